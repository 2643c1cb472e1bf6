"""Rewards: per-sample time limit, exceptions, NaN/Inf, the zero policy
(docs/reliability.md). A hanging reward is simulated by one that waits on an Event the test sets
afterwards, so no thread outlives the test."""

import math
import threading

import pytest

from relax.errors import RewardError
from relax.rollout.reward.rewards import score, score_with_errors
from tests.reliability.helpers import SMALL
from tests.trainer.helpers import make_config, read_metrics, write_reward

PROMPTS = ["first prompt", "second prompt", "the hanging one", "fourth"]
RESPONSES = ["a", "b", "c", "d"]


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()  # free the abandoned reward thread


def _reward(kind, release):
    def fn(prompts, responses, labels):
        out = []
        for p in prompts:
            if "hanging" in p and kind == "hang":
                release.wait(30)
            if "hanging" in p and kind == "raise":
                raise KeyError("service said 503")
            out.append(float("nan") if "hanging" in p and kind == "nan" else 1.0)
        return out

    return fn


@pytest.mark.parametrize("kind,needle", [
    ("hang", "timed out after 0.05 s (--reward-timeout) on sample 12 (prompt 'the hanging one')"),
    ("raise", "raised on sample 12 (prompt 'the hanging one'): KeyError: 'service said 503'"),
    ("nan", "returned nan for sample 12 (prompt 'the hanging one')"),
])
def test_raise_policy_names_the_sample(kind, needle, release):
    with pytest.raises(RewardError) as e:
        score(_reward(kind, release), PROMPTS, RESPONSES, [None] * 4, name="r", index_base=10,
              timeout=0.05)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["hang", "raise", "nan"])
def test_zero_policy_scores_0_and_reports_each_failure(kind, release):
    values, errors = score_with_errors(_reward(kind, release), PROMPTS, RESPONSES, [None] * 4,
                                       name="r", timeout=0.05, policy="zero")
    assert values == [1.0, 1.0, 0.0, 1.0]
    assert len(errors) == 1 and "sample 2 (prompt 'the hanging one')" in errors[0]


def test_slow_but_in_time_batch_is_not_a_timeout():
    # the batch may take timeout x samples: 4 samples of 0.02 s under a 0.05 s limit pass
    done = threading.Event()

    def slow(prompts, responses, labels):
        done.wait(0.02 * len(prompts))
        return [0.25] * len(prompts)

    assert score(slow, PROMPTS, RESPONSES, [None] * 4, timeout=0.05) == [0.25] * 4


def test_trainer_counts_reward_errors_under_the_zero_policy(tmp_path, capsys):
    reward = write_reward(tmp_path, "def f(p, r, l):\n"
                          "    return [float('inf') if i == 1 else 0.5 for i in range(len(p))]\n",
                          "inf_reward.py")
    from relax.trainer import train

    cfg = make_config(*SMALL, "--custom-rm-path", f"{reward}:f", "--num-rollout", "2",
                      "--reward-error-policy", "zero", tiny=False, output_dir=tmp_path / "run")
    assert train(cfg) == 0
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/reward_errors"] for r in rows] == [1.0, 1.0]
    assert all(math.isfinite(r["rollout/raw_reward"]) for r in rows)
    warnings = [x for x in capsys.readouterr().err.splitlines() if "scored 0" in x]
    assert len(warnings) == 2 and "returned inf for sample 1" in warnings[0]


def test_builtin_math_reward_runs_under_the_limit():
    from relax.rollout.reward.math_reward import math_reward

    values = score(math_reward, ["q", "q"], ["\\boxed{4}", "#### 5"], ["4", "4"], name="math",
                   timeout=5.0)
    assert values == [1.0, 0.0]
