"""A reward model served over HTTP: ``--rm-type remote_rm --rm-url URL``.

The wire format is slime's and Relax's ``remote_rm`` (docs/reward_services.md): a POST whose
JSON body is one sample ``{"prompt", "response", "label", "metadata"}`` and whose JSON answer
is its reward, a number (or ``{"reward": number}``). With ``--rm-batch-size N > 1`` the body is
an array of up to N such objects and the answer an array of as many rewards, in order.

How it differs from slime's client: requests run on ``--reward-max-concurrency`` daemon threads
(slime: one asyncio task per sample, bounded elsewhere); each request, from its connection to
the last byte of the answer, has one deadline of ``--reward-timeout`` per sample it carries
(relax/http_post.py; a socket timeout would bound each read only). Only what may pass
-- a refused, dropped or cut-short connection, a timeout, an HTTP 5xx -- is retried
(``--rm-retries`` times, waits ``min(B * 2**k, 30) + U(0, B)`` with ``B =
--rm-retry-backoff``, slime's with B = 1); a redirect, a 4xx or an answer that is not one
reward per sample finite in float32 is not retried, since it would come back the same. What
still fails is reported per sample, and :class:`~relax.rollout.reward.scoring.Scorer` applies
``--reward-error-policy`` to it. Only the standard library, one connection per request (no
keep-alive pool to go stale between rollout steps), which costs a TCP handshake per request,
small next to a reward model's forward pass.
"""

from __future__ import annotations

import http.client
import json
import numbers
import random
import socket
import threading
from urllib.parse import urlsplit

from relax import http_post
from relax.config.section import default_of
from relax.config.sections.rewards import MAX_BACKOFF_WAIT, RewardsSection
from relax.errors import InputError, RewardError
from relax.plugins import bad_reward
from relax.waits import wait_event

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
    """One reward of an answer: a real number or ``{"reward": number}``, finite in float32."""
    if isinstance(value, dict) and "reward" in value:
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Failed(f"{where} is not a number or {{\"reward\": number}}: {_peek(json.dumps(value))}")
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise _Failed(f"{where} is an integer beyond float range: {_peek(str(value))}") from None
    problem = bad_reward(value)
    if problem is not None:
        raise _Failed(f"{where} is {problem}, not a reward")
    return value


