"""evaluate() on the built-in tiny model: pass@k and mean reward agree with the rewards the
reward function actually returned; greedy decoding, thresholds, chunking, two Gloo ranks."""

from __future__ import annotations

import threading

import pytest

from relax.errors import RewardError
from relax.eval.evaluate import evaluate
from tests.distributed_utils import run_distributed
from tests.eval.conftest import copy_prompts
from tests.eval.helpers import eval_sampling
from tests.eval.test_passk import brute_force


class Recorder:
    """A reward that passes about half the responses and remembers what it returned."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, responses, labels):
        values = [1.0 if r and ord(r[0]) % 2 == 0 else 0.0 for r in responses]
        self.calls += list(zip(prompts, labels, responses, values, strict=True))
        return values


def test_metrics_equal_an_independent_count_of_the_returned_rewards(tiny):
    model, tok = tiny
    prompts, labels = copy_prompts(10)
    reward = Recorder()
    n = 4
    out = evaluate(model, tok, prompts, labels, reward,
                   eval_sampling(n_samples=n, temperature=1.0, max_response_len=6, batch_size=8,
                                seed=11), name="copy")
    assert sorted(out) == sorted(["eval/copy/pass@1", "eval/copy/pass@2", "eval/copy/pass@4",
                                  "eval/copy/mean_reward", "eval/copy/response_length",
                                  "eval/copy/truncated"])
    # every prompt was sampled n times, with its own label, in order
    assert [(p, y) for p, y, _, _ in reward.calls] == [
        (p, y) for p, y in zip(prompts, labels, strict=True) for _ in range(n)]
    values = [v for *_, v in reward.calls]
    passed = [int(sum(values[i * n:(i + 1) * n])) for i in range(len(prompts))]
    assert 0 < sum(passed) < len(values)  # the check below sees both outcomes
    for k in (1, 2, 4):
        expected = sum(brute_force(n, c, k) for c in passed) / len(prompts)
        assert out[f"eval/copy/pass@{k}"] == pytest.approx(expected, abs=1e-12)
    assert out["eval/copy/mean_reward"] == pytest.approx(sum(values) / len(values))
    assert 0 < out["eval/copy/response_length"] <= 6
    assert 0 <= out["eval/copy/truncated"] <= 1
    assert model.training  # the caller's mode is restored


def test_greedy_samples_agree_and_chunking_does_not_change_results(tiny):
    model, tok = tiny
    from tests.eval.dist_workers import parity_reward

    prompts, labels = copy_prompts(6, seed=1)
    runs = [evaluate(model, tok, prompts, labels, parity_reward,
                     eval_sampling(n_samples=2, temperature=0.0, max_response_len=6,
                                  batch_size=b), name="g")
            for b in (2, 64)]
    assert runs[0] == pytest.approx(runs[1])
    assert 0 < runs[0]["eval/g/pass@1"] < 1
    # two greedy samples of one prompt are the same response: both pass or both fail
    assert runs[0]["eval/g/pass@1"] == pytest.approx(runs[0]["eval/g/pass@2"])


def test_threshold_and_bad_input(tiny):
    model, tok = tiny
    prompts, labels = copy_prompts(3)
    always = lambda p, r, y: [1.0] * len(r)  # noqa: E731
    sampling = eval_sampling(n_samples=2, max_response_len=3)
    out = evaluate(model, tok, prompts, labels, always, sampling, name="a")
    assert out["eval/a/pass@1"] == out["eval/a/pass@2"] == out["eval/a/mean_reward"] == 1.0
    strict = eval_sampling(n_samples=2, max_response_len=3, pass_threshold=1.5)
    out = evaluate(model, tok, prompts, labels, always, strict, name="a")
    assert out["eval/a/pass@2"] == 0.0 and out["eval/a/mean_reward"] == 1.0
    with pytest.raises(ValueError, match="3 prompts but 2 labels"):
        evaluate(model, tok, prompts, labels[:2], always, sampling)
    with pytest.raises(ValueError, match="no prompts"):
        evaluate(model, tok, [], [], always, sampling)


def test_the_reward_has_the_runs_time_limit(tiny):
    model, tok = tiny
    prompts, labels = copy_prompts(2)
    release = threading.Event()
    try:
        with pytest.raises(RewardError, match=r"reward function r timed out after 0.05 s "
                           r"\(--reward-timeout\) on sample 0"):
            evaluate(model, tok, prompts, labels, lambda p, r, y: release.wait(30),
                     eval_sampling(n_samples=1, max_response_len=2), reward_name="r",
                     reward_timeout=0.05)
    finally:
        release.set()  # the abandoned calls return and free their workers


@pytest.mark.subprocess
def test_two_ranks_equal_one_process(tiny):
    """Greedy decoding is deterministic, so sharding the prompts over two Gloo ranks and
    all-reducing must reproduce the single-process numbers exactly; 5 prompts leave the
    ranks uneven (with ``sync_group`` the short rank pads so both decode in lockstep)."""
    from tests.eval.dist_workers import evaluate_on_rank, parity_reward

    model, tok = tiny
    prompts, labels = copy_prompts(5)
    single = evaluate(model, tok, prompts, labels, parity_reward,
                      eval_sampling(n_samples=2, temperature=0.0, max_response_len=6,
                                   batch_size=4), name="copy")
    assert 0 < single["eval/copy/pass@1"] < 1  # a count that sharding could get wrong
    ranks = run_distributed(evaluate_on_rank, 2, 5, timeout=120)
    for free, synced in ranks:
        assert free == pytest.approx(single, abs=1e-12)
        assert synced == pytest.approx(single, abs=1e-12)
