"""Agent programs as episodes (``--use-agentic-rollout --agent-command CMD``).

Each episode is one run of an existing agent program. The trainer serves an OpenAI-compatible
Chat Completions endpoint on 127.0.0.1 (an ephemeral port; nothing else can reach it), starts
CMD once per episode with these variables in its environment, and waits for it:

    RELAX_BASE_URL     http://127.0.0.1:PORT/sessions/SESSION/v1 (an OpenAI client's base_url)
    RELAX_SESSION_ID   SESSION, unique per episode
    RELAX_INPUT_JSON   a file holding {"session_id", "prompt", "label", "index", "step"}
    RELAX_OUTPUT_JSON  where the agent writes {"reward": float} before it exits 0

The program may call ``POST {RELAX_BASE_URL}/chat/completions`` any number of times, up to
``--max-turns`` model turns, each with the whole conversation so far (``messages``, optional
``tools``, ``max_tokens``); each call must extend the previous one by the assistant message it
got back plus new user or tool messages. The endpoint records the conversation token-in /
token-out exactly as an ``--env`` episode (relax/rollout/episodes.py): the first call's
rendered messages are the prompt, the model's sampled ids are kept as drawn (loss mask 1), and
only the new messages are rendered with the chat template (mask 0). Sampling uses the run's
``--rollout-temperature`` / top-p / top-k whatever the request asks, so the training
log-probs describe the distribution the tokens came from. Tool calls the model writes as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` come back as ``tool_calls``.

Requests of concurrent episodes are answered in batches: once a request arrives, the server
waits until every running agent has one pending or no new one came for ``BATCH_WINDOW_S``,
then runs one batched generation for all of them.

Bounded: an agent that exits non-zero, writes no valid reward, or runs past
``--agent-timeout`` (its process group is killed) is a failed episode: reward 0, a warning
with the tail of its output, counted in ``rollout/agent_failures``; the run goes on.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from relax.errors import InputError
from relax.rollout.episodes import (
    PLAIN_CHAT_TEMPLATE,
    Episode,
    TurnRenderer,
    as_rollout,
)
from relax.rollout.generate import left_pad

BATCH_WINDOW_S = 0.02
TAIL_CHARS = 600
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass
class _Session:
    """One agent run: its recorded episode and the messages it has been answered for."""

    episode: Episode | None = None
    messages: list = field(default_factory=list)  # the last call's messages + our reply
    ended: bool = True  # the last model turn ended with EOS
    error: str | None = None  # the conversation can no longer be recorded
    refused: str | None = None  # why the last refused call was refused


@dataclass
class _Request:
    session: _Session
    body: dict
    done: threading.Event = field(default_factory=threading.Event)
    reply: tuple[int, dict] | None = None


class _Server(ThreadingHTTPServer):
    # every agent of a step may connect at once; the default backlog of 5 refuses the rest
    request_queue_size = 1024
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    server_version = "relax"

    def log_message(self, *args):  # the trainer's log is not an access log
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "relax", "object": "model"}]})
        else:
            self._send(404, _error("unknown path"))

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        # sessions/<id>/v1/chat/completions
        if len(parts) != 5 or parts[0] != "sessions" or parts[2:] != ["v1", "chat",
                                                                       "completions"]:
            self._send(404, _error(f"unknown path {self.path}"))
            return
        session = self.server.sessions.get(parts[1])
        if session is None:
            self._send(404, _error(f"unknown session {parts[1]}"))
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise ValueError("expected a JSON object with a messages list")
            # one recorded continuation per call: several choices or a stream would need a
            # sample per choice and chunked replies, which the recording does not make
            if body.get("stream"):
                raise ValueError("stream=true is not supported; call without streaming")
            if body.get("n", 1) != 1:
                raise ValueError("n must be 1 (one recorded continuation per call)")
        except ValueError as e:
            self._send(400, _error(f"bad request: {e}"))
            return
        request = _Request(session, body)
        self.server.requests.put(request)
        if not request.done.wait(self.server.timeout_s):
            self._send(504, _error("the trainer did not answer in time"))
            return
        try:
            self._send(*request.reply)
        except OSError:  # the agent went away while waiting
            pass


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _tool_calls(text: str) -> list[dict]:
    calls = []
    for k, raw in enumerate(TOOL_CALL.findall(text)):
        try:
            call = json.loads(raw)
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            calls.append({"id": f"call_{k}", "type": "function", "function": {
                "name": call["name"],
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    return calls


@dataclass
class AgentResults:
    """One rank's agent episodes of a step (``rollout`` as in episodes.EpisodeRollout)."""

    rollout: object
    rewards: list[float]
    turns: list[int]
    failures: list[str]
    prompts: list[str]


