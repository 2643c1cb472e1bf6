"""Agent programs (--use-agentic-rollout): a scripted program (tests/rollout/agents/agent_program.py)
calls the trainer's localhost endpoint; its conversation is recorded token-in/token-out,
crashes and hangs are contained."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from relax.config import ConfigError
from relax.rollout.agents.agent_server import AgentRunner, _Session, _tool_calls
from relax.rollout.generation.generate import generate
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import init_distributed, unwrap
from relax.trainer.loop import Trainer
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, make_config, read_metrics

PROGRAM = os.path.join(os.path.dirname(__file__), "agent_program.py")


def command(mode: str) -> str:
    return f"{sys.executable} {PROGRAM} {mode}"


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0).eval()


def _run(tiny, mode, n=4, timeout_s=60.0, max_turns=4):
    tok, model = tiny
    rows = []
    generator = torch.Generator().manual_seed(0)

    def sample(ids, mask, k, cache=None, keys=None):
        out = generate(model, ids, mask, max_new_tokens=k, eos_token_ids=[tok.eos_token_id],
                       pad_token_id=tok.pad_token_id, generator=generator, cache=cache)
        rows.extend(tuple(out.response_ids[i][out.response_mask[i]].tolist())
                    for i in range(len(out.response_ids)))
        return out

    runner = AgentRunner(command(mode), timeout_s=timeout_s, max_turns=max_turns,
                         max_turn_tokens=4, tokenizer=tok, eos_token_id=tok.eos_token_id,
                         context=256, device="cpu")
    try:
        played = runner.run([{"prompt": f"p{i}", "label": None, "index": i, "step": 0}
                             for i in range(n)], sample)
    finally:
        runner.close()
    return played, rows, runner


def _runs(mask):
    """[(start, stop, trained)] runs of equal mask values."""
    out, start = [], 0
    for t in range(1, len(mask) + 1):
        if t == len(mask) or mask[t] != mask[start]:
            out.append((start, t, mask[start]))
            start = t
    return out


@pytest.mark.parametrize("mode", ["ok", "tool", "openai"])
@pytest.mark.subprocess
def test_conversations_are_recorded_token_in_token_out(tiny, mode, tmp_path, monkeypatch):
    monkeypatch.setenv("RELAX_TEST_DIR", str(tmp_path))
    tok = tiny[0]
    played, sampled, runner = _run(tiny, mode)
    assert played.failures == [] and played.turns == [2, 2, 2, 2]
    assert played.rewards == [0.0, 1.0, 2.0, 0.0]  # the agents' own rewards (index % 3)
    r = played.rollout
    for i in range(4):
        with open(tmp_path / f"{i}.json") as f:
            replies = json.load(f)
        present = r.context_mask[i]
        ids = r.response_ids[i][present].tolist()
        runs = _runs(r.response_mask[i][present].tolist())
        assert [t for _, _, t in runs] == [True, False, True]
        first, middle, second = (ids[a:b] for a, b, _ in runs)
        # the model's tokens are the sampled ids, and the agent got exactly their text
        assert tuple(first) in sampled and tuple(second) in sampled
        assert [tok.decode(first, skip_special_tokens=True),
                tok.decode(second, skip_special_tokens=True)] == replies
        assert len(second) <= 2  # the request's max_tokens
        # only the new message is rendered (the plain template of a template-less tokenizer)
        new = ({"role": "tool", "content": "42"} if mode == "tool" else
               {"role": "user", "content": "again"})
        assert middle == runner.render.messages([new], ended=first[-1] == tok.eos_token_id)
        prompt = tok.decode(r.prompt_ids[i][r.prompt_mask[i]].tolist())
        assert prompt == f"user: p{i}<eos>\nassistant: "


@pytest.mark.subprocess
def test_crashing_hanging_and_silent_agents_fail_their_episode_only(tiny):
    played, _, _ = _run(tiny, "crash", n=2)
    assert played.rewards == [0.0, 0.0] and len(played.failures) == 2
    assert "exited with status 3" in played.failures[0]
    assert "agent: the tool server is unreachable" in played.failures[0]  # the stderr tail
    start = time.monotonic()
    played, _, _ = _run(tiny, "hang", n=2, timeout_s=1.5)
    assert time.monotonic() - start < 20
    assert all("ran past --agent-timeout 1.5 s and was killed" in f for f in played.failures)
    played, _, _ = _run(tiny, "noreward", n=1)
    assert "wrote no valid" in played.failures[0] and played.turns == [2]
    played, _, _ = _run(tiny, "rewrite", n=1)
    assert "did not extend the conversation" in played.failures[0]
    played, _, _ = _run(tiny, "ok", n=1, max_turns=1)
    assert "reached --max-turns 1" in played.failures[0] and played.turns == [1]


def test_tool_calls_are_parsed():
    calls = _tool_calls('x <tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call> '
                        '<tool_call>not json</tool_call>')
    assert calls == [{"id": "call_0", "type": "function",
                      "function": {"name": "calc", "arguments": '{"a": 1}'}}]


def test_the_endpoint_listens_on_localhost_only_and_refuses_what_it_cannot_record(tiny):
    import urllib.error
    import urllib.request

    runner = AgentRunner(command("ok"), timeout_s=5, max_turns=2, max_turn_tokens=4,
                         tokenizer=tiny[0], eos_token_id=1, context=256, device="cpu")
    try:
        assert runner.server.server_address[0] == "127.0.0.1"
        url = f"{runner.base}/sessions/nosuch/v1/chat/completions"
        body = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10)
        runner.server.sessions["s"] = _Session()  # a known session: the body is checked first
        for bad in ({"messages": [], "stream": True}, {"messages": [], "n": 2}, {"x": 1}):
            request = urllib.request.Request(url.replace("nosuch", "s"),
                                             data=json.dumps(bad).encode())
            with pytest.raises(urllib.error.HTTPError, match="400"):
                urllib.request.urlopen(request, timeout=10)
    finally:
        runner.close()


@pytest.mark.subprocess
def test_agent_rewards_reach_the_estimator(tmp_path):
    cfg = make_config(*RECIPES["reinforce_plus_plus_baseline"], "--use-agentic-rollout",
                      "--agent-command", command("ok"), output_dir=tmp_path / "run")
    trainer = Trainer(cfg, init_distributed(cfg.system.device), console=False)
    initial = {n: p.detach().clone() for n, p in unwrap(trainer.policy.model).named_parameters()}
    try:
        trainer.fit()
    finally:
        trainer.close()
    moved = max((p.detach() - initial[n]).abs().max().item()
                for n, p in unwrap(trainer.policy.model).named_parameters())
    assert moved > 1e-4
    rows = read_metrics(tmp_path / "run")
    for step, row in enumerate(rows):
        indices = range(step * 16, (step + 1) * 16)  # 4 prompts x 4 samples per step
        assert row["rollout/raw_reward"] == pytest.approx(sum(i % 3 for i in indices) / 16)
        assert row["rollout/episode_turns"] == 2.0 and row["rollout/agent_failures"] == 0
    with open(tmp_path / "run" / "samples.jsonl") as f:
        assert "user: again" in json.loads(f.readline())["response"]


@pytest.mark.parametrize("flags,match", [
    (["--use-agentic-rollout"], "needs --agent-command"),
    (["--agent-command", "python x.py"], "only applies to --use-agentic-rollout"),
    (["--use-agentic-rollout", "--agent-command", "no-such-agent-program --x"],
     "'no-such-agent-program' is not an executable file or a program on PATH"),
    (["--use-agentic-rollout", "--agent-command", command("ok"), "--rm-type", "copy"],
     "the agent writes the messages and reports the reward"),
    (["--use-agentic-rollout", "--agent-command", command("ok"), "--agent-timeout", "0"],
     "must lie in"),
])
def test_bad_agent_flags_are_rejected(flags, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        make_config(*flags, output_dir=tmp_path)


@pytest.mark.subprocess
def test_an_agent_command_that_does_not_start_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "relax", "train", "--use-agentic-rollout",
                           "--agent-command", "./missing-agent.sh", "--num-rollout", "1",
                           "--output-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "relax train: error: --agent-command ./missing-agent.sh: './missing-agent.sh' is not "
        "an executable file or a program on PATH; give a command that starts, e.g. 'python "
        "my_agent.py'"]


@pytest.mark.subprocess
def test_two_process_gloo_agents_repeat_every_token(tmp_path):
    """Two seeded runs of agents that think for a random time before each call (different in
    each run): the same samples, token for token, and the same metrics but the timings. A
    time window batched the calls as they came, so the batches, and with one random stream
    per batch the tokens, changed with the think times."""
    runs = []
    for name in ("first", "again"):
        out = tmp_path / name
        proc = torchrun_relax("--use-agentic-rollout", "--agent-command", command("think"),
                              "--num-rollout", "2", "--rollout-batch-size", "2",
                              "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4",
                              "--rollout-temperature", "1.5", "--log-samples", "8", "--seed",
                              "11", "--device", "cpu", "--output-dir", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((read_metrics(out), (out / "samples.jsonl").read_text()))
    (rows, samples), (rows_again, samples_again) = runs
    for step, row in enumerate(rows):
        # every rank ran its own agents; the reward is the global mean over both ranks
        indices = range(step * 8, (step + 1) * 8)
        assert row["rollout/raw_reward"] == pytest.approx(sum(i % 3 for i in indices) / 8)
    # rank 0's 4 episodes of each step, whole; rank 1's tokens enter the metrics below
    assert samples == samples_again and samples.count("\n") == 8
    timings = ("perf/", "rollout/generate_", "rollout/reward_time", "time/")
    for row, again in zip(rows, rows_again, strict=True):
        assert {k: v for k, v in row.items() if not k.startswith(timings)} == {
            k: v for k, v in again.items() if not k.startswith(timings)}


@pytest.mark.parametrize("mode", ["ok", "tool"])
@pytest.mark.subprocess
def test_sessions_keep_their_kv_cache_between_calls(tiny, mode, tmp_path, monkeypatch):
    """Every batch of calls, sampled with the sessions' kept KV caches, draws exactly the ids
    a prefill of the whole conversations draws from the same generator state (fp32), and
    every session that called before finds its cache, whichever sessions share the batch."""
    monkeypatch.setenv("RELAX_TEST_DIR", str(tmp_path))
    tok, model = tiny
    generator = torch.Generator().manual_seed(0)
    seen, hits = set(), []

    def sample(ids, mask, k, cache=None, keys=None):
        kw = dict(max_new_tokens=k, eos_token_ids=[tok.eos_token_id],
                  pad_token_id=tok.pad_token_id, generator=generator)
        state = generator.get_state()
        whole = generate(model, ids, mask, **kw)
        generator.set_state(state)
        hits.append((sum(key in cache.cache.entries for key in cache.keys),
                     sum(key in seen for key in cache.keys)))
        seen.update(cache.keys)
        kept = generate(model, ids, mask, **kw, cache=cache)
        assert torch.equal(whole.response_ids, kept.response_ids)
        assert torch.equal(whole.response_mask, kept.response_mask)
        torch.testing.assert_close(whole.log_probs, kept.log_probs, rtol=0, atol=1e-5)
        return kept

    runner = AgentRunner(command(mode), timeout_s=60, max_turns=4, max_turn_tokens=4,
                         tokenizer=tok, eos_token_id=tok.eos_token_id, context=256,
                         device="cpu")
    try:
        played = runner.run([{"prompt": f"p{i}", "label": None, "index": i, "step": 0}
                             for i in range(4)], sample)
    finally:
        runner.close()
    assert played.failures == [] and played.turns == [2, 2, 2, 2]
    assert all(found == before for found, before in hits)
    assert sum(found for found, _ in hits) == 4  # each session's second call
