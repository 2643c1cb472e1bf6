"""The machinery of the configuration's sections: a field declared once (:func:`option`: its
flag, default, help and bound) and the tree walks the parser, validation, the JSON file and the
``--config`` file loader share.

The configuration is a tree of frozen dataclasses (torchtitan's JobConfig is the model)::

    cfg.algorithm.estimator               # --advantage-estimator
    cfg.rollout.sampling.temperature      # --rollout-temperature
    cfg.batches.samples_per_prompt        # --n-samples-per-prompt

A leaf field's flag is ``--`` + its *dest* (``option(flag=...)``, else the field's own name)
with ``-`` for ``_``: the Relax/Megatron flag names are the interface, the section paths are
the code's names. Lists become tuples, so a section is immutable all the way down. Nothing
here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from functools import cache


def option(default, help: str, *, flag: str | None = None, bound: tuple | None = None,
           choices: tuple | None = None, nargs: str | None = None, metavar: str | None = None,
           default_text: str | None = None, default_note: str | None = None,
           positional: bool = False, cli: bool = True, group: str | None = None,
           writes: str | None = None):
    """A configuration field: its default (the only place it is written), the help text of
    its flag, and its bound.

    ``flag``: the flag's dest when it differs from the field name (``--advantage-estimator``
    is ``algorithm.estimator``); ``bound``: ``(predicate, what it must be)``, checked by
    :func:`check_bounds_of` with the one-line error ``--flag VALUE: what it must be``;
    ``--help`` prefixes ``help`` with the default, written from ``default`` ("Default 8.",
    "Default off."), followed by ``default_note`` in parentheses, or replaced by
    ``default_text`` where the default needs words. ``cli=False``: resolved, not a flag.
    ``writes``: the flag names a directory Relax writes into, of this kind (``"output"``,
    ``"save"``, ``"critic"``): relax/rundirs.py claims it before anything is written (new,
    empty or Relax's own of that kind), found through :func:`written_dirs`.
    ``group`` is accepted for field modules written before sections and ignored: a flag's
    ``--help`` group is its section."""
    del group
    return field(default=default, metadata=dict(
        help=help, dest=flag, bound=bound, choices=choices, nargs=nargs, metavar=metavar,
        positional=positional, default_text=default_text, default_note=default_note, cli=cli,
        writes=writes))


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
    section's own rules."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, _frozen(value))

    def check(self) -> None:
        """Raise :class:`~relax.errors.ConfigError` for the first of this section's own rules
        it breaks: each field's bound, then each sub-section's :meth:`check`. A section with
        rules among its own fields adds them by overriding this (and calling it)."""
        check_sections(self)


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


def check_sections(obj) -> None:
    """The bounds of ``obj``'s own leaves, then :meth:`Section.check` of each sub-section, in
    declaration order (the root config's rules start with this)."""
    from relax.config.checks import reject
    for f in dataclasses.fields(obj):
        if is_section(f):
            getattr(obj, f.name).check()
            continue
        bound = f.metadata.get("bound")
        if bound is not None and not bound[0](getattr(obj, f.name)):
            reject(obj, dest_of(f), bound[1])
