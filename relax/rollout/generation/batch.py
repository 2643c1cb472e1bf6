"""What one rank samples in a rollout step, and the batch dynamic sampling keeps of it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from relax.rollout.generation.generate import Rollout, concat_rollouts


@dataclass
class StepBatch:
    """One rank's samples of a rollout step: what it trains on (``rollout`` and the lists and
    tensors of its rows, whole groups) and what it generated (``generated``: every round of
    dynamic sampling, for the generation metrics; ``decode_steps``: the decode loop's steps)."""

    prompts: list[str]
    labels: list
    group_index: torch.Tensor  # [B] local group ids
    rollout: Rollout
    responses: list[str]
    rewards: torch.Tensor  # [B]
    generated: Rollout
    decode_steps: int
    # --opd-type self: each row's teacher prompt, formatted (relax/rollout/prompts/privileged.py)
    teacher_prompts: list[str] | None = None

    @classmethod
    def of(cls, *, prompts: list[str], labels: list, group_index: torch.Tensor,
           rollout: Rollout, responses: list[str], rewards: torch.Tensor,
           teacher_prompts: list[str] | None = None) -> StepBatch:
        """A batch that trains on everything it generated (no rows filtered out)."""
        return cls(prompts=prompts, labels=labels, group_index=group_index, rollout=rollout,
                   responses=responses, rewards=rewards, generated=rollout,
                   decode_steps=rollout.response_ids.shape[1], teacher_prompts=teacher_prompts)


    def plain(self) -> dict:
        """This batch as dicts, lists and tensors (what a checkpoint's rank file may hold:
        it is read with ``weights_only``); :meth:`from_plain` rebuilds it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("rollout", "generated"):
            out[name] = {f.name: getattr(out[name], f.name)
                         for f in dataclasses.fields(out[name])}
        return out

    @classmethod
    def from_plain(cls, state: dict) -> StepBatch:
        return cls(**{**state, "rollout": Rollout(**state["rollout"]),
                      "generated": Rollout(**state["generated"])})

    def to(self, device) -> StepBatch:
        """This batch with every tensor on ``device`` (--fully-async sends batches between
        ranks on the CPU)."""
        return _moved(self, device)


def _moved(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: _moved(getattr(x, f.name), device)
                                        for f in dataclasses.fields(x)})
    return x


def kept_batch(parts: list[StepBatch], kept: list[tuple[int, int]], n: int,
               pad_token_id: int) -> StepBatch:
    """The groups ``kept`` (``(round, group)`` pairs, in order) of the rounds ``parts``, as one
    batch with local group ids 0..k-1; ``generated`` holds every row of every round."""
    generated = concat_rollouts([p.rollout for p in parts], pad_token_id)
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + len(p.prompts))
    rows = [offsets[r] + g * n + j for r, g in kept for j in range(n)]
    prompts, labels, responses = (
        [every[i] for i in rows]
        for every in ([x for p in parts for x in getattr(p, name)]
                      for name in ("prompts", "labels", "responses")))
    teacher = None
    if parts[0].teacher_prompts is not None:
        every = [x for p in parts for x in p.teacher_prompts]
        teacher = [every[i] for i in rows]
    device = generated.prompt_ids.device
    rewards = torch.cat([p.rewards for p in parts])[torch.tensor(rows, dtype=torch.long,
                                                                 device=device)]
    group_index = torch.arange(len(kept), device=device).repeat_interleave(n)
    return StepBatch(prompts=prompts, labels=labels, group_index=group_index,
                     rollout=generated.select(rows), responses=responses, rewards=rewards,
                     generated=generated,
                     decode_steps=sum(p.rollout.response_ids.shape[1] for p in parts),
                     teacher_prompts=teacher)
