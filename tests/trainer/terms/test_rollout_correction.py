"""The rollout correction in the update (reinforce_plus_plus.md §7c): where its factor enters
the policy loss (per row, against float64 values computed here), the metrics it reports,
and whole tiny-model runs of every mode (packed and prefix-shared passes, a repeat that is
bitwise the same run)."""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms.registry import ESTIMATORS
from relax.config.sections import OffPolicySection
from relax.errors import RelaxError
from relax.metrics.tracker import MetricTracker
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy.update import loss_terms, metric_names, micro_batch_loss
from relax.trainer.terms.rollout_correction import RolloutCorrection
from tests.trainer.helpers import RECIPES, fit, make_config, write_reward
from tests.trainer.workers import B, fixed_experience, replace_loss, settings


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tokenizer(), seed=7)


def _row_stats(model, exp, section: OffPolicySection | None, estimator: str = "grpo"):
    """Each row's metrics alone (``num_responses=B``, so each is its share of the batch)."""
    per_token = ESTIMATORS[estimator].facts.requires_per_token_loss
    s = replace_loss(settings(estimator, per_token=per_token), entropy_coef=0.0,
                     use_kl_loss=False)
    term = RolloutCorrection.build(section) if section is not None else None
    terms = loss_terms(s, (term,) if term is not None else ())
    rows = []
    for i in range(B):
        _, stats = micro_batch_loss(model, exp.select([i]), s, num_responses=B, num_tokens=None,
                                    terms=terms)
        rows.append(dict(zip(metric_names(terms), stats.tolist(), strict=True)))
    return rows, term


def _shifted(model, shifts):
    """The fixed batch with the sampler's log-probs ``s = q - shift_i`` on row i: every
    trained token of row i has the log-ratio ``d = shift_i``."""
    exp = fixed_experience(model)
    shift = torch.tensor(shifts, dtype=torch.float32)[:, None]
    exp.rollout_log_probs = torch.where(exp.response_mask, exp.old_log_probs - shift, 0.0)
    # the hole of row 6 (a token the model reads but does not train: an environment's, in an
    # episode) holds a value that would dominate any ratio it entered
    assert not exp.response_mask[6, 2] and exp.attention_mask[6, 4 + 2]
    exp.rollout_log_probs[6, 2] = -60.0
    return exp


SHIFTS = [0.3, -0.4, 0.05, 0.0, -0.02, 0.6, 0.1, -0.15]  # row 3 has no tokens


def _lengths(exp):
    return [int(x) for x in exp.response_mask.sum(-1)]


@pytest.mark.parametrize("level,mode", [("token", "truncate"), ("sequence", "truncate"),
                                        ("geometric", "mask"), ("sequence", "mask")])
def test_the_weight_multiplies_each_rows_policy_loss(model, level, mode):
    """pg'_i = w_i pg_i with w_i from the row's length and log-ratio, computed here in float64;
    the weights' mean, maximum and ESS are the float64 ones."""
    exp = _shifted(model, SHIFTS)
    low, high = 0.7, 1.4
    plain, _ = _row_stats(model, exp, None)
    section = OffPolicySection(rollout_is=level, rollout_is_mode=mode, rollout_is_threshold=high,
                               rollout_is_threshold_lower=low)
    got, term = _row_stats(model, exp, section)
    weights = []
    for i, length in enumerate(_lengths(exp)):
        log_w = {"token": SHIFTS[i], "sequence": SHIFTS[i] * length,
                 "geometric": SHIFTS[i]}[level]
        inside = math.log(low) <= log_w <= math.log(high)
        w = (math.exp(min(max(log_w, math.log(low)), math.log(high))) if mode == "truncate"
             else math.exp(log_w) if inside else 0.0)
        weights += [w] * length
        assert got[i]["train/pg_loss"] == pytest.approx(w * plain[i]["train/pg_loss"],
                                                        rel=1e-5, abs=1e-9)
        changed = f"train/rollout_is_{'truncated' if mode == 'truncate' else 'masked'}_fraction"
        assert got[i][changed] == pytest.approx(0.0 if inside or not length else 1.0 / B)
    assert any(w == 0.0 or w in (low, high) for w in weights)  # the bounds acted
    tracker = MetricTracker()
    term.after_update(tracker)
    values = tracker.reduce()
    assert values["train/rollout_is_weight_max"] == pytest.approx(max(weights), rel=1e-6)
    ess = sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))
    assert values["train/rollout_is_ess"] == pytest.approx(ess, rel=1e-6)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_takes_the_weight_in_the_update(model, name):
    """The update applies the factor whatever the estimator (§7c "Where it enters the loss"):
    each row's policy loss is its float64 sequence weight times the unweighted one, for
    every registered estimator (tests/algorithms/test_rollout_correction.py checks each
    policy loss's gradient under a per-token weight)."""
    exp = _shifted(model, SHIFTS)
    low, high = 0.7, 1.4
    plain, _ = _row_stats(model, exp, None, name)
    got, _ = _row_stats(model, exp, OffPolicySection(
        rollout_is="sequence", rollout_is_threshold=high, rollout_is_threshold_lower=low), name)
    changed = 0
    for i, length in enumerate(_lengths(exp)):
        w = math.exp(min(max(SHIFTS[i] * length, math.log(low)), math.log(high)))
        assert got[i]["train/pg_loss"] == pytest.approx(w * plain[i]["train/pg_loss"],
                                                        rel=1e-5, abs=1e-9), (name, i)
        changed += w != 1.0 and abs(plain[i]["train/pg_loss"]) > 1e-6
    assert changed >= 3  # rows whose loss the weight moved: the test can fail


