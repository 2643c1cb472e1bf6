"""Per-token policy losses and their reductions (reinforce_plus_plus.md §7).

Three separate pieces, tested separately (STYLE principle 3):

* per-token losses: :func:`ppo_clip_loss`, :func:`gspo_loss`, :func:`sapo_loss`, each
  ``[B, T] -> [B, T]``, 0 outside the mask;
* reductions: :func:`response_mean` (the formal objective of every estimator) and
  :func:`token_mean` (``--calculate-per-token-loss``, group-relative family only);
* the distributed denominator: ``num_responses`` / ``num_tokens`` are passed in by the
  caller (the optimizer step's global count), so summing the per-micro-batch, per-rank
  values gives the whole-batch objective and the same gradient.

NaN or Inf stored at masked positions of log-probs or advantages reaches neither the loss
nor the gradient that flows back into ``log_probs``: every step is elementwise (or, for
GSPO's sequence ratio, a row sum of already selected values) and the results are selected
bitwise (reinforce_plus_plus.md §1: a boolean select, never a multiplication by the mask). Nothing here reads
a value back to the host.

Speed: each loss (:class:`_PPOClip`, :class:`_GSPO`, :class:`_SAPO`) and the reductions
(:class:`_MaskedRowSum`) are ``autograd.Function`` s with hand-written gradients that reuse
their own buffers; the plain autograd composition allocated ~8-12 fresh [B, T] tensors (each
costs about one copy in page faults on the CPU). The tests compare every Function with the
plain composition (kept there) and the float64 reference; ``benchmarks/bench_algorithms.py``
measures them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from relax.algorithms._checks import (
    _INT_OF,
    as_bool_mask,
    check_like_mask,
    compute_dtype,
    count_true,
    float_bits,
    keep_bits,
    row_counts,
    select_,
    select_copy,
    select_into,
)


def _checked(log_probs, old_log_probs, advantages, mask):
    m = as_bool_mask(mask)
    check_like_mask(log_probs, m, "log_probs")
    check_like_mask(old_log_probs, m, "old_log_probs")
    check_like_mask(advantages, m, "advantages")
    return m, compute_dtype(log_probs, old_log_probs, advantages)


def _check_dual(eps_clip_c) -> None:
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c={eps_clip_c!r} must be > 1 (dual clip)")


class _PPOClip(torch.autograd.Function):
    """The PPO clip of :func:`ppo_clip_loss` with a hand-written gradient.

    Why: the autograd composition makes ~12 passes over [B, T] and ~8 fresh [B, T]
    allocations (each fresh 32 MB costs about one copy in page faults on the CPU), ~30x
    a copy forward+backward. Here the forward runs in place on two owned buffers and the
    backward is one multiply.

    The gradient. Where the unclipped branch sets the value, ``pg = -A*rho`` and
    ``d pg / d log_probs = -A*rho = pg`` (``d rho / d lp = rho``). Where a clipped branch
    sets it (``clipped``: the bound ``-A*clip(rho)`` is strictly larger, or the dual clip
    ``-c*A``), the value is constant in ``log_probs``: gradient 0. Masked positions: 0. So

        coef = pg   where mask & ~clipped,   0 elsewhere;   grad_lp = grad_pg * coef.

    At a tie (``-A*clip(rho) == -A*rho``) both branches have the same derivative, which
    is what the composition's ``maximum`` (half to each side) adds up to as well.

    Masking: every operation is elementwise, so a NaN or Inf stored at a masked position
    only reaches that position's results, which the final bitwise selects reset to +0.0
    (reinforce_plus_plus.md §1: a boolean select, nothing is multiplied by the mask).
    """

    @staticmethod
    def forward(ctx, lp, old, adv, mask, low, high, dual_c):
        # lp, old, adv: [B, T] in the compute dtype; mask: bool [B, T].
        zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
        pg = torch.sub(lp, old).exp_()  # rho
        scratch = torch.addcmul(zero, pg, adv, value=-1)  # -A*rho, one pass
        pg.clamp_(low, high)
        torch.addcmul(zero, pg, adv, value=-1, out=pg)  # -A*clip(rho)
        clipped = torch.gt(pg, scratch)  # the clipped branch is strictly larger
        torch.maximum(pg, scratch, out=pg)
        if dual_c is not None:  # A < 0: pg = min(pg, -c*A)
            torch.mul(adv, -dual_c, out=scratch)
            dual = torch.lt(scratch, pg).logical_and_(adv < 0)
            torch.where(dual, scratch, pg, out=pg)
            clipped.logical_or_(dual)
        clipped.logical_and_(mask)
        select_(pg, keep_bits(mask, pg.dtype))
        # scratch becomes the gradient coefficient (no new buffer).
        coef = select_into(pg, keep_bits(clipped, pg.dtype, invert=True), out=scratch)
        ctx.save_for_backward(pg, clipped)
        ctx.coef = coef  # handed to the first backward, see there
        ctx.mark_non_differentiable(clipped)
        ctx.set_materialize_grads(False)  # no [B, T] zeros for the flags' (absent) gradient
        return pg, clipped

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_pg, _grad_clipped):
        if grad_pg is None:
            return (None,) * 7
        coef, ctx.coef = ctx.coef, None
        if coef is None:
            # A second backward through the same graph (retain_graph=True): the first one
            # wrote its gradient into the coefficient buffer, so rebuild it from the saved
            # outputs (pg is already 0 outside the mask).
            pg, clipped = ctx.saved_tensors
            coef = pg.masked_fill(clipped, 0.0)
        # In place: the coefficient buffer becomes the gradient (saves a B x T allocation).
        return coef.mul_(grad_pg), None, None, None, None, None, None


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate per token (GRPO and both REINFORCE++ variants).

        rho = exp(log_probs - old_log_probs)                        (no clamp)
        pg  = max(-rho*A, -clip(rho, 1 - eps_clip, 1 + eps_clip_high)*A)
        A < 0 and eps_clip_c = c > 1:  pg = min(pg, -c*A)

    Args are all [B, T]. Returns ``(pg [B, T], clipped [B, T] bool)``; ``clipped`` marks the
    valid tokens where a clipped branch (either bound or the dual clip) sets the value.
    Computed by :class:`_PPOClip` (gradient into ``log_probs`` only; the old log-probs and
    the advantages are constants of the loss).
    """
    _check_dual(eps_clip_c)
    m, dtype = _checked(log_probs, old_log_probs, advantages, mask)
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    return _PPOClip.apply(
        log_probs.to(dtype),
        old_log_probs.detach().to(dtype),
        advantages.detach().to(dtype),
        m,
        1.0 - eps_clip,
        1.0 + eps_high,
        eps_clip_c,
    )


