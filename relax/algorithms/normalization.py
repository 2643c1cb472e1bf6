"""Global masked advantage normalization over the data-parallel group (reinforce_plus_plus.md §5, 6).

Two normalizers share one moment computation:

* :func:`masked_population_normalize` (both REINFORCE++ variants, reinforce_plus_plus.md §6): population
  moments (ddof = 0) over every valid token of the global batch, output
  ``(A - mu) * rsqrt(max(var, var_floor))``; an empty global mask is an error.
* :func:`masked_whiten` (group-relative family, reinforce_plus_plus.md §5): Bessel variance (ddof = 1, N = 1
  gives 0), output ``(A - mu) * rsqrt(var + eps)``.

Moments are accumulated in float64 and all-reduced over ``group`` in two collectives
(``[sum, count]``, then the sum of squared deviations), so the result equals normalizing
the concatenation of all ranks' tensors in one process, with the two-pass accuracy that
a one-pass ``E[x^2] - mu^2`` lacks when ``|mu| >> std``. Every rank joins every
collective, including a rank whose tokens are all masked (it contributes zeros), so no
rank waits for another. No value is read back to the host: counts, moments and the
empty-mask check stay on the device (``torch._assert_async``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from relax.algorithms._checks import (
    as_bool_mask,
    check_like_mask,
    compute_dtype,
    count_true,
    keep_bits,
    numpy_path,
    row_counts,
    select_,
    select_copy,
)
from relax.algorithms.advantages import broadcast_masked


@dataclass(frozen=True)
class NormalizationStats:
    """Global moments of one normalization; every field a 0-d tensor (no host sync).

    ``mean``/``var`` are the raw population moments (float64, ddof = 0), ``count`` the global
    number of valid tokens N (int64), ``zero_variance`` whether ``var`` is below the floor
    (bool), ``normalized_mean``/``normalized_std`` the population moments of the output
    (float64). The latter follow from the raw moments by linearity, exactly as the output is
    defined, so they cost no extra pass or collective.
    """

    mean: Tensor
    var: Tensor
    count: Tensor
    zero_variance: Tensor
    normalized_mean: Tensor
    normalized_std: Tensor


def _all_reduce(t: Tensor, group) -> Tensor:
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def f64_sum(x: Tensor, square: bool = False) -> Tensor:
    """Sum (or sum of squares) of a float tensor accumulated in float64, as a 0-d tensor.

    On the CPU the reduction runs in NumPy, whose float64-accumulating reductions widen
    float32 in vectorised blocks; torch's ``sum(dtype=float64)`` and an explicit float64
    copy both measured 3-10x slower there (``benchmarks/bench_algorithms.py``). NumPy's
    pairwise summation also makes sums of equal float32 values exact, so an all-equal batch
    normalizes to exact zeros. Elsewhere torch reduces on the device (no host sync)."""
    flat = x.detach().reshape(-1)
    if not numpy_path(flat):
        return torch.sum(flat.square() if square else flat, dtype=torch.float64)
    a = flat.numpy()
    if square:
        value = np.einsum("i,i->", a, a, dtype=np.float64, casting="safe")
    else:
        value = np.add.reduce(a, dtype=np.float64)
    return torch.tensor(float(value), dtype=torch.float64)


def centred_moments(x: Tensor, mask: Tensor, keep: Tensor, group, *, out: Tensor | None = None):
    """Global float64 moments of ``x`` over ``mask`` and ``x`` centred on the global mean.

    ``x`` [B, T] must already be 0 outside the mask (finite everywhere). Returns
    ``(d, n, mean, m2, shift_error)``: ``d = where(mask, x - shift, 0)`` written into ``out``
    (``out is x`` centres in place), ``shift`` = the float64 mean rounded to ``x``'s dtype,
    ``n`` the global count, ``m2`` the global sum of squared deviations from ``mean`` and
    ``shift_error = mean - shift``. Two all-reduces: ``[sum, count]`` then ``m2``; the second
    pass (deviations, not ``E[x^2] - mu^2``) keeps full accuracy when ``|mu| >> std``.
    """
    first = torch.stack([f64_sum(x), count_true(mask).to(torch.float64)])
    _all_reduce(first, group)
    total, n = first[0], first[1]
    mean = total / n.clamp(min=1.0)
    shift = mean.to(x.dtype)
    d = torch.sub(x, shift, out=x if out is None else out)
    select_(d, keep)  # masked positions back to exactly 0
    # sum (x - mean)^2 = sum (x - shift)^2 - n (mean - shift)^2: exact correction for the
    # rounding of the shift to float32.
    second = f64_sum(d, square=True).reshape(1)
    _all_reduce(second, group)
    shift_error = mean - shift.to(torch.float64)
    m2 = (second[0] - n * shift_error.square()).clamp(min=0.0)
    return d, n, mean, m2, shift_error


def masked_population_normalize(
    values: Tensor, mask: Tensor, *, group=None, var_floor: float = 1e-8
) -> tuple[Tensor, NormalizationStats]:
    """REINFORCE++ global masked population normalization (reinforce_plus_plus.md §6).

    ``values`` [B, T], ``mask`` [B, T] (bool, or numeric read as ``!= 0``); ``group`` the
    data-parallel process group (``None``: this process only). Returns ``A_hat`` [B, T] =
    ``mask * (values - mu) * rsqrt(max(var, var_floor))`` with population moments over
    every valid token on every rank, and the :class:`NormalizationStats`.

    An empty global mask fails on every rank via ``torch._assert_async`` (raises at once on
    the CPU, asynchronously on accelerators); the collectives have already completed, so
    no rank is left waiting.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    dtype = compute_dtype(values)
    keep = keep_bits(m, dtype)
    x = select_copy(values, keep, dtype)
    return population_normalize_clean(x, m, keep, group=group, var_floor=var_floor, inplace=True)


