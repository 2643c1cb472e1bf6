"""The policy update of one rollout step: ``--num-steps-per-rollout`` AdamW steps (reinforce_plus_plus.md §7).

Each optimizer step takes ``global_batch_size / world_size`` local samples in micro-batches.
Every micro-batch loss is already divided by the GLOBAL count of the step -- ``B`` responses
(response mean) or ``N_step`` valid tokens (``--calculate-per-token-loss``) -- so the sum over
micro-batches and ranks is the whole-batch loss, and ranks sum (not average) their gradients
(see ``distributed.py``). The step's metrics are partial sums reduced the same way, with one
all-reduce per optimizer step, which is also where a non-finite loss or gradient norm stops
training before ``optimizer.step()``.

The loss is the policy loss and its terms (relax/trainer/terms/term.py, :func:`loss_terms`):
the sampler corrections weigh the per-token policy loss (TIS, OPSM, §7a), then the entropy
bonus, the KL loss and the self-distillation JSD (§7, §7b) are added in that order, and the
metrics vector is the policy loss's own followed by each term's. The optimizer step itself is
relax/trainer/policy/optimizer_step.py, shared with the critic.

Rows that cannot move the parameters skip the backward: with no term that acts on them (KL
loss, entropy bonus, JSD), a response whose advantages are all exactly 0 contributes exactly 0
to every policy loss and to its gradient (each loss is the advantage times a finite factor), so
it needs a forward for the step's metrics and nothing more (``inert_rows``). Its share still
counts in the denominators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch

from relax.algorithms import compute_policy_loss, response_mean, token_mean
from relax.config.section import default_of
from relax.config.sections import AlgorithmSection, BatchSection, SamplingSection
from relax.errors import NonFiniteError
from relax.precision import autocast
from relax.trainer.distributed import DistContext, no_grad_sync, unwrap
from relax.trainer.policy.experience import Experience, micro_batches
from relax.trainer.policy.logprobs import packs, response_rows, rows_log_probs, token_slots
from relax.trainer.policy.optimizer_step import global_tokens, optimizer_step
from relax.trainer.terms.entropy import EntropyBonus
from relax.trainer.terms.kl import KLLoss
from relax.trainer.terms.off_policy import OffPolicy, behaviour_log_probs, corrections
from relax.trainer.terms.self_distillation import METRICS as SELF_DISTILLATION_METRICS
from relax.trainer.terms.term import LossView, Term


@dataclass(frozen=True)
class LossSettings:
    """What the update's loss reads: the algorithm section as it is (estimator, clips, KL
    loss, entropy, reduction; reinforce_plus_plus.md §7), the off-policy correction (§7a), and
    how the passes run: the rollout's sampling ``temperature`` (log-probs of softmax(z / T)),
    ``bf16`` autocast (relax/precision.py), the token budget of a micro-batch (``max_tokens``,
    relax/trainer/policy/experience.py) and ``--pass-layout`` (relax/trainer/policy/packing.py). ``opsd``:
    the loss has the self-distillation term of ``--opd-type self`` (§7b), which
    :func:`train_on_rollout` is handed among its terms."""

    algorithm: AlgorithmSection = AlgorithmSection()
    off_policy: OffPolicy = OffPolicy()
    temperature: float = default_of(SamplingSection, "rollout_temperature")  # --rollout-temperature
    bf16: bool = False
    max_tokens: int | None = None
    layout: str = default_of(BatchSection, "pass_layout")  # --pass-layout
    opsd: bool = False

    @property
    def metric_names(self) -> tuple[str, ...]:
        extra = SELF_DISTILLATION_METRICS if self.opsd else ()
        return metric_names(loss_terms(self)) + extra

    # after the metric partial sums: the skipped-backward share, then the micro-batches'
    # token slots and attended tokens (the padding fraction is computed from their global sums)
    EXTRA = ("perf/backward_skipped_fraction", "slots", "tokens")


# the policy loss's own metrics, before those of its terms
POLICY_METRICS = ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl")


def loss_terms(s: LossSettings, terms: tuple[Term, ...] = ()) -> tuple[Term, ...]:
    """The loss's terms in the order they are added (reinforce_plus_plus.md §7, §7a, §7b):
    the entropy bonus, the KL loss (``--use-kl-loss``), the sampler corrections (TIS, OPSM),
    then the run's ``terms`` (relax/trainer/build.py: self-distillation, the mismatch meter,
    and terms whose loss hooks do nothing)."""
    alg = s.algorithm
    kl = (KLLoss(alg.kl_loss_coef, alg.kl_loss_type),) if alg.use_kl_loss else ()
    return (EntropyBonus(alg.entropy_coef), *kl, *corrections(s.off_policy), *terms)


def metric_names(terms: tuple[Term, ...]) -> tuple[str, ...]:
    """The metrics vector of :func:`micro_batch_loss` with ``terms``: the policy loss's, then
    each term's in order."""
    return POLICY_METRICS + tuple(name for t in terms for name in t.metric_names)