class _GSPO(torch.autograd.Function):
    """The GSPO loss of :func:`gspo_loss` with a hand-written gradient (why: see _PPOClip).

    ``s_i`` depends on every valid token of row i: ``d s_i / d lp[i,u] = s_i * m[i,u] / L_i``.
    Where the unclipped branch sets token t, ``pg_t = -A_t * s_i`` and ``d pg_t / d s_i *
    s_i = pg_t``; elsewhere 0. So with ``coef = pg`` on valid unclipped tokens (0 elsewhere,
    as in _PPOClip):

        grad_lp[i,u] = m[i,u] / L_i * sum_t grad_pg[i,t] * coef[i,t]

    a row reduction and a broadcast, both written into the coefficient buffer.
    """

    @staticmethod
    def forward(ctx, lp, old, adv, mask, length, low, high):
        # length: [B] valid tokens per row, clamped to >= 1, in the compute dtype.
        dtype = lp.dtype
        keep = keep_bits(mask, dtype)
        diff = select_(torch.sub(lp, old), keep)  # masked log-ratios, +0.0 elsewhere
        seq_ratio = torch.exp(diff.sum(dim=1) / length)  # s_i [B]; 1 for an empty row
        unclipped = torch.mul(adv, (-seq_ratio)[:, None], out=diff)  # -A*s
        pg = torch.mul(adv, (-seq_ratio.clamp(low, high))[:, None])  # -A*clip(s)
        clipped = torch.gt(pg, unclipped)
        torch.maximum(pg, unclipped, out=pg)
        clipped.logical_and_(mask)
        select_(pg, keep)
        coef = select_into(pg, keep_bits(clipped, dtype, invert=True), out=diff)
        ctx.save_for_backward(pg, clipped, mask, length)
        ctx.coef = coef  # handed to the first backward, as in _PPOClip
        ctx.mark_non_differentiable(clipped)
        ctx.set_materialize_grads(False)
        return pg, clipped

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_pg, _grad_clipped):
        if grad_pg is None:
            return (None,) * 7
        pg, clipped, mask, length = ctx.saved_tensors
        coef, ctx.coef = ctx.coef, None
        if coef is None:  # a second backward (retain_graph=True): rebuild, see _PPOClip
            coef = pg.masked_fill(clipped, 0.0)
        row = coef.mul_(grad_pg).sum(dim=1) / length  # [B]
        grad = select_into(row[:, None], keep_bits(mask, pg.dtype), out=coef)
        return grad, None, None, None, None, None, None


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """GSPO: the sequence ratio ``s_i = exp(mean_t over valid tokens (log_probs - old))``
    replaces ``rho`` on every valid token of response ``i``, then the PPO clip (reinforce_plus_plus.md §7).

    A fully masked response has ``s_i = 1`` and contributes 0. Returns ``(pg, clipped)``.
    Computed by :class:`_GSPO`.
    """
    m, dtype = _checked(log_probs, old_log_probs, advantages, mask)
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    length = row_counts(m).clamp(min=1).to(dtype)
    return _GSPO.apply(
        log_probs.to(dtype), old_log_probs.detach().to(dtype), advantages.detach().to(dtype), m, length,
        1.0 - eps_clip, 1.0 + eps_high,
    )


