"""The pool of vLLM servers behind a router (relax/rollout/backends/vllm/router.py) against
stub servers that are real processes on 127.0.0.1 (stub_vllm.py): least-loaded routing, a
slow server given less work, a server killed mid-step whose requests finish elsewhere (every
sample once, the same as on one server), a server failing its weight update leaving the
pool, a server reporting another weights version than it was told (or no version) leaving
it until it reports the right one, an episode's turns on one server, a rejoin after /health
and the weights caught up,
and a run whose every server is gone ending in one line with exit 1. Assertions are on
counts and order, never on durations; every wait is bounded."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from relax.metrics.tracker import MetricTracker
from relax.rollout.backends.vllm.router import ServerPool
from relax.rollout.backends.vllm.vllm_backend import VllmBackend, VllmSettings
from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient
from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
from relax.rollout.backends.vllm.vllm_sync import _reload  # a server's part of a disk sync
from relax.rollout.generation.generate import left_pad
from relax.rollout.generation.sampler import SamplingParams
from relax.rollout.generation.turn_cache import TurnCache
from tests.rollout.backends.vllm.stub_vllm import tokens

pytestmark = pytest.mark.subprocess

STUB = os.path.join(os.path.dirname(__file__), "stub_vllm.py")
EOS, PAD = 1, 0
START_S = 20.0  # the most a stub may take to report its port


class Stub:
    """One stub server process; ``url`` from the port the child reports."""

    def __init__(self, model_dir, *flags):
        self.process = subprocess.Popen(
            [sys.executable, STUB, "--model-dir", str(model_dir), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], START_S)
        line = self.process.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            self.kill()
            raise RuntimeError(f"the stub did not report its port within {START_S} s: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return json.loads(answer.read())

    def control(self, **settings) -> None:
        request = urllib.request.Request(self.url + "/control", json.dumps(settings).encode(),
                                         {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.process.stdout.close()


@pytest.fixture
def stubs(tmp_path):
    """``stubs(n, *flags)`` starts n stubs (flags for all, or a list of flag tuples, one per
    stub); every one is killed by its PID at the end."""
    started = []

    def start(n: int, *flags, each=None):
        new = [Stub(tmp_path, *(each[i] if each else flags)) for i in range(n)]
        started.extend(new)
        return new

    yield start
    for stub in started:
        stub.kill()


def _pool(stubs_, **kw) -> ServerPool:
    return ServerPool([VllmClient(s.url, timeout=30) for s in stubs_], **kw)


def _request(seed: int) -> dict:
    return dict(max_tokens=2, temperature=1.0, top_p=1.0, top_k=-1, seed=seed,
                stop_token_ids=[EOS])


def _sampler(target) -> VllmSampler:
    return VllmSampler(target, eos_token_ids=[EOS], pad_token_id=PAD,
                       params=SamplingParams(temperature=1.0), device=torch.device("cpu"))


def _batch(rows: int):
    return left_pad([[2 + i % 5, 3 + i % 3] for i in range(rows)], PAD, torch.device("cpu"))


def _metrics(pool: ServerPool) -> dict:
    tracker = MetricTracker()
    pool.record(tracker)
    return tracker.reduce()


def _until(condition, limit: float = 15.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_requests_go_to_the_least_loaded_server(stubs):
    """8 requests at once, 4 at most per server: they alternate, 4 and 4, both full."""
    pool = _pool(stubs(2, "--delay", "0.5"), cap=4)
    try:
        with ThreadPoolExecutor(8) as threads:
            answers = list(threads.map(lambda s: pool.complete([3, 4], **_request(s)),
                                       range(8)))
        assert [a["token_ids"] for a in answers] == [tokens([3, 4], s, 2) for s in range(8)]
        m = _metrics(pool)
        assert [m[f"rollout/server{i}/requests"] for i in (0, 1)] == [4, 4]
        assert [m[f"rollout/server{i}/in_flight"] for i in (0, 1)] == [4, 4]
        assert [m[f"rollout/server{i}/in_pool"] for i in (0, 1)] == [1.0, 1.0]
        assert m["rollout/server0/failures"] == 0 and m["rollout/server0/tokens_per_s"] > 0
    finally:
        pool.close()


def test_a_slow_server_gets_less_work(stubs):
    """128 rows through the sampler (64 in flight, 32 per server at most): the fast server
    answers its share and takes the rest while the slow one still holds its first 32."""
    slow, fast = stubs(2, each=[("--delay", "1.5"), ()])
    pool = _pool([slow, fast])
    try:
        ids, mask = _batch(128)
        out = _sampler(pool)(ids, mask, 2, torch.Generator().manual_seed(0))
        assert out.response_ids.shape == (128, 2)
        m = _metrics(pool)
        served = [m["rollout/server0/requests"], m["rollout/server1/requests"]]
        assert sum(served) == 128 and served[0] < served[1], served
    finally:
        pool.close()


def test_a_server_killed_mid_step_its_requests_finish_elsewhere(stubs, capsys):
    """Server 0 is SIGKILLed at the arrival of its 5th request, others in flight: the step's
    48 samples all come back, each answered once (the dead server's at most 4, the rest by
    server 1), and equal those of one healthy server with the same seeds."""
    dying, healthy_ = stubs(2, each=[("--kill-after", "4"), ("--delay", "0.05")])
    pool = _pool([dying, healthy_])
    ids, mask = _batch(48)
    try:
        out = _sampler(pool)(ids, mask, 2, torch.Generator().manual_seed(7))
        m = _metrics(pool)
        assert dying.process.wait(timeout=10) == -9
        dead = m["rollout/server0/requests"]
        assert dead <= 4 and dead + m["rollout/server1/requests"] == 48
        assert m["rollout/server0/failures"] >= 1 and m["rollout/server0/in_pool"] == 0.0
        assert len(healthy_.get("/stats")["prompts"]) == 48 - dead  # each once
        lines = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert len(lines) == 1 and dying.url in lines[0], lines
    finally:
        pool.close()
    alone = _pool([healthy_])
    try:
        again = _sampler(alone)(ids, mask, 2, torch.Generator().manual_seed(7))
    finally:
        alone.close()
    assert torch.equal(out.response_ids, again.response_ids)
    assert torch.equal(out.log_probs, again.log_probs)


def test_a_pool_of_one_server_ends_with_that_servers_own_error(stubs, capsys):
    """One server (an owned one, or one URL): nowhere else to go, so its own error ends the
    run as before pools, without a line about the pool."""
    (only,) = stubs(1, "--kill-after", "0")
    pool = _pool([only])
    try:
        with pytest.raises(ServerError) as e:
            pool.complete([3, 4], **_request(0))
    finally:
        pool.close()
    assert str(e.value).startswith(f"vLLM server {only.url} failed on /v1/completions: ")
    assert "pool" not in capsys.readouterr().err


def test_a_server_failing_its_update_leaves_the_pool(stubs, capsys):
    good, bad = stubs(2, each=[(), ("--fail-reload",)])
    pool = _pool([good, bad])
    try:
        pool.load(1, _reload("/weights/v1"))
        assert [os.path.basename(p) for p in good.get("/stats")["reloads"]] == ["v1"]
        err = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert len(err) == 1 and bad.url in err[0]
        assert "missed the update to weights version 1" in err[0] and "HTTP 500" in err[0]
        for seed in range(6):  # everything goes to the server that holds version 1
            pool.complete([3, 4], **_request(seed))
        m = _metrics(pool)
        assert (m["rollout/server0/requests"], m["rollout/server1/requests"]) == (6, 0)
        assert (m["rollout/server0/weight_version"], m["rollout/server1/weight_version"]) == (1, 0)
        assert m["rollout/server1/failures"] == 1 and m["rollout/server1/in_pool"] == 0.0
    finally:
        pool.close()


def test_a_server_reporting_a_stale_version_leaves_the_pool(stubs, capsys):
    """Server 1 reloads but reports version 2 after the update to 3 (it missed it): it
    leaves the pool in one line naming its URL, what it reports and what was expected; the
    step's 8 samples come from server 0, each recording the version server 0 reported."""
    good, stale = stubs(2, each=[(), ("--misreport", '"2"')])
    pool = _pool([good, stale], health_every=600)
    try:
        pool.load(3, _reload("/weights/v3"))
        (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert f"vLLM server {stale.url} left the pool" in line
        assert f"{stale.url} reports weights version 2 after the update to version 3" in line
        assert [m.in_pool for m in pool.members] == [True, False]
        assert good.get("/stats")["versions"] == ["3"]  # told as vLLM keeps it: a string
        ids, mask = _batch(8)
        out = _sampler(pool)(ids, mask, 2, torch.Generator().manual_seed(0))
        assert out.policy_version.tolist() == [3] * 8
        assert pool.served() == (3, good.url) and pool.served() is None
        m = _metrics(pool)
        assert (m["rollout/server0/requests"], m["rollout/server1/requests"]) == (8, 0)
        assert m["rollout/server1/failures"] == 1 and m["rollout/server1/weight_version"] == 0
    finally:
        pool.close()


def test_a_stale_server_rejoins_only_once_it_reports_the_pools_version(stubs, capsys):
    """The watcher's catch-ups reload server 1 while it still reports version 2: it stays
    out; once it reports what it is told it rejoins, at version 3."""
    good, stale = stubs(2, each=[(), ("--misreport", '"2"')])
    pool = _pool([good, stale], health_every=0.2)
    try:
        pool.load(3, _reload("/weights/v3"))
        assert _until(lambda: len(stale.get("/stats")["reloads"]) >= 3)  # two catch-ups
        assert not pool.members[1].in_pool
        stale.control(misreport=None)
        assert _until(lambda: pool.members[1].in_pool)
        assert pool.members[1].version == 3
        err = capsys.readouterr().err
        assert f"vLLM server {stale.url} rejoined the pool at weights version 3" in err
        assert sum("left the pool" in ln for ln in err.splitlines()) == 1
    finally:
        pool.close()


@pytest.mark.parametrize("answer", ['"latest"', "-1", '"default"'])
def test_a_weight_info_answer_that_is_no_version_is_one_line(stubs, capsys, answer):
    good, odd = stubs(2, each=[(), ("--misreport", answer)])
    pool = _pool([good, odd], health_every=600)
    try:
        pool.load(1, _reload("/weights/v1"))
        (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert f"vLLM server {odd.url} answered /weight_info with weight_version " in line
        assert ("'default'" if answer == '"default"' else "not a version") in line, line
        assert [m.in_pool for m in pool.members] == [True, False]
    finally:
        pool.close()


def test_an_episodes_turns_stay_on_one_server(stubs):
    """6 episodes, 3 turns each through a turn cache's keys: each episode's prompts all
    reach one server, and both servers hold some."""
    a, b = stubs(2, "--delay", "0.1")
    pool = _pool([a, b])
    sampler, cache = _sampler(pool), TurnCache()
    contexts = [[10 + e] for e in range(6)]
    generator = torch.Generator().manual_seed(1)
    try:
        for _ in range(3):
            ids, mask = left_pad(contexts, PAD, torch.device("cpu"))
            out = sampler(ids, mask, 2, generator, cache=cache.rows(list(range(6))))
            for e in range(6):
                contexts[e] = contexts[e] + out.response_ids[e].tolist() + [9]
    finally:
        pool.close()
    where = {}
    for k, stub in enumerate((a, b)):
        for prompt in stub.get("/stats")["prompts"]:
            where.setdefault(prompt[0], set()).add(k)
    assert sorted(where) == [10 + e for e in range(6)]
    assert all(len(servers) == 1 for servers in where.values()), where
    assert {k for servers in where.values() for k in servers} == {0, 1}


def test_a_server_rejoins_after_health_and_the_weights(stubs, capsys):
    """Server 1 stops answering: its request goes to server 0; once it answers /health
    again it reloads the pool's current weights, then rejoins."""
    a, b = stubs(2)
    pool = _pool([a, b], health_every=0.2)
    try:
        pool.load(3, _reload("/weights/v3"))
        b.control(down=True)
        pool.sessions["s"] = pool.members[1]  # a session that went to b
        answer = pool.complete([3, 4], session="s", **_request(5))
        assert answer["token_ids"] == tokens([3, 4], 5, 2)
        assert [m.in_pool for m in pool.members] == [True, False]
        assert a.get("/stats")["prompts"] == [[3, 4]]  # sent again to a
        b.control(down=False)
        assert _until(lambda: pool.members[1].in_pool)
        reloads = [os.path.basename(p) for p in b.get("/stats")["reloads"]]
        assert reloads == ["v3", "v3"]  # the update, then the catch-up before rejoining
        assert pool.members[1].version == 3
        err = capsys.readouterr().err
        assert f"vLLM server {b.url} rejoined the pool at weights version 3" in err
    finally:
        pool.close()


def test_fully_async_rollout_ranks_pool_disjoint_urls(stubs, tmp_path):
    urls = tuple(s.url for s in stubs(3))
    conf = VllmSettings(urls=urls, model_dir=str(tmp_path), run_dir=str(tmp_path), seed=0,
                        temperature=1.0, interval=1, startup_timeout=5.0, request_timeout=5.0)
    pools = [VllmBackend.open(conf, 2 + i, "cpu", slot=(i, 2)) for i in range(2)]
    try:
        assert [[m.index for m in b.pool.members] for b in pools] == [[0, 2], [1]]
        assert [[m.url for m in b.pool.members] for b in pools] == [[urls[0], urls[2]], [urls[1]]]
        tracker = MetricTracker()
        pools[1].record(tracker)  # every entry's names, zeros for the other rank's
        assert sorted(tracker.reduce()) == sorted(
            f"rollout/server{i}/{k}" for i in range(3) for k in (
                "requests", "failures", "in_flight", "tokens_per_s", "in_pool",
                "weight_version"))
    finally:
        for b in pools:
            b.close()


def test_every_server_gone_ends_the_run_in_one_line(stubs, tmp_path, capsys):
    """Both servers die at their first rollout request (after the start-up probe): one error
    line naming the pool, exit 1, no step written."""
    from relax.config import parse_train_config
    from relax.tiny_model import build_tiny_model, build_tokenizer
    from relax.trainer.launch import train

    model = tmp_path / "model"
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0, tie_word_embeddings=False).save_pretrained(model)
    tokenizer.save_pretrained(model)
    servers = stubs(2, "--model-dir", str(model), "--kill-after", "1")
    cfg = parse_train_config([
        "--rollout-backend", "vllm", "--vllm-url", *(s.url for s in servers),
        "--hf-checkpoint", str(model), "--num-rollout", "1", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--device", "cpu",
        "--output-dir", str(tmp_path / "run"), "--log-samples", "0"])
    status = train(cfg)
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("relax train: error: ")]
    assert status == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "every vLLM server of the pool" in errors[0] and "is gone" in errors[0], errors
    assert all(s.url in errors[0] for s in servers)
    assert sum("left the pool" in ln for ln in err.splitlines()) == 2
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""


