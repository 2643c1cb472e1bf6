"""relax/rollout/agents/agent_server.py's endpoint in one process: requests and replies, bad requests,
sessions. The agents here are Python functions on threads standing in for agent programs
(``subprocess.Popen`` is replaced for the test), and the model is a scripted ``sample`` that
records what it was given, so every reply and every recorded token can be checked exactly.
Real agent programs, crashes and time-outs: tests/rollout/agents/test_agent_programs.py."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
import torch

from relax.rollout.agents.agent_server import AgentRunner, _Session
from relax.tiny_model import build_tokenizer

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, no proxy
TOOL_TEXT = '<tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _call(url: str, body=None, *, raw: bytes | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON body) of a GET (``body`` None) or a POST."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with OPENER.open(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


class ThreadAgent:
    """``subprocess.Popen`` for AgentRunner: runs ``AGENTS[argv[0]](env)`` on a thread; its
    return value is the exit status, an exception exits 1 with the message as output."""

    programs: dict = {}

    def __init__(self, argv, *, env, stdout, **kwargs):
        # above Linux's largest pid (2**22): killing "its process group" finds nothing
        self.pid, self.returncode, self._status = 2**22 + 1, None, None

        def run():
            try:
                self._status = self.programs[argv[0]](env)
            except Exception as e:
                stdout.write(f"{type(e).__name__}: {e}".encode())
                stdout.flush()
                self._status = 1

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def poll(self):
        if not self._thread.is_alive():
            self.returncode = self._status
        return self.returncode

    def wait(self, timeout=None):
        self._thread.join(timeout)
        return self.poll()


class Model:
    """A scripted ``sample(ids, mask, k)``: every row answers ``text`` + EOS, cut at ``k``
    tokens; records each call's contexts (unpadded) and budget."""

    def __init__(self, tok, text="ok"):
        self.tok, self.reply = tok, tok(text, add_special_tokens=False)["input_ids"]
        self.calls: list[tuple[list[list[int]], int]] = []
        self.keys: list[list[tuple[int, int]]] = []  # each call's rows' (index, turn)

    def __call__(self, ids, mask, k, cache=None, keys=None):
        self.calls.append(([row[m].tolist() for row, m in zip(ids, mask, strict=True)], k))
        self.keys.append(keys)
        full = [*self.reply, self.tok.eos_token_id]
        out = full[:k]
        rows = len(ids)
        response = torch.full((rows, k), self.tok.pad_token_id)
        response[:, :len(out)] = torch.tensor(out)
        keep = torch.zeros((rows, k), dtype=torch.bool)
        keep[:, :len(out)] = True
        return SimpleNamespace(response_ids=response, response_mask=keep,
                               truncated=torch.full((rows,), len(out) < len(full)),
                               log_probs=torch.where(keep, -0.25, 0.0))


@pytest.fixture
def play(tok, monkeypatch):
    """``play(agent, n, **runner_kw)``: run ``n`` episodes of the agent function; returns
    (AgentResults, runner, model)."""
    monkeypatch.setattr(subprocess, "Popen", ThreadAgent)

    def run(agent, n=1, model=None, inputs=None, **kw):
        ThreadAgent.programs = {"agent": agent}
        model = model or Model(tok)
        options = dict(timeout_s=60, max_turns=4, max_turn_tokens=4, context=512)
        runner = AgentRunner("agent --flag", tokenizer=tok, eos_token_id=tok.eos_token_id,
                             device="cpu", **{**options, **kw})
        try:
            played = runner.run(inputs or [{"prompt": f"p{i}", "label": i, "index": i,
                                            "step": 3} for i in range(n)], model)
        finally:
            runner.close()
        return played, runner, model

    return run


def _task(env) -> dict:
    with open(env["RELAX_INPUT_JSON"]) as f:
        return json.load(f)


def _reward(env, value) -> int:
    with open(env["RELAX_OUTPUT_JSON"], "w") as f:
        json.dump({"reward": value}, f)
    return 0


