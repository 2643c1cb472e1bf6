"""Evaluation inside ``relax train`` (``--eval-interval``), and the evaluation sets and
scoring that ``relax eval`` (relax/eval/command.py) shares with it.

The trainer (``Trainer.evaluate`` in ``relax/trainer/loop.py``) calls, once per rollout step
and on every rank (evaluation is a collective under data parallelism), after the update and
before the step's metrics are written::

    maybe_evaluate(cfg.evaluation, cfg.rollout, cfg.system, step, self.model, self.tokenizer,
                   self.ctx.device, seed=cfg.run.seed, group=self.ctx.group,
                   eval_sets=self.eval_sets)

where ``step`` is the 1-based number of finished rollout steps and ``self.eval_sets =
load_eval_sets(cfg.evaluation, cfg.rollout)`` was built in ``Trainer.__init__`` (so a bad
evaluation file fails before any model is loaded). It returns ``{}`` when no evaluation is due.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from relax import models
from relax.config.sections.evaluation import BUILTIN_EVAL_PROMPTS
from relax.errors import InputError
from relax.eval.env_eval import evaluate_episodes
from relax.eval.evaluate import EvalSampling, evaluate
from relax.rollout.agents.env_guard import guarded_factory
from relax.rollout.agents.envs import environment_factory
from relax.rollout.agents.episodes import turn_io
from relax.rollout.prompts.data import format_prompt, load_source
from relax.rollout.prompts.reasoning_gym_source import is_reasoning_gym
from relax.rollout.prompts.samples import PromptSample
from relax.rollout.prompts.tasks import get_task
from relax.rollout.reward.sources import reward_source


@dataclass(frozen=True)
class EvalSet:
    """One named evaluation set: raw prompts (text or chat messages), their labels, and
    whether it is a reasoning-gym source (scored by its own verifier without a reward flag)."""

    name: str
    prompts: list
    labels: list
    reasoning_gym: bool = False

    def as_samples(self) -> list:
        """The set as :class:`relax.rollout.prompts.data.PromptSample` s, named for error messages."""
        return [PromptSample(p, y, f"--eval-prompt-data {self.name} prompt {i + 1}")
                for i, (p, y) in enumerate(zip(self.prompts, self.labels, strict=True))]


def load_eval_sets(evaluation, rollout) -> list[EvalSet]:
    """The sets named by ``--eval-prompt-data`` (``evaluation``: the evaluation section; the
    files are read as the ``rollout`` section says), else the built-in task's fixed prompts.

    Raises :class:`relax.errors.InputError` naming the set and the file:line of a
    bad row.
    """
    if evaluation.eval_prompt_data:
        sets = []
        for name, path in evaluation.eval_prompt_data:
            try:
                rows = load_source(path, f"--eval-prompt-data {name}", rollout, role="eval")
            except InputError as e:
                message = str(e)
                raise InputError(message if message.startswith("--eval-prompt-data") else
                                 f"--eval-prompt-data {name}: {message}") from None
            sets.append(EvalSet(name, [r.prompt for r in rows], [r.label for r in rows],
                                reasoning_gym=is_reasoning_gym(path)))
        return sets
    task = get_task(rollout.data.builtin_task)
    # one fixed set per task, independent of --seed, so runs with different seeds compare
    rng = random.Random(f"relax-eval:{task.name}")
    pairs = [task.sample(rng) for _ in range(BUILTIN_EVAL_PROMPTS)]
    return [EvalSet(task.name, [p for p, _ in pairs], [y for _, y in pairs])]


def evaluate_sets(evaluation, rollout, system, sets: list[EvalSet], model, tokenizer, device, *,
                  seed: int, reward_timeout: float | None = None, step=None, group=None,
                  sync_group=None, make_sampler=None) -> dict[str, float]:
    """Every set, scored with the run's reward (``rollout``: its rewards and prompt format);
    sampled as ``evaluation`` says from ``seed``, in bf16 when ``system`` says so; adds
    ``perf/eval_time`` (seconds). ``reward_timeout``: relax train's --reward-timeout (relax
    eval has none: its config holds only the default), bounding a reward function's calls; a
    reward server bounds its requests itself. ``make_sampler``: relax/eval/evaluate.py
    ``evaluate``'s."""
    start = time.perf_counter()
    sampling = EvalSampling(evaluation, seed, system.bf16)
    metrics: dict[str, float] = {}
    for s in sets:
        # the run's reward (the reward server of --rm-type remote_rm only under relax train);
        # builtin_task is None when prompt files are given (resolution sets it so)
        source = reward_source(rollout.rewards, builtin_task=rollout.data.builtin_task,
                               gym_answer=(rollout.data.reasoning_gym_answer
                                           if s.reasoning_gym else None))
        texts = [format_prompt(tokenizer, p,
                               apply_chat_template=rollout.data.apply_chat_template,
                               system_prompt=rollout.data.system_prompt) for p in s.prompts]
        timeout = reward_timeout if source.bounded else None
        metrics.update(evaluate(
            model, tokenizer, texts, s.labels, source.batch_fn, sampling, name=s.name,
            step=step, device=device, group=group, sync_group=sync_group, reward_name=source.name,
            reward_timeout=timeout,
            make_sampler=make_sampler,
        ))
    metrics["perf/eval_time"] = time.perf_counter() - start
    return metrics


