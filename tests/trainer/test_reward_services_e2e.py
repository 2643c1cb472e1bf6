"""End to end on the tiny model: ``relax train`` scored by a reward server process
(``--rm-type remote_rm``) and by a group function (``--group-rm``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from relax.rollout.reward.math_reward import math_reward
from tests.rollout.reward.test_remote_reward import server, stats
from tests.trainer.helpers import fit, make_config, read_metrics, write_jsonl, write_reward

ROWS = [{"input": f"{i}+{i}=", "label": str(2 * i)} for i in range(8)]


def _samples(output_dir) -> list[dict]:
    with open(output_dir / "samples.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.subprocess
def test_relax_train_with_the_example_reward_server(tmp_path):
    data = write_jsonl(tmp_path, ROWS)
    with server("math", tmp_path) as url:
        cfg = make_config("--prompt-data", data, "--rm-type", "remote_rm", "--rm-url", url,
                          "--reward-max-concurrency", "3", "--rm-batch-size", "2",
                          "--eval-interval", "2", "--eval-prompt-data", "held", data,
                          output_dir=tmp_path / "run")
        fit(cfg)
        posts = stats(url)["posts"]
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["rollout/raw_reward"]) and math.isfinite(r["train/loss"])
               for r in rows)
    assert rows[-1]["rollout/reward_errors"] == 0 and "eval/held/mean_reward" in rows[-1]
    # 2 steps x 16 samples in requests of 2, then the 8 evaluation prompts in requests of 2
    assert posts == 2 * 8 + 4
    # every logged reward is the math verifier's, computed by the server
    for s in _samples(tmp_path / "run"):
        assert s["reward"] == math_reward([s["prompt"]], [s["response"]], [s["label"]])[0]


@pytest.mark.subprocess
def test_relax_train_stops_with_one_line_when_the_server_answers_garbage(tmp_path):
    data = write_jsonl(tmp_path, ROWS)
    with server("garbage", tmp_path) as url:
        done = subprocess.run(
            [sys.executable, "-m", "relax", "train", "--prompt-data", data, "--rm-type",
             "remote_rm", "--rm-url", url, "--num-rollout", "1", "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--device",
             "cpu", "--output-dir", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and errors[0].startswith(
        f"relax train: error: reward model --rm-url {url}: answered something that is not "
        "JSON: '<html><body>Service temporarily"), done.stderr


def test_relax_train_with_a_group_reward(tmp_path):
    data = write_jsonl(tmp_path, ROWS)
    reward = write_reward(tmp_path, "def longest(prompts, responses, labels):\n"
                          "    assert len(set(prompts)) == 1 and len(prompts) == 4\n"
                          "    best = max(len(r) for r in responses)\n"
                          "    return [float(len(r) == best) for r in responses]\n")
    cfg = make_config("--prompt-data", data, "--custom-rm-path", f"{reward}:longest",
                      "--group-rm", output_dir=tmp_path / "run")
    _, _, moved = fit(cfg)
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and moved > 0.0
    # at least one member of every group is its longest: the mean reward is >= 1/4
    assert all(r["rollout/raw_reward"] >= 0.25 for r in rows)


def test_a_group_function_returning_the_wrong_count_is_exit_2_naming_the_flag(tmp_path, capsys):
    from relax.cli import main

    data = write_jsonl(tmp_path, ROWS)
    reward = write_reward(tmp_path, "def one(prompts, responses, labels):\n"
                          "    return [1.0]\n")
    code = main(["train", "--prompt-data", data, "--custom-rm-path", f"{reward}:one",
                 "--group-rm", "--num-rollout", "1", "--rollout-batch-size", "4",
                 "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
                 "--device", "cpu", "--output-dir", str(tmp_path / "run")])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2 and len(err) == 1
    assert err[0].startswith("relax train: error: --group-rm: reward function --custom-rm-path ")
    assert "returned 1 values for 2 samples" in err[0]


def test_relax_train_with_a_generative_judge(tmp_path):
    from tests.rollout.reward.test_genrm import _tiny_judge_dir

    data = write_jsonl(tmp_path, ROWS)
    cfg = make_config("--prompt-data", data, "--rm-type", "genrm", "--genrm-model-path",
                      _tiny_judge_dir(tmp_path), "--genrm-max-response-len", "4",
                      output_dir=tmp_path / "run")
    trainer, _, _ = fit(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["rollout/genrm_unparsed"] <= 1.0 for r in rows)
    # the judge's verdicts are 0/1 rewards (or 0 when it wrote no verdict)
    assert all(s["reward"] in (0.0, 1.0) for s in _samples(tmp_path / "run"))
    assert len(trainer.scorer.judge.last_verdicts) == 16  # one batch: the step's 4 x 4 samples
    assert trainer.scorer.judge.share_prefixes  # the default --pass-layout shared-prefix


def test_prompts_the_judge_cannot_hold_with_a_full_response_are_exit_2(tmp_path, capsys):
    from relax.cli import main
    from tests.rollout.reward.test_genrm import _tiny_judge_dir

    # row 3 fits the policy (64 + 4 tokens of 256) but not the judge: the default template's
    # 192 tokens + 64 + its label + 4 + the verdict's 4 (before: its start was cut silently)
    rows = ROWS[:2] + [{"input": "7" * 63 + "=", "label": "1"}] + ROWS[2:]
    data = write_jsonl(tmp_path, rows)
    code = main(["train", "--prompt-data", data, "--rm-type", "genrm", "--genrm-model-path",
                 _tiny_judge_dir(tmp_path), "--genrm-max-response-len", "4", "--num-rollout",
                 "1", "--rollout-max-response-len", "4", "--device", "cpu", "--output-dir",
                 str(tmp_path / "run")])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"relax train: error: {data}:3: judging prompt of 257 tokens "
                             "(template, prompt and label) + --rollout-max-response-len 4 + "
                             "--genrm-max-response-len 4 exceeds the judge's context of 256 "
                             "tokens (1 of 9 prompts do not fit)"), err


def test_a_judge_that_does_not_load_is_exit_2_naming_the_flag(tmp_path, capsys):
    from relax.cli import main

    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "config.json").write_text('{"model_type": "not-a-model"}')
    code = main(["train", "--prompt-data", write_jsonl(tmp_path, ROWS), "--rm-type", "genrm",
                 "--genrm-model-path", str(judge), "--num-rollout", "1", "--device", "cpu",
                 "--output-dir", str(tmp_path / "run")])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"relax train: error: --genrm-model-path {judge}: ")


@pytest.mark.subprocess
def test_two_ranks_post_their_own_samples_named_over_both(tmp_path):
    from tests.distributed_utils import torchrun_relax

    data = write_jsonl(tmp_path, ROWS)
    with server("math", tmp_path) as url:
        proc = torchrun_relax("--prompt-data", data, "--rm-type", "remote_rm", "--rm-url", url,
                              "--num-rollout", "1", "--rollout-batch-size", "4",
                              "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
                              "--device", "cpu", "--output-dir", str(tmp_path / "run"))
        bodies = stats(url)["bodies"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = sorted((b[0]["metadata"]["index"], b[0]["metadata"]["group_index"]) for b in bodies)
    # 4 prompts x 2 samples over 2 ranks: every sample once, groups numbered over both ranks
    assert meta == [(i, i // 2) for i in range(8)]
