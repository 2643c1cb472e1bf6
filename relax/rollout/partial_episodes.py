"""Partial rollouts of ``--env`` episodes (``--partial-rollout --env``): a step stops playing
once it holds enough finished episode groups, and the episodes still being played continue in
a later step, with their environments.

Each rank plays ``--over-sampling-batch-size / WORLD_SIZE`` groups of ``n`` episodes per step:
the groups it carried over first, then fresh ones (the next environment seeds of the stream,
as many on every rank as it has room for). Every turn is one batched generation over the live
episodes, then one step of each one's environment (relax/rollout/agents/episodes.py). After each turn
the step stops when the first ``--rollout-batch-size / WORLD_SIZE`` groups are complete (every
episode ended: by its environment, ``--max-turns``, the context or an error) and every group
carried ``--partial-rollout-max-aborted-count`` times is complete too; it plays at least one
turn. An episode is cut between two of its turns, never inside one: whether a turn ends an
episode is known only once its environment answered it. The first complete groups (carried
before fresh) are the step's batch; the other groups are carried, their model tokens with the
sampler's log-probs and the step each was sampled at (off-policy later, as in
relax/rollout/partial.py), and continue under the newer policy (their context prefilled again).

The environments are user Python objects, which a checkpoint cannot hold. It holds what was
done to them instead: each carried episode's seed and, per turn, the action it was given and
what it answered. ``--load`` rebuilds each carried episode's environment by resetting a fresh
one with the seed and replaying the actions, and checks every answer against the recorded
one: an environment that answers the same seed and actions the same way continues exactly;
one that does not stops the resume with one line naming the episode and the first difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from relax.errors import InputError, RewardError
from relax.rollout.agents.env_guard import EnvFailure
from relax.rollout.agents.episodes import (
    HELDOUT_SEED,
    Episode,
    as_rollout,
    play_turn,
    start_episodes,
    turn_io,
)
from relax.rollout.collectors import rollout_generator
from relax.rollout.episode_collector import EpisodeCollector
from relax.rollout.generation.batch import StepBatch
from relax.rollout.generation.turn_cache import TurnCache
from relax.rollout.partial import share_stream
from relax.rollout.reward.scoring import warn_some
from relax.seeding import seed_for


@dataclass
class CarriedEpisode(Episode):
    """An :class:`Episode` that may span steps: its seed, the steps its tokens were added in,
    what its environment was told and answered (``log``: [action, observation, reward, done]
    per turn, for the replay), and how many steps it was carried unfinished."""

    seed: int = 0
    text: str = ""  # the first observation, formatted as the prompt
    versions: list[int] = field(default_factory=list)
    log: list[list] = field(default_factory=list)
    aborted: int = 0
    step: int = 0  # the step playing it now: its new tokens' version
    env: object = None  # its environment (not saved: rebuilt by the replay)

    def add(self, ids: list[int], trained: bool, log_probs: list[float] | None = None,
            routes=None) -> None:
        super().add(ids, trained, log_probs, routes)
        self.versions.extend([self.step] * len(ids))

    def plain(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "env"}


class _Recorder:
    """The episode's environment, logging each step's action and answer."""

    def __init__(self, episode: CarriedEpisode):
        self.episode = episode

    def step(self, action: str):
        observation, reward, done = self.episode.env.step(action)
        self.episode.log.append([action, observation, reward, done])
        return observation, reward, done


class PartialEpisodes(EpisodeCollector):
    """``collect(step)`` with unfinished episode groups carried between steps; the arguments
    are :class:`EpisodeCollector`'s (``envs``: one per episode a step plays) plus the carry
    bound and the off-policy mask of ``--partial-rollout``."""

    def __init__(self, rollout, batches, ctx, *, max_aborted: int, mask_offpolicy: bool,
                 **parts):
        super().__init__(rollout, batches, ctx, **parts)
        self.quota, self.per_step = self.per_rank, batches.over_sampling_batch_size // ctx.world_size
        self.max_aborted, self.mask_offpolicy = max_aborted, mask_offpolicy
        self.format_prompt, self.render = turn_io(
            self.tokenizer, apply_chat_template=rollout.data.apply_chat_template,
            system_prompt=rollout.data.system_prompt, eos_token_id=self.eos_token_id)
        self.cursor = 0  # environment seeds of the stream taken by all ranks so far
        self.carried: list[list[CarriedEpisode]] = []

    # ------------------------------------------------------------------ the step
    def collect(self, step: int) -> StepBatch:
        groups, error = self.carried, None
        with self.timer("generate"):
            try:  # under --reward-error-policy raise the first failed episode ends the step
                groups = groups + self._fresh(max(0, self.per_step - len(self.carried)))
                self._play(groups, step)
            except EnvFailure as e:
                error = RewardError(f"--env {self.rollout.episodes.env}: {e} "
                                    "(--reward-error-policy zero scores such episodes 0)")
        self.agree.raise_together(error)  # on every share
        complete = [i for i, g in enumerate(groups) if not any(e.live for e in g)]
        done = set(complete[:self.quota])
        self.carried = [self._carry(g) for i, g in enumerate(groups) if i not in done]
        self.tracker.add_sum("rollout/partial_carried_groups", len(self.carried))
        return self._batch([groups[i] for i in sorted(done)], step)

    def _play(self, groups: list[list[CarriedEpisode]], step: int) -> None:
        """Turns of the live episodes until the stop rule holds (at least one turn)."""
        episodes = [e for g in groups for e in g]
        for e in episodes:
            e.step = step
        generator = rollout_generator(self.seed, self.ctx.rank, step, 0, self.ctx.device)
        must = [g for g in groups if g[0].aborted >= self.max_aborted]
        cache = TurnCache()  # one per step: the weights change between steps
        try:
            while any(e.live for e in episodes):
                self._turn(episodes, generator, cache)
                complete = sum(not any(e.live for e in g) for g in groups)
                if complete >= self.quota and not any(e.live for g in must for e in g):
                    break
        finally:
            cache.clear()

    def _turn(self, episodes: list[CarriedEpisode], generator, cache: TurnCache) -> None:
        """One model turn of every live episode, each environment's answer recorded."""
        section = self.rollout
        play_turn(episodes, [i for i, e in enumerate(episodes) if e.live],
                  [_Recorder(e) for e in episodes],
                  sample=lambda ids, mask, limit, cache: self.sampler(ids, mask, limit, generator,
                                                                      cache=cache),
                  cache=cache, tokenizer=self.tokenizer, render=self.render,
                  max_turns=section.episodes.max_turns,
                  max_turn_tokens=section.sampling.rollout_max_response_len, context=self.context,
                  device=self.ctx.device, stop=section.rewards.reward_error_policy == "raise",
                  name=lambda i: f"episode of seed {episodes[i].seed}")

    def _fresh(self, count: int) -> list[list[CarriedEpisode]]:
        """``count`` new groups of this rank, reset on the environments no carried episode
        holds: the ranks take consecutive, disjoint seeds of the stream (share_stream; below
        HELDOUT_SEED: never the evaluation's)."""
        first, self.cursor = share_stream(self.cursor, count, self.ctx, self.agree)
        seeds = [seed_for(self.seed, "env", first + g) % HELDOUT_SEED
                 for g in range(count) for _ in range(self.n)]
        held = {id(e.env) for g in self.carried for e in g}
        envs = [env for env in self.envs if id(env) not in held][:len(seeds)]
        texts, started = start_episodes(
            envs, seeds, tokenizer=self.tokenizer, format_prompt=self.format_prompt,
            max_turn_tokens=self.rollout.sampling.rollout_max_response_len, context=self.context,
            length_flag="--rollout-max-response-len",
            stop=self.rollout.rewards.reward_error_policy == "raise")
        episodes = [CarriedEpisode(**{f.name: getattr(e, f.name) for f in fields(Episode)},
                                   seed=s, text=t, env=env)
                    for e, s, t, env in zip(started, seeds, texts, envs, strict=True)]
        return [episodes[g * self.n:(g + 1) * self.n] for g in range(count)]

    def _carry(self, group: list[CarriedEpisode]) -> list[CarriedEpisode]:
        unfinished = any(e.live for e in group)
        for e in group:
            e.aborted += int(unfinished)
        return group

    def _batch(self, groups: list[list[CarriedEpisode]], step: int) -> StepBatch:
        """The complete groups as the step's batch: model tokens of earlier steps are
        off-policy (left out of the loss with ``--mask-offpolicy-in-partial-rollout``)."""
        episodes = [e for g in groups for e in g]
        device = self.ctx.device
        rollout = as_rollout(episodes, self.tokenizer.pad_token_id, device)
        T = rollout.response_ids.shape[1]
        current = torch.zeros((len(episodes), T), dtype=torch.bool)
        for i, e in enumerate(episodes):
            current[i, :len(e.versions)] = torch.tensor(e.versions, dtype=torch.long) == step
        current = current.to(device)
        trained = rollout.response_mask
        self.tracker.add_ratio("rollout/partial_offpolicy_tokens", (trained & ~current).sum(),
                               trained.sum())
        if self.mask_offpolicy:
            rollout = replace(rollout, response_mask=trained & current)
        errors = [e.error for e in episodes if e.error]
        self.tracker.add_sum("rollout/reward_errors", len(errors))
        warn_some([f"--env {self.rollout.episodes.env}: {x}" for x in errors], self.ctx,
                  "episodes", "scored 0 (--reward-error-policy zero)")
        self.tracker.add_ratio("rollout/episode_turns", sum(e.turns for e in episodes),
                               len(episodes))
        labels = [{"env_seed": e.seed, "turns": e.turns} for e in episodes]
        return self._step_batch(rollout, [e.reward for e in episodes],
                                [e.text for e in episodes], labels)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The seed stream's position and this rank's episodes in flight, each with what its
        environment was told and answered (plain lists: the rank's checkpoint file holds
        them)."""
        return {"cursor": self.cursor,
                "carried": [[e.plain() for e in g] for g in self.carried]}

    def load_state_dict(self, state: dict) -> None:
        """Continue a checkpoint: its episodes in flight, each on a fresh environment rebuilt
        by replaying its recorded turns (:func:`replay`)."""
        self.cursor = int(state["cursor"])
        groups = state.get("carried") or []
        if sum(len(g) for g in groups) > len(self.envs):
            raise InputError(f"--load: the checkpoint carries {len(groups)} episode groups in "
                             f"flight on this rank, more than the {len(self.envs) // self.n} "
                             "a step plays; resume with a larger --over-sampling-batch-size")
        envs = iter(self.envs)
        self.carried = [[replay(CarriedEpisode(**e), next(envs), self.format_prompt,
                                self.rollout.episodes.env) for e in g] for g in groups]


def replay(episode: CarriedEpisode, env, format_prompt, spec: str) -> CarriedEpisode:
    """``episode`` on ``env``, reset with its seed and stepped with its recorded actions; every
    answer must be the recorded one, else one :class:`InputError` line."""
    where = f"--load: --env {spec}: the episode in flight of seed {episode.seed}"
    advice = ("continuing it needs an environment that answers the same seed and actions "
              "the same way; resume without --partial-rollout to drop the episodes in flight")
    try:
        first = format_prompt(env.reset(episode.seed))
        if first != episode.text:
            raise InputError(f"{where} starts with another observation than in the "
                             f"interrupted run; {advice}")
        for turn, (action, *answer) in enumerate(episode.log, 1):
            got = list(env.step(action))
            if got != answer:
                raise InputError(f"{where} does not replay: turn {turn} answered "
                                 f"{got!r:.120} where the interrupted run got {answer!r:.120}; "
                                 f"{advice}")
    except EnvFailure as e:
        raise InputError(f"{where} does not replay: {e}; {advice}") from None
    episode.env = env
    return episode
