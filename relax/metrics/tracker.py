"""Per-rollout-step metrics, reduced across data-parallel ranks in one place.

Ranks record LOCAL contributions with the reduction they need; :meth:`MetricTracker.reduce`
turns them into global values with two all-reduces (one SUM for sums and ratios, one MAX) and
returns plain floats that are identical on every rank:

- ``add_sum(name, v)``: global sum of ``v`` (e.g. generated tokens);
- ``add_ratio(name, num, den)``: ``sum(num) / sum(den)`` (e.g. mean response length);
- ``add_max(name, v)``: maximum over ranks (wall times, peak memory);
- ``add_global(name, v)``: a value already identical on every rank (the dispatcher's
  ``rollout/`` moments, a step's reduced train loss); repeated calls are averaged;
- ``add_ess(name, n, sum_w, sum_w2)``: the normalized effective sample size
  ``(sum w)^2 / (n sum w^2)`` of importance weights, from their global sums (in the SUM
  all-reduce: the sizes of ranks' shares do not average, they add).
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from relax.collectives import all_reduce


def effective_sample_size(count: float, total: float, squares: float) -> float:
    """``(sum w)^2 / (n sum w^2)`` in [0, 1] (1: every weight equal); NaN without tokens, 0
    when every weight is 0 (reinforce_plus_plus.md §7c)."""
    if count <= 0:
        return float("nan")
    return total * total / (count * squares) if squares > 0 else 0.0


def _as_float(v) -> float:
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


class MetricTracker:
    def __init__(self, group=None, device="cpu"):
        self.group, self.device = group, device
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # [num, den]
        self._kinds: dict[str, str] = {}
        self._max: dict[str, float] = {}
        self._global: dict[str, list[float]] = defaultdict(list)
        self._ess: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])

    def _kind(self, name: str, kind: str) -> None:
        if self._kinds.setdefault(name, kind) != kind:
            raise ValueError(f"metric {name} recorded as {self._kinds[name]} and as {kind}")

    def add_sum(self, name: str, value) -> None:
        self._kind(name, "sum")
        self._sums[name][0] += _as_float(value)

    def add_ratio(self, name: str, numerator, denominator) -> None:
        self._kind(name, "ratio")
        acc = self._sums[name]
        acc[0] += _as_float(numerator)
        acc[1] += _as_float(denominator)

    def add_max(self, name: str, value) -> None:
        self._kind(name, "max")
        self._max[name] = max(self._max.get(name, float("-inf")), _as_float(value))

    def add_global(self, name: str, value) -> None:
        self._kind(name, "global")
        self._global[name].append(_as_float(value))

    def add_ess(self, name: str, count, total, squares) -> None:
        self._kind(name, "ess")
        acc = self._ess[name]
        for k, v in enumerate((count, total, squares)):
            acc[k] += _as_float(v)

    def export(self) -> dict:
        """This process's records since the last reset, as plain data (then reset): what a
        rollout rank sends with a batch for the training rank to :meth:`merge`."""
        out = {"sums": {n: list(v) for n, v in self._sums.items()}, "kinds": dict(self._kinds),
               "max": dict(self._max), "global": {n: list(v) for n, v in self._global.items()},
               "ess": {n: list(v) for n, v in self._ess.items()}}
        self.reset()
        return out

    def merge(self, records: dict) -> None:
        """Add what :meth:`export` returned elsewhere, as if recorded here."""
        for name, (num, den) in records["sums"].items():
            self._kind(name, records["kinds"][name])
            self._sums[name][0] += num
            self._sums[name][1] += den
        for name, value in records["max"].items():
            self.add_max(name, value)
        for name, values in records["global"].items():
            for value in values:
                self.add_global(name, value)
        for name, values in records.get("ess", {}).items():
            self.add_ess(name, *values)

    def reduce(self) -> dict[str, float]:
        """Global values of everything recorded since the last reset (a collective call).

        Every rank must have recorded the same names (they run the same code path).
        """
        out: dict[str, float] = {}
        names, ess = sorted(self._sums), sorted(self._ess)
        if names or ess:
            flat = torch.tensor([x for n in names for x in self._sums[n]]
                                + [x for n in ess for x in self._ess[n]], dtype=torch.float64)
            flat = self._all_reduce(flat, dist.ReduceOp.SUM)
            pairs, triples = flat[:2 * len(names)].view(-1, 2), flat[2 * len(names):].view(-1, 3)
            for n, (count, total, squares) in zip(ess, triples.tolist(), strict=True):
                out[n] = effective_sample_size(count, total, squares)
            for n, (num, den) in zip(names, pairs.tolist(), strict=True):
                if self._kinds[n] == "sum":
                    out[n] = num
                else:
                    out[n] = num / den if den else float("nan")
        max_names = sorted(self._max)
        if max_names:
            t = torch.tensor([self._max[n] for n in max_names], dtype=torch.float64)
            for n, v in zip(max_names, self._all_reduce(t, dist.ReduceOp.MAX).tolist(),
                            strict=True):
                out[n] = v
        for n, values in self._global.items():
            out[n] = sum(values) / len(values)
        self.reset()
        return dict(sorted(out.items()))

    def _all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        if self.group is None:
            return t
        t = t.to(self.device)  # NCCL needs device tensors; Gloo takes CPU ones
        all_reduce(t, self.group, op)
        return t.cpu()
