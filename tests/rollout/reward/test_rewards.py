"""Reward functions: loading by path, validation of what they return, built-in tasks."""

import random

import pytest

from relax.errors import InputError, RewardError
from relax.rollout.prompts.tasks import TASKS, char_agreement, get_task
from relax.rollout.reward.rewards import build_reward_fn, load_function, score


def _write(tmp_path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return str(path)


def test_load_file_function(tmp_path):
    path = _write(tmp_path, "def f(prompts, responses, labels):\n    return [1.0] * len(prompts)\n")
    fn, name = build_reward_fn(f"{path}:f", None)
    assert fn(["a", "b"], ["x", "y"], [None, None]) == [1.0, 1.0] and name.endswith(":f")


def test_load_module_function():
    fn = load_function("relax.rollout.reward.math_reward:math_reward", "--custom-rm-path")
    assert fn(["q"], ["\\boxed{2}"], ["2"]) == [1.0]


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("no_colon", "expected 'module:function'"),
        ("relax.rollout.reward.math_reward:nope", "has no function 'nope'"),
        ("surely_missing_module_xyz:f", "cannot import"),
        ("/nonexistent/r.py:f", "does not exist"),
    ],
)
def test_load_errors_name_the_flag(spec, needle):
    with pytest.raises(InputError, match=needle) as e:
        load_function(spec, "--custom-rm-path")
    assert str(e.value).startswith("--custom-rm-path")


def _bad(kind):
    def fn(prompts, responses, labels):
        if kind == "raise" and any(r == "boom" for r in responses):
            raise ZeroDivisionError("division by zero")
        if kind == "count":
            return [0.0] * (len(prompts) + 1)
        if kind == "nan":
            return [float("nan") if r == "boom" else 1.0 for r in responses]
        if kind == "inf":
            return [float("inf") if r == "boom" else 1.0 for r in responses]
        if kind == "beyond-float32":  # finite in float64, -inf as the float32 reward tensor
            return [-1e300 if r == "boom" else 1.0 for r in responses]
        return [1.0] * len(prompts)

    return fn


@pytest.mark.parametrize("kind", ["raise", "nan", "inf", "beyond-float32"])
def test_bad_reward_names_sample_and_prompt(kind):
    prompts = ["What is 1+1?", "A long question about apples and oranges " * 3, "third"]
    with pytest.raises(RewardError) as e:
        score(_bad(kind), prompts, ["ok", "boom", "ok"], [1, 2, 3], name="r", index_base=10)
    msg = str(e.value)
    assert "sample 11" in msg and "A long question about apples" in msg and "\n" not in msg
    if kind == "beyond-float32":
        assert "returned -1e+300, beyond the float32 range of rewards" in msg


def test_the_reward_bound_is_float32s_largest_value():
    import torch

    from relax.rollout.reward.rewards import bad_reward

    biggest = float(torch.finfo(torch.float32).max)
    assert bad_reward(biggest) is None and bad_reward(-biggest) is None
    assert bad_reward(2 * biggest) is not None and bad_reward(-1e300) is not None
    assert torch.isinf(torch.tensor([-1e300], dtype=torch.float32)).all()  # why it is refused


def test_wrong_count_is_an_error():
    with pytest.raises(RewardError, match="returned 4 values for 3 samples"):
        score(_bad("count"), ["a", "b", "c"], ["x", "y", "z"], [1, 2, 3])


def test_non_numbers_are_an_error():
    with pytest.raises(RewardError, match="list of 1 real numbers, got str"):
        score(lambda p, r, y: ["high"] * len(p), ["a"], ["x"], [1])


def test_char_agreement_partial_credit():
    assert char_agreement("abc", "abc") == 1.0
    assert char_agreement("abc", "abd") == pytest.approx(2 / 3)
    assert char_agreement("abc", "abcabc") == pytest.approx(0.5)  # extra characters cost
    assert char_agreement("abc", "") == 0.0


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_reward_is_verifiable(name):
    task = get_task(name)
    rng = random.Random(0)
    prompts, labels = zip(*(task.sample(rng) for _ in range(20)), strict=True)
    assert task.reward(list(prompts), list(labels), list(labels)) == [1.0] * 20
    wrong = task.reward(list(prompts), ["#"] * 20, list(labels))
    assert all(0.0 <= w < 1.0 for w in wrong)


def test_addition_aligns_units_digit():
    task = get_task("addition")
    assert task.reward(["12+7="], ["18"], ["19"]) == [0.5]
    assert task.reward(["12+7="], ["9"], ["19"]) == [0.5]


def test_unknown_task():
    with pytest.raises(ValueError, match="valid: copy, addition"):
        get_task("sorting")
