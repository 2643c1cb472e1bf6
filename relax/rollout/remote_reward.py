"""A reward model served over HTTP: ``--rm-type remote_rm --rm-url URL``.

The wire format is slime's and Relax's ``remote_rm`` (docs/reward_services.md): a POST whose
JSON body is one sample ``{"prompt", "response", "label", "metadata"}`` and whose JSON answer
is its reward, a number (or ``{"reward": number}``). With ``--rm-batch-size N > 1`` the body is
an array of up to N such objects and the answer an array of as many rewards, in order.

How it differs from slime's client: requests run on a thread pool of
``--reward-max-concurrency`` workers (slime: one asyncio task per sample, bounded elsewhere);
only what may pass -- a refused or dropped connection, a timeout, an HTTP 5xx -- is retried
(``--rm-retries`` times, waits ``min(B * 2**k, 30) + U(0, B)`` with ``B =
--rm-retry-backoff``, slime's with B = 1); a 4xx or an answer that is not one finite reward per
sample is not retried, since it would come back the same. What still fails is reported per
sample, and :class:`~relax.rollout.scoring.Scorer` applies ``--reward-error-policy`` to it.
Only the standard library: urllib, one connection per request (no keep-alive pool to go stale
between rollout steps), which costs a TCP handshake per request, small next to a reward
model's forward pass.
"""

from __future__ import annotations

import http.client
import json
import math
import numbers
import random
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from relax.config.reward_services import MAX_BACKOFF_WAIT
from relax.errors import InputError, RewardError

MAX_ANSWER_BYTES = 16 << 20  # an answer is a few bytes per sample; more is a wrong endpoint
FLAG = "--rm-url"


class _Transient(Exception):
    """A failure that may pass: retried."""


class _Failed(Exception):
    """A failure that would come back the same: not retried."""


