"""reasoning-gym datasets as prompt sources, scored by their own verifiers.

    --prompt-data reasoning-gym:basic_arithmetic?size=2000&min_digits=1&max_digits=2
    --eval-prompt-data arith reasoning-gym:basic_arithmetic?size=200&min_digits=1&max_digits=2

``reasoning-gym:NAME`` names one of the package's registered datasets; ``?key=value&...`` sets
the fields of its configuration dataclass (``size`` and ``seed`` among them; values are
converted to the field's type, a sequence field takes a comma-separated list). The dataset
item ``i`` of seed ``S`` is generated from ``Random(S + i)`` (the package's convention), so
training and evaluation draw from disjoint seed ranges by default: training from
``seed=0``, evaluation sets from ``seed=1000000000`` (``DEFAULT_SEEDS``). Duplicate questions
between the two are reported by the trainer (``relax.rollout.prompts.data.report_overlap``): small
problem spaces repeat questions whatever the seed.

Reward: without ``--rm-type``/``--custom-rm-path`` a sample scores
``dataset.score_answer(extract(response), entry)``: the dataset's own verifier on the answer
extracted as ``--reasoning-gym-answer`` says:

- ``tags`` (default; reasoning-gym's own convention): the last ``<answer>...</answer>`` of the
  response, with the package's ``SYSTEM_PROMPTS["default"]`` as the system message;
- ``last_number``: the last number in the response (thousands commas removed), no system
  message added (for small chat models that never write the tags);
- ``boxed``: the content of the last ``\\boxed{...}``, with a system message asking for it.

``--system-prompt`` replaces the system message in every mode. The package is imported only
when such a source is used (the ``rl`` extra, ``pip install -e '.[rl]'`` in a clone, which
``make`` installs).
"""

from __future__ import annotations

import re

from relax.config.gym_spec import (  # noqa: F401  (the spec names, re-exported for callers)
    ANSWER_FORMATS,
    DEFAULT_SEEDS,
    PREFIX,
    GymSpec,
    gym_package,
    is_reasoning_gym,
    parse_spec,
)
from relax.errors import InputError
from relax.rollout.prompts.samples import PromptSample

BOXED_SYSTEM_PROMPT = ("Solve the problem step by step, then give the final answer as "
                       "\\boxed{answer}.")


# Datasets loaded by this process, by name: their score_answer is the reward of their entries.
_LOADED: dict[str, object] = {}


def load_samples(spec: GymSpec, flag: str, *, answer_format: str,
                 system_prompt: str | None):
    """The dataset's items as :class:`relax.rollout.prompts.data.PromptSample` (label = the item).

    The prompt is the question, preceded by the answer format's system message unless
    ``system_prompt`` (``--system-prompt``) is given, which the formatter then adds itself.
    """
    reasoning_gym, _ = gym_package(flag)
    try:
        dataset = reasoning_gym.create_dataset(spec.name, **spec.options)
        items = [dataset[i] for i in range(len(dataset))]
    except Exception as e:
        raise InputError(f"{flag} {spec.text}: generating the dataset failed: "
                         f"{type(e).__name__}: {e}".splitlines()[0]) from e
    _LOADED[spec.name] = dataset
    system = None if system_prompt else default_system_prompt(answer_format)
    samples = []
    for i, item in enumerate(items):
        question = item["question"]
        prompt = ([{"role": "system", "content": system}, {"role": "user", "content": question}]
                  if system else question)
        samples.append(PromptSample(prompt, item, f"{spec.text}#{i}"))
    return samples


def default_system_prompt(answer_format: str) -> str | None:
    if answer_format == "tags":
        from reasoning_gym.utils import SYSTEM_PROMPTS

        return SYSTEM_PROMPTS["default"]
    if answer_format == "boxed":
        return BOXED_SYSTEM_PROMPT
    return None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``1,234`` -> ``1234``, trailing ``.`` dropped)."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def extract_answer(response: str, answer_format: str) -> str | None:
    if answer_format == "tags":
        from reasoning_gym.utils import extract_answer as from_tags

        return from_tags(response)
    if answer_format == "boxed":
        return last_boxed(response)
    return last_number(response)


def _scorer(name: str):
    if name not in _LOADED:
        import reasoning_gym

        _LOADED[name] = reasoning_gym.create_dataset(name, size=1, seed=0)
    return _LOADED[name].score_answer


def make_reward(answer_format: str):
    """``reward(prompts, responses, labels)``: each label is a reasoning-gym item."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer format {answer_format!r}; valid: {', '.join(ANSWER_FORMATS)}")

    def reasoning_gym_reward(prompts, responses, labels):
        out = []
        for response, item in zip(responses, labels, strict=True):
            source = item.get("metadata", {}).get("source_dataset")
            answer = extract_answer(response, answer_format)
            out.append(float(_scorer(source)(answer=answer, entry=item)))
        return out

    return reasoning_gym_reward
