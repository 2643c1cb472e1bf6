"""Mixed precision in one place: ``--bf16`` (Relax/Megatron name) and its autocast.

With bf16 the forward passes (generation, old/reference log-probs, the update) run under
``torch.autocast(device, bfloat16)``; the trainable weights and AdamW state stay fp32 (an
update of lr 1e-6 vanishes in bf16), the frozen reference is stored in bf16, and the
log-probabilities and everything of ``relax.algorithms`` are computed in fp32 from logits cast
up (the algorithm functions return float32 for bf16 inputs, docs/algorithms/reinforce_plus_plus.md "Python API"). Default: on for CUDA,
off for the CPU (``--bf16`` turns it on there, ``--no-bf16`` off on CUDA).

The sampler follows the trainer unless ``--rollout-bf16`` / ``--no-rollout-bf16`` says
otherwise (:func:`use_rollout_bf16`): a bf16 sampler against an fp32 trainer is what a GPU
deployment with a bf16 inference engine runs, and the mismatch it makes is what the
importance corrections and routing replay are for.
"""

from __future__ import annotations

import torch


def use_bf16(flag: bool | None, device: torch.device) -> bool:
    """The resolved ``--bf16``: the flag when given, else whether ``device`` is CUDA."""
    return device.type == "cuda" if flag is None else bool(flag)


def autocast(device: torch.device, bf16: bool):
    """The forward-pass context of a run: bf16 autocast on ``device`` when ``bf16``."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def use_rollout_bf16(flag: bool | None, bf16: bool) -> bool:
    """The sampler's precision: ``--rollout-bf16`` / ``--no-rollout-bf16`` (``flag``) when
    given, else the trainer's resolved ``--bf16`` (``bf16``, from :func:`use_bf16`). Relax's
    engine decodes under :func:`autocast` at it, and an owned vLLM server is started at
    ``--dtype bfloat16`` (else float32); the trainer's passes keep ``bf16``."""
    return bf16 if flag is None else bool(flag)
