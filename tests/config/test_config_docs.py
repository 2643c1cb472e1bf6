"""docs/configuration.md stays in sync with the parser and the built-in preset."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relax.config import BUILTIN_PRESET, TrainConfig
from relax.config.flags import REMOVED, build_eval_parser, build_train_parser
from relax.config.section import flat_index
from relax.plotting import build_plot_parser
from tests.flag_helpers import train_flags

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
FLAGS = train_flags()
ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \| ([^|]*) \|")


def flag_rows(text: str) -> dict[str, str]:
    """Flag -> default cell of the per-group tables (everything before the REINFORCE++ rules)."""
    head = text.split("## The REINFORCE++ rules")[0]
    rows = {}
    for line in head.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} listed twice in {DOC.name}"
            rows[m.group(1)] = m.group(2).strip()
    return rows


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text(encoding="utf-8")


def test_every_parser_flag_is_documented_and_vice_versa(text):
    rows = flag_rows(text)
    assert sorted(set(FLAGS) - set(rows)) == [], "flags missing from docs/configuration.md"
    assert sorted(set(rows) - set(FLAGS)) == [], "docs/configuration.md lists unknown flags"
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    other = (_all_names(build_train_parser()) | _all_names(build_eval_parser())
             | _all_names(build_plot_parser()))
    assert sorted(mentioned - set(FLAGS) - other - set(REMOVED) - {"--help"}) == [], (
        "the doc mentions unknown flags")


def _long_flags(parser) -> list[str]:
    return [a.option_strings[0] for a in parser._actions
            if a.option_strings and a.dest != "help"]


def _all_names(parser) -> set[str]:
    """Every spelling, --no-bf16 included."""
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


@pytest.mark.parametrize("section,parser", [("## `relax eval`", build_eval_parser),
                                            ("## `relax plot`", build_plot_parser)])
def test_eval_and_plot_flags_are_documented(text, section, parser):
    body = text.split(section)[1].split("\n## ")[0]
    missing = [f for f in _long_flags(parser()) if f"`{f}`" not in body]
    assert missing == [], f"document {missing} under {section} in docs/configuration.md"


def test_documented_defaults_match_the_parser(text):
    for flag, cell in flag_rows(text).items():
        default = FLAGS[flag].default
        if isinstance(default, bool):
            assert cell == ("on" if default else "off"), (flag, cell, default)
        elif default is not None:
            literal = re.match(r"`([^`]*)`", cell)
            assert literal, (flag, cell, default)
            value = literal.group(1)
            if isinstance(default, str):
                assert value == default, (flag, value, default)
            else:
                assert float(value) == default, (flag, value, default)


def test_preset_table_matches_presets_py(text):
    table = text.split("## The built-in preset")[1]
    rows = {m.group(1): m.group(2).strip().strip("`") for m in map(ROW.match, table.splitlines())
            if m}
    documented = {FLAGS[flag].dest: value for flag, value in rows.items()}
    actual = {key: value if isinstance(value, str) else float(value)
              for key, value in BUILTIN_PRESET.items()}
    documented = {key: value if isinstance(actual.get(key), str) else float(value)
                  for key, value in documented.items()}
    assert documented == actual, (
        "update the preset table of docs/configuration.md to relax/config/presets.py")


def test_each_table_lists_the_flags_of_the_sections_its_heading_names(text):
    """A heading names its sections (``## Rewards (`cfg.rollout.rewards`)``); every flag row
    under it is a field of one of them, and every section has a heading."""
    index = flat_index(TrainConfig)
    covered, heading = set(), None
    for line in text.split("## The REINFORCE++ rules")[0].splitlines():
        if line.startswith("## "):
            heading = set(re.findall(r"`cfg\.([a-z_.]+)`", line))
            covered |= heading
        m = ROW.match(line)
        if m and m.group(1) != "--config":  # the file the configuration comes from
            dest = m.group(1)[2:].replace("-", "_")
            section = ".".join(index[dest][:-1])
            assert heading and section in heading, (
                f"{m.group(1)} is a field of cfg.{section}: move its row under that heading")
    sections = {".".join(path[:-1]) for path in index.values() if len(path) > 1}
    assert sections <= covered, f"no docs/configuration.md heading for {sections - covered}"
