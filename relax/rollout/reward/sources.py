"""Where rewards come from, chosen once from the rewards section: the one builder
(:func:`reward_source`) of the training rewards (relax/rollout/reward/scoring.py's
``Scorer``) and of the evaluation rewards (relax/eval/sets.py).

    source = reward_source(cfg.rollout.rewards, builtin_task=..., gym_answer=..., judge=...)
    values, failures = source.score(prompts, responses, labels, group_index, rank=r, ...)
    source.batch_fn(prompts, responses, labels) -> list[float]      evaluation's call

The sources, in the builder's order: the generative judge (``--rm-type genrm``, loaded by
judge.py), the reward server (``--rm-type remote_rm``, remote_reward.py), and a reward
function (rewards.py: ``--custom-rm-path``, a built-in task's, reasoning-gym's, math),
called per prompt's samples with ``--group-rm`` (group_rewards.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from relax.errors import RewardError
from relax.rollout.reward.group_rewards import by_prompt_runs, score_groups
from relax.rollout.reward.remote_reward import RemoteRewardModel
from relax.rollout.reward.rewards import RewardFn, build_reward_fn, score_with_errors


class RewardSource(Protocol):
    """``name``: for messages; ``bounded``: whether Relax bounds each call by
    ``--reward-timeout`` (a reward server bounds its requests itself); ``batch_fn``: the
    rewards of a batch whose samples of one prompt sit side by side (evaluation's call)."""

    name: str
    bounded: bool
    batch_fn: RewardFn

    def score(self, prompts: list[str], responses: list[str], labels: list,
              group_index: list[int], *, rank: int, timeout: float | None,
              policy: str) -> tuple[list[float], list[str]]:
        """One rank's rewards [B] (``group_index``: each sample's group on this rank) and
        the messages of the samples scored 0 under ``policy`` (--reward-error-policy);
        samples are numbered over ranks, this ``rank``'s after the lower ranks'."""
        ...


@dataclass(frozen=True)
class JudgeReward:
    """``--rm-type genrm``: the judge's verdicts (the trainer's own model code, bounded by
    its token limit: no failures to count)."""

    judge: object
    name: str
    bounded = True

    def score(self, prompts, responses, labels, group_index, *, rank, timeout, policy):
        return self.judge(prompts, responses, labels), []

    @property
    def batch_fn(self) -> RewardFn:
        return self.judge


@dataclass(frozen=True)
class ServerReward:
    """``--rm-type remote_rm``: the reward server of ``--rm-url``."""

    remote: RemoteRewardModel
    bounded = False

    @property
    def name(self) -> str:
        return self.remote.name

    def score(self, prompts, responses, labels, group_index, *, rank, timeout, policy):
        """The server's metadata names each sample and its group over all ranks (this rank's
        groups are numbered after the lower ranks')."""
        index_base = rank * len(prompts)
        groups_before = rank * (max(group_index) + 1 if group_index else 0)
        metadata = [{"index": index_base + i, "group_index": groups_before + g}
                    for i, g in enumerate(group_index)]
        values, errors = self.remote.score(prompts, responses, labels, metadata=metadata,
                                           index_base=index_base)
        failures = [e for e in errors if e is not None]
        if failures and policy == "raise":
            more = f" (and {len(failures) - 1} more samples failed)" if len(failures) > 1 else ""
            raise RewardError(failures[0] + more)
        return [0.0 if e is not None else v for v, e in zip(values, errors, strict=True)], failures

    @property
    def batch_fn(self) -> RewardFn:
        return self.remote


@dataclass(frozen=True)
class FunctionReward:
    """A reward function (rewards.py), called per prompt's samples with ``group``
    (``--group-rm``, group_rewards.py); each call bounded by ``--reward-timeout``."""

    fn: RewardFn
    name: str
    group: bool
    bounded = True

    def score(self, prompts, responses, labels, group_index, *, rank, timeout, policy):
        index_base = rank * len(prompts)
        if self.group:
            return score_groups(self.fn, prompts, responses, labels, group_index,
                                name=self.name, index_base=index_base, timeout=timeout,
                                policy=policy)
        return score_with_errors(self.fn, prompts, responses, labels, name=self.name,
                                 index_base=index_base, timeout=timeout, policy=policy)

    @property
    def batch_fn(self) -> RewardFn:
        return by_prompt_runs(self.fn, self.name) if self.group else self.fn


def reward_source(rewards, *, builtin_task: str | None, gym_answer: str | None,
                  judge=None, check: bool = False) -> RewardSource:
    """The source of ``rewards`` (``cfg.rollout.rewards``): ``judge`` when given (--rm-type
    genrm), the server of --rm-type remote_rm (``check``: something must accept connections
    at --rm-url, else InputError, exit 2), else the reward function of --custom-rm-path,
    --rm-type or the ``builtin_task`` (a built-in task scores with its own reward unless
    told otherwise), or with neither the reasoning-gym verifier of ``gym_answer`` (its
    --reasoning-gym-answer format, for reasoning-gym data), else math."""
    if judge is not None:
        return JudgeReward(judge, f"--genrm-model-path {rewards.genrm_model_path}")
    rm_type = rewards.rm_type or builtin_task
    if rm_type == "remote_rm":
        remote = RemoteRewardModel.of(rewards)
        if check:
            remote.check_reachable()
        return ServerReward(remote)
    fn, name = build_reward_fn(rewards.custom_rm_path, rm_type, gym_answer=gym_answer)
    return FunctionReward(fn, name, group=rewards.group_rm)
