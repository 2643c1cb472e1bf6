"""Random flag combinations never end in a traceback: exit 0 or 2, at most one stderr line.

Flags are drawn from the real parser; values mix plausible ones (defaults, choices, small
numbers, existing paths) with implausible ones (negative, NaN, text for numbers, missing
paths, control characters).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from relax.config.flags import finite_float, integer
from tests.flag_helpers import train_flags

FLAGS = train_flags()
JUNK = st.sampled_from(["", "x", "-1", "1e999", "nan", "a:b:c", "line\nbreak", "--lr", "0x10"])


def value_strategy(action, paths: list[str]):
    if action.choices:
        return st.one_of(st.sampled_from(list(action.choices)), JUNK)
    if action.type is integer:
        return st.one_of(st.integers(-3, 70).map(str), st.sampled_from(["1.5", "2**3"]), JUNK)
    if action.type is finite_float:
        return st.one_of(st.floats(-2, 2).map(repr),
                         st.sampled_from(["0", "1", "0.2", "1e-6", "inf"]), JUNK)
    # free text: paths, module:function paths, keys, prompts
    return st.one_of(st.sampled_from(paths), JUNK)


def argv_strategy(paths: list[str]):
    def pair(flag: str):
        action = FLAGS[flag]
        if action.nargs == 0:  # switches, sometimes with a bogus attached value
            return st.sampled_from([[flag], [flag], [f"{flag}=1"]])
        return st.one_of(value_strategy(action, paths).map(lambda v: [flag, v]),
                         st.just([flag]))  # missing value

    flag_lists = st.lists(st.sampled_from(sorted(FLAGS)), max_size=7)
    return flag_lists.flatmap(lambda flags: st.tuples(*(pair(f) for f in flags))).map(
        lambda pairs: [tok for p in pairs for tok in p])


RPP = ("--advantage-estimator reinforce_plus_plus --normalize-advantages --kl-coef 0.01"
       ).split()
BASE = ("--advantage-estimator reinforce_plus_plus_baseline --normalize-advantages "
        "--n-samples-per-prompt 8 --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01").split()
WORLD = st.sampled_from([None, "1", "2", "4", "3", "0", "x"])


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_flags_never_traceback(cli, tmp_path, data):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    reward = tmp_path / "r.py"
    reward.write_text("raise RuntimeError('user code must not run')\n")
    paths = [str(model), str(prompts), str(tmp_path / "missing"), "json:loads",
             f"{reward}:f", "no_such_module_q:f", "input", "math", str(tmp_path)]
    # start from an accepted setup half the time so that later rules get reached too
    base = data.draw(st.sampled_from([[], [], RPP, BASE, ["--prompt-data", str(prompts),
                                                          "--rm-type", "math"]]))
    argv = base + data.draw(argv_strategy(paths)) + ["--dry-run"]
    world = data.draw(WORLD)
    saved = os.environ.pop("WORLD_SIZE", None)
    if world is not None:
        os.environ["WORLD_SIZE"] = world
    try:
        result = cli(["train", *argv])
    finally:
        os.environ.pop("WORLD_SIZE", None)
        if saved is not None:
            os.environ["WORLD_SIZE"] = saved
    event(f"exit {result.code}")
    assert result.code in (0, 2), (argv, result)
    assert result.err.count("\n") <= 1, (argv, result.err)
    if result.code == 2:
        assert result.err.startswith("relax train: error: ") and result.out == ""
    else:
        assert result.err == "" and result.out.startswith("{")
