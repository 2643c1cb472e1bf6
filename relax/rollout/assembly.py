"""The rollout side, built from the configuration: the one assembly of the colocated trainer
(relax/trainer/build.py) and of the rollout ranks of ``--fully-async``
(relax/trainer/fully_async/rollout_worker.py).

    inputs    = load_inputs(cfg)                    the prompt stream and the filter, once per
                                                    process, before any model is loaded
    scorer    = build_scorer(cfg, share, agree, judge=judge)
    envs      = build_environments(cfg.rollout, cfg.batches, share)   --env, one per episode
    collector = build_collector(cfg, share, agree, sampler, inputs=inputs, scorer=scorer,
                                envs=envs, ...)

``share`` is the data-parallel context the collector acts as (rank v of the training ranks:
its prompts and random streams), ``agree`` how the shares of a step agree
(relax/agreement.py): a collector built the same way samples the same batch on a
training rank and on a rollout rank, whatever the number of rollout ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.agreement import Agreement
from relax.rollout.collectors import Collector, DynamicSampling, PromptCollector
from relax.rollout.episode_collector import EpisodeCollector, build_environments
from relax.rollout.filters import load_group_filter
from relax.rollout.generation.sampler import SamplingParams
from relax.rollout.partial import PartialRollouts
from relax.rollout.partial_episodes import PartialEpisodes
from relax.rollout.prompts.data import PromptSource, load_source
from relax.rollout.prompts.tasks import get_task
from relax.rollout.reward.scoring import Scorer

__all__ = ["Inputs", "build_collector", "build_environments", "build_scorer", "load_inputs",
           "sampling_params", "turn_eos"]


@dataclass(frozen=True)
class Inputs:
    """What every share of a process reads: ``samples`` (None for a built-in task or an
    environment), the prompt ``source`` and ``--dynamic-sampling-filter-path``'s filter."""

    samples: list | None
    source: PromptSource
    group_filter: object | None


def load_inputs(cfg) -> Inputs:
    """The training data and the filter; bad input is one line naming the file (exit 2)."""
    samples = task = None
    if cfg.rollout.data.prompt_data:
        samples = load_source(cfg.rollout.data.prompt_data, "--prompt-data", cfg.rollout,
                              role="train", privileged_key=cfg.distillation.privileged_info_key)
    elif not cfg.rollout.episodes.env:  # an environment makes its own prompts
        task = get_task(cfg.rollout.data.builtin_task)
    source = PromptSource(batch_size=cfg.batches.rollout_batch_size, seed=cfg.run.seed,
                          samples=samples, task=task, shuffle=cfg.rollout.data.shuffle)
    group_filter = load_group_filter(cfg.batches.filter_path) if cfg.batches.filter_path else None
    return Inputs(samples, source, group_filter)


def build_scorer(cfg, share, agree: Agreement, *, samples, judge=None) -> Scorer:
    """The share's rewards: the reward function, server or ``judge`` (--rm-type genrm), and
    the post-processing plug-in."""
    return Scorer(cfg.rollout, share,
                  builtin_task=None if samples is not None else cfg.rollout.data.builtin_task,
                  post_process_path=cfg.algorithm.reward_post_process_path, judge=judge,
                  agree=agree)


def sampling_params(cfg) -> SamplingParams:
    s = cfg.rollout.sampling
    return SamplingParams(s.temperature, s.top_p, s.top_k)


def turn_eos(tokenizer, eos_token_ids: list[int]) -> int:
    """The token that ends an episode's model turn: the tokenizer's EOS, else the model's
    first (``eos_token_ids``, relax/models.py ``eos_token_ids``)."""
    eos = tokenizer.eos_token_id
    return eos_token_ids[0] if eos is None else eos


def build_collector(cfg, share, agree: Agreement, sampler, *, inputs: Inputs, scorer,
                    tokenizer, envs, context: int | None, eos_token_id: int, timer,
                    tracker) -> Collector:
    """Episodes (--env, --use-agentic-rollout), partial rollouts, or prompt groups, with
    dynamic sampling around prompt groups when a filter is set (partial rollouts filter each
    group once it completes; the configuration refuses a filter with episodes). ``sampler``:
    relax/rollout/generation/sampler.py's or a vLLM server's; ``context``: the model's maximum
    positions; ``eos_token_id``: :func:`turn_eos`; ``timer`` / ``tracker``: the share's phase
    times and metrics."""
    rollout, batches = cfg.rollout, cfg.batches
    parts = dict(seed=cfg.run.seed, source=inputs.source, tokenizer=tokenizer, scorer=scorer,
                 timer=timer, tracker=tracker, sampler=sampler, agree=agree)
    carry = dict(max_aborted=rollout.partial.max_aborted_count,
                 mask_offpolicy=rollout.partial.mask_off_policy)
    if rollout.episodes.env or rollout.episodes.agentic:
        parts.update(envs=envs, context=context, eos_token_id=eos_token_id)
        if rollout.partial.enabled:  # --env only (the configuration refuses agents)
            return PartialEpisodes(rollout, batches, share, **parts, **carry)
        return EpisodeCollector(rollout, batches, share, **parts)
    if rollout.partial.enabled:  # a filter judges each group once, when it completes
        return PartialRollouts(rollout, batches, share, **parts, **carry,
                               group_filter=inputs.group_filter,
                               filter_timeout=rollout.rewards.timeout)
    collector = PromptCollector(rollout, batches, share, **parts)
    if inputs.group_filter is None:
        return collector
    return DynamicSampling(batches, share, collector, inputs.group_filter, tracker=tracker,
                           filter_timeout=rollout.rewards.timeout)
