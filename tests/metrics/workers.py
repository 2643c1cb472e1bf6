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
    # global n = 5, sum w = 3, sum w^2 = 3: (sum w)^2 / (n sum w^2) = 9 / 15, not the mean of
    # the ranks' own 0.8 and 0.667
    t.add_ess("train/rollout_is_ess", [2, 3][rank], [2.0, 1.0][rank], [2.5, 0.5][rank])
    return t.reduce()
