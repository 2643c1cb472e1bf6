"""The policy update of one rollout step: ``--num-steps-per-rollout`` AdamW steps (reinforce_plus_plus.md §7).

Each optimizer step takes ``global_batch_size / world_size`` local samples in micro-batches.
Every micro-batch loss is already divided by the GLOBAL count of the step -- ``B`` responses
(response mean) or ``N_step`` valid tokens (``--calculate-per-token-loss``) -- so the sum over
micro-batches and ranks is the whole-batch loss, and ranks sum (not average) their gradients
(see ``distributed.py``). The step's metrics are partial sums reduced the same way, with one
all-reduce per optimizer step, which is also where a non-finite loss or gradient norm stops
training before ``optimizer.step()``.

Rows that cannot move the parameters skip the backward: with no KL loss and no entropy bonus,
a response whose advantages are all exactly 0 contributes exactly 0 to every policy loss and to
its gradient (each loss is the advantage times a finite factor), so it needs a forward for the
step's metrics and nothing more (``inert_rows``). Its share still counts in the denominators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from relax.algorithms import (
    approx_kl,
    compute_policy_loss,
    mismatch_sums,
    response_mean,
    token_mean,
)
from relax.collectives import all_reduce
from relax.config.sections import AlgorithmSection
from relax.errors import NonFiniteError
from relax.precision import autocast
from relax.trainer.distributed import DistContext, no_grad_sync, unwrap
from relax.trainer.experience import Experience, micro_batches
from relax.trainer.logprobs import packs, response_rows, rows_log_probs, token_slots
from relax.trainer.off_policy import OffPolicy, behaviour_log_probs, corrected


@dataclass(frozen=True)
class LossSettings:
    """What the update's loss reads: the algorithm section as it is (estimator, clips, KL
    loss, entropy, reduction; reinforce_plus_plus.md §7), the off-policy correction (§7a), and
    how the passes run: the rollout's sampling ``temperature`` (log-probs of softmax(z / T)),
    ``bf16`` autocast (relax/precision.py), the token budget of a micro-batch (``max_tokens``,
    relax/trainer/experience.py) and ``--pass-layout`` (relax/trainer/packing.py)."""

    algorithm: AlgorithmSection = AlgorithmSection()
    off_policy: OffPolicy = OffPolicy()
    temperature: float = 1.0
    bf16: bool = False
    max_tokens: int | None = None
    layout: str = "shared-prefix"
    opsd: bool = False  # --opd-type self: the JSD loss of relax/trainer/self_distill.py (§7b)

    @property
    def metric_names(self) -> tuple[str, ...]:
        names = ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl",
                 "train/entropy")
        return (names + (("train/kl_loss",) if self.algorithm.use_kl_loss else ())
                + self.off_policy.metric_names + (OPSD_METRICS if self.opsd else ()))

    # after the metric partial sums: the skipped-backward share, then the micro-batches'
    # token slots and attended tokens (the padding fraction is computed from their global sums)
    EXTRA = ("perf/backward_skipped_fraction", "slots", "tokens")


# --opd-type self (§7b), each reduced like the loss: the clipped JSD (before the weight C), the
# share of tokens the clip bound, the full-vocabulary reverse KL and the teacher's log-prob of
# the sampled token
OPSD_METRICS = ("train/opsd_jsd", "train/opsd_jsd_clipfrac", "train/opsd_reverse_kl",
                "train/opsd_teacher_logprob")


def micro_batch_loss(model, mb: Experience, s: LossSettings, *, num_responses, num_tokens,
                     on_mismatch=None, opsd=None):
    """The micro-batch's share of the step loss and its metric partial sums.

    Returns ``(loss, stats)``: ``loss`` a scalar with grad; ``stats`` a detached float64 vector
    in the order of ``s.metric_names``, each already divided by the global count, so that
    summing over micro-batches and ranks gives the step's global value. ``on_mismatch``
    receives :func:`~relax.algorithms.mismatch_sums` of the trainer's pi_old (here: the
    update's own log-probs, see below) against the sampler's (reinforce_plus_plus.md §7a).
    ``opsd``: the :class:`~relax.trainer.self_distill.SelfDistillation` of ``s.opsd``.
    """
    mask, alg = mb.response_mask, s.algorithm
    log_probs, entropy, jsd = _student_pass(model, mb, s, opsd)
    # No old log-probs: the caller proved the update's policy is the rollout's (one optimizer
    # step per rollout, see ``parts.needs_old_log_probs``), so pi_old = pi_theta before the step
    # and the ratio is exactly 1 with the gradient of log pi_theta.
    trainer_old = log_probs.detach() if mb.old_log_probs is None else mb.old_log_probs
    if on_mismatch is not None and mb.rollout_log_probs is not None:
        on_mismatch(mismatch_sums(trainer_old, mb.rollout_log_probs, mask))
    old_log_probs = behaviour_log_probs(trainer_old, mb.rollout_log_probs, s.off_policy)

    def reduce(values):
        if alg.per_token_loss:
            return token_mean(values, mask, num_tokens=num_tokens)
        return response_mean(values, mask, num_responses=num_responses)

    pg, clipped = compute_policy_loss(alg.estimator, log_probs, old_log_probs, mb.advantages,
                                      mask, alg)
    pg, correction_stats = corrected(
        pg, log_probs=log_probs, trainer_old=trainer_old, sampler=mb.rollout_log_probs,
        advantages=mb.advantages, mask=mask, s=s.off_policy, reduce=reduce)
    pg_loss = reduce(pg)
    entropy_term = reduce(entropy)
    loss = pg_loss - alg.entropy_coef * entropy_term if alg.entropy_coef else pg_loss
    kl_loss = None
    if alg.use_kl_loss:
        kl_loss = reduce(approx_kl(log_probs, mb.ref_log_probs, alg.kl_loss_type, mask=mask))
        loss = loss + alg.kl_loss_coef * kl_loss
    # the clipped JSD and its statistics (the JSD column is the unclipped one: skipped)
    opsd_stats = [] if jsd is None else [reduce(x) for x in (jsd[0], *jsd[1].unbind(-1)[1:])]
    if opsd_stats:  # C * the clipped JSD, reduced like the policy loss (§7b)
        loss = loss + opsd.settings.coef * opsd_stats[0]
    with torch.no_grad():
        stats = [loss, pg_loss, reduce(clipped.float()), reduce(old_log_probs - log_probs),
                 entropy_term]
        if kl_loss is not None:
            stats.append(kl_loss)
        stats += correction_stats + opsd_stats
        stats = torch.stack([x.detach().double() for x in stats])
    return loss, stats


def _student_pass(model, mb: Experience, s: LossSettings, opsd):
    """One student forward for every loss term: [B, T] log-probs and entropies, and for
    ``s.opsd`` the self-distillation JSD terms of the same rows (relax/trainer/self_distill.py)."""
    with autocast(mb.input_ids.device, s.bf16):
        rows = response_rows(model, mb, layout=s.layout)
        log_probs, entropy = (rows.to_grid(x) for x in rows_log_probs(
            rows, temperature=s.temperature, with_entropy=True,
            entropy_grad=bool(s.algorithm.entropy_coef)))
        jsd = opsd.token_terms(rows, mb) if s.opsd else None
    return log_probs, entropy, jsd


def inert_rows(mb: Experience, s: LossSettings) -> torch.Tensor | None:
    """[B] bool: responses whose loss and gradient are exactly zero, or None when no row can be.

    Every policy loss is ``-A`` times a finite factor per token (reinforce_plus_plus.md §7: PPO
    clip with dual clip, GSPO, SAPO; §5a, §5b: RLOO's ``log pi``, CISPO's ``sg(w) log pi``); with
    ``A = 0`` on every token of a response its terms are 0 and so is their gradient, whatever
    the ratio. A KL loss, an entropy bonus or the self-distillation JSD (§7b) adds terms that
    do not vanish.
    """
    if s.algorithm.use_kl_loss or s.algorithm.entropy_coef or s.opsd:
        return None
    return (mb.advantages == 0).all(dim=-1)  # NaN compares unequal: such a row stays active


def _split(chunk: Experience, s: LossSettings, sharded: bool):
    """(rows that need a backward, rows that need only a forward) of one optimizer step.

    A sharded (FSDP2) model keeps every row active: its ranks must run the same passes, each
    with its collectives. Otherwise at least one row stays active, because a data-parallel rank
    must join the step's gradient all-reduce even when its gradient is zero.
    """
    inert = None if sharded else inert_rows(chunk, s)
    if inert is None or not inert.any():
        return chunk, None
    inert[0] &= not bool(inert.all())  # keep row 0 active when all are inert: its gradient is 0
    active_idx, inert_idx = (~inert).nonzero().squeeze(-1), inert.nonzero().squeeze(-1)
    return chunk.select(active_idx), chunk.select(inert_idx)


def train_on_rollout(
    model,
    optimizer: torch.optim.Optimizer,
    exp: Experience,
    s: LossSettings,
    ctx: DistContext,
    *,
    global_batch_size: int,
    micro_batch_size: int,
    clip_grad: float,
    on_mismatch=None,
    opsd=None,
) -> list[dict[str, float]]:
    """Run the optimizer steps over this rank's ``exp``; return each step's global metrics
    (``on_mismatch``, ``opsd``: see :func:`micro_batch_loss`)."""
    if s.opsd and opsd is None:
        raise ValueError("LossSettings.opsd needs the SelfDistillation (opsd=...)")
    local_step = global_batch_size // ctx.world_size
    _check_whole_steps(exp, local_step)
    params = [p for p in model.parameters() if p.requires_grad]
    sharded = hasattr(model, "set_requires_gradient_sync")
    names = s.metric_names + LossSettings.EXTRA
    history = []
    for start in range(0, len(exp), local_step):
        chunk = exp.rows(start, start + local_step)
        num_tokens = None
        if s.algorithm.per_token_loss:
            # keep the global token count on device: one all-reduce, no host sync
            num_tokens = all_reduce(chunk.response_mask.sum().to(torch.float64), ctx.group)
        # zeroed in place, not freed: gradients allocated once stay where they are instead of
        # being allocated again amid each backward's activations, which fragments the host
        # heap (SmolLM2, 16 x 256 with recompute: peak RSS 6.1 -> 5.0 GiB, docs/performance.md
        # "What sets the peak"). The gradients are bitwise the same (0 + g = g); a parameter
        # that had a gradient once and takes no part in this step gets a zero one, and AdamW
        # then moves it (moment decay, weight decay) where None would skip it: no model Relax
        # trains has such conditional parameters (no mixture of experts).
        optimizer.zero_grad(set_to_none=False)
        stats = _accumulate_gradients(model, chunk, s, sharded, micro_batch_size=micro_batch_size,
                                      num_responses=global_batch_size, num_tokens=num_tokens,
                                      group=ctx.group, on_mismatch=on_mismatch, opsd=opsd)
        values = _clip_and_reduce(params, clip_grad, stats, names, ctx.group)
        _check_finite(values, len(history) + 1)
        optimizer.step()
        history.append(values)
    return history


def _clip_and_reduce(params, clip_grad: float, stats, names, group) -> dict[str, float]:
    """Clip the step's gradient norm; the step's global metrics (``names``: its partial sums,
    summed over ranks) with the norm and the padding fraction of the passes."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_grad)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    values = dict(zip(names, all_reduce(stats, group).tolist(), strict=True))
    values["train/grad_norm"] = float(grad_norm)
    slots, tokens = values.pop("slots"), values.pop("tokens")
    values["perf/update_padding_fraction"] = 1.0 - tokens / max(slots, 1.0)
    return values


