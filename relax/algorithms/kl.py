"""Per-token KL estimators (reinforce_plus_plus.md §2).

``delta = logp - logp_base``:

| kind         | value                              |
|--------------|------------------------------------|
| ``k1``       | ``delta`` (signed)                 |
| ``k2``       | ``0.5 * delta**2``                 |
| ``k3``       | ``exp(-delta) - 1 + delta``        |
| ``low_var_kl`` | ``k3`` clamped to ``[-10, 10]``  |

The estimators are unmasked token maps; callers reduce them with a mask
(:func:`relax.algorithms.losses.response_mean`), which selects valid tokens with a boolean
(bitwise) select, so values at masked positions never reach the reduced loss. Its gradient
flows back only through valid positions, but a NaN/Inf stored in ``logp_base`` at a masked
position still makes ``0 * NaN`` in the k2/k3 backward: callers sanitize ``logp_base`` first.
"""

from __future__ import annotations

from torch import Tensor

from relax.algorithms._checks import check_float, compute_dtype

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def approx_kl(logp: Tensor, logp_base: Tensor, kind: str) -> Tensor:
    """Token KL estimate of ``kind`` between two log-prob tensors of equal shape ``[B, T]``.

    Returns float32 for float32/bf16/fp16 inputs and float64 for float64 inputs.
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
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta.square()
    k3 = (-delta).exp() - 1.0 + delta
    if kind == "k3":
        return k3
    return k3.clamp(-10.0, 10.0)
