"""Loading user plug-ins (relax/plugins.py): a function that cannot take the arguments its flag
passes is refused when loaded, in one line naming the flag, before any model is loaded."""

from __future__ import annotations

import pytest

from relax.errors import InputError
from relax.plugins import ARITY, load_function

# What each flag's call passes, written out here rather than read from ARITY.
CALLED_WITH = {
    "--custom-rm-path": (["p"], ["r"], ["l"]),
    "--dynamic-sampling-filter-path": ([1.0], ["r"], "l"),
    "--custom-reward-post-process-path": ("rewards", "group_index"),
    "--custom-advantage-function-path": ("rewards", "group_index", "mask"),
    "--custom-tis-function-path": ("trainer", "sampler", "mask"),
    "--env": (),
}


def _plugin(tmp_path, body: str) -> str:
    path = tmp_path / "plug.py"
    path.write_text(body)
    return str(path)


def test_every_plugin_flag_is_checked():
    assert set(ARITY) == set(CALLED_WITH)


@pytest.mark.parametrize("flag", sorted(CALLED_WITH))
def test_a_function_that_cannot_take_the_flags_arguments_is_one_line(tmp_path, flag):
    n = len(CALLED_WITH[flag])
    params = ", ".join(f"a{i}" for i in range(n + 1))  # one argument too many
    path = _plugin(tmp_path, f"def f({params}):\n    return None\n")
    with pytest.raises(InputError) as e:
        load_function(f"{path}:f", flag)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{flag} {path}:f: the function takes ({params})")
    assert f"called with {n} positional argument" in msg


@pytest.mark.parametrize("flag", sorted(CALLED_WITH))
@pytest.mark.parametrize("params", ["{named}", "*args", "{named}, extra=None", "{named}, *, k=1"])
def test_functions_that_take_the_arguments_load(tmp_path, flag, params):
    named = ", ".join(f"a{i}" for i in range(len(CALLED_WITH[flag])))
    params = params.format(named=named).lstrip(", ")
    path = _plugin(tmp_path, f"def f({params}):\n    return 'called'\n")
    assert load_function(f"{path}:f", flag)(*CALLED_WITH[flag]) == "called"


def test_a_class_as_environment_factory_is_checked_by_its_init(tmp_path):
    path = _plugin(tmp_path, "class Env:\n    def __init__(self):\n        pass\n"
                             "class Needs:\n    def __init__(self, level):\n        pass\n")
    assert load_function(f"{path}:Env", "--env") is not None
    with pytest.raises(InputError, match=r"--env .*:Needs: the function takes \(level\)"):
        load_function(f"{path}:Needs", "--env")


def test_functions_without_a_signature_are_left_to_the_call():
    assert load_function("builtins:max", "--custom-rm-path") is max  # no inspectable signature
    assert load_function("builtins:len", "--other-flag") is len  # no ARITY row: not checked
