"""Where the weights go after each rollout step: nowhere when the trainer samples with its own
model, to the rollout ranks of ``--fully-async`` (relax/trainer/fully_async/remote_rollout.py), or to the
vLLM servers of ``--rollout-backend vllm`` (relax/rollout/backends/vllm/vllm_backend.py).

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


class Colocated:
    """The sampler reads the trained module itself: nothing to send."""

    def start(self, step: int, *, resumed: bool) -> None:
        pass

    def publish(self, version: int) -> None:
        pass


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


class ToVllm:
    """``--rollout-backend vllm``: the servers every --update-weights-interval steps."""

    def __init__(self, vllm, policy, timer, tracker):
        self.vllm, self.policy, self.timer, self.tracker = vllm, policy, timer, tracker

    def start(self, step: int, *, resumed: bool) -> None:
        if resumed:  # the server holds --hf-checkpoint, not the resumed step
            self.vllm.push(self.policy.module, step, self.tracker)

    def publish(self, version: int) -> None:
        if self.vllm.due(version):
            with self.timer("weight_sync"):
                self.vllm.push(self.policy.module, version, self.tracker)


def publisher_for(collector, vllm, *, layout, policy, timer, tracker) -> Publisher:
    if layout is not None:
        return ToRolloutRanks(collector, timer)
    if vllm is not None:
        return ToVllm(vllm, policy, timer, tracker)
    return Colocated()
