"""Agent programs that misbehave (tests/rollout/agents/hostile.py, run as real processes): requests
outside the Chat Completions shape are refused with a 400 and the reason before the tokenizer,
a body over the cap with a 413, a garbage reward file fails the episode; what an agent starts
dies with its episode; an agent cannot list the other episodes' files (docs/reliability.md,
section 9)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
import torch

from relax.rollout.agents.agent_server import AgentRunner
from relax.rollout.agents.chat_schema import MAX_BODY_BYTES
from relax.rollout.generation.generate import generate
from relax.tiny_model import build_tiny_model, build_tokenizer

PROGRAM = os.path.join(os.path.dirname(__file__), "..", "rollout", "agents", "agent_program.py")


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0).eval()


def run_agents(tiny, mode: str, n: int, tmp_path, monkeypatch, **kw):
    monkeypatch.setenv("RELAX_TEST_DIR", str(tmp_path))
    tok, model = tiny
    generator = torch.Generator().manual_seed(0)
    batches = []

    def sample(ids, mask, k, cache=None, keys=None):
        batches.append(len(ids))
        return generate(model, ids, mask, max_new_tokens=k, eos_token_ids=[tok.eos_token_id],
                        pad_token_id=tok.pad_token_id, generator=generator, cache=cache)

    runner = AgentRunner(f"{sys.executable} {PROGRAM} {mode}", timeout_s=kw.get("timeout", 60),
                         max_turns=4, max_turn_tokens=4, tokenizer=tok,
                         eos_token_id=tok.eos_token_id, context=kw.get("context", 256),
                         device="cpu")
    try:
        played = runner.run([{"prompt": f"p{i}", "label": None, "index": i, "step": 0}
                             for i in range(n)], sample)
    finally:
        runner.close()
    seen = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(n)]
    return played, seen, batches


REFUSED = {
    "numbers": (400, "messages[0] must be an object with role and content, got int"),
    "empty": (400, "messages must be a non-empty list"),
    "bare_string": (400, "messages[1] must be an object with role and content, got str"),
    "deep": (400, "the JSON is nested too deeply"),
    "image": (400, "content parts must be text parts"),
    "surrogate": (400, "a lone surrogate"),
    "max_tokens": (400, "max_tokens must be a positive integer, got str"),
    "role": (400, "messages[0].role must be one of system, developer, user, assistant, tool"),
    "huge": (413, f"is over the cap of {MAX_BODY_BYTES} bytes (8 MiB)"),
}


@pytest.mark.subprocess
def test_requests_outside_the_chat_shape_are_refused_before_the_trainer(tiny, tmp_path,
                                                                       monkeypatch):
    played, (seen,), batches = run_agents(tiny, "garbage", 1, tmp_path, monkeypatch)
    for name, (status, reason) in REFUSED.items():
        assert seen[name][0] == status and reason in seen[name][1], (name, seen[name])
    # none of them reached generation: the one valid call is the only turn
    assert seen["valid"] == "assistant" and batches == [1] and played.turns == [1]
    # the reward file nested 100000 deep is a failed episode, not a RecursionError
    (failure,) = played.failures
    assert "RELAX_OUTPUT_JSON is nested too deeply" in failure and played.rewards == [0.0]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.subprocess
def test_what_an_agent_starts_dies_with_its_episode(tiny, tmp_path, monkeypatch):
    played, seen, _ = run_agents(tiny, "spawn", 2, tmp_path, monkeypatch)
    assert played.failures == [] and played.rewards == [1.0, 1.0]
    for s in seen:
        # killed with the agent's process group (a zombie where no init reaps it). A process
        # with SIGKILL pending is runnable ('R') until it gets a CPU to die on, which a busy
        # machine can delay; one that was not killed sleeps ('S') for its 300 s, so a bounded
        # wait tells the two apart without a timed assertion.
        deadline = time.monotonic() + 60
        while _state(s["child"]) not in ("gone", "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(s["child"]) in ("gone", "Z"), s


@pytest.mark.subprocess
def test_an_agent_sees_only_its_own_files(tiny, tmp_path, monkeypatch):
    played, seen, _ = run_agents(tiny, "snoop", 3, tmp_path, monkeypatch)
    assert played.failures == []
    for s in seen:
        assert s["own"] == ["in.json", "log"]  # no other episode's input, so no session id
    if os.geteuid() != 0:  # root reads any directory; a user cannot list the shared parent
        assert all(s["parent"] == "PermissionError" for s in seen)
    else:
        assert all(len(s["parent"]) == 3 for s in seen)  # random names, not session ids


@pytest.mark.subprocess
def test_another_episodes_session_id_is_of_no_use(tiny, tmp_path, monkeypatch):
    played, seen, _ = run_agents(tiny, "intrude", 2, tmp_path, monkeypatch)
    assert played.failures == [] and played.turns == [1, 1]  # only their own calls
    for s in seen:
        assert s["own"] == 200
        if os.geteuid() != 0:  # a user cannot even list the workspace
            assert s["other"] == "PermissionError"
        else:  # root read the other id: the endpoint refuses it from this agent's group
            assert s["other"] == [403, "this session belongs to another episode's agent"]
