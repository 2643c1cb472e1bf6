"""The rollout phase of ``--env`` and ``--use-agentic-rollout``: this rank's episodes of a step.

Both sources turn a step into the same thing, an :class:`~relax.rollout.episodes.EpisodeRollout`
whose samples are whole episodes (the environment's or the agent's messages as holes of the
loss mask), so the loop's training phases are those of single-turn prompts. The difference
is how failures count: an environment that raises follows ``--reward-error-policy`` (it is the
reward's code), an agent program that fails is always contained (it is a separate program that
may crash or hang for reasons of its own).
"""

from __future__ import annotations

import sys

from relax.collectives import seed_for
from relax.errors import RewardError
from relax.rollout.agent_server import AgentRunner
from relax.rollout.envs import environment_factory
from relax.rollout.episodes import HELDOUT_SEED, run_episodes, turn_io
from relax.trainer.distributed import raise_together


class EpisodeSource:
    """``play(step, sample)`` -> (episodes, labels) for one rank. Environments are built at
    construction, before any model is loaded, so bad input stops the run early; the agent
    endpoint starts with the first step (it needs the tokenizer) and stops at ``close``."""

    def __init__(self, cfg, ctx):
        self.cfg, self.ctx = cfg, ctx
        self.per_rank = cfg.rollout_batch_size // ctx.world_size
        self.envs = self.agents = None
        if cfg.env:
            make_env = environment_factory(cfg.env)  # one per episode this rank plays
            self.envs = [make_env() for _ in range(self.per_rank * cfg.n_samples_per_prompt)]

    def play(self, step: int, sample, *, tracker, tokenizer, eos_token_id: int,
             context: int | None, prompts):
        """``sample(ids, mask, max_new_tokens)``: the trainer's batched generation;
        ``tracker`` counts the failed episodes; ``prompts``: the run's PromptSource (agent
        inputs)."""
        if self.envs is not None:
            played, labels = self._environments(step, sample, tokenizer, eos_token_id, context)
            tracker.add_sum("rollout/reward_errors", len(played.errors))
        else:
            played, labels = self._agents(step, sample, tokenizer, eos_token_id, context,
                                          prompts)
            tracker.add_sum("rollout/agent_failures", len(played.failures))
        return played, labels

    def close(self) -> None:
        if self.agents is not None:
            self.agents.close()

    def _environments(self, step, sample, tokenizer, eos_token_id, context):
        """The n episodes of a group start from the same environment seed, so the group
        baseline compares plays of one game; seeds come from the run's seed, never from
        Python's global ``random`` (environments reseed it)."""
        cfg, n = self.cfg, self.cfg.n_samples_per_prompt
        first = step * cfg.rollout_batch_size + self.ctx.rank * self.per_rank
        # below HELDOUT_SEED: the evaluation's seeds are never trained on
        seeds = [seed_for(cfg.seed, "env", first + g) % HELDOUT_SEED
                 for g in range(self.per_rank) for _ in range(n)]
        format_prompt, render = turn_io(tokenizer, apply_chat_template=cfg.apply_chat_template,
                                        system_prompt=cfg.system_prompt,
                                        eos_token_id=eos_token_id)
        played = run_episodes(
            self.envs, seeds, tokenizer=tokenizer, format_prompt=format_prompt, render=render,
            sample=sample, max_turns=cfg.max_turns,
            max_turn_tokens=cfg.rollout_max_response_len, context=context,
            device=self.ctx.device,
        )
        error = None
        if played.errors and cfg.reward_error_policy == "raise":
            error = RewardError(f"--env {cfg.env}: {played.errors[0]} (--reward-error-policy "
                                "zero scores such episodes 0)")
        raise_together(error, self.ctx)
        self._warn(played.errors, "scored 0 (--reward-error-policy zero)")
        labels = [{"env_seed": s, "turns": k} for s, k in zip(seeds, played.turns, strict=True)]
        return played, labels

    def _agents(self, step, sample, tokenizer, eos_token_id, context, prompts):
        """One agent run per sample of this rank's prompt groups; a failed run scores 0."""
        cfg, n = self.cfg, self.cfg.n_samples_per_prompt
        if self.agents is None:
            self.agents = AgentRunner(
                cfg.agent_command, timeout_s=cfg.agent_timeout, max_turns=cfg.max_turns,
                max_turn_tokens=cfg.rollout_max_response_len, tokenizer=tokenizer,
                eos_token_id=eos_token_id, context=context, device=self.ctx.device)
        rank = self.ctx.rank
        batch = prompts.batch(step)[rank * self.per_rank:(rank + 1) * self.per_rank]
        base = (step * cfg.rollout_batch_size + rank * self.per_rank) * n
        inputs = [{"prompt": s.prompt, "label": s.label, "index": base + k, "step": step}
                  for k, s in enumerate(x for x in batch for _ in range(n))]
        played = self.agents.run(inputs, sample)
        self._warn(played.failures, "scored 0")
        return played, [x["label"] for x in inputs]

    def _warn(self, messages: list[str], outcome: str) -> None:
        prefix = f"[rank {self.ctx.rank}] " if self.ctx.world_size > 1 else ""
        for message in messages[:5]:  # a service that is down would flood the log
            print(f"relax train: warning: {prefix}{message}; {outcome}", file=sys.stderr)
        if len(messages) > 5:
            print(f"relax train: warning: {prefix}{len(messages) - 5} more episodes "
                  f"{outcome} in this step", file=sys.stderr)
