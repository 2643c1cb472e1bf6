"""The rollout side, built from the configuration: the one assembly of the colocated trainer
(relax/trainer/build.py) and of the rollout ranks of ``--fully-async``
(relax/trainer/fully_async/rollout_worker.py).

    side = build_rollout_side(cfg, [(share, agree), ...], device=..., bf16=..., stop=stop)
        the prompt stream and the filter (load_inputs), the --rm-type genrm judge, and each
        share's --env environments and scorer: bad input exits 2 here
    side.check_lengths(tokenizer)              the judging prompts fit the judge
    collectors = side.collectors(cfg.rollout, cfg.batches, backend, seed=..., ...)
        one per share, all sampling through the rollout backend's one sampler (relax/rollout/backends/)

``share`` is the data-parallel context a collector acts as (rank v of the training ranks:
its prompts and random streams), ``agree`` how the shares of a step agree
(relax/agreement.py): a collector built the same way samples the same batch on a
training rank and on a rollout rank, whatever the number of rollout ranks. The parts
(:func:`load_inputs`, :func:`build_scorer`, :func:`build_collector`) are the side's steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.agreement import Agreement
from relax.rollout.backends.protocol import RolloutBackend
from relax.rollout.collectors import Collector, DynamicSampling, PromptCollector
from relax.rollout.episode_collector import EpisodeCollector, build_environments
from relax.rollout.filters import load_group_filter
from relax.rollout.generation.sampler import SamplingParams
from relax.rollout.partial import PartialRollouts
from relax.rollout.partial_episodes import PartialEpisodes
from relax.rollout.prompts.data import PromptSource, load_source
from relax.rollout.prompts.tasks import get_task
from relax.rollout.reward.judge import build_judge, check_judging_lengths
from relax.rollout.reward.scoring import Scorer

__all__ = ["Inputs", "RolloutSide", "Share", "build_collector", "build_environments",
           "build_rollout_side", "build_scorer", "load_inputs", "sampling_params", "turn_eos"]


@dataclass(frozen=True)
class Inputs:
    """What every share of a process reads: ``samples`` (None for a built-in task or an
    environment), the prompt ``source`` and ``--dynamic-sampling-filter-path``'s filter."""

    samples: list | None
    source: PromptSource
    group_filter: object | None


def load_inputs(rollout, batches, *, seed: int, privileged_key: str | None) -> Inputs:
    """The training data and the filter; bad input is one line naming the file (exit 2).
    ``rollout``, ``batches``: the configuration's sections; ``seed``: --seed;
    ``privileged_key``: --privileged-info-key (the distillation section's)."""
    samples = task = None
    if rollout.data.prompt_data:
        samples = load_source(rollout.data.prompt_data, "--prompt-data", rollout,
                              role="train", privileged_key=privileged_key)
    elif not rollout.episodes.env:  # an environment makes its own prompts
        task = get_task(rollout.data.builtin_task)
    source = PromptSource(batch_size=batches.rollout_batch_size, seed=seed,
                          samples=samples, task=task, shuffle=rollout.data.rollout_shuffle)
    group_filter = (load_group_filter(batches.dynamic_sampling_filter_path)
                    if batches.dynamic_sampling_filter_path else None)
    return Inputs(samples, source, group_filter)


def build_scorer(rollout, share, agree: Agreement, *, samples, post_process_path: str | None,
                 judge=None) -> Scorer:
    """The share's rewards (``rollout``: the rollout section): the reward function, server or
    ``judge`` (--rm-type genrm), and the post-processing plug-in at ``post_process_path``
    (--reward-post-process-path)."""
    return Scorer(rollout, share,
                  builtin_task=None if samples is not None else rollout.data.builtin_task,
                  post_process_path=post_process_path, judge=judge,
                  agree=agree)


def sampling_params(sampling) -> SamplingParams:
    """The rollout's draw (``sampling``: ``cfg.rollout.sampling``)."""
    return SamplingParams(sampling.rollout_temperature, sampling.rollout_top_p,
                          sampling.rollout_top_k)


def turn_eos(tokenizer, eos_token_ids: list[int]) -> int:
    """The token that ends an episode's model turn: the tokenizer's EOS, else the model's
    first (``eos_token_ids``, relax/models.py ``eos_token_ids``)."""
    eos = tokenizer.eos_token_id
    return eos_token_ids[0] if eos is None else eos


