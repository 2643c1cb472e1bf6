"""The off-policy section (``cfg.rollout.off_policy``): the sampler's log-probs, mismatch
metrics and importance correction (reinforce_plus_plus.md §7a): the clips of ``--use-tis``,
the threshold of ``--use-opsm`` and the flags that need one of them; the rollout correction
family (§7c: ``--rollout-is``, ``--rollout-rs``, ``--rollout-token-veto-threshold``) with its
bounds. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import check_custom_path
from relax.config.section import FLOAT32, Needs, Section, flag_of, option, reject

IS_LEVELS = ("token", "sequence", "geometric")  # relax/algorithms/rollout_correction.py
IS_MODES = ("truncate", "mask")
RS_KINDS = ("token", "sequence", "geometric", "k3")
RS_RATIO_DEFAULT = 2.0  # --rollout-rs-threshold of a ratio rule (token, sequence, geometric)
RS_K3_DEFAULT = 0.01  # --rollout-rs-threshold of the k3 rule (a mean divergence in nats)


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
    get_mismatch_metrics: bool | None = option(
        None,
        'rollout/logprob_abs_diff (mean, max), rollout/mismatch_k1, _k3 and _ratio_outside '
        "between the sampler's and the trainer's log-probs of the trained tokens; "
        '--no-get-mismatch-metrics turns them off.',
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
    custom_tis_function_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' computing the TIS weights: "
        'f(trainer_log_probs, sampler_log_probs, mask) -> weights [B, T], finite and >= 0 on '
        'the mask; needs --use-tis.',
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

    rollout_is: str | None = option(
        None,
        "Rollout importance weights (reinforce_plus_plus.md §7c; verl's rollout_is, TRL's "
        "vllm_importance_sampling_mode): each token's policy loss times a weight of the ratio "
        "pi_old / pi_sampler: its own (token), its response's product (sequence) or geometric "
        "mean (geometric), bounded by --rollout-is-mode.",
        choices=IS_LEVELS, default_text='off')
    rollout_is_mode: str = option(
        'truncate',
        'How --rollout-is bounds a weight to [--rollout-is-threshold-lower, '
        '--rollout-is-threshold]: truncate (clamp) or mask (0 outside); needs --rollout-is.',
        choices=IS_MODES, requires=_needs("rollout_is"))
    rollout_is_threshold: float = option(
        2.0,
        'Upper bound of the --rollout-is weight, > 1; needs --rollout-is.',
        bound=((lambda v: v > 1, "must be > 1 (a weight of 1 is always kept), e.g. 2.0"),
               FLOAT32),
        requires=_needs("rollout_is"))
    rollout_is_threshold_lower: float = option(
        0.0,
        'Lower bound of the --rollout-is weight, in [0, 1) (0: none); needs --rollout-is.',
        bound=((lambda v: 0 <= v < 1, "must lie in [0, 1) (a weight of 1 is always kept); "
                "use 0 for no lower bound"), FLOAT32),
        requires=_needs("rollout_is"))
    rollout_rs: str | None = option(
        None,
        "Rollout rejection (reinforce_plus_plus.md §7c; verl's rollout_rs): drop from the "
        "policy loss the tokens whose ratio pi_old / pi_sampler leaves the bounds (token: "
        "IcePop), or the responses whose product (sequence) or geometric mean (geometric) of "
        "ratios leaves them, or whose mean K3 divergence exceeds --rollout-rs-threshold (k3).",
        choices=RS_KINDS, default_text='off')
    rollout_rs_threshold: float | None = option(
        None,
        'Upper bound of --rollout-rs: a ratio > 1 (token, sequence, geometric) or a K3 '
        'divergence > 0 (k3); needs --rollout-rs.',
        default_text=f'{RS_RATIO_DEFAULT} (a ratio), {RS_K3_DEFAULT} (k3)',
        bound=((lambda v: v is None or v > 0, "must be > 0, e.g. 2.0"), FLOAT32),
        requires=_needs("rollout_rs"))
    rollout_rs_threshold_lower: float | None = option(
        None,
        'Lower bound of a ratio --rollout-rs, in (0, 1); rejected with k3; needs --rollout-rs.',
        default_text='1 / --rollout-rs-threshold',
        bound=((lambda v: v is None or 0 < v < 1, "must lie in (0, 1), e.g. 0.5"), FLOAT32),
        requires=_needs("rollout_rs"))
    rollout_token_veto_threshold: float | None = option(
        None,
        "Drop from the policy loss every response with a token whose ratio pi_old / "
        "pi_sampler is below this, in (0, 1) (reinforce_plus_plus.md §7c; verl's "
        "rollout_token_veto_threshold).",
        default_text='off',
        bound=((lambda v: v is None or 0 < v < 1, "must lie in (0, 1), e.g. 1e-4"), FLOAT32))

    @property
    def rollout_correction(self) -> bool:
        """A §7c correction is configured (weights, rejection or the veto)."""
        return (self.rollout_is is not None or self.rollout_rs is not None
                or self.rollout_token_veto_threshold is not None)

    @property
    def corrects_sampler(self) -> bool:
        """pi_old's tokens are weighted, masked or replaced for the sampler's: what a batch
        sampled by older weights or another engine needs (§7a, §7c)."""
        return self.use_tis or self.use_rollout_logprobs or self.rollout_correction

    def rs_bounds(self) -> tuple[float, float]:
        """``(low, high)`` of ``--rollout-rs``: a ratio rule's (its lower bound defaulting to
        1 / the upper), the k3 rule's ``(0, threshold)``."""
        if self.rollout_rs == "k3":
            return 0.0, RS_K3_DEFAULT if self.rollout_rs_threshold is None else \
                self.rollout_rs_threshold
        high = RS_RATIO_DEFAULT if self.rollout_rs_threshold is None else \
            self.rollout_rs_threshold
        low = 1.0 / high if self.rollout_rs_threshold_lower is None else \
            self.rollout_rs_threshold_lower
        return low, high

    def check(self) -> None:
        _check_rollout_correction(self)
        if self.use_rollout_routing_replay and self.use_routing_replay:
            reject(self, ("use_rollout_routing_replay", "use_routing_replay"), "R3 already "
                   "fixes the routing of every pass to the sampler's; keep one of them")
        if not 0 <= self.tis_clip_low <= self.tis_clip:
            reject(self, ("tis_clip_low", "tis_clip"), "the lower clip must lie in [0, "
                   "--tis-clip]; use 0 for no lower clip")
        if self.use_tis and self.use_rollout_logprobs:
            reject(self, ("use_tis", "use_rollout_logprobs"), "with the sampler's log-probs as "
                   "pi_old every TIS weight is 1; keep one of them")
        if self.custom_tis_function_path:
            check_custom_path(self, "custom_tis_function_path")


