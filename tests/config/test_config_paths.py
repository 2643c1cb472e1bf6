"""Paths must exist; custom 'module:function' paths are found without running user code."""

from __future__ import annotations

import sys

import pytest

GRPO = ["train", "--advantage-estimator", "grpo", "--dry-run"]


def test_directories(cli, rejected, tmp_path, hf_dir, prompt_file):
    missing = str(tmp_path / "missing")
    rejected(cli([*GRPO, "--hf-checkpoint", missing, "--num-rollout", "2"]),
                    "--hf-checkpoint", "no such directory")
    rejected(cli([*GRPO, "--hf-checkpoint", str(tmp_path), "--num-rollout", "2"]),
                    "--hf-checkpoint", "config.json")
    rejected(cli([*GRPO, "--hf-checkpoint", prompt_file, "--num-rollout", "2"]),
                    "--hf-checkpoint")
    cfg = cli([*GRPO, "--hf-checkpoint", hf_dir, "--num-rollout", "2"]).config()
    assert cfg["hf_checkpoint"] == hf_dir and cfg["builtin_preset_applied"] is False
    kl = ["--use-kl-loss", "--kl-loss-coef", "0.01"]
    rejected(cli([*GRPO, *kl, "--ref-load", missing]), "--ref-load")
    assert cli([*GRPO, *kl, "--ref-load", hf_dir]).config()["ref_load"] == hf_dir
    rejected(cli([*GRPO, "--load", missing]), "--load")
    assert cli([*GRPO, "--load", str(tmp_path)]).config()["load"] == str(tmp_path)


def test_prompt_data_and_reward(cli, rejected, tmp_path, prompt_file):
    rejected(cli([*GRPO, "--prompt-data", str(tmp_path / "x.jsonl"), "--rm-type", "math"]),
                    "--prompt-data", "no such file")
    rejected(cli([*GRPO, "--prompt-data", str(tmp_path), "--rm-type", "math"]),
                    "--prompt-data")
    rejected(cli([*GRPO, "--prompt-data", prompt_file]), "--prompt-data", "--rm-type")
    rejected(cli([*GRPO, "--prompt-data", prompt_file, "--rm-type", "math",
                         "--custom-rm-path", "json:loads"]), "--rm-type math", "--custom-rm-path")
    rejected(cli([*GRPO, "--prompt-data", prompt_file, "--rm-type", "math",
                         "--builtin-task", "addition"]), "--builtin-task")
    cfg = cli([*GRPO, "--prompt-data", prompt_file, "--custom-rm-path", "json:loads",
               "--input-key", "question", "--label-key", "answer", "--rollout-shuffle"]).config()
    assert (cfg["prompt_data"], cfg["builtin_task"], cfg["input_key"]) == (
        prompt_file, None, "question")
    # data-only flags without data would be ignored: rejected
    for flag in (["--input-key", "q"], ["--label-key", "a"], ["--rollout-shuffle"]):
        rejected(cli([*GRPO, *flag]), flag[0])
    rejected(cli([*GRPO, "--rm-type", "math"]), "--rm-type math")
    assert cli([*GRPO, "--rm-type", "copy"]).config()["rm_type"] == "copy"


def test_chat_template_and_system_prompt(cli, rejected, hf_dir):
    rejected(cli([*GRPO, "--apply-chat-template"]), "--apply-chat-template")
    assert cli([*GRPO, "--system-prompt", "Be brief."]).config()["system_prompt"] == "Be brief."
    cfg = cli([*GRPO, "--hf-checkpoint", hf_dir, "--num-rollout", "1", "--apply-chat-template",
               "--system-prompt", "Be brief."]).config()
    assert cfg["system_prompt"] == "Be brief."


def test_run_directories(cli, rejected, tmp_path, prompt_file):
    rejected(cli([*GRPO, "--save-interval", "5"]), "--save-interval 5", "--save")
    # an interval the run never reaches saves nothing the final checkpoint does not
    rejected(cli([*GRPO, "--save", str(tmp_path / "ckpt"), "--save-interval", "4",
                  "--num-rollout", "3"]), "--save-interval 4 --num-rollout 3", "never reached")
    assert cli([*GRPO, "--save", str(tmp_path / "ckpt"), "--save-interval", "3",
                "--num-rollout", "3"]).config()["save_interval"] == 3
    rejected(cli([*GRPO, "--output-dir", prompt_file]), "--output-dir")
    rejected(cli([*GRPO, "--save", prompt_file]), "--save")
    cfg = cli([*GRPO, "--save", str(tmp_path / "ckpt"), "--save-interval", "5",
               "--output-dir", str(tmp_path / "out")]).config()
    assert (cfg["save_interval"], cfg["output_dir"]) == (5, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # a dry run creates nothing
    default = cli(GRPO).config()["output_dir"]
    assert default.startswith("runs/grpo-") and len(default) == len("runs/grpo-20260101-000000")


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A package whose __init__ and modules raise on import, on sys.path."""
    pkg = tmp_path / "boompkg"
    (pkg / "sub").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text("raise RuntimeError('user code ran during validation')\n")
    (pkg / "sub" / "rewards.py").write_text("raise RuntimeError('imported')\n")
    script = tmp_path / "my_reward.py"
    script.write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return str(script)


@pytest.mark.parametrize("flag", ["--custom-rm-path", "--custom-reward-post-process-path",
                                  "--custom-advantage-function-path"])
def test_custom_paths(cli, rejected, flag, user_code, tmp_path):
    for good in ("boompkg.sub.rewards:score", "boompkg:f", f"{user_code}:reward", "json:loads",
                 "boompkg.sub.rewards:Scorer.score"):
        r = cli([*GRPO, flag, good])
        assert r.code == 0, (good, r.err)
    assert not any(name.startswith("boompkg") for name in sys.modules)
    for bad, reason in [("no_colon", "expected"), ("json:", "expected"), (":f", "expected"),
                        ("json:1f", "expected"), ("a-b:f", "not a module name"),
                        ("boompkg.nothere:f", "not found"), ("no_such_mod_zz:f", "not found"),
                        ("json.loads.x:f", "not found"),  # json.loads is no package
                        (f"{tmp_path}/missing.py:f", "does not exist")]:
        rejected(cli([*GRPO, flag, bad]), flag, reason)