def _load_on_two_ranks(urls: list[str]) -> dict:
    """One Gloo rank of a colocated run: its pool of the three URLs, entry j reloaded by
    rank j mod 2 (vllm_sync.py ``Split``), the failures agreed; rank 0 had taken server 0
    out of its own pool before the sync (a failed request), and loads it all the same for
    rank 1's pool. What the pool holds after, and the model name each client now asks for."""
    import torch.distributed as dist

    from relax.rollout.backends.vllm.vllm_sync import Split
    from relax.trainer.distributed import DistContext

    rank = dist.get_rank()
    pool = ServerPool([VllmClient(u, timeout=30) for u in urls], health_every=600)
    if rank == 0:
        pool.members[0].in_pool = False
    try:
        Split(DistContext(rank, 2, rank, torch.device("cpu"), dist.group.WORLD)).load(
            pool, 1, _reload("/weights/v1"), apply=lambda c: setattr(c, "model", "v1"))
        return {"in_pool": [m.in_pool for m in pool.members],
                "version": [m.version for m in pool.members],
                "model": [m.client.model for m in pool.members]}
    finally:
        pool.close()


def test_ranks_sharing_servers_take_out_the_same_failed_one(stubs):
    """Two ranks pool three servers; server 1 (reloaded by rank 1) fails its update: both
    ranks' pools drop it; servers 0 and 2 were reloaded once each, by rank 0, and every
    rank's clients of the servers holding version 1 name its model."""
    from tests.distributed_utils import run_distributed

    servers = stubs(3, each=[(), ("--fail-reload",), ()])
    results = run_distributed(_load_on_two_ranks, 2, [s.url for s in servers], timeout=120)
    assert results == [
        {"in_pool": [False, False, True], "version": [0, 0, 1], "model": [None, None, "v1"]},
        {"in_pool": [True, False, True], "version": [1, 0, 1], "model": ["v1", None, "v1"]}]
    assert [len(s.get("/stats")["reloads"]) for s in servers] == [1, 0, 1]


