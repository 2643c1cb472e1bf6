"""The streamed weight sync (relax/rollout/backends/vllm/vllm_collective.py) without vLLM: the
wire format packed here and unpacked by the plugin's own code (vllm_plugin/) against bytes
written out independently; stub servers (stub_vllm.py) that receive over real Gloo groups,
one failing its init and leaving the pool in one line that says what to do, and a server
out of the pool rejoining at the next push, never between pushes. Every wait is bounded."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch

from relax.rollout.backends.vllm.router import ServerPool
from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient
from relax.rollout.backends.vllm.vllm_collective import CollectiveSync, pack
from relax.rollout.backends.vllm.vllm_weights import plan_buckets
from tests.rollout.backends.vllm.test_vllm_pool import stubs  # noqa: F401 - the fixture

WIRE = os.path.join(os.path.dirname(__file__), *[os.pardir] * 4, "vllm_plugin",
                    "relax_vllm_plugin", "wire.py")


def _wire():
    spec = importlib.util.spec_from_file_location("relax_plugin_wire", WIRE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_packed_chunk_unpacks_to_the_same_tensors():
    """Mixed dtypes, odd sizes (a float32 after 3 bf16 values sits at an unaligned offset),
    a scalar and an empty tensor: the bytes are the tensors' own, one after the other
    (numpy's tobytes, written out here), and the plugin's unpack gives them back exactly."""
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, generator=g).to(torch.bfloat16), torch.randn(2, 5, generator=g),
               torch.randn((), generator=g, dtype=torch.float64), torch.zeros(0, 4),
               torch.arange(6, dtype=torch.int64).reshape(3, 2)[:, 1]]  # not contiguous
    names = [f"t{i}" for i in range(len(tensors))]
    chunk = pack(names, tensors)
    expected = b"".join(t.contiguous().view(torch.int16).numpy().tobytes()
                        if t.dtype == torch.bfloat16 else t.contiguous().numpy().tobytes()
                        for t in tensors)
    assert bytes(chunk.data.numpy()) == expected and chunk.nbytes == len(expected)
    assert chunk.info == {"names": names,
                          "dtype_names": ["bfloat16", "float32", "float64", "float32", "int64"],
                          "shapes": [[3], [2, 5], [], [0, 4], [3]]}
    unpacked = _wire().unpack(chunk.data, **chunk.info)
    assert [n for n, _ in unpacked] == names
    for (_, got), want in zip(unpacked, tensors, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(ValueError, match="a chunk of 5 bytes"):
        _wire().unpack(chunk.data[:5], **chunk.info)


def test_a_receive_buffer_is_reused_only_once_nothing_refers_to_it():
    """The plugin's receive buffers (wire.py ``Buffers``): a buffer is taken again only when
    no tensor shares it any more, such as the views a model's load keeps of a chunk until
    its layer is complete; beyond ``keep`` a fresh one is allocated."""
    buffers = _wire().Buffers(keep=2)
    first = buffers.get(100)
    address = first.data_ptr()
    second = buffers.get(50)
    assert second.data_ptr() != address  # the first is in use
    del first
    again = buffers.get(80)
    assert again.data_ptr() == address and again.numel() == 80
    kept = _wire().unpack(again, ["w"], ["float32"], [[20]])  # a load holding a view
    del again
    assert buffers.get(60).data_ptr() not in (address, second.data_ptr())
    del kept, second
    assert buffers.get(100).data_ptr() == address
    buffers.clear()
    assert buffers.pool == []


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _sums(model) -> list:
    return [float(t.double().sum()) for t in model.state_dict().values()]


@pytest.mark.subprocess
def test_streamed_weights_reach_each_server_and_a_failing_one_leaves(stubs, capsys):  # noqa: F811
    """Two stubs receive over their own groups, in buckets of at most 40 bytes; the
    third fails its init: it leaves the pool with one line naming it and the two ways out,
    and the others hold the version."""
    servers = stubs(3, each=[(), (), ("--fail-transfer",)])
    pool = ServerPool([VllmClient(s.url, timeout=60) for s in servers])
    model = _model()
    try:
        sync = CollectiveSync(pool, timeout=60, bucket_bytes=40)
        nbytes = sync.push(model, 1)
        assert nbytes == sum(t.numel() * 4 for t in model.state_dict().values())
        state = model.state_dict()
        buckets = plan_buckets([t.numel() * 4 for t in state.values()], 40)
        assert len(buckets) == 3  # [0.weight], [0.bias, 1.weight], [1.bias]
        for stub in servers[:2]:
            chunks = stub.get("/stats")["chunks"]
            assert [names for names, _ in chunks] == [[list(state)[j] for j in bucket]
                                                      for bucket in buckets]
            assert sum(total for _, total in chunks) == pytest.approx(sum(_sums(model)))
        assert [m.in_pool for m in pool.members] == [True, True, False]
        assert [m.version for m in pool.members[:2]] == [1, 1]
        line = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert len(line) == 1 and servers[2].url in line[0] and "HTTP 500" in line[0]
        assert "--weight-transfer-config" in line[0] and "--vllm-weight-sync disk" in line[0]
        with torch.no_grad():  # a second push goes over the groups set up by the first
            model[0].weight.add_(1.0)
        sync.push(model, 2)
        chunks = servers[0].get("/stats")["chunks"]
        assert len(chunks) == 6
        assert sum(total for _, total in chunks[3:]) == pytest.approx(sum(_sums(model)))
    finally:
        pool.close()


@pytest.mark.subprocess
def test_a_server_out_of_the_pool_rejoins_at_the_next_streamed_load(stubs, capsys):  # noqa: F811
    """A streamed load leaves nothing to catch up to: a server that missed one stays out
    while the pool waits (no load, no version set), and the next load, which finds it
    answering /health, loads it and puts it back."""
    a, b = stubs(2)
    pool = ServerPool([VllmClient(s.url, timeout=5) for s in (a, b)], health_every=0.1)
    loads = []

    def load(client):
        loads.append(client.url)
        client.pause()
        client.resume()

    try:
        b.control(down=True)
        pool.load(1, load, streamed=True)
        assert [m.in_pool for m in pool.members] == [True, False]
        b.control(down=False)
        time.sleep(1.0)  # ten health rounds of a disk pool: a streamed one asks none
        assert not pool.members[1].in_pool and b.get("/stats")["versions"] == []
        loads.clear()
        pool.load(2, load, streamed=True)
        assert sorted(loads) == sorted([a.url, b.url])
        assert [m.in_pool for m in pool.members] == [True, True]
        assert [m.version for m in pool.members] == [2, 2]
        assert b.get("/stats")["versions"] == ["2"]
        assert f"vLLM server {b.url} rejoined the pool at weights version 2" in \
            capsys.readouterr().err
    finally:
        pool.close()


@pytest.mark.subprocess
def test_a_pool_of_one_server_that_fails_its_init_is_its_one_line(stubs):  # noqa: F811
    [bad] = stubs(1, "--fail-transfer")
    with pytest.raises(ServerError, match="--weight-transfer-config") as e:
        CollectiveSync(VllmClient(bad.url, timeout=30), timeout=30,
                       bucket_bytes=1 << 20).push(_model(), 1)
    assert bad.url in str(e.value) and "\n" not in str(e.value)


def test_a_server_failing_after_its_last_bucket_leaves_without_a_hang(monkeypatch):
    """/finish_weight_update failing once every bucket went (the layers' reload): the push
    ends with that server's line instead of its sender waiting for buckets that never
    come. No server: the client's steps are stand-ins, the group a no-op."""
    import threading

    class Client:
        url = "http://127.0.0.1:9"
        pause = resume = start_weight_update = lambda self: None

        def describe(self):
            return f"vLLM server {self.url}"

        def finish_weight_update(self):
            raise ServerError(f"{self.describe()}: /finish_weight_update answered HTTP 500")

    sync = CollectiveSync(Client(), timeout=5, bucket_bytes=40)
    monkeypatch.setattr(sync, "_connect", lambda client: None)
    monkeypatch.setattr(sync, "_send_chunk", lambda client, group, chunk, *_: None)
    raised = []
    pusher = threading.Thread(target=lambda: raised.append(_raises(sync.push, _model(), 1)),
                              daemon=True)
    pusher.start()
    pusher.join(60)
    assert not pusher.is_alive(), "the push hung after a failed /finish_weight_update"
    assert isinstance(raised[0], ServerError) and "finish_weight_update" in str(raised[0])


def _raises(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - returned for the assertion
        return e
    return None


def test_a_push_holds_one_packed_bucket_and_one_whole_tensor_at_most(monkeypatch):
    """What FSDP2 ranks count on (vllm_collective.py): while a tensor is gathered, the only
    things alive beyond the shards are the bucket being packed (allocated once, filled
    tensor by tensor) and that one gathered tensor: no earlier gathered tensor, no earlier
    packed bucket (the producer's or a sender's). Gathers stand in as copies; no server."""
    import weakref

    from relax.rollout.backends.vllm import router, vllm_collective

    alive, peak = [], [0]

    def gather(tensor):
        full = tensor.detach().clone()
        alive.append(weakref.ref(full))
        held = {id(r()): r().numel() * r().element_size() for r in alive if r() is not None}
        peak[0] = max(peak[0], sum(held.values()))  # a bucket sent to two servers: once
        return full

    def sent(client, group, chunk, *_):
        alive.append(weakref.ref(chunk.data))

    class Client:
        url = "http://127.0.0.1:9"
        pause = resume = start_weight_update = finish_weight_update = lambda self: None

        def describe(self):
            return f"vLLM server {self.url}"

    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16, bias=False) for _ in range(6)])
    tensor = 16 * 16 * 4
    monkeypatch.setattr(vllm_collective, "full_tensor", gather)
    monkeypatch.setattr(router, "confirm", lambda client, version: version)
    pool = ServerPool([Client(), Client()])
    sync = CollectiveSync(pool, timeout=5, bucket_bytes=2 * tensor)  # two tensors a bucket
    monkeypatch.setattr(sync, "_connect", lambda client: None)
    monkeypatch.setattr(sync, "_send_chunk", sent)
    assert sync.push(model, 1) == 6 * tensor
    assert peak[0] == tensor