class _SAPO(torch.autograd.Function):
    """The SAPO gate of :func:`sapo_loss` with a hand-written gradient (why: see _PPOClip).

        s = sigmoid(tau * (rho - 1)),  pg = -4 * s * A / tau
        d pg / d log_probs = -4 * A * s * (1 - s) * rho     (the 1/tau cancels the chain's tau)

    ``coef`` (the derivative, 0 outside the mask) is computed in the forward; the backward
    is one multiply. As in _PPOClip every step is elementwise and the results are selected
    bitwise at the end, so masked NaN/Inf reach nothing.
    """

    @staticmethod
    def forward(ctx, lp, old, adv, mask, tau_pos, tau_neg):
        dtype = lp.dtype
        zero = torch.zeros((), dtype=dtype, device=lp.device)
        rho = torch.sub(lp, old).exp_()
        # tau by the sign of A, selected on the bit patterns (exact, no bool where):
        # tau = tau_neg ^ (bits(A > 0) & (tau_pos ^ tau_neg)).
        pos_bits, neg_bits = float_bits(tau_pos, dtype), float_bits(tau_neg, dtype)
        tau_bits = torch.full(lp.shape, pos_bits ^ neg_bits, dtype=_INT_OF[dtype], device=lp.device)
        select_(tau_bits.view(dtype), keep_bits(torch.gt(adv, 0), dtype))
        tau = tau_bits.bitwise_xor_(neg_bits).view(dtype)
        gate = torch.sub(rho, 1).mul_(tau).sigmoid_()  # s
        pg = torch.div(gate, tau, out=tau)
        torch.addcmul(zero, pg, adv, value=-4, out=pg)  # -4 s A / tau
        rho.mul_(gate)
        torch.addcmul(rho, rho, gate, value=-1, out=rho)  # rho s - rho s^2 = rho s (1 - s)
        coef = torch.addcmul(zero, rho, adv, value=-4, out=rho)
        keep = keep_bits(mask, dtype)
        select_(pg, keep)
        select_(coef, keep)
        ctx.save_for_backward(coef)
        return pg

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_pg):
        (coef,) = ctx.saved_tensors
        return grad_pg * coef, None, None, None, None, None


