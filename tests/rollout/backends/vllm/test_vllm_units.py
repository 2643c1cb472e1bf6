"""The vLLM backend's pieces without a server: the sampler's assembly of answers into a
Rollout, its per-row seeds and budgets, the weight sync's order of requests, where the
owned servers run and who pools them, and the one-line errors of a missing environment and a failing server. The real servers are
tests/rollout/backends/vllm/test_vllm_server.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from relax.errors import InputError
from relax.rollout.backends.vllm.vllm_backend import Owned, VllmBackend, VllmSettings
from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient, check_version
from relax.rollout.backends.vllm.vllm_sampler import VllmSampler
from relax.rollout.backends.vllm.vllm_server import PORT_TRIES, VllmServer, last_error, vllm_python
from relax.rollout.backends.vllm.vllm_sync import DiskSync, LoraSync
from relax.rollout.backends.vllm.vllm_weights import lora_rank_slot
from relax.rollout.generation.generate import concat_rollouts, left_pad
from relax.rollout.generation.sampler import SamplingParams

EOS, PAD = 1, 0


class FakeClient:
    """Answers each prompt with ``script[first prompt token]`` and records the requests."""

    def __init__(self, script):
        self.script, self.calls, self.lock = script, [], threading.Lock()

    def complete(self, prompt, **kw):
        with self.lock:
            self.calls.append((list(prompt), kw))
        tokens = self.script[prompt[0]][:kw["max_tokens"]]
        return {"token_ids": tokens, "log_probs": [-0.5 - i for i in range(len(tokens))],
                "finish_reason": "stop" if tokens[-1] == EOS else "length"}


def test_answers_become_a_rollout():
    client = FakeClient({5: [7, 8, EOS], 6: [9, 9, 9, 9], 4: [EOS]})
    ids, mask = left_pad([[5, 2], [6], [4, 3, 3]], PAD, "cpu")
    sampler = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD,
                          params=SamplingParams(temperature=0.7, top_p=0.9, top_k=5),
                          device=torch.device("cpu"), version=3)
    r = sampler(ids, mask, max_new_tokens=4, generator=torch.Generator().manual_seed(0))
    # prompts went as their unpadded token ids, nothing re-tokenized
    assert sorted(c[0] for c in client.calls) == [[4, 3, 3], [5, 2], [6]]
    assert r.response_ids.tolist() == [[7, 8, EOS, PAD], [9, 9, 9, 9], [EOS, PAD, PAD, PAD]]
    assert r.response_mask.tolist() == [[True, True, True, False], [True] * 4,
                                        [True, False, False, False]]
    assert r.truncated.tolist() == [False, True, False]
    assert r.log_probs[0].tolist() == [-0.5, -1.5, -2.5, 0.0]
    assert r.policy_version.tolist() == [3, 3, 3]
    kw = client.calls[0][1]
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["stop_token_ids"]) == (
        0.7, 0.9, 5, [EOS])
    # a group's copies of one prompt get different seeds (one seed would sample one answer)
    assert len({c[1]["seed"] for c in client.calls}) == 3


def test_seeds_follow_the_generator_and_budgets_cut_rows():
    script = {5: [7] * 9}
    ids, mask = left_pad([[5], [5]], PAD, "cpu")

    def seeds(seed):
        client = FakeClient(script)
        VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD, params=SamplingParams(),
                    device=torch.device("cpu"))(
            ids, mask, 6, torch.Generator().manual_seed(seed), budgets=torch.tensor([2, 9]))
        return sorted((c[1]["seed"], c[1]["max_tokens"]) for c in client.calls)

    assert seeds(1) == seeds(1) != seeds(2)
    assert sorted(m for _, m in seeds(1)) == [2, 6]


def test_rows_with_their_own_streams_get_their_own_seeds_in_any_batch():
    """One generator per row (agent calls): a row's request seed is its stream's first draw,
    wherever the row sits in the batch and whatever else is in it."""
    ids, mask = left_pad([[5], [6]], PAD, "cpu")

    def seeds(order):
        client = FakeClient({5: [EOS], 6: [EOS]})
        VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD, params=SamplingParams(),
                    device=torch.device("cpu"))(
            ids[order], mask[order], 2, [torch.Generator().manual_seed(10 + i) for i in order])
        return {c[0][0]: c[1]["seed"] for c in client.calls}

    want = {5 + i: int(torch.randint(0, 2**31 - 1, (1,),
                                     generator=torch.Generator().manual_seed(10 + i)))
            for i in (0, 1)}
    assert seeds([0, 1]) == seeds([1, 0]) == want


def test_a_cuda_generator_draws_the_cpu_stream_and_goes_on_between_calls():
    """A CUDA run's seeds are a CPU run's of the same seed, and the turns of an episode (calls
    with one generator) get new seeds each, as on the CPU."""

    class CudaGenerator:  # what the sampler reads of a CUDA generator (no GPU here)
        device = torch.device("cuda")

        def initial_seed(self):
            return 11

    ids, mask = left_pad([[5], [5]], PAD, "cpu")

    def turns(generator):
        client = FakeClient({5: [EOS]})
        sampler = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD,
                              params=SamplingParams(), device=torch.device("cpu"))
        for _ in range(2):
            sampler(ids, mask, 2, generator)
        return [c[1]["seed"] for c in client.calls]

    cuda, cpu = turns(CudaGenerator()), turns(torch.Generator().manual_seed(11))
    assert sorted(cuda[:2]) == sorted(cpu[:2]) and sorted(cuda[2:]) == sorted(cpu[2:])
    assert set(cuda[:2]) != set(cuda[2:])


def test_policy_version_survives_concatenation():
    client = FakeClient({5: [EOS]})
    ids, mask = left_pad([[5]], PAD, "cpu")
    make = [VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD,
                        params=SamplingParams(), device=torch.device("cpu"), version=v)
            for v in (1, 2)]
    both = concat_rollouts([s(ids, mask, 2) for s in make], PAD)
    assert both.policy_version.tolist() == [1, 2]
    assert both.select([1]).policy_version.tolist() == [2]


class ContinuingClient(FakeClient):
    """Prompts of one token plus the tokens drawn so far: each answer continues
    ``script[first token]`` from there, a token at position j having log-prob -0.5 - j."""

    def complete(self, prompt, **kw):
        with self.lock:
            self.calls.append((list(prompt), kw))
        at = len(prompt) - 1
        tokens = self.script[prompt[0]][at:at + kw["max_tokens"]]
        return {"token_ids": tokens, "log_probs": [-0.5 - at - i for i in range(len(tokens))],
                "finish_reason": "stop" if tokens[-1] == EOS else "length"}


def test_partial_rounds_stop_on_token_counts_and_continue_from_the_tokens():
    """stop: rounds of ``chunk`` tokens, the rule asked after each; a carried row continues
    from its tokens with nothing lost or repeated and its log-probs going on."""
    script = {5: [7] * 10, 6: [8, 8, EOS], 4: [9] * 5 + [EOS]}
    ids, mask = left_pad([[5], [6], [4]], PAD, "cpu")
    asked = []

    def two_done(finished):
        asked.append(finished.tolist())
        return int(finished.sum()) >= 2

    def run(seed):
        client = ContinuingClient(script)
        sampler = VllmSampler(client, eos_token_ids=[EOS], pad_token_id=PAD,
                              params=SamplingParams(), device=torch.device("cpu"), chunk=2)
        out = sampler(ids, mask, 8, torch.Generator().manual_seed(seed), stop=two_done)
        return sampler, client, out

    sampler, client, out = run(0)
    assert asked == [[False, False, False], [False, True, False], [False, True, True]]
    assert all(kw["max_tokens"] <= 2 for _, kw in client.calls) and len(client.calls) == 8
    # row 0 was cut after three rounds: its tokens so far, and not ended (carried)
    assert out.response_ids[0].tolist() == [7] * 6
    assert out.truncated.tolist() == [True, False, False]
    assert out.log_probs[0].tolist() == [-0.5 - j for j in range(6)]
    # each round asked with the row's whole context: prompt + every token drawn so far
    assert sorted(p for p, _ in client.calls if p[0] == 5) == [[5], [5] + [7] * 2,
                                                               [5] + [7] * 4]
    # the same seed draws the same per-round seeds, another seed others; by request (the
    # context sent and its seed), since the requests of a round run on threads and the fake
    # records them in the order they finish, which a busy machine changes
    def seeds(calls):
        return sorted((prompt, kw["seed"]) for prompt, kw in calls)

    assert seeds(run(0)[1].calls) == seeds(client.calls)
    assert seeds(run(1)[1].calls) != seeds(client.calls)
    # the carried row in a later step: its context is prompt + its 6 tokens
    row = out.response_ids[0][out.response_mask[0]].tolist()
    ids2, mask2 = left_pad([[5] + row], PAD, "cpu")
    more = sampler(ids2, mask2, 4, torch.Generator().manual_seed(2), stop=lambda f: False)
    assert row + more.response_ids[0].tolist() == script[5][:10]
    assert more.log_probs[0].tolist() == [-0.5 - j for j in range(6, 10)]


class RecordingClient:
    def __init__(self, fail: bool = False):
        self.events, self.fail = [], fail

    def set_weight_version(self, version):
        self.served = version  # what vLLM's /weight_info then reports

    def weight_version(self):
        return self.served

    def pause(self):
        self.events.append("pause")

    def resume(self):
        self.events.append("resume")

    def reload_weights(self, path):
        self.events.append(("reload", os.path.basename(path), sorted(os.listdir(path))))
        if self.fail:
            raise RuntimeError("reload failed")


def _model():
    from relax.tiny_model import build_tiny_model, build_tokenizer
    return build_tiny_model(build_tokenizer(), seed=0)


def test_disk_sync_pauses_reloads_resumes_and_keeps_one_version(tmp_path):
    client, model = RecordingClient(), _model()
    sync = DiskSync(client, str(tmp_path / "w"))
    nbytes = sync.push(model, 1)
    assert client.events[0] == "pause" and client.events[-1] == "resume"
    _, name, files = client.events[1]
    assert name == "v1" and "config.json" in files and "model.safetensors" in files
    assert nbytes == os.path.getsize(tmp_path / "w" / "v1" / "model.safetensors")
    sync.push(model, 2)
    assert sorted(os.listdir(tmp_path / "w")) == ["v2"]  # the old version is gone


def test_disk_sync_resumes_the_server_when_the_reload_fails(tmp_path):
    client = RecordingClient(fail=True)
    with pytest.raises(RuntimeError, match="reload failed"):
        DiskSync(client, str(tmp_path / "w")).push(_model(), 1)
    assert client.events[-1] == "resume"


class LoraClient(RecordingClient):
    """Records adapter loads; ``fail``: a server started without --enable-lora."""

    url, model = "http://10.0.0.9:8000", "base"

    def describe(self):
        return f"vLLM server {self.url}"

    def load_lora_adapter(self, name, path):
        if self.fail:
            raise ServerError(f"{self.describe()} answered /v1/load_lora_adapter with HTTP "
                              '404: {"detail":"Not Found"}')
        self.events.append(("load", name, sorted(os.listdir(path))))

    def unload_lora_adapter(self, name):
        self.events.append(("unload", name))


def _lora_model():
    from relax.trainer.policy.lora import add_lora
    model = _model()
    return model, add_lora(model, rank=4, alpha=8, dropout=0.0, targets=["q_proj"], seed=0)


def test_lora_sync_loads_a_new_name_per_version_and_drops_the_old(tmp_path):
    client, (model, tuner) = LoraClient(), _lora_model()
    sync = LoraSync(client, str(tmp_path / "a"), tuner)
    nbytes = sync.push(model, 0)
    sync.push(model, 1)
    assert client.events == [
        "pause", ("load", "relax-lora-v0", ["adapter_config.json", "adapter_model.safetensors"]),
        "resume", "pause",
        ("load", "relax-lora-v1", ["adapter_config.json", "adapter_model.safetensors"]),
        ("unload", "relax-lora-v0"), "resume"]
    assert client.model == "relax-lora-v1" and os.listdir(tmp_path / "a") == ["v1"]
    # only the adapter's matrices (q_proj: 4 x 64 and 64 x 4 per layer, fp32) and a header
    adapter = sum(p.numel() * 4 for n, p in model.named_parameters() if "lora_" in n)
    assert adapter <= nbytes < adapter + 4096


def test_a_url_server_without_lora_is_one_line_naming_the_flags(tmp_path):
    client, (model, tuner) = LoraClient(fail=True), _lora_model()
    conf = VllmSettings(urls=(client.url,), model_dir=str(tmp_path), run_dir=str(tmp_path),
                        seed=0, temperature=1.0, interval=1, startup_timeout=1.0,
                        request_timeout=1.0)
    backend = VllmBackend(conf, 0, "cpu", client)
    backend.sync = LoraSync(client, str(tmp_path / "a"), tuner)
    with pytest.raises(InputError) as e:
        backend._load_first_adapter(model, tuner)
    line = str(e.value)
    assert "\n" not in line and line.startswith("--lora-rank 4: vLLM server http://10.0.0.9")
    assert "--enable-lora --max-lora-rank 8 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in line
    assert client.events[-1] == "resume"
    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 300, 512, 513)] == [
        1, 8, 8, 16, 320, 512, None]


class Ranks:
    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size


def test_owned_servers_are_started_by_rank_k_mod_r_and_pooled_by_every_colocated_rank():
    """--vllm-num-servers N over R sampling ranks: server k started by rank k mod R (each
    exactly once, the loader Split picks); colocated ranks pool all N, a rank starting none
    too; a --fully-async rollout rank i only i, i+R, ... (its own reload schedule)."""
    for n, r in ((1, 2), (2, 2), (3, 2), (5, 3), (2, 4)):
        colocated = [Owned.of(n, slot=None, ranks=Ranks(i, r)) for i in range(r)]
        started = [k for o in colocated for k in o.started]
        assert sorted(started) == list(range(n))  # every server once
        for i, o in enumerate(colocated):
            assert all(k % r == i for k in o.started)  # Split's loader is its starter
            assert o.pooled == list(range(n))
    assert [Owned.of(1, slot=None, ranks=Ranks(i, 2)).started for i in (0, 1)] == [[0], []]
    assert [Owned.of(5, slot=(i, 2), ranks=None).pooled for i in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert [Owned.of(None, slot=(i, 2), ranks=None).started for i in (0, 1)] == [[0], [1]]
    # unset: one per sampling rank; one process alone (relax eval) starts server 0
    assert Owned.of(None, slot=None, ranks=Ranks(1, 2)) == Owned(2, 2, 1)
    assert Owned.of(None, slot=None, ranks=None).started == [0]


def test_missing_environment_names_the_make_target(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAX_VLLM_PYTHON", str(tmp_path / "none" / "python"))
    with pytest.raises(InputError, match="run `make vllm`") as e:
        vllm_python()
    assert "\n" not in str(e.value)


def test_unsupported_version_is_one_line():
    check_version("0.32.0", "here")
    with pytest.raises(InputError, match="has vLLM 0.11.0; Relax is tested with 0.32.x"):
        check_version("0.11.0", "--vllm-url http://x:1")


def test_unreachable_server_is_one_line_naming_it():
    client = VllmClient("http://127.0.0.1:9", timeout=5)  # the discard port: nothing listens
    with pytest.raises(Exception) as e:
        client.served_model()
    line = str(e.value)
    assert line.startswith("vLLM server http://127.0.0.1:9 failed on /v1/models") and "\n" not in line


def test_last_error_picks_the_error_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\nRuntimeError: Unsupported head_dim=16\nINFO bye\n")
    assert last_error(str(log)) == "RuntimeError: Unsupported head_dim=16"
    assert last_error(str(tmp_path / "none.log")) == "(no log)"


def test_a_silent_server_times_out_in_one_line():
    """A server that accepts and never answers (a hung one): one line after the timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # the kernel accepts the connection; nobody ever answers
        client = VllmClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5)
        with pytest.raises(ServerError, match="did not answer within --vllm-request-timeout "
                           r"0.5 s") as e:
            client.served_model()
    assert "\n" not in str(e.value)


