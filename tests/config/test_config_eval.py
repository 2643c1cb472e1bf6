"""Evaluation flags of relax train: defaults follow the rollout, nothing is silently ignored,
ranges and --eval-prompt-data forms are checked before anything is loaded."""

from __future__ import annotations

import pytest

BASE = ["train", "--dry-run"]
EVAL = [*BASE, "--eval-interval", "5"]


def test_defaults_follow_the_rollout_settings(cli):
    cfg = cli(BASE).config()
    assert cfg["eval_interval"] is None and cfg["eval_prompt_data"] is None
    cfg = cli([*EVAL, "--rollout-temperature", "0.7", "--rollout-top-p", "0.9",
               "--rollout-top-k", "5", "--rollout-max-response-len", "6"]).config()
    assert (cfg["eval_temperature"], cfg["eval_top_p"], cfg["eval_top_k"],
            cfg["eval_max_response_len"]) == (0.7, 0.9, 5, 6)
    cfg = cli([*EVAL, "--eval-temperature", "0", "--eval-top-k", "-1",
               "--eval-max-response-len", "3", "--n-samples-per-eval-prompt", "8"]).config()
    assert (cfg["eval_temperature"], cfg["eval_top_k"], cfg["eval_max_response_len"],
            cfg["n_samples_per_eval_prompt"]) == (0.0, -1, 3, 8)


@pytest.mark.parametrize("flag", [
    ["--eval-prompt-data", "PROMPTS"], ["--n-samples-per-eval-prompt", "4"],
    ["--eval-temperature", "0.6"], ["--eval-top-p", "0.9"], ["--eval-top-k", "4"],
    ["--eval-max-response-len", "64"], ["--eval-batch-size", "8"],
    ["--eval-pass-threshold", "0.5"],
])
def test_eval_flags_without_an_interval_are_rejected(cli, rejected, prompt_file, flag):
    flag = [prompt_file if v == "PROMPTS" else v for v in flag]
    rejected(cli([*BASE, *flag]), flag[0], "--eval-interval")


@pytest.mark.parametrize("flag,value", [
    ("--eval-interval", "0"), ("--n-samples-per-eval-prompt", "0"),
    ("--eval-temperature", "-0.1"), ("--eval-top-p", "0"), ("--eval-top-p", "1.5"),
    ("--eval-top-k", "0"), ("--eval-max-response-len", "0"), ("--eval-batch-size", "0"),
])
def test_ranges(cli, rejected, flag, value):
    rejected(cli([*EVAL, flag, value]), f"{flag} {value}")


def test_eval_prompt_data_forms(cli, rejected, prompt_file, tmp_path):
    cfg = cli([*EVAL, "--eval-prompt-data", prompt_file]).config()
    assert cfg["eval_prompt_data"] == [["prompts", prompt_file]]
    cfg = cli([*EVAL, "--eval-prompt-data", "a", prompt_file, "b.2", prompt_file]).config()
    assert cfg["eval_prompt_data"] == [["a", prompt_file], ["b.2", prompt_file]]
    rejected(cli([*EVAL, "--eval-prompt-data", "a", prompt_file, "b"]), "--eval-prompt-data",
             "got 3 values")
    rejected(cli([*EVAL, "--eval-prompt-data", "a", prompt_file, "a", prompt_file]),
             "given twice")
    rejected(cli([*EVAL, "--eval-prompt-data", "a/b", prompt_file]), "name 'a/b'")
    rejected(cli([*EVAL, "--eval-prompt-data", "a", str(tmp_path / "no.jsonl")]),
             "no such file")


def test_user_data_needs_an_eval_set(cli, rejected, prompt_file):
    data = ["--prompt-data", prompt_file, "--rm-type", "math"]
    rejected(cli([*EVAL, *data]), "--eval-interval 5", "--eval-prompt-data")
    cfg = cli([*EVAL, *data, "--eval-prompt-data", "held", prompt_file]).config()
    assert cfg["eval_prompt_data"] == [["held", prompt_file]] and cfg["eval_interval"] == 5
