"""On-policy self-distillation (OPSD): the clipped full-vocabulary generalized JSD between the
student and a teacher that saw privileged information (reinforce_plus_plus.md §7b, "Self
mode").

For one token position with student log-probs ``s = log_softmax(z_S / tau)`` [V] and teacher
log-probs ``t = log_softmax(z_T / tau)`` [V] (the teacher detached), mixture weight
``beta`` in [0, 1]:

    M         = (1 - beta) * P_S + beta * P_T
    JSD_beta  = beta * KL(P_T || M) + (1 - beta) * KL(P_S || M)      0 < beta < 1
    JSD_0     = KL(P_T || P_S)     (forward KL)      JSD_1 = KL(P_S || P_T)   (reverse KL)

(slime's and TRL's convention: the endpoints are the KLs themselves, not the limits of the
formula, which are 0), and the per-token loss is ``min(JSD_beta, c)`` (``c`` the clip): a
token whose divergence exceeds ``c`` adds ``c`` and no gradient.

Pure tensor functions over rows of logits [N, V]; the caller picks the rows (the valid tokens)
and bounds N (the trainer runs them in chunks, relax/trainer/terms/self_distillation.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from relax.algorithms._checks import compute_dtype

# the columns of :func:`opsd_token_terms`'s detached statistics
STAT_NAMES = ("jsd", "clipped", "reverse_kl", "teacher_logprob")


def _log_probs(logits: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    logits = logits.to(dtype)
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``KL(P || Q)`` [N] from log-probs [N, V]."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def jsd_from_log_probs(s: Tensor, t: Tensor, beta: float) -> Tensor:
    """``JSD_beta`` [N] of the module docstring from student / teacher log-probs [N, V]."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return _kl(t, s)
    if beta == 1.0:
        return _kl(s, t)
    # log M in log space (no underflow of the two probabilities' sum)
    m = torch.logaddexp(s + math.log(1.0 - beta), t + math.log(beta))
    return beta * _kl(t, m) + (1.0 - beta) * _kl(s, m)


def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, *, beta: float,
                    temperature: float = 1.0) -> Tensor:
    """``JSD_beta`` [N] between rows of logits [N, V]; gradients reach ``student_logits`` only.
    float32 (float64 when an input is float64)."""
    dtype = compute_dtype(student_logits, teacher_logits)
    s = _log_probs(student_logits, temperature, dtype)
    t = _log_probs(teacher_logits.detach(), temperature, dtype)
    return jsd_from_log_probs(s, t, beta)


def opsd_token_terms(student_logits: Tensor, teacher_logits: Tensor, targets: Tensor, *,
                     beta: float, clip: float, temperature: float = 1.0
                     ) -> tuple[Tensor, Tensor]:
    """The per-token loss ``min(JSD_beta, clip)`` [N] (with the student's gradient) and the
    detached statistics [N, 4] in the order of :data:`STAT_NAMES`: the unclipped JSD, 1.0 where
    the clip bound, the full-vocabulary reverse KL ``KL(P_S || P_T)``, and the teacher's
    log-prob of the sampled token ``targets`` [N]."""
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    dtype = compute_dtype(student_logits, teacher_logits)
    s = _log_probs(student_logits, temperature, dtype)
    t = _log_probs(teacher_logits.detach(), temperature, dtype)
    jsd = jsd_from_log_probs(s, t, beta)
    with torch.no_grad():
        stats = torch.stack([jsd, (jsd > clip).to(dtype), _kl(s, t),
                             t.gather(-1, targets.unsqueeze(-1)).squeeze(-1)], dim=-1)
    return jsd.clamp(max=clip), stats