def micro_batch_loss(model, mb: Experience, s: LossSettings, *, num_responses, num_tokens,
                     terms: tuple[Term, ...] | None = None):
    """The micro-batch's share of the step loss and its metric partial sums.

    Returns ``(loss, stats)``: ``loss`` a scalar with grad; ``stats`` a detached float64 vector
    in the order of ``metric_names(terms)``, each already divided by the global count, so that
    summing over micro-batches and ranks gives the step's global value. ``terms``: those of
    :func:`loss_terms` (by default the ones ``s`` configures); the policy loss is
    ``L_PG`` of the per-token loss as each term's ``correct`` weighs it, then each term's
    ``add_loss`` in order: ``L_PG - entropy_coef * L_entropy + kl_loss_coef * L_KL + C * JSD``.
    """
    terms = loss_terms(s) if terms is None else terms
    mask, alg = mb.response_mask, s.algorithm
    log_probs, entropy, rows = _student_pass(model, mb, s, terms)
    # No old log-probs: the caller proved the update's policy is the rollout's (one optimizer
    # step per rollout, see ``passes.needs_old_log_probs``), so pi_old = pi_theta before the step
    # and the ratio is exactly 1 with the gradient of log pi_theta.
    trainer_old = log_probs.detach() if mb.old_log_probs is None else mb.old_log_probs
    old_log_probs = behaviour_log_probs(trainer_old, mb.rollout_log_probs, s.off_policy)

    def reduce(values):
        if alg.calculate_per_token_loss:
            return token_mean(values, mask, num_tokens=num_tokens)
        return response_mean(values, mask, num_responses=num_responses)

    view = LossView(mb, log_probs, entropy, trainer_old, old_log_probs, reduce)
    for term in terms:
        term.observe(view)
    pg, clipped = compute_policy_loss(alg.advantage_estimator, log_probs, old_log_probs,
                                      mb.advantages, mask, alg)
    term_stats = [[] for _ in terms]
    for term, out in zip(terms, term_stats, strict=True):
        pg, stats = term.correct(pg, view)
        out += stats
    pg_loss = loss = reduce(pg)
    for term, term_rows, out in zip(terms, rows, term_stats, strict=True):
        loss, stats = term.add_loss(loss, view, term_rows)
        out += stats
    with torch.no_grad():
        stats = [loss, pg_loss, reduce(clipped.float()), reduce(old_log_probs - log_probs)]
        stats += [x for out in term_stats for x in out]
        stats = torch.stack([x.detach().double() for x in stats])
    return loss, stats


def _student_pass(model, mb: Experience, s: LossSettings, terms):
    """One student forward for every loss term: [B, T] log-probs and entropies, and what each
    term reads of the same rows (``student_rows``: the self-distillation JSD)."""
    with autocast(mb.input_ids.device, s.bf16):
        rows = response_rows(model, mb, layout=s.layout)
        log_probs, entropy = (rows.to_grid(x) for x in rows_log_probs(
            rows, temperature=s.temperature, with_entropy=True,
            entropy_grad=bool(s.algorithm.entropy_coef)))
        read = [term.student_rows(rows, mb) for term in terms]
    return log_probs, entropy, read


