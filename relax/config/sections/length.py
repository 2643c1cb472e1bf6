"""The length section (``cfg.rollout.length``): length control (reinforce_plus_plus.md §7d):
DAPO's soft overlong punishment and a linear length penalty on the reward, and the overlong
filter (truncated responses left out of the policy loss); and the rule that places them
beside the episodes, the response limit and the frozen REINFORCE++ variants. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import FLOAT32, Needs, Section, option, reject
from relax.estimators import facts


@dataclass(frozen=True)
class LengthSection(Section):
    """Length control (reinforce_plus_plus.md §7d)."""

    overlong_buffer_len: int | None = option(
        None,
        "DAPO's soft overlong punishment: the last N tokens before --rollout-max-response-len "
        'add a penalty to the reward that grows linearly to --overlong-penalty-factor at the '
        "limit (OpenRLHF's overlong_buffer_len, verl's overlong_buffer.len).",
        default_text='off',
        bound=(lambda v: v is None or v > 0, "must be > 0 (tokens), e.g. 4"))
    overlong_penalty_factor: float = option(
        1.0,
        'The overlong penalty at the limit, >= 0; needs --overlong-buffer-len.',
        bound=((lambda v: v >= 0, "must be >= 0, e.g. 1.0"), FLOAT32),
        requires=Needs(lambda cfg: cfg.rollout.length.overlong_buffer_len is not None,
                       "has no effect without --overlong-buffer-len; add it or remove this "
                       "flag"))
    overlong_filter: bool = option(
        False,
        'Overlong filtering (DAPO; TRL\'s mask_truncated_completions): responses cut at '
        '--rollout-max-response-len (no EOS) get advantage 0, leaving the policy loss; their '
        'share of its denominator stays.')
    length_penalty_coef: float = option(
        0.0,
        'A linear length penalty: each response\'s reward minus coef x its length / '
        '--rollout-max-response-len, >= 0 (0: off).',
        bound=((lambda v: v >= 0, "must be >= 0; use 0 to turn it off"), FLOAT32))

    @property
    def shapes_rewards(self) -> bool:
        return self.overlong_buffer_len is not None or self.length_penalty_coef > 0

    @property
    def enabled(self) -> bool:
        return self.shapes_rewards or self.overlong_filter


def check_length(cfg, explicit: set[str]) -> None:
    """Sections rollout.length, rollout.sampling, rollout.episodes, algorithm: the buffer
    within the limit, rewards shaped by one response's length (not an episode's), and the
    overlong filter where it would not drop the reward's own KL penalty."""
    s = cfg.rollout.length
    limit = cfg.rollout.sampling.rollout_max_response_len
    if s.overlong_buffer_len is not None and s.overlong_buffer_len > limit:
        reject(cfg, ("overlong_buffer_len", "rollout_max_response_len"), "the buffer is the "
               "last tokens before the limit, so it cannot be longer than the limit; use at "
               f"most {limit}")
    episodes = cfg.rollout.episodes
    if s.shapes_rewards and (episodes.env is not None or episodes.use_agentic_rollout):
        dest = "overlong_buffer_len" if s.overlong_buffer_len is not None else \
            "length_penalty_coef"
        reject(cfg, (dest, "env" if episodes.env is not None else "use_agentic_rollout"),
               "an episode's length is its turns' (each turn up to --rollout-max-response-len), "
               "not one response's against the limit; remove the length shaping")
    f = facts(cfg.algorithm.advantage_estimator)
    if s.overlong_filter and f.kl_in_reward and cfg.algorithm.kl_coef > 0:
        reject(cfg, ("overlong_filter", "kl_coef"), f"{f.name}'s reference KL enters only "
               f"through the reward-to-go (reinforce_plus_plus.md {f.section}), so a truncated "
               "response given advantage 0 would lose its KL penalty too; remove "
               "--overlong-filter or set --kl-coef 0")
