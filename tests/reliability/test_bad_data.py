"""Bad data: every malformed input is an InputError naming file:line, never a traceback
(docs/reliability.md); the loader is fuzzed with hypothesis."""

import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relax.errors import InputError
from relax.rollout.prompts.data import load_prompt_data
from tests.reliability.helpers import SMALL
from tests.trainer.helpers import make_config, write_jsonl

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=8,
)
rows = st.one_of(
    st.fixed_dictionaries({"input": st.text(max_size=10), "label": json_values}),
    st.fixed_dictionaries({"input": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=6)}),
        max_size=2), "label": st.integers()}),
    st.dictionaries(st.sampled_from(["input", "label", "other"]), json_values, max_size=3),
    json_values,
)


def _load(data: bytes, **kw):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "data.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        try:
            return path, load_prompt_data(path, "input", "label", **kw), None
        except InputError as e:
            return path, None, str(e)


def _is_good(row) -> bool:
    if not isinstance(row, dict) or "input" not in row or row.get("label") is None:
        return False
    p = row["input"]
    if isinstance(p, str):
        return bool(p.strip())
    return (isinstance(p, list) and bool(p) and all(isinstance(m, dict) and isinstance(
        m.get("content"), str) and isinstance(m.get("role", ""), str) for m in p)
        and any(m["content"].strip() for m in p))


@FUZZ
@given(st.lists(rows, max_size=6))
def test_fuzzed_rows_load_or_name_the_first_bad_line(items):
    data = "".join(json.dumps(r) + "\n" for r in items).encode()
    path, samples, error = _load(data)
    bad = [i for i, r in enumerate(items, start=1) if not _is_good(r)]
    if bad:
        assert error is not None and error.startswith(f"{path}:{bad[0]}: "), error
        assert "\n" not in error
    elif not items:
        assert error == f"--prompt-data {path}: the dataset is empty"
    else:
        assert error is None and [s.prompt for s in samples] == [r["input"] for r in items]
        assert [s.source for s in samples] == [f"{path}:{i}" for i in range(1, len(items) + 1)]


@FUZZ
@given(st.binary(max_size=80))
def test_fuzzed_bytes_never_escape_as_a_traceback(data):
    path, samples, error = _load(data, need_label=False)
    if error is not None:
        assert (error.startswith(path + ":") or error.startswith("--prompt-data")), error
        assert "\n" not in error


def test_deeply_nested_json_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"input": "ok", "label": 1}\n' + "[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(InputError, match=r"deep.jsonl:2: "):
        load_prompt_data(str(path), "input", "label")


def test_prompt_longer_than_the_context_names_file_line(tmp_path, capsys):
    from relax.trainer import train

    rows = [{"input": "1+1=", "label": "2"}] * 3 + [{"input": "x" * 300, "label": "1"}]
    cfg = make_config(*SMALL, "--prompt-data", write_jsonl(tmp_path, rows), "--rm-type", "math",
                      "--num-rollout", "1", tiny=False, output_dir=tmp_path / "run")
    assert train(cfg) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "data.jsonl:4: prompt of 300 tokens + --rollout-max-response-len 4 exceeds the " \
           "model context of 256 tokens (1 of 4 prompts do not fit)" in line
