"""reinforce_plus_plus.md §8: every rejection row, each side of each condition, for the variants
it names.

Each case starts from an accepted configuration (a recipe of reinforce_plus_plus.md or an
estimator's defaults), changes one thing, and asserts exit status 2, one stderr line, the offending flag named.
"""

from __future__ import annotations

import pytest

RPP = ["--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages",
       "--gamma", "1.0", "--kl-coef", "0.01", "--kl-loss-type", "k1"]
BASE = ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
        "--n-samples-per-prompt", "8", "--kl-coef", "0", "--use-kl-loss", "--kl-loss-type", "k2",
        "--kl-loss-coef", "0.01"]
ACCEPTED = {
    "reinforce_plus_plus": RPP,
    "reinforce_plus_plus_baseline": BASE,
    "grpo": ["--advantage-estimator", "grpo"],
    "gspo": ["--advantage-estimator", "gspo"],
    "sapo": ["--advantage-estimator", "sapo"],
    "cispo": ["--advantage-estimator", "cispo", "--calculate-per-token-loss"],
    "rloo": ["--advantage-estimator", "rloo", "--calculate-per-token-loss"],
}
VARIANTS = {"rpp": RPP, "baseline": BASE}


def edit(argv: list[str], *changes) -> list[str]:
    """Apply changes: ("--flag", "value") sets, ("--flag",) adds a switch, ("-", "--flag")
    removes the flag and its value (if it has one)."""
    out = list(argv)
    for change in changes:
        if change[0] == "-":
            i = out.index(change[1])
            has_value = i + 1 < len(out) and not out[i + 1].startswith("--")
            del out[i: i + 1 + has_value]
        elif change[0] in out and len(change) == 2:
            out[out.index(change[0]) + 1] = change[1]
        elif change[0] not in out:
            out.extend(change)
    return out


def test_starting_points_are_accepted(cli):
    for argv in ACCEPTED.values():
        assert cli(["train", *argv, "--dry-run"]).code == 0


# ---------------------------------------------------------------- both REINFORCE++ variants

