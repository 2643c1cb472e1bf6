"""The sampler's log-probs in the update (reinforce_plus_plus.md §7a): which pi_old the ratio
uses, the TIS plug-in, and a whole run with the corrections and the mismatch metrics."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relax.errors import RelaxError
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy.update import micro_batch_loss
from relax.trainer.terms.off_policy import MISMATCH_METRICS
from tests.trainer.helpers import RECIPES, fit, make_config, write_reward
from tests.trainer.workers import B, T, fixed_experience, replace_loss, settings
from tests.trainer.workers import off_policy as make_off_policy


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tokenizer(), seed=7)


def _stats(model, exp, **off_policy):
    s = replace_loss(settings("grpo"), entropy_coef=0.0, use_kl_loss=False,
                     off_policy=make_off_policy(**off_policy))
    loss, stats = micro_batch_loss(model, exp, s, num_responses=B, num_tokens=None)
    return dict(zip(s.metric_names, stats.tolist(), strict=True)), loss


def test_use_rollout_logprobs_puts_the_sampler_into_the_ratio(model):
    exp = fixed_experience(model)
    exp.rollout_log_probs = torch.where(exp.response_mask, exp.old_log_probs + 0.5, 0.0)
    trainer, _ = _stats(model, exp)
    sampler, _ = _stats(model, exp, use_rollout_logprobs=True)
    # train/ppo_kl is the response mean of pi_old - pi_theta: shifted by the 0.5 on every row
    # with tokens (row 3 has none)
    shift = 0.5 * (B - 1) / B
    assert sampler["train/ppo_kl"] == pytest.approx(trainer["train/ppo_kl"] + shift, abs=1e-5)
    exp.rollout_log_probs = None
    with pytest.raises(RelaxError, match="--use-rollout-logprobs: this rollout carries no"):
        _stats(model, exp, use_rollout_logprobs=True)


def test_a_tis_plugin_weighs_every_token(model):
    exp = fixed_experience(model)
    exp.rollout_log_probs = exp.old_log_probs.clone()
    plain, _ = _stats(model, exp)
    half, _ = _stats(model, exp, tis_clip=2.0, tis_fn=lambda q, s, m: torch.full(m.shape, 0.5))
    assert half["train/pg_loss"] == pytest.approx(0.5 * plain["train/pg_loss"], rel=1e-6)
    assert half["train/tis_weight_mean"] == pytest.approx(0.5 * (B - 1) / B)  # row 3: no tokens
    for bad, match in ((lambda q, s, m: torch.ones(B, T + 1), r"shape \(8, 6\), got shape \(8, 7\)"),
                       (lambda q, s, m: torch.full(m.shape, -1.0), "negative on the response"),
                       (lambda q, s, m: torch.full(m.shape, float("nan")), "non-finite values"),
                       (lambda q, s, m: "weights", "got str")):
        with pytest.raises(RelaxError, match="--custom-tis-function-path .*" + match):
            _stats(model, exp, tis_clip=2.0, tis_fn=bad)


def test_a_run_with_tis_and_opsm_logs_the_corrections_and_the_mismatch(tmp_path):
    reward = write_reward(tmp_path)
    cfg = make_config(*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity", "--use-tis",
                      "--tis-clip-low", "0.5", "--use-opsm", output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    assert moved > 0
    for row in history:
        # one fp32 model samples and trains: the two agree to float rounding
        assert 0 <= row["rollout/logprob_abs_diff"] < 1e-4
        assert row["rollout/logprob_abs_diff_max"] >= row["rollout/logprob_abs_diff"]
        assert row["rollout/mismatch_ratio_outside"] == 0.0
        assert all(name in row for name in MISMATCH_METRICS)
        assert row["train/tis_weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert row["train/tis_clipfrac"] == 0.0 and row["train/opsm_masked_fraction"] == 0.0
    off = make_config(*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity",
                      "--no-get-mismatch-metrics", output_dir=tmp_path / "off")
    assert not any(name in fit(off)[1][0] for name in MISMATCH_METRICS)


def test_a_bf16_sampler_against_an_fp32_trainer(tmp_path):
    """--rollout-bf16 (relax/precision.py ``use_rollout_bf16``): the engine samples under bf16
    autocast while pi_old and the update stay fp32, so the sampler's log-probs are a bf16
    model's: the logged mismatch is bf16 rounding (a mean of about 6e-4 here), where one fp32
    model on both sides agrees to float rounding (about 1e-7)."""
    reward = write_reward(tmp_path)
    flags = [*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity", "--num-rollout", "1"]
    trainer, (row,), _ = fit(make_config(*flags, "--rollout-bf16", output_dir=tmp_path / "mix"))
    assert trainer.parts.backend.bf16 and not trainer.policy.bf16
    assert row["rollout/logprob_abs_diff"] > 2e-4
    assert row["rollout/logprob_abs_diff_max"] > 1e-3
    trainer, (row,), _ = fit(make_config(*flags, output_dir=tmp_path / "fp32"))
    assert not trainer.parts.backend.bf16 and not trainer.policy.bf16  # the CPU's default: fp32
    assert row["rollout/logprob_abs_diff"] < 2e-5


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                       "grpo", "gspo", "sapo", "cispo", "rloo"])
def test_the_weight_enters_every_estimators_policy_loss_and_not_the_kl_loss(model, estimator):
    """reinforce_plus_plus.md §7a: pg' = w * pg for every estimator's loss (for cispo the TIS
    weight multiplies its own capped weight, §5b); the KL loss is not weighted. A constant
    weight of 0.5 halves the policy loss exactly."""
    exp = fixed_experience(model)
    exp.rollout_log_probs = exp.old_log_probs.clone()
    s = replace_loss(settings(estimator), entropy_coef=0.0, use_kl_loss=True,
                     kl_loss_type="k2", kl_loss_coef=0.1)
    weighted = dataclasses.replace(s, off_policy=make_off_policy(
        tis_clip=2.0, tis_fn=lambda q, s_, m: torch.full(m.shape, 0.5)))
    plain = dict(zip(s.metric_names, micro_batch_loss(
        model, exp, s, num_responses=B, num_tokens=None)[1].tolist(), strict=True))
    half = dict(zip(weighted.metric_names, micro_batch_loss(
        model, exp, weighted, num_responses=B, num_tokens=None)[1].tolist(), strict=True))
    assert plain["train/pg_loss"] != 0
    assert half["train/pg_loss"] == pytest.approx(0.5 * plain["train/pg_loss"], rel=1e-6)
    assert half["train/kl_loss"] == pytest.approx(plain["train/kl_loss"], rel=1e-9)
