"""Where the weights go after each rollout step: to the rollout ranks of ``--fully-async``
(relax/trainer/fully_async/remote_rollout.py), or to the rank's own rollout backend
(relax/rollout/backends/protocol.py), which takes them when due: never for Relax's engine,
which samples the trained module itself; every --update-weights-interval steps for vLLM.

    publisher = publisher_for(...)      relax/trainer/build.py
    publisher.start(step, resumed=...)  once the run is built: the rollout ranks begin, a
                                        resumed run's vLLM servers load its weights
    publisher.publish(step + 1)         after each step (every training rank calls it)
"""

from __future__ import annotations

from typing import Protocol


class Publisher(Protocol):
    def start(self, step: int, *, resumed: bool) -> None: ...
    def publish(self, version: int) -> None: ...


class ToRolloutRanks:
    """``--fully-async``: the weights a batch to come is sampled with (``remote``: the
    RemoteRollout collector, which knows the schedule)."""

    def __init__(self, remote, timer):
        self.remote, self.timer = remote, timer

    def start(self, step: int, *, resumed: bool) -> None:
        # also a run that ends without a step: the rollout ranks wait for their start first
        self.remote.start(step)

    def publish(self, version: int) -> None:
        with self.timer("weight_sync"):
            self.remote.publish(version)


class ToBackend:
    """The rank's own rollout backend: the policy's weights when the backend says they are
    due (timed as ``weight_sync``), and a resumed run's before its first step (a vLLM server
    starts on --hf-checkpoint, not on the resumed step)."""

    def __init__(self, backend, policy, timer, tracker):
        self.backend, self.policy, self.timer, self.tracker = backend, policy, timer, tracker

    def start(self, step: int, *, resumed: bool) -> None:
        if resumed:
            self.backend.push(self.policy.module, step, self.tracker)

    def publish(self, version: int) -> None:
        if self.backend.due(version):
            with self.timer("weight_sync"):
                self.backend.push(self.policy.module, version, self.tracker)


def publisher_for(collector, backend, *, layout, policy, timer, tracker) -> Publisher:
    """``layout``: --fully-async's roles (None: colocated); ``backend``: the rank's."""
    if layout is not None:
        return ToRolloutRanks(collector, timer)
    return ToBackend(backend, policy, timer, tracker)
