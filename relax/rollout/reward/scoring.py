"""A rollout's rewards: the reward function over this rank's samples (or over each group with
``--group-rm``, relax/rollout/reward/group_rewards.py; or the reward server of ``--rm-type remote_rm``,
relax/rollout/reward/remote_reward.py), its failures counted and agreed between ranks, and
``--custom-reward-post-process-path`` over the result.

Prompt rollouts call :meth:`Scorer.score`; episode rollouts have their rewards from the
environment or the agent and only call :meth:`Scorer.post_process`.
"""

from __future__ import annotations

import sys

import torch

from relax.agreement import Agreement, GroupAgreement
from relax.errors import InputError, RewardError, error_summary, stops_the_run, value_summary
from relax.plugins import call_plugin, load_function
from relax.rollout.prompts.reasoning_gym_source import is_reasoning_gym
from relax.rollout.reward.group_rewards import score_groups
from relax.rollout.reward.remote_reward import RemoteRewardModel
from relax.rollout.reward.rewards import build_reward_fn, score_with_errors

POST_PROCESS_FLAG = "--custom-reward-post-process-path"


class Scorer:
    """Rewards [B] float32 for one rank's samples; ``ctx`` gives rank, world size, group and
    device; ``tracker`` (relax/metrics/tracker.py) counts ``rollout/reward_errors``."""

    def __init__(self, rollout, ctx, *, builtin_task: str | None, post_process_path: str | None,
                 judge=None, agree: Agreement | None = None):
        """``rollout``: the configuration's section (relax/config/sections/); ``judge``: the
        GenerativeJudge of ``--rm-type genrm`` (relax/rollout/reward/judge.py loads it); ``agree``:
        how the shares of a step fail together (relax/agreement.py)."""
        self.ctx, self.judge = ctx, judge
        self.agree = agree or GroupAgreement(ctx.group, ctx.device)
        # a built-in task scores with its own reward unless told otherwise
        rm_type = rollout.rewards.rm_type or builtin_task
        self.remote = None
        if judge is not None:
            self.reward_fn, self.reward_name = judge, f"--genrm-model-path {rollout.rewards.genrm_model_path}"
        elif rm_type == "remote_rm":
            self.remote = RemoteRewardModel.of(rollout.rewards)
            self.remote.check_reachable()  # before any model is loaded: exit 2 naming --rm-url
            self.reward_fn, self.reward_name = self.remote, self.remote.name
        else:
            self.reward_fn, self.reward_name = build_reward_fn(
                rollout.rewards.custom_rm_path, rm_type,
                gym_answer=(rollout.data.reasoning_gym_answer if is_reasoning_gym(rollout.data.prompt_data)
                            else None))
        self.group_rm = rollout.rewards.group_rm
        self.timeout, self.error_policy = rollout.rewards.timeout, rollout.rewards.error_policy
        self.post_process_fn = (load_function(post_process_path, POST_PROCESS_FLAG)
                                if post_process_path else None)

    def score(self, prompts: list[str], responses: list[str], labels: list,
              group_index: torch.Tensor, *, tracker) -> torch.Tensor:
        """Rewards [B]; a bad reward names its sample (global index over ranks). No samples
        (a partial rollout round in which none of this rank's groups completed): no reward
        call, but the ranks' error agreement all the same."""
        values, error, failures = [], None, []
        try:
            if prompts:
                values, failures = self._score(prompts, responses, labels, group_index.tolist())
        except (RewardError, InputError) as e:  # InputError: a broken --group-rm function
            error = e  # (a signal's Interrupted passes through, as before)
        # read before agreeing: another share of a rollout rank may use the judge meanwhile
        unparsed = self.judge.unparsed if self.judge is not None and error is None else 0
        self.agree.raise_together(error)
        if self.judge is not None and prompts:  # verdicts without a yes/no word, scored 0
            tracker.add_ratio("rollout/genrm_unparsed", unparsed, len(prompts))
        # --reward-error-policy zero: counted in rollout/reward_errors and printed, never silent
        tracker.add_sum("rollout/reward_errors", len(failures))
        warn_some(failures, self.ctx, "samples", "scored 0 (--reward-error-policy zero)")
        rewards = torch.tensor(values, dtype=torch.float32, device=self.ctx.device)
        return self.post_process(rewards, group_index) if prompts else rewards

    def _score(self, prompts, responses, labels, group_index: list[int]):
        """Rewards [B] and the messages of the samples scored 0 under the error policy."""
        index_base = self.ctx.rank * len(prompts)
        if self.judge is not None:  # the trainer's own model code, bounded by its token limit
            return self.judge(prompts, responses, labels), []
        if self.remote is not None:
            return self._score_remote(prompts, responses, labels, group_index, index_base)
        if self.group_rm:
            return score_groups(self.reward_fn, prompts, responses, labels, group_index,
                                name=self.reward_name, index_base=index_base,
                                timeout=self.timeout, policy=self.error_policy)
        return score_with_errors(self.reward_fn, prompts, responses, labels,
                                 name=self.reward_name, index_base=index_base,
                                 timeout=self.timeout, policy=self.error_policy)

    def _score_remote(self, prompts, responses, labels, group_index, index_base):
        """The server's rewards; its metadata names each sample and its group over all ranks
        (this rank's groups are numbered after the lower ranks')."""
        groups_before = self.ctx.rank * (max(group_index) + 1 if group_index else 0)
        metadata = [{"index": index_base + i, "group_index": groups_before + g}
                    for i, g in enumerate(group_index)]
        values, errors = self.remote.score(prompts, responses, labels, metadata=metadata,
                                           index_base=index_base)
        failures = [e for e in errors if e is not None]
        if failures and self.error_policy == "raise":
            more = f" (and {len(failures) - 1} more samples failed)" if len(failures) > 1 else ""
            raise RewardError(failures[0] + more)
        return [0.0 if e is not None else v for v, e in zip(values, errors, strict=True)], failures

    def post_process(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        """``--custom-reward-post-process-path`` over rewards [B], checked; else unchanged."""
        if self.post_process_fn is None:
            return rewards
        returned = call_plugin(self.post_process_fn, POST_PROCESS_FLAG, rewards.clone(),
                               group_index.clone(), timeout=self.timeout)
        return plugin_tensor(returned, POST_PROCESS_FLAG, "finite rewards", rewards.shape,
                             device=self.ctx.device, finite_on=torch.ones_like(rewards, dtype=bool))


def plugin_tensor(returned, flag: str, what: str, shape, *, device, finite_on=None,
                  error=RewardError) -> torch.Tensor:
    """What a plug-in returned as a float32 tensor of ``shape`` on ``device``, finite where the
    bool tensor ``finite_on`` is True; anything else is one ``error`` line naming ``flag``,
    ``what`` it must return and a bounded description of what came back."""
    shape = tuple(shape)
    try:
        out = torch.as_tensor(returned).to(device=device, dtype=torch.float32)
    except Exception as e:  # nested too deeply, ragged, not numbers, a __len__ that raises
        if stops_the_run(e):
            raise
        raise error(f"{flag} must return {what} of shape {shape}, got "
                    f"{value_summary(returned)}: {error_summary(e)}") from None
    if tuple(out.shape) != shape:
        raise error(f"{flag} must return {what} of shape {shape}, got shape "
                    f"{tuple(out.shape)}: {value_summary(returned)}")
    if finite_on is not None and not torch.isfinite(out[finite_on]).all():
        raise error(f"{flag} must return {what} of shape {shape}, got non-finite values: "
                    f"{value_summary(returned)}")
    return out


def warn_some(messages: list[str], ctx, what: str, outcome: str) -> None:
    """The first five failure ``messages`` of a step, then a count: a reward service that is
    down would flood the log."""
    prefix = f"[rank {ctx.rank}] " if ctx.world_size > 1 else ""
    for message in messages[:5]:
        print(f"relax train: warning: {prefix}{message}; {outcome}", file=sys.stderr)
    if len(messages) > 5:
        print(f"relax train: warning: {prefix}{len(messages) - 5} more {what} {outcome} in "
              "this step", file=sys.stderr)
