"""The partial-rollout section (``cfg.rollout.partial``): unfinished groups continue in the
next step (relax/rollout/partial.py), and its rules. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Needs, Section, option, reject, value_of

NEEDS_PARTIAL = Needs(lambda cfg: cfg.rollout.partial.partial_rollout,
                      "has no effect without --partial-rollout; add it or remove this flag")

# episode sources whose unfinished episodes a checkpoint cannot hold (docs/configuration.md,
# "Off-policy"): an --env environment is rebuilt by replaying its recorded turns
# (relax/rollout/partial_episodes.py), an agent program's process is not
_NOT_CARRIED = {
    "use_agentic_rollout": "an agent run cut between steps lives on in its agent program's "
                           "process (its pending request and its own state), which a "
                           "checkpoint cannot hold",
}


@dataclass(frozen=True)
class PartialSection(Section):
    """Partial rollouts: unfinished groups continue in the next step
    (relax/rollout/partial.py)."""

    partial_rollout: bool = option(
        False,
        'Start --over-sampling-batch-size groups per step, stop decoding once '
        '--rollout-batch-size of them are complete, and continue the unfinished ones in the '
        'next step under the newer policy (relax/rollout/partial.py); deterministic: the stop '
        'counts tokens, not time.')
    partial_rollout_max_aborted_count: int = option(
        2,
        'Most steps one group may be carried over unfinished; a step waits for groups at the '
        'bound. Needs --partial-rollout.',
        bound=(lambda v: v >= 1, "must be >= 1 (how many steps one response may be carried "
               "over before the step waits for it)"),
        requires=NEEDS_PARTIAL)
    mask_offpolicy_in_partial_rollout: bool = option(
        False,
        'Leave tokens an earlier step sampled out of the loss (they stay in the context); '
        'without it --use-tis or --use-rollout-logprobs must weigh them. Needs '
        '--partial-rollout.',
        requires=NEEDS_PARTIAL)

# ------------------------------------------------------------------ rules across sections

def check_partial_rollout(cfg, explicit: set[str]) -> None:
    """Sections rollout.partial, batches, rollout.episodes, rollout.off_policy: partial
    rollouts over-sample, carry only what a checkpoint can hold, and weigh the older
    policy's tokens."""
    if not cfg.rollout.partial.partial_rollout:
        return
    over = cfg.batches.over_sampling_batch_size
    if over is None or over <= cfg.batches.rollout_batch_size:
        reject(cfg, ("partial_rollout", "over_sampling_batch_size"), "partial rollouts start "
               "more groups than a step trains on and carry the unfinished ones over; set "
               "--over-sampling-batch-size above --rollout-batch-size, e.g. twice it")
    for dest, why in _NOT_CARRIED.items():
        if value_of(cfg, dest):
            reject(cfg, ("partial_rollout", dest), f"partial rollouts carry unfinished samples "
                   f"into later steps and checkpoints, but {why}, so --load could not continue "
                   "it exactly; remove one of the two")
    if not (cfg.rollout.partial.mask_offpolicy_in_partial_rollout or cfg.rollout.off_policy.corrects_sampler):
        reject(cfg, "partial_rollout", "carried responses hold tokens an older policy sampled: "
               "add --mask-offpolicy-in-partial-rollout (leave them out of the loss) or correct "
               "for them with --use-tis or --use-rollout-logprobs")
