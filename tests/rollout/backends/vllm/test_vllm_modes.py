"""The modes beyond single-turn prompts on ``--rollout-backend vllm``, with one real vLLM
server for the whole module (a start takes 20-40 s here): ``--env`` episodes and
``--use-agentic-rollout`` agent programs (every turn sampled by the server, token ids in and
out), ``relax eval --env``, partial rollouts (relax/rollout/backends/vllm/vllm_sampler.py, the stop in
rounds of ``--vllm-partial-chunk-tokens``), partial rollouts of ``--env`` episodes, and a
generative judge (``--rm-type genrm``) scoring the server's samples.

The server serves an untied tiny Qwen3 directory that the runs name with ``--vllm-url`` and
``--hf-checkpoint``; a run pushes its weights to it, so each test that trains puts the
original weights back afterwards. The trainer's log-probs of the whole context against the
server's per-turn log-probs (``rollout/logprob_abs_diff_max`` below fp32 rounding) is what
shows that the tokens the trainer trains on are the ones the server drew, in the context it
drew them in: a re-tokenized turn, a lost or a repeated token would put the model's
log-probs of another context there.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from relax.rollout.backends.vllm.vllm_server import VllmServer
from relax.rollout.backends.vllm.vllm_sync import DiskSync
from tests.rollout.backends.vllm.test_vllm_server import (
    STARTUP,
    TOL_FP32,
    VLLM_PYTHON,
    build_model_dir,
    load,
)
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward

# xdist_group: under `make test`'s workers the module stays on one, so its server starts
# once
pytestmark = [pytest.mark.subprocess, pytest.mark.xdist_group("vllm-modes")]

if not VLLM_PYTHON.exists():
    pytest.skip("the vLLM environment is absent: `make vllm` builds it (`make test` does)",
                allow_module_level=True)

AGENT = str(Path(__file__).resolve().parents[2] / "agents" / "agent_program.py")
SMALL = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--rollout-max-response-len", "6", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # untied: a --vllm-url server reloads the trainer's weights (vllm_weights.py)
    return build_model_dir(tmp_path_factory.mktemp("vllm-modes-model"),
                           tie_word_embeddings=False)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-modes-log") / "server.log"
    # processed: softmax(z / T) without truncation, so T = 1 and the partial run's T = 1.5
    # both get the trainer's distribution (relax/config/sections/backend.py)
    server = VllmServer.start(str(model_dir), log_path=str(log), dtype="float32", seed=0,
                              logprobs_mode="processed_logprobs", python=str(VLLM_PYTHON))
    try:
        server.wait_ready(STARTUP)
        server.client(timeout=300).served_model()
        yield server
    finally:
        server.close()


@pytest.fixture
def client(server):
    client = server.client(timeout=300)
    client.served_model()
    return client


@pytest.fixture
def restore(server, model_dir, tmp_path):
    """After a run that synced its weights: the server serves the original ones again."""
    yield
    client = server.client(timeout=300)
    client.served_model()
    DiskSync(client, str(tmp_path / "restore")).push(load(model_dir), 0)


def train(model_dir, server, tmp_path, *flags):
    cfg = make_config("--rollout-backend", "vllm", "--hf-checkpoint", str(model_dir),
                      "--vllm-url", server.url, *SMALL, *flags, output_dir=tmp_path / "run")
    return fit(cfg)


def samples(tmp_path) -> list[dict]:
    with open(tmp_path / "run" / "samples.jsonl") as f:
        return [json.loads(line) for line in f]


def prefix_cache_hits(client) -> float:
    """Tokens the server's prefix cache has served so far (its Prometheus counter)."""
    text = client.request("/metrics", method="GET")
    found = re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert found, "no prefix-cache counter in /metrics"
    return sum(float(x) for x in found)