def evaluate_env(rollout, sampling: EvalSampling, model, tokenizer, device, *, step=None,
                 group=None, make_sampler=None) -> dict[str, float]:
    """``--env`` (``rollout``: ``cfg.rollout``, its data and episodes sections):
    ``--eval-episodes`` held-out episodes (relax/eval/env_eval.py) as ``eval/env/...``;
    adds ``perf/eval_time`` (seconds). ``make_sampler``: as :func:`evaluate_sets`'."""
    start = time.perf_counter()
    eos = tokenizer.eos_token_id
    data, env = rollout.data, rollout.episodes
    format_prompt, render = turn_io(
        tokenizer, apply_chat_template=data.apply_chat_template, system_prompt=data.system_prompt,
        eos_token_id=models.eos_token_ids(tokenizer, model)[0] if eos is None else eos)
    metrics = evaluate_episodes(
        model, tokenizer, guarded_factory(environment_factory(env.env, env.env_step_timeout),
                                          env.env_step_timeout),
        sampling, episodes=sampling.section.eval_episodes, max_turns=env.max_turns,
        format_prompt=format_prompt, render=render, name="env", step=step, device=device,
        group=group, make_sampler=make_sampler)
    metrics["perf/eval_time"] = time.perf_counter() - start
    return metrics


def maybe_evaluate(evaluation, rollout, system, step: int, model, tokenizer, device, *, seed: int,
                   group=None, eval_sets: list[EvalSet] | None = None,
                   last: bool = False) -> dict[str, float]:
    """Evaluate when ``--eval-interval`` divides ``step`` (1-based finished rollout steps;
    ``step`` 0 before training evaluates too) or ``step`` is the ``last`` one of a run that
    ends early (``--exit-duration-in-mins``), so it ends measured; else return ``{}`` at once.

    ``model`` may be the trainer's DDP or FSDP2 model: DDP is unwrapped, FSDP2 generation
    runs in lockstep over ``group``. Call it on every rank. ``evaluation``, ``rollout``,
    ``system``: relax train's sections; ``seed``: its --seed.
    """
    if not evaluation.eval_interval or (step % evaluation.eval_interval and not last):
        return {}
    if rollout.episodes.env:
        return evaluate_env(rollout, EvalSampling(evaluation, seed, system.bf16),
                            models.unwrap(model), tokenizer, device, step=step, group=group)
    sets = eval_sets if eval_sets is not None else load_eval_sets(evaluation, rollout)
    return evaluate_sets(evaluation, rollout, system, sets, models.unwrap(model), tokenizer,
                         device, seed=seed, reward_timeout=rollout.rewards.reward_timeout,
                         step=step,
                         group=group, sync_group=group if system.fsdp else None)
