"""A rollout's rewards: the source the rewards section names (relax/rollout/reward/sources.py:
the judge, the reward server, or a reward function, per sample or per group) over this
rank's samples, its failures counted and agreed between ranks, and
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
from relax.rollout.reward.sources import reward_source

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
        # before any model is loaded: an unreachable --rm-url exits 2 naming it
        self.source = reward_source(
            rollout.rewards, builtin_task=builtin_task, judge=judge, check=True,
            gym_answer=(rollout.data.reasoning_gym_answer
                        if is_reasoning_gym(rollout.data.prompt_data) else None))
        self.timeout = rollout.rewards.reward_timeout
        self.error_policy = rollout.rewards.reward_error_policy
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
                values, failures = self.source.score(
                    prompts, responses, labels, group_index.tolist(), rank=self.ctx.rank,
                    timeout=self.timeout, policy=self.error_policy)
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
