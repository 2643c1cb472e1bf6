"""Where metrics go: a console summary line with a progress bar, metrics.jsonl, TensorBoard,
Weights & Biases. Rank 0 writes; other ranks get a logger with no sinks (the no-op fallback),
so the training loop never asks who it is or what is installed.
"""

from __future__ import annotations

import json
import math
import os
import sys


class JsonlSink:
    """``metrics.jsonl``: one JSON object per rollout step, with ``rollout/step``.

    A resumed run appends to the file. Steps redone after a crash (those after the checkpoint
    the run resumed from) then appear twice: readers keep the LAST row of each step
    (:func:`final_view`, ``relax plot``). A line torn by a kill in the middle of a write is cut
    off when the file is reopened (it is always a step the resumed run writes again).
    """

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _drop_torn_line(path)
        self._f = open(path, "a", encoding="utf-8")  # append: a resumed run continues the file

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"rollout/step": step}
        # JSON has no NaN/Inf; write them as null rather than produce an unreadable line
        row.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class SamplesSink:
    """``samples.jsonl``: a few samples of every rollout step (``--log-samples N``).

    One JSON object per sample: ``step``, ``prompt`` (the text the model saw), ``response``,
    ``reward``, ``label``, ``response_length`` (tokens) and ``truncated``. Labels that JSON
    cannot hold are written as their ``str``. Like ``metrics.jsonl`` the file is appended to
    on resume; redone steps then appear twice (the later rows are the resumed run's).
    """

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _drop_torn_line(path)
        self._f = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_samples(self, step: int, rows: list[dict]) -> None:
        for row in rows:
            self._f.write(json.dumps({"step": step, **row}, default=str) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def spread_indices(count: int, total: int) -> list[int]:
    """``count`` indices spread evenly over ``range(total)`` (all of them when fewer):
    with groups stored one after another, they come from as many groups as possible."""
    if count >= total:
        return list(range(total))
    return [(k * total) // count for k in range(count)]


def samples_table(rows: list[dict]) -> str:
    """The samples of a step as a Markdown table (TensorBoard's text panel renders it)."""
    def cell(value) -> str:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        # a lone surrogate would make the protobuf writer raise: show it as an escape
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return text.replace("|", "\\|").replace("\n", "<br>")

    columns = ("prompt", "response", "reward", "label")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _drop_torn_line(path: str) -> None:
    """Cut a last line without its newline (a write interrupted by a kill)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        data = f.seek(0) or f.read()
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    print(f"relax train: warning: {path}: dropped a torn last line of {len(data) - keep} bytes "
          "(the run was killed while writing it)", file=sys.stderr)


def final_view(rows: list[dict]) -> list[dict]:
    """One row per ``rollout/step``, the last one written, in step order.

    After a resume, ``metrics.jsonl`` may hold a step twice: first from the interrupted run
    (written after its last checkpoint), then from the resumed run, which redid it. The later
    row is the one the final model's history went through.
    """
    last = {}
    for row in rows:
        last[int(row["rollout/step"])] = row
    return [last[s] for s in sorted(last)]


def read_rows(path: str, *, errors: str = "strict") -> list[tuple[int, str, dict | None]]:
    """Every non-blank line of a ``metrics.jsonl``: ``(line number, line, row)``, where ``row``
    is the JSON object, or None when the line is not an object with an integer
    ``rollout/step`` (a line torn by a kill, or not written by relax train).

    The one parser of the format :class:`JsonlSink` writes. Raises ``OSError`` and (with
    ``errors="strict"``) ``UnicodeDecodeError`` for the caller to word."""
    out = []
    with open(path, encoding="utf-8", errors=errors) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                row["rollout/step"] = int(row["rollout/step"])
            except (ValueError, KeyError, TypeError, OverflowError):
                row = None
            out.append((lineno, line, row))
    return out


def read_metrics(path: str) -> list[dict]:
    """The final view of a ``metrics.jsonl`` (``path`` is the file or its run directory)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    return final_view([row for _, _, row in read_rows(path) if row is not None])


class TensorBoardSink:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=log_dir)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._w.add_scalar(k, v, global_step=step)
        self._w.flush()

    def log_samples(self, step: int, rows: list[dict]) -> None:
        self._w.add_text("samples", samples_table(rows), global_step=step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WandbSink:
    def __init__(self, run_config: dict, output_dir: str):
        """A W&B run in ``output_dir`` recording ``run_config`` (the resolved configuration
        as a dict) as its config."""
        import wandb

        self._wandb = wandb
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "relax"), config=run_config, dir=output_dir
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        columns = ["step", "prompt", "response", "reward", "label"]
        data = [[step, r["prompt"], r["response"], r["reward"], json.dumps(r["label"], default=str)]
                for r in rows]
        self._run.log({"samples": self._wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self._run.finish()


# (metric, label, format) shown in the one-line summary of a rollout step
SUMMARY = (
    ("rollout/raw_reward", "reward", "{:.3f}"),
    ("rollout/response_length", "len", "{:.1f}"),
    ("rollout/truncated", "trunc", "{:.2f}"),
    ("train/pg_loss", "pg", "{:+.4f}"),
    ("train/kl_loss", "kl", "{:.2e}"),
    ("train/ppo_kl", "ppo_kl", "{:+.1e}"),
    # the sampler against the trainer, and what the corrections did (reinforce_plus_plus.md §7a)
    ("rollout/mismatch_k3", "mis_kl", "{:.1e}"),
    ("train/tis_clipfrac", "tis_clip", "{:.3f}"),
    ("train/opsm_masked_fraction", "opsm", "{:.3f}"),
    ("train/entropy", "ent", "{:.2f}"),
    ("train/grad_norm", "gnorm", "{:.3f}"),
    ("perf/step_time", "s", "{:.2f}"),
    ("perf/mfu", "mfu", "{:.2f}"),
    ("perf/generated_tokens_per_s", "tok/s", "{:.0f}"),
)


def summary_line(step: int, total: int | None, metrics: dict[str, float]) -> str:
    head = f"step {step}" + (f"/{total}" if total else "")
    parts = [head] + [
        f"{label} {fmt.format(metrics[k])}" for k, label, fmt in SUMMARY if k in metrics
    ]
    return " | ".join(parts)


class ConsoleSink:
    """A rich progress bar over rollout steps with one summary line printed per step."""

    def __init__(self, total_steps: int | None, start_step: int = 0, stream=None):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.total = total_steps
        console = Console(file=stream or sys.stderr)
        self._progress = Progress(
            TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), console=console, transient=False,
            disable=not console.is_terminal,  # logs and pipes get the summary lines only
        )
        self._task = self._progress.add_task("rollout", total=total_steps, completed=start_step)
        self._progress.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._progress.console.print(
            summary_line(step, self.total, metrics), highlight=False, soft_wrap=True
        )
        self._progress.update(self._task, completed=step)

    def close(self) -> None:
        self._progress.stop()


class MetricsLogger:
    """Fan-out to sinks; with no sinks it does nothing (non-zero ranks, tests)."""

    def __init__(self, sinks=()):
        self.sinks = list(sinks)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for s in self.sinks:
            s.log(step, metrics)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Rows of :class:`SamplesSink`; sinks without a sample view skip them."""
        if not rows:
            return
        for s in self.sinks:
            if hasattr(s, "log_samples"):
                s.log_samples(step, rows)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def build_logger(*, is_main: bool, output_dir: str, total_steps: int | None, start_step: int = 0,
                 console: bool = True, tensorboard: bool = False, wandb: bool = False,
                 run_config: dict | None = None, samples: bool = False) -> MetricsLogger:
    if not is_main:
        return MetricsLogger()
    sinks = [JsonlSink(os.path.join(output_dir, "metrics.jsonl"))]
    if samples:
        sinks.append(SamplesSink(os.path.join(output_dir, "samples.jsonl")))
    if console:
        sinks.append(ConsoleSink(total_steps, start_step))
    if tensorboard:
        sinks.append(TensorBoardSink(os.path.join(output_dir, "tensorboard")))
    if wandb:
        try:
            sinks.append(WandbSink(run_config or {}, output_dir))
        except ImportError:
            print("relax train: warning: wandb is not installed; --use-wandb ignored",
                  file=sys.stderr)
    return MetricsLogger(sinks)
