"""Small run-time helpers of the training loop: the phase timer (``Timer``), the peak memory
of the device (``peak_memory_gb``) and the rows of ``metrics.jsonl`` after a step
(``rows_after``, for a resumed run)."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections import defaultdict

import torch

from relax.metrics.sinks import read_rows


class Timer:
    """Wall time per named phase, summed within a rollout step."""

    def __init__(self, device: torch.device):
        self.device, self.totals = device, defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # kernels are asynchronous
        self.totals[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        """``seconds`` measured elsewhere, counted under ``name``."""
        self.totals[name] += seconds

    def pop(self) -> dict[str, float]:
        out, self.totals = dict(self.totals), defaultdict(float)
        return out


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)


def rows_after(path: str, step: int) -> int:
    """Rows of ``metrics.jsonl`` for steps after ``step`` (0 when there is no file)."""
    if not os.path.isfile(path):
        return 0
    # a torn line (row None) is not counted; the sink cuts it when it opens the file
    return sum(row is not None and row["rollout/step"] > step
               for _, _, row in read_rows(path, errors="replace"))
