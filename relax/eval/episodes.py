"""Evaluation of an ``--env`` policy: episodes of held-out environment seeds.

    metrics = evaluate_episodes(model, tokenizer, make_env, sampling, episodes=64,
                                max_turns=4, format_prompt=..., render=..., name="env")
    # {"eval/env/pass@1": ..., "eval/env/mean_reward": ..., "eval/env/episode_turns": ...,
    #  "eval/env/response_length": ..., "eval/env/truncated": ...}

Seeds: episode ``i`` starts from ``reset(HELDOUT_SEED + i)``. Training draws its seeds below
``HELDOUT_SEED`` (relax/rollout/episodes.py), so the two never meet and every run and
``relax eval`` of one environment play the same held-out games. Each seed is played
``sampling.n_samples`` times; an episode passes when its reward (the sum of its step rewards,
relax/rollout/episodes.py) is >= ``sampling.pass_threshold`` (1.0: a won game for gem's and
textarena's games), and pass@k is the unbiased estimate over the plays of a seed, averaged over
seeds, as for prompts (relax/eval/evaluate.py).

The episodes run with the rollout's own episode loop and batched generation, at the evaluation
sampling settings (``--eval-temperature 0`` is greedy), ``--eval-batch-size`` episodes side by
side. Data-parallel: rank r plays seeds r, r + world, ...; the sums are all-reduced once.
"""

from __future__ import annotations

import torch

from relax.collectives import all_reduce
from relax.eval.evaluate import EvalSampling, _model_device, _my_prompts, _rank_world
from relax.eval.passk import ks_for, pass_at_k
from relax.models import eos_token_ids as find_eos_ids
from relax.precision import autocast, use_bf16
from relax.rollout.episodes import HELDOUT_SEED, run_episodes
from relax.rollout.generate import generate
from relax.seeding import seed_for


def evaluate_episodes(model, tokenizer, make_env, sampling: EvalSampling, *, episodes: int,
                      max_turns: int, format_prompt, render, name: str = "env",
                      step: int | None = None, device=None, group=None) -> dict[str, float]:
    """Play ``episodes`` held-out seeds x ``sampling.n_samples`` with ``model`` (a plain
    Hugging Face causal LM); ``make_env()`` builds one environment. Returns
    ``eval/<name>/pass@k``, ``mean_reward``, ``episode_turns`` (model turns per episode),
    ``response_length`` (model tokens per episode) and ``truncated`` (share the environment
    did not end: turn limit, context, or an environment error), identical on every rank."""
    rank, world = _rank_world(group)
    device = torch.device(device) if device is not None else _model_device(model)
    n, ks = sampling.n_samples, ks_for(sampling.n_samples)
    eos_ids = find_eos_ids(tokenizer, model)
    generator = torch.Generator(device)
    generator.manual_seed(seed_for(sampling.seed, "eval", name, step, rank))

    def sample(ids, mask, max_new_tokens):
        with autocast(device, use_bf16(sampling.bf16, device)):
            return generate(model, ids, mask, max_new_tokens=max_new_tokens,
                            eos_token_ids=eos_ids, pad_token_id=tokenizer.pad_token_id,
                            temperature=sampling.temperature, top_p=sampling.top_p,
                            top_k=sampling.top_k, generator=generator)

    mine = [i for i, _ in _my_prompts(episodes, rank, world, pad=False)]
    per_call = max(1, sampling.batch_size // n)  # seeds per batch, n plays each
    envs = [make_env() for _ in range(min(per_call, max(1, len(mine))) * n)]
    # sums: pass@k for each k, reward, episodes, seeds, turns, model tokens, truncated
    sums = torch.zeros(len(ks) + 6, dtype=torch.float64)
    context = getattr(model.config, "max_position_embeddings", None)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(mine), per_call):
            seeds = [HELDOUT_SEED + i for i in mine[start:start + per_call] for _ in range(n)]
            played = run_episodes(
                envs[:len(seeds)], seeds, tokenizer=tokenizer, format_prompt=format_prompt,
                render=render, sample=sample, max_turns=max_turns,
                max_turn_tokens=sampling.max_response_len, context=context, device=device,
                length_flag="--eval-max-response-len")
            tokens = played.rollout.response_mask.sum(-1).tolist()
            truncated = played.rollout.truncated.tolist()
            for j in range(len(seeds) // n):
                rows = slice(j * n, (j + 1) * n)
                passed = sum(r >= sampling.pass_threshold for r in played.rewards[rows])
                for a, k in enumerate(ks):
                    sums[a] += pass_at_k(n, passed, k)
                sums[len(ks):] += torch.tensor([
                    sum(played.rewards[rows]), n, 1, sum(played.turns[rows]),
                    sum(tokens[rows]), sum(truncated[rows])], dtype=torch.float64)
    finally:
        model.train(was_training)
    values = all_reduce(sums.to(device), group).cpu().tolist()
    reward, plays, seeds_n, turns, tokens_n, truncated_n = values[len(ks):]
    out = {f"eval/{name}/pass@{k}": values[a] / seeds_n for a, k in enumerate(ks)}
    out.update({f"eval/{name}/mean_reward": reward / plays,
                f"eval/{name}/episode_turns": turns / plays,
                f"eval/{name}/response_length": tokens_n / plays,
                f"eval/{name}/truncated": truncated_n / plays})
    return out
