"""Reward plug-ins that misbehave: exits and interrupts at import or call, and return values
that are not a sequence of real numbers, each end in one line naming --custom-rm-path."""

from __future__ import annotations

import pytest

from tests.hostile.helpers import SMALL, one_error_line, relax, write

pytestmark = pytest.mark.subprocess  # every test here starts `relax` processes (conftest.py)

IMPORT_TIME = {
    "sys.exit(0)": "SystemExit",
    "raise KeyboardInterrupt": "KeyboardInterrupt",
    "raise BaseException('odd')": "BaseException: odd",
    "import no_such_module_anywhere": "ModuleNotFoundError",
}


@pytest.mark.parametrize("statement", IMPORT_TIME)
def test_a_module_that_exits_at_import_is_bad_input(tmp_path, statement):
    path = write(tmp_path / "rm.py", f"import sys\n{statement}\n"
                 "def f(p, r, l):\n    return [0.0] * len(p)\n")
    out = relax("train", *SMALL, "--custom-rm-path", f"{path}:f", "--output-dir",
                tmp_path / "run")
    assert out.returncode == 2
    line = one_error_line(out)
    assert f"--custom-rm-path {path}:f: cannot import" in line
    assert IMPORT_TIME[statement] in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained


CALL_TIME = {
    "sys.exit(3)": "raised on sample 0",
    "raise KeyboardInterrupt": "KeyboardInterrupt",
    "return {'a': 1.0, 'b': 1.0}": "got dict",
    "return 'ab'": "got str",
    "return [True] * len(p)": "got bool True at index 0",
    "return [10 ** 400] * len(p)": "does not fit in a float",
    "return [None] * len(p)": "got NoneType None at index 0",
    "return [[1.0]] * len(p)": "got list",
    "return [1.0]": "returned 1 values for 4 samples",
}


@pytest.mark.parametrize("body", CALL_TIME)
def test_a_reward_that_misbehaves_ends_the_run_with_one_line(tmp_path, body):
    path = write(tmp_path / "rm.py", f"import sys\ndef f(p, r, l):\n    {body}\n")
    out = relax("train", *SMALL, "--custom-rm-path", f"{path}:f", "--output-dir",
                tmp_path / "run")
    assert out.returncode == 1, out.stderr[-2000:]
    line = one_error_line(out)
    assert f"--custom-rm-path {path}:f" in line and CALL_TIME[body] in line


def test_exits_inside_the_reward_honour_the_zero_policy(tmp_path):
    path = write(tmp_path / "rm.py", "import sys\ndef f(p, r, l):\n"
                 "    if len(p) == 1 and r[0].startswith(('a', 'b', 'c')):\n"
                 "        sys.exit(1)\n"
                 "    if len(p) > 1:\n        raise KeyboardInterrupt\n"
                 "    return [0.5]\n")
    out = relax("train", *SMALL, "--custom-rm-path", f"{path}:f", "--reward-error-policy",
                "zero", "--output-dir", tmp_path / "run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2


def test_numpy_and_torch_results_are_accepted(tmp_path):
    path = write(tmp_path / "rm.py", "import numpy, torch\ndef f(p, r, l):\n"
                 "    return numpy.full(len(p), 0.25) if len(p) % 2 == 0 else torch.ones(len(p))\n")
    out = relax("train", *SMALL, "--custom-rm-path", f"{path}:f", "--output-dir",
                tmp_path / "run")
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("flag, body, words", [
    ("--custom-reward-post-process-path", "sys.exit(0)", "raised SystemExit"),
    ("--custom-reward-post-process-path", "return 'no'", "got str"),
    ("--custom-advantage-function-path", "raise KeyboardInterrupt", "raised KeyboardInterrupt"),
    ("--custom-advantage-function-path", "return {'x': 1}", "got dict"),
    ("--custom-reward-post-process-path",
     "x = []\n    for _ in range(100000):\n        x = [x]\n    return x",
     "must return finite rewards of shape (4,), got list [[[[[["),
])
def test_other_plugins_are_contained_too(tmp_path, flag, body, words):
    path = write(tmp_path / "plug.py", f"import sys\ndef g(*args):\n    {body}\n")
    out = relax("train", *SMALL, flag, f"{path}:g", "--output-dir", tmp_path / "run")
    assert out.returncode == 1, out.stderr[-2000:]
    line = one_error_line(out)
    assert flag in line and words in line


@pytest.mark.parametrize("body, words", [
    ("raise SystemExit(0)", "the function raised SystemExit: 0"),
    ("raise KeyboardInterrupt", "the function raised KeyboardInterrupt"),
    ("return numpy.bool_(True)", "must return True or False for a group, got numpy.bool"),
    ("return [True]", "must return True or False for a group, got list"),
])
def test_a_dynamic_sampling_filter_that_misbehaves_is_one_line(body, words, monkeypatch,
                                                               tmp_path):
    import signal

    from relax.errors import RewardError
    from relax.rollout.filters import FLAG, kept_groups, load_group_filter

    monkeypatch.setattr(signal, "getsignal", lambda sig: None)  # relax train's SIGINT handler
    path = write(tmp_path / "flt.py", f"import numpy\ndef keep(r, s, l):\n    {body}\n")
    fn = load_group_filter(f"{path}:keep")
    with pytest.raises(RewardError) as e:
        kept_groups(fn, [0.0, 1.0], ["a", "b"], [None, None], 2)
    assert str(e.value).startswith(FLAG) and words in str(e.value)
    assert "\n" not in str(e.value)
