"""Discounted reverse cumulative sum without a Python loop over tokens.

    G[i, t] = sum_{u >= t} gamma^(u - t) * r[i, u]

The obvious vectorisations fail at long T: ``gamma^-t`` scaling overflows float32 for
gamma = 0.99 near T = 8192, and a per-timestep loop is slow. Here the row is cut into
chunks of C positions and the sum becomes two small matrix products whose entries are
all ``gamma^k <= 1``, so nothing overflows and terms that underflow to 0 are below
float32 resolution anyway:

1. inside each chunk: ``local = r_chunk @ U`` with ``U[u, t] = gamma^(u - t)`` for u >= t;
2. across chunks: the return at the first position of the *next* chunk,
   ``H[k] = sum_{j > k} gamma^(C (j - k - 1)) * local[j, 0]`` (a [K, K] matrix product),
   is added as ``local[k, t] += gamma^(C - t) * H[k]``.

Cost: B*T*C + B*T*K/C multiply-adds, with C ~ cbrt(T) balancing the two. Every term is a
sum of non-negative weights times r, so float32 accuracy is that of a length-C dot product
(tests: within 1e-4 of the float64 definition at T = 8192, gamma = 0.99).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _chunk_size(T: int) -> int:
    # C^3 ~ T balances the in-chunk (C) and cross-chunk (T / C^2) work per element.
    c = 16
    while c * c * c < T and c < 256:
        c *= 2
    return c


def _powers(n: int, base: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    # base^k for k = 0..n-1, evaluated in float64 so the matrix entries are exact-rounded.
    k = torch.arange(n, dtype=torch.float64, device=device)
    return torch.pow(torch.tensor(base, dtype=torch.float64, device=device), k).to(dtype)


def _toeplitz(n: int, base: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """M[u, t] = base^(u - t) for u >= t else 0, shape [n, n]."""
    p = _powers(n, base, dtype, device)
    idx = torch.arange(n, device=device)
    diff = idx[:, None] - idx[None, :]
    return torch.where(diff >= 0, p[diff.clamp(min=0)], torch.zeros((), dtype=dtype, device=device))


def new_scan_buffer(B: int, T: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A [B, T_pad] buffer (T_pad a multiple of the chunk size) whose padding tail is 0.

    Callers write r into ``buf[:, :T]`` directly, which saves a padding copy."""
    C = _chunk_size(T)
    T_pad = -(-T // C) * C
    buf = torch.empty(B, T_pad, dtype=dtype, device=device)
    buf[:, T:].zero_()
    return buf


def discounted_reverse_cumsum(buf: Tensor, T: int, gamma: float, scale: float = 1.0) -> Tensor:
    """``scale`` times the discounted reverse cumsum of ``buf[:, :T]`` (``buf`` from
    :func:`new_scan_buffer`); the scale rides in the in-chunk matrix, costing no pass.

    Returns a [B, T] view of a new tensor; ``buf`` is not modified.
    """
    B, T_pad = buf.shape
    C = _chunk_size(T)
    K = T_pad // C
    dtype, device = buf.dtype, buf.device
    # local[b, k, t] = sum_{u >= t in chunk k} gamma^(u - t) r[b, k, u]
    local = torch.matmul(buf.view(B, K, C), _toeplitz(C, gamma, dtype, device) * scale)
    if K > 1:
        first = local[:, :, 0]  # [B, K]: in-chunk return at each chunk's first position
        # H[b, k] = sum_{j > k} gamma^(C (j - k - 1)) first[b, j]: the return at the start
        # of chunk k + 1, i.e. the carry into chunk k.
        V = _toeplitz(K, gamma**C, dtype, device)  # V[j, k] = (gamma^C)^(j - k), j >= k
        carry = torch.matmul(first[:, 1:], V[:-1, :-1])  # [B, K-1]: carry into chunks 0..K-2
        tail = _powers(C, gamma, dtype, device).flip(0) * gamma  # gamma^(C - t), t = 0..C-1
        local[:, :-1, :].addcmul_(carry.unsqueeze(-1), tail)
    return local.view(B, T_pad)[:, :T]