def test_two_turns_are_answered_and_recorded_token_in_token_out(play, tok):
    replies = {}

    def agent(env):
        task = _task(env)
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": task["prompt"]}]
        status, first = _call(url, {"model": "policy", "messages": messages})
        messages += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
        status2, second = _call(url, {"messages": messages, "max_tokens": 2})
        replies[task["index"]] = (status, first, status2, second)
        return _reward(env, task["index"] + 0.5)

    played, runner, model = play(agent, n=2)
    assert played.failures == [] and played.rewards == [0.5, 1.5] and played.turns == [2, 2]
    ok, eos = tok("ok", add_special_tokens=False)["input_ids"], tok.eos_token_id
    new = runner.render.messages([{"role": "user", "content": "again"}], ended=True)
    for i in range(2):
        status, first, status2, second = replies[i]
        assert status == status2 == 200
        assert first["object"] == "chat.completion" and first["id"].startswith("chatcmpl-")
        assert first["model"] == "policy" and second["model"] == "relax"  # echoed, or ours
        assert first["choices"] == [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "ok"}}]
        # max_tokens 2 cuts "ok" + EOS after "ok": a turn that ran out of length
        assert second["choices"][0]["finish_reason"] == "length"
        prompt = tok(f"user: p{i}<eos>\nassistant: ", add_special_tokens=False)["input_ids"]
        assert first["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 3,
                                  "total_tokens": len(prompt) + 3}
        # the model saw the first context, then it + its own sampled ids + the new message
        contexts = [c for call, _ in model.calls for c in call]
        assert prompt in contexts and prompt + ok + [eos] + new in contexts
        r = played.rollout
        present = r.context_mask[i]
        assert r.prompt_ids[i][r.prompt_mask[i]].tolist() == prompt
        assert r.response_ids[i][present].tolist() == ok + [eos] + new + ok
        assert r.response_mask[i][present].tolist() == [True] * 3 + [False] * len(new) + [True] * 2
        # the sampler's log-prob of each sampled token is kept; the message's tokens have none
        assert r.log_probs[i][present].tolist() == [-0.25] * 3 + [0.0] * len(new) + [-0.25] * 2
    # batched or not (one generation per batch of waiting agents), first turns get the run's
    # 4 tokens and second turns the requested 2
    assert {k for _, k in model.calls} == {2, 4}


def test_every_episode_has_its_own_session_and_input(play):
    seen = []

    def agent(env):
        seen.append((env["RELAX_SESSION_ID"], env["RELAX_BASE_URL"], _task(env),
                     env["NO_PROXY"].split(",")[0]))
        return _reward(env, 1)

    inputs = [{"prompt": [{"role": "user", "content": "hi"}], "label": "x", "index": 7,
               "step": 2}, {"prompt": "p", "label": None, "index": 8, "step": 2}]
    played, runner, model = play(agent, inputs=inputs)
    assert played.rewards == [1.0, 1.0] and model.calls == []  # no agent called the model
    sessions = sorted(seen, key=lambda s: s[2]["index"])
    assert len({s[0] for s in sessions}) == 2
    for (sid, url, task, no_proxy), given in zip(sessions, inputs, strict=True):
        assert url == f"{runner.base}/sessions/{sid}/v1" and url.startswith("http://127.0.0.1:")
        assert task == {"session_id": sid, **given} and no_proxy == "127.0.0.1"
    assert runner.server.sessions == {}  # ended sessions are forgotten
    # an agent that never called: its prompt is its input, rendered
    assert played.prompts == ["user: hi<eos>\nassistant: ", "user: p<eos>\nassistant: "]


