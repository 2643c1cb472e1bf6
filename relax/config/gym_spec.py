"""``reasoning-gym:NAME?key=value&...`` specs: recognised, parsed and checked against the
package's dataset registry without generating anything (relax/rollout/prompts/reasoning_gym_source.py
loads the datasets and scores them).

    spec = parse_spec("reasoning-gym:basic_arithmetic?size=200&min_digits=1", "--prompt-data")
    spec.name, spec.options  # "basic_arithmetic", {"size": 200, "min_digits": 1, "seed": 0}

Validation runs before torch is imported, so this module imports neither torch nor anything
of relax.rollout; the reasoning-gym package is imported only when a spec is parsed.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from urllib.parse import unquote

from relax.errors import InputError

PREFIX = "reasoning-gym:"
ANSWER_FORMATS = ("tags", "last_number", "boxed")
DEFAULT_SEEDS = {"train": 0, "eval": 1_000_000_000}
# Items are generated eagerly at start-up (basic_arithmetic: 0.44 ms each on one core, so the
# bound costs under a minute); a size of 10**8 would run for hours and ignore a first SIGTERM.
MAX_SIZE = 100_000


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


def gym_package(flag: str):
    """``(reasoning_gym, its DATASETS registry)``, or an InputError naming ``flag``."""
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise InputError(f"{flag}: reasoning-gym is not installed; make install in a "
                         "clone, or pip install reasoning-gym==0.1.25") from None
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
    name, _, query = spec[len(PREFIX):].partition("?")
    config_cls = _dataset_config(name, spec, flag)
    options = _options(_query_pairs(query, spec, flag), config_cls, name, spec, flag)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    options.setdefault("seed", DEFAULT_SEEDS[role])
    options.setdefault("size", fields["size"].default if "size" in fields else 500)
    if not isinstance(options["size"], int) or not 1 <= options["size"] <= MAX_SIZE:
        raise InputError(f"{flag} {spec}: size must be an integer in [1, {MAX_SIZE}] (every "
                         "item is generated when the run starts, up to ~0.5 ms each); for "
                         "more distinct problems give another seed=")
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


def _dataset_config(name: str, spec: str, flag: str):
    """The configuration dataclass of the registered dataset ``name``."""
    _, datasets = gym_package(flag)
    if name not in datasets:
        close = [n for n in sorted(datasets) if name and (name in n or n in name)][:5]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise InputError(f"{flag} {spec}: unknown reasoning-gym dataset {name!r}{hint} "
                         f"({len(datasets)} datasets, e.g. basic_arithmetic, chain_sum, "
                         "gsm_symbolic, leg_counting)")
    return datasets[name][1]


def _query_pairs(query: str, spec: str, flag: str) -> list[tuple[str, str]]:
    """``key=value&...`` as unquoted (key, raw value) pairs, in order."""
    pairs = []
    for part in query.split("&") if query else ():
        key, eq, raw = part.partition("=")
        if not eq or not key:
            raise InputError(f"{flag} {spec}: options must be key=value pairs joined by '&', "
                             f"got {part!r}")
        # unquote, not unquote_plus: '+' is an operator here (operators=+,-), not a space
        pairs.append((unquote(key), unquote(raw)))
    return pairs


def _options(pairs, config_cls, name: str, spec: str, flag: str) -> dict:
    """The pairs converted to the types of ``config_cls``'s fields (each key once)."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # an annotation that does not resolve: fall back to the defaults' types
        hints = {}
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
    return options
