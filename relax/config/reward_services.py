"""Rewards served outside the reward function: the flags of a remote reward model
(``--rm-type remote_rm --rm-url``), of group rewards (``--group-rm``) and their rules.

The fields are built here so relax/config/schema.py stays one line per flag; the rules run
with the rest of validation (relax/config/validate.py) and, like it, never touch the network:
whether the URL answers is checked when the trainer starts (relax/rollout/remote_reward.py).
Torch-free.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from relax.config.checks import reject
from relax.config.fields import option

GROUP = "rewards"

# The remote client's defaults are slime's and Relax's remote_rm: ten attempts, waits of
# min(2**k, 30) s plus up to a second of jitter, 64 requests in flight, one sample a request.
DEFAULT_RETRIES = 9
DEFAULT_BACKOFF = 1.0
MAX_BACKOFF_WAIT = 30.0


def rm_url_option():
    return option(
        None, "With --rm-type remote_rm: the http(s) URL the trainer POSTs samples to as "
        "JSON, one reward back per sample (docs/reward_services.md). Must accept connections "
        "when relax train starts.", group=GROUP, metavar="URL")


def reward_max_concurrency_option():
    return option(
        64, "Most --rm-url requests in flight at once per data-parallel rank.", group=GROUP)


def rm_batch_size_option():
    return option(
        1, "Samples per --rm-url request. 1: one JSON object per request (slime's and "
        "Relax's format); N > 1: a JSON array of up to N objects, answered by an array.",
        group=GROUP)


def rm_retries_option():
    return option(
        DEFAULT_RETRIES, "Retries of an --rm-url request after a connection error, a "
        "timeout or an HTTP 5xx answer (then --reward-error-policy decides); 0: none.",
        group=GROUP)


def rm_retry_backoff_option():
    return option(
        DEFAULT_BACKOFF, "Seconds B of the retry waits: before retry k (0, 1, ...) "
        f"min(B * 2**k, {MAX_BACKOFF_WAIT:g}) plus a uniform jitter in [0, B).", group=GROUP,
        metavar="SECONDS")


def group_rm_option():
    return option(
        False, "--custom-rm-path scores a whole group at a time: it is called once per "
        "prompt with the group's --n-samples-per-prompt prompts, responses and labels and "
        "returns one reward per member (pairwise or relative judgements).", group=GROUP)


# the flags only the remote reward model reads
_REMOTE_ONLY = ("rm_url", "reward_max_concurrency", "rm_batch_size", "rm_retries",
                "rm_retry_backoff")


def check_reward_services(cfg, explicit: set[str]) -> None:
    """The remote reward model's and ``--group-rm``'s rules (ConfigError on the first)."""
    remote = cfg.rm_type == "remote_rm"
    for dest in _REMOTE_ONLY:
        if dest in explicit and not remote:
            reject(cfg, dest, "only applies to the remote reward model; add --rm-type "
                   "remote_rm or remove this flag")
    if remote:
        _check_remote(cfg)
    if cfg.group_rm:
        _check_group_rm(cfg)


def _check_remote(cfg) -> None:
    if cfg.rm_url is None:
        reject(cfg, "rm_type", "needs --rm-url URL, the address of the reward server (e.g. "
               "http://127.0.0.1:8000/reward)")
    problem = url_problem(cfg.rm_url)
    if problem:
        reject(cfg, "rm_url", problem)
    if cfg.reward_max_concurrency < 1:
        reject(cfg, "reward_max_concurrency", "must be >= 1 requests in flight")
    if not 1 <= cfg.rm_batch_size <= 1 << 16:
        reject(cfg, "rm_batch_size", "must lie in [1, 65536] samples per request")
    if not 0 <= cfg.rm_retries <= 100:
        reject(cfg, "rm_retries", "must lie in [0, 100]; 0 turns retries off")
    if not 0 < cfg.rm_retry_backoff <= MAX_BACKOFF_WAIT:
        reject(cfg, "rm_retry_backoff", f"must lie in (0, {MAX_BACKOFF_WAIT:g}] seconds, "
               "e.g. 1")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a reward server's address, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- reading it raises ValueError for a port that is not one
    except ValueError as e:
        return f"not a URL ({e}); give e.g. http://127.0.0.1:8000/reward"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/reward"
    return None


def _check_group_rm(cfg) -> None:
    if cfg.custom_rm_path is None:
        reject(cfg, "group_rm", "scores groups with --custom-rm-path module:function; add it "
               "(a function of one group's prompts, responses and labels)")
    for dest in ("env", "use_agentic_rollout"):
        if getattr(cfg, dest):
            reject(cfg, ("group_rm", dest), "episodes are scored by their environment or "
                   "agent; remove --group-rm")
