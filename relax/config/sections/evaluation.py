"""The evaluation section (``cfg.evaluation``): the evaluation flags of ``relax train``
(periodic evaluation) and of ``relax eval`` (relax/config/eval_command.py), and the rules of
``relax train``'s.

    relax train ... --eval-interval 10 --eval-prompt-data gsm8k data/gsm8k/test.jsonl

``--eval-prompt-data`` takes ``PATH`` (the set is named after the file stem) or
``NAME PATH [NAME PATH ...]`` (Relax/slime convention); the resolved value is a list of
``[name, path]`` pairs, and every metric is ``eval/<name>/...``. Without it, a run on the
built-in task evaluates on :data:`BUILTIN_EVAL_PROMPTS` fixed prompts of that task.

The sampling flags default to the rollout's (``option(follows=...)``: ``--eval-temperature``
unset -> resolved to ``--rollout-temperature`` and so on); ``--eval-temperature 0`` is greedy
decoding. A sample passes when its reward is >= ``--eval-pass-threshold`` (1.0: an exact
answer for the math reward and the built-in tasks). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import eval_pairs
from relax.config.gym_spec import is_reasoning_gym
from relax.config.section import FLOAT32, Needs, Section, followers, head, option, reject, value_of
from relax.config.sections.batches import MAX_SAMPLES_PER_STEP
from relax.config.sections.sampling import MAX_TOKENS
from relax.errors import ConfigError

# Fixed held-out prompts drawn per built-in task when no --eval-prompt-data is given.
BUILTIN_EVAL_PROMPTS = 64

NEEDS_INTERVAL = Needs(lambda cfg: cfg.evaluation.eval_interval is not None,
                       "has no effect without --eval-interval N (evaluation only runs every N "
                       "rollout steps); add --eval-interval or remove it")


@dataclass(frozen=True)
class EvaluationSection(Section):
    """Evaluation as ``relax train --eval-interval`` and ``relax eval`` share it: pass@k
    (unbiased) and mean reward on held-out prompts or ``--env`` seeds; the sampling follows
    the rollout's where its flag is not given; in ``relax train`` every field but the interval
    needs ``--eval-interval``."""

    eval_interval: int | None = option(
        None,
        'Evaluate every N rollout steps and log eval/<name>/pass@k and '
        'eval/<name>/mean_reward.',
        default_note='no evaluation',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 rollout steps"))
    eval_prompt_data: tuple | None = option(
        None,
        'PATH, or NAME PATH pairs, of .jsonl/.parquet prompt files or reasoning-gym:NAME '
        "sources; fields --input-key / --label-key, scored with the run's reward.",
        nargs='+',
        metavar='[NAME] PATH',
        default_text="the built-in task's fixed evaluation prompts",
        requires=NEEDS_INTERVAL)
    n_samples_per_eval_prompt: int = option(
        1,
        'Responses per evaluation prompt; pass@k is logged for k = 1, 2, 4, ... up to this '
        'number.',
        bound=(lambda v: v >= 1, "must be >= 1 responses per prompt"),
        requires=NEEDS_INTERVAL)
    eval_temperature: float | None = option(
        None,
        'Sampling temperature >= 0; 0 is greedy.',
        default_text="in relax train the rollout's temperature, in relax eval 1.0",
        bound=((lambda v: v is None or v >= 0.0, "must be >= 0 (0 is greedy decoding)"),
               FLOAT32),
        follows='rollout_temperature',
        requires=NEEDS_INTERVAL)
    eval_top_p: float | None = option(
        None,
        'Nucleus sampling mass in (0, 1].',
        default_text="in relax train the rollout's top-p, in relax eval 1.0",
        bound=(lambda v: v is None or 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 to turn it off"),
        follows='rollout_top_p',
        requires=NEEDS_INTERVAL)
    eval_top_k: int | None = option(
        None,
        'Top-k sampling, >= 1 or -1.',
        default_text="in relax train the rollout's top-k, in relax eval -1 (off)",
        bound=(lambda v: v is None or v == -1 or v >= 1, "must be >= 1, or -1 to turn top-k off"),
        follows='rollout_top_k',
        requires=NEEDS_INTERVAL)
    eval_max_response_len: int | None = option(
        None,
        'Maximum generated tokens per evaluation response.',
        default_text="in relax train the rollout's maximum response length, in relax eval 1024 (the "
        "preset's for the built-in task)",
        bound=((lambda v: v is None or v >= 1, "must be >= 1 tokens"),
               (lambda v: v is None or v <= MAX_TOKENS, f"must be <= {MAX_TOKENS} tokens")),
        follows='rollout_max_response_len',
        requires=NEEDS_INTERVAL)
    eval_batch_size: int = option(
        64,
        'Sequences (prompts x samples) per generation call.',
        bound=(lambda v: v >= 1, "must be >= 1 sequences per generation call"),
        requires=NEEDS_INTERVAL)
    eval_pass_threshold: float = option(
        1.0,
        'A response passes (counts for pass@k) when its reward is >= this.',
        requires=NEEDS_INTERVAL)
    eval_episodes: int = option(
        64,
        'With --env: episodes of the held-out environment seeds 1000000000, 1000000001, ... an'
        ' evaluation plays (--n-samples-per-eval-prompt plays each); an episode passes when '
        'its reward is >= --eval-pass-threshold.',
        bound=(lambda v: v >= 1, "must be >= 1 episodes"),
        requires=(Needs(lambda cfg: cfg.rollout.episodes.env is not None, "only applies to "
                        "--env (evaluation of prompts runs on --eval-prompt-data); remove it"),
                  NEEDS_INTERVAL))

    def check(self) -> None:
        plays = self.eval_episodes * self.n_samples_per_eval_prompt
        if plays > MAX_SAMPLES_PER_STEP:
            reject(self, ("eval_episodes", "n_samples_per_eval_prompt"),
                   f"{self.eval_episodes} x {self.n_samples_per_eval_prompt} = {plays} episodes "
                   f"per evaluation, more than the bound of {MAX_SAMPLES_PER_STEP}")


# ------------------------------------------------------------------ rules across sections

def check_train_eval(cfg, explicit: set[str]) -> None:
    """Sections evaluation, rollout.data, rollout.rewards: ``relax train``'s evaluation sets
    exist and can be scored."""
    pairs = eval_pairs(cfg)
    if cfg.evaluation.eval_interval is not None and pairs is None and cfg.rollout.data.prompt_data:
        raise ConfigError(head(cfg, "eval_interval"), "with --prompt-data the evaluation set "
                          "must be given; add --eval-prompt-data NAME PATH")
    if (pairs and is_reasoning_gym(cfg.rollout.data.prompt_data) and cfg.rollout.rewards.rm_type is None
            and cfg.rollout.rewards.custom_rm_path is None):
        files = [p for _, p in pairs if not is_reasoning_gym(p)]
        if files:
            raise ConfigError(f"--eval-prompt-data {files[0]}", "a data file needs a reward, "
                              "and the reasoning-gym verifier only scores reasoning-gym sets; "
                              "evaluate on reasoning-gym:NAME or add --custom-rm-path")


def resolved_train_eval(cfg) -> dict:
    """The evaluation fields ``relax train`` resolves: the named sets and the sampling
    settings that follow the rollout's."""
    values = {dest: value_of(cfg, rollout) for dest, rollout in followers(EvaluationSection).items()
              if value_of(cfg, dest) is None}
    return {"eval_prompt_data": eval_pairs(cfg), **values}
