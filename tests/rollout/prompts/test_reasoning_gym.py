"""reasoning-gym as a prompt source and reward (relax/rollout/prompts/reasoning_gym_source.py): spec
parsing and its one-line errors, generation, answer extraction, the verifier reward, overlap
between training and evaluation prompts. Small generated sizes; no model is downloaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import reasoning_gym  # noqa: F401  (the rl extra; make installs it, so it is never skipped)

from relax.config.sections import DataSection, RewardsSection, RolloutSection  # noqa: E402
from relax.errors import InputError  # noqa: E402
from relax.rollout.prompts import reasoning_gym_source as gym  # noqa: E402
from relax.rollout.prompts.data import PromptSample, load_source, report_overlap  # noqa: E402

ARITH = ("reasoning-gym:basic_arithmetic?size=12&min_terms=2&max_terms=2&min_digits=1"
         "&max_digits=2&operators=+,-&allow_parentheses=false&allow_negation=false")


def cfg(custom_rm_path=None, **data):
    """The rollout section load_source reads."""
    return RolloutSection(data=DataSection(**data),
                          rewards=RewardsSection(custom_rm_path=custom_rm_path))


def test_spec_options_take_the_config_field_types():
    spec = gym.parse_spec(ARITH, "--prompt-data")
    assert spec.name == "basic_arithmetic"
    assert spec.options["operators"] == ("+", "-")  # '+' is not a space here
    assert spec.options["allow_parentheses"] is False
    assert spec.options["size"] == 12 and spec.options["min_digits"] == 1
    assert spec.options["seed"] == gym.DEFAULT_SEEDS["train"]
    ev = gym.parse_spec(ARITH, "--eval-prompt-data x", role="eval")
    assert ev.options["seed"] == gym.DEFAULT_SEEDS["eval"]
    # train and eval seed ranges are disjoint by default (item i is Random(seed + i))
    assert not set(spec.seed_range) & set(ev.seed_range)
    assert gym.parse_spec("reasoning-gym:chain_sum?seed=7", "f").options["seed"] == 7


@pytest.mark.parametrize("spec, words", [
    ("reasoning-gym:basic_arith", ["unknown reasoning-gym dataset", "basic_arithmetic"]),
    ("reasoning-gym:", ["unknown reasoning-gym dataset"]),
    ("reasoning-gym:chain_sum?size=abc", ["size='abc'", "expected an integer"]),
    ("reasoning-gym:chain_sum?size=0", ["size must be an integer in [1, 100000]"]),
    ("reasoning-gym:chain_sum?colour=red", ["has no option 'colour'", "min_terms"]),
    ("reasoning-gym:chain_sum?size", ["key=value"]),
    ("reasoning-gym:chain_sum?size=3&size=4", ["given twice"]),
    ("reasoning-gym:chain_sum?allow_negation=maybe", ["expected true or false"]),
    ("reasoning-gym:chain_sum?min_terms=5&max_terms=2", ["rejects these options"]),
])
def test_bad_specs_are_one_line_naming_the_flag(spec, words):
    with pytest.raises(InputError) as info:
        gym.parse_spec(spec, "--prompt-data")
    message = str(info.value)
    assert message.startswith(f"--prompt-data {spec}: ") and "\n" not in message
    for word in words:
        assert word in message


def test_samples_are_the_dataset_items_with_the_format_system_prompt():
    samples = load_source(ARITH, "--prompt-data", cfg(), role="train")
    assert len(samples) == 12
    s = samples[0]
    assert s.prompt[0]["role"] == "system" and "<answer>" in s.prompt[0]["content"]
    assert s.prompt[1] == {"role": "user", "content": s.label["question"]}
    assert s.source == f"{ARITH}#0"
    plain = load_source(ARITH, "--prompt-data", cfg(reasoning_gym_answer="last_number"),
                        role="train")
    assert plain[0].prompt == s.label["question"]  # the model's own default system message
    # --system-prompt replaces the format's: the formatter adds it, the sample does not
    own = load_source(ARITH, "--prompt-data", cfg(system_prompt="Be brief."), role="train")
    assert own[0].prompt == s.label["question"]
    boxed = load_source(ARITH, "--prompt-data", cfg(reasoning_gym_answer="boxed"), role="train")
    assert "\\boxed" in boxed[0].prompt[0]["content"]
    # deterministic: the same spec gives the same questions
    again = load_source(ARITH, "--prompt-data", cfg(), role="train")
    assert [a.label["question"] for a in again] == [b.label["question"] for b in samples]


@pytest.mark.parametrize("text, expected", [
    ("The sum is 12.", "12"),
    ("3 + 4 = 7", "7"),
    ("It is -5, I think", "-5"),
    ("1,234 apples", "1234"),
    ("x = 2.50", "2.50"),
    ("no digits", None),
])
def test_last_number(text, expected):
    assert gym.last_number(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{12}.", "12"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{unclosed", None),
    ("nothing", None),
])
def test_last_boxed(text, expected):
    assert gym.last_boxed(text) == expected


def test_reward_is_the_dataset_verifier_on_the_extracted_answer():
    samples = load_source(ARITH, "--prompt-data", cfg(), role="train")
    labels = [s.label for s in samples[:4]]
    answers = [item["answer"] for item in labels]
    wrong = [str(int(a) + 1) for a in answers]
    prompts = ["p"] * 4
    tags = gym.make_reward("tags")
    assert tags(prompts, [f"thinking\n<answer>{a}</answer>" for a in answers], labels) == [1.0] * 4
    assert tags(prompts, [f"<answer>{a}</answer>" for a in wrong], labels) == [0.0] * 4
    assert tags(prompts, [f"The answer is {a}" for a in answers], labels) == [0.0] * 4  # no tags
    last = gym.make_reward("last_number")
    assert last(prompts, [f"The answer is {a}." for a in answers], labels) == [1.0] * 4
    assert last(prompts, [f"{a} ... no, {w}" for a, w in zip(answers, wrong, strict=True)], labels) == [0.0] * 4
    boxed = gym.make_reward("boxed")
    assert boxed(prompts, [f"\\boxed{{{a}}}" for a in answers], labels) == [1.0] * 4
    with pytest.raises(ValueError):
        gym.make_reward("first_word")


def test_a_dataset_not_loaded_in_this_process_still_scores():
    from reasoning_gym import create_dataset

    item = create_dataset("chain_sum", size=1, seed=3)[0]
    gym._LOADED.pop("chain_sum", None)
    assert gym.make_reward("tags")(["p"], [f"<answer>{item['answer']}</answer>"], [item]) == [1.0]


def test_overlap_between_training_and_evaluation_prompts_is_reported():
    train = [PromptSample(q, None, f"t#{i}") for i, q in enumerate(["1+1", "2+2", "3+3"])]
    sets = [SimpleNamespace(name="a", prompts=["2+2", "9+9", "3+3"]),
            SimpleNamespace(name="b", prompts=["7+7"])]
    lines = []
    assert report_overlap(train, sets, report=lines.append) == {"a": 2, "b": 0}
    assert len(lines) == 1 and "2 of 3 prompts of evaluation set 'a'" in lines[0]


def test_disjoint_seeds_can_still_repeat_questions_of_a_small_space():
    """One-digit sums have ~100 distinct questions: the report is what keeps this honest."""
    tiny = ("reasoning-gym:basic_arithmetic?size=300&min_terms=2&max_terms=2&min_digits=1"
            "&max_digits=1&operators=+&allow_parentheses=false&allow_negation=false")
    c = cfg(reasoning_gym_answer="last_number")
    train = load_source(tiny, "--prompt-data", c, role="train")
    ev = load_source(tiny.replace("size=300", "size=50"), "--eval-prompt-data e", c, role="eval")
    counts = report_overlap(train, [SimpleNamespace(name="e", prompts=[s.prompt for s in ev])],
                            report=lambda line: None)
    assert counts["e"] > 0


def test_missing_package_is_one_line(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gym(name, *args, **kwargs):
        if name.startswith("reasoning_gym"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gym)
    with pytest.raises(InputError, match="reasoning-gym is not installed"):
        gym.parse_spec(ARITH, "--prompt-data")