def test_a_bucket_of_one_contiguous_tensor_is_sent_from_its_own_storage():
    """No copy where none is needed: a chunk of one contiguous CPU tensor is that tensor's
    bytes; one of several tensors, or of one strided tensor, is packed into the buffer given
    (its first bytes), which unpacks to the same tensors."""
    weight = torch.randn(3, 4)
    alone = pack(["w"], [weight])
    assert alone.data.data_ptr() == weight.data_ptr() and alone.nbytes == 48
    assert alone.info == {"names": ["w"], "dtype_names": ["float32"], "shapes": [[3, 4]]}
    buffer = torch.empty(100, dtype=torch.uint8)
    for tensors in ([weight, torch.ones(2)], [weight.t()]):
        chunk = pack([f"t{i}" for i in range(len(tensors))], tensors, buffer=buffer)
        assert chunk.data.data_ptr() == buffer.data_ptr()
        unpacked = _wire().unpack(chunk.data, **chunk.info)
        assert all(torch.equal(got, want)
                   for (_, got), want in zip(unpacked, tensors, strict=True))


def _push_in_thread(sync, model, version: int, limit: float = 60.0):
    """``sync.push`` on a thread joined for at most ``limit`` s (far below the group's and the
    requests' timeout, which is what a push waiting for a peer that never comes would take):
    what it raised, or None."""
    import threading

    raised = []
    pusher = threading.Thread(target=lambda: raised.append(_raises(sync.push, model, version)),
                              daemon=True)
    pusher.start()
    pusher.join(limit)
    assert not pusher.is_alive(), "the push waited for a server that will not receive"
    return raised[0]