def sapo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> Tensor:
    """SAPO soft gate per token: ``pg = -f(rho) * A``, ``f(rho) = 4 sigmoid(tau (rho - 1)) / tau``
    with ``tau = tau_pos`` where ``A > 0`` else ``tau_neg`` (reinforce_plus_plus.md §7). Returns ``pg`` [B, T].

    Computed by :class:`_SAPO` (taus in the compute dtype: a float32 1.05 would bias
    float64 results); gradient into ``log_probs`` only."""
    m, dtype = _checked(log_probs, old_log_probs, advantages, mask)
    return _SAPO.apply(
        log_probs.to(dtype), old_log_probs.detach().to(dtype), advantages.detach().to(dtype), m,
        float(tau_pos), float(tau_neg),
    )


class _MaskedRowSum(torch.autograd.Function):
    """``sum_i (1/divisor_i) * sum_t m[i,t] * values[i,t]``, a scalar, with a bitwise select.

    ``values`` [B, T] (float32/float64), ``mask`` bool [B, T], ``divisor`` [B] or ``None``
    (all 1). The shared kernel of :func:`response_mean` and :func:`token_mean`.

    Why a Function: ``torch.where`` with a bool condition costs ~1.5 copies per call on
    the CPU, a bitwise AND with the mask's keep words ~0.2. The forward's selected copy is
    handed to the backward, which writes the gradient ``grad / divisor_i`` (valid tokens;
    +0.0 elsewhere) into it: one [B, T] allocation in all.
    """

    @staticmethod
    def forward(ctx, values, mask, divisor):
        picked = select_copy(values, keep_bits(mask, values.dtype), values.dtype)
        rows = picked.sum(dim=1)
        if divisor is not None:
            rows = rows / divisor
        ctx.save_for_backward(mask)
        ctx.divisor, ctx.buffer = divisor, picked
        return rows.sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        buffer, ctx.buffer = ctx.buffer, None  # the first backward takes the buffer
        if buffer is None:  # a second backward (retain_graph=True): the first one owns it
            buffer = torch.empty(mask.shape, dtype=grad.dtype, device=grad.device)
        scale = grad.expand(mask.shape[0]) if ctx.divisor is None else grad / ctx.divisor
        return select_into(scale.contiguous()[:, None], keep_bits(mask, grad.dtype), out=buffer), None, None


def response_mean(values: Tensor, mask: Tensor, *, num_responses: int | Tensor | None = None) -> Tensor:
    """``(1/B) * sum_i (1/L_i) * sum_t m[i,t] * values[i,t]`` (reinforce_plus_plus.md §7), a scalar.

    ``num_responses`` = B of the optimizer step's *global* batch (all micro-batches, all
    ranks) so per-micro-batch values add up to the objective; defaults to this batch's
    rows. Responses with ``L_i = 0`` add 0 but still count in B.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    v = values.to(compute_dtype(values))
    length = row_counts(m).clamp(min=1).to(v.dtype)
    denom = m.shape[0] if num_responses is None else num_responses
    return _MaskedRowSum.apply(v, m, length) / denom


def token_mean(values: Tensor, mask: Tensor, *, num_tokens: int | Tensor | None = None) -> Tensor:
    """``sum_S values / N`` over valid tokens, a scalar. ``num_tokens`` = the optimizer
    step's global valid-token count (default: this batch's count, at least 1)."""
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    v = values.to(compute_dtype(values))
    denom = count_true(m).clamp(min=1).to(v.dtype) if num_tokens is None else num_tokens
    return _MaskedRowSum.apply(v, m, None) / denom
