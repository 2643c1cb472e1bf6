"""The "How to add a flag" recipe of docs/architecture.md stays true: each section's fields and
rules live in the module named for it under relax/config/sections/, what a field needs is
``Needs`` metadata on its ``option()``, and the rules across sections are one ordered list of
``Rule`` entries, each naming existing sections and defined in its first section's module."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from relax.config.schema import EVAL_FLAGS, EvalConfig, TrainConfig
from relax.config.section import (
    Needs,
    Section,
    default_of,
    dest_of,
    flat_index,
    is_section,
    leaves,
)
from relax.config.validate import CROSS_RULES, Rule

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ROOT / "relax" / "config" / "sections"


def _sections(cls, prefix: tuple[str, ...] = ()):
    """``(path, section class)`` of every section below ``cls``."""
    for f in dataclasses.fields(cls):
        if is_section(f):
            path = (*prefix, f.name)
            yield path, f.metadata["section"]
            yield from _sections(f.metadata["section"], path)


def _section_at(path: str):
    return dict(_sections(TrainConfig))[tuple(path.split("."))]


def test_the_files_the_recipe_names_exist():
    for name in ("relax/config/section.py", "relax/config/validate.py",
                 "relax/config/schema.py", "docs/configuration.md", "docs/architecture.md"):
        assert (ROOT / name).is_file(), name
    assert (SECTIONS / "__init__.py").is_file()


def test_every_section_lives_in_the_module_named_for_it():
    for path, cls in _sections(TrainConfig):
        assert issubclass(cls, Section), path
        assert cls.__module__ == f"relax.config.sections.{path[-1]}", (
            f"cfg.{'.'.join(path)}: {cls.__name__} belongs in relax/config/sections/"
            f"{path[-1]}.py")
        assert (SECTIONS / f"{path[-1]}.py").is_file()


def test_no_rule_modules_beside_the_sections():
    stray = [p.name for p in (ROOT / "relax" / "config").glob("*.py")
             if p.stem.endswith(("_rules", "_fields")) or p.stem in ("sections", "bounds")]
    assert stray == [], "a section's rules go in its module under relax/config/sections/"


def test_what_a_field_needs_is_needs_metadata():
    for _, f in leaves(TrainConfig):
        needs = f.metadata["requires"]
        assert isinstance(needs, tuple) and all(isinstance(n, Needs) for n in needs), f.name
        assert all(n.given in ("explicit", "changed") for n in needs), f.name
        assert all(set(n.commands) <= {"train", "eval"} for n in needs), f.name
        bound = f.metadata["bound"]
        if bound is not None:
            pairs = (bound,) if callable(bound[0]) else bound
            assert all(callable(p) and (isinstance(w, str) or callable(w)) for p, w in pairs)


def test_follows_names_a_flag():
    index = flat_index(TrainConfig)
    for _, f in leaves(TrainConfig):
        if f.metadata["follows"] is not None:
            assert f.metadata["follows"] in index, dest_of(f)


def test_cross_section_rules_name_their_sections_and_live_in_the_first():
    assert CROSS_RULES and all(isinstance(rule, Rule) for rule in CROSS_RULES)
    checks = [rule.check for rule in CROSS_RULES]
    assert len(set(checks)) == len(checks), "a rule listed twice"
    for rule in CROSS_RULES:
        assert len(rule.sections) >= 2, f"{rule.check.__name__} reads one section: its check()"
        for path in rule.sections:
            _section_at(path)  # exists
        assert rule.check.__module__ == _section_at(rule.sections[0]).__module__, (
            f"{rule.check.__name__} belongs in the module of {rule.sections[0]}")


def test_eval_flags_are_fields_of_the_eval_command():
    index = flat_index(EvalConfig)
    assert len(set(EVAL_FLAGS)) == len(EVAL_FLAGS)
    assert all(dest in index for dest in EVAL_FLAGS)


def test_the_names_that_differ_from_their_flags_are_one_table():
    """docs/configuration.md lists every field named unlike its flag, and only those, each
    with its reason."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = re.split(r"\n##+ ", text.split("### Field names that differ from their flags")[1])[0]
    rows = re.findall(r"^\| `cfg\.([\w.]+)` \| `(--[a-z0-9-]+)` \| ([^|]*?) \|$", table, re.M)
    assert all(reason.strip() for _, _, reason in rows), rows
    listed = {(field, flag) for field, flag, _ in rows}
    renamed = {(".".join(path), "--" + dest_of(f).replace("_", "-"))
               for path, f in leaves(TrainConfig)
               if f.metadata["cli"] and dest_of(f) != f.name}
    assert listed == renamed


def test_a_settings_object_takes_its_default_from_the_section():
    """``default_of`` is how a settings object built from a section writes its default
    (recipe step 1: a default is written once, in ``option()``)."""
    for path, cls in _sections(TrainConfig):
        built = cls()
        for f in dataclasses.fields(cls):
            if not is_section(f):
                assert default_of(cls, f.name) == getattr(built, f.name), (path, f.name)
