#!/usr/bin/env python3
"""Write GSM8K as ``question`` / ``answer`` jsonl for relax train (answer = the final number).

    # from the Hugging Face hub, where the network allows (needs `pip install datasets`)
    python scripts/prepare_gsm8k.py --output-dir data/gsm8k

    # from local files: the hub's parquet shards or any jsonl with question/answer fields
    python scripts/prepare_gsm8k.py --output-dir data/gsm8k \
        --train-file gsm8k/main/train-00000-of-00001.parquet \
        --test-file gsm8k/main/test-00000-of-00001.parquet

GSM8K answers are a rationale ending in ``#### 72``; the output keeps only ``72`` (thousands
separators removed), which is the label ``--rm-type math`` compares with. The recipe reads the
files with ``--input-key question --label-key answer``. A row without a final number stops the
script with its file:line. Outputs are written to a temporary name and renamed, so an
interrupted run leaves no half-written file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


class PrepError(ValueError):
    """Bad input; ``str(e)`` names the file and line."""


def final_answer(answer: str, where: str) -> str:
    """``"... #### 1,234"`` -> ``"1234"``; a plain number passes through."""
    if not isinstance(answer, str) and isinstance(answer, (int, float)):
        answer = str(answer)
    if not isinstance(answer, str):
        raise PrepError(f"{where}: 'answer' must be a string, got {type(answer).__name__}")
    tail = answer.rsplit("####", 1)[-1].strip()
    value = tail.replace(",", "").removeprefix("$").rstrip(".").strip()
    if not _NUMBER.match(value):
        raise PrepError(f"{where}: no final number after '####' in the answer "
                        f"(got {tail[:40]!r})")
    return value


def read_rows(path: str) -> list[tuple[str, dict]]:
    """``(where, row)`` pairs of a ``.parquet`` or ``.jsonl`` file."""
    if not os.path.isfile(path):
        raise PrepError(f"{path}: no such file")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return [(f"{path}:row {i + 1}", row)
                for i, row in enumerate(pq.read_table(path).to_pylist())]
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise PrepError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


def convert(rows) -> list[dict]:
    out = []
    for where, row in rows:
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise PrepError(f"{where}: expected an object with 'question' and 'answer'")
        question = str(row["question"]).strip()
        if not question:
            raise PrepError(f"{where}: empty question")
        out.append({"question": question, "answer": final_answer(row["answer"], where)})
    if not out:
        raise PrepError("no rows to write")
    return out


def hub_rows(dataset: str, config: str, split: str) -> list[tuple[str, dict]]:
    try:
        import datasets
    except ImportError:
        raise PrepError("the Hugging Face download needs `pip install datasets`; or give "
                        "--train-file and --test-file") from None
    data = datasets.load_dataset(dataset, config, split=split)
    return [(f"{dataset}/{config}/{split}:row {i + 1}", row) for i, row in enumerate(data)]


def write_jsonl(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True, help="writes train.jsonl and test.jsonl")
    parser.add_argument("--train-file", help="local .parquet/.jsonl (default: the hub)")
    parser.add_argument("--test-file", help="local .parquet/.jsonl (default: the hub)")
    parser.add_argument("--test-limit", type=int, default=None,
                        help="keep only the first N test rows (faster evaluation)")
    parser.add_argument("--hf-dataset", default="openai/gsm8k")
    parser.add_argument("--hf-config", default="main")
    args = parser.parse_args(argv)
    if (args.train_file is None) != (args.test_file is None):
        parser.error("give both --train-file and --test-file, or neither (the hub)")
    if args.test_limit is not None and args.test_limit < 1:
        parser.error("--test-limit must be >= 1")
    try:
        splits = {}
        for split, path in (("train", args.train_file), ("test", args.test_file)):
            rows = read_rows(path) if path else hub_rows(args.hf_dataset, args.hf_config, split)
            splits[split] = convert(rows)
        if args.test_limit is not None:
            splits["test"] = splits["test"][: args.test_limit]
        for split, rows in splits.items():
            path = os.path.join(args.output_dir, f"{split}.jsonl")
            write_jsonl(rows, path)
            print(f"wrote {len(rows)} rows to {path}")
    except PrepError as e:
        print(f"prepare_gsm8k: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