@pytest.mark.subprocess
def test_a_server_refusing_a_chunk_leaves_at_once_and_the_others_finish(stubs, capsys):  # noqa: F811
    """/update_weights answered with HTTP 500 before the server joins the broadcast: the
    push notices that answer while its broadcast waits, instead of waiting out the group's
    timeout (600 s here; the first bucket is larger than what the sockets buffer, so the
    broadcast cannot end without the server); that server leaves the pool in one line naming
    it, the other loads every bucket and holds the version."""
    good, bad = stubs(2, each=[(), ("--fail-update",)])
    pool = ServerPool([VllmClient(s.url, timeout=600) for s in (good, bad)])
    torch.manual_seed(0)  # a first bucket of 32 MB: more than the sockets buffer unreceived
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096, bias=False), torch.nn.Linear(4, 3))
    try:
        sync = CollectiveSync(pool, timeout=600, bucket_bytes=1 << 20)
        assert _push_in_thread(sync, model, 1) is None
        assert [m.in_pool for m in pool.members] == [True, False]
        assert pool.members[0].version == 1
        chunks = good.get("/stats")["chunks"]
        assert len(chunks) == 2
        assert sum(total for _, total in chunks) == pytest.approx(sum(_sums(model)))
        lines = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert len(lines) == 1 and bad.url in lines[0] and "/update_weights" in lines[0]
    finally:
        pool.close()


