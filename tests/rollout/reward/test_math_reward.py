"""--rm-type math: answer extraction, label forms, numeric and symbolic equality."""

import pytest

from relax.rollout.reward.math_reward import (
    answers_equal,
    extract_answer,
    last_boxed,
    math_reward,
    parse_label,
)


@pytest.mark.parametrize(
    "response,expected",
    [
        ("so the answer is \\boxed{72}.", "72"),
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the LAST box
        ("nested \\boxed{\\sqrt{x^{2}}} end", "\\sqrt{x^{2}}"),
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,000\nextra text", "1,000"),
        ("a \\boxed{3} and later #### 4", "3"),  # a box wins over ####
        ("no final answer here: 42", None),
        ("cut off \\boxed{12", None),  # unbalanced box: no answer
        ("", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "label,expected",
    [
        (72, "72"),
        ("72", "72"),
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
        ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        (0.5, "0.5"),
    ],
)
def test_parse_label(label, expected):
    assert parse_label(label) == expected


def test_parse_label_rejects_none():
    with pytest.raises(ValueError):
        parse_label(None)


@pytest.mark.parametrize(
    "gold,answer,equal",
    [
        ("72", "72", True),
        ("72", "72.0", True),
        ("1000", "1,000", True),
        ("0.5", "\\frac{1}{2}", True),
        ("3/4", "0.75", True),
        ("72", "\\$72", True),
        ("72", "73", False),
        ("1,000", "100", False),
        ("x^2+2x", "2x+x^2", True),  # symbolic (math-verify)
        ("\\sqrt{2}", "2^{1/2}", True),
        ("\\sqrt{2}", "2", False),
    ],
)
def test_answers_equal(gold, answer, equal):
    assert answers_equal(gold, answer) is equal


def test_math_reward_batch():
    responses = ["... \\boxed{72}", "#### 71", "72", "\\boxed{\\frac{144}{2}}"]
    labels = ["#### 72", 72, 72, "72"]
    assert math_reward(["q"] * 4, responses, labels) == [1.0, 0.0, 0.0, 1.0]


def test_last_boxed_fbox():
    assert last_boxed("\\fbox{5}") == "5"
