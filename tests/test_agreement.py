"""relax/agreement.py: the shares of a step agree, whichever processes play them.

A rollout rank of ``--fully-async`` playing several training ranks' shares in lockstep reduces
to what the training ranks reduce among themselves; a share that fails makes every share
raise, its own error first; one share alone needs no thread and no collective.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from relax.agreement import Agreement, GroupAgreement, Lockstep
from relax.errors import RelaxError, RewardError
from tests.agreement_workers import colocated as colocated_worker
from tests.agreement_workers import rounds, two_rollout_ranks
from tests.distributed_utils import run_distributed


def _expected(count: int) -> list[list[float]]:
    """Independent reference: the three reductions over shares 0 .. count - 1."""
    values = [[[v * 10.0 + r, -float(v)] for v in range(count)] for r in range(3)]
    return [[sum(c) for c in zip(*values[0], strict=True)],
            [max(c) for c in zip(*values[1], strict=True)],
            [min(c) for c in zip(*values[2], strict=True)]]


def test_three_shares_of_one_process_agree_like_three_ranks():
    lockstep = Lockstep(3, None, torch.device("cpu"), timeout_s=30)
    try:
        got = lockstep.run([lambda v=v: rounds(lockstep.share(v), v) for v in range(3)])
    finally:
        lockstep.close()
    assert got == [_expected(3)] * 3
    assert isinstance(lockstep.share(0), Agreement)


def test_one_share_alone_runs_on_the_calling_thread_without_collectives():
    lockstep = Lockstep(1, None, torch.device("cpu"), timeout_s=30)
    here = threading.get_ident()
    assert lockstep.run([lambda: (threading.get_ident(), rounds(lockstep.share(0), 4))]) == \
        [(here, [[40.0, -4.0], [41.0, -4.0], [42.0, -4.0]])]
    with pytest.raises(RewardError, match="mine"):
        lockstep.share(0).raise_together(RewardError("mine"))
    GroupAgreement(None, torch.device("cpu")).raise_together(None)
    # a rollout rank past the training ranks' count serves no share
    assert Lockstep(0, None, torch.device("cpu"), timeout_s=30).run([]) == []


def test_a_failing_share_makes_every_share_raise_with_its_own_error_first():
    for _ in range(20):  # the failing share may run before the others have woken
        lockstep = Lockstep(3, None, torch.device("cpu"), timeout_s=30)
        seen = []

        def play(v, lockstep=lockstep, seen=seen):
            agree = lockstep.share(v)
            agree.reduce(torch.zeros(1), dist.ReduceOp.SUM)
            try:
                agree.raise_together(RewardError("reward of share 1") if v == 1 else None)
            except RelaxError as e:
                seen.append((v, str(e)))
                raise

        with pytest.raises(RewardError, match="reward of share 1"):
            lockstep.run([lambda v=v: play(v) for v in range(3)])
        assert sorted(seen) == [(0, "another data-parallel rank failed; see its message"),
                                (1, "reward of share 1"),
                                (2, "another data-parallel rank failed; see its message")]


def test_a_share_that_crashes_between_agreements_does_not_leave_the_others_waiting():
    lockstep = Lockstep(2, None, torch.device("cpu"), timeout_s=60)

    def play(v):
        if v == 0:
            raise ValueError("crashed before agreeing")
        lockstep.share(v).reduce(torch.zeros(1), dist.ReduceOp.MAX)

    with pytest.raises(ValueError, match="crashed before agreeing"):
        lockstep.run([lambda v=v: play(v) for v in range(2)])


@pytest.mark.subprocess
def test_shares_spread_over_two_rollout_ranks_agree_like_the_training_ranks():
    """Three training ranks' shares on two rollout ranks (0 and 2 on one, 1 on the other)
    reduce to what three colocated ranks reduce."""
    colocated = run_distributed(colocated_worker, 3, 3, timeout=120)
    assert colocated == [_expected(3)] * 3
    spread = run_distributed(two_rollout_ranks, 2, 3,
                             timeout=120)
    assert spread[0] == {0: _expected(3), 2: _expected(3)} and spread[1] == {1: _expected(3)}