def inert_rows(mb: Experience, s: LossSettings) -> torch.Tensor | None:
    """[B] bool: responses whose loss and gradient are exactly zero, or None when no row can be.

    Every policy loss is ``-A`` times a finite factor per token (reinforce_plus_plus.md §7: PPO
    clip with dual clip, GSPO, SAPO; §5a, §5b: RLOO's ``log pi``, CISPO's ``sg(w) log pi``); with
    ``A = 0`` on every token of a response its terms are 0 and so is their gradient, whatever
    the ratio. A KL loss or an entropy bonus (§7) adds terms that do not vanish (their
    ``keeps_zero_advantage_rows``; the run's own terms, such as the self-distillation JSD of
    §7b, are asked by the update before it asks this).
    """
    if any(t.keeps_zero_advantage_rows for t in loss_terms(s)):
        return None
    return (mb.advantages == 0).all(dim=-1)  # NaN compares unequal: such a row stays active


def _split(chunk: Experience, s: LossSettings, terms, sharded: bool):
    """(rows that need a backward, rows that need only a forward) of one optimizer step.

    A sharded (FSDP2) model keeps every row active: its ranks must run the same passes, each
    with its collectives; so does a term that acts on rows whose advantages are 0. Otherwise at
    least one row stays active, because a data-parallel rank must join the step's gradient
    all-reduce even when its gradient is zero.
    """
    keep = sharded or any(t.keeps_zero_advantage_rows for t in terms)
    inert = None if keep else inert_rows(chunk, s)
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
    terms: tuple[Term, ...] = (),
) -> list[dict[str, float]]:
    """Run the optimizer steps over this rank's ``exp``; return each step's global metrics
    (``terms``: the run's, see :func:`loss_terms`)."""
    terms = loss_terms(s, terms)
    if s.opsd and SELF_DISTILLATION_METRICS[0] not in metric_names(terms):
        raise ValueError("LossSettings.opsd needs the SelfDistillation term (terms=...)")
    local_step = global_batch_size // ctx.world_size
    _check_whole_steps(exp, local_step)
    params = [p for p in model.parameters() if p.requires_grad]
    sharded = hasattr(model, "set_requires_gradient_sync")
    names = metric_names(terms) + LossSettings.EXTRA
    history = []
    for start in range(0, len(exp), local_step):
        chunk = exp.rows(start, start + local_step)
        # --calculate-per-token-loss: the global token count, kept on the device
        num_tokens = (global_tokens(chunk.response_mask, ctx.group)
                      if s.algorithm.calculate_per_token_loss else None)

        accumulate = partial(_accumulate_gradients, model, chunk, s, terms, sharded,
                             micro_batch_size=micro_batch_size,
                             num_responses=global_batch_size, num_tokens=num_tokens,
                             group=ctx.group)
        check = partial(_checked_values, names, step=len(history) + 1)
        history.append(optimizer_step(optimizer, params, accumulate, clip_grad=clip_grad,
                                      group=ctx.group, check=check))
    return history


def _checked_values(names, sums: list[float], grad_norm, *, step: int) -> dict[str, float]:
    """The step's global metrics (``names``: its partial sums, summed over ranks) with the
    gradient norm and the padding fraction of the passes; a non-finite loss or gradient norm
    stops the run before the optimizer's step."""
    values = dict(zip(names, sums, strict=True))
    values["train/grad_norm"] = float(grad_norm)
    slots, tokens = values.pop("slots"), values.pop("tokens")
    values["perf/update_padding_fraction"] = 1.0 - tokens / max(slots, 1.0)
    _check_finite(values, step)
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


def _accumulate_gradients(model, chunk: Experience, s: LossSettings, terms, sharded: bool, *,
                          micro_batch_size: int, num_responses: int, num_tokens,
                          group) -> torch.Tensor:
    """Backward over the micro-batches of one optimizer step; returns this rank's partial
    sums in the order of ``metric_names(terms) + LossSettings.EXTRA``, float64."""
    active, inert = _split(chunk, s, terms, sharded)
    k = len(metric_names(terms))
    stats = torch.zeros(k + len(LossSettings.EXTRA), dtype=torch.float64,
                        device=chunk.response_mask.device)
    packed = packs(model, s.layout)
    batches = micro_batches(active, size=micro_batch_size, max_tokens=s.max_tokens,
                            flag="--max-tokens-per-gpu", group=group, lockstep=sharded,
                            packed=packed)
    for i, (_, mb) in enumerate(batches):
        with no_grad_sync(model, skip=i < len(batches) - 1):
            loss, part = micro_batch_loss(model, mb, s, num_responses=num_responses,
                                          num_tokens=num_tokens, terms=terms)
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
                                              num_tokens=num_tokens, terms=terms)[1]
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
