"""The trainer's weights to its vLLM server (``--rollout-backend vllm``), behind one small
interface so other transports can be added beside the ones built here.

    sync = DiskSync(client, folder)            # or LoraSync(client, folder, tuner)
    nbytes = sync.push(module, version)        # the server samples with these weights from now

:class:`DiskSync` is prime-rl's filesystem mode: the trainer writes the model as a Hugging
Face safetensors directory (relax/rollout/backends/vllm/vllm_weights.py), the server is paused
(``/pause?mode=wait``: requests in flight finish with the old weights, so no response mixes
two versions), reloads the directory (``/collective_rpc`` calling the model runner's
``reload_weights`` with ``weights_path``; ``load_weights`` directly is broken on the CPU
build), drops its prefix cache and resumes. It works on every machine, and across nodes
where the folder is on shared storage. Under FSDP2 (:class:`Shards`) every rank gathers the
model bucket by bucket, rank 0 writes it into one folder all ranks share, and each rank's
server reloads that folder once the write is complete.

:class:`LoraSync` (``--lora-rank``): the base weights never change, so only the adapter is
written (PEFT's format, a few MiB) and loaded under a new name per version
(``/v1/load_lora_adapter``; the server runs with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); requests name that adapter as their model from
then on, and the previous version's name is unloaded. A new name per version rather than
``load_inplace``: vLLM 0.32 keeps ``load_inplace`` on the stored request and would reload
the adapter from disk at every engine step, and a new name gets a new adapter id, so no
prefix-cache entry of the old adapter is reused.

Not built: vLLM's native transfer (``/init_weight_transfer_engine``, ``/update_weights``:
NCCL between GPUs or CUDA IPC on one GPU), the faster path on GPUs. It would be a third
class with the same ``push`` and its own test on GPUs with vLLM; nothing here can run it
(docs/configuration.md, "Rollout backend").
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Protocol

import torch

from relax.agreement import GroupAgreement
from relax.rollout.backends.vllm.vllm_weights import write_adapter, write_sharded, write_weights

__all__ = ["DiskSync", "LoraSync", "Shards", "WeightSync", "write_weights"]


class WeightSync(Protocol):
    def push(self, module: torch.nn.Module, version: int) -> int:
        """Make the server sample with ``module``'s weights, tagged ``version`` (the trainer
        steps behind them); returns the bytes written."""
        ...


@dataclass(frozen=True)
class Shards:
    """An FSDP2 model's sync: ``ctx`` (``group``, ``device``, ``is_main``) the ranks that
    shard it, ``bucket_bytes`` the most any rank gathers at once (--weight-sync-bucket-mb),
    ``reloads`` whether this rank's server reloads (one rank per distinct server)."""

    ctx: object
    bucket_bytes: int
    reloads: bool = True

    def agree(self, error: Exception | None = None) -> None:
        """Every rank gets here before any goes on; one rank's failure is every rank's."""
        GroupAgreement(self.ctx.group, self.ctx.device).raise_together(error)


class DiskSync:
    """Writes ``folder/v<version>`` and has the server reload it; the previous version's
    folder is deleted once the server holds the new one (a crash in between leaves at most
    two). ``shards``: FSDP2, rank 0 writes and every server reloads the same folder."""

    def __init__(self, client, folder: str, shards: Shards | None = None):
        self.client, self.folder, self.shards = client, os.path.abspath(folder), shards
        self.current: str | None = None

    def write(self, module: torch.nn.Module, path: str) -> int:
        """``module``'s weights at ``path`` (under FSDP2 a collective; written by rank 0,
        complete on every rank's return)."""
        if self.shards is None:
            return write_weights(module, path)
        error, nbytes = None, 0
        try:
            nbytes = write_sharded(module, path, is_main=self.shards.ctx.is_main,
                                   bucket_bytes=self.shards.bucket_bytes)
        except Exception as e:  # rank 0's disk: the others must not wait in the next step
            error = e
        self.shards.agree(error)
        return nbytes

    def push(self, module: torch.nn.Module, version: int) -> int:
        path = os.path.join(self.folder, f"v{version}")
        nbytes = self.write(module, path)
        error = None
        try:
            if self.shards is None or self.shards.reloads:
                self.client.pause()
                try:
                    self.client.reload_weights(path)
                finally:
                    self.client.resume()
        except Exception as e:
            error = e
        if self.shards is not None:  # every server holds the new folder before the old goes
            self.shards.agree(error)
        elif error is not None:
            raise error
        if (self.shards is None or self.shards.ctx.is_main) and self.current not in (None, path):
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = path
        return nbytes


ADAPTER_PREFIX = "relax-lora-v"  # the served adapter's name: this plus the version


class LoraSync:
    """Writes the adapter at ``folder/v<version>`` and loads it by name; ``tuner``: peft's
    ``LoraModel`` of the policy."""

    def __init__(self, client, folder: str, tuner):
        self.client, self.folder, self.tuner = client, os.path.abspath(folder), tuner
        self.current: str | None = None  # the folder of the adapter served now
        self.name: str | None = None

    def push(self, module: torch.nn.Module, version: int) -> int:
        path = os.path.join(self.folder, f"v{version}")
        nbytes = write_adapter(module, self.tuner, path)
        name = f"{ADAPTER_PREFIX}{version}"
        self.client.pause()
        try:
            if self.name == name:  # the same version again (a resume at it): a fresh load
                self.client.unload_lora_adapter(name)
                self.name = None
            self.client.load_lora_adapter(name, path)
            previous, self.client.model, self.name = self.name, name, name
            if previous not in (None, name):
                self.client.unload_lora_adapter(previous)
        finally:
            self.client.resume()
        if self.current not in (None, path):
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = path
        return nbytes