def test_a_generative_judge_scores_vllm_samples(model_dir, server, tmp_path, restore):
    """--rm-type genrm: the judge is its own model in the trainer's process and decodes with
    Relax's engine whatever samples the policy; the vLLM samples reach it and its verdicts
    are the rewards. (Here on the module's server rather than an owned one of its own: the
    judge does not care which, and a start is 17-26 s of a worker.)"""
    from tests.rollout.reward.test_genrm import _tiny_judge_dir
    from tests.trainer.helpers import write_jsonl

    rows = [{"input": f"{i}+{i}=", "label": str(2 * i)} for i in range(8)]
    trainer, _, _ = train(model_dir, server, tmp_path, "--prompt-data",
                          write_jsonl(tmp_path, rows), "--rm-type", "genrm",
                          "--genrm-model-path", _tiny_judge_dir(tmp_path),
                          "--genrm-max-response-len", "4", "--num-rollout", "1")
    assert read_metrics(tmp_path / "run")[0]["rollout/logprob_abs_diff_max"] < TOL_FP32
    assert len(trainer.scorer.judge.last_verdicts) == 4  # the step's 2 x 2 vLLM samples
    drawn = samples(tmp_path)
    assert drawn and all(s["reward"] in (0.0, 1.0) for s in drawn)


# ---------------------------------------------------------------------- --env episodes
class LongGame:
    """A first observation longer than one KV block of vLLM's CPU build (128 tokens; the
    tiny tokenizer has a token per character), then two more turns."""

    def reset(self, seed: int) -> str:
        self.left = 2
        return f"game {seed}: " + "the board is long " * 8

    def step(self, action: str):
        self.left -= 1
        return "move", 0.5, self.left == 0


def reference_log_probs(model, prompt: list[int], ids: list[int], trained: list[bool]):
    """float64 log-probs of each trained token of one episode given everything before it
    (written out here: one forward of the whole context)."""
    model = model.double()
    tokens = torch.tensor(prompt + ids)
    with torch.no_grad():
        logp = model(tokens[None]).logits[0].double().log_softmax(-1)
    model.float()
    return [float(logp[len(prompt) + t - 1, ids[t]]) for t in range(len(ids)) if trained[t]]


