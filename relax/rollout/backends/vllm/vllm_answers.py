"""What a vLLM server's ``/v1/completions`` answer must hold before Relax uses any of it: the
sampler's answer (:func:`completion`, one sampled response) and the distillation teacher's
(:func:`prompt_log_probs`, the log-probs of the tokens sent).

:func:`weight_version` checks the weights version a server reports (``GET /weight_info``).

The answer comes from another process, possibly another machine or a proxy in front of it, so
it is checked as input: the JSON shape, one entry per token, token ids that are integers of the
trainer's vocabulary, no more tokens than asked, and log-probs that are finite and <= 0.
Unchecked, each of these became a Python traceback, a log-prob copied across a response, a
response longer than ``--rollout-max-response-len`` or a NaN that the trainer blamed on
``--lr``. No tolerance above 0 is needed: vLLM computes ``log_softmax`` in float32 as
``(z - max) - log(sum exp(z - max))``, where the sum holds ``exp(0) = 1`` so the log is >= 0,
and ``z - max`` <= 0 under IEEE rounding; a log-prob above 0 is never rounding.

The functions are pure: they raise :class:`BadAnswer` with what is wrong and a cut view of what
came back; the caller adds the server's URL and which request it was
(relax/rollout/backends/vllm/vllm_client.py ``VllmClient.complete``,
relax/trainer/terms/teacher_server.py).
"""

from __future__ import annotations

import math
import numbers

from relax.errors import value_summary


class BadAnswer(ValueError):
    """An answer that cannot be used; ``index``: the prompt of a batched request it concerns
    (None: the answer as a whole)."""

    def __init__(self, reason: str, index: int | None = None):
        super().__init__(reason)
        self.index = index


def completion(answer, *, max_tokens: int, vocab_size: int | None = None) -> dict:
    """The one choice of a sampling request's answer as ``{"token_ids", "log_probs",
    "finish_reason"}``: at least one and at most ``max_tokens`` token ids in
    ``[0, vocab_size)``, each with its log-prob."""
    choice = _choices(answer, 1)[0]
    ids = _token_ids(choice.get("token_ids"), vocab_size)
    if len(ids) > max_tokens or (max_tokens > 0 and not ids):
        raise BadAnswer(f"{len(ids)} token ids for max_tokens {max_tokens}: "
                        f"{value_summary(ids)}")
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list):
        raise BadAnswer(f"no logprobs.token_logprobs list: logprobs is "
                        f"{value_summary(logprobs)}")
    if len(values) != len(ids):
        raise BadAnswer(f"{len(values)} log-probs for {len(ids)} tokens: "
                        f"{value_summary(values)}")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise BadAnswer(f"finish_reason {value_summary(finish)}")
    return {"token_ids": ids, "log_probs": [log_prob(v, f"log-prob {k}")
                                            for k, v in enumerate(values)],
            "finish_reason": finish}


def weight_version(answer) -> int:
    """The version of ``GET /weight_info``'s answer ``{"weight_version": ...}``: vLLM 0.32
    keeps the version as the string ``POST /update_weight_version`` set (the trainer steps
    behind the weights, written in decimal), ``"default"`` until one is set; a JSON integer
    is taken too. Anything else is not a version."""
    value = answer.get("weight_version") if isinstance(answer, dict) else None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if value == "default":
        raise BadAnswer("weight_version 'default', vLLM's value before any version is set "
                        "(restarted since the update?)")
    raise BadAnswer(f"weight_version {value_summary(value)}, not a version (the trainer "
                    f"steps behind the weights): the answer was {value_summary(answer)}")


def prompt_log_probs(answer, prompts: list[list[int]], starts: list[int]) -> list[list[float]]:
    """Per prompt ``k`` of a scoring request (``prompt_logprobs`` 0), the log-probs of its
    tokens ``starts[k]:`` (each >= 1: the first token has none). Entry ``j`` of a choice's
    ``prompt_logprobs`` maps token ids (as strings) to ``{"logprob": x}`` (or ``x``) and must
    hold token ``j`` of the prompt; the choices may come in any order of ``index``."""
    by_index = {}
    for choice in _choices(answer, len(prompts)):
        index = choice.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index in by_index \
                or not 0 <= index < len(prompts):
            raise BadAnswer(f"choice index {value_summary(index)} for {len(prompts)} prompts")
        by_index[index] = choice
    return [_scores(by_index[k].get("prompt_logprobs"), ids, start, k)
            for k, (ids, start) in enumerate(zip(prompts, starts, strict=True))]


def _scores(entries, ids: list[int], start: int, k: int) -> list[float]:
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise BadAnswer(f"prompt {k}: prompt_logprobs for {len(ids)} tokens expected, got "
                        f"{value_summary(entries)}", k)
    out = []
    for j in range(start, len(ids)):
        entry = entries[j]
        item = entry.get(str(ids[j])) if isinstance(entry, dict) else None
        if isinstance(item, dict):
            item = item.get("logprob")
        if item is None:
            raise BadAnswer(f"prompt {k}: prompt log-prob entry {j} lacks token {ids[j]}: "
                            f"{value_summary(entry)}", k)
        try:
            out.append(log_prob(item, f"prompt {k}: the log-prob of token {j}"))
        except BadAnswer as e:
            raise BadAnswer(str(e), k) from None
    return out


def log_prob(value, what: str) -> float:
    """``value`` as a log-prob: a JSON number, finite and <= 0 (the module docstring says
    why 0 needs no tolerance)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadAnswer(f"{what} is {value_summary(value)}, not a number")
    x = float(value)
    if not math.isfinite(x) or x > 0:
        raise BadAnswer(f"{what} is {x!r}; a log-prob is finite and <= 0")
    return x


def _choices(answer, n: int) -> list[dict]:
    """The ``choices`` of ``answer``: a list of ``n`` JSON objects."""
    if not isinstance(answer, dict):
        raise BadAnswer(f"not a JSON object: {value_summary(answer)}")
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        raise BadAnswer(f"{n} choice(s) expected, got choices {value_summary(choices)}")
    for choice in choices:
        if not isinstance(choice, dict):
            raise BadAnswer(f"a choice is {value_summary(choice)}, not a JSON object")
    return choices


def _token_ids(value, vocab_size: int | None) -> list[int]:
    """A list of integer token ids in ``[0, vocab_size)``."""
    if not isinstance(value, list):
        raise BadAnswer(f"no token_ids list: {value_summary(value)}")
    for k, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (
                vocab_size is not None and token >= vocab_size):
            bound = f" [0, {vocab_size})" if vocab_size is not None else " >= 0"
            raise BadAnswer(f"token id {k} is {value_summary(token)}, not an integer in"
                            f"{bound}: {value_summary(value)}")
    return list(value)
