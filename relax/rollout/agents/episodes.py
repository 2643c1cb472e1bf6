"""Episode rollout: each sample is a multi-turn episode against an environment (``--env``).

    observation = env.reset(seed)                      the episode's prompt
    for turn in 1 .. --max-turns:
        action ids  = generate(context)                one batched call for every live episode
        observation, reward, done = env.step(decode(action ids))
        context    += action ids (trained, mask 1) + rendered observation (context, mask 0)

An episode becomes one ordinary sample: the response is every turn concatenated, with the
environment's tokens as holes in the loss mask (reinforce_plus_plus.md §1 allows holes), and
its reward is the **sum of the step rewards** the environment returned (for environments that
reward only the last step, such as textarena's, that is the terminal reward). So every
estimator, both REINFORCE++ variants included, trains on the episode unchanged.

Token-in/token-out: the model's sampled ids are appended exactly as drawn (never decoded and
re-tokenized); only the environment's text is tokenized. Each turn is one batched generation
over the live episodes' contexts (relax/rollout/generation/generate.py) that keeps every episode's KV
cache for the next turn (relax/rollout/generation/turn_cache.py): a turn prefills only the last token
the model drew and the environment's answer, ragged across the batch, with the same sampled
ids as a prefill of the whole context; an episode's cache is released when it ends, and the
step's when the episodes are played. An episode also ends, counted as truncated, when its context could not hold
another full turn within the model's context window; an observation that would take that
room is not added, so an episode never outgrows the context.

Everything an environment does passes the containment boundary of
relax/rollout/agents/env_guard.py: a reset or step that raises, exits, returns the wrong thing or a
non-finite reward (or runs past ``--env-step-timeout``) fails its episode (``errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from relax.errors import InputError
from relax.rollout.agents.env_guard import EnvFailure, GuardedEnv
from relax.rollout.generation.generate import Rollout, left_pad
from relax.rollout.generation.turn_cache import TurnCache
from relax.rollout.prompts.data import format_prompt

SENTINEL = "RELAXTURNSENTINEL"

# An observation longer than this (characters) is not tokenized: no context holds it, and
# tokenizing megabytes of text an environment returned would cost seconds to minutes.
MAX_OBSERVATION_CHARS = 1 << 20

# Environment seeds from here on are held out for evaluation (relax/eval/env_eval.py); the
# training episodes draw theirs below it (relax/rollout/episode_collector.py).
HELDOUT_SEED = 1_000_000_000

# For agent programs on a tokenizer without a chat template (the built-in tiny model): one
# line per message, each closed by the EOS the model itself ends its turns with.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}")


class TurnRenderer:
    """Token ids of the text between two model turns: the end of the model's turn when it did
    not end it itself (cut at the length limit), the new messages (an observation as a user
    turn, or an agent's user and tool messages), and the start of the next model turn.

    With a chat template the text is taken from the template itself: a conversation with a
    sentinel assistant message is rendered with the new messages after it, and the part after
    the sentinel is what follows a model turn. Without one (``chat=False``), an observation is
    a line of its own after the model's EOS. ``template`` overrides the tokenizer's.
    """

    def __init__(self, tokenizer, *, chat: bool, eos_token_id: int, template: str | None = None):
        self.tokenizer, self.chat, self.eos_token_id = tokenizer, chat, eos_token_id
        self.template = template
        self.eos_text = tokenizer.decode([eos_token_id])

    def __call__(self, observation: str, ended: bool) -> list[int]:
        if self.chat:
            return self.messages([{"role": "user", "content": observation}], ended=ended)
        ids = self.tokenizer(observation + "\n", add_special_tokens=False)["input_ids"]
        return ids if ended else [self.eos_token_id, *ids]

    def messages(self, new: list[dict], *, ended: bool, tools=None) -> list[int]:
        """The ids of ``new`` messages following a model turn, up to the next model turn."""
        context = [{"role": "user", "content": "x"},
                   {"role": "assistant", "content": SENTINEL}]
        full = self.tokenizer.apply_chat_template(
            [*context, *new], tools=tools, tokenize=False, add_generation_prompt=True,
            chat_template=self.template)
        text = full[full.rindex(SENTINEL) + len(SENTINEL):]
        if ended and text.startswith(self.eos_text):
            text = text[len(self.eos_text):]  # the model's own EOS already closed the turn
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def turn_io(tokenizer, *, apply_chat_template: bool, system_prompt: str | None,
            eos_token_id: int) -> tuple[Callable[[str], str], TurnRenderer]:
    """How an environment's text reaches the model: the first observation formatted as the
    prompt (chat template, system prompt) and the renderer of the later observations."""
    def first(text: str) -> str:
        return format_prompt(tokenizer, text, apply_chat_template=apply_chat_template,
                             system_prompt=system_prompt)

    return first, TurnRenderer(tokenizer, chat=apply_chat_template, eos_token_id=eos_token_id)


@dataclass
class Episode:
    """One episode's growing token sequence: ``ids`` after the prompt, ``trained`` flags and
    the sampler's ``log_probs`` (0.0 for the environment's tokens); a mixture of experts'
    ``routes``: ``(start in ids, record [n, layers, k])`` of each model turn's tokens (the model's
    tokens only: the prompt and the environment's tokens have none, the trainer routes them)."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    routes: list = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    done: bool = False  # the environment ended it
    live: bool = True
    error: str | None = None

    def add(self, ids: list[int], trained: bool, log_probs: list[float] | None = None,
            routes: torch.Tensor | None = None) -> None:
        if routes is not None:
            self.routes.append((len(self.ids), routes.cpu()))
        self.ids.extend(ids)
        self.trained.extend([trained] * len(ids))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))


