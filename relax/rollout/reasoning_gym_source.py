"""reasoning-gym datasets as prompt sources, scored by their own verifiers.

    --prompt-data reasoning-gym:basic_arithmetic?size=2000&min_digits=1&max_digits=2
    --eval-prompt-data arith reasoning-gym:basic_arithmetic?size=200&min_digits=1&max_digits=2

``reasoning-gym:NAME`` names one of the package's registered datasets; ``?key=value&...`` sets
the fields of its configuration dataclass (``size`` and ``seed`` among them; values are
converted to the field's type, a sequence field takes a comma-separated list). The dataset
item ``i`` of seed ``S`` is generated from ``Random(S + i)`` (the package's convention), so
training and evaluation draw from disjoint seed ranges by default: training from
``seed=0``, evaluation sets from ``seed=1000000000`` (``DEFAULT_SEEDS``). Duplicate questions
between the two are reported by the trainer (``relax.rollout.data.report_overlap``): small
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

import dataclasses
import re
import typing
from dataclasses import dataclass
from urllib.parse import unquote

from relax.errors import InputError
from relax.rollout.samples import PromptSample

PREFIX = "reasoning-gym:"
ANSWER_FORMATS = ("tags", "last_number", "boxed")
DEFAULT_SEEDS = {"train": 0, "eval": 1_000_000_000}
BOXED_SYSTEM_PROMPT = ("Solve the problem step by step, then give the final answer as "
                       "\\boxed{answer}.")


def is_reasoning_gym(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


@dataclass(frozen=True)
class GymSpec:
    """A parsed ``reasoning-gym:NAME?options`` (options already converted to field types)."""

    text: str
    name: str
    options: dict  # includes size and seed

    @property
    def seed_range(self) -> range:
        return range(self.options["seed"], self.options["seed"] + self.options["size"])


def _package(flag: str):
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise InputError(f"{flag}: reasoning-gym is not installed; pip install -e '.[rl]' "
                         "in a clone of Relax (make installs it)") from None
    return reasoning_gym, DATASETS


def _convert(raw: str, default, hint):
    """``raw`` as the type of a config field (from its default, else its annotation)."""
    def one(text: str, kind):
        if kind is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got {text!r}")
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                raise ValueError(f"expected {'an integer' if kind is int else 'a number'}, "
                                 f"got {text!r}") from None
        return text

    if isinstance(default, (list, tuple)):
        kind = type(default[0]) if default else str
        values = [one(t, kind) for t in raw.split(",") if t != ""]
        if not values:
            raise ValueError("expected a comma-separated list")
        return type(default)(values)
    if default is not None and not isinstance(default, str):
        return one(raw, type(default))
    text_hint = str(hint)
    if default is None and raw.lower() == "none":
        return None
    for kind in (bool, int, float):  # Optional[int] and the like: the annotation says which
        if re.search(rf"\b{kind.__name__}\b", text_hint):
            return one(raw, kind)
    return raw


def parse_spec(spec: str, flag: str, *, role: str = "train") -> GymSpec:
    """Parse and validate ``reasoning-gym:NAME?key=value&...`` without generating anything.

    An unknown dataset, an unknown option, a value of the wrong type or one the dataset's own
    ``validate()`` refuses is an :class:`InputError` naming ``flag`` and what is valid.
    """
    body = spec[len(PREFIX):]
    name, _, query = body.partition("?")
    _, datasets = _package(flag)
    if name not in datasets:
        close = [n for n in sorted(datasets) if name and (name in n or n in name)][:5]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(f"{flag} {spec}: unknown reasoning-gym dataset {name!r}{hint} "
                         f"({len(datasets)} datasets, e.g. basic_arithmetic, chain_sum, "
                         "gsm_symbolic, leg_counting)")
    _, config_cls = datasets[name]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # an annotation that does not resolve: fall back to the defaults' types
        hints = {}
    pairs = []
    for part in query.split("&") if query else ():
        key, eq, raw = part.partition("=")
        if not eq or not key:
            raise InputError(f"{flag} {spec}: options must be key=value pairs joined by '&', "
                             f"got {part!r}")
        # unquote, not unquote_plus: '+' is an operator here (operators=+,-), not a space
        pairs.append((unquote(key), unquote(raw)))
    options = {}
    for key, raw in pairs:
        if key not in fields:
            raise InputError(f"{flag} {spec}: {name} has no option {key!r}; valid: "
                             f"{', '.join(fields)}")
        if key in options:
            raise InputError(f"{flag} {spec}: option {key!r} given twice")
        f = fields[key]
        default = f.default if f.default is not dataclasses.MISSING else None
        try:
            options[key] = _convert(raw, default, hints.get(key))
        except ValueError as e:
            raise InputError(f"{flag} {spec}: option {key}={raw!r}: {e}") from None
    options.setdefault("seed", DEFAULT_SEEDS[role])
    options.setdefault("size", fields["size"].default if "size" in fields else 500)
    if not isinstance(options["size"], int) or options["size"] < 1:
        raise InputError(f"{flag} {spec}: size must be an integer >= 1")
    if not isinstance(options["seed"], int):
        raise InputError(f"{flag} {spec}: seed must be an integer")
    try:
        config = config_cls(**options)
        if hasattr(config, "validate"):
            config.validate()
    except Exception as e:  # the package's own checks are assertions and ValueErrors
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"{flag} {spec}: {name} rejects these options: {reason}") from None
    return GymSpec(spec, name, options)


# Datasets loaded by this process, by name: their score_answer is the reward of their entries.
_LOADED: dict[str, object] = {}


def load_samples(spec: GymSpec, flag: str, *, answer_format: str,
                 system_prompt: str | None):
    """The dataset's items as :class:`relax.rollout.data.PromptSample` (label = the item).

    The prompt is the question, preceded by the answer format's system message unless
    ``system_prompt`` (``--system-prompt``) is given, which the formatter then adds itself.
    """
    reasoning_gym, _ = _package(flag)
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
