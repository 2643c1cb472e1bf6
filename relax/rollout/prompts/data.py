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

from relax.errors import InputError, invalid_text
from relax.rollout.prompts import reasoning_gym_source as gym
from relax.rollout.prompts.samples import PromptSample


def _keys(row: dict) -> str:
    keys = sorted(map(str, row))
    return repr(keys[:10])[:-1] + (", ...]" if len(keys) > 10 else "]")


def _check_prompt(prompt, where: str, input_key: str):
    """A non-blank string, or a non-empty list of chat messages with string contents."""
    what = f"{where}: key {input_key!r}"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError(f"{what} is an empty prompt")
        if invalid_text(prompt):
            raise InputError(f"{what}: {invalid_text(prompt)}")
        return
    if not isinstance(prompt, list):
        raise InputError(f"{what} must be a non-empty string or message list, got "
                         f"{type(prompt).__name__}")
    if not prompt:
        raise InputError(f"{what} is an empty message list")
    for j, msg in enumerate(prompt):
        if not (isinstance(msg, dict) and isinstance(msg.get("content"), str)
                and isinstance(msg.get("role", ""), str)):
            raise InputError(f"{what}: message {j} must be an object with string 'role' and "
                             "'content'")
    for j, msg in enumerate(prompt):
        bad = invalid_text(msg["content"]) or invalid_text(msg.get("role", ""))
        if bad:
            raise InputError(f"{what}: message {j}: {bad}")
    if not any(m["content"].strip() for m in prompt):
        raise InputError(f"{what} is an empty prompt (every message content is blank)")


def _check_privileged(row: dict, where: str, key: str) -> str:
    """The row's privileged information (--opd-type self): a non-blank string."""
    flag = "--opsd-privileged-info-key"
    if key not in row:
        raise InputError(f"{where}: missing key {key!r} ({flag}); keys: {_keys(row)}")
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: key {key!r} ({flag}) must be a non-blank string, got "
                         f"{type(value).__name__ if not isinstance(value, str) else 'blank'}")
    if invalid_text(value):
        raise InputError(f"{where}: key {key!r} ({flag}): {invalid_text(value)}")
    return value


def _check_row(row, where: str, input_key: str, label_key: str, need_label: bool,
               privileged_key: str | None = None):
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if input_key not in row:
        raise InputError(f"{where}: missing key {input_key!r} (--input-key); keys: {_keys(row)}")
    _check_prompt(row[input_key], where, input_key)
    if need_label and label_key not in row:
        raise InputError(f"{where}: missing key {label_key!r} (--label-key); keys: {_keys(row)}")
    if need_label and row[label_key] is None:
        raise InputError(f"{where}: key {label_key!r} (--label-key) is null")
    if isinstance(row.get(label_key), str) and invalid_text(row[label_key]):
        raise InputError(f"{where}: key {label_key!r} (--label-key): "
                         f"{invalid_text(row[label_key])}")
    privileged = None if privileged_key is None else _check_privileged(row, where, privileged_key)
    return PromptSample(row[input_key], row.get(label_key), where, privileged)


# A line is read at most this long: a prompt of 8 MiB is millions of tokens, beyond any model's
# context, and reading (then tokenizing) an unbounded line can exhaust memory first.
MAX_LINE_BYTES = 8 << 20


