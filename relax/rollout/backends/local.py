"""``--rollout-backend relax``: Relax's own decoding engine on the policy's module
(relax/rollout/generation/sampler.py). The sampler reads the module's parameters in place,
so the trained weights are sampled from the moment the optimizer writes them: nothing is
ever pushed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from relax.rollout.generation.sampler import Sampler, SamplingParams


class LocalBackend:
    """``device``: where the module decodes; ``sync_group``: the ranks a sharded (FSDP2)
    module runs its forward passes with, in lockstep; ``release(module)``: frees what a
    no-grad pass gathered of a sharded module, after each decode (relax/trainer/distributed.py
    ``reshard``)."""

    remote = False

    def __init__(self, device: torch.device, *, sync_group=None,
                 release: Callable[[torch.nn.Module], None] | None = None):
        self.device, self.sync_group, self.release = device, sync_group, release
        self.module: torch.nn.Module | None = None
        self.bf16 = False

    def start(self, module: torch.nn.Module, *, bf16: bool, lora=None) -> None:
        """``lora``: the adapter lives in ``module`` itself, nothing to load."""
        self.module, self.bf16 = module, bf16

    def sampler(self, params: SamplingParams, *, eos_token_ids: list[int],
                pad_token_id: int) -> Sampler:
        after = self.release and functools.partial(self.release, self.module)
        return Sampler(self.module, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id,
                       params=params, bf16=self.bf16, device=self.device,
                       sync_group=self.sync_group, after=after)

    def due(self, version: int) -> bool:
        return False  # the sampler reads the module the optimizer updates

    def behind(self, version: int) -> bool:
        return False

    def push(self, module: torch.nn.Module, version: int, tracker=None) -> int:
        return 0

    def served(self) -> None:
        return None  # the engine samples with the weights this process holds

    def record(self, tracker) -> None:
        pass  # the engine's metrics are the step's own (perf/)

    def close(self) -> None:
        pass  # nothing started