def test_tool_calls_come_back_as_tool_calls(play, tok):
    got = {}

    def agent(env):
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
        _, got["reply"] = _call(url, {"messages": [{"role": "user", "content": "x"}],
                                      "tools": tools})
        return _reward(env, 0)

    played, _, _ = play(agent, model=Model(tok, TOOL_TEXT), max_turn_tokens=200)
    choice = got["reply"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": TOOL_TEXT, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "calc", "arguments": '{"a": 1}'}}]}
    assert played.failures == []


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_the_request_may_lower_the_turn_budget_but_not_raise_it(play, field):
    def agent(env):
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": "x"}]
        _, reply = _call(url, {"messages": messages, field: 1})
        messages += [reply["choices"][0]["message"], {"role": "user", "content": "y"}]
        _call(url, {"messages": messages, field: 1000})
        return _reward(env, 0)

    _, _, model = play(agent)
    assert [k for _, k in model.calls] == [1, 4]  # --rollout-max-response-len caps it


def test_calls_that_cannot_be_recorded_are_refused_and_fail_the_episode(play):
    answers = []

    def agent(env):
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": "x"}]
        _, reply = _call(url, {"messages": messages})
        answers.append(_call(url, {"messages": messages + [reply["choices"][0]["message"]]}))
        rewritten = [{"role": "user", "content": "other"}, reply["choices"][0]["message"],
                     {"role": "user", "content": "y"}]
        answers.append(_call(url, {"messages": rewritten}))
        answers.append(_call(url, {"messages": messages}))  # once broken, always refused
        return _reward(env, 1)

    played, _, model = play(agent)
    (s1, a1), (s2, a2), (s3, a3) = answers
    assert s1 == 400 and a1["error"] == {"message": "no new message after the assistant's reply",
                                         "type": "invalid_request_error"}
    assert s2 == s3 == 400 and "did not extend the conversation" in a2["error"]["message"]
    assert a3 == a2
    assert len(model.calls) == 1  # refused calls never reach the model
    assert played.rewards == [0.0]
    assert "exited 0 after the endpoint refused a call (a call did not extend" in \
        played.failures[0]


def test_turns_beyond_max_turns_and_the_context_are_refused(play, tok):
    answers = []

    def agent(env):
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": "x"}]
        for k in range(2):
            status, reply = _call(url, {"messages": messages})
            answers.append((status, reply))
            if status != 200:
                break
            messages += [reply["choices"][0]["message"], {"role": "user", "content": f"{k}"}]
        return 0 if answers[-1][0] == 200 else 5

    played, _, _ = play(agent, max_turns=1)
    assert [s for s, _ in answers] == [200, 400]
    assert answers[1][1]["error"]["message"] == "the episode reached --max-turns 1"
    assert played.turns == [1] and "exited with status 5 after the endpoint refused a call " \
        "(the episode reached --max-turns 1)" in played.failures[0]
    answers.clear()
    prompt = len(tok("user: x<eos>\nassistant: ", add_special_tokens=False)["input_ids"])
    play(agent, context=prompt + 3)  # no room for a turn of 4 tokens
    assert answers[0][0] == 400 and answers[0][1]["error"]["message"] == (
        f"the conversation ({prompt} tokens) leaves no room for a turn in the model's context "
        f"of {prompt + 3} tokens")


@pytest.mark.parametrize("body,raw,words", [
    ({"messages": [], "stream": True}, None, "stream=true is not supported"),
    ({"messages": [], "n": 2}, None, "n must be 1 (one recorded continuation per call)"),
    ({"prompt": "x"}, None, "messages must be a non-empty list of message objects"),
    ({"messages": "x"}, None, "messages must be a non-empty list of message objects, got str"),
    (None, b"{not json", "bad request: "),
    (None, b"[1]", "expected a JSON object, got list"),
])
def test_malformed_requests_are_400_before_anything_runs(tok, body, raw, words):
    runner = AgentRunner("agent", timeout_s=5, max_turns=2, max_turn_tokens=4, tokenizer=tok,
                         eos_token_id=tok.eos_token_id, context=256, device="cpu")
    try:
        runner.server.sessions["s"] = _Session()
        status, reply = _call(f"{runner.base}/sessions/s/v1/chat/completions", body, raw=raw)
        assert status == 400 and reply["error"]["type"] == "invalid_request_error"
        assert reply["error"]["message"].startswith("bad request: ") and words in \
            reply["error"]["message"]
        assert runner.server.requests.empty()  # nothing was queued for the model
    finally:
        runner.close()


def test_paths_and_sessions_the_endpoint_does_not_know_are_404(tok):
    runner = AgentRunner("agent", timeout_s=5, max_turns=2, max_turn_tokens=4, tokenizer=tok,
                         eos_token_id=tok.eos_token_id, context=256, device="cpu")
    body = {"messages": [{"role": "user", "content": "x"}]}
    try:
        host, port = runner.server.server_address
        assert host == "127.0.0.1" and runner.base == f"http://127.0.0.1:{port}"
        assert _call(f"{runner.base}/sessions/nosuch/v1/chat/completions", body) == (
            404, {"error": {"message": "unknown session nosuch",
                            "type": "invalid_request_error"}})
        for path in ("/v1/chat/completions", "/sessions/s/v1/completions",
                     "/sessions/s/v2/chat/completions"):
            status, reply = _call(runner.base + path, body)
            assert status == 404 and reply["error"]["message"] == f"unknown path {path}"
        assert _call(f"{runner.base}/sessions/s/v1/models") == (
            200, {"object": "list", "data": [{"id": "relax", "object": "model"}]})
        assert _call(f"{runner.base}/sessions/s/v1/other")[0] == 404
    finally:
        runner.close()


def test_calls_answered_together_each_keep_their_own_max_tokens(play):
    """Two agents call at the same moment (a barrier), so the endpoint answers them in one
    batch; one asks for 2 tokens, the other for the default 4. Each reply follows its own
    budget: a shared one cut the default call to 2 tokens ("length" instead of "stop")."""
    barrier, replies = threading.Barrier(2, timeout=30), {}

    def agent(env):
        task = _task(env)
        body = {"messages": [{"role": "user", "content": task["prompt"]}]}
        if task["index"] == 0:
            body["max_tokens"] = 2
        barrier.wait()
        replies[task["index"]] = _call(env["RELAX_BASE_URL"] + "/chat/completions", body)
        return _reward(env, 1)

    played, _, model = play(agent, n=2)
    assert played.failures == []
    (status0, cut), (status1, whole) = replies[0], replies[1]
    assert status0 == status1 == 200
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 2
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == 3  # "ok" and EOS
    assert sorted(k for _, k in model.calls) == [2, 4]


def test_a_reward_beyond_float32_fails_the_episode(play):
    """-1e300 is a float, but -inf in the float32 rewards tensor: the episode fails, naming
    the range, instead of a non-finite loss later blaming --lr."""
    played, _, _ = play(lambda env: _reward(env, -1e300), n=1)
    (failure,) = [f for f in played.failures if f]
    assert "the reward is -1e+300, beyond the float32 range" in failure, failure
    assert played.rewards == [0.0]


def _thinking(slow: int):
    """An agent function: episode ``index`` makes ``3 - index`` calls; before its call of turn
    ``t`` the agent with index ``(slow + t) % 3`` thinks for 0.3 s, the others call at once."""
    def agent(env):
        task = _task(env)
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": task["prompt"]}]
        for turn in range(3 - task["index"]):
            if task["index"] == (slow + turn) % 3:
                time.sleep(0.3)
            status, reply = _call(url, {"messages": messages})
            assert status == 200, reply
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "more"}]
        return _reward(env, 1)

    return agent


