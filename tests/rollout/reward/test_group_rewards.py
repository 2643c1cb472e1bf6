"""``--group-rm``: the reward function sees one whole group per call (relax/rollout/reward/group_rewards.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from relax.config.sections import DataSection, RewardsSection, RolloutSection
from relax.errors import InputError, RewardError
from relax.rollout.reward.group_rewards import by_prompt_runs, group_spans, score_groups
from relax.rollout.reward.scoring import Scorer

PROMPTS = ["a"] * 3 + ["b"] * 3 + ["c"] * 3
RESPONSES = ["x", "xxx", "xx", "y", "yy", "yyy", "zz", "z", "zzz"]
LABELS = [None] * 9
GROUPS = [0, 0, 0, 1, 1, 1, 2, 2, 2]


def rank_in_group(prompts, responses, labels):
    """A relative judgement: 1 for the longest response of the group, 0 for the shortest."""
    order = sorted(range(len(responses)), key=lambda i: len(responses[i]))
    out = [0.0] * len(responses)
    for rank, i in enumerate(order):
        out[i] = rank / (len(responses) - 1)
    return out


def test_each_call_gets_exactly_one_group_and_its_rewards_land_on_its_members():
    calls = []

    def fn(prompts, responses, labels):
        calls.append(list(prompts))
        return rank_in_group(prompts, responses, labels)

    values, failures = score_groups(fn, PROMPTS, RESPONSES, LABELS, GROUPS, name="fn")
    assert calls == [["a"] * 3, ["b"] * 3, ["c"] * 3] and failures == []
    assert values == [0.0, 1.0, 0.5, 0.0, 0.5, 1.0, 0.5, 0.0, 1.0]


def test_groups_need_not_be_contiguous():
    assert group_spans([1, 0, 1, 0]) == [[0, 2], [1, 3]]


@pytest.mark.parametrize("returned,what", [([1.0, 2.0], "returned 2 values for 3 samples"),
                                           ("abc", "must return a list of 3 real numbers")])
def test_a_wrong_count_is_bad_input_naming_the_flag_whatever_the_policy(returned, what):
    for policy in ("raise", "zero"):
        with pytest.raises(InputError) as caught:
            score_groups(lambda p, r, y: returned, PROMPTS, RESPONSES, LABELS, GROUPS,
                         name="--custom-rm-path m:f", policy=policy)
        message = str(caught.value)
        assert message.startswith("--group-rm: reward function --custom-rm-path m:f ")
        assert what in message and "one reward per member" in message and "\n" not in message


def test_a_group_that_raises_or_is_nan_scores_zero_or_stops_the_run():
    def fn(prompts, responses, labels):
        if prompts[0] == "b":
            raise ValueError("judge\nunavailable")
        return [float("nan")] * 3 if prompts[0] == "c" else [1.0] * 3

    values, failures = score_groups(fn, PROMPTS, RESPONSES, LABELS, GROUPS, name="fn",
                                    index_base=10, policy="zero")
    assert values == [1.0] * 3 + [0.0] * 6 and len(failures) == 6
    assert failures[0] == ("--group-rm reward function fn raised on the group of samples "
                           "13..15: ValueError: judge unavailable [sample 13]")
    assert "returned nan in the group of samples 16..18" in failures[3]
    with pytest.raises(RewardError, match="raised on the group of samples 3..5"):
        score_groups(fn, PROMPTS, RESPONSES, LABELS, GROUPS, name="fn")


def test_a_group_reward_beyond_float32_is_the_groups_failure():
    def fn(prompts, responses, labels):
        return [1.0, 1e39, 1.0] if prompts[0] == "b" else [1.0] * 3  # 1e39: inf in float32

    values, failures = score_groups(fn, PROMPTS, RESPONSES, LABELS, GROUPS, name="fn",
                                    policy="zero")
    assert values == [1.0] * 3 + [0.0] * 3 + [1.0] * 3 and len(failures) == 3
    assert "returned 1e+39, beyond the float32 range of rewards" in failures[0]
    with pytest.raises(RewardError, match="beyond the float32 range .* samples 3..5"):
        score_groups(fn, PROMPTS, RESPONSES, LABELS, GROUPS, name="fn")


def test_a_group_has_its_members_times_the_per_sample_limit():
    def slow(prompts, responses, labels):
        time.sleep(0.3)
        return [0.0] * len(prompts)

    with pytest.raises(RewardError, match=r"did not return within 0.03 s for the group of "
                       r"samples 0..2 \(--reward-timeout 0.01 s per sample\)"):
        score_groups(slow, PROMPTS, RESPONSES, LABELS, GROUPS, name="slow", timeout=0.01)


def test_the_scorer_calls_the_function_per_group(tmp_path):
    path = tmp_path / "judge.py"
    path.write_text("def judge(prompts, responses, labels):\n"
                    "    assert len(set(prompts)) == 1\n"
                    "    best = max(len(r) for r in responses)\n"
                    "    return [float(len(r) == best) for r in responses]\n")
    rollout = RolloutSection(data=DataSection(prompt_data="data.jsonl"),
                             rewards=RewardsSection(custom_rm_path=f"{path}:judge", group_rm=True))
    ctx = SimpleNamespace(rank=0, world_size=1, group=None, device=torch.device("cpu"))
    tracker = SimpleNamespace(add_sum=lambda name, value: None)
    scorer = Scorer(rollout, ctx, builtin_task=None, post_process_path=None)
    got = scorer.score(PROMPTS, RESPONSES, LABELS, torch.tensor(GROUPS), tracker=tracker)
    assert got.tolist() == [0, 1, 0, 0, 0, 1, 0, 0, 1]


def test_evaluation_calls_a_group_function_once_per_prompts_samples():
    calls = []

    def fn(prompts, responses, labels):
        calls.append(len(prompts))
        return rank_in_group(prompts, responses, labels)

    grouped = by_prompt_runs(fn, "fn")
    assert grouped(PROMPTS, RESPONSES, LABELS) == [0.0, 1.0, 0.5, 0.0, 0.5, 1.0, 0.5, 0.0, 1.0]
    assert calls == [3, 3, 3]
    with pytest.raises(RewardError, match="returned 1 values for 3 samples"):
        by_prompt_runs(lambda p, r, y: [0.0], "fn")(PROMPTS, RESPONSES, LABELS)
