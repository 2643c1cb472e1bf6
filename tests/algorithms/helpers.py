"""Batch builders and comparison helpers shared by the algorithm tests (no production math)."""

from __future__ import annotations

import math

import numpy as np
import torch

SENTINELS = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)

# Tolerances for production output vs the float64 reference, by input dtype.
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=2e-5, atol=2e-5)}


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    """reinforce_plus_plus.md §13: float64 in -> float64 out; float32/bf16/fp16 in -> float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def random_mask(rng: np.random.Generator, B: int, T: int, *, holes: bool = True,
                masked_rows: tuple[int, ...] = (), lead: bool = True) -> torch.Tensor:
    """Right-padded response masks of random length, optional leading zeros and holes."""
    m = np.zeros((B, T), dtype=bool)
    for i in range(B):
        length = int(rng.integers(1, T + 1))
        start = int(rng.integers(0, max(1, T - length + 1))) if lead else 0
        m[i, start:start + length] = True
        if holes and length > 2:
            for t in range(start + 1, start + length - 1):
                if rng.random() < 0.25:
                    m[i, t] = False
    for i in masked_rows:
        m[i] = False
    return torch.from_numpy(m)


def poison(x: torch.Tensor, mask: torch.Tensor, sentinel: float | None = None,
           rng: np.random.Generator | None = None) -> torch.Tensor:
    """Copy of ``x`` with every masked position set to a sentinel (cycled if none given)."""
    x = x.detach().clone()
    bad = ~mask.bool()
    if sentinel is not None:
        x[bad] = sentinel
    else:
        n = int(bad.sum())
        vals = torch.tensor([SENTINELS[k % len(SENTINELS)] for k in range(n)], dtype=torch.float64)
        if rng is not None and n:
            vals = vals[torch.from_numpy(rng.permutation(n))]
        x[bad] = vals.to(x.dtype)
    return x


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a), dtype=dtype)


def assert_ref(got: torch.Tensor, ref, dtype: torch.dtype, *, scale: float | None = None,
               what: str = "") -> None:
    """Compare a production tensor with a float64 reference array.

    float32 tolerance is relative to ``scale`` (default: max(1, max|ref|)), because the
    float32 error of sums/normalizations grows with the magnitude of the quantities.
    """
    ref = np.asarray(ref, dtype=np.float64)
    assert tuple(got.shape) == ref.shape, f"{what}: shape {tuple(got.shape)} != {ref.shape}"
    g = got.detach().double().numpy()
    assert np.all(np.isfinite(g)), f"{what}: non-finite output {g}"
    tol = TOL[torch.float64 if dtype == torch.float64 else torch.float32]
    if scale is None:
        scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    err = np.abs(g - ref)
    bound = tol["atol"] * scale + tol["rtol"] * np.abs(ref)
    if not np.all(err <= bound):
        k = np.unravel_index(int(np.argmax(err - bound)), err.shape) if err.ndim else ()
        raise AssertionError(
            f"{what}: max violation at {k}: got {g[k]!r}, ref {ref[k]!r} (dtype {dtype}, "
            f"scale {scale:g})\ngot={g}\nref={ref}"
        )


def assert_zero_outside(x: torch.Tensor, mask: torch.Tensor, what: str = "") -> None:
    bad = ~mask.bool()
    vals = x.detach()[bad]
    if vals.dtype == torch.bool:
        assert not bool(vals.any()), f"{what}: True outside the mask"
    else:
        assert bool((vals == 0).all()), f"{what}: nonzero outside the mask: {vals}"


def safe_flags(rho: np.ndarray, eps_low: float, eps_high: float, tol: float = 1e-4) -> np.ndarray:
    """Positions whose ratio is not within ``tol`` of a clip bound (flags are stable there)."""
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    return (np.abs(rho - lo) > tol) & (np.abs(rho - hi) > tol)


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))
