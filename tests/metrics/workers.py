"""Per-rank worker for the tracker test (outside test files: spawned children import it)."""

import torch.distributed as dist

from relax.metrics.tracker import MetricTracker


def reduce_on_two_ranks():
    rank = dist.get_rank()
    t = MetricTracker(dist.group.WORLD)
    t.add_sum("perf/generated_tokens", [10, 30][rank])
    t.add_ratio("rollout/response_length", [10, 30][rank], [2, 6][rank])  # (10+30)/(2+6)
    t.add_max("perf/step_time", [1.5, 0.5][rank])
    t.add_global("rollout/raw_reward", 0.25)
    t.add_global("train/loss", 1.0)  # identical on every rank; averaged over calls
    t.add_global("train/loss", 2.0)
    return t.reduce()
