"""Prompt data: jsonl/parquet files or a built-in task, served one rollout step at a time.

The prompts of a rollout step depend only on (seed, step) -- the order of a dataset epoch is a
permutation seeded by (seed, epoch) with ``--rollout-shuffle``, the built-in task draws from a
``random.Random`` seeded by (seed, step) -- so a resumed run sees exactly the prompts an
uninterrupted run would have seen, with no loader state to save.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Any

from relax.trainer.errors import InputError


@dataclass(frozen=True)
class PromptSample:
    prompt: Any  # a string, or a list of chat messages ({"role", "content"}) in data files
    label: Any
    source: str  # "file:line" (or "task:step") for error messages


def _check_row(row, where: str, input_key: str, label_key: str, need_label: bool):
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if input_key not in row:
        raise InputError(f"{where}: missing key {input_key!r} (--input-key); keys: {sorted(row)}")
    prompt = row[input_key]
    if not (isinstance(prompt, str) or isinstance(prompt, list)) or not prompt:
        raise InputError(f"{where}: key {input_key!r} must be a non-empty string or message list")
    if need_label and label_key not in row:
        raise InputError(f"{where}: missing key {label_key!r} (--label-key); keys: {sorted(row)}")
    return PromptSample(prompt, row.get(label_key), where)


def load_prompt_data(
    path: str, input_key: str, label_key: str, *, need_label: bool = True
) -> list[PromptSample]:
    """Read every row of a ``.jsonl`` (one JSON object a line) or ``.parquet`` file."""
    if not os.path.isfile(path):
        raise InputError(f"--prompt-data {path}: no such file")
    samples = []
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:
            raise InputError(f"--prompt-data {path}: not a readable parquet file: {e}") from e
        for i, row in enumerate(rows):
            samples.append(_check_row(row, f"{path}:row {i + 1}", input_key, label_key, need_label))
    else:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                samples.append(_check_row(row, f"{path}:{lineno}", input_key, label_key, need_label))
    if not samples:
        raise InputError(f"--prompt-data {path}: the dataset is empty")
    return samples


class PromptSource:
    """The global list of prompts for each rollout step (every rank computes the same list)."""

    def __init__(self, *, batch_size: int, seed: int, samples=None, task=None, shuffle=False):
        self.batch_size, self.seed, self.samples, self.task = batch_size, seed, samples, task
        self.shuffle = shuffle
        if samples is not None and len(samples) < batch_size:
            raise InputError(
                f"--prompt-data has {len(samples)} prompts, fewer than --rollout-batch-size "
                f"{batch_size}"
            )

    @property
    def steps_per_epoch(self) -> int | None:
        return None if self.samples is None else len(self.samples) // self.batch_size

    def batch(self, step: int) -> list[PromptSample]:
        """The ``batch_size`` prompts of rollout ``step`` (0-based)."""
        if self.samples is None:
            rng = random.Random(f"{self.seed}:{step}")  # str seeds hash deterministically
            return [
                PromptSample(*self.task.sample(rng), f"{self.task.name}:{step}")
                for _ in range(self.batch_size)
            ]
        epoch, k = divmod(step, self.steps_per_epoch)  # the last partial batch is dropped
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"{self.seed}:epoch{epoch}").shuffle(order)
        return [self.samples[j] for j in order[k * self.batch_size : (k + 1) * self.batch_size]]


def format_prompt(tokenizer, prompt, *, apply_chat_template: bool, system_prompt: str | None):
    """The prompt text fed to the model."""
    if apply_chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if system_prompt and messages[0].get("role") != "system":
            messages = [{"role": "system", "content": system_prompt}, *messages]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if isinstance(prompt, list):
        prompt = "\n".join(str(m.get("content", "")) for m in prompt)
    return f"{system_prompt}\n{prompt}" if system_prompt else prompt
