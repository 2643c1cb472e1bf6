"""relax/trainer/fully_async/publish.py: where the weights go after a step is an object chosen once, not a
branch in the loop: the rollout ranks (--fully-async: every step, the remote collector knows
which versions a batch needs), or the rank's rollout backend: nowhere for Relax's engine,
the vLLM servers when due, and a resumed run's weights before its first step."""

from __future__ import annotations

import contextlib

from relax.rollout.backends.local import LocalBackend
from relax.trainer.fully_async.publish import ToBackend, ToRolloutRanks, publisher_for


class Recorder:
    def __init__(self, due_every=2):
        self.calls, self.due_every = [], due_every
        self.module = "module"

    def __call__(self, phase):  # a Timer
        self.calls.append(("time", phase))
        return contextlib.nullcontext()

    def start(self, step):
        self.calls.append(("start", step))

    def publish(self, version):
        self.calls.append(("publish", version))

    def due(self, version):
        return version % self.due_every == 0

    def push(self, module, version, tracker):
        self.calls.append(("push", module, version))


def test_each_placement_gets_its_publisher():
    r = Recorder()
    local = LocalBackend("cpu")
    assert isinstance(publisher_for(r, local, layout=None, policy=r, timer=r, tracker=r),
                      ToBackend)
    assert isinstance(publisher_for(r, r, layout=None, policy=r, timer=r, tracker=r), ToBackend)
    assert isinstance(publisher_for(r, local, layout="async", policy=r, timer=r, tracker=r),
                      ToRolloutRanks)


def test_the_rollout_ranks_start_and_get_every_version_the_collector_asks_for():
    r = Recorder()
    p = ToRolloutRanks(r, r)
    p.start(3, resumed=True)
    p.publish(4)
    assert r.calls == [("start", 3), ("time", "weight_sync"), ("publish", 4)]


def test_vllm_servers_get_the_weights_when_due_and_a_resumed_runs_at_start():
    r = Recorder(due_every=2)
    p = ToBackend(r, r, r, r)
    p.start(0, resumed=False)
    p.publish(1)
    assert r.calls == []
    p.publish(2)
    p.start(5, resumed=True)
    assert r.calls == [("time", "weight_sync"), ("push", "module", 2), ("push", "module", 5)]
    local = ToBackend(LocalBackend("cpu"), r, r, r)  # the sampler reads the trained module
    local.start(1, resumed=True)
    local.publish(1)
    assert r.calls[3:] == []