class RemoteRewardModel:
    """Rewards of samples from the server at ``url``.

    ``timeout``: seconds per sample a request may take as a whole (``--reward-timeout``; a
    request of k samples gets k times it). ``sleep(seconds)`` is the wait between attempts
    (tests pass a fake); by default a wait that ends early when the step is abandoned.
    """

    # the defaults are the rewards section's (--reward-max-concurrency, --rm-batch-size,
    # --reward-timeout, --rm-retries, --rm-retry-backoff), written once there
    def __init__(self, url: str, *,
                 concurrency: int = default_of(RewardsSection, "reward_max_concurrency"),
                 batch_size: int = default_of(RewardsSection, "rm_batch_size"),
                 timeout: float = default_of(RewardsSection, "reward_timeout"),
                 retries: int = default_of(RewardsSection, "rm_retries"),
                 backoff: float = default_of(RewardsSection, "rm_retry_backoff"), sleep=None):
        self.url, self.concurrency, self.batch_size = url, concurrency, batch_size
        self.timeout, self.retries, self.backoff, self.sleep = timeout, retries, backoff, sleep
        self._jitter = random.Random()  # its own: the run's seeded RNGs stay untouched

    @classmethod
    def of(cls, rewards) -> RemoteRewardModel:
        """From the rewards section (``cfg.rollout.rewards``)."""
        return cls(rewards.rm_url, concurrency=rewards.reward_max_concurrency,
                   batch_size=rewards.rm_batch_size, timeout=rewards.reward_timeout,
                   retries=rewards.rm_retries, backoff=rewards.rm_retry_backoff)

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
        values, errors = [float("nan")] * n, [None] * n
        results = self._run_all([samples[s:s + self.batch_size] for s in starts])
        for s, (chunk_values, message) in zip(starts, results, strict=True):
            for k, v in enumerate(chunk_values):
                values[s + k] = v
                if message is not None:
                    errors[s + k] = self._message(message, index_base + s + k, prompts[s + k])
        return values, errors

    def _run_all(self, chunks: list[list[dict]]) -> list[tuple[list[float], str | None]]:
        """``_score_chunk`` of every chunk on at most ``concurrency`` daemon threads.

        Each chunk ends by itself (each attempt has its deadline, each wait is bounded), so
        the wait for all of them is bounded. An interrupted step (a signal's exception in this
        thread) sets ``stop``: the threads start no further request or retry and end with
        their request in flight; being daemons, they never hold up the interpreter's exit.
        """
        results: list = [None] * len(chunks)
        pending = iter(range(len(chunks)))
        lock, stop, done = threading.Lock(), threading.Event(), threading.Event()
        left = [len(chunks)]

        def work():
            while not stop.is_set():
                with lock:
                    i = next(pending, None)
                if i is None:
                    return
                try:
                    results[i] = self._score_chunk(chunks[i], stop)
                except BaseException as e:  # a bug here must not leave the caller waiting
                    results[i] = e
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        done.set()

        if not chunks:
            return results
        for _ in range(min(self.concurrency, len(chunks))):
            threading.Thread(target=work, daemon=True, name="relax-remote-rm").start()
        try:
            wait_event(done)  # each chunk ends by itself (above)
        finally:
            stop.set()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results

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

    def _score_chunk(self, chunk: list[dict], stop: threading.Event,
                     ) -> tuple[list[float], str | None]:
        """One request's rewards, or NaNs and why they failed."""
        single = self.batch_size == 1
        body = json.dumps(chunk[0] if single else chunk, default=str).encode("utf-8")
        try:
            answer = self._post(body, len(chunk), stop)
            if single:
                return [_reward(answer, "the answer")], None
            if not isinstance(answer, list) or len(answer) != len(chunk):
                raise _Failed(f"answered {_peek(json.dumps(answer))} to a batch of "
                              f"{len(chunk)} samples; expected a JSON array of {len(chunk)} "
                              "rewards")
            return [_reward(v, f"reward {i} of the answer") for i, v in enumerate(answer)], None
        except _Failed as e:
            return [float("nan")] * len(chunk), str(e)

    def _post(self, body: bytes, n: int, stop: threading.Event):
        """The decoded JSON answer, after at most ``retries`` retries of transient failures."""
        limit = self.timeout * n
        for attempt in range(self.retries + 1):
            if attempt:
                wait = (min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF_WAIT)
                        + self._jitter.uniform(0, self.backoff))
                if self.sleep is not None:
                    self.sleep(wait)
                else:
                    stop.wait(wait)
            if stop.is_set():
                raise _Failed("the step was interrupted")
            try:
                return self._once(body, limit)
            except _Transient as e:
                last = e
        tries = f"after {self.retries + 1} attempts" if self.retries else "no retries (--rm-retries 0)"
        raise _Failed(f"{last}, {tries}")

    def _once(self, body: bytes, limit: float):
        try:
            answer = http_post.post(self.url, body, limit=limit, max_bytes=MAX_ANSWER_BYTES)
        except TimeoutError:
            raise _Transient(f"no complete answer within {limit:g} s (--reward-timeout)") from None
        except http_post.TooLarge as e:
            raise _Failed(f"answered more than {MAX_ANSWER_BYTES} bytes ({e})") from None
        except (OSError, http.client.HTTPException) as e:  # refused, reset, cut short
            detail = " ".join(str(e).split())
            raise _Transient(f"connection failed: {type(e).__name__}"
                             f"{': ' + detail if detail else ''}") from None
        status = answer.status
        if 300 <= status < 400:
            raise _Failed(f"answered HTTP {status} redirecting to {answer.location!r}; redirects "
                          f"are not followed (a POST is not re-sent): give the final URL as {FLAG}")
        if status >= 500:
            raise _Transient(f"HTTP {status} {_peek(answer.body[:1000])}")
        if not 200 <= status < 300:
            raise _Failed(f"answered HTTP {status} {_peek(answer.body[:1000])}")
        try:
            return json.loads(answer.body)
        except (ValueError, RecursionError):
            raise _Failed(f"answered something that is not JSON: {_peek(answer.body)}") from None
