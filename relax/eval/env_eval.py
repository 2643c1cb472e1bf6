"""Evaluation of an ``--env`` policy: episodes of held-out environment seeds.

    metrics = evaluate_episodes(model, tokenizer, make_env, sampling, episodes=64,
                                max_turns=4, format_prompt=..., render=..., name="env")
    # {"eval/env/pass@1": ..., "eval/env/mean_reward": ..., "eval/env/episode_turns": ...,
    #  "eval/env/response_length": ..., "eval/env/truncated": ...}

Seeds: episode ``i`` starts from ``reset(HELDOUT_SEED + i)``. Training draws its seeds below
``HELDOUT_SEED`` (relax/rollout/agents/episodes.py), so the two never meet and every run and
``relax eval`` of one environment play the same held-out games. Each seed is played
``sampling.section.n_samples_per_eval_prompt`` times; an episode passes when its reward (the
sum of its step rewards, relax/rollout/agents/episodes.py) is >=
``sampling.section.eval_pass_threshold`` (1.0: a won game for gem's and textarena's games), and pass@k is the unbiased estimate over the plays of a seed, averaged over
seeds, as for prompts (relax/eval/evaluate.py).

The episodes run with the rollout's own episode loop and sampler, at the evaluation
sampling settings (``--eval-temperature 0`` is greedy), ``--eval-batch-size`` episodes side by
side. Data-parallel: rank r plays seeds r, r + world, ...; the sums are all-reduced once.
"""

from __future__ import annotations

import torch

from relax.eval.evaluate import (
    EvalSampling,
    _model_device,
    _my_prompts,
    _rank_world,
    all_reduced,
    eval_generator,
    eval_sampler,
)
from relax.eval.passk import PassAtKSums
from relax.models import eos_token_ids as find_eos_ids
from relax.rollout.agents.episodes import HELDOUT_SEED, run_episodes

# per-episode means reported next to pass@k and mean_reward
EPISODE_MEANS = ("episode_turns", "response_length", "truncated")


def evaluate_episodes(model, tokenizer, make_env, sampling: EvalSampling, *, episodes: int,
                      max_turns: int, format_prompt, render, name: str = "env",
                      step: int | None = None, device=None, group=None,
                      make_sampler=None) -> dict[str, float]:
    """Play ``episodes`` held-out seeds x ``sampling.section.n_samples_per_eval_prompt`` with
    ``model`` (a plain Hugging Face causal LM); ``make_env()`` builds one environment. Returns
    ``eval/<name>/pass@k``, ``mean_reward``, ``episode_turns`` (model turns per episode),
    ``response_length`` (model tokens per episode) and ``truncated`` (share the environment
    did not end: turn limit, context, or an environment error), identical on every rank.
    ``make_sampler(params, eos_token_ids)``: another sampler than the model's own (a vLLM
    server, relax/eval/command.py)."""
    rank, world = _rank_world(group)
    device = torch.device(device) if device is not None else _model_device(model)
    n = sampling.section.n_samples_per_eval_prompt
    sampler = (eval_sampler(model, tokenizer, sampling, device) if make_sampler is None else
               make_sampler(sampling.params, find_eos_ids(tokenizer, model)))
    generator = eval_generator(sampling, device, name, step, rank)

    def sample(ids, mask, max_new_tokens, cache=None):
        return sampler(ids, mask, max_new_tokens, generator, cache=cache)

    mine = [i for i, _ in _my_prompts(episodes, rank, world, pad=False)]
    per_call = max(1, sampling.section.eval_batch_size // n)  # seeds per batch, n plays each
    envs = [make_env() for _ in range(min(per_call, max(1, len(mine))) * n)]
    sums = PassAtKSums(n, sampling.section.eval_pass_threshold, means=EPISODE_MEANS)
    context = getattr(model.config, "max_position_embeddings", None)
    for start in range(0, len(mine), per_call):
        seeds = [HELDOUT_SEED + i for i in mine[start:start + per_call] for _ in range(n)]
        played = run_episodes(
            envs[:len(seeds)], seeds, tokenizer=tokenizer, format_prompt=format_prompt,
            render=render, sample=sample, max_turns=max_turns,
            max_turn_tokens=sampling.section.eval_max_response_len, context=context, device=device,
            length_flag="--eval-max-response-len")
        _add_played(sums, played)
    return sums.metrics(name, totals=all_reduced(sums.values, device, group))


def _add_played(sums: PassAtKSums, played) -> None:
    """One batch of played episodes, ``sums.n`` consecutive plays per seed."""
    n = sums.n
    tokens = played.rollout.response_mask.sum(-1).tolist()
    truncated = played.rollout.truncated.tolist()
    for j in range(len(played.rewards) // n):
        rows = slice(j * n, (j + 1) * n)
        sums.add_group(played.rewards[rows], episode_turns=played.turns[rows],
                       response_length=tokens[rows], truncated=truncated[rows])
