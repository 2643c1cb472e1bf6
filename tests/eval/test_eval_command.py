"""``relax eval CHECKPOINT``: a saved tiny model evaluates like the in-memory one; bad
arguments are one line and exit 2."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from relax.cli import main
from relax.config import BUILTIN_PRESET, parse_eval_config
from relax.eval.sets import evaluate_sets, load_eval_sets


def call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_checkpoint_round_trip_equals_in_memory_evaluation(tiny, tiny_checkpoint, tmp_path):
    argv = [tiny_checkpoint, "--eval-temperature", "0", "--n-samples-per-eval-prompt", "2",
            "--eval-pass-threshold", "0.2"]
    code, out, err = call(["eval", *argv, "--output-dir", str(tmp_path / "ev")])
    assert (code, err) == (0, "")
    metrics = json.loads(out)
    assert json.loads((tmp_path / "ev" / "eval_metrics.json").read_text()) == metrics
    # greedy decoding: the saved and reloaded model gives the in-memory model's numbers
    model, tok = tiny
    cfg = parse_eval_config(argv)
    assert cfg.evaluation.eval_max_response_len == BUILTIN_PRESET["rollout_max_response_len"]
    direct = evaluate_sets(cfg.evaluation, cfg.rollout, cfg.system,
                           load_eval_sets(cfg.evaluation, cfg.rollout), model, tok, "cpu",
                           seed=cfg.run.seed)
    metrics.pop("perf/eval_time"), direct.pop("perf/eval_time")
    assert metrics == pytest.approx(direct, abs=1e-12)
    assert set(metrics) == {"eval/copy/pass@1", "eval/copy/pass@2", "eval/copy/mean_reward",
                            "eval/copy/response_length", "eval/copy/truncated"}


def test_data_file_names_the_metrics(tiny_checkpoint, tmp_path):
    data = tmp_path / "held.jsonl"
    data.write_text('{"q": "ab=", "a": "ab"}\n{"q": "ca=", "a": "ca"}\n')
    code, out, err = call(["eval", tiny_checkpoint, "--eval-prompt-data", str(data),
                           "--rm-type", "copy", "--input-key", "q", "--label-key", "a",
                           "--eval-max-response-len", "3"])
    assert code == 0, err
    assert sorted(json.loads(out)) == ["eval/held/mean_reward", "eval/held/pass@1",
                                       "eval/held/response_length", "eval/held/truncated",
                                       "perf/eval_time"]


@pytest.mark.parametrize("args,needle", [
    (["MISSING"], "no such directory"),
    (["EMPTY"], "no config.json"),
    (["CKPT", "--eval-prompt-data", "DATA"], "needs a reward"),
    (["CKPT", "--eval-prompt-data", "a", "DATA", "b"], "got 3 values"),
    (["CKPT", "--eval-prompt-data", "a/b", "DATA", "--rm-type", "math"], "name 'a/b'"),
    (["CKPT", "--eval-prompt-data", "DATA", "--rm-type", "math", "--builtin-task", "copy"],
     "--builtin-task"),
    (["CKPT", "--rm-type", "math"], "--rm-type math"),
    (["CKPT", "--input-key", "q"], "--input-key"),
    (["CKPT", "--eval-top-p", "0"], "--eval-top-p"),
    (["CKPT", "--n-samples-per-eval-prompt", "0"], "--n-samples-per-eval-prompt"),
    (["CKPT", "--eval-interval", "2"], "unknown flag"),
    # the sampler's precision apart from the trainer's is relax train's alone
    (["CKPT", "--rollout-bf16"], "--rollout-bf16: a relax train flag"),
    (["CKPT", "--no-rollout-bf16"], "--no-rollout-bf16: a relax train flag"),
    (["CKPT", "--apply-chat-template"], "no chat template"),
    ([], "CHECKPOINT"),
])
def test_rejections_are_one_line(tmp_path, tiny_checkpoint, args, needle):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "ab=", "label": "ab"}\n')
    (tmp_path / "empty").mkdir()
    subst = {"MISSING": str(tmp_path / "missing"), "EMPTY": str(tmp_path / "empty"),
             "CKPT": tiny_checkpoint, "DATA": str(data)}
    code, out, err = call(["eval", *[subst.get(a, a) for a in args]])
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith("relax eval: error: ") and needle in err, err


def test_omp_num_threads_sets_the_threads_as_in_training(tiny_checkpoint, tmp_path, monkeypatch):
    """``relax eval`` on the CPU takes OMP_NUM_THREADS as ``relax train`` does (it took every
    core, so evaluations beside other work could not be held to one)."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(2)
    try:
        code, _, err = call(["eval", tiny_checkpoint, "--eval-temperature", "0",
                             "--output-dir", str(tmp_path / "ev")])
        assert (code, err) == (0, "")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
