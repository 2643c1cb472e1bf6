"""Discounted reverse cumulative sum without a Python loop over tokens.

    G[i, t] = sum_{u >= t} gamma^(u - t) * r[i, u]

The obvious vectorisations fail at long T: ``gamma^-t`` scaling overflows float32 for
gamma = 0.99 near T = 8192, and a per-timestep loop is slow. Here each row is cut into
chunks of C positions and the sum becomes small matrix products whose entries are all
``gamma^k <= 1``, so nothing overflows, and terms that underflow to 0 are below float32
resolution anyway:

1. inside each chunk: ``local = r_chunk @ U`` with ``U[u, t] = gamma^(u - t)`` for u >= t;
2. across chunks: the return at the first position of chunk k + 1,
   ``H[k] = sum_{j > k} (gamma^C)^(j - k - 1) * local[j, 0]``, is itself a discounted
   reverse cumsum (of the chunks' first values, with base ``gamma^C``), computed by the
   same two steps recursively over K = T / C values; then
   ``local[k, t] += gamma^(C - t) * H[k]``.

Cost: ~2C multiply-adds per element at the top level, and a geometric series below it.
Each output is a short sum of non-negative weights times r, so float32 stays within
1e-4 of the float64 definition at T = 8192 (tests, and ``benchmarks/bench_algorithms.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK = 16  # measured fastest of 8/16/32/64 for the [N*K, C] @ [C, C] product on the CPU


def _powers(n: int, base: float, dtype: torch.dtype, device) -> Tensor:
    # base^k for k = 0..n-1, evaluated in float64 so the matrix entries are exact-rounded.
    k = torch.arange(n, dtype=torch.float64, device=device)
    return torch.pow(torch.tensor(base, dtype=torch.float64, device=device), k).to(dtype)


def _toeplitz(n: int, base: float, dtype: torch.dtype, device, scale: float = 1.0) -> Tensor:
    """M[u, t] = scale * base^(u - t) for u >= t else 0, shape [n, n]."""
    p = _powers(n, base, dtype, device) * scale
    idx = torch.arange(n, device=device)
    diff = idx[:, None] - idx[None, :]
    return torch.where(diff >= 0, p[diff.clamp(min=0)], torch.zeros((), dtype=dtype, device=device))


def new_scan_buffer(B: int, T: int, dtype: torch.dtype, device) -> Tensor:
    """A [B, T_pad] buffer (T_pad the next multiple of the chunk size) whose tail is 0.

    Callers write r into ``buf[:, :T]`` directly, which saves a padding copy."""
    T_pad = -(-T // CHUNK) * CHUNK
    buf = torch.empty(B, T_pad, dtype=dtype, device=device)
    buf[:, T:].zero_()
    return buf


def discounted_reverse_cumsum(buf: Tensor, T: int, gamma: float, scale: float = 1.0) -> Tensor:
    """``scale`` times the discounted reverse cumsum of ``buf[:, :T]`` (``buf`` from
    :func:`new_scan_buffer`); the scale rides in the in-chunk matrix, costing no pass.

    Returns a [B, T] view of a new tensor; ``buf`` is not modified.
    """
    return _scan_chunked(buf, gamma, scale)[:, :T]


def _scan_chunked(x: Tensor, gamma: float, scale: float) -> Tensor:
    """Scan of a contiguous [N, L] tensor with L a multiple of CHUNK; returns [N, L]."""
    N, L = x.shape
    C = CHUNK
    K = L // C
    local = torch.matmul(x.view(N, K, C), _toeplitz(C, gamma, x.dtype, x.device, scale))
    if K > 1:
        # carry[k] = G at the first position of chunk k + 1 (already scaled: local is)
        carry = _scan_any(local[:, 1:, 0], gamma**C)  # [N, K - 1]
        tail = _powers(C, gamma, x.dtype, x.device).flip(0) * gamma  # gamma^(C - t)
        local[:, :-1, :].addcmul_(carry.unsqueeze(-1), tail)
    return local.view(N, L)


def _scan_any(y: Tensor, gamma: float) -> Tensor:
    """Scan of a small [N, M] tensor of any layout (the chunk carries)."""
    N, M = y.shape
    if M <= CHUNK:
        return torch.matmul(y, _toeplitz(M, gamma, y.dtype, y.device))
    padded = y.new_zeros(N, -(-M // CHUNK) * CHUNK)
    padded[:, :M] = y
    return _scan_chunked(padded, gamma, 1.0)[:, :M]