def test_rejection_and_veto_drop_rows_and_tokens(model):
    """A row rule and the veto zero a whole row's policy loss; IcePop zeroes its tokens (here
    every token of a row shares one ratio, so whole rows as well); kept rows are unchanged."""
    exp = _shifted(model, SHIFTS)
    plain, _ = _row_stats(model, exp, None)
    lengths = _lengths(exp)
    cases = {
        "token": (OffPolicySection(rollout_rs="token", rollout_rs_threshold=1.2),
                  lambda i: abs(SHIFTS[i]) <= math.log(1.2) + 1e-9),
        "sequence": (OffPolicySection(rollout_rs="sequence", rollout_rs_threshold=1.5),
                     lambda i: abs(SHIFTS[i] * lengths[i]) <= math.log(1.5)),
        "k3": (OffPolicySection(rollout_rs="k3", rollout_rs_threshold=0.02),
               lambda i: math.expm1(SHIFTS[i]) - SHIFTS[i] <= 0.02),
        "veto": (OffPolicySection(rollout_token_veto_threshold=0.8),
                 lambda i: SHIFTS[i] >= math.log(0.8)),
    }
    for name, (section, kept) in cases.items():
        got, _ = _row_stats(model, exp, section)
        metric = [n for n in got[0] if n.startswith(("train/rollout_rs", "train/rollout_veto"))]
        assert len(metric) == 1
        dropped = [i for i in range(B) if lengths[i] and not kept(i)]
        assert dropped and len(dropped) < B - 1, name  # both outcomes occur: the test can fail
        for i in range(B):
            want = plain[i]["train/pg_loss"] * (0.0 if i in dropped else 1.0)
            assert got[i]["train/pg_loss"] == pytest.approx(want, rel=1e-6, abs=1e-12), (name, i)
            assert got[i][metric[0]] == pytest.approx(1.0 / B if i in dropped else 0.0), name


def test_the_parts_multiply(model):
    """Weights, rejection and veto together: their product, in one term."""
    exp = _shifted(model, SHIFTS)
    plain, _ = _row_stats(model, exp, None)
    section = OffPolicySection(rollout_is="token", rollout_is_threshold=1.3,
                               rollout_rs="geometric", rollout_rs_threshold=1.5,
                               rollout_token_veto_threshold=0.7)
    got, term = _row_stats(model, exp, section)
    assert term.metric_names == ("train/rollout_is_weight_mean",
                                 "train/rollout_is_truncated_fraction",
                                 "train/rollout_rs_rejected_fraction", "train/rollout_veto_fraction")
    for i, d in enumerate(SHIFTS):
        w = math.exp(min(d, math.log(1.3)))
        keep = abs(d) <= math.log(1.5) and d >= math.log(0.7)
        assert got[i]["train/pg_loss"] == pytest.approx(w * keep * plain[i]["train/pg_loss"],
                                                        rel=1e-5, abs=1e-12)


def test_a_rollout_without_sampler_log_probs_is_one_line(model):
    exp = fixed_experience(model)
    with pytest.raises(RelaxError, match="carries no sampler log-probs"):
        _row_stats(model, exp, OffPolicySection(rollout_rs="token"))


# ------------------------------------------------------------------ whole runs

MODES = {
    "is-token-truncate": ["--rollout-is", "token", "--rollout-is-threshold", "1.5"],
    "is-sequence-mask": ["--rollout-is", "sequence", "--rollout-is-mode", "mask",
                         "--pass-layout", "packed"],
    "is-geometric": ["--rollout-is", "geometric", "--rollout-is-threshold-lower", "0.5"],
    "icepop": ["--rollout-rs", "token", "--rollout-rs-threshold", "5",
               "--rollout-rs-threshold-lower", "0.5", "--pass-layout", "packed"],
    "rs-sequence": ["--rollout-rs", "sequence"],
    "rs-geometric": ["--rollout-rs", "geometric", "--pass-layout", "padded"],
    "rs-k3": ["--rollout-rs", "k3", "--rollout-rs-threshold", "0.001"],
    "veto": ["--rollout-token-veto-threshold", "0.001", "--use-opsm"],
}


