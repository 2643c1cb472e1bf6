"""Length control on the reward (reinforce_plus_plus.md §7d): DAPO's soft overlong punishment
and a linear length penalty, pure functions of each response's length.

``lengths`` [B] are the responses' token counts (every token the policy generated, EOS
included; a partial rollout's from every step it was sampled in) and ``max_len`` is
``--rollout-max-response-len``. Returns float32 [B] (float64 for float64 ``lengths``): the
term added to each response's reward, <= 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _float(lengths: Tensor) -> Tensor:
    return lengths.to(torch.float64 if lengths.dtype == torch.float64 else torch.float32)


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer: int, factor: float) -> Tensor:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer`` tokens, then falling
    linearly to ``-factor`` at ``max_len`` (and beyond):
    ``-factor * clamp(L - (max_len - buffer), 0, buffer) / buffer``."""
    start = max_len - buffer
    over = (_float(lengths) - start).clamp(min=0, max=buffer)
    return -factor * over / buffer


def length_penalty(lengths: Tensor, *, max_len: int, coef: float) -> Tensor:
    """A cost per generated token: ``-coef * L / max_len`` (``-coef`` at the limit)."""
    return -coef * _float(lengths) / max_len
