"""The sampler interface of relax/rollout/generation/sampler.py served by a vLLM server
(``--rollout-backend vllm``): token ids in, token ids and log-probs out, nothing
re-tokenized.

    sampler = VllmSampler(client, eos_token_ids=eos, pad_token_id=pad,
                          params=SamplingParams(temperature=1.0), device=device)
    rollout = sampler(prompt_ids, prompt_mask, max_new_tokens=64, generator=g)

Each row is its own request with its own seed, drawn from ``generator``: vLLM's seeded
sampling draws from the seed and the position alone, so rows of one request sharing a seed
(a group's copies of one prompt) would sample the same response. The requests go out
together and the server batches them. The log-prob of each sampled token comes back under
the server's ``--logprobs-mode``, which the backend picks so that it is softmax(z / T)
before top-p / top-k truncation, the distribution the trainer's log-probs describe
(relax/config/sections/backend.py ``log_probs_mode``); the mismatch metrics, TIS and OPSM
then compare like with like (reinforce_plus_plus.md §7a).

Partial rollouts (``stop``, relax/rollout/partial.py) decode in rounds: every unfinished row
asks for at most ``chunk`` more tokens (``--vllm-partial-chunk-tokens``), its context being
its prompt and every token drawn so far, and ``stop(finished)`` is asked after each round.
Relax's engine asks it after every token; a round ends the same rule on token counts alone,
never on time, so which rows finish and how many tokens each holds depends only on the
sampled tokens, and a seeded run repeats as a single-turn one does. A row cut between rounds
(or carried into a later step) continues from its tokens: each round is a request conditioned
on the whole row so far, with a seed of its own from ``generator``.
"""

from __future__ import annotations

import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from relax.config.section import default_of
from relax.config.sections.backend import BackendSection
from relax.rollout.generation.generate import Rollout
from relax.rollout.generation.sampler import SamplingParams
from relax.waits import future_result

MAX_IN_FLIGHT = 64  # requests per rank at once; the server's scheduler batches them