def test_episode_turns_are_sampled_token_in_token_out_with_the_prefix_cache(client, model_dir):
    """run_episodes with the vLLM sampler: each model turn's tokens and log-probs are the
    server's, and the whole episode's float64 log-probs equal them (the turns were sent as
    the episode's ids, nothing re-tokenized); the second turn of every episode reuses the
    first observation's KV block from vLLM's prefix cache."""
    from relax.models import load_tokenizer
    from relax.rollout.agents.episodes import run_episodes, turn_io
    from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
    from relax.rollout.generation.sampler import SamplingParams

    tokenizer = load_tokenizer(str(model_dir), "--hf-checkpoint")
    eos = tokenizer.eos_token_id
    sampler = VllmSampler(client, eos_token_ids=[eos], pad_token_id=tokenizer.pad_token_id,
                          params=SamplingParams(temperature=1.0), device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    format_prompt, render = turn_io(tokenizer, apply_chat_template=False, system_prompt=None,
                                    eos_token_id=eos)
    before = prefix_cache_hits(client)
    played = run_episodes(
        [LongGame() for _ in range(4)], [1, 1, 2, 2], tokenizer=tokenizer,
        format_prompt=format_prompt, render=render,
        sample=lambda ids, mask, k, cache=None: sampler(ids, mask, k, generator, cache=cache),
        max_turns=3, max_turn_tokens=6, context=256, device="cpu")
    hits = prefix_cache_hits(client) - before
    assert played.errors == [] and played.turns == [2, 2, 2, 2]
    r, model = played.rollout, load(model_dir)
    for i in range(4):
        prompt = r.prompt_ids[i][r.prompt_mask[i]].tolist()
        present = r.context_mask[i]
        ids = r.response_ids[i][present].tolist()
        trained = r.response_mask[i][present].tolist()
        assert len(prompt) > 128 and sum(trained) >= 2
        drawn = r.log_probs[i][r.response_mask[i]].double()
        ref = torch.tensor(reference_log_probs(model, prompt, ids, trained))
        assert float((drawn - ref).abs().max()) < TOL_FP32
    assert hits >= 4 * 128, hits  # each episode's second turn: its first full block


def test_env_episodes_train_on_vllm(model_dir, server, tmp_path, restore):
    cfg_flags = ["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3"]
    _, _, moved = train(model_dir, server, tmp_path, *cfg_flags)
    assert moved > 1e-4
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for row in rows:
        # the trainer's log-probs of whole episodes against the server's, turn by turn;
        # step 2 samples after a sync
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
        assert row["rollout/episode_turns"] == 3.0 and row["rollout/policy_lag"] == 0
    got = samples(tmp_path)
    assert {(s["step"], s["policy_version"]) for s in got} == {(1, 0), (2, 1)}
    assert "T-2" in got[0]["response"]  # the environment's turns are in the episode


def test_relax_eval_env_on_vllm_equals_relax_engine(model_dir, server):
    """Greedy held-out episodes give Relax's engine's metrics (fp32)."""
    from tests.eval.test_eval_command import call

    argv = [str(model_dir), "--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3",
            "--eval-temperature", "0", "--n-samples-per-eval-prompt", "1",
            "--eval-episodes", "4", "--eval-max-response-len", "5"]
    code, out, err = call(["eval", *argv])
    assert (code, err) == (0, ""), err
    relax = json.loads(out)
    code, out, err = call(["eval", *argv, "--rollout-backend", "vllm", "--vllm-url",
                           server.url])
    assert (code, err) == (0, ""), err
    vllm = json.loads(out)
    relax.pop("perf/eval_time"), vllm.pop("perf/eval_time")
    assert vllm == pytest.approx(relax, abs=1e-12)
    assert vllm["eval/env/episode_turns"] == 3.0


# ---------------------------------------------------------------------- agent programs
def test_agent_programs_train_on_vllm(model_dir, server, tmp_path, restore):
    """The agent endpoint's turns go to the server as token ids (its chat template rendered
    once, the replies kept as drawn)."""
    _, _, moved = train(model_dir, server, tmp_path, "--use-agentic-rollout",
                        "--agent-command", f"{sys.executable} {AGENT} ok")
    assert moved > 1e-4
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
        assert row["rollout/episode_turns"] == 2.0 and row["rollout/agent_failures"] == 0
    got = samples(tmp_path)
    assert {(s["step"], s["policy_version"]) for s in got} == {(1, 0), (2, 1)}
    assert "user: again" in got[0]["response"]


# ---------------------------------------------------------------------- partial rollouts
def test_a_cut_response_continues_from_its_tokens(client, model_dir):
    """A decode stopped after its first round of 5 tokens, then continued from prompt + those
    tokens: greedy, the pieces join into the uncut response token for token with its
    log-probs; sampled, the joined log-probs are a float64 forward's of the whole response
    (nothing lost, nothing repeated, the continuation conditioned on every earlier token)."""
    from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
    from relax.rollout.generation.generate import left_pad
    from relax.rollout.generation.sampler import SamplingParams
    from tests.rollout.backends.vllm.test_vllm_server import EOS, PAD, PROMPTS

    def joined(temperature, seed):
        sampler = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD,
                              params=SamplingParams(temperature=temperature),
                              device=torch.device("cpu"), chunk=5)
        generator = torch.Generator().manual_seed(seed)
        ids, mask = left_pad(PROMPTS, PAD, "cpu")
        cut = sampler(ids, mask, 12, generator, stop=lambda finished: True)
        heads = [r[m].tolist() for r, m in zip(cut.response_ids, cut.response_mask, strict=True)]
        logps = [r[m].tolist() for r, m in zip(cut.log_probs, cut.response_mask, strict=True)]
        assert max(len(h) for h in heads) == 5 and bool(cut.truncated.any())
        rows = [i for i in range(len(PROMPTS)) if cut.truncated[i]]
        ids, mask = left_pad([PROMPTS[i] + heads[i] for i in rows], PAD, "cpu")
        rest = sampler(ids, mask, 12, generator,
                       budgets=torch.tensor([12 - len(heads[i]) for i in rows]),
                       stop=lambda finished: False)
        for k, i in enumerate(rows):
            heads[i] += rest.response_ids[k][rest.response_mask[k]].tolist()
            logps[i] += rest.log_probs[k][rest.response_mask[k]].tolist()
        return heads, logps

    heads, logps = joined(0.0, 0)
    whole = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD,
                        params=SamplingParams(temperature=0.0), device=torch.device("cpu"))(
        *left_pad(PROMPTS, PAD, "cpu"), 12)
    for i in range(len(PROMPTS)):
        m = whole.response_mask[i]
        assert heads[i] == whole.response_ids[i][m].tolist()
        assert logps[i] == pytest.approx(whole.log_probs[i][m].tolist(), abs=TOL_FP32)
    heads, logps = joined(1.0, 1)
    model = load(model_dir)
    for i in range(len(PROMPTS)):
        ref = reference_log_probs(model, PROMPTS[i], heads[i], [True] * len(heads[i]))
        assert logps[i] == pytest.approx(ref, abs=TOL_FP32)