def population_normalize_clean(
    x: Tensor, m: Tensor, keep: Tensor, *, group, var_floor: float = 1e-8, inplace: bool = False,
    out: Tensor | None = None,
) -> tuple[Tensor, NormalizationStats]:
    """:func:`masked_population_normalize` for ``x`` already 0 outside the mask; the result
    goes into ``x`` (``inplace``), into ``out``, or into a new tensor."""
    out = x if inplace else (torch.empty_like(x) if out is None else out)
    d, n, mean, m2, shift_error = centred_moments(x, m, keep, group, out=out)
    inv_std = scale_of("population", n, m2, var_floor=var_floor)
    d.mul_(inv_std.to(d.dtype))  # masked positions stay 0
    return d, _stats(n, mean, m2, var_floor, inv_std, normalized_mean=-shift_error * inv_std)


def scale_of(mode: str, n: Tensor, m2: Tensor, *, var_floor: float = 1e-8, eps: float = 1e-8) -> Tensor:
    """The factor each normalizer multiplies the centred values by (0-d float64).

    ``n`` the global valid-token count, ``m2`` the global sum of squared deviations.

    * ``"population"`` (REINFORCE++, reinforce_plus_plus.md §6): ``rsqrt(max(m2 / N, var_floor))`` -- a floor
      on the population variance, not ``sqrt(var) + eps``; an empty global mask fails here
      on every rank (``torch._assert_async``, after the collectives, so none hangs).
    * ``"whiten"`` (group-relative family, reinforce_plus_plus.md §5): ``rsqrt(m2 / (N - 1) + eps)``, Bessel
      variance, 0 for N = 1.
    """
    if mode == "population":
        torch._assert_async(n > 0, "masked_population_normalize: the global mask has no valid token (N = 0)")
        return torch.rsqrt((m2 / n.clamp(min=1.0)).clamp(min=var_floor))
    sample_var = torch.where(n > 1, m2 / (n - 1).clamp(min=1.0), torch.zeros_like(m2))
    return torch.rsqrt(sample_var + eps)


