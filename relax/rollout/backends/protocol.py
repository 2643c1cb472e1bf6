"""The rollout backend: who samples the rollouts for a rank, and what it needs to follow the
trainer's weights. Relax's own engine on the policy's module (local.py) and vLLM servers
(vllm/vllm_backend.py) implement it; relax/rollout/backends/open.py picks one from
``--rollout-backend``, and nothing else asks which one it is.

    backend = open_backend(...)                     before any model loads: bad input exits 2
    backend.start(module, bf16=..., lora=...)       the policy is loaded: ready to sample
    sampler = backend.sampler(params, eos_token_ids=eos, pad_token_id=pad)
    if backend.due(version):                        colocated: after a trainer step
        backend.push(module, version, tracker)      the sampler uses ``version``'s weights
    if backend.behind(version):                     a rollout rank: after weights arrived
        backend.push(module, version)
    backend.served()                                after sampling: the oldest version, where
    backend.record(tracker)                         after a step: its own metrics, if any
    backend.close()                                 whatever the backend started is gone

``relax eval`` is ``start`` on the checkpoint and ``sampler`` at the evaluation's sampling
(relax/eval/command.py).
"""

from __future__ import annotations

from typing import Protocol

import torch

from relax.rollout.generation.sampler import SamplingParams


class RolloutBackend(Protocol):
    """``remote``: the samples come from outside this process, so its generation FLOPs are
    not this process's (``perf/generate_flops`` 0) and the weights reach it only by
    :meth:`push`."""

    remote: bool

    def start(self, module: torch.nn.Module, *, bf16: bool, lora=None) -> None:
        """Sample with ``module`` (the Hugging Face policy; ``lora``: peft's tuner of a
        ``--lora-rank`` policy) from now on: raises InputError (exit 2) for a model the
        backend cannot run."""
        ...

    def sampler(self, params: SamplingParams, *, eos_token_ids: list[int], pad_token_id: int):
        """``sampler(ids, mask, max_new_tokens, generator, ...) -> Rollout``, the interface of
        relax/rollout/generation/sampler.py ``Sampler``, with its ``eos_token_ids`` and
        ``device``."""
        ...

    def due(self, version: int) -> bool:
        """Whether the weights after ``version`` trainer steps must be pushed (colocated)."""
        ...

    def behind(self, version: int) -> bool:
        """Whether the samples still come from older weights than ``version`` (a rollout
        rank that just received them)."""
        ...

    def push(self, module: torch.nn.Module, version: int, tracker=None) -> int:
        """The samples come from ``module``'s weights (``version``) from now on; returns the
        bytes sent (``tracker``: records them, if the backend sends any)."""
        ...

    def served(self) -> tuple[int, str] | None:
        """The oldest weights version the samples since the last call were drawn with, as the
        server that drew them reported it, and where (a vLLM server's URL); None when the
        samples come from the weights this process holds (Relax's engine)."""
        ...

    def record(self, tracker) -> None:
        """This step's metrics of the backend itself into ``tracker``
        (relax/metrics/tracker.py; vLLM: each server's, ``rollout/server<i>/...``)."""
        ...

    def close(self) -> None:
        """What the backend started (a server process, its weight copies) is gone."""
        ...
