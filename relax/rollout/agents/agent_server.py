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
token-out exactly as an ``--env`` episode (relax/rollout/agents/episodes.py): the first call's
rendered messages are the prompt, the model's sampled ids are kept as drawn (loss mask 1), and
only the new messages are rendered with the chat template (mask 0). Sampling uses the run's
``--rollout-temperature`` / top-p / top-k whatever the request asks, so the training
log-probs describe the distribution the tokens came from. Tool calls the model writes as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` come back as ``tool_calls``.

Requests of concurrent episodes are answered in batches formed by what the agents do, never
by when: the server waits until every agent of the step that is still running has a call
pending or has ended (exited, or killed at its deadline), then answers those calls, one each,
in one batched generation with its rows in the agents' order. Which calls share a batch is
then the same in every run of a seed, however fast each agent thinks, and each call draws
from a random stream of its own (``sample``'s ``keys``: the episode's index and the turn), so
a call's tokens would not depend on the rest of its batch either. The time an agent's call
waits for its answer (for the other agents, then the decode) does not count toward
``--agent-timeout``: the deadline bounds the agent's own time, so a slow agent delays the
others' answers but never makes them fail. Each session's KV cache stays between its
calls (relax/rollout/generation/turn_cache.py): a call prefills only the model's last drawn token and
the new messages, whichever sessions share its batch; a session's cache is released when its
agent ends, and all of them when the step ends. With ``--rollout-backend vllm`` the batch goes
to the rank's vLLM server instead (relax/rollout/backends/vllm/vllm_sampler.py), each session's context as
token ids and the reply back as token ids; the server's prefix cache stands in for the KV
cache.

Contained (docs/reliability.md, section 9): a request body is checked against the Chat
Completions shape in the handler thread (relax/rollout/agents/chat_schema.py: 400 with the reason,
413 over ``MAX_BODY_BYTES``) before anything reaches the tokenizer; a call into a session from
a process of another episode's agent is refused with 403 (relax/rollout/agents/peer.py); each run has
a private directory and its process group is killed when its episode ends
(relax/rollout/agents/agent_procs.py).

Bounded: an agent that exits non-zero, writes no valid reward, or runs past
``--agent-timeout`` (its process group is killed) is a failed episode: reward 0, a warning
with the tail of its output, counted in ``rollout/agent_failures``; the run goes on.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import shlex
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

from relax.errors import Interrupted, error_summary
from relax.rollout.agents.agent_http import (
    _error,
    _Handler,
    _refuse_ended,
    _Request,
    _Server,
    _Session,
)
from relax.rollout.agents.agent_procs import AgentProcess, AgentWorkspace
from relax.rollout.agents.episodes import (
    PLAIN_CHAT_TEMPLATE,
    Episode,
    TurnRenderer,
    as_rollout,
)
from relax.rollout.generation.generate import left_pad
from relax.rollout.generation.turn_cache import TurnCache

POLL_S = 0.05  # how long the batch loop blocks on the queue before it looks at the agents
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


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
        # close() waits for the serving loop to see the stop, at most one poll interval (0.5 s
        # by default, paid at the end of every run)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ one step
    def run(self, inputs: list[dict], sample) -> AgentResults:
        """Start one agent per input, answer their calls with ``sample(ids, mask, k,
        cache=..., keys=...)`` (the trainer's batched generation, with the sessions' KV caches
        and each row's ``(index, turn)``: the input's ``index`` and the episode's turns before
        the call, which name the row's own random stream), and collect the episodes when all
        have ended. Every agent's process group is killed when the step ends, however it
        ends."""
        workspace, runs = AgentWorkspace(), []
        cache = TurnCache()  # one per step: the weights do not change while agents run
        held: dict[int, deque] = {}  # calls taken from the queue, by agent, not yet answered
        try:
            for payload in inputs:
                runs.append(self._start(workspace, payload))
            of_session = {id(r.session): r for r in runs}
            live = list(range(len(runs)))
            while live:
                batch = self._next_batch(runs, live, held)
                self._answer(batch, sample, cache)
                answered = time.monotonic()
                for request in batch:  # waiting for an answer is not the agent's own time
                    of_session[id(request.session)].waited(answered - request.arrived)
                for i in live:
                    if runs[i].finished():
                        cache.release(id(runs[i].session))
                live = [i for i in live if not runs[i].finished()]
            for r in runs:
                r.end()  # what the agent started dies with its episode
            results = [self._result(r) for r in runs]
        finally:
            cache.clear()
            for r in runs:
                self.server.sessions.pop(r.sid, None)
                r.end()
            workspace.close()
            self._refuse_stale([r for calls in held.values() for r in calls])
        episodes = [r.session.episode or Episode(self._fallback_prompt(p))
                    for r, p in zip(runs, inputs, strict=True)]
        for e, (reward, failure) in zip(episodes, results, strict=True):
            e.reward, e.done, e.error = reward, failure is None, failure
        prompts = [self.tokenizer.decode(e.prompt) for e in episodes]
        return AgentResults(as_rollout(episodes, self.tokenizer.pad_token_id, self.device),
                            [e.reward for e in episodes], [e.turns for e in episodes],
                            [f for _, f in results if f is not None], prompts)

    def _refuse_stale(self, held: list[_Request]) -> None:
        """A killed agent's last request must not reach the next step's batch; the calls the
        step took but did not answer (it ended by an error or a signal) are refused too."""
        while True:
            try:
                held.append(self.server.requests.get_nowait())
            except queue.Empty:
                break
        for stale in held:
            _refuse_ended(stale)

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

    def _start(self, workspace: AgentWorkspace, payload: dict) -> AgentProcess:
        sid = secrets.token_hex(16)
        session = _Session(index=int(payload["index"]))
        folder = workspace.private_dir()
        paths = {k: os.path.join(folder, f"{k}.json") for k in ("in", "out")}
        with open(paths["in"], "w", encoding="utf-8") as f:
            json.dump({"session_id": sid, **payload}, f)
        env = {**os.environ, "RELAX_BASE_URL": f"{self.base}/sessions/{sid}/v1",
               "RELAX_SESSION_ID": sid, "RELAX_INPUT_JSON": paths["in"],
               "RELAX_OUTPUT_JSON": paths["out"],
               # an HTTP proxy in the environment must not carry the agent's calls away
               "NO_PROXY": ",".join(filter(None, ["127.0.0.1", os.environ.get("NO_PROXY")])),
               "no_proxy": ",".join(filter(None, ["127.0.0.1", os.environ.get("no_proxy")]))}
        self.server.sessions[sid] = session  # before the start: the agent may call at once
        try:
            run = AgentProcess(self.argv, env, folder, command=self.command,
                               timeout_s=self.timeout_s, sid=sid, session=session)
        except BaseException:
            self.server.sessions.pop(sid, None)
            raise
        session.group = run.proc.pid  # started in a new session: its own process group
        return run

    def _next_batch(self, runs: list[AgentProcess], live: list[int],
                    held: dict[int, deque]) -> list[_Request]:
        """The next batch: once every agent in ``live`` has a call pending or has ended, the
        first pending call of each, in the agents' order (empty when all have ended). Which
        calls share a batch follows from what the agents do, never from when they do it; an
        agent that neither calls nor exits is killed at its deadline (``finished``), so the
        wait is bounded. ``held``: the calls taken from the queue, by agent."""
        owner = {id(runs[i].session): i for i in live}
        while not all(held.get(i) or runs[i].finished() for i in live):
            try:
                request = self.server.requests.get(timeout=POLL_S)
            except queue.Empty:
                continue
            i = owner.get(id(request.session))
            if i is None:  # left over from an agent of this step that has ended
                _refuse_ended(request)
                continue
            held.setdefault(i, deque()).append(request)
        return [held[i].popleft() for i in live if held.get(i)]

    def _result(self, run: AgentProcess) -> tuple[float, str | None]:
        """(reward, failure message or None) of a finished agent."""
        session = run.session
        why = run.failure()
        if why is None and session.error is not None:
            why = f"exited 0 after the endpoint refused a call ({session.error})"
        if why is None:
            reward, problem = run.reward()
            if problem is None:
                return reward, None
            why = f"wrote no valid {{\"reward\": number}} to RELAX_OUTPUT_JSON ({problem})"
        if session.refused is not None and run.proc.returncode != 0:
            why += f" after the endpoint refused a call ({session.refused})"
        tail = run.tail()
        return 0.0, (f"--agent-command {self.command}: session {run.sid[:8]} {why}"
                     f"{'; output tail: ' + tail if tail else ''}")

    # ------------------------------------------------------------------ answering
    def _answer(self, batch: list[_Request], sample, cache: TurnCache) -> None:
        ready = []
        for request in batch:
            problem = self._extend(request)
            if problem is None:
                ready.append(request)
            else:
                request.session.refused = problem
                request.reply = (400, _error(problem))
                request.done.set()
        # One decode per distinct max_tokens: a shared budget would cut every call of the
        # batch to the smallest one asked (a first turn answered "length" after 2 tokens
        # because another agent's call asked for 2).
        for budget in sorted({self._max_tokens(r) for r in ready}):
            self._decode([r for r in ready if self._max_tokens(r) == budget], budget,
                         sample, cache)

    def _decode(self, ready: list[_Request], budget: int, sample, cache: TurnCache) -> None:
        """Sample one turn of at most ``budget`` tokens for each request and answer it."""
        contexts = [r.session.episode.prompt + r.session.episode.ids for r in ready]
        ids, mask = left_pad(contexts, self.tokenizer.pad_token_id, self.device)
        out = sample(ids, mask, budget, cache=cache.rows([id(r.session) for r in ready]),
                     keys=[(r.session.index, r.session.episode.turns) for r in ready])
        for row, request in enumerate(ready):
            session, episode = request.session, request.session.episode
            keep = out.response_mask[row]
            action = out.response_ids[row][keep].tolist()
            routes = (None if getattr(out, "routed_experts", None) is None  # a MoE: its tokens
                      else out.routed_experts[row, ids.shape[1]:][keep])
            episode.add(action, trained=True, log_probs=out.log_probs[row][keep].tolist(),
                        routes=routes)
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
        session as failed: its tokens could not be recorded faithfully. Messages that would
        leave no room for the reply in the context are refused and not recorded, so an
        episode never outgrows the context."""
        session = request.session
        if session.error is not None:
            return session.error
        try:
            if session.episode is None:
                return self._first_call(request)
            return self._next_call(request)
        except Interrupted:
            raise
        except Exception as e:  # a template that refuses these messages (jinja's raise_exception)
            return f"the chat template cannot render these messages ({error_summary(e)})"

    def _first_call(self, request: _Request) -> str | None:
        text = self.tokenizer.apply_chat_template(
            request.body["messages"], tools=request.body.get("tools"), tokenize=False,
            add_generation_prompt=True, chat_template=self.template)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        why = self._no_room(len(ids), request)
        if why is None:
            request.session.episode = Episode(ids)
        return why

    def _next_call(self, request: _Request) -> str | None:
        session, messages = request.session, request.body["messages"]
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
        ids = self.render.messages(new, ended=session.ended, tools=request.body.get("tools"))
        episode = session.episode
        why = self._no_room(len(episode.prompt) + len(episode.ids) + len(ids), request)
        if why is None:
            episode.add(ids, trained=False)
        return why

    def _no_room(self, length: int, request: _Request) -> str | None:
        if self.context is not None and length + self._max_tokens(request) > self.context:
            return (f"the conversation ({length} tokens) leaves no room for a turn in the "
                    f"model's context of {self.context} tokens")
        if length == 0:
            return "the messages render to no tokens"
        return None


def _key(message: dict) -> tuple:
    """What must match when a call repeats an earlier message (clients add or drop fields such
    as tool_calls=None or name)."""
    return (message.get("role"), message.get("content") or "")
