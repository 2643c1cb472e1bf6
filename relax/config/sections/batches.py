"""The batches section (``cfg.batches``): sizes in prompts and samples (responses),
micro-batching, token budgets and dynamic sampling, with their rules; the resolved sizes
against the data-parallel world size: :func:`resolved_batches`. Torch-free.

The bounds on the work of one rollout step are checked before anything is built: a typo such
as ``--rollout-batch-size 10000000`` would otherwise build ten million prompts and end in the
kernel's OOM killer, without a word. They are far above published setups (DAPO: 512 prompts x
16 samples = 8192 samples a step) and low enough that exceeding them is a mistake."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import check_custom_path
from relax.config.constants import BUILTIN_FILTER_NAMES
from relax.config.section import Needs, Section, option, reject, replace_flat, value_of

MAX_SAMPLES_PER_STEP = 1 << 20  # samples (or episodes) one rollout step or round generates
MAX_ROUNDS = 1000  # --dynamic-sampling-max-rounds
EPOCHS_WHEN_UNSET = 1  # --num-epoch resolved when neither it nor --num-rollout is given

NEEDS_TOKEN_BUDGET = Needs(lambda cfg: cfg.batches.use_dynamic_batch_size, "has no effect without "
                           "--use-dynamic-batch-size; add it or remove the budget",
                           given="changed")
_NO_FILTER = ("has no effect without --dynamic-sampling-filter-path; add "
              "--dynamic-sampling-filter-path nonzero_std or remove it")

@dataclass(frozen=True)
class BatchSection(Section):
    """Sizes in prompts and samples (responses), micro-batching and dynamic sampling."""

    rollout_batch_size: int = option(
        8,
        'Prompts per rollout step; a multiple of WORLD_SIZE.',
        bound=(lambda v: v >= 1, "must be >= 1 prompts per rollout step"))
    n_samples_per_prompt: int = option(
        1,
        'Responses per prompt (a group); > 1 for reinforce_plus_plus_baseline '
        '(reinforce_plus_plus.md §8).',
        bound=(lambda v: v >= 1, "must be >= 1 responses per prompt"))
    global_batch_size: int | None = option(
        None,
        'Samples per optimizer step; divides the rollout samples, multiple of WORLD_SIZE x '
        "--micro-batch-size (reinforce_plus_plus.md §7: one step's loss).",
        default_text='rollout samples (one optimizer step per rollout)',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 samples per step"))
    micro_batch_size: int | None = option(
        None,
        'Samples per forward/backward per rank.',
        default_text='global batch / WORLD_SIZE',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 samples per rank"))
    use_dynamic_batch_size: bool = option(
        False,
        'Token-budget micro-batches of at most --max-tokens-per-gpu tokens (instead of '
        '--micro-batch-size rows): packed passes take rows in order while their lengths fit; '
        '--pass-layout padded groups rows by length and counts padded slots. The loss is the '
        'same (reinforce_plus_plus.md §7).')
    max_tokens_per_gpu: int | None = option(
        None,
        'Tokens (prompt + response; padded slots with --pass-layout padded) per micro-batch of'
        ' the update.',
        default_text='none; required by --use-dynamic-batch-size',
        requires=NEEDS_TOKEN_BUDGET)
    log_probs_max_tokens_per_gpu: int | None = option(
        None,
        'The same budget for the no-grad old and reference log-prob passes (no activations '
        'kept, so it can be larger).',
        default_text='--max-tokens-per-gpu',
        requires=NEEDS_TOKEN_BUDGET)
    pass_layout: str = option(
        'shared-prefix',
        'How the old-policy, reference and update passes lay out a micro-batch. shared-prefix:'
        ' its rows as one sequence without padding, attention within each row, the samples of '
        "a prompt sharing one copy of it (log-probs and gradients equal the padded passes'); "
        'packed: the same, every row with its own prompt; padded: every row padded to the '
        'longest of its micro-batch. Llama and Qwen3 models pack; other models, and rows whose'
        ' attention has holes, run padded. With shared-prefix the generative judge\'s'
        ' (--rm-type genrm) prefill also shares the beginning of a prompt\'s judging prompts.',
        choices=('shared-prefix', 'packed', 'padded'))
    num_steps_per_rollout: int | None = option(
        None,
        'Optimizer steps per rollout step; alone it sets the global batch.',
        default_text='rollout samples / global batch',
        bound=(lambda v: v is None or v >= 1, "must be >= 1"))
    num_rollout: int | None = option(
        None,
        'Rollout steps to run; required without --prompt-data.',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 rollout steps"))
    num_epoch: int | None = option(
        None,
        'Passes over --prompt-data when --num-rollout is not given.',
        default_text=str(EPOCHS_WHEN_UNSET),
        bound=(lambda v: v is None or v >= 1, "must be >= 1 passes over --prompt-data"))
    dynamic_sampling_filter_path: str | None = option(
        None,
        'DAPO-style dynamic sampling: a group filter, nonzero_std (keep groups whose rewards '
        "are not all equal) or 'module:function' / 'file.py:function' (rewards, responses, "
        'label) -> bool. Prompts are generated in rounds until --rollout-batch-size groups '
        'pass; the step trains on those only.',
        default_text='off')
    over_sampling_batch_size: int | None = option(
        None,
        'Prompts generated per dynamic-sampling round; >= --rollout-batch-size, a multiple of '
        'WORLD_SIZE.',
        default_text='--rollout-batch-size',
        # partial rollouts over-sample too (relax/config/sections/partial.py)
        requires=Needs(lambda cfg: cfg.batches.dynamic_sampling_filter_path is not None
                       or cfg.rollout.partial.partial_rollout,
                       _NO_FILTER, given="changed"))
    dynamic_sampling_max_rounds: int = option(
        8,
        'Bound on the dynamic-sampling rounds of one rollout step; when it is reached the step'
        ' trains on the groups that passed (rollout/groups_trained), or skips the update when '
        'none did.',
        bound=((lambda v: v >= 1, "must be >= 1 rounds per rollout step"),
               (lambda v: v <= MAX_ROUNDS, f"must be <= {MAX_ROUNDS} rounds per rollout step")),
        requires=Needs(lambda cfg: cfg.batches.dynamic_sampling_filter_path is not None, _NO_FILTER,
                       given="changed"))

    def check(self) -> None:
        n = self.n_samples_per_prompt
        for dest in ("rollout_batch_size", "over_sampling_batch_size"):
            prompts = value_of(self, dest)
            if prompts is not None and prompts * n > MAX_SAMPLES_PER_STEP:
                reject(self, (dest, "n_samples_per_prompt"), f"{prompts} x {n} = "
                       f"{prompts * n} samples per rollout step, more than the bound of "
                       f"{MAX_SAMPLES_PER_STEP}; use fewer prompts or samples per step")
        if self.use_dynamic_batch_size and self.max_tokens_per_gpu is None:
            reject(self, "use_dynamic_batch_size", "needs --max-tokens-per-gpu N (padded tokens "
                   "per micro-batch)")
        if self.dynamic_sampling_filter_path is not None:
            self._check_filter()

    def _check_filter(self) -> None:
        """Dynamic sampling (DAPO): a filter that can pass a group, rounds that offer at
        least a step's prompts."""
        if self.dynamic_sampling_filter_path in BUILTIN_FILTER_NAMES:
            if self.n_samples_per_prompt < 2:
                reject(self, ("dynamic_sampling_filter_path", "n_samples_per_prompt"), "a group "
                       "of one sample never has two different rewards, so every group would be "
                       "filtered; set --n-samples-per-prompt 8")
        else:
            check_custom_path(self, "dynamic_sampling_filter_path")
        over = self.over_sampling_batch_size
        if over is not None and over < self.rollout_batch_size:
            reject(self, ("over_sampling_batch_size", "rollout_batch_size"), "a round must "
                   "offer at least the prompts a step trains on; use --over-sampling-batch-size "
                   ">= --rollout-batch-size")


