"""Rewards served outside the reward function: the flags of a remote reward model
(``--rm-type remote_rm --rm-url``), of group rewards (``--group-rm``), of a generative judge
(``--rm-type genrm --genrm-model-path``; its template rules, shared with
relax/rollout/reward/genrm.py) and their rules.

The section (``cfg.rollout.rewards``) and its rules; the rules run
with the rest of validation (relax/config/validate.py) and, like it, never touch the network:
whether the URL answers is checked when the trainer starts (relax/rollout/reward/remote_reward.py).
Torch-free.
"""

from __future__ import annotations

import os
import string
from dataclasses import dataclass

from relax.config.checks import check_url, reject
from relax.config.presets import BUILTIN_TASK_NAMES
from relax.config.section import Section, option, value_of

RM_TYPES: tuple[str, ...] = ("math", "remote_rm", "genrm", *BUILTIN_TASK_NAMES)

# The remote client's defaults are slime's and Relax's remote_rm: ten attempts, waits of
# min(2**k, 30) s plus up to a second of jitter, 64 requests in flight, one sample a request.
DEFAULT_RETRIES = 9
DEFAULT_BACKOFF = 1.0
MAX_BACKOFF_WAIT = 30.0


# The judge's prompt. {label} is the data row's label (a reasoning-gym item's "answer").
DEFAULT_TEMPLATE = (
    "You are grading a student's answer to a question.\n\n"
    "Question:\n{prompt}\n\n"
    "Reference answer: {label}\n\n"
    "Student answer:\n{response}\n\n"
    "Does the student's final answer match the reference answer? Reply with one word: "
    "Yes or No.")
TEMPLATE_FIELDS = ("prompt", "response", "label")
MAX_TEMPLATE_BYTES = 1 << 16


def template_problem(text: str) -> str | None:
    """Why ``text`` cannot be a judging template, or None: it must name ``{response}``, may
    name ``{prompt}`` and ``{label}``, nothing else (``{{``/``}}`` are literal braces), and
    each field plainly: a format spec (``{response:>10000000}`` pads to ten million
    characters), a conversion (``{response!r}``) or a nested field would make the filled
    prompt something other than the text it names."""
    try:
        fields = list(_fields(text))
    except ValueError as e:
        return f"not a template ({e}); write literal braces as {{{{ and }}}}"
    for name, spec, conversion in fields:
        if name not in TEMPLATE_FIELDS:
            return (f"unknown field {{{name}}}; a template may use {{prompt}}, {{response}} "
                    "and {label}")
        if spec or conversion is not None:
            written = "{" + name + (f"!{conversion}" if conversion is not None else "") + \
                (f":{spec}" if spec else "") + "}"
            return (f"field {written} has a {'format spec' if spec else 'conversion'}; write "
                    f"{{{name}}} alone (the text is inserted as it is)")
    if not any(name == "response" for name, _, _ in fields):
        return "has no {response} field; the judge must see the response it judges"
    return None


def _fields(text: str):
    """``(name, format spec, conversion)`` of each replacement field, in order."""
    for _, name, spec, conversion in string.Formatter().parse(text):
        if name is not None:
            yield name, spec, conversion


def fill_template(template: str, *, prompt: str, response: str, label) -> str:
    """The template with each field replaced by its text: the same parse as
    :func:`template_problem`, so only what it accepted is ever filled (no ``str.format``)."""
    if isinstance(label, dict) and "answer" in label:  # a reasoning-gym item
        label = label["answer"]
    values = {"prompt": prompt, "response": response, "label": label}
    return "".join(literal + ("" if name is None else str(values[name]))
                   for literal, name, _, _ in string.Formatter().parse(template))


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
    timeout: float = option(
        30.0,
        'Seconds per sample a reward function may take; with --rm-url, one request as a whole '
        '(docs/reliability.md).',
        flag='reward_timeout',
        bound=(lambda v: 0.0 < v <= 86400.0, "must lie in (0, 86400] seconds (one day); the default is 30"))
    error_policy: str = option(
        'raise',
        'A reward that raises, times out or is NaN/Inf: stop with an error naming the sample, '
        'or score it 0 and count it in rollout/reward_errors.',
        flag='reward_error_policy',
        choices=('raise', 'zero'))
    url: str | None = option(
        None,
        'With --rm-type remote_rm: the http(s) URL the trainer POSTs samples to as JSON, one '
        'reward back per sample (docs/reward_services.md). Must accept connections when relax '
        'train starts.',
        flag='rm_url',
        metavar='URL')
    max_concurrency: int = option(
        64,
        'Most --rm-url requests in flight at once per data-parallel rank.',
        flag='reward_max_concurrency')
    batch_size: int = option(
        1,
        "Samples per --rm-url request. 1: one JSON object per request (slime's and Relax's "
        'format); N > 1: a JSON array of up to N objects, answered by an array.',
        flag='rm_batch_size')
    retries: int = option(
        DEFAULT_RETRIES,
        'Retries of an --rm-url request after a connection error, a timeout or an HTTP 5xx '
        'answer (then --reward-error-policy decides); 0: none.',
        flag='rm_retries')
    retry_backoff: float = option(
        DEFAULT_BACKOFF,
        'Seconds B of the retry waits: before retry k (0, 1, ...) min(B * 2**k, 30) plus a '
        'uniform jitter in [0, B).',
        flag='rm_retry_backoff',
        metavar='SECONDS')
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
        metavar='DIR')
    genrm_prompt_template: str | None = option(
        None,
        'A text file: the judging prompt, with {response} and optionally {prompt} and {label};'
        ' needs --rm-type genrm.',
        metavar='FILE',
        default_text='the template of docs/reward_services.md')
    genrm_max_response_len: int = option(
        16,
        "Most tokens of the judge's verdict; needs --rm-type genrm.")