@pytest.mark.subprocess
def test_a_stale_update_session_is_finished_before_the_push(stubs):  # noqa: F811
    """A server whose update session a dead trainer began and never finished refuses a new
    /start_weight_update (vLLM 0.32's worker): the push finishes that session, starts its
    own and sends every weight; the server holds the version."""
    [stale] = stubs(1, "--stale-session")
    model = _model()
    client = VllmClient(stale.url, timeout=60)
    pool = ServerPool([client])
    try:
        assert _push_in_thread(CollectiveSync(pool, timeout=60, bucket_bytes=40),
                               model, 1) is None
        stats = stale.get("/stats")
        assert stats["steps"] == ["/start_weight_update", "/finish_weight_update",
                                  "/start_weight_update", "/finish_weight_update"]
        assert sum(total for _, total in stats["chunks"]) == pytest.approx(sum(_sums(model)))
        assert pool.members[0].in_pool and pool.members[0].version == 1
    finally:
        pool.close()


@pytest.mark.subprocess
def test_a_server_dying_as_it_joins_leaves_at_once_and_the_others_finish(stubs, capsys):  # noqa: F811
    """A server that says its worker is ready and dies before joining the group: Gloo's
    connect would wait for it the whole timeout (600 s here) and hold the other server's
    buckets; its failed init ends the wait, it leaves the pool in one line naming it, and the
    other loads every bucket and holds the version."""
    good, dying = stubs(2, each=[(), ("--die-joining",)])
    pool = ServerPool([VllmClient(s.url, timeout=600) for s in (good, dying)])
    model = _model()
    try:
        assert _push_in_thread(CollectiveSync(pool, timeout=600, bucket_bytes=40),
                               model, 1) is None
        assert [m.in_pool for m in pool.members] == [True, False]
        assert pool.members[0].version == 1
        chunks = good.get("/stats")["chunks"]
        assert sum(total for _, total in chunks) == pytest.approx(sum(_sums(model)))
        lines = [ln for ln in capsys.readouterr().err.splitlines() if "left the pool" in ln]
        assert len(lines) == 1 and dying.url in lines[0], lines
    finally:
        pool.close()
