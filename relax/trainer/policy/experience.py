"""The training batch of a rollout step (:class:`Experience`) and how it is cut into
micro-batches: fixed slices of ``--micro-batch-size`` rows, or token-budget micro-batches
(``--use-dynamic-batch-size --max-tokens-per-gpu N``).

Token budgets: rows are sorted by length and grouped greedily into micro-batches whose padded
size (rows x the longest row) stays within N tokens; each micro-batch is cut to its own width,
so short answers no longer carry the padding of the longest one. The loss is unchanged: every
reduction divides by the optimizer step's global count (reinforce_plus_plus.md §7), nothing of
the micro-batch, so only the float summation order differs from fixed micro-batches.

Field vocabulary: ``input_ids`` / ``attention_mask`` / ``position_ids`` [B, P+T] are the
left-padded prompt followed by the right-padded response; ``response_mask`` [B, T] marks the
generated tokens up to and including EOS.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.distributed as dist

from relax.collectives import all_reduce
from relax.errors import InputError
from relax.rollout.generation.generate import Rollout


@dataclass
class Experience:
    """One rank's training batch for a rollout step; every tensor has the batch dim first."""

    input_ids: torch.Tensor  # [B, P+T]
    attention_mask: torch.Tensor  # [B, P+T] long
    position_ids: torch.Tensor  # [B, P+T]
    response_mask: torch.Tensor  # [B, T] bool
    old_log_probs: torch.Tensor | None = None  # [B, T]
    ref_log_probs: torch.Tensor | None = None  # [B, T]
    advantages: torch.Tensor | None = None  # [B, T]
    rollout_log_probs: torch.Tensor | None = None  # [B, T] the sampler's (reinforce_plus_plus.md §7a)
    teacher_log_probs: torch.Tensor | None = None  # [B, T] --use-opd (reinforce_plus_plus.md §7b)
    values: torch.Tensor | None = None  # [B, T] ppo: the critic before the update (§5c)
    returns: torch.Tensor | None = None  # [B, T] ppo: the critic's targets A_raw + V (§5c)
    # --opd-type self: the teacher's left-padded prompt [B, P'] (with the privileged
    # information) and its mask; the teacher reads it followed by the response (§7b)
    teacher_prompt_ids: torch.Tensor | None = None
    teacher_prompt_mask: torch.Tensor | None = None
    # a mixture of experts [B, P+T, MoE layers, k] int16, -1: none: the sampler's routing
    # record (Rollout.routed_experts) and, --use-routing-replay, the old policy's (docs/moe.md)
    routed_experts: torch.Tensor | None = None
    old_routed_experts: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, start: int, stop: int) -> Experience:
        return self.select(slice(start, stop))

    def select(self, index) -> Experience:
        """The rows picked by ``index`` (a slice or a [k] index tensor) of every field."""
        return replace(
            self,
            **{
                f.name: getattr(self, f.name)[index]
                for f in fields(self)
                if getattr(self, f.name) is not None
            },
        )


def experience_from_rollout(r: Rollout) -> Experience:
    """Concatenate prompt and response; positions count attended tokens only (left padding).

    The attention covers ``context_mask`` when the rollout has one (an episode's environment
    tokens are read by the model but are holes of the loss mask, ``response_mask``)."""
    # clone(): the rollout was made under inference_mode, and inference tensors cannot be saved
    # for backward by the training pass.
    input_ids = torch.cat([r.prompt_ids, r.response_ids], dim=1).clone()
    attended = r.response_mask if r.context_mask is None else r.context_mask
    attention_mask = torch.cat([r.prompt_mask, attended], dim=1).long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Experience(input_ids, attention_mask, position_ids, r.response_mask.clone(),
                      rollout_log_probs=None if r.log_probs is None else r.log_probs.clone(),
                      routed_experts=None if r.routed_experts is None
                      else r.routed_experts.clone())


