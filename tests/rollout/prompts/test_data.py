"""Prompt data: jsonl/parquet rows, errors naming file:line and key, deterministic batches."""

import json

import pytest

from relax.errors import InputError
from relax.rollout.prompts.data import PromptSource, load_prompt_data
from relax.rollout.prompts.tasks import get_task


def _jsonl(tmp_path, lines):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_rows(tmp_path):
    path = _jsonl(tmp_path, [json.dumps({"q": f"{i}+1=", "a": i + 1}) for i in range(3)] + [""])
    rows = load_prompt_data(path, "q", "a")
    assert [(r.prompt, r.label) for r in rows] == [("0+1=", 1), ("1+1=", 2), ("2+1=", 3)]
    assert rows[1].source.endswith("data.jsonl:2")


def test_parquet_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"input": ["a", "b"], "label": ["1", "2"]}), path)
    assert [r.label for r in load_prompt_data(path, "input", "label")] == ["1", "2"]


def test_parquet_missing_key_names_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"text": ["a", "b"]}), path)
    with pytest.raises(InputError, match=r"d.parquet:row 1: missing key 'input'"):
        load_prompt_data(path, "input", "label")


@pytest.mark.parametrize(
    "lines,needle",
    [
        (['{"input": "a", "label": 1}', "{not json"], r"data.jsonl:2: not valid JSON"),
        (['{"input": "a", "label": 1}', '{"prompt": "b", "label": 2}'],
         r"data.jsonl:2: missing key 'input' \(--input-key\)"),
        (['{"input": "a"}'], r"data.jsonl:1: missing key 'label' \(--label-key\)"),
        (['[1, 2]'], r"data.jsonl:1: expected a JSON object"),
        (['{"input": "", "label": 1}'], r"data.jsonl:1: key 'input' is an empty prompt"),
    ],
)
def test_bad_rows(tmp_path, lines, needle):
    with pytest.raises(InputError, match=needle):
        load_prompt_data(_jsonl(tmp_path, lines), "input", "label")


def test_label_optional_for_custom_rewards(tmp_path):
    rows = load_prompt_data(_jsonl(tmp_path, ['{"input": "a"}']), "input", "label",
                            need_label=False)
    assert rows[0].label is None


def test_empty_and_missing(tmp_path):
    with pytest.raises(InputError, match="is empty"):
        load_prompt_data(_jsonl(tmp_path, ["", "  "]), "input", "label")
    with pytest.raises(InputError, match="no such file"):
        load_prompt_data(str(tmp_path / "nope.jsonl"), "input", "label")


def test_dataset_batches_cover_each_epoch_once(tmp_path):
    path = _jsonl(tmp_path, [json.dumps({"input": str(i), "label": i}) for i in range(10)])
    src = PromptSource(batch_size=3, seed=1, samples=load_prompt_data(path, "input", "label"),
                       shuffle=True)
    assert src.steps_per_epoch == 3  # the partial last batch is dropped
    epoch0 = [s.label for step in range(3) for s in src.batch(step)]
    epoch1 = [s.label for step in range(3, 6) for s in src.batch(step)]
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9 and epoch0 != epoch1
    assert [s.label for s in src.batch(4)] == [s.label for s in src.batch(4)]


def test_task_batches_depend_only_on_seed_and_step():
    a = PromptSource(batch_size=4, seed=5, task=get_task("copy"))
    b = PromptSource(batch_size=4, seed=5, task=get_task("copy"))
    assert [s.prompt for s in a.batch(7)] == [s.prompt for s in b.batch(7)]
    assert [s.prompt for s in a.batch(7)] != [s.prompt for s in a.batch(8)]


def test_too_few_prompts(tmp_path):
    path = _jsonl(tmp_path, ['{"input": "a", "label": 1}'])
    with pytest.raises(InputError, match="fewer than --rollout-batch-size 2"):
        PromptSource(batch_size=2, seed=0, samples=load_prompt_data(path, "input", "label"))
