"""The machinery of the configuration's sections: a field declared once (:func:`option`: its
flag, default, help, bound and :class:`Needs`), the tree walks the parser, validation, the JSON
file and the ``--config`` file loader share, and the one-line error of every rule
(:func:`reject`). The sections themselves, with their rules: relax/config/sections/.

The configuration is a tree of frozen dataclasses (torchtitan's JobConfig is the model)::

    cfg.algorithm.advantage_estimator          # --advantage-estimator
    cfg.rollout.sampling.rollout_temperature   # --rollout-temperature
    cfg.batches.n_samples_per_prompt           # --n-samples-per-prompt

A leaf field's flag is ``--`` + its *dest* (``option(flag=...)``, else the field's own name)
with ``-`` for ``_``: the Relax/Megatron flag names are the interface, and a field is named
exactly like its flag; the exceptions are listed in docs/configuration.md, each with its
reason. Lists become tuples, so a section is immutable all the way down. Nothing here imports
torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from relax.errors import ConfigError


@dataclass(frozen=True)
class Needs:
    """What a field needs to have any effect ("has no effect without X"): a field set while
    ``active(cfg)`` is false (``cfg`` the root configuration) is refused with ``reason`` (a
    string, or a function of ``cfg`` giving one).

    ``given``: how the field counts as set: ``"explicit"`` (the user gave the flag, on the
    command line or in a ``--config`` file with a value other than its default) or
    ``"changed"`` (its value differs from its default, whoever set it). ``commands``: the
    commands whose validation checks it (``relax eval`` shares sections with ``relax
    train`` but not every need)."""

    active: Callable
    reason: str | Callable
    given: str = "explicit"
    commands: tuple[str, ...] = ("train",)


def option(default, help: str, *, flag: str | None = None, bound: tuple | None = None,
           requires: Needs | tuple[Needs, ...] = (), follows: str | None = None,
           choices: tuple | None = None, nargs: str | None = None, metavar: str | None = None,
           default_text: str | None = None, default_note: str | None = None,
           positional: bool = False, cli: bool = True, writes: str | None = None):
    """A configuration field: its default (the only place it is written), the help text of
    its flag, its bound and what it needs to have an effect.

    ``flag``: the flag's dest when it cannot be the field's name (the exceptions are listed
    in docs/configuration.md, each with its reason);
    ``bound``: ``(predicate, what it must be)``, or several such pairs checked in order, by
    :func:`check_tree` with the one-line error ``--flag VALUE: what it must be`` (``what``
    may be a function of the value); ``requires``: the :class:`Needs` without which the field
    has no effect, checked by :func:`check_requirements`; ``follows``: the dest whose value
    the field takes when unset (resolution fills it in; a saved configuration drops it again
    where equal). ``--help`` prefixes ``help`` with the default, written from ``default``
    ("Default 8.", "Default off."), followed by ``default_note`` in parentheses, or replaced
    by ``default_text`` where the default needs words. ``cli=False``: resolved, not a flag.
    ``writes``: the flag names a directory Relax writes into, of this kind (``"output"``,
    ``"save"``, ``"critic"``): relax/rundirs.py claims it before anything is written (new,
    empty or Relax's own of that kind), found through :func:`written_dirs`."""
    needs = (requires,) if isinstance(requires, Needs) else tuple(requires)
    return field(default=default, metadata=dict(
        help=help, dest=flag, bound=bound, requires=needs, follows=follows, choices=choices,
        nargs=nargs, metavar=metavar, positional=positional, default_text=default_text,
        default_note=default_note, cli=cli, writes=writes))


def derived(default=None, help: str = ""):
    """A field filled in by resolution, not a flag."""
    return option(default, help, cli=False)


def section(cls):
    """A sub-section field (``rollout.sampling``): built from its own defaults."""
    return field(default_factory=cls, metadata={"section": cls})


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


class Section:
    """Base of every section: list values are stored as tuples, and :meth:`check` holds the
    rules among the section's own fields."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, _frozen(value))

    def check(self) -> None:
        """Raise :class:`~relax.errors.ConfigError` for the first rule among this section's
        own fields it breaks; :func:`check_tree` calls it after the fields' bounds. A section
        with such rules overrides it."""


def is_section(f: dataclasses.Field) -> bool:
    return "section" in f.metadata


def dest_of(f: dataclasses.Field) -> str:
    """The flat name of a leaf field: its flag without ``--`` and with ``_``."""
    return f.metadata.get("dest") or f.name


@cache
def leaves(cls) -> tuple[tuple[tuple[str, ...], dataclasses.Field], ...]:
    """Every leaf field of ``cls`` in declaration order, with its path from ``cls``."""
    out = []
    for f in dataclasses.fields(cls):
        if is_section(f):
            out += [((f.name, *path), leaf) for path, leaf in leaves(f.metadata["section"])]
        else:
            out.append(((f.name,), f))
    return tuple(out)


@cache
def flat_index(cls) -> dict[str, tuple[str, ...]]:
    """dest (flat name) -> path, for every leaf of ``cls``; a dest is unique in the tree."""
    index: dict[str, tuple[str, ...]] = {}
    for path, f in leaves(cls):
        dest = dest_of(f)
        assert dest not in index, f"{dest} declared twice ({index[dest]} and {path})"
        index[dest] = path
    return index


def default_of(cls, name: str):
    """The default of field ``name`` of the section ``cls``: what a settings object built from
    a section uses as its own default, so that the default is written once (in ``option()``)."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def flat_defaults(cls) -> dict:
    """dest -> default of every leaf of ``cls``."""
    return {dest_of(f): f.default for _, f in leaves(cls)}


def get_path(obj, path: tuple[str, ...]):
    for name in path:
        obj = getattr(obj, name)
    return obj


def build(cls, values: dict, prefix: tuple[str, ...] = ()):
    """``cls`` from ``values`` keyed by path tuple (missing leaves keep their defaults)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        if is_section(f):
            kwargs[f.name] = build(f.metadata["section"], values, path)
        elif path in values:
            kwargs[f.name] = values[path]
    return cls(**kwargs)


_MISSING = object()


def value_of(obj, dest: str, default=_MISSING):
    """The value of the flag ``dest`` (its flat name) in a config or one of its sections:
    how rules and reports that name flags look them up (``default``: for a dest ``obj``
    does not hold, as ``getattr``'s)."""
    path = flat_index(type(obj)).get(dest) if dataclasses.is_dataclass(obj) else None
    if path is not None:
        return get_path(obj, path)
    if default is _MISSING:
        return getattr(obj, dest)
    return getattr(obj, dest, default)


def from_flat(cls, flat: dict):
    """``cls`` from ``{dest: value}``; an unknown dest is a KeyError naming it."""
    index = flat_index(cls)
    return build(cls, {index[dest]: value for dest, value in flat.items()})


def to_flat(cfg) -> dict:
    """``{dest: value}`` of every leaf of ``cfg``."""
    return {dest_of(f): get_path(cfg, path) for path, f in leaves(type(cfg))}


def written_dirs(cfg) -> tuple[tuple[str, str, str], ...]:
    """``(--flag, directory, kind)`` of every field of ``cfg`` declared with ``writes`` and
    set: the directories the run will write into, each to be claimed first."""
    return tuple(("--" + dest_of(f).replace("_", "-"), get_path(cfg, path), f.metadata["writes"])
                 for path, f in leaves(type(cfg))
                 if f.metadata.get("writes") and get_path(cfg, path) is not None)


def replace_flat(cfg, **flat):
    """A copy of ``cfg`` with the leaves named by dest replaced."""
    return from_flat(type(cfg), {**to_flat(cfg), **flat})


def bounds_of(f: dataclasses.Field) -> tuple:
    """The ``(predicate, what)`` pairs of a leaf's ``bound``, in the order they are checked."""
    bound = f.metadata.get("bound")
    if bound is None:
        return ()
    return (bound,) if callable(bound[0]) else tuple(bound)


def check_tree(obj) -> None:
    """Walk ``obj`` (a config or a section) in declaration order: each leaf's bounds, each
    sub-section's walk, then the section's own :meth:`Section.check`. Raises
    :class:`~relax.errors.ConfigError` for the first rule broken."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if is_section(f):
            check_tree(value)
            continue
        for predicate, what in bounds_of(f):
            if not predicate(value):
                reject(obj, dest_of(f), what(value) if callable(what) else what)
    if isinstance(obj, Section):
        obj.check()


def check_requirements(cfg, explicit: set[str], command: str = "train") -> None:
    """Refuse the first field of ``cfg`` that is set without what it needs (its
    :class:`Needs`, for ``command``), in declaration order."""
    for path, f in leaves(type(cfg)):
        dest = dest_of(f)
        for need in f.metadata["requires"]:
            if command not in need.commands:
                continue
            given = (dest in explicit if need.given == "explicit"
                     else get_path(cfg, path) != f.default)
            if given and not need.active(cfg):
                reject(cfg, dest, need.reason(cfg) if callable(need.reason) else need.reason)


def followers(cls) -> dict[str, str]:
    """dest -> the dest it follows when unset (``option(follows=...)``), for every leaf."""
    return {dest_of(f): f.metadata["follows"] for _, f in leaves(cls)
            if f.metadata["follows"] is not None}


# ------------------------------------------------------------------ the one-line error

def _fmt(value) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def flag_of(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def head(cfg, *dests: str) -> str:
    """``--flag VALUE`` for each field (bare ``--flag`` for switches)."""
    parts = []
    for dest in dests:
        value = value_of(cfg, dest)
        parts.append(flag_of(dest) if isinstance(value, bool) else f"{flag_of(dest)} {_fmt(value)}")
    return " ".join(parts)


def reject(cfg, dests, reason: str):
    """Raise the one-line error naming ``dests`` (one field name or several) and their values."""
    dests = (dests,) if isinstance(dests, str) else tuple(dests)
    raise ConfigError(head(cfg, *dests), reason)


# ------------------------------------------------------------------ float32 range

# Float flags that scale, clip or divide float32 (or bf16, the same exponent range) tensors:
# beyond float32's range a clamp bound is a RuntimeError ("cannot be converted to type float
# without overflow") and a coefficient an infinity; below its smallest normal number a
# temperature or coefficient is flushed towards 0. Torch-free, so the limits are written out.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


def _float32_what(value) -> str:
    side = "beyond" if abs(value) > FLOAT32_MAX else "below"
    return (f"{side} the range of float32, the dtype of the tensors it is used "
            f"with (0 or a magnitude in [{FLOAT32_TINY:.2g}, {FLOAT32_MAX:.3g}])")


# the bound of such a flag (unset, 0 or a normal float32 in magnitude), after its own
FLOAT32 = (lambda v: v is None or v == 0 or FLOAT32_TINY <= abs(v) <= FLOAT32_MAX, _float32_what)


# ------------------------------------------------------------------ --help words

def default_words(value) -> str:
    """A default as ``--help`` writes it: on/off, none, 1e-6, 0.2, grpo."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        mantissa, e, exponent = f"{value:g}".partition("e")
        return mantissa + (f"e{int(exponent)}" if e else "")
    return str(value)


def help_text(f: dataclasses.Field) -> str:
    """The ``--help`` text of a flag field: its default, then what it does."""
    md = f.metadata
    if md["positional"]:
        return md["help"]
    if md["default_text"] is not None:
        default = f"Default: {md['default_text']}."
    else:
        note = f" ({md['default_note']})" if md["default_note"] else ""
        default = f"Default {default_words(f.default)}{note}."
    return f"{default} {md['help']}".rstrip()