def _peek(raw) -> str:
    """At most 200 characters of what came back, on one line, quoted."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    text = " ".join(text.split())
    return repr(text[:200] + ("..." if len(text) > 200 else ""))


def _reward(value, where: str) -> float:
    """One reward of an answer: a real number or ``{"reward": number}``, finite."""
    if isinstance(value, dict) and "reward" in value:
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Failed(f"{where} is not a number or {{\"reward\": number}}: {_peek(json.dumps(value))}")
    value = float(value)
    if not math.isfinite(value):
        raise _Failed(f"{where} is {value}, not a finite reward")
    return value


class RemoteRewardModel:
    """Rewards of samples from the server at ``url``.

    ``timeout``: seconds per sample a request may stay silent (``--reward-timeout``; a request
    of k samples gets k times it). ``sleep`` is the wait between attempts (tests pass a fake).
    """

    def __init__(self, url: str, *, concurrency: int = 64, batch_size: int = 1,
                 timeout: float = 30.0, retries: int = 9, backoff: float = 1.0,
                 sleep=time.sleep):
        self.url, self.concurrency, self.batch_size = url, concurrency, batch_size
        self.timeout, self.retries, self.backoff, self.sleep = timeout, retries, backoff, sleep
        self._jitter = random.Random()  # its own: the run's seeded RNGs stay untouched
        self._opener = urllib.request.build_opener()

    @classmethod
    def of(cls, rollout) -> RemoteRewardModel:
        """From the rollout section (relax/config/sections.py)."""
        return cls(rollout.rm_url, concurrency=rollout.reward_max_concurrency,
                   batch_size=rollout.rm_batch_size, timeout=rollout.reward_timeout,
                   retries=rollout.rm_retries, backoff=rollout.rm_retry_backoff)

    @property
    def name(self) -> str:
        return f"{FLAG} {self.url}"

    def check_reachable(self, connect_timeout: float = 10.0) -> None:
        """An :class:`InputError` naming ``--rm-url`` unless something accepts a TCP connection
        at its host and port. Only a connection: a probe POST would be scored as a sample."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname, port),
                                          timeout=min(connect_timeout, self.timeout)):
                pass
        except OSError as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise InputError(f"{self.name}: nothing accepts connections at {parts.hostname}:"
                             f"{port} ({reason}); start the reward server first "
                             "(examples/reward_server/) or fix the URL") from None

    # ------------------------------------------------------------------ scoring
    def score(self, prompts: list[str], responses: list[str], labels: list, *,
              metadata: list[dict] | None = None, index_base: int = 0,
              ) -> tuple[list[float], list[str | None]]:
        """Rewards [n] and one message per sample (None where it scored): the requests of
        ``--rm-batch-size`` samples run ``--reward-max-concurrency`` at a time. A failed
        sample's reward is NaN."""
        n = len(prompts)
        metadata = metadata or [{} for _ in range(n)]
        samples = [{"prompt": p, "response": r, "label": y, "metadata": m}
                   for p, r, y, m in zip(prompts, responses, labels, metadata, strict=True)]
        starts = list(range(0, n, self.batch_size))
        values, errors = [math.nan] * n, [None] * n
        if not starts:
            return values, errors
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(starts)),
                                  thread_name_prefix="relax-remote-rm")
        try:
            futures = [pool.submit(self._score_chunk, samples[s:s + self.batch_size])
                       for s in starts]
            for s, future in zip(starts, futures, strict=True):
                chunk_values, message = future.result()
                for k, v in enumerate(chunk_values):
                    values[s + k] = v
                    if message is not None:
                        errors[s + k] = self._message(message, index_base + s + k, prompts[s + k])
        finally:
            # an interrupted step does not wait for the requests still in flight
            pool.shutdown(wait=False, cancel_futures=True)
        return values, errors

    def __call__(self, prompts: list[str], responses: list[str], labels: list) -> list[float]:
        """A reward function (rewards.py's signature, as evaluation calls it): the first failed
        sample is a :class:`RewardError`."""
        values, errors = self.score(prompts, responses, labels)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise RewardError(first)
        return values

    def _message(self, what: str, index: int, prompt: str) -> str:
        head = prompt[:60].replace("\n", "\\n")
        return (f"reward model {self.name}: {what} (sample {index}, prompt {head!r}"
                f"{'...' if len(prompt) > 60 else ''})")

    def _score_chunk(self, chunk: list[dict]) -> tuple[list[float], str | None]:
        """One request's rewards, or NaNs and why they failed."""
        single = self.batch_size == 1
        body = json.dumps(chunk[0] if single else chunk, default=str).encode("utf-8")
        try:
            answer = self._post(body, len(chunk))
            if single:
                return [_reward(answer, "the answer")], None
            if not isinstance(answer, list) or len(answer) != len(chunk):
                raise _Failed(f"answered {_peek(json.dumps(answer))} to a batch of "
                              f"{len(chunk)} samples; expected a JSON array of {len(chunk)} "
                              "rewards")
            return [_reward(v, f"reward {i} of the answer") for i, v in enumerate(answer)], None
        except _Failed as e:
            return [math.nan] * len(chunk), str(e)

    def _post(self, body: bytes, n: int):
        """The decoded JSON answer, after at most ``retries`` retries of transient failures."""
        limit = self.timeout * n
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF_WAIT)
                           + self._jitter.uniform(0, self.backoff))
            try:
                return self._once(body, limit)
            except _Transient as e:
                last = e
        tries = f"after {self.retries + 1} attempts" if self.retries else "no retries (--rm-retries 0)"
        raise _Failed(f"{last}, {tries}")

    def _once(self, body: bytes, limit: float):
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(request, timeout=limit) as answer:
                raw = answer.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            text = _peek(e.read(1000) if e.fp is not None else b"")
            if e.code >= 500:
                raise _Transient(f"HTTP {e.code} {text}") from None
            raise _Failed(f"answered HTTP {e.code} {text}") from None
        except TimeoutError:
            raise _Transient(f"no answer within {limit:g} s (--reward-timeout)") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise _Transient(f"no answer within {limit:g} s (--reward-timeout)") from None
            raise _Transient(f"connection failed: {e.reason}") from None
        except (OSError, http.client.HTTPException) as e:  # reset, dropped mid-answer
            raise _Transient(f"connection failed: {type(e).__name__}: {e}") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise _Failed(f"answered more than {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise _Failed(f"answered something that is not JSON: {_peek(raw)}") from None