@pytest.mark.parametrize("mode", MODES)
def test_a_tiny_run_of_each_mode_trains_and_reports(tmp_path, mode):
    reward = write_reward(tmp_path)
    cfg = make_config(*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity", *MODES[mode],
                      "--num-steps-per-rollout", "2", output_dir=tmp_path / "run")
    trainer, history, moved = fit(cfg)
    assert moved > 0
    names = next(t for t in trainer.terms if isinstance(t, RolloutCorrection)).metric_names
    for row in history:
        for name in names:
            # one fp32 model samples and trains: every ratio is 1 to float rounding
            assert row[name] == pytest.approx(1.0 if name.endswith("weight_mean") else 0.0,
                                              abs=1e-3), name
        if "--rollout-is" in MODES[mode]:
            assert row["train/rollout_is_ess"] == pytest.approx(1.0, abs=1e-6)
            assert row["train/rollout_is_weight_max"] == pytest.approx(1.0, abs=1e-3)


def test_a_seeded_run_with_every_part_repeats_exactly(tmp_path):
    reward = write_reward(tmp_path)
    flags = (*RECIPES["reinforce_plus_plus"], "--custom-rm-path", f"{reward}:parity",
             "--rollout-is", "sequence", "--rollout-rs", "token",
             "--rollout-token-veto-threshold", "0.01", "--seed", "3")
    first = fit(make_config(*flags, output_dir=tmp_path / "a"))[1]
    second = fit(make_config(*flags, output_dir=tmp_path / "b"))[1]
    keep = [k for k in first[0] if not k.startswith("perf/")]
    assert [{k: r[k] for k in keep} for r in first] == [{k: r[k] for k in keep} for r in second]
    assert "train/rollout_is_ess" in first[0]


# --fully-async K = 1: one training rank, one rollout rank; LoRA adapters travel
ASYNC = ["--num-rollout", "3", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
         "--rollout-max-response-len", "6", "--micro-batch-size", "4", "--rollout-temperature",
         "1.5", "--lr", "1e-2", "--device", "cpu", "--log-samples", "0", "--seed", "5",
         "--fully-async", "--max-staleness", "1", "--lora-rank", "4", "--lora-alpha", "8",
         "--rollout-is", "sequence", "--rollout-is-mode", "mask", "--rollout-is-threshold", "4",
         "--rollout-rs", "token", "--rollout-rs-threshold", "4",
         "--overlong-buffer-len", "3", "--overlong-filter"]


@pytest.mark.subprocess
def test_fully_async_lag_one_with_lora_corrects_and_repeats_exactly(tmp_path):
    """Batches one step old: the ratios leave 1, the correction and the length control
    report on the training rank, and a second seeded run is the same run."""
    from tests.distributed_utils import torchrun_relax
    from tests.trainer.helpers import read_metrics

    reward = write_reward(tmp_path)
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        proc = torchrun_relax(*RECIPES["grpo"], *ASYNC, "--custom-rm-path", f"{reward}:parity",
                              "--output-dir", str(out), nproc=2, timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(read_metrics(out))
    first, second = runs
    lagged = [row for row in first if row["async/staleness"] == 1]
    assert lagged and all(row["rollout/logprob_abs_diff"] > 1e-4 for row in lagged)
    for row in first:
        assert 0 < row["train/rollout_is_ess"] <= 1
        assert row["train/rollout_is_weight_max"] <= 4
        assert row["rollout/overlong_penalty"] <= 0
        assert 0 <= row["rollout/overlong_filtered_fraction"] <= 1
    assert any(row["train/rollout_is_weight_mean"] != pytest.approx(1.0, abs=1e-4)
               for row in lagged)
    skip = ("perf/", "async/rollout_", "async/train_", "async/weight_sync_time")
    for a, b in zip(first, second, strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(skip)} == \
            {k: v for k, v in b.items() if not k.startswith(skip)}


PARTIAL = ["--partial-rollout", "--rollout-batch-size", "4", "--over-sampling-batch-size", "8",
           "--n-samples-per-prompt", "2", "--rollout-temperature", "1.5", "--lr", "1e-2",
           "--rollout-is", "sequence", "--rollout-rs", "token", "--rollout-rs-threshold", "3",
           "--num-rollout", "4"]


def test_partial_rollouts_take_the_correction_and_length_control_in_place_of_tis(tmp_path):
    """Carried tokens were sampled by older weights: their ratios leave 1 and the sequence
    weights show it; the overlong punishment counts every step's tokens of a response."""
    reward = write_reward(tmp_path)
    cfg = make_config(*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity", *PARTIAL,
                      "--rollout-max-response-len", "12", "--overlong-buffer-len", "6",
                      "--overlong-filter", output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    assert moved > 0
    assert any(r["rollout/partial_offpolicy_tokens"] > 0 for r in history[1:])
    assert any(r["train/rollout_is_weight_mean"] != pytest.approx(1.0, abs=1e-5)
               for r in history[1:])
    assert all(r["rollout/overlong_penalty"] <= 0 for r in history)


def test_episodes_are_corrected_on_the_models_tokens(tmp_path):
    """--env episodes carried between steps: the environment's tokens are holes of the mask,
    so only the model's tokens form the ratios (a run that trains and reports)."""
    cfg = make_config(*RECIPES["grpo"], "--env", "tests.rollout.agents.scripted:ragged",
                      "--max-turns", "3", *PARTIAL, output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    assert moved > 0
    for row in history:
        assert 0 < row["train/rollout_is_ess"] <= 1
        assert 0 <= row["train/rollout_rs_masked_fraction"] <= 1
