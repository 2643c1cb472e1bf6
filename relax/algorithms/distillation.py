"""On-policy distillation: the per-token reverse KL to a teacher as an advantage term
(reinforce_plus_plus.md §7b).

The student samples; a frozen teacher scores the student's own tokens. With
``d[i,t] = log pi_old(y_t) - log pi_teacher(y_t)`` (the single-sample estimate of the reverse
KL ``KL(pi_student || pi_teacher)`` at the visited context), the advantage of any estimator
becomes ``A[i,t] - C * d[i,t]`` on the valid tokens (mask 1), and the term is a constant of
the loss: both log-probs come from no-grad passes. With no task signal the estimator's
advantage is replaced by 0 and ``-C * d`` is the whole advantage.

Pure tensor functions: the process group of the metric reduction is an argument, nothing
reads a config. Each variant of the term is one entry of :data:`OPD_TERMS`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from relax.algorithms._checks import as_bool_mask, check_like_mask, compute_dtype
from relax.collectives import all_reduce


def _checked(student_log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor):
    m = as_bool_mask(mask)
    check_like_mask(student_log_probs, m, "student_log_probs")
    check_like_mask(teacher_log_probs, m, "teacher_log_probs")
    return m, compute_dtype(student_log_probs, teacher_log_probs)


def opd_reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor) -> Tensor:
    """``d = log pi_student(y_t) - log pi_teacher(y_t)`` [B, T], 0 outside ``mask`` [B, T].

    Both inputs are selected by the mask before the subtraction, so NaN or Inf stored at masked
    positions (padding, environment tokens of an episode) never reaches the result. Detached:
    the term is a reward, not a loss (§7b)."""
    m, dtype = _checked(student_log_probs, teacher_log_probs, mask)
    s = torch.where(m, student_log_probs.detach().to(dtype), 0.0)
    t = torch.where(m, teacher_log_probs.detach().to(dtype), 0.0)
    return s - t


def reverse_kl_term(student_log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor,
                    *, kl_coef: float) -> Tensor:
    """The advantage term ``-C * d`` [B, T] (``C = kl_coef >= 0``), 0 outside the mask."""
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    return -kl_coef * opd_reverse_kl(student_log_probs, teacher_log_probs, mask)


# name -> (student_log_probs, teacher_log_probs, mask, *, kl_coef) -> the term [B, T]
OPD_TERMS: dict[str, Callable[..., Tensor]] = {"reverse_kl": reverse_kl_term}


def distilled_advantages(advantages: Tensor | None, student_log_probs: Tensor,
                         teacher_log_probs: Tensor, mask: Tensor, *, kl_coef: float,
                         term: str = "reverse_kl") -> Tensor:
    """``A - C * d`` [B, T] on the valid tokens, exactly 0 outside ``mask`` (§7b).

    ``advantages`` [B, T] is the estimator's output (after its normalization), or None for
    distillation alone (the task reward gives no signal). The result is detached and has the
    dtype rules of reinforce_plus_plus.md §13."""
    if term not in OPD_TERMS:
        raise ValueError(f"term={term!r} is not a distillation term; valid: "
                         f"{', '.join(OPD_TERMS)}")
    shaped = OPD_TERMS[term](student_log_probs, teacher_log_probs, mask, kl_coef=kl_coef)
    if advantages is None:
        return shaped
    m = as_bool_mask(mask)
    check_like_mask(advantages, m, "advantages")
    dtype = compute_dtype(advantages, shaped)
    base = torch.where(m, advantages.detach().to(dtype), 0.0)
    return base + shaped.to(dtype)


def opd_metrics(student_log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor, *,
                group=None) -> dict[str, Tensor]:
    """Global token means over the valid tokens of every rank of ``group`` (0-d float64):
    ``rollout/opd_reverse_kl`` (mean ``d``) and ``rollout/teacher_logprob`` (mean
    ``log pi_teacher(y_t)``). One all-reduce of three float64 sums; 0 when no token is valid.
    """
    m, _ = _checked(student_log_probs, teacher_log_probs, mask)
    d = opd_reverse_kl(student_log_probs.double(), teacher_log_probs.double(), m)
    teacher = torch.where(m, teacher_log_probs.detach().double(), 0.0)
    sums = all_reduce(torch.stack([d.sum(), teacher.sum(), m.sum().double()]), group)
    count = sums[2].clamp(min=1.0)
    return {"rollout/opd_reverse_kl": sums[0] / count, "rollout/teacher_logprob": sums[1] / count}
