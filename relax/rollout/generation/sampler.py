"""Generate with a policy under its run's precision: the one place training rollouts,
episodes and evaluation sample from a model.

    sampler = Sampler(model, eos_token_ids=eos, pad_token_id=pad,
                      params=SamplingParams(temperature=1.0), bf16=False)
    rollout = sampler(prompt_ids, prompt_mask, max_new_tokens=64, generator=g)

The model is switched to eval mode for the call (dropout off) and back to its previous mode
after, and the decode runs under the run's autocast (relax/precision.py). A sharded (FSDP2)
model passes ``sync_group`` (every rank runs the same number of forward passes) and
``after`` (reshard the parameters the decode gathered), and decodes under plain ``no_grad``
(FSDP2 reuses its all-gather buffers in later training passes; inference tensors cannot be
updated outside inference mode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from relax.precision import autocast
from relax.rollout.generation.generate import Rollout, generate


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn (relax/rollout/generation/generate.py ``sample_next``): temperature 0
    is greedy, ``top_p`` 1.0 and ``top_k`` -1 switch truncation off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


class Sampler:
    """``sampler(ids, mask, max_new_tokens, generator) -> Rollout`` for left-padded prompts
    ``ids`` / ``mask`` [B, P] (relax/rollout/generation/generate.py); ``generator``: one stream
    for the batch or a list of one per row (generate.py ``row_uniforms``)."""

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: list[int], pad_token_id: int,
                 params: SamplingParams, bf16: bool, device: torch.device | None = None,
                 sync_group=None, after: Callable[[], None] | None = None):
        self.model = model
        self.eos_token_ids, self.pad_token_id = list(eos_token_ids), pad_token_id
        self.params, self.bf16 = params, bf16
        self.device = device if device is not None else next(model.parameters()).device
        self.sync_group, self.after = sync_group, after

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
                 generator: torch.Generator | list[torch.Generator] | None = None, *,
                 budgets=None, stop=None, cache=None, shared=None) -> Rollout:
        """``budgets`` / ``stop``: per-row limits and an early end; ``cache``: the rows' KV
        caches of earlier turns; ``shared``: the rows' shared prefixes, prefilled once per
        group (relax/rollout/generation/generate.py)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(self.device, self.bf16):
                return generate(
                    self.model, ids, mask, max_new_tokens=max_new_tokens,
                    eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id,
                    temperature=self.params.temperature, top_p=self.params.top_p,
                    top_k=self.params.top_k, generator=generator, sync_group=self.sync_group,
                    budgets=budgets, stop=stop, cache=cache, shared=shared,
                    # a sharded model keeps its gathered buffers for training passes
                    inference_mode=self.sync_group is None,
                )
        finally:
            self.model.train(was_training)
            if self.after is not None:
                self.after()
