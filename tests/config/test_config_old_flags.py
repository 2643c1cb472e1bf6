"""Every flag ``relax train --help`` listed at e31a7d6 still parses to the same value
(tests/config/data/train_flags_e31a7d6.json: each flag, a sample command line and the value
the parser of that commit gave its dest), except the flags removed on purpose below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relax.config import ConfigError, TrainConfig
from relax.config.flags import build_train_parser
from relax.config.section import from_flat, value_of

ROWS = json.loads((Path(__file__).parent / "data" / "train_flags_e31a7d6.json").read_text())
# removed, each with why; a command line naming one gets one line saying what to do instead
REMOVED = {
    "colocate": "never read: rollout and training share the ranks unless --fully-async",
    "hybrid": "only ever refused: no hybrid mode exists",
}


def _norm(value):
    return [_norm(v) for v in value] if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("row", [r for r in ROWS if r["dest"] not in REMOVED],
                         ids=lambda r: " ".join(r["argv"]))
def test_an_old_flag_parses_to_the_same_value(row):
    values = vars(build_train_parser().parse_strict(row["argv"]))
    del values["config"]  # not a field: the file the values come from
    cfg = from_flat(TrainConfig, values)  # the value reaches its section's field
    assert _norm(value_of(cfg, row["dest"])) == row["value"]
    assert _norm(values[row["dest"]]) == row["value"]


def test_the_list_is_the_whole_old_help():
    assert len({r["dest"] for r in ROWS}) == 125
    assert set(REMOVED) <= {r["dest"] for r in ROWS}


@pytest.mark.parametrize("flag", sorted(REMOVED))
def test_a_removed_flag_is_one_line_saying_what_to_do(flag):
    with pytest.raises(ConfigError) as e:
        build_train_parser().parse_strict(["--" + flag])
    line = str(e.value)
    assert line.startswith(f"--{flag}: removed") and "\n" not in line and "remove it" in line
