"""samples.jsonl and the sample views of TensorBoard (--log-samples): what a user reads."""

from __future__ import annotations

import json

import pytest

from relax.metrics.sinks import (
    MetricsLogger,
    SamplesSink,
    build_logger,
    samples_table,
    spread_indices,
)

ROWS = [{"prompt": "Calculate 2 + 3.", "response": "2 + 3 = 5 | done\nok", "reward": 1.0,
         "label": {"answer": "5", "meta": (1, 2)}, "response_length": 9, "truncated": False},
        {"prompt": "x\ud800", "response": "", "reward": 0.0, "label": None,
         "response_length": 0, "truncated": True}]


@pytest.mark.parametrize("count, total, expected", [
    (4, 32, [0, 8, 16, 24]), (3, 2, [0, 1]), (1, 5, [0]), (0, 5, []), (4, 4, [0, 1, 2, 3]),
])
def test_spread_indices(count, total, expected):
    assert spread_indices(count, total) == expected


def test_samples_jsonl_rows_and_resume_append(tmp_path):
    path = tmp_path / "samples.jsonl"
    sink = SamplesSink(str(path))
    sink.log_samples(3, ROWS)
    sink.close()
    with path.open("a") as f:
        f.write('{"step": 4, "prom')  # a kill in the middle of a write
    sink = SamplesSink(str(path))  # the resumed run cuts the torn line and appends
    sink.log_samples(4, ROWS[:1])
    sink.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 3, 4]
    assert rows[0]["label"] == {"answer": "5", "meta": [1, 2]}  # tuples as lists
    assert rows[1]["prompt"] == "x\ud800"  # escaped in the file, read back the same
    assert set(rows[0]) == {"step", *ROWS[0]}


def test_markdown_table_escapes_pipes_and_newlines():
    table = samples_table(ROWS).splitlines()
    assert table[0] == "| prompt | response | reward | label |"
    assert "2 + 3 = 5 \\| done<br>ok" in table[2] and table[2].count(" | ") == 3


def test_logger_writes_samples_only_when_asked(tmp_path):
    logger = build_logger(is_main=True, output_dir=str(tmp_path / "a"), total_steps=1,
                          console=False, samples=True)
    logger.log_samples(1, ROWS)
    logger.log_samples(2, [])  # nothing to write: no empty line
    logger.close()
    assert len((tmp_path / "a" / "samples.jsonl").read_text().splitlines()) == 2
    logger = build_logger(is_main=True, output_dir=str(tmp_path / "b"), total_steps=1,
                          console=False)
    logger.log_samples(1, ROWS)
    logger.close()
    assert not (tmp_path / "b" / "samples.jsonl").exists()
    MetricsLogger().log_samples(1, ROWS)  # other ranks: no sinks, no error


def test_tensorboard_gets_a_text_panel(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = build_logger(is_main=True, output_dir=str(tmp_path), total_steps=1,
                          console=False, tensorboard=True, samples=True)
    logger.log_samples(5, ROWS)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (tag,) = [t for t in events.Tags()["tensors"] if t.startswith("samples")]
    (event,) = events.Tensors(tag)
    assert event.step == 5
    assert "Calculate 2 + 3." in event.tensor_proto.string_val[0].decode()
