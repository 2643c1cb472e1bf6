"""KV caches kept between the turns of episodes, so a turn prefills only the tokens the
environment or the agent added (relax/rollout/agents/episodes.py, relax/rollout/agents/agent_server.py).

    cache = TurnCache()                                   one per rollout step (fixed weights)
    out = generate(model, ids, mask, ..., cache=cache.rows(keys))   every turn, keys [B]
    cache.release(key)                                    an episode ended: its memory goes

After a turn's decode the engine (relax/rollout/generation/engine.py, ``retain``) still holds each row's
keys and values: its context and every token it drew but the last (never fed). ``store``
keeps references to those tensors under the row's key, with the token ids they stand for. The
next call with that key checks that those ids begin the row's new context (else the row is
computed whole) and the engine's prefill copies them into the columns a fresh prefill of the
same left-padded batch would compute, so the decode that follows sees the same cache layout
and draws from the same random stream: the sampled ids are those of a prefill of the whole
conversation, the logits equal up to float rounding (tests/rollout/generation/test_turn_cache.py).

Memory: ``past`` takes a row's entry out of the cache, so the previous turn's tensors are
freed once the new prefill has copied what it needs, except those of rows a call did not name
(an agent still thinking) and of rows released since, which go with the last row that shares
them. A model the engine does not run (``unsupported_reason``: FSDP2-sharded, other
architectures) ignores the cache and prefills every turn.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch


@dataclass
class _Entry:
    keys: list[torch.Tensor]  # per layer [r, kv heads, columns, head_dim]: a whole chunk
    values: list[torch.Tensor]
    row: int  # this sequence's row in the chunk
    start: int  # the chunk column of its first token; the tokens are contiguous from there
    ids: list[int]  # the token ids the columns hold


@dataclass
class Past:
    """What a prefill takes from the cache: ``cached`` [B] tokens per row, copied into the
    new cache by ``fill``; each group is ``(entry, src rows, src cols, dst rows, dst cols)``
    with one (row, column) pair per cached token."""

    cached: torch.Tensor
    groups: list[tuple[_Entry, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]

    def fill(self, layer: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Write layer ``layer``'s cached keys and values into ``k_cache`` / ``v_cache``
        [B, kv heads, L, head_dim]."""
        for entry, src_rows, src_cols, dst_rows, dst_cols in self.groups:
            k_cache[dst_rows, :, dst_cols] = entry.keys[layer][src_rows, :, src_cols]
            v_cache[dst_rows, :, dst_cols] = entry.values[layer][src_rows, :, src_cols]


class TurnCache:
    """Each live sequence's KV cache between calls, by the caller's key (episode index,
    agent session). Valid for one set of weights: make a new one per rollout step."""

    def __init__(self):
        self.entries: dict[Hashable, _Entry] = {}

    def rows(self, keys: list[Hashable]) -> CachedRows:
        """The cache as seen by one call whose row i is the sequence ``keys[i]``."""
        return CachedRows(self, list(keys))

    def release(self, key: Hashable) -> None:
        """Forget ``key`` (its episode ended)."""
        self.entries.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()

    @property
    def tokens(self) -> int:
        """Tokens held (for tests and the memory check of finished episodes)."""
        return sum(len(e.ids) for e in self.entries.values())


class CachedRows:
    """One call's view of a :class:`TurnCache` (relax/rollout/generation/generate.py ``generate``)."""

    def __init__(self, cache: TurnCache, keys: list[Hashable]):
        self.cache, self.keys = cache, keys

    def past(self, ids: torch.Tensor, mask: torch.Tensor) -> Past | None:
        """Take the entries of this call's rows for the prefill of left-padded ``ids`` /
        ``mask`` [B, P]; None when no row has any (a fresh prefill). A row keeps at least
        its last token to compute (its logits start the decode)."""
        B, P = ids.shape
        lengths = mask.sum(-1).tolist()
        rows = ids.tolist()
        cached, by_entry = [0] * B, {}
        for i, key in enumerate(self.keys):
            entry = self.cache.entries.pop(key, None)
            if entry is None:
                continue
            context = rows[i][P - lengths[i]:]
            n = min(len(entry.ids), lengths[i] - 1)
            if n <= 0 or entry.ids[:n] != context[:n]:  # not a prefix: computed whole
                continue
            cached[i] = n
            by_entry.setdefault(id(entry.keys[0]), (entry, []))[1].append(
                (entry.row, entry.start, i, P - lengths[i], n))
        if not any(cached):
            return None
        device = ids.device
        groups = []
        for entry, parts in by_entry.values():
            src_rows, src_cols, dst_rows, dst_cols = ([], [], [], [])
            for row, start, i, first, n in parts:
                src_rows += [row] * n
                src_cols += range(start, start + n)
                dst_rows += [i] * n
                dst_cols += range(first, first + n)
            groups.append((entry, *(torch.tensor(x, dtype=torch.long, device=device)
                                    for x in (src_rows, src_cols, dst_rows, dst_cols))))
        return Past(torch.tensor(cached, dtype=torch.long, device=device), groups)

    def store(self, chunks, ids: torch.Tensor, mask: torch.Tensor,
              response_ids: torch.Tensor, response_mask: torch.Tensor) -> None:
        """Keep each row's cache after a decode: ``chunks`` from the engine's ``chunks()``,
        the call's left-padded context ``ids`` / ``mask`` [B, P] and the sampled
        ``response_ids`` / ``response_mask`` [B, T]."""
        P = ids.shape[1]
        lengths = mask.sum(-1).tolist()
        drawn = response_mask.sum(-1).tolist()
        rows, responses = ids.tolist(), response_ids.tolist()
        for chunk_rows, keys, values in chunks:
            for row, i in enumerate(chunk_rows.tolist()):
                # the context and the drawn tokens but the last, which was never fed
                tokens = rows[i][P - lengths[i]:] + responses[i][:drawn[i] - 1]
                self.cache.entries[self.keys[i]] = _Entry(keys, values, row, P - lengths[i],
                                                          tokens)