def _check_whole_steps(exp: Experience, local_step: int) -> None:
    """This rank's rows must be whole optimizer steps, each after the first with pi_old."""
    if len(exp) % local_step:  # a last shorter micro-batch is fine: denominators are global
        raise ValueError(
            f"local batch {len(exp)} is not whole optimizer steps of {local_step} samples"
        )
    if exp.old_log_probs is None and len(exp) != local_step:
        raise ValueError(
            f"old log-probs are required: {len(exp) // local_step} optimizer steps per rollout "
            "step, and every step after the first sees a moved policy"
        )


def _accumulate_gradients(model, chunk: Experience, s: LossSettings, sharded: bool, *,
                          micro_batch_size: int, num_responses: int, num_tokens,
                          group, on_mismatch=None, opsd=None) -> torch.Tensor:
    """Backward over the micro-batches of one optimizer step; returns this rank's partial
    sums in the order of ``s.metric_names + LossSettings.EXTRA``, float64."""
    active, inert = _split(chunk, s, sharded)
    k = len(s.metric_names)
    stats = torch.zeros(k + len(LossSettings.EXTRA), dtype=torch.float64,
                        device=chunk.response_mask.device)
    packed = packs(model, s.layout)
    batches = micro_batches(active, size=micro_batch_size, max_tokens=s.max_tokens,
                            flag="--max-tokens-per-gpu", group=group, lockstep=sharded,
                            packed=packed)
    for i, (_, mb) in enumerate(batches):
        with no_grad_sync(model, skip=i < len(batches) - 1):
            loss, part = micro_batch_loss(model, mb, s, num_responses=num_responses,
                                          num_tokens=num_tokens, on_mismatch=on_mismatch,
                                          opsd=opsd)
            loss.backward()
        stats[:k] += part
        stats[k + 1:] += _slots(model, mb, s.layout, stats.device)
    if inert is not None:
        # the metrics' share of the inert rows: the same function, without autograd, and on
        # the bare module (a DDP forward may broadcast buffers, a collective)
        with torch.no_grad():
            for _, mb in micro_batches(inert, size=micro_batch_size, max_tokens=s.max_tokens,
                                       flag="--max-tokens-per-gpu", packed=packed):
                stats[:k] += micro_batch_loss(unwrap(model), mb, s, num_responses=num_responses,
                                              num_tokens=num_tokens, on_mismatch=on_mismatch)[1]
                stats[k + 1:] += _slots(model, mb, s.layout, stats.device)
        stats[k] = len(inert) / num_responses
    return stats


def _slots(model, mb: Experience, layout: str, device) -> torch.Tensor:
    """[2] float64: the micro-batch's token slots and its tokens that are not padding."""
    return torch.tensor(token_slots(model, mb, layout), dtype=torch.float64, device=device)


def _check_finite(values: dict[str, float], step: int) -> None:
    """Stop before ``optimizer.step()`` on a non-finite loss or gradient norm."""
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if "train/loss" in bad or "train/grad_norm" in bad:
        raise NonFiniteError(
            f"non-finite training values at optimizer step {step} of this rollout step "
            f"({', '.join(f'{k}={v}' for k, v in bad.items())}); stopped before the optimizer "
            "step, nothing was saved. Try a lower --lr or --clip-grad"
        )