BOTH_ROWS = {
    "normalize-missing": ((("-", "--normalize-advantages"),), ("--normalize-advantages",)),
    "fully-async": ((("--fully-async",),), ("--fully-async", "closed synchronous global batch")),
    "context-parallel-2": ((("--context-parallel-size", "2"),), ("--context-parallel-size 2",)),
    "context-parallel-0": ((("--context-parallel-size", "0"),), ("--context-parallel-size 0",)),
    "per-token-loss": ((("--calculate-per-token-loss",),),
                       ("--calculate-per-token-loss", "response mean")),
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("row", BOTH_ROWS)
def test_both_variants_rows(cli, rejected, variant, row):
    changes, needles = BOTH_ROWS[row]
    rejected(cli(["train", *edit(VARIANTS[variant], *changes), "--dry-run"]), *needles)


# ---------------------------------------------------------------- reinforce_plus_plus only

RPP_ROWS = {
    "kl-loss-type-k2": ((("--kl-loss-type", "k2"),), ("--kl-loss-type k2", "signed k1")),
    "kl-loss-type-k3": ((("--kl-loss-type", "k3"),), ("--kl-loss-type k3",)),
    "kl-loss-type-low-var": ((("--kl-loss-type", "low_var_kl"),), ("--kl-loss-type low_var_kl",)),
    "use-kl-loss": ((("--use-kl-loss",),), ("--use-kl-loss", "no second KL loss")),
    "kl-loss-coef-alone": ((("--kl-coef", "0"), ("--kl-loss-coef", "0.01")),
                           ("--kl-loss-coef 0.01", "no second KL loss")),
    "kl-loss-coef-with-kl-coef": ((("--kl-loss-coef", "0.01"),),
                                  ("--kl-coef 0.01", "--kl-loss-coef 0.01")),
    "kl-coef-negative": ((("--kl-coef", "-0.01"),), ("--kl-coef -0.01",)),
    "gamma-zero": ((("--gamma", "0"),), ("--gamma 0", "(0, 1]")),
    "gamma-above-one": ((("--gamma", "1.5"),), ("--gamma 1.5", "(0, 1]")),
    "gamma-negative": ((("--gamma", "-0.5"),), ("--gamma -0.5",)),
}


@pytest.mark.parametrize("row", RPP_ROWS)
def test_reinforce_plus_plus_rows(cli, rejected, row):
    changes, needles = RPP_ROWS[row]
    rejected(cli(["train", *edit(RPP, *changes), "--dry-run"]), *needles)


def test_reinforce_plus_plus_boundaries_accepted(cli):
    """gamma's upper end 1 is in, any small positive gamma too; beta = 0 is allowed."""
    for changes in ((("--gamma", "1"),), (("--gamma", "0.01"),), (("--kl-coef", "0"),)):
        assert cli(["train", *edit(RPP, *changes), "--dry-run"]).code == 0


# ---------------------------------------------------------------- reinforce_plus_plus_baseline

BASE_ROWS = {
    "one-sample": ((("--n-samples-per-prompt", "1"),), ("--n-samples-per-prompt 1", "be 0")),
    "zero-samples": ((("--n-samples-per-prompt", "0"),), ("--n-samples-per-prompt 0",)),
    "kl-coef-alone": ((("--kl-loss-coef", "0"), ("-", "--use-kl-loss"), ("--kl-coef", "0.01")),
                      ("--kl-coef 0.01", "never enters the advantage")),
    "kl-coef-with-kl-loss": ((("--kl-coef", "0.01"),), ("--kl-coef 0.01",)),
    "kl-loss-type-k1": ((("--kl-loss-type", "k1"),), ("--kl-loss-type k1", "k2")),
    "kl-loss-type-k3": ((("--kl-loss-type", "k3"),), ("--kl-loss-type k3",)),
    "kl-loss-type-low-var": ((("--kl-loss-type", "low_var_kl"),), ("--kl-loss-type low_var_kl",)),
    "kl-loss-coef-without-use": ((("-", "--use-kl-loss"),),
                                 ("--kl-loss-coef 0.01", "--use-kl-loss")),
    "kl-loss-coef-negative": ((("--kl-loss-coef", "-0.01"),), ("--kl-loss-coef -0.01",)),
    "custom-post-process": ((("--custom-reward-post-process-path", "json:loads"),),
                            ("--custom-reward-post-process-path json:loads", "group-mean")),
    "custom-advantage": ((("--custom-advantage-function-path", "json:loads"),),
                         ("--custom-advantage-function-path json:loads", "group-mean")),
}


@pytest.mark.parametrize("row", BASE_ROWS)
def test_baseline_rows(cli, rejected, row):
    changes, needles = BASE_ROWS[row]
    rejected(cli(["train", *edit(BASE, *changes), "--dry-run"]), *needles)


def test_baseline_kl_loss_off_accepted(cli):
    """No KL at all is a legal baseline run; so is the KL loss with coefficient 0."""
    for changes in ((("-", "--use-kl-loss"), ("-", "--kl-loss-type"), ("--kl-loss-coef", "0")),
                    (("--kl-loss-coef", "0"),)):
        assert cli(["train", *edit(BASE, *changes), "--dry-run"]).code == 0


# ---------------------------------------------------------------- every estimator

@pytest.mark.parametrize("estimator", ACCEPTED)
@pytest.mark.parametrize("mode", [("--context-parallel-size", "2")])
def test_unimplemented_modes_rejected_for_every_estimator(cli, rejected, estimator, mode):
    line = rejected(cli(["train", *ACCEPTED[estimator], *mode, "--dry-run"]), mode[0])
    if estimator.startswith("reinforce_plus_plus"):
        assert estimator in line  # the REINFORCE++-specific reason
    else:
        assert "not implemented" in line


@pytest.mark.parametrize("estimator", ACCEPTED)
def test_fully_async_rejected_only_for_the_reinforce_plus_plus_variants(cli, estimator,
                                                                        monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # one training rank, one rollout rank
    result = cli(["train", *ACCEPTED[estimator], "--fully-async", "--max-staleness", "0",
                  "--dry-run"])
    if estimator.startswith("reinforce_plus_plus"):
        assert result.code == 2 and "closed synchronous global batch" in result.err
    else:
        assert result.config()["world_size"] == 1  # the training ranks


@pytest.mark.parametrize("estimator", ACCEPTED)
def test_kl_coef_and_kl_loss_coef_never_both_nonzero(cli, rejected, estimator):
    argv = edit(ACCEPTED[estimator], ("--kl-coef", "0.01"), ("--use-kl-loss",),
                ("--kl-loss-coef", "0.02"))
    rejected(cli(["train", *argv, "--dry-run"]), "--kl-coef 0.01", "--kl-loss-coef 0.02")


# ---------------------------------------------------------------- flags an estimator would ignore

IGNORED = {
    "grpo-gamma": ("grpo", ("--gamma", "0.9"), "--gamma 0.9"),
    "baseline-gamma": ("reinforce_plus_plus_baseline", ("--gamma", "0.9"), "--gamma 0.9"),
    "gspo-kl-coef": ("gspo", ("--kl-coef", "0.01"), "--kl-coef 0.01"),
    "grpo-sapo-tau": ("grpo", ("--sapo-tau-pos", "2"), "--sapo-tau-pos 2"),
    "rpp-sapo-tau": ("reinforce_plus_plus", ("--sapo-tau-neg", "2"), "--sapo-tau-neg 2"),
    "sapo-eps-clip": ("sapo", ("--eps-clip", "0.3"), "--eps-clip 0.3"),
    "sapo-eps-clip-high": ("sapo", ("--eps-clip-high", "0.28"), "--eps-clip-high 0.28"),
    "gspo-dual-clip": ("gspo", ("--eps-clip-c", "3"), "--eps-clip-c 3"),
    "rpp-std-switch": ("reinforce_plus_plus", ("--disable-grpo-std-normalization",),
                       "--disable-grpo-std-normalization"),
    "rpp-custom-advantage": ("reinforce_plus_plus",
                             ("--custom-advantage-function-path", "json:loads"),
                             "--custom-advantage-function-path"),
    "grpo-kl-coef-without-loss": ("grpo", ("--kl-loss-coef", "0.1"), "--kl-loss-coef 0.1"),
}


@pytest.mark.parametrize("case", IGNORED)
def test_flags_the_estimator_ignores_are_rejected(cli, rejected, case):
    estimator, change, needle = IGNORED[case]
    rejected(cli(["train", *edit(ACCEPTED[estimator], change), "--dry-run"]), needle)


def test_kl_loss_type_without_kl_loss_is_inert_and_accepted(cli):
    """Valid upstream: --kl-loss-type alone changes nothing, so it is not rejected."""
    for estimator, kind in (("grpo", "k3"), ("sapo", "low_var_kl")):
        assert cli(["train", *ACCEPTED[estimator], "--kl-loss-type", kind, "--dry-run"]).code == 0
    argv = edit(BASE, ("-", "--use-kl-loss"), ("--kl-loss-coef", "0"))  # keeps --kl-loss-type k2
    assert cli(["train", *argv, "--dry-run"]).code == 0


def test_ref_load_needs_a_kl(cli, rejected, tmp_path):
    ref = str(tmp_path)
    rejected(cli(["train", "--ref-load", ref, "--dry-run"]), "--ref-load")
    cfg = cli(["train", *RPP, "--ref-load", ref, "--dry-run"]).config()
    assert cfg["ref_load"] == ref


def test_estimator_specific_flags_accepted_where_they_apply(cli):
    cases = [
        ("grpo", ["--eps-clip-c", "3", "--eps-clip-high", "0.28", "--disable-grpo-std-normalization",
                  "--calculate-per-token-loss", "--normalize-advantages",
                  "--use-kl-loss", "--kl-loss-type", "low_var_kl", "--kl-loss-coef", "0.001",
                  "--custom-advantage-function-path", "json:loads"]),
        ("sapo", ["--sapo-tau-pos", "2", "--sapo-tau-neg", "3"]),
        ("gspo", ["--eps-clip", "3e-4", "--eps-clip-high", "4e-4"]),
        ("reinforce_plus_plus", ["--eps-clip-c", "3", "--custom-reward-post-process-path",
                                 "json:loads", "--entropy-coef", "0.01"]),
    ]
    for estimator, extra in cases:
        r = cli(["train", *ACCEPTED[estimator], *extra, "--dry-run"])
        assert r.code == 0, (estimator, r.err)


# ---------------------------------------------------------------- single-flag ranges

BAD_VALUES = [
    ("--eps-clip", "0"), ("--eps-clip", "1"), ("--eps-clip-high", "0"), ("--eps-clip-c", "1"),
    ("--entropy-coef", "-1"), ("--rollout-batch-size", "0"), ("--global-batch-size", "0"),
    ("--micro-batch-size", "0"), ("--num-steps-per-rollout", "0"), ("--num-rollout", "0"),
    ("--rollout-max-response-len", "0"), ("--rollout-temperature", "0"),
    ("--rollout-top-p", "0"), ("--rollout-top-p", "1.1"), ("--rollout-top-k", "0"),
    ("--lr", "0"), ("--weight-decay", "-0.1"), ("--adam-beta1", "1"), ("--adam-beta2", "-0.1"),
    ("--clip-grad", "0"), ("--seed", "-1"), ("--save-interval", "0"),
    ("--lr", "nan"), ("--gamma", "inf"), ("--seed", "1.5"), ("--rollout-batch-size", "x"),
    ("--advantage-estimator", "ppo_plus"), ("--kl-loss-type", "k4"), ("--device", "tpu"),
    ("--rm-type", "gsm8k"), ("--builtin-task", "sort"), ("--output-dir", ""),
]


@pytest.mark.parametrize(("flag", "value"), BAD_VALUES)
def test_bad_single_values(cli, rejected, flag, value):
    rejected(cli(["train", flag, value, "--dry-run"]), flag)


def test_unknown_flag_suggests_the_closest(cli, rejected):
    line = rejected(cli(["train", "--kl-coeff", "0.1", "--dry-run"]), "--kl-coeff")
    assert "did you mean --kl-coef?" in line
    rejected(cli(["train", "--dry-run", "stray"]), "stray")
    rejected(cli(["train", "--lr"]), "--lr", "expected one argument")
    # no prefix matching: a shortened flag is unknown, not silently expanded
    rejected(cli(["train", "--normalize", "--dry-run"]), "--normalize")


# ---------------------------------------------------------------- dynamic sampling

DYNAMIC = ["--advantage-estimator", "grpo", "--n-samples-per-prompt", "4",
           "--dynamic-sampling-filter-path", "nonzero_std"]


def test_dynamic_sampling_accepted_and_resolved(cli):
    cfg = cli(["train", *DYNAMIC, "--dry-run"]).config()
    assert cfg["over_sampling_batch_size"] == cfg["rollout_batch_size"]
    assert cfg["dynamic_sampling_max_rounds"] == 8
    cfg = cli(["train", *DYNAMIC, "--over-sampling-batch-size", "32",
               "--dynamic-sampling-filter-path", "json:loads", "--dry-run"]).config()
    assert cfg["over_sampling_batch_size"] == 32


@pytest.mark.parametrize("argv,needles", [
    (["--over-sampling-batch-size", "32"], ("--over-sampling-batch-size 32", "has no effect")),
    (["--dynamic-sampling-max-rounds", "3"], ("--dynamic-sampling-max-rounds 3",)),
    ([*DYNAMIC, "--over-sampling-batch-size", "4", "--rollout-batch-size", "8"],
     ("--over-sampling-batch-size 4 --rollout-batch-size 8", ">= --rollout-batch-size")),
    ([*DYNAMIC, "--dynamic-sampling-max-rounds", "0"], ("--dynamic-sampling-max-rounds 0",)),
    ([*DYNAMIC, "--n-samples-per-prompt", "1"],
     ("--dynamic-sampling-filter-path nonzero_std --n-samples-per-prompt 1",)),
    ([*DYNAMIC, "--dynamic-sampling-filter-path", "no_such_module:f"],
     ("--dynamic-sampling-filter-path no_such_module:f", "not found")),
])
def test_dynamic_sampling_rejections(cli, rejected, argv, needles):
    rejected(cli(["train", *argv, "--dry-run"]), *needles)


def test_over_sampling_needs_whole_groups_per_rank(cli, rejected, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    rejected(cli(["train", *DYNAMIC, "--rollout-batch-size", "16", "--over-sampling-batch-size",
                  "17", "--dry-run"]), "--over-sampling-batch-size 17", "WORLD_SIZE=2")


# ---------------------------------------------------------------- token-budget micro-batches

@pytest.mark.parametrize("argv,needles", [
    (["--max-tokens-per-gpu", "4096"], ("--max-tokens-per-gpu 4096", "--use-dynamic-batch-size")),
    (["--log-probs-max-tokens-per-gpu", "4096"], ("--log-probs-max-tokens-per-gpu 4096",)),
    (["--use-dynamic-batch-size"], ("--use-dynamic-batch-size", "--max-tokens-per-gpu N")),
    (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "5"],
     ("--max-tokens-per-gpu 5 --rollout-max-response-len 5", "at least one row")),
])
def test_token_budget_rejections(cli, rejected, argv, needles):
    rejected(cli(["train", *argv, "--dry-run"]), *needles)


def test_token_budget_accepted(cli):
    cfg = cli(["train", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "64",
               "--dry-run"]).config()
    assert cfg["max_tokens_per_gpu"] == 64 and cfg["log_probs_max_tokens_per_gpu"] is None


# ---------------------------------------------------------------- LoRA

@pytest.mark.parametrize("argv,needles", [
    (["--lora-alpha", "32"], ("--lora-alpha 32", "--lora-rank")),
    (["--lora-target-modules", "q_proj"], ("--lora-target-modules q_proj",)),
    (["--lora-rank", "-1"], ("--lora-rank -1",)),
    (["--lora-rank", "8", "--lora-dropout", "1"], ("--lora-dropout 1",)),
    (["--lora-rank", "8", "--fsdp"], ("--lora-rank 8 --fsdp", "remove --fsdp")),
])
def test_lora_rejections(cli, rejected, argv, needles):
    rejected(cli(["train", *argv, "--dry-run"]), *needles)


def test_lora_accepted(cli):
    cfg = cli(["train", "--lora-rank", "8", "--lora-target-modules", "linear_qkv", "linear_fc1",
               "--dry-run"]).config()
    assert cfg["lora_rank"] == 8 and cfg["lora_target_modules"] == ["linear_qkv", "linear_fc1"]
