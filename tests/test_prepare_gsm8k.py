"""scripts/prepare_gsm8k.py on small local fixtures (jsonl and parquet, GSM8K layout): the
final number is extracted, the output is what relax train and the math reward read."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "prepare_gsm8k.py"
spec = importlib.util.spec_from_file_location("prepare_gsm8k", SCRIPT)
prep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prep)

ROWS = [
    {"question": " Tom has 3 apples and buys 4. How many? ",
     "answer": "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A farm sells 1,234 eggs.", "answer": "Count them.\n#### 1,234"},
    {"question": "Temperature drops by 5 from 2.", "answer": "2 - 5 = -3\n#### -3"},
]


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = prep.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), train)
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    return train, test


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_converts_parquet_and_jsonl(tmp_path, files):
    train, test = files
    code, out, err = run(["--output-dir", str(tmp_path / "out"), "--train-file", str(train),
                          "--test-file", str(test), "--test-limit", "2"])
    assert (code, err) == (0, ""), err
    expected = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "7"},
                {"question": "A farm sells 1,234 eggs.", "answer": "1234"},
                {"question": "Temperature drops by 5 from 2.", "answer": "-3"}]
    assert read(tmp_path / "out" / "train.jsonl") == expected
    assert read(tmp_path / "out" / "test.jsonl") == expected[:2]
    assert "wrote 3 rows" in out and "wrote 2 rows" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["test.jsonl", "train.jsonl"]


def test_output_feeds_relax_data_and_math_reward(tmp_path, files):
    from relax.rollout.prompts.data import load_prompt_data
    from relax.rollout.reward.math_reward import math_reward

    train, test = files
    assert run(["--output-dir", str(tmp_path), "--train-file", str(train),
                "--test-file", str(test)])[0] == 0
    samples = load_prompt_data(str(tmp_path / "train.jsonl"), "question", "answer")
    labels = [s.label for s in samples]
    rewards = math_reward([s.prompt for s in samples],
                          ["so \\boxed{7}", "\\boxed{1234}", "\\boxed{3}"], labels)
    assert rewards == [1.0, 1.0, 0.0]


def test_bad_rows_name_file_and_line(tmp_path, files):
    train, _ = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": "q", "answer": "x"})
                   + "\n")
    code, _, err = run(["--output-dir", str(tmp_path / "o"), "--train-file", str(train),
                        "--test-file", str(bad)])
    assert code == 2 and f"{bad}:2: no final number" in err
    assert not (tmp_path / "o" / "test.jsonl").exists()
    code, _, err = run(["--output-dir", str(tmp_path / "o"), "--train-file",
                        str(tmp_path / "none.jsonl"), "--test-file", str(bad)])
    assert code == 2 and "none.jsonl: no such file" in err
    with pytest.raises(SystemExit):
        with contextlib.redirect_stderr(io.StringIO()):
            prep.main(["--output-dir", "o", "--train-file", str(train)])  # test file missing
