"""maybe_evaluate, the hook relax train calls each rollout step, and its evaluation sets."""

from __future__ import annotations

import json

import pytest

from relax.config import BUILTIN_EVAL_PROMPTS, parse_train_config
from relax.errors import InputError
from relax.eval.sets import load_eval_sets, maybe_evaluate


def cfg(*flags):
    return parse_train_config(["--eval-interval", "2", "--n-samples-per-eval-prompt", "2",
                               *flags])


def test_not_due_returns_nothing_and_touches_no_model():
    c = cfg()
    for step in (1, 3, 5):
        assert maybe_evaluate(c.evaluation, c.rollout, c.system, step, None, None, "cpu",
                              seed=c.run.seed) == {}
    off = parse_train_config([])
    assert off.evaluation.eval_interval is None and maybe_evaluate(
        off.evaluation, off.rollout, off.system, 4, None, None, "cpu", seed=off.run.seed) == {}


def test_builtin_task_set_is_fixed_across_seeds():
    a, b = (load_eval_sets(c.evaluation, c.rollout) for c in (cfg("--seed", "1"), cfg("--seed", "2")))
    assert a == b and len(a) == 1 and a[0].name == "copy"
    assert len(a[0].prompts) == BUILTIN_EVAL_PROMPTS
    c = cfg("--builtin-task", "addition")
    addition = load_eval_sets(c.evaluation, c.rollout)[0]
    assert addition.name == "addition" and addition.prompts[0].endswith("=")


def test_due_steps_evaluate_the_builtin_task(tiny):
    model, tok = tiny
    c = cfg("--eval-temperature", "1.0", "--eval-max-response-len", "4")
    sets = load_eval_sets(c.evaluation, c.rollout)
    out = maybe_evaluate(c.evaluation, c.rollout, c.system, 2, model, tok, "cpu", seed=c.run.seed,
                         eval_sets=sets)
    assert {"eval/copy/pass@1", "eval/copy/pass@2", "eval/copy/mean_reward",
            "eval/copy/response_length", "eval/copy/truncated", "perf/eval_time"} == set(out)
    assert 0 <= out["eval/copy/pass@1"] <= out["eval/copy/pass@2"] <= 1
    assert 0 < out["eval/copy/response_length"] <= 4
    # step 0 (before training) is due as well; a different step samples with another seed
    assert set(maybe_evaluate(c.evaluation, c.rollout, c.system, 0, model, tok, "cpu",
                              seed=c.run.seed, eval_sets=sets)) == set(out)


def test_eval_prompt_data_sets_and_bad_rows(tmp_path, tiny):
    good = tmp_path / "held.jsonl"
    good.write_text("".join(json.dumps({"input": f"{s}=", "label": s}) + "\n"
                            for s in ("ab", "cd", "abc")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "ab=", "label": "ab"}\n{"label": "x"}\n')
    c = cfg("--eval-prompt-data", "first", str(good), "second", str(good))
    sets = load_eval_sets(c.evaluation, c.rollout)
    assert [s.name for s in sets] == ["first", "second"] and sets[0].labels == ["ab", "cd", "abc"]
    model, tok = tiny
    out = maybe_evaluate(c.evaluation, c.rollout, c.system, 4, model, tok, "cpu", seed=c.run.seed,
                         eval_sets=sets)
    assert {k.split("/")[1] for k in out if k.startswith("eval/")} == {"first", "second"}
    pairs = cfg("--eval-prompt-data", str(good)).evaluation.eval_prompt_data
    assert pairs == (("held", str(good)),)
    with pytest.raises(InputError, match=r"--eval-prompt-data x: .*bad.jsonl:2: missing key"):
        c = cfg("--eval-prompt-data", "x", str(bad))
        load_eval_sets(c.evaluation, c.rollout)