# ------------------------------------------------------------------ rules across sections

def check_run_length(cfg, explicit: set[str]) -> None:
    """Sections batches, rollout.data, rollout.episodes: a run without prompt files needs a
    number of rollout steps, and it has one length."""
    if cfg.batches.num_rollout is None and cfg.rollout.data.prompt_data is None:
        what = "--env episodes have" if cfg.rollout.episodes.env else "the built-in task has"
        reject(cfg, "num_rollout", f"{what} no end; set --num-rollout N")
    if cfg.batches.num_epoch is not None:
        if cfg.rollout.data.prompt_data is None:
            reject(cfg, "num_epoch", "only applies to --prompt-data; use --num-rollout")
        if "num_rollout" in explicit:
            reject(cfg, ("num_rollout", "num_epoch"), "give one length: rollout steps or "
                   "passes over --prompt-data")


def check_dynamic_sampling_episodes(cfg, explicit: set[str]) -> None:
    """Sections batches, rollout.episodes: dynamic sampling filters single-turn groups."""
    if cfg.batches.dynamic_sampling_filter_path is not None and (
            cfg.rollout.episodes.env is not None or cfg.rollout.episodes.use_agentic_rollout):
        flag = "env" if cfg.rollout.episodes.env is not None else "use_agentic_rollout"
        reject(cfg, ("dynamic_sampling_filter_path", flag), "dynamic sampling filters the "
               "groups of single-turn rollouts; episodes are not filtered yet, remove one")