def _jsonl_rows(path: str, max_line_bytes: int = MAX_LINE_BYTES):
    """(line number, parsed row) of every non-blank line; errors name ``path:line``."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""),
                                     start=1):
            if len(raw) > max_line_bytes:
                raise InputError(f"{path}:{lineno}: line longer than {max_line_bytes >> 20} MiB; "
                                 "no prompt of that size fits a model context")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 (byte {e.start})") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            except RecursionError:
                raise InputError(f"{path}:{lineno}: JSON nested too deeply") from None


def load_prompt_data(
    path: str, input_key: str, label_key: str, *, need_label: bool = True,
    privileged_key: str | None = None,
) -> list[PromptSample]:
    """Read every row of a ``.jsonl`` (one JSON object a line) or ``.parquet`` file.

    Every failure is an :class:`InputError` naming ``file:line`` (``file:row N`` for parquet)
    and, where it applies, the key: invalid UTF-8 or JSON, a row that is not an object, a
    missing key, a prompt that is not a string or message list, an empty prompt, a null label,
    and with ``privileged_key`` (--opd-type self) a row without that key or a value that is not
    a non-blank string.
    """
    if not os.path.isfile(path):
        raise InputError(f"--prompt-data {path}: no such file")
    samples = []
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:
            raise InputError(f"--prompt-data {path}: not a readable parquet file: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        for i, row in enumerate(rows):
            samples.append(_check_row(row, f"{path}:row {i + 1}", input_key, label_key, need_label,
                                      privileged_key))
    else:
        for lineno, row in _jsonl_rows(path):
            samples.append(_check_row(row, f"{path}:{lineno}", input_key, label_key, need_label,
                                      privileged_key))
    if not samples:
        raise InputError(f"--prompt-data {path}: the dataset is empty")
    return samples


def load_source(spec: str, flag: str, rollout, *, role: str,
                privileged_key: str | None = None) -> list[PromptSample]:
    """The prompts of ``--prompt-data`` or one ``--eval-prompt-data`` set: a reasoning-gym
    dataset (``reasoning-gym:NAME?...``, generated here) or a data file; ``rollout`` is the
    rollout section (its ``data``, and whether ``rewards`` needs labels).
    ``privileged_key``: the field each row must hold for ``--opd-type self``
    (``--opsd-privileged-info-key``; training rows only)."""
    data = rollout.data
    if gym.is_reasoning_gym(spec):
        return gym.load_samples(gym.parse_spec(spec, flag, role=role), flag,
                                answer_format=data.reasoning_gym_answer,
                                system_prompt=data.system_prompt)
    return load_prompt_data(spec, data.input_key, data.label_key,
                            need_label=rollout.rewards.custom_rm_path is None,
                            privileged_key=privileged_key)


def report_overlap(train: list[PromptSample], eval_sets, *, report=print) -> dict[str, int]:
    """Count, per evaluation set, the prompts that also appear in the training data.

    ``eval_sets`` holds objects with ``name`` and ``prompts``. Prompts compare as their JSON
    text (a question with the same system message is the same prompt). A set with overlap gets
    one warning through ``report``: held-out numbers on it are partly in-sample.
    """
    def key(prompt):
        return json.dumps(prompt, sort_keys=True, ensure_ascii=False)

    seen = {key(s.prompt) for s in train}
    counts = {}
    for eval_set in eval_sets:
        n = sum(key(p) in seen for p in eval_set.prompts)
        counts[eval_set.name] = n
        if n:
            report(f"relax train: warning: {n} of {len(eval_set.prompts)} prompts of evaluation "
                   f"set {eval_set.name!r} also appear in --prompt-data ({len(seen)} distinct "
                   "training prompts); its metrics are partly in-sample")
    return counts


def check_prompt_lengths(samples, texts: list[str], count_tokens, *, max_response: int,
                         context: int | None,
                         length_flag: str = "--rollout-max-response-len") -> None:
    """Every prompt must tokenize to something and fit the model context with a full response.

    ``texts`` are the formatted prompts of ``samples`` (same order); ``count_tokens(text)``
    gives a prompt's token count. Prompts are never truncated silently: a prompt that does not
    fit is an error naming its ``file:line`` and how many prompts do not fit.
    """
    too_long = []
    for sample, text in zip(samples, texts, strict=True):
        n = count_tokens(text)
        if n == 0:
            raise InputError(f"{sample.source}: the prompt tokenizes to nothing")
        if context is not None and n + max_response > context:
            too_long.append((sample, n))
    if too_long:
        sample, n = too_long[0]
        raise InputError(
            f"{sample.source}: prompt of {n} tokens + {length_flag} {max_response} "
            f"exceeds the model context of {context} tokens ({len(too_long)} of {len(samples)} "
            f"prompts do not fit); shorten or drop them, or lower {length_flag}")


def check_formatted_lengths(tokenizer, samples, *, apply_chat_template: bool,
                            system_prompt: str | None, max_response: int,
                            context: int | None,
                            length_flag: str = "--rollout-max-response-len") -> None:
    """:func:`check_prompt_lengths` of ``samples`` formatted as the model will see them."""
    texts = [format_prompt(tokenizer, s.prompt, apply_chat_template=apply_chat_template,
                           system_prompt=system_prompt) for s in samples]
    lengths = {t: len(ids) for t, ids in zip(
        texts, tokenizer(texts, add_special_tokens=False)["input_ids"], strict=True)}
    check_prompt_lengths(samples, texts, lengths.__getitem__, max_response=max_response,
                         context=context, length_flag=length_flag)


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

    def position(self, step: int) -> dict[str, int]:
        """Data position before rollout ``step``: epoch and prompts consumed in it."""
        return self.position_at(step * self.batch_size)

    def position_at(self, cursor: int) -> dict[str, int]:
        """Epoch and index in it of the prompt stream position ``cursor`` (prompts drawn so
        far; dynamic sampling draws more than one batch per rollout step)."""
        if self.samples is None:
            return {"epoch": 0, "index": cursor}
        epoch, index = divmod(cursor, self.steps_per_epoch * self.batch_size)
        return {"epoch": epoch, "index": index}

    def take(self, cursor: int, count: int) -> list[PromptSample]:
        """``count`` prompts of the stream from position ``cursor``: the batches of consecutive
        rollout steps laid end to end, so ``take(step * batch_size, batch_size)`` is
        ``batch(step)``."""
        out, batches = [], {}
        for position in range(cursor, cursor + count):
            step, j = divmod(position, self.batch_size)
            if step not in batches:
                batches[step] = self.batch(step)
            out.append(batches[step][j])
        return out

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
