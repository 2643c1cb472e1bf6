"""The off-policy section (``cfg.rollout.off_policy``): the sampler's log-probs, mismatch
metrics and importance correction (reinforce_plus_plus.md §7a): the clips of ``--use-tis``,
the threshold of ``--use-opsm`` and the flags that need one of them. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import check_custom_path
from relax.config.section import FLOAT32, Needs, Section, flag_of, option, reject


def _needs(switch: str) -> Needs:
    """The off-policy switch ``switch`` (a dest of this section)."""
    return Needs(lambda cfg: getattr(cfg.rollout.off_policy, switch),
                 f"has no effect without {flag_of(switch)}; add it or remove this flag")


@dataclass(frozen=True)
class OffPolicySection(Section):
    """The sampler's log-probs: mismatch metrics and importance correction
    (reinforce_plus_plus.md §7a)."""

    use_rollout_logprobs: bool = option(
        False,
        "pi_old of the PPO ratio is the sampler's log-prob of each token (kept by the decode, "
        "no extra pass) instead of the trainer's; rejected for rloo (no ratio).")
    mismatch_metrics: bool | None = option(
        None,
        'rollout/logprob_abs_diff (mean, max), rollout/mismatch_k1, _k3 and _ratio_outside '
        "between the sampler's and the trainer's log-probs of the trained tokens; "
        '--no-get-mismatch-metrics turns them off.',
        flag='get_mismatch_metrics',
        default_text='on (free: elementwise over log-probs the update already holds)')
    use_tis: bool = option(
        False,
        "Truncated importance sampling: each token's policy loss times clamp(pi_trainer / "
        'pi_sampler, --tis-clip-low, --tis-clip), a constant.')
    tis_clip: float = option(
        2.0,
        'Upper clip of the TIS weight, > 0, at most 3.4e38 (float32); needs --use-tis.',
        bound=(FLOAT32, (lambda v: v > 0, "must be > 0 (the largest importance weight a token "
                         "gets), e.g. 2.0")),
        requires=_needs("use_tis"))
    tis_clip_low: float = option(
        0.0,
        'Lower clip of the TIS weight, in [0, --tis-clip]; needs --use-tis.',
        bound=FLOAT32,
        requires=_needs("use_tis"))
    custom_tis_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' computing the TIS weights: "
        'f(trainer_log_probs, sampler_log_probs, mask) -> weights [B, T], finite and >= 0 on '
        'the mask; needs --use-tis.',
        flag='custom_tis_function_path',
        requires=_needs("use_tis"))
    use_opsm: bool = option(
        False,
        'Off-policy sequence masking: drop from the policy loss a response with a negative '
        'advantage whose mean log(pi_sampler / pi_theta) exceeds --opsm-delta.')
    opsm_delta: float = option(
        0.0001,
        'OPSM threshold, > 0; needs --use-opsm.',
        bound=(FLOAT32, (lambda v: v > 0, "must be > 0 (a mean log-ratio per token), e.g. "
                         "1e-4")),
        requires=_needs("use_opsm"))
    use_rollout_routing_replay: bool = option(
        False,
        "R3 (a mixture-of-experts policy): the trainer's passes route every token the sampler "
        "recorded through the sampler's experts, their gate weights recomputed by the current "
        'router over those experts (docs/moe.md); rejected for a dense model.')
    use_routing_replay: bool = option(
        False,
        "R2 (a mixture-of-experts policy): the update routes every token through the experts "
        "the old policy chose before the step's first optimizer step (one more no-grad pass "
        'per step records them; docs/moe.md); rejected for a dense model.')

    def check(self) -> None:
        if self.use_rollout_routing_replay and self.use_routing_replay:
            reject(self, ("use_rollout_routing_replay", "use_routing_replay"), "R3 already "
                   "fixes the routing of every pass to the sampler's; keep one of them")
        if not 0 <= self.tis_clip_low <= self.tis_clip:
            reject(self, ("tis_clip_low", "tis_clip"), "the lower clip must lie in [0, "
                   "--tis-clip]; use 0 for no lower clip")
        if self.use_tis and self.use_rollout_logprobs:
            reject(self, ("use_tis", "use_rollout_logprobs"), "with the sampler's log-probs as "
                   "pi_old every TIS weight is 1; keep one of them")
        if self.custom_tis_path:
            check_custom_path(self, "custom_tis_function_path")