DYING_SERVER = """
import socket, struct, sys, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(listener.getsockname()[1]))
__import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
conn, _ = listener.accept()
conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
conn.close()  # a reset, as a killed server's inherited listening socket gives
time.sleep(1.5)  # still running when the client sees the reset
sys.exit(7)
"""


@pytest.mark.subprocess
def test_a_reset_from_a_dying_owned_server_names_its_exit_status(tmp_path):
    """The connection resets before the owned server's process has ended: the line waits for
    its exit and gives the status (not only the reset)."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-c", DYING_SERVER, str(port_file)])
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        log = tmp_path / "server.log"
        log.write_text("RuntimeError: engine core died\n")
        server = VllmServer(proc, f"http://127.0.0.1:{port_file.read_text()}", str(log), "m")
        with pytest.raises(ServerError) as e:
            server.client(timeout=30).request("/pause?mode=wait")
    finally:
        proc.kill()
        proc.wait()
    assert "exited with status 7 (RuntimeError: engine core died)" in str(e.value)


# A stand-in for the vLLM environment's python: the first ``taken`` starts fail as vLLM does
# when its port is bound by another process; later ones serve /health on the port given.
PORT_TAKEN_SERVER = """#!{python}
import http.server, os, sys
port, starts = int(sys.argv[sys.argv.index("--port") + 1]), "{starts}"
n = len(open(starts).read()) if os.path.exists(starts) else 0
open(starts, "a").write("x")
if n < {taken}:
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _port_taken_python(tmp_path, taken: int) -> str:
    path = tmp_path / "python"
    path.write_text(PORT_TAKEN_SERVER.format(python=sys.executable, starts=tmp_path / "starts",
                                             taken=taken))
    path.chmod(0o755)
    return str(path)