@dataclass
class EpisodeRollout:
    """The episodes as a :class:`Rollout` (``context_mask`` set) plus per-episode facts [B]."""

    rollout: Rollout
    rewards: list[float]
    turns: list[int]
    errors: list[str]  # "episode i: ..." for environments that raised (scored 0)
    prompts: list[str]  # first observations, as formatted for the model


def run_episodes(
    envs: list,
    seeds: list[int],
    *,
    tokenizer,
    format_prompt: Callable[[str], str],
    render: TurnRenderer,
    sample: Callable[[torch.Tensor, torch.Tensor, int], Rollout],
    max_turns: int,
    max_turn_tokens: int,
    context: int | None,
    device,
    length_flag: str = "--rollout-max-response-len",
    stop_at_first_error: bool = False,
) -> EpisodeRollout:
    """Play ``envs[i]`` from ``reset(seeds[i])`` for up to ``max_turns`` model turns.

    ``envs``: :class:`~relax.rollout.agents.env_guard.GuardedEnv` (a plain environment is guarded
    here, without a time limit); what one does wrong fails its episode (``errors``).
    ``sample(ids [b, L] left-padded, mask [b, L], max_new_tokens, cache=...)`` is the trainer's
    batched generation (its own seeded generator); it is called once per turn with every live
    episode and the episodes' KV caches (relax/rollout/generation/turn_cache.py ``CachedRows``, passed on
    to ``generate``).
    ``context``: the model's window (None: unbounded); ``length_flag`` names the flag of
    ``max_turn_tokens`` in the error when the first observation leaves no room for a turn.
    ``stop_at_first_error`` (``--reward-error-policy raise``): the first failed episode
    raises its :class:`EnvFailure` at once, so a hung environment costs one deadline, not
    one per episode.
    """
    envs = [env if isinstance(env, GuardedEnv) else GuardedEnv(env) for env in envs]
    prompts, episodes = start_episodes(envs, seeds, tokenizer=tokenizer, format_prompt=format_prompt,
                               max_turn_tokens=max_turn_tokens, context=context,
                               length_flag=length_flag, stop=stop_at_first_error)
    cache = TurnCache()  # one per call: the weights do not change while episodes play
    try:
        for _ in range(max_turns):
            live = [i for i, e in enumerate(episodes) if e.live]
            if not live:
                break
            play_turn(episodes, live, envs, sample=sample, cache=cache, tokenizer=tokenizer,
                      render=render, max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                      context=context, device=device, stop=stop_at_first_error,
                      name=lambda i: f"episode {i} (seed {seeds[i]})")
    finally:
        cache.clear()
    return EpisodeRollout(as_rollout(episodes, tokenizer.pad_token_id, device),
                          [e.reward for e in episodes], [e.turns for e in episodes],
                          [e.error for e in episodes if e.error], prompts)


def play_turn(episodes, live, envs, *, sample, cache, tokenizer, render, max_turns,
              max_turn_tokens, context, device, stop, name):
    """One model turn of the ``live`` episodes (indices of ``episodes``; one batched
    generation), then one step of each one's environment ``envs[i]``; an episode's turn
    ``max_turns`` is its last. ``stop``: the first failure raises; ``name(i)`` names episode
    ``i`` in its error. Also the partial rollouts' turn (relax/rollout/partial_episodes.py)."""
    ids, mask = left_pad([episodes[i].prompt + episodes[i].ids for i in live],
                         tokenizer.pad_token_id, device)
    out = sample(ids, mask, max_turn_tokens, cache=cache.rows(live))
    for row, i in enumerate(live):
        e, keep = episodes[i], out.response_mask[row]
        action = out.response_ids[row][keep].tolist()
        routes = (None if out.routed_experts is None
                  else out.routed_experts[row, ids.shape[1]:][keep])
        e.add(action, trained=True, log_probs=out.log_probs[row][keep].tolist(), routes=routes)
        error = play_action(e, envs[i], action, ended=not bool(out.truncated[row]),
                            tokenizer=tokenizer, render=render, last=e.turns == max_turns - 1,
                            room=None if context is None else context - max_turn_tokens)
        if error:
            e.error = f"{name(i)}, turn {e.turns}: {error}"
            if stop:
                raise EnvFailure(e.error)
        if not e.live:
            cache.release(i)