def _stats(n, mean, m2, var_floor, inv_std=None, normalized_mean=None) -> NormalizationStats:
    """The stats object from the global moments; the output's moments follow by linearity
    (``inv_std=None``: no normalization, output = raw values)."""
    var = m2 / n.clamp(min=1.0)
    return NormalizationStats(
        mean=mean,
        var=var,
        count=n.to(torch.int64),
        zero_variance=var < var_floor,
        normalized_mean=mean if inv_std is None else normalized_mean,
        normalized_std=torch.sqrt(var) if inv_std is None else torch.sqrt(var) * inv_std,
    )


def masked_whiten(values: Tensor, mask: Tensor, *, group=None, eps: float = 1e-8) -> Tensor:
    """Classic whitening of the group-relative family (reinforce_plus_plus.md §5) [B, T].

    Global masked mean, Bessel-corrected variance (ddof = 1; N = 1 gives 0), output
    ``(values - mu) * rsqrt(var + eps)``, 0 outside the mask.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    dtype = compute_dtype(values)
    keep = keep_bits(m, dtype)
    x = select_copy(values, keep, dtype)
    return whiten_clean(x, m, keep, group=group, eps=eps, inplace=True)[0]


def whiten_clean(
    x: Tensor, m: Tensor, keep: Tensor, *, group, eps: float = 1e-8, var_floor: float = 1e-8,
    inplace: bool = False, out: Tensor | None = None,
) -> tuple[Tensor, NormalizationStats]:
    """:func:`masked_whiten` for ``x`` already 0 outside the mask, plus the stats object of
    the population normalizer (``var`` reported as the population variance; ``var_floor``
    only decides ``zero_variance``)."""
    out = x if inplace else (torch.empty_like(x) if out is None else out)
    d, n, mean, m2, shift_error = centred_moments(x, m, keep, group, out=out)
    inv_std = scale_of("whiten", n, m2, eps=eps)
    d.mul_(inv_std.to(d.dtype))
    return d, _stats(n, mean, m2, var_floor, inv_std, normalized_mean=-shift_error * inv_std)


def moments_clean(
    x: Tensor, m: Tensor, keep: Tensor, *, group, var_floor: float = 1e-8, out: Tensor | None = None
) -> NormalizationStats:
    """Global population moments of ``x`` (already 0 outside the mask) without normalizing;
    raw and "normalized" fields coincide. For metrics when no normalization is requested.
    ``out`` is scratch space for the deviations (allocated when ``None``)."""
    _, n, mean, m2, _ = centred_moments(x, m, keep, group, out=torch.empty_like(x) if out is None else out)
    return _stats(n, mean, m2, var_floor)


def normalize_rows(
    rows: Tensor, m: Tensor, dtype: torch.dtype, *, mode: str, group, var_floor: float = 1e-8,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor, NormalizationStats]:
    """The normalizations above for raw advantages that are one value per response.

    ``rows`` float64 [B] (the value of every valid token of response i), ``m`` bool
    [B, T]; ``mode`` "population" (reinforce_plus_plus.md §6), "whiten" (reinforce_plus_plus.md §5, ddof = 1) or "none" (moments
    only). Returns ``(advantages [B, T], raw [B, T], stats)``; for "none" the advantages
    are the raw tensor. Same moments, collectives and outputs as the token-level functions,
    but each token sum becomes a sum over responses weighted by ``L_i`` (float64 on [B]),
    so the only [B, T] work is writing the two outputs.
    """
    rows = rows.to(dtype).double()  # the values the raw tensor holds
    counts = row_counts(m).to(torch.float64)
    first = torch.stack([(counts * rows).sum(), counts.sum()])
    _all_reduce(first, group)
    total, n = first[0], first[1]
    mean = total / n.clamp(min=1.0)
    second = (counts * (rows - mean).square()).sum().reshape(1)
    _all_reduce(second, group)
    m2 = second[0]
    raw = broadcast_masked(rows, m, dtype)
    if mode == "none":
        return raw, raw, _stats(n, mean, m2, var_floor)
    inv_std = scale_of(mode, n, m2, var_floor=var_floor, eps=eps)
    advantages = broadcast_masked((rows - mean) * inv_std, m, dtype)
    # centred in float64 before the cast, so the output's mean is 0 by linearity
    return advantages, raw, _stats(n, mean, m2, var_floor, inv_std, torch.zeros_like(mean))