def _check_rollout_correction(s: OffPolicySection) -> None:
    """§7c: its ratios need the sampler's log-probs beside the trainer's pi_old, one
    importance weight at a time, and bounds around 1."""
    if s.rollout_correction and s.use_rollout_logprobs:
        dest = ("rollout_is" if s.rollout_is else "rollout_rs" if s.rollout_rs
                else "rollout_token_veto_threshold")
        reject(s, (dest, "use_rollout_logprobs"), "with the sampler's log-probs as pi_old "
               "every ratio pi_old / pi_sampler is 1, so it would never act; keep one of them")
    if s.rollout_is and s.use_tis:
        reject(s, ("rollout_is", "use_tis"), "two importance weights on the same tokens; "
               "keep one (--use-tis is --rollout-is token --rollout-is-mode truncate with "
               "--rollout-is-threshold = --tis-clip)")
    if s.rollout_rs is None:
        return
    low, high = s.rs_bounds()
    if s.rollout_rs == "k3":
        if s.rollout_rs_threshold_lower is not None:
            reject(s, ("rollout_rs", "rollout_rs_threshold_lower"), "k3 bounds a divergence "
                   "from above only; remove --rollout-rs-threshold-lower")
        return
    if not low < 1 < high:
        reject(s, ("rollout_rs_threshold_lower", "rollout_rs_threshold"), f"a ratio rule "
               f"keeps [{low:g}, {high:g}], which must hold 1 (an unchanged token is never "
               "dropped): use a lower bound in (0, 1) and an upper bound > 1, e.g. 0.5 and 2")