class VllmSampler:
    """``sampler(ids, mask, max_new_tokens, generator) -> Rollout`` for left-padded prompts
    ``ids`` / ``mask`` [B, P], like :class:`~relax.rollout.generation.sampler.Sampler`; ``version`` is
    the trainer step whose weights the server holds (relax/rollout/backends/vllm/vllm_sync.py sets it).
    ``Rollout.policy_version`` holds each row's version as its server reported it (a pool's
    answers carry it, router.py; over rounds the oldest), else ``version``. ``vocab_size``: the policy's embedding rows; a token
    id the server answers outside them stops the run (vllm_answers.py), as would one past
    ``max_new_tokens`` or a log-prob that is not finite and <= 0."""

    def __init__(self, client, *, eos_token_ids: list[int], pad_token_id: int,
                 params: SamplingParams, device: torch.device, version: int = 0,
                 chunk: int = default_of(BackendSection, "vllm_partial_chunk_tokens"),
                 vocab_size: int | None = None):
        self.client, self.params, self.device = client, params, device
        self.eos_token_ids, self.pad_token_id = list(eos_token_ids), pad_token_id
        self.version, self.chunk, self.vocab_size = version, chunk, vocab_size

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
                 generator: torch.Generator | list[torch.Generator] | None = None, *,
                 budgets=None, stop=None, cache=None) -> Rollout:
        """``generator``: one stream for the batch or a list of one per row (each row's
        request seeds drawn from its own). ``budgets`` [B]: fewer tokens for some rows.
        ``cache`` (a turn cache's rows, relax/rollout/generation/turn_cache.py): only its
        keys are read, as each row's session, so that a pool of servers (router.py) keeps an
        episode's turns on the server whose prefix cache holds its context;
        ``stop(finished [B] bool) -> bool``: end the decode early (partial rollouts), asked
        after every round of ``chunk`` tokens."""
        B = ids.shape[0]
        prompts = [row[keep].tolist() for row, keep in zip(ids.cpu(), mask.cpu(), strict=True)]
        limits = [max_new_tokens] * B if budgets is None else [
            min(max_new_tokens, int(b)) for b in budgets.tolist()]
        sessions = _sessions(cache, B)
        if stop is not None:
            return self._rollout(ids, mask, self._rounds(prompts, limits, generator, stop,
                                                         sessions))
        return self._rollout(ids, mask, self._complete(prompts, limits,
                                                       _seeds(generator, range(B)), range(B),
                                                       sessions))

    def _complete(self, prompts: list[list[int]], limits: list[int],
                  seeds: list[int], rows, sessions: list) -> list[dict]:
        """One request per row (``rows``: their rows in the batch, named by a bad answer's
        error; ``sessions``: every row's of the batch), sent together (the server batches
        them)."""
        p, rows = self.params, list(rows)
        sessions = [sessions[i] for i in rows]
        with ThreadPoolExecutor(max_workers=max(1, min(len(prompts), MAX_IN_FLIGHT))) as pool:
            futures = [pool.submit(
                self.client.complete, prompt, max_tokens=limit, temperature=p.temperature,
                top_p=p.top_p, top_k=p.top_k, seed=seed, stop_token_ids=self.eos_token_ids,
                vocab_size=self.vocab_size, label=f"sample {row} of the batch", session=session)
                for prompt, limit, seed, row, session in zip(prompts, limits, seeds, rows,
                                                             sessions, strict=True)]
            try:
                return [future_result(f) for f in futures]
            except BaseException:
                for f in futures:  # a dead server fails the rest fast; queued ones never start
                    f.cancel()
                raise

    def _rounds(self, prompts: list[list[int]], limits: list[int], generator,
                stop, sessions: list) -> list[dict]:
        """Each row's tokens and log-probs, decoded ``chunk`` tokens per round until every
        row ended (EOS or its limit) or ``stop(finished)`` holds after a round."""
        answers = [{"token_ids": [], "log_probs": [], "version": None} for _ in prompts]
        finished = [limit <= 0 for limit in limits]
        eos = set(self.eos_token_ids)
        while not all(finished):
            live = [i for i, f in enumerate(finished) if not f]
            parts = self._complete(
                [prompts[i] + answers[i]["token_ids"] for i in live],
                [min(self.chunk, limits[i] - len(answers[i]["token_ids"])) for i in live],
                _seeds(generator, live), live, sessions)
            for i, part in zip(live, parts, strict=True):
                a = answers[i]
                a["token_ids"] += part["token_ids"]
                a["log_probs"] += part["log_probs"]
                a["version"] = _oldest(a["version"], part.get("version"))
                finished[i] = (len(a["token_ids"]) >= limits[i]
                               or bool(part["token_ids"]) and part["token_ids"][-1] in eos)
            if stop(torch.tensor(finished, dtype=torch.bool, device=self.device)):
                break
        return answers

    def _rollout(self, ids, mask, answers: list[dict]) -> Rollout:
        B = len(answers)
        T = max(1, max((len(a["token_ids"]) for a in answers), default=0))
        response = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((B, T), dtype=torch.bool)
        log_probs = torch.zeros((B, T), dtype=torch.float32)
        ended = torch.zeros(B, dtype=torch.bool)
        versions = [self.version if a.get("version") is None else a["version"] for a in answers]
        eos = set(self.eos_token_ids)
        for i, a in enumerate(answers):
            n = len(a["token_ids"])
            response[i, :n] = torch.tensor(a["token_ids"], dtype=torch.long)
            response_mask[i, :n] = True
            log_probs[i, :n] = torch.tensor(a["log_probs"], dtype=torch.float32)
            ended[i] = n > 0 and a["token_ids"][-1] in eos
        d = self.device
        return Rollout(ids, mask, response.to(d), response_mask.to(d), (~ended).to(d),
                       log_probs=log_probs.to(d),
                       policy_version=torch.tensor(versions, dtype=torch.long, device=d))


def _oldest(a: int | None, b: int | None) -> int | None:
    """The older of two versions, either of which may be unknown (None)."""
    return b if a is None else a if b is None else min(a, b)


def _sessions(cache, rows: int) -> list:
    """Each row's session: its turn cache's key (with the cache, whose keys are its own), or
    None for a single-turn call."""
    keys = getattr(cache, "keys", None)
    if keys is None:
        return [None] * rows
    owner = id(getattr(cache, "cache", cache))  # the TurnCache: its keys are its own
    return [(owner, key) for key in keys]


def _seeds(generator, rows) -> list[int]:
    """A request seed for each of ``rows`` (row indices of the batch): drawn together from one
    stream, or each from its row's own when ``generator`` is a list of one per row."""
    rows = list(rows)
    if not isinstance(generator, (list, tuple)):
        return torch.randint(0, 2**31 - 1, (len(rows),), generator=_cpu(generator)).tolist()
    return [int(torch.randint(0, 2**31 - 1, (1,), generator=_cpu(generator[i]))) for i in rows]


def _cpu(generator: torch.Generator | None) -> torch.Generator | None:
    """The seeds are drawn on the CPU; a CUDA run's generator seeds a CPU one the same way,
    made once per generator, so that the calls an episode's turns make with one generator
    draw on along one stream (new seeds each turn) as a CPU run's do."""
    if generator is None or generator.device.type == "cpu":
        return generator
    cpu = _SHADOWS.get(generator)
    if cpu is None:
        cpu = _SHADOWS[generator] = torch.Generator()
        cpu.manual_seed(generator.initial_seed())
    return cpu


# a CUDA generator's CPU stream, while the generator lives (a step's rollout stream)
_SHADOWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
