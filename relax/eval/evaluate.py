"""Sampling-based evaluation: pass@k (unbiased) and mean reward of a policy on fixed prompts.

    sampling = EvalSampling(cfg.evaluation, cfg.run.seed, cfg.system.bf16)
    metrics = evaluate(model, tokenizer, prompts, labels, reward_fn, sampling, name="gsm8k")
    # {"eval/gsm8k/pass@1": ..., "eval/gsm8k/pass@2": ..., "eval/gsm8k/pass@4": ...,
    #  "eval/gsm8k/mean_reward": ..., "eval/gsm8k/response_length": ...,
    #  "eval/gsm8k/truncated": ...}

Generation is the rollout's own sampler (:class:`relax.rollout.generation.sampler.Sampler`), so an
evaluated policy samples exactly as it does in training. A response passes when its reward is
>= ``pass_threshold``; pass@k is the mean over prompts of the per-prompt unbiased estimate
(:mod:`relax.eval.passk`, whose :class:`~relax.eval.passk.PassAtKSums` holds the sums).

Data-parallel: with ``group`` every rank evaluates every ``world_size``-th prompt and the
partial sums are all-reduced once, so the result is the same on every rank and equals the
single-process value up to sampling. With ``sync_group`` (a sharded FSDP model, whose forward
passes are collectives) every rank runs the same number of generation calls: short ranks pad
with a zero-weight copy of a prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from relax.collectives import all_reduce
from relax.config.section import default_of
from relax.config.sections import EvaluationSection, RunSection
from relax.eval.passk import PassAtKSums
from relax.models import eos_token_ids as find_eos_ids
from relax.precision import use_bf16
from relax.rollout.generation.generate import tokenize_prompts
from relax.rollout.generation.sampler import Sampler, SamplingParams
from relax.rollout.reward.rewards import score
from relax.seeding import seed_for


@dataclass(frozen=True)
class EvalSampling:
    """The evaluation section (``cfg.evaluation``, resolved: its sampling is set; temperature
    0 is greedy) with the run's seed (``cfg.run.seed``) and ``--bf16`` (``cfg.system.bf16``;
    None: on for CUDA, relax/precision.py)."""

    section: EvaluationSection
    seed: int = default_of(RunSection, "seed")  # --seed
    bf16: bool | None = None

    @property
    def params(self) -> SamplingParams:
        e = self.section
        return SamplingParams(e.eval_temperature, e.eval_top_p, e.eval_top_k)


def _rank_world(group) -> tuple[int, int]:
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _model_device(model) -> torch.device:
    param = next(model.parameters())
    return getattr(param, "device", torch.device("cpu"))


def eval_sampler(model, tokenizer, sampling: EvalSampling, device: torch.device, *,
                 eos_token_ids: list[int] | None = None, sync_group=None) -> Sampler:
    """The run's sampler at the evaluation settings (``eos_token_ids`` default: the model's)."""
    if eos_token_ids is None:
        eos_token_ids = find_eos_ids(tokenizer, model)
    return Sampler(model, eos_token_ids=eos_token_ids, pad_token_id=tokenizer.pad_token_id,
                   params=sampling.params, bf16=use_bf16(sampling.bf16, device), device=device,
                   sync_group=sync_group)


def eval_generator(sampling: EvalSampling, device: torch.device, name: str, step, rank: int):
    """The sampling stream of one evaluation set at one step on one rank."""
    generator = torch.Generator(device)
    generator.manual_seed(seed_for(sampling.seed, "eval", name, step, rank))
    return generator


def _my_prompts(num_prompts: int, rank: int, world: int, pad: bool) -> list[tuple[int, float]]:
    """(prompt index, weight) pairs of this rank; padding entries weigh 0."""
    mine = [(i, 1.0) for i in range(rank, num_prompts, world)]
    if pad:
        per_rank = -(-num_prompts // world)
        mine += [(0, 0.0)] * (per_rank - len(mine))
    return mine


def evaluate(
    model,
    tokenizer,
    prompts: list[str],
    labels: list,
    reward_fn,
    sampling: EvalSampling,
    *,
    name: str = "eval",
    step: int | None = None,
    eos_token_ids: list[int] | None = None,
    device: torch.device | None = None,
    group=None,
    sync_group=None,
    reward_name: str = "reward",
    reward_timeout: float | None = None,
    make_sampler=None,
) -> dict[str, float]:
    """Evaluate ``model`` (a plain Hugging Face causal LM, not a DDP wrapper) on ``prompts``.

    ``prompts`` are the texts fed to the model (chat template already applied);
    ``labels[i]`` goes to ``reward_fn(prompts, responses, labels) -> list[float]``.
    ``step`` only varies the sampling seed between evaluations of one run;
    ``reward_timeout``: seconds per sample ``reward_fn`` may take (None: no limit). Returns
    ``eval/<name>/pass@k`` for k in 1, 2, 4, ..., n_samples, ``eval/<name>/mean_reward``
    (over all responses), ``eval/<name>/response_length`` (mean tokens) and
    ``eval/<name>/truncated`` (share without EOS); identical on every rank of ``group``.
    ``make_sampler(params, eos_token_ids)``: another sampler than the model's own (a vLLM
    server, relax/rollout/backends/vllm/vllm_backend.py).
    """
    if len(prompts) != len(labels):
        raise ValueError(f"evaluate: {len(prompts)} prompts but {len(labels)} labels")
    if not prompts:
        raise ValueError(f"evaluate: the evaluation set {name!r} has no prompts")
    device = torch.device(device) if device is not None else _model_device(model)
    rank, world = _rank_world(group)
    sampler = _sampler(model, tokenizer, sampling, device, eos_token_ids, sync_group,
                       make_sampler)
    generator = eval_generator(sampling, device, name, step, rank)
    section = sampling.section
    sums = PassAtKSums(section.n_samples_per_eval_prompt, section.eval_pass_threshold,
                       means=("response_length", "truncated"))
    mine = _my_prompts(len(prompts), rank, world, pad=sync_group is not None)
    per_call = max(1, section.eval_batch_size // section.n_samples_per_eval_prompt)
    for start in range(0, len(mine), per_call):
        _add_chunk(sums, sampler, tokenizer, prompts, labels, mine[start:start + per_call],
                   reward_fn, generator=generator, max_new_tokens=section.eval_max_response_len,
                   reward_name=reward_name, index_base=start * section.n_samples_per_eval_prompt,
                   timeout=reward_timeout)
    return sums.metrics(name, totals=all_reduced(sums.values, device, group))


def _sampler(model, tokenizer, sampling, device, eos_token_ids, sync_group, make_sampler):
    """The model's own sampler, or ``make_sampler``'s (a vLLM server)."""
    if make_sampler is not None:
        return make_sampler(sampling.params, eos_token_ids or find_eos_ids(tokenizer, model))
    return eval_sampler(model, tokenizer, sampling, device, eos_token_ids=eos_token_ids,
                        sync_group=sync_group)


def all_reduced(values: list[float], device: torch.device, group) -> list[float]:
    """``values`` summed over the ranks of ``group`` (float64, one all-reduce)."""
    totals = torch.tensor(values, dtype=torch.float64).to(device)
    return all_reduce(totals, group).cpu().tolist()


def _add_chunk(sums: PassAtKSums, sampler: Sampler, tokenizer, prompts, labels, chunk,
               reward_fn, *, generator, max_new_tokens, reward_name, index_base,
               timeout=None) -> None:
    """Generate ``n`` responses for each ``(prompt index, weight)`` of ``chunk``, score them and
    add them to ``sums`` (a padded duplicate prompt has weight 0: it keeps the ranks'
    generation calls in lockstep and counts nothing)."""
    n = sums.n
    texts = [prompts[i] for i, _ in chunk for _ in range(n)]
    chunk_labels = [labels[i] for i, _ in chunk for _ in range(n)]
    ids, mask = tokenize_prompts(tokenizer, texts, sampler.device)
    rollout = sampler(ids, mask, max_new_tokens, generator)
    responses = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
    rewards = score(reward_fn, texts, responses, chunk_labels, name=reward_name,
                    index_base=index_base, timeout=timeout)
    lengths = rollout.response_mask.sum(-1).cpu().tolist()
    truncated = rollout.truncated.cpu().tolist()
    for j, (_, weight) in enumerate(chunk):
        rows = slice(j * n, (j + 1) * n)
        sums.add_group(rewards[rows], weight, response_length=lengths[rows],
                       truncated=truncated[rows])
