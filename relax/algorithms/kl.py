"""Per-token KL estimators (reinforce_plus_plus.md §2).

``delta = logp - logp_base``:

| kind           | value                            |
|----------------|----------------------------------|
| ``k1``         | ``delta`` (signed)               |
| ``k2``         | ``0.5 * delta**2``               |
| ``k3``         | ``exp(-delta) - 1 + delta``      |
| ``low_var_kl`` | ``k3`` clamped to ``[-10, 10]``  |
"""

from __future__ import annotations

import torch
from torch import Tensor

from relax.algorithms._checks import as_bool_mask, check_float, check_like_mask, compute_dtype
from relax.estimators import KL_KINDS


def approx_kl(logp: Tensor, logp_base: Tensor, kind: str, *, mask: Tensor | None = None) -> Tensor:
    """Token KL estimate of ``kind`` between two log-prob tensors of shape ``[B, T]``.

    With ``mask`` (``[B, T]``, reinforce_plus_plus.md §1) the result is 0 at masked positions
    and so is the gradient there, even where either input holds NaN or Inf: ``delta`` is
    selected before the nonlinear estimators see it (selecting only the result would give
    ``0 * NaN`` in their backward). Returns float32 for float32/bf16/fp16 inputs and float64
    for float64 inputs.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind={kind!r} is not a KL estimator; valid kinds: {', '.join(KL_KINDS)}")
    check_float(logp, "logp")
    check_float(logp_base, "logp_base")
    if logp.shape != logp_base.shape:
        raise ValueError(
            f"logp has shape {tuple(logp.shape)} but logp_base has shape {tuple(logp_base.shape)}"
        )
    dtype = compute_dtype(logp, logp_base)
    delta = logp.to(dtype) - logp_base.to(dtype)
    if mask is not None:
        m = as_bool_mask(mask)
        check_like_mask(logp, m, "logp")
        delta = torch.where(m, delta, 0.0)
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta.square()
    k3 = torch.exp(-delta) - 1.0 + delta
    return k3 if kind == "k3" else k3.clamp(-10.0, 10.0)