def test_which_calls_share_a_batch_does_not_depend_on_when_they_come(play):
    """The endpoint waits until every running agent has a call pending or has ended, then
    answers one call of each in one batch, rows in the agents' order: whichever agent thinks
    longest, the batches are the same (a time window batched the quick agents' calls without
    the slow one's, so the batches changed with the think times). Each row carries its
    episode's index and turn, which name its random stream; an agent that has ended does not
    hold the others' calls back."""
    models = [play(_thinking(slow), n=3)[2] for slow in range(3)]
    for model in models:
        assert model.keys == [[(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 1)], [(0, 2)]]
        assert [len(contexts) for contexts, _ in model.calls] == [3, 2, 1]
    assert models[0].calls == models[1].calls == models[2].calls


def test_an_agent_that_hangs_is_killed_at_its_deadline_and_the_others_go_on(play):
    """Agent 0 hangs before its first call; agent 1's calls wait for it (a batch waits for
    every running agent) until agent 0 is killed at its deadline, then are answered. The wait
    for an answer is not agent 1's own time: it does not fail although its first answer came
    after its own deadline would have passed. The failure names the program."""
    def agent(env):
        task = _task(env)
        if task["index"] == 0:
            time.sleep(4.5)  # past the 3 s deadline (agent 1 gets 3 s to make its call)
            return 0
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": task["prompt"]}]
        for _ in range(2):
            status, reply = _call(url, {"messages": messages})
            assert status == 200, reply
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "more"}]
        return _reward(env, 1)

    played, _, model = play(agent, n=2, timeout_s=3.0)
    assert played.rewards == [0.0, 1.0] and played.turns == [0, 2]
    (failure,) = played.failures
    assert failure.startswith("--agent-command agent --flag: session ")
    assert failure.endswith("ran past --agent-timeout 3 s and was killed"), failure
    assert model.keys == [[(1, 0)], [(1, 1)]]


class MoeModel(Model):
    """:class:`Model` as a mixture of experts: its record of column c of a call is c + 10 * the
    call's number, in both layers and both slots (2 MoE layers, top-2)."""

    def __call__(self, ids, mask, k, cache=None, keys=None):
        out = super().__call__(ids, mask, k, cache, keys)
        cols = torch.arange(ids.shape[1] + k, dtype=torch.int16) + 10 * len(self.calls)
        out.routed_experts = cols[None, :, None, None].expand(len(ids), -1, 2, 2).clone()
        return out


def test_agent_turns_carry_the_routing_record_of_the_model_tokens(play, tok):
    def agent(env):
        task = _task(env)
        url = env["RELAX_BASE_URL"] + "/chat/completions"
        messages = [{"role": "user", "content": task["prompt"]}]
        _, first = _call(url, {"messages": messages})
        messages += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
        _call(url, {"messages": messages, "max_tokens": 2})
        return _reward(env, 1.0)

    played, _, model = play(agent, n=1, model=MoeModel(tok))
    r = played.rollout
    response, trained = r.routed_experts[0, r.prompt_ids.shape[1]:], r.response_mask[0]
    assert (r.routed_experts[0, :r.prompt_ids.shape[1]] == -1).all()
    assert (response[~trained] == -1).all()  # the message's tokens and the padding
    # each turn's tokens carry their call's record at their columns of that call
    (ctx1, _), (ctx2, _) = model.calls
    want = [10 + len(ctx1[0]) + j for j in range(3)] + [20 + len(ctx2[0]) + j for j in range(2)]
    assert response[trained][:, 0, 0].tolist() == want
