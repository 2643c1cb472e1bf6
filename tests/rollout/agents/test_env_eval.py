"""Evaluation of ``--env`` policies on held-out environment seeds (relax/eval/env_eval.py):
in ``relax train --eval-interval`` and in ``relax eval CHECKPOINT --env``."""

import contextlib
import io
import json
from math import comb

import pytest

from relax.cli import main
from relax.config import ConfigError
from relax.eval.env_eval import evaluate_episodes
from relax.rollout.agents.episodes import HELDOUT_SEED, TurnRenderer
from relax.tiny_model import build_tiny_model, build_tokenizer
from tests.eval.helpers import eval_sampling
from tests.rollout.agents import scripted
from tests.trainer.helpers import RECIPES, fit, make_config

ENV = ["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3"]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0)


def _evaluate(tiny, make_env, *, episodes, n=1, batch=64, max_turns=3):
    tok, model = tiny
    sampling = eval_sampling(n_samples=n, temperature=1.0, max_response_len=4, batch_size=batch)
    return evaluate_episodes(
        model, tok, make_env, sampling, episodes=episodes, max_turns=max_turns,
        format_prompt=lambda t: t,
        render=TurnRenderer(tok, chat=False, eos_token_id=tok.eos_token_id), device="cpu")


@pytest.mark.parametrize("batch", [64, 3])  # one generation call, or several
def test_metrics_equal_a_hand_count_over_the_held_out_seeds(tiny, batch):
    scripted.JUDGED.clear()
    got = _evaluate(tiny, scripted.judge, episodes=10, n=2, batch=batch, max_turns=1)
    seeds = [HELDOUT_SEED + i for i in range(10)]
    assert sorted(scripted.JUDGED) == sorted(s for s in seeds for _ in range(2))
    won = [s % 3 == 0 for s in seeds]
    # pass@k over the 2 plays of a seed: both plays of a seed score alike (0 or 2 of 2 pass)
    assert got["eval/env/pass@1"] == pytest.approx(sum(won) / 10)
    assert got["eval/env/pass@2"] == pytest.approx(
        sum(1 - comb(2 - 2 * w, 2) / comb(2, 2) for w in won) / 10)
    assert got["eval/env/mean_reward"] == pytest.approx(
        sum(1.0 if w else 0.25 for w in won) / 10)
    assert got["eval/env/episode_turns"] == 1.0 and got["eval/env/truncated"] == 0.0
    assert 1.0 <= got["eval/env/response_length"] <= 4.0


def test_multi_turn_episode_reward_is_the_sum_of_step_rewards(tiny):
    scripted.REWARDS.clear()
    got = _evaluate(tiny, scripted.quiet_countdown, episodes=6)
    assert len(scripted.REWARDS) == 6
    assert got["eval/env/mean_reward"] == pytest.approx(sum(scripted.REWARDS) / 6)
    assert got["eval/env/episode_turns"] == 3.0
    # Countdown's rewards lie in [0.1, 0.8] per turn: no episode reaches the threshold 1.0
    # unless its three turns sum to it
    assert got["eval/env/pass@1"] == pytest.approx(
        sum(r >= 1.0 for r in scripted.REWARDS) / 6)


def test_training_evaluates_on_seeds_it_never_trains_on(tmp_path):
    scripted.ACTIONS.clear()
    cfg = make_config(*RECIPES["grpo"], *ENV, "--eval-interval", "2", "--eval-episodes", "5",
                      "--eval-temperature", "0", output_dir=tmp_path / "run")
    _, history, _ = fit(cfg)
    assert "eval/env/pass@1" not in history[0]
    assert history[1]["eval/env/episode_turns"] == 3.0
    seeds = {seed for seed, _ in scripted.ACTIONS}
    train, held = {s for s in seeds if s < HELDOUT_SEED}, {s for s in seeds if s >= HELDOUT_SEED}
    assert held == {HELDOUT_SEED + i for i in range(5)}
    assert len(train) == 8  # 2 steps x 4 groups: one seed per group


def _call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_relax_eval_plays_the_same_held_out_episodes(tiny, tmp_path):
    tok, model = tiny
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    scripted.JUDGED.clear()
    code, out, err = _call(["eval", str(tmp_path / "ckpt"), "--env", "tests.rollout.agents.scripted:judge",
                            "--max-turns", "1", "--eval-episodes", "9", "--eval-temperature",
                            "0", "--eval-max-response-len", "4", "--device", "cpu", "--output-dir", str(tmp_path / "out")])
    assert code == 0, err
    metrics = json.loads(out)
    assert sorted(scripted.JUDGED) == [HELDOUT_SEED + i for i in range(9)]
    assert metrics["eval/env/pass@1"] == pytest.approx(3 / 9)
    assert json.loads((tmp_path / "out" / "eval_metrics.json").read_text()) == metrics


@pytest.mark.parametrize(("flags", "match"), [
    (["--eval-episodes", "4"], "only applies to --env"),
    ([*ENV, "--eval-episodes", "4"], "has no effect without --eval-interval"),
    ([*ENV, "--eval-interval", "1", "--eval-episodes", "0"], "must be >= 1 episodes"),
    ([*ENV, "--eval-interval", "1", "--eval-prompt-data", "x.jsonl"], "held-out environment"),
])
def test_bad_train_flags(flags, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        make_config(*flags, output_dir=tmp_path)


@pytest.mark.parametrize(("args", "needle"), [
    (["--env", "tests.rollout.agents.scripted:judge", "--rm-type", "math"], "remove --rm-type"),
    (["--max-turns", "2"], "only applies to --env"),
    (["--eval-episodes", "2"], "only applies to --env"),
    (["--env", "nosuchmodule_xyz:make"], "--env nosuchmodule_xyz:make"),
])
def test_bad_eval_flags_are_one_line(tiny, tmp_path, args, needle):
    tok, model = tiny
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    code, out, err = _call(["eval", str(tmp_path / "ckpt"), *args])
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert needle in err, err