def test_fully_async_rollout_rank_records_its_pool_for_two_training_ranks(stubs, tmp_path):
    """``--fully-async`` with two training ranks and one rollout rank pooling three stub
    servers: the run trains, every step's samples are counted once over the servers, each
    server reloaded each version once, and both training ranks reduce the same metric names
    (the second share's are zeros)."""
    from relax.tiny_model import build_tiny_model, build_tokenizer
    from tests.distributed_utils import torchrun_relax
    from tests.trainer.helpers import RECIPES, read_metrics, write_reward

    model = tmp_path / "model"
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0, tie_word_embeddings=False).save_pretrained(model)
    tokenizer.save_pretrained(model)
    servers = stubs(3, "--model-dir", str(model))
    run = tmp_path / "run"
    done = torchrun_relax(
        *RECIPES["grpo"], "--fully-async", "--rollout-num-gpus", "1", "--max-staleness", "0",
        "--rollout-backend", "vllm", "--vllm-url", *(s.url for s in servers),
        "--hf-checkpoint", str(model), "--custom-rm-path", f"{write_reward(tmp_path)}:parity",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--rollout-max-response-len", "4", "--num-rollout", "3", "--output-dir", str(run),
        "--device", "cpu", nproc=3, timeout=300, hang="a --fully-async pool run did not finish")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["rollout/step"] for r in rows] == [1, 2, 3]
    for step, row in enumerate(rows):
        assert sum(row[f"rollout/server{i}/requests"] for i in range(3)) == 4, row
        assert all(row[f"rollout/server{i}/in_pool"] == 1.0 for i in range(3)), row
        assert all(row[f"rollout/server{i}/weight_version"] == step for i in range(3)), row
        assert all(row[f"rollout/server{i}/failures"] == 0 for i in range(3)), row
    reloads = [[os.path.basename(p) for p in s.get("/stats")["reloads"]] for s in servers]
    assert reloads == [["v1", "v2"]] * 3