def build_collector(rollout, batches, share, agree: Agreement, sampler, *, seed: int,
                    inputs: Inputs, scorer, tokenizer, envs, context: int | None,
                    eos_token_id: int, timer, tracker) -> Collector:
    """Episodes (--env, --use-agentic-rollout), partial rollouts, or prompt groups, with
    dynamic sampling around prompt groups when a filter is set (partial rollouts filter each
    group once it completes; the configuration refuses a filter with episodes). ``sampler``:
    relax/rollout/generation/sampler.py's or a vLLM server's; ``context``: the model's maximum
    positions; ``eos_token_id``: :func:`turn_eos`; ``timer`` / ``tracker``: the share's phase
    times and metrics; ``rollout``, ``batches``: the configuration's sections, ``seed``:
    --seed."""
    parts = dict(seed=seed, source=inputs.source, tokenizer=tokenizer, scorer=scorer,
                 timer=timer, tracker=tracker, sampler=sampler, agree=agree)
    carry = dict(max_aborted=rollout.partial.partial_rollout_max_aborted_count,
                 mask_offpolicy=rollout.partial.mask_offpolicy_in_partial_rollout)
    if rollout.episodes.env or rollout.episodes.use_agentic_rollout:
        parts.update(envs=envs, context=context, eos_token_id=eos_token_id)
        if rollout.partial.partial_rollout:  # --env only (the configuration refuses agents)
            return PartialEpisodes(rollout, batches, share, **parts, **carry)
        return EpisodeCollector(rollout, batches, share, **parts)
    if rollout.partial.partial_rollout:  # a filter judges each group once, when it completes
        return PartialRollouts(rollout, batches, share, **parts, **carry,
                               group_filter=inputs.group_filter,
                               filter_timeout=rollout.rewards.reward_timeout)
    collector = PromptCollector(rollout, batches, share, **parts)
    if inputs.group_filter is None:
        return collector
    return DynamicSampling(batches, share, collector, inputs.group_filter, tracker=tracker,
                           filter_timeout=rollout.rewards.reward_timeout)


@dataclass(frozen=True)
class Share:
    """One data-parallel share a process samples: its context ``ctx`` (rank v of the
    training ranks), how it agrees (``agree``), its --env environments (None without) and
    its ``scorer``."""

    ctx: object
    agree: Agreement
    envs: list | None
    scorer: Scorer


@dataclass(frozen=True)
class RolloutSide:
    """What a process's collectors are built from: the ``inputs``, the --rm-type genrm
    ``judge`` (None without; shared by the shares) and the ``shares``."""

    inputs: Inputs
    judge: object | None
    shares: list[Share]

    def check_lengths(self, tokenizer, data, max_response: int) -> None:
        """Every training prompt's judging prompt, as the policy's ``tokenizer`` formats it
        (``data``: ``cfg.rollout.data``), fits the judge with a full response
        (relax/rollout/reward/judge.py; exit 2 naming the prompt)."""
        check_judging_lengths(self.judge, tokenizer, self.inputs.samples,
                              apply_chat_template=data.apply_chat_template,
                              system_prompt=data.system_prompt, max_response=max_response)

    def collectors(self, rollout, batches, backend: RolloutBackend, *, seed: int, tokenizer,
                   eos_token_ids: list[int], context: int | None, timers: list,
                   trackers: list) -> list[Collector]:
        """Each share's collector (:func:`build_collector`), in order, sampling through one
        sampler of the started ``backend`` at the rollout's sampling; ``eos_token_ids``: the
        policy's (relax/models.py); ``timers`` / ``trackers``: one per share; ``rollout``,
        ``batches``, ``seed``: as :func:`build_collector`'s."""
        sampler = backend.sampler(sampling_params(rollout.sampling),
                                  eos_token_ids=eos_token_ids,
                                  pad_token_id=tokenizer.pad_token_id)
        return [build_collector(rollout, batches, share.ctx, share.agree, sampler, seed=seed,
                                inputs=self.inputs,
                                scorer=share.scorer, tokenizer=tokenizer, envs=share.envs,
                                context=context, eos_token_id=turn_eos(tokenizer, eos_token_ids),
                                timer=timer, tracker=tracker)
                for share, timer, tracker in zip(self.shares, timers, trackers, strict=True)]


def build_rollout_side(cfg, shares: list[tuple[object, Agreement]], *, device, bf16: bool,
                       stop, samples_here: bool = True) -> RolloutSide:
    """The environments of each (share context, agreement) in ``shares`` (--env: one per
    episode; a signal via ``stop``, relax/trainer/signals.py, ends their building at once),
    the inputs, the judge on ``device`` and each share's scorer, in that order. ``samples_here``
    False (a --fully-async training rank): the rollout ranks sample, build the
    environments and hold the judge; the scorer is still built, so that a bad reward
    plug-in or an unreachable --rm-url stops the training ranks too before any model
    loads."""
    envs = [None] * len(shares)
    if cfg.rollout.episodes.env and samples_here:
        # a factory may take up to its deadline (600 s by default): a signal stops it at once
        with stop.at_once("building the --env environments"):
            envs = [build_environments(cfg.rollout, cfg.batches, ctx) for ctx, _ in shares]
    inputs = load_inputs(cfg.rollout, cfg.batches, seed=cfg.run.seed,
                         privileged_key=cfg.distillation.opsd_privileged_info_key)
    judge = build_judge(cfg.rollout.rewards, device, bf16=bf16,
                        pass_layout=cfg.batches.pass_layout) if samples_here else None
    return RolloutSide(inputs, judge, [
        Share(ctx, agree, share_envs,
              build_scorer(cfg.rollout, ctx, agree, samples=inputs.samples,
                           post_process_path=cfg.algorithm.custom_reward_post_process_path,
                           judge=judge))
        for (ctx, agree), share_envs in zip(shares, envs, strict=True)])