def start_episodes(envs, seeds, *, tokenizer, format_prompt, max_turn_tokens, context, length_flag,
           stop=False):
    """Reset every environment: the formatted first observations and fresh episodes. An
    environment whose reset fails starts a failed episode (an empty prompt, no turns), or
    (``stop``) raises its EnvFailure."""
    prompts, episodes = [], []
    for i, (env, seed) in enumerate(zip(envs, seeds, strict=True)):
        try:
            text, error = env.reset(seed), None
        except EnvFailure as e:
            text, error = "", f"episode {i} (seed {seed}), reset: {e}"
            if stop:
                raise EnvFailure(error) from None
        if len(text) > MAX_OBSERVATION_CHARS:
            raise InputError(f"--env: the first observation of seed {seed} is {len(text)} "
                             f"characters, more than {MAX_OBSERVATION_CHARS} (no model "
                             "context holds it)")
        prompts.append(format_prompt(text))
        ids = tokenizer(prompts[-1], add_special_tokens=False)["input_ids"]
        episodes.append(Episode(ids or [tokenizer.pad_token_id], live=error is None,
                                error=error))
        if error is None and context is not None and len(ids) + max_turn_tokens > context:
            raise InputError(f"--env: the first observation of seed {seed} is "
                             f"{len(ids)} tokens; with {length_flag} {max_turn_tokens} it "
                             f"does not fit the model's context of {context} tokens")
    return prompts, episodes


def play_action(e: Episode, env: GuardedEnv, action: list[int], *, ended: bool, tokenizer, render,
          last: bool, room: int | None) -> str | None:
    """Play the model's ``action`` in ``env`` and add the answer to ``e``; ``ended``: the turn
    stopped at EOS, ``room``: the most tokens an episode may hold before one more full turn
    (None: unbounded); the action is already in ``e``. Returns the environment's failure,
    which fails the episode, or None.

    An observation that would leave no room for another full turn ends the episode as
    truncated without being added: the episode never outgrows the context."""
    e.turns += 1
    try:
        observation, reward, done = env.step(tokenizer.decode(action, skip_special_tokens=True))
    except EnvFailure as failure:  # a broken environment fails its episode, not the run
        e.reward, e.live = 0.0, False
        return str(failure)
    e.reward += reward
    if done or last:
        e.done, e.live = done, False
        return None
    e.live = False  # until the observation is known to fit: truncated
    if len(observation) > MAX_OBSERVATION_CHARS:  # not worth tokenizing: it cannot fit
        return None
    ids = render(observation, ended=ended)
    if room is not None and len(e.prompt) + len(e.ids) + len(ids) > room:
        return None
    e.add(ids, trained=False)
    e.live = True
    return None


def as_rollout(episodes: list[Episode], pad: int, device) -> Rollout:
    """Left-padded prompts [B, P]; right-padded turns [B, T] with ``response_mask`` on the
    model's tokens and ``context_mask`` on every token (model and environment)."""
    prompt_ids, prompt_mask = left_pad([e.prompt for e in episodes], pad, device)
    T = max(1, max(len(e.ids) for e in episodes))
    B = len(episodes)
    ids = torch.full((B, T), pad, dtype=torch.long)
    trained = torch.zeros((B, T), dtype=torch.bool)
    present = torch.zeros((B, T), dtype=torch.bool)
    log_probs = torch.zeros((B, T), dtype=torch.float32)
    for i, e in enumerate(episodes):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids, dtype=torch.long)
        trained[i, :n] = torch.tensor(e.trained, dtype=torch.bool)
        log_probs[i, :n] = torch.tensor(e.log_probs, dtype=torch.float32)
        present[i, :n] = True
    # truncated: the environment did not end the episode (turn limit, context, or an error)
    truncated = torch.tensor([not e.done for e in episodes], dtype=torch.bool)
    return Rollout(prompt_ids, prompt_mask, ids.to(device), trained.to(device),
                   truncated.to(device), context_mask=present.to(device),
                   log_probs=log_probs.to(device),
                   routed_experts=episode_routes(episodes, prompt_ids.shape[1], T, device))


def episode_routes(episodes: list[Episode], P: int, T: int, device) -> torch.Tensor | None:
    """The model turns' routing records on the [B, P + T] grid of :func:`as_rollout`, -1 on
    the prompt and the environment's tokens; None when no episode has one (a dense model)."""
    chunks = [c for e in episodes for c in e.routes]
    if not chunks:
        return None
    first = chunks[0][1]
    out = torch.full((len(episodes), P + T, *first.shape[1:]), -1, dtype=first.dtype)
    for i, e in enumerate(episodes):
        for start, rec in e.routes:
            out[i, P + start:P + start + rec.shape[0]] = rec
    return out.to(device)
