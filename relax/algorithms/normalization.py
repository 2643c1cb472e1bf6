"""Global masked advantage normalization over the data-parallel group (reinforce_plus_plus.md §5, 6).

Two normalizers share one moment computation, :func:`masked_moments`:

* :func:`masked_population_normalize` (both REINFORCE++ variants, §6): population moments
  (ddof = 0) over every valid token of the global batch, output
  ``(A - mu) * rsqrt(max(var, var_floor))``; an empty global mask is an error.
* :func:`masked_whiten` (group-relative family, §5): Bessel variance (ddof = 1, N = 1 gives 0),
  output ``(A - mu) * rsqrt(var + eps)``.

Moments are float64 and all-reduced over ``group`` in two collectives (``[sum, count]``, then
the deviations), so the result equals normalizing the concatenation of all ranks' tensors in one
process, with the accuracy of two passes (``E[x^2] - mu^2`` loses it when ``|mu| >> std``).
Every rank joins every collective, including a rank whose tokens are all masked, so none waits
for another; no value is read back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from relax.algorithms._checks import as_bool_mask, check_like_mask, compute_dtype
from relax.collectives import all_reduce


@dataclass(frozen=True)
class NormalizationStats:
    """Global moments of one normalization; every field a 0-d tensor (no host sync).

    ``mean``/``var`` the raw population moments (float64, ddof = 0), ``count`` the global number
    of valid tokens N (int64), ``zero_variance`` whether ``var`` is below the floor (bool),
    ``normalized_mean``/``normalized_std`` the population moments of the output (float64),
    which follow from the raw moments by linearity (no extra pass or collective).
    """

    mean: Tensor
    var: Tensor
    count: Tensor
    zero_variance: Tensor
    normalized_mean: Tensor
    normalized_std: Tensor


@dataclass(frozen=True)
class Moments:
    """Global float64 moments of a masked ``[B, T]`` tensor (see :func:`masked_moments`)."""

    count: Tensor  # N, 0-d
    mean: Tensor  # 0-d
    centred: Tensor  # [B, T] float64: x - mean on valid tokens, 0 elsewhere
    centred_sum: Tensor  # 0-d: sum of ``centred`` (0 up to rounding)
    m2: Tensor  # 0-d: sum of squared deviations


def masked_moments(values: Tensor, mask: Tensor, group) -> Moments:
    """Two-pass global moments of ``values`` over the bool ``mask`` (both ``[B, T]``).

    NaN or Inf at masked positions is selected away before any sum (reinforce_plus_plus.md §1)."""
    x = torch.where(mask, values.detach().double(), 0.0)
    first = all_reduce(torch.stack([x.sum(), mask.sum().double()]), group)
    total, count = first[0], first[1]
    mean = total / count.clamp(min=1.0)
    centred = torch.where(mask, x - mean, 0.0)
    second = all_reduce(torch.stack([centred.sum(), centred.square().sum()]), group)
    return Moments(count, mean, centred, second[0], second[1])


def stats_of(mo: Moments, inv_std: Tensor | None, var_floor: float) -> NormalizationStats:
    """The stats of an output ``centred * inv_std`` (``inv_std=None``: the raw values)."""
    var = mo.m2 / mo.count.clamp(min=1.0)
    if inv_std is None:
        normalized_mean, normalized_std = mo.mean, var.sqrt()
    else:
        normalized_mean = mo.centred_sum / mo.count.clamp(min=1.0) * inv_std
        normalized_std = var.sqrt() * inv_std
    return NormalizationStats(
        mean=mo.mean, var=var, count=mo.count.to(torch.int64), zero_variance=var < var_floor,
        normalized_mean=normalized_mean, normalized_std=normalized_std,
    )


def population_scale(mo: Moments, var_floor: float) -> Tensor:
    """``rsqrt(max(m2 / N, var_floor))`` (§6): a floor on the population variance, not
    ``sqrt(var) + eps``. An empty global mask fails here on every rank, after the collectives,
    so none is left waiting (``torch._assert_async``: at once on the CPU, later on a GPU)."""
    torch._assert_async(mo.count > 0, "masked_population_normalize: the global mask has no valid token (N = 0)")
    return torch.rsqrt((mo.m2 / mo.count.clamp(min=1.0)).clamp(min=var_floor))


def whiten_scale(mo: Moments, eps: float) -> Tensor:
    """``rsqrt(m2 / (N - 1) + eps)`` (§5): Bessel variance, 0 for N <= 1."""
    sample_var = torch.where(mo.count > 1, mo.m2 / (mo.count - 1).clamp(min=1.0), 0.0)
    return torch.rsqrt(sample_var + eps)


def masked_population_normalize(
    values: Tensor, mask: Tensor, *, group=None, var_floor: float = 1e-8
) -> tuple[Tensor, NormalizationStats]:
    """REINFORCE++ global masked population normalization (reinforce_plus_plus.md §6).

    ``values`` ``[B, T]``, ``mask`` ``[B, T]`` (bool, or numeric read as ``!= 0``); ``group`` the
    data-parallel process group (``None``: this process only). Returns ``A_hat`` ``[B, T]`` =
    ``m * (values - mu) * rsqrt(max(var, var_floor))`` with population moments over every valid
    token on every rank, and the :class:`NormalizationStats`.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    mo = masked_moments(values, m, group)
    inv_std = population_scale(mo, var_floor)
    return (mo.centred * inv_std).to(compute_dtype(values)), stats_of(mo, inv_std, var_floor)


def masked_whiten(values: Tensor, mask: Tensor, *, group=None, eps: float = 1e-8) -> Tensor:
    """Whitening of the group-relative family (reinforce_plus_plus.md §5), ``[B, T]``.

    Global masked mean, Bessel-corrected variance (ddof = 1; N = 1 gives 0), output
    ``(values - mu) * rsqrt(var + eps)``, 0 outside the mask.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    mo = masked_moments(values, m, group)
    return (mo.centred * whiten_scale(mo, eps)).to(compute_dtype(values))