@pytest.mark.subprocess
def test_a_server_whose_port_was_taken_starts_again_on_another(tmp_path, capsys):
    """The port is chosen here, held until the server answers (so no one else is handed it),
    and should a process still bind it first, the server starts again on a fresh port."""
    server = VllmServer.start("m", log_path=str(tmp_path / "server.log"), dtype="float32",
                              seed=0, logprobs_mode="raw_logprobs",
                              python=_port_taken_python(tmp_path, taken=1))
    first = server.url
    try:
        with socket.socket() as intruder, pytest.raises(OSError, match="in use"):
            intruder.bind(("127.0.0.1", int(first.rsplit(":", 1)[1])))  # reserved
        server.wait_ready(timeout=60)
        assert server.url != first
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
        assert f"vLLM server {first} " in line and "its port was taken before it bound it; " \
            f"starting it again on port {server.url.rsplit(':', 1)[1]}" in line, line
    finally:
        server.close(grace=5)


@pytest.mark.subprocess
def test_a_server_whose_ports_are_always_taken_fails_in_one_line(tmp_path):
    server = VllmServer.start("m", log_path=str(tmp_path / "server.log"), dtype="float32",
                              seed=0, logprobs_mode="raw_logprobs",
                              python=_port_taken_python(tmp_path, taken=99))
    try:
        with pytest.raises(InputError, match="exited with status 1 while starting: OSError: "
                           r"\[Errno 98\] Address already in use"):
            server.wait_ready(timeout=60)
    finally:
        server.close(grace=5)
    assert (tmp_path / "starts").read_text() == "x" * PORT_TRIES  # its starts, then the line