def test_partial_rollouts_train_on_vllm(model_dir, server, tmp_path, restore):
    """Groups cut at a round boundary are carried and continued by the next step's server
    (after a sync): with the older tokens masked out of the loss, the tokens of each step
    are the server's under the weights of that step, conditioned on the carried ones, so the
    mismatch stays at fp32 rounding."""
    flags = ["--partial-rollout", "--rollout-batch-size", "2", "--over-sampling-batch-size",
             "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "12",
             "--rollout-temperature", "1.5", "--mask-offpolicy-in-partial-rollout",
             "--vllm-partial-chunk-tokens", "3", "--num-rollout", "3",
             "--custom-rm-path", f"{write_reward(tmp_path)}:parity"]
    _, _, moved = train(model_dir, server, tmp_path, *flags)
    assert moved > 1e-4
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
    assert any(r["rollout/partial_carried_groups"] > 0 for r in rows), rows
    assert any(r["rollout/partial_offpolicy_tokens"] > 0 for r in rows[1:]), rows


def test_partial_episodes_train_on_vllm(model_dir, server, tmp_path, restore):
    """--partial-rollout --env: every turn is the server's; episodes cut between their turns
    are carried with their environments and continued in the next step by the server (after
    a sync), conditioned on the turns played before the cut. With the older turns masked out
    of the loss, each step's tokens are the server's under that step's weights, so the
    mismatch stays at fp32 rounding."""
    flags = ["--partial-rollout", "--env", "tests.rollout.agents.scripted:ragged", "--max-turns", "3",
             "--rollout-batch-size", "2", "--over-sampling-batch-size", "4",
             "--n-samples-per-prompt", "2", "--rollout-temperature", "1.5",
             "--mask-offpolicy-in-partial-rollout", "--num-rollout", "2"]
    trainer, _, moved = train(model_dir, server, tmp_path, *flags)
    assert moved > 1e-4
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
    assert all(r["rollout/partial_carried_groups"] > 0 for r in rows), rows
    # step 2 trained episodes holding turns the server sampled in step 1
    assert rows[1]["rollout/partial_offpolicy_tokens"] > 0, rows
    collector = trainer.collector
    cut = {e.seed: e.turns for g in collector.carried for e in g if e.live and e.turns}
    assert cut, "episodes cut between their turns are carried"
    labels = collector.collect(2).labels + collector.collect(3).labels
    # trained later with the turns they played before the cut and after it
    assert any(x["turns"] > cut[x["env_seed"]] for x in labels if x["env_seed"] in cut)