_GENRM_ONLY = ("genrm_model_path", "genrm_prompt_template", "genrm_max_response_len")

# the flags only the remote reward model reads
_REMOTE_ONLY = ("rm_url", "reward_max_concurrency", "rm_batch_size", "rm_retries",
                "rm_retry_backoff")


def check_reward_services(cfg, explicit: set[str]) -> None:
    """The remote reward model's and ``--group-rm``'s rules (ConfigError on the first)."""
    remote = cfg.rollout.rewards.rm_type == "remote_rm"
    for dest in _REMOTE_ONLY:
        if dest in explicit and not remote:
            reject(cfg, dest, "only applies to the remote reward model; add --rm-type "
                   "remote_rm or remove this flag")
    if remote:
        _check_remote(cfg)
    for dest in _GENRM_ONLY:
        if dest in explicit and cfg.rollout.rewards.rm_type != "genrm":
            reject(cfg, dest, "only applies to the generative judge; add --rm-type genrm or "
                   "remove this flag")
    if cfg.rollout.rewards.rm_type == "genrm":
        _check_genrm(cfg)
    if cfg.rollout.rewards.group_rm:
        _check_group_rm(cfg)


def _check_remote(cfg) -> None:
    if cfg.rollout.rewards.url is None:
        reject(cfg, "rm_type", "needs --rm-url URL, the address of the reward server (e.g. "
               "http://127.0.0.1:8000/reward)")
    check_url(cfg, "rm_url", cfg.rollout.rewards.url, "http://127.0.0.1:8000/reward")
    if cfg.rollout.rewards.max_concurrency < 1:
        reject(cfg, "reward_max_concurrency", "must be >= 1 requests in flight")
    if not 1 <= cfg.rollout.rewards.batch_size <= 1 << 16:
        reject(cfg, "rm_batch_size", "must lie in [1, 65536] samples per request")
    if not 0 <= cfg.rollout.rewards.retries <= 100:
        reject(cfg, "rm_retries", "must lie in [0, 100]; 0 turns retries off")
    if not 0 < cfg.rollout.rewards.retry_backoff <= MAX_BACKOFF_WAIT:
        reject(cfg, "rm_retry_backoff", f"must lie in (0, {MAX_BACKOFF_WAIT:g}] seconds, "
               "e.g. 1")


def _check_group_rm(cfg) -> None:
    if cfg.rollout.rewards.custom_rm_path is None:
        reject(cfg, "group_rm", "scores groups with --custom-rm-path module:function; add it "
               "(a function of one group's prompts, responses and labels)")
    for dest in ("env", "use_agentic_rollout"):
        if value_of(cfg, dest):
            reject(cfg, ("group_rm", dest), "episodes are scored by their environment or "
                   "agent; remove --group-rm")


def _check_genrm(cfg) -> None:
    path = cfg.rollout.rewards.genrm_model_path
    if path is None:
        reject(cfg, "rm_type", "needs --genrm-model-path DIR, the judge's Hugging Face model "
               "directory")
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        reject(cfg, "genrm_model_path", "not a Hugging Face model directory (no config.json); "
               "point it at the judge model")
    if not 1 <= cfg.rollout.rewards.genrm_max_response_len <= 4096:
        reject(cfg, "genrm_max_response_len", "must lie in [1, 4096] tokens")
    if cfg.evaluation.interval is not None:
        reject(cfg, ("rm_type", "eval_interval"), "evaluation measures pass@k against a "
               "verifiable reward; evaluate the saved model with relax eval and --rm-type math "
               "or a reward function")
    if cfg.rollout.rewards.genrm_prompt_template is not None:
        problem = read_template_problem(cfg.rollout.rewards.genrm_prompt_template)
        if problem:
            reject(cfg, "genrm_prompt_template", problem)


def read_template(path: str) -> str:
    """The template file's text (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return f.read(MAX_TEMPLATE_BYTES + 1)


def read_template_problem(path: str) -> str | None:
    try:
        text = read_template(path)
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot read it ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
    if len(text.encode("utf-8")) > MAX_TEMPLATE_BYTES:
        return f"larger than {MAX_TEMPLATE_BYTES} bytes; a judging prompt is a few lines"
    return template_problem(text)