def check_token_budget_fits(cfg, explicit: set[str]) -> None:
    """Sections batches, rollout.sampling: a token budget holds at least one row."""
    if not cfg.batches.use_dynamic_batch_size:
        return
    for dest in ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu"):
        value = value_of(cfg, dest)
        if value is not None and value <= cfg.rollout.sampling.rollout_max_response_len:
            reject(cfg, (dest, "rollout_max_response_len"), "a budget must hold at least one "
                   "row: its prompt and a full response; use more than "
                   f"{cfg.rollout.sampling.rollout_max_response_len} tokens")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def resolved_batches(cfg, world_size: int) -> dict:
    """Global batch = samples per optimizer step; micro batch = samples per rank per pass."""
    samples = cfg.batches.rollout_batch_size * cfg.batches.n_samples_per_prompt
    what = (f"a rollout step makes --rollout-batch-size {cfg.batches.rollout_batch_size} x "
            f"--n-samples-per-prompt {cfg.batches.n_samples_per_prompt} = {samples} samples")
    steps, global_batch = cfg.batches.num_steps_per_rollout, cfg.batches.global_batch_size
    if global_batch is None:
        if steps is not None and samples % steps:
            reject(cfg, "num_steps_per_rollout", f"{what}, not divisible into {steps} "
                   f"optimizer steps; use one of {_divisors(samples)}")
        global_batch = samples // steps if steps is not None else samples
    elif samples % global_batch:
        reject(cfg, "global_batch_size", f"{what}, not a multiple of the global batch; use one "
               f"of {_divisors(samples)}")
    elif steps is not None and steps * global_batch != samples:
        reject(cfg, ("global_batch_size", "num_steps_per_rollout"), f"{what}, not "
               f"{steps} x {global_batch}; give only one of the two")
    if cfg.batches.rollout_batch_size % world_size:
        reject(cfg, "rollout_batch_size", f"WORLD_SIZE={world_size} ranks need whole prompt "
               f"groups each; use a multiple of {world_size}")
    if cfg.batches.over_sampling_batch_size is not None and cfg.batches.over_sampling_batch_size % world_size:
        reject(cfg, "over_sampling_batch_size", f"WORLD_SIZE={world_size} ranks need whole "
               f"prompt groups each; use a multiple of {world_size}")
    if global_batch % world_size:
        resolved = replace_flat(cfg, global_batch_size=global_batch)
        reject(resolved, "global_batch_size", f"not divisible by WORLD_SIZE={world_size} ranks; "
               f"use a multiple of {world_size}")
    micro = cfg.batches.micro_batch_size or global_batch // world_size
    if global_batch % (world_size * micro):
        resolved = replace_flat(cfg, global_batch_size=global_batch, micro_batch_size=micro)
        reject(resolved, ("global_batch_size", "micro_batch_size"), f"the global batch must be "
               f"a multiple of WORLD_SIZE={world_size} x --micro-batch-size; use a micro batch "
               f"among {_divisors(global_batch // world_size)}")
    return {"global_batch_size": global_batch, "micro_batch_size": micro,
            "num_steps_per_rollout": samples // global_batch}


def resolved_dynamic_sampling(cfg) -> dict:
    if cfg.batches.dynamic_sampling_filter_path is None:
        return {}
    return {"over_sampling_batch_size": cfg.batches.over_sampling_batch_size or cfg.batches.rollout_batch_size}