class AgentRunner:
    """Runs agent episodes against the trainer's model; one endpoint for the whole run."""

    def __init__(self, command: str, *, timeout_s: float, max_turns: int, max_turn_tokens: int,
                 tokenizer, eos_token_id: int, context: int | None, device):
        self.argv = shlex.split(command)
        self.command, self.timeout_s = command, timeout_s
        self.max_turns, self.max_turn_tokens, self.context = max_turns, max_turn_tokens, context
        self.tokenizer, self.device = tokenizer, device
        template = None if getattr(tokenizer, "chat_template", None) else PLAIN_CHAT_TEMPLATE
        self.template = template
        self.render = TurnRenderer(tokenizer, chat=True, eos_token_id=eos_token_id,
                                   template=template)
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.sessions, self.server.requests = {}, queue.Queue()
        self.server.timeout_s = timeout_s
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ one step
    def run(self, inputs: list[dict], sample) -> AgentResults:
        """Start one agent per input, answer their calls with ``sample(ids, mask, k)`` (the
        trainer's batched generation), and collect the episodes when all have ended."""
        with tempfile.TemporaryDirectory(prefix="relax-agents-") as tmp:
            runs = [self._start(tmp, payload) for payload in inputs]
            live = list(range(len(runs)))
            while live:
                self._answer(self._collect(runs, live), sample)
                live = [i for i in live if not self._finished(runs[i])]
            results = [self._result(r) for r in runs]
        for r in runs:
            self.server.sessions.pop(r["sid"], None)
        while True:  # a killed agent's last request must not reach the next step's batch
            try:
                stale = self.server.requests.get_nowait()
            except queue.Empty:
                break
            stale.reply = (410, _error("the episode has ended"))
            stale.done.set()
        episodes = [r["session"].episode or Episode(self._fallback_prompt(p))
                    for r, p in zip(runs, inputs, strict=True)]
        for e, (reward, failure) in zip(episodes, results, strict=True):
            e.reward, e.done, e.error = reward, failure is None, failure
        prompts = [self.tokenizer.decode(e.prompt) for e in episodes]
        return AgentResults(as_rollout(episodes, self.tokenizer.pad_token_id, self.device),
                            [e.reward for e in episodes], [e.turns for e in episodes],
                            [f for _, f in results if f is not None], prompts)

    def _fallback_prompt(self, payload: dict) -> list[int]:
        """The prompt of an agent that never called the endpoint: its input, rendered."""
        prompt = payload["prompt"]
        messages = prompt if isinstance(prompt, list) else [{"role": "user",
                                                               "content": str(prompt)}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True,
                                                  chat_template=self.template)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] or [
            self.tokenizer.pad_token_id]

    def _start(self, tmp: str, payload: dict) -> dict:
        sid = uuid.uuid4().hex
        session = _Session()
        self.server.sessions[sid] = session
        paths = {k: os.path.join(tmp, f"{sid}.{k}") for k in ("in.json", "out.json", "log")}
        with open(paths["in.json"], "w", encoding="utf-8") as f:
            json.dump({"session_id": sid, **payload}, f)
        env = {**os.environ, "RELAX_BASE_URL": f"{self.base}/sessions/{sid}/v1",
               "RELAX_SESSION_ID": sid, "RELAX_INPUT_JSON": paths["in.json"],
               "RELAX_OUTPUT_JSON": paths["out.json"],
               # an HTTP proxy in the environment must not carry the agent's calls away
               "NO_PROXY": ",".join(filter(None, ["127.0.0.1", os.environ.get("NO_PROXY")])),
               "no_proxy": ",".join(filter(None, ["127.0.0.1", os.environ.get("no_proxy")]))}
        log = open(paths["log"], "wb")
        try:
            # its own process group, so a timeout kills whatever the agent started too
            proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            log.close()
            raise InputError(f"--agent-command {self.command}: cannot start it "
                             f"({type(e).__name__}: {e})") from None
        return {"sid": sid, "session": session, "proc": proc, "log": log, "paths": paths,
                "deadline": time.monotonic() + self.timeout_s, "killed": False}

    def _finished(self, run: dict) -> bool:
        if run["proc"].poll() is not None:
            return True
        if time.monotonic() > run["deadline"]:
            os.killpg(run["proc"].pid, signal.SIGKILL)
            run["proc"].wait()
            run["killed"] = True
            return True
        return False

    def _collect(self, runs: list[dict], live: list[int]) -> list[_Request]:
        """The pending requests of one batch (possibly none when agents are still working)."""
        requests = self.server.requests
        try:
            batch = [requests.get(timeout=0.05)]
        except queue.Empty:
            return []
        waiting = sum(1 for i in live if runs[i]["proc"].poll() is None)
        while len(batch) < waiting:
            try:
                batch.append(requests.get(timeout=BATCH_WINDOW_S))
            except queue.Empty:
                break
        return batch

    def _result(self, run: dict) -> tuple[float, str | None]:
        """(reward, failure message or None) of a finished agent."""
        run["log"].close()
        session, proc = run["session"], run["proc"]
        why = None
        if run["killed"]:
            why = f"ran past --agent-timeout {self.timeout_s:g} s and was killed"
        elif proc.returncode != 0:
            why = f"exited with status {proc.returncode}"
        elif session.error is not None:
            why = f"exited 0 after the endpoint refused a call ({session.error})"
        else:
            try:
                with open(run["paths"]["out.json"], encoding="utf-8") as f:
                    reward = float(json.load(f)["reward"])
                if not math.isfinite(reward):
                    raise ValueError("not finite")
                return reward, None
            except (OSError, ValueError, KeyError, TypeError) as e:
                why = f"wrote no valid {{\"reward\": number}} to RELAX_OUTPUT_JSON ({e})"
        if session.refused is not None and proc.returncode != 0:
            why += f" after the endpoint refused a call ({session.refused})"
        with open(run["paths"]["log"], "rb") as f:
            tail = f.read()[-TAIL_CHARS:].decode("utf-8", "replace")
        tail = " | ".join(line for line in tail.splitlines() if line.strip())
        return 0.0, (f"agent session {run['sid'][:8]} {why}"
                     f"{'; output tail: ' + tail if tail else ''}")

    # ------------------------------------------------------------------ answering
    def _answer(self, batch: list[_Request], sample) -> None:
        ready = []
        for request in batch:
            problem = self._extend(request)
            if problem is None:
                ready.append(request)
            else:
                request.session.refused = problem
                request.reply = (400, _error(problem))
                request.done.set()
        if not ready:
            return
        contexts = [r.session.episode.prompt + r.session.episode.ids for r in ready]
        budget = min(self._max_tokens(r) for r in ready)
        ids, mask = left_pad(contexts, self.tokenizer.pad_token_id, self.device)
        out = sample(ids, mask, budget)
        for row, request in enumerate(ready):
            session, episode = request.session, request.session.episode
            action = out.response_ids[row][out.response_mask[row]].tolist()
            episode.add(action, trained=True,
                        log_probs=out.log_probs[row][out.response_mask[row]].tolist())
            episode.turns += 1
            session.ended = not bool(out.truncated[row])
            text = self.tokenizer.decode(action, skip_special_tokens=True)
            calls = _tool_calls(text)
            message = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            session.messages = [*request.body["messages"], message]
            finish = "tool_calls" if calls else ("stop" if session.ended else "length")
            request.reply = (200, {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
                "created": int(time.time()), "model": request.body.get("model", "relax"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": len(contexts[row]), "completion_tokens": len(action),
                          "total_tokens": len(contexts[row]) + len(action)}})
            request.done.set()

    def _max_tokens(self, request: _Request) -> int:
        asked = request.body.get("max_tokens") or request.body.get("max_completion_tokens")
        limit = self.max_turn_tokens
        return max(1, min(limit, int(asked))) if isinstance(asked, int) else limit

    def _extend(self, request: _Request) -> str | None:
        """Append the request's new messages to its session's episode (mask 0), or say why
        the request cannot be answered. A call that does not extend the conversation ends the
        session as failed: its tokens could not be recorded faithfully."""
        session, messages = request.session, request.body["messages"]
        tools = request.body.get("tools")
        if session.error is not None:
            return session.error
        if session.episode is None:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                      add_generation_prompt=True,
                                                      chat_template=self.template)
            session.episode = Episode(self.tokenizer(text, add_special_tokens=False)[
                "input_ids"])
        else:
            known = session.messages
            if [_key(m) for m in messages[:len(known)]] != [_key(m) for m in known]:
                session.error = ("a call did not extend the conversation with the assistant "
                                 "message it got back; only appended messages can be recorded "
                                 "token-in/token-out")
                return session.error
            new = messages[len(known):]
            if not new:
                return "no new message after the assistant's reply"
            if session.episode.turns >= self.max_turns:
                return f"the episode reached --max-turns {self.max_turns}"
            session.episode.add(self.render.messages(new, ended=session.ended, tools=tools),
                                trained=False)
        length = len(session.episode.prompt) + len(session.episode.ids)
        if self.context is not None and length + self._max_tokens(request) > self.context:
            return (f"the conversation ({length} tokens) leaves no room for a turn in the "
                    f"model's context of {self.context} tokens")
        return None


def _key(message: dict) -> tuple:
    """What must match when a call repeats an earlier message (clients add or drop fields such
    as tool_calls=None or name)."""
    return (message.get("role"), message.get("content") or "")
