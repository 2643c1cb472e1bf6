"""The rewards section (``cfg.rollout.rewards``): the reward function, a remote reward model
(``--rm-type remote_rm --rm-url``), group rewards (``--group-rm``) and a generative judge
(``--rm-type genrm --genrm-model-path``), with their rules. Like the rest of validation they
never touch the network: whether the URL answers is checked when the trainer starts
(relax/rollout/reward/remote_reward.py). Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from relax.config.checks import check_custom_path, check_url
from relax.config.judge_template import read_template_problem
from relax.config.presets import BUILTIN_TASK_NAMES
from relax.config.section import Needs, Section, option, reject, value_of

RM_TYPES: tuple[str, ...] = ("math", "remote_rm", "genrm", *BUILTIN_TASK_NAMES)

# The remote client's defaults are slime's and Relax's remote_rm: ten attempts, waits of
# min(2**k, 30) s plus up to a second of jitter, 64 requests in flight, one sample a request.
DEFAULT_RETRIES = 9
DEFAULT_BACKOFF = 1.0
MAX_BACKOFF_WAIT = 30.0

# the flags only the remote reward model reads, and those only the generative judge reads
NEEDS_REMOTE = Needs(lambda cfg: cfg.rollout.rewards.rm_type == "remote_rm",
                     "only applies to the remote reward model; add --rm-type remote_rm or "
                     "remove this flag")
NEEDS_GENRM = Needs(lambda cfg: cfg.rollout.rewards.rm_type == "genrm",
                    "only applies to the generative judge; add --rm-type genrm or remove this "
                    "flag")


@dataclass(frozen=True)
class RewardsSection(Section):
    """How samples are scored: a reward function, a remote reward model, a generative judge,
    group rewards (docs/reward_services.md)."""

    rm_type: str | None = option(
        None,
        'Reward for prompt files: math (math-verify answer check), remote_rm (relax train: the'
        ' --rm-url server), genrm (relax train: the --genrm-model-path judge) or a built-in '
        "task's reward.",
        choices=RM_TYPES,
        default_text="the built-in task's reward")
    custom_rm_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' reward; excludes --rm-type.")
    reward_timeout: float = option(
        30.0,
        'Seconds per sample a reward function may take; with --rm-url, one request as a whole '
        '(docs/reliability.md).',
        bound=(lambda v: 0.0 < v <= 86400.0, "must lie in (0, 86400] seconds (one day); the default is 30"))
    reward_error_policy: str = option(
        'raise',
        'A reward that raises, times out or is NaN/Inf: stop with an error naming the sample, '
        'or score it 0 and count it in rollout/reward_errors.',
        choices=('raise', 'zero'))
    rm_url: str | None = option(
        None,
        'With --rm-type remote_rm: the http(s) URL the trainer POSTs samples to as JSON, one '
        'reward back per sample (docs/reward_services.md). Must accept connections when relax '
        'train starts.',
        metavar='URL',
        requires=NEEDS_REMOTE)
    reward_max_concurrency: int = option(
        64,
        'Most --rm-url requests in flight at once per data-parallel rank.',
        bound=(lambda v: v >= 1, "must be >= 1 requests in flight"),
        requires=NEEDS_REMOTE)
    rm_batch_size: int = option(
        1,
        "Samples per --rm-url request. 1: one JSON object per request (slime's and Relax's "
        'format); N > 1: a JSON array of up to N objects, answered by an array.',
        bound=(lambda v: 1 <= v <= 1 << 16, "must lie in [1, 65536] samples per request"),
        requires=NEEDS_REMOTE)
    rm_retries: int = option(
        DEFAULT_RETRIES,
        'Retries of an --rm-url request after a connection error, a timeout or an HTTP 5xx '
        'answer (then --reward-error-policy decides); 0: none.',
        bound=(lambda v: 0 <= v <= 100, "must lie in [0, 100]; 0 turns retries off"),
        requires=NEEDS_REMOTE)
    rm_retry_backoff: float = option(
        DEFAULT_BACKOFF,
        'Seconds B of the retry waits: before retry k (0, 1, ...) min(B * 2**k, 30) plus a '
        'uniform jitter in [0, B).',
        metavar='SECONDS',
        bound=(lambda v: 0 < v <= MAX_BACKOFF_WAIT, f"must lie in (0, {MAX_BACKOFF_WAIT:g}] "
               "seconds, e.g. 1"),
        requires=NEEDS_REMOTE)
    group_rm: bool = option(
        False,
        '--custom-rm-path scores a whole group at a time: it is called once per prompt with '
        "the group's --n-samples-per-prompt prompts, responses and labels and returns one "
        'reward per member (pairwise or relative judgements).')
    genrm_model_path: str | None = option(
        None,
        'With --rm-type genrm: a Hugging Face causal LM directory whose greedy verdict on each'
        " sample is its reward, decoded on the policy's device under the run's precision "
        '(relax/rollout/reward/genrm.py).',
        metavar='DIR',
        requires=NEEDS_GENRM)
    genrm_prompt_template: str | None = option(
        None,
        'A text file: the judging prompt, with {response} and optionally {prompt} and {label};'
        ' needs --rm-type genrm.',
        metavar='FILE',
        default_text='the template of docs/reward_services.md',
        requires=NEEDS_GENRM)
    genrm_max_response_len: int = option(
        16,
        "Most tokens of the judge's verdict; needs --rm-type genrm.",
        bound=(lambda v: 1 <= v <= 4096, "must lie in [1, 4096] tokens"),
        requires=NEEDS_GENRM)

    def check(self) -> None:
        check_custom_path(self, "custom_rm_path")
        if self.rm_type is not None and self.custom_rm_path is not None:
            reject(self, ("rm_type", "custom_rm_path"), "two reward functions; keep one")
        if self.rm_type == "remote_rm":
            if self.rm_url is None:
                reject(self, "rm_type", "needs --rm-url URL, the address of the reward server "
                       "(e.g. http://127.0.0.1:8000/reward)")
            check_url(self, "rm_url", self.rm_url, "http://127.0.0.1:8000/reward")
        if self.rm_type == "genrm":
            self._check_genrm()
        if self.group_rm and self.custom_rm_path is None:
            reject(self, "group_rm", "scores groups with --custom-rm-path module:function; add "
                   "it (a function of one group's prompts, responses and labels)")

    def _check_genrm(self) -> None:
        path = self.genrm_model_path
        if path is None:
            reject(self, "rm_type", "needs --genrm-model-path DIR, the judge's Hugging Face "
                   "model directory")
        if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
            reject(self, "genrm_model_path", "not a Hugging Face model directory (no "
                   "config.json); point it at the judge model")
        if self.genrm_prompt_template is not None:
            problem = read_template_problem(self.genrm_prompt_template)
            if problem:
                reject(self, "genrm_prompt_template", problem)


# ------------------------------------------------------------------ rules across sections

def check_reward_scope(cfg, explicit: set[str]) -> None:
    """Sections rollout.rewards, rollout.episodes, evaluation: episodes are scored by their
    environment or agent; a generative judge's rewards are not for pass@k."""
    if cfg.rollout.rewards.rm_type == "genrm" and cfg.evaluation.eval_interval is not None:
        reject(cfg, ("rm_type", "eval_interval"), "evaluation measures pass@k against a "
               "verifiable reward; evaluate the saved model with relax eval and --rm-type math "
               "or a reward function")
    if cfg.rollout.rewards.group_rm:
        for dest in ("env", "use_agentic_rollout"):
            if value_of(cfg, dest):
                reject(cfg, ("group_rm", dest), "episodes are scored by their environment or "
                       "agent; remove --group-rm")


