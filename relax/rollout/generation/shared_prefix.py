"""Prompts whose groups share a beginning, prefilled with each group's shared tokens once.

The generative judge (relax/rollout/reward/genrm.py) fills one judging prompt per sample: the n
samples of a question give n prompts that agree on the template's head and the question and
differ from the response on. Prefilled whole, that shared beginning is computed n times.

    shared = shared_prefixes(rows, keys)          token lists [B], a group key per row
    rollout = generate(model, ids, mask, ..., shared=shared)   ids / mask: rows left-padded

The shared tokens are found on the token lists themselves (the longest common prefix of a
group's rows), so where a tokenizer merges characters across the boundary of a template field
is never a question. The engine (relax/rollout/generation/engine.py) prefills the groups'
prefixes as one batch, then extends every row from its group's keys and values the way an
episode's next turn extends its kept cache (relax/rollout/generation/turn_cache.py ``Past``):
only each row's own tokens are computed, and the cache the decode continues from has the
layout of a whole prefill, so the logits equal those of a whole prefill up to float rounding
(tests/rollout/generation/test_shared_prefix.py, float64). A model the engine does not run prefills every
row whole.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from relax.rollout.generation.turn_cache import Past


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share at their start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class SharedPrefixes:
    """Row i belongs to group ``group[i]`` and starts with its group's first ``length[g]``
    tokens, which are those of row ``first[g]``; a length is below each of its rows' lengths
    (every row computes its last token, whose logits start the decode).

    group [B] long, first [G] long, length [G] long (on the CPU; moved where the ids are)."""

    group: torch.Tensor
    first: torch.Tensor
    length: torch.Tensor

    def prefix_batch(self, ids: torch.Tensor, mask: torch.Tensor):
        """The groups' prefixes, left-padded: ids [G, W] and mask [G, W] bool, W the longest
        prefix, cut from the left-padded rows ``ids`` / ``mask`` [B, P]."""
        first, length = self.first.to(ids.device), self.length.to(ids.device)
        start = ids.shape[1] - mask.sum(-1)[first]  # [G] each first row's first real column
        width = int(length.max())
        offset = torch.arange(width, device=ids.device)[None] - (width - length)[:, None]
        pre_mask = offset >= 0  # [G, W]
        columns = (start[:, None] + offset).clamp(0, ids.shape[1] - 1)
        pre_ids = torch.where(pre_mask, ids[first[:, None], columns], torch.zeros_like(columns))
        return pre_ids, pre_mask

    def past(self, keys: list[torch.Tensor], values: list[torch.Tensor],
             mask: torch.Tensor) -> Past:
        """What each row of the left-padded batch (``mask`` [B, P]) takes from its group's
        prefix: per layer ``keys`` / ``values`` [G, kv heads, W, head_dim] of
        :meth:`prefix_batch`, column for column into the row's own first columns."""
        device = mask.device
        group, length = self.group.to(device), self.length.to(device)
        width, P = keys[0].shape[2], mask.shape[1]
        cached = length[group]  # [B]
        rows = torch.repeat_interleave(torch.arange(cached.shape[0], device=device), cached)
        j = torch.arange(rows.shape[0], device=device) - torch.repeat_interleave(
            cached.cumsum(0) - cached, cached)  # each copied token's index in its prefix
        src_cols = width - cached[rows] + j
        dst_cols = P - mask.sum(-1)[rows] + j
        return Past(cached, [(_Columns(keys, values), group[rows], src_cols, rows, dst_cols)])

    def saved_tokens(self) -> int:
        """Prefill tokens the sharing saves: each shared prefix once instead of per row."""
        rows = torch.bincount(self.group, minlength=self.length.shape[0])
        return int(((rows - 1) * self.length).sum())


@dataclass(frozen=True)
class _Columns:
    """A prefix prefill's cache in the shape ``Past.fill`` reads (a turn cache's entry)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def shared_prefixes(rows: list[list[int]], keys: list[Hashable]) -> SharedPrefixes | None:
    """The groups of ``rows`` (token lists) by ``keys`` (one per row, e.g. the sample's prompt)
    and each group's longest common prefix, at most one token less than its shortest row; None
    when no row would reuse a token (every group of one, or rows that differ from the first
    token), where a plain prefill costs less."""
    index: dict[Hashable, int] = {}
    group = [index.setdefault(k, len(index)) for k in keys]
    first: list[int] = []
    length: list[int] = []
    for i, g in enumerate(group):
        if g == len(first):
            first.append(i)
            length.append(len(rows[i]) - 1)
        else:
            length[g] = min(length[g], len(rows[i]) - 1, common_prefix(rows[first[g]], rows[i]))
    shared = SharedPrefixes(torch.tensor(group, dtype=torch.long),
                            torch.tensor(first, dtype=torch.long),
                            torch.tensor(length, dtype=torch.long).clamp(min=0))
    return shared if shared.saved_tokens() > 0 else None