def trimmed(exp: Experience) -> Experience:
    """``exp`` without its all-padding columns: leading prompt columns no row attends to and
    trailing response columns outside every row's mask (positions are unchanged: they count
    attended tokens)."""
    T = exp.response_mask.shape[1]
    P = exp.input_ids.shape[1] - T
    start = _first_attended(exp.attention_mask[:, :P])
    valid = exp.response_mask.any(dim=0).nonzero()
    width = int(valid[-1]) + 1 if len(valid) else 1
    teacher_start = (None if exp.teacher_prompt_mask is None
                     else _first_attended(exp.teacher_prompt_mask))

    def cut(name: str, value):
        if value is None:
            return None
        if name in _SEQUENCE_FIELDS:  # [B, P+T]: both ends
            return value[:, start:P + width]
        if name in _TEACHER_PROMPT_FIELDS:  # [B, P']: the leading padding
            return value[:, teacher_start:]
        return value[:, :width]  # [B, T]: the tail

    return Experience(**{f.name: cut(f.name, getattr(exp, f.name)) for f in fields(exp)})


_SEQUENCE_FIELDS = ("input_ids", "attention_mask", "position_ids", "routed_experts",
                    "old_routed_experts")
_TEACHER_PROMPT_FIELDS = ("teacher_prompt_ids", "teacher_prompt_mask")


def _first_attended(mask: torch.Tensor) -> int:
    """The first column some row of a left-padded prompt ``mask`` [B, P] attends to (P when
    none does)."""
    attended = mask.any(dim=0).nonzero()
    return int(attended[0]) if len(attended) else mask.shape[1]


def budget_groups(lengths: list[int], max_tokens: int, flag: str,
                  packed: bool = False) -> list[list[int]]:
    """Row indices per micro-batch: longest rows first, each micro-batch as many rows as fit in
    ``max_tokens`` padded tokens; ``packed``: rows in their order (a group's samples stay
    together, so a pack can share their prompt), as many as fit in ``max_tokens`` tokens
    (the sum of their lengths, a bound on the pack). A row longer than the budget is bad input
    naming ``flag``."""
    longest = max(range(len(lengths)), key=lambda i: lengths[i]) if lengths else None
    if longest is not None and lengths[longest] > max_tokens:
        raise InputError(f"{flag} {max_tokens}: a row of this step has {lengths[longest]} "
                         f"tokens (prompt + response), more than the budget; use at least "
                         f"{lengths[longest]}")
    if packed:
        return _packed_groups(lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:  # rows come longest first, so a group's first row sets its width
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _packed_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    groups: list[list[int]] = []
    used = max_tokens + 1
    for i, n in enumerate(lengths):
        if used + n > max_tokens:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


def split_to(groups: list[list[int]], count: int) -> list[list[int]]:
    """Split the largest micro-batches until there are ``count`` (ranks of a sharded model run
    the same number of passes, each with its collectives)."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        big = max(range(len(groups)), key=lambda k: len(groups[k]))
        if len(groups[big]) < 2:
            raise ValueError(f"cannot make {count} micro-batches of {sum(map(len, groups))} rows")
        g = groups.pop(big)
        groups[big:big] = [g[: len(g) // 2], g[len(g) // 2:]]
    return groups


def micro_batches(exp: Experience, *, size: int, max_tokens: int | None, flag: str,
                  group=None, lockstep: bool = False,
                  packed: bool = False) -> list[tuple[torch.Tensor, Experience]]:
    """``(row indices, micro-batch)`` pairs covering ``exp``: fixed slices of ``size`` rows,
    or token-budget groups (trimmed) when ``max_tokens`` is set (``packed``: the passes pack,
    :func:`budget_groups`). ``lockstep``: every rank of ``group`` gets the same number of
    micro-batches."""
    device = exp.input_ids.device
    if max_tokens is None:
        return [(torch.arange(i, min(i + size, len(exp)), device=device), exp.rows(i, i + size))
                for i in range(0, len(exp), size)]
    groups = budget_groups(exp.attention_mask.sum(dim=1).tolist(), max_tokens, flag, packed)
    if lockstep and group is not None:
        count = torch.tensor([float(len(groups))], device=device)
        groups = split_to(groups, int(all_reduce(count, group, dist.ReduceOp.MAX)))
    out = []
    for g in groups:
        index = torch.tensor(g, dtype=torch.long, device=device)
        out.append((index, trimmed(exp.select(index))))
    return out
