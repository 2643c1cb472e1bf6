"""The trainer's weights to its vLLM server (``--rollout-backend vllm``), behind one small
interface so other transports can be added beside the ones built here.

    sync = DiskSync(pool, folder)              # or LoraSync(pool, folder, tuner); or one client
    nbytes = sync.push(module, version)        # the servers sample with these weights from now

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from relax.agreement import GroupAgreement
from relax.rollout.backends.vllm.router import ServerPool
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
    ``mine(index)`` whether this rank reloads the pool's server of that --vllm-url entry (None:
    every server of its pool; the ranks share the servers, each reloaded once)."""

    ctx: object
    bucket_bytes: int
    mine: Callable[[int], bool] | None = None

    def agree(self, error: Exception | None = None) -> None:
        """Every rank gets here before any goes on; one rank's failure is every rank's."""
        GroupAgreement(self.ctx.group, self.ctx.device).raise_together(error)


def _reload(path: str):
    """What one server does to take the weights of ``path``: paused around the reload."""
    def reload(client) -> None:
        client.pause()
        try:
            client.reload_weights(path)
        finally:
            client.resume()
    return reload


class DiskSync:
    """Writes ``folder/v<version>`` and has every server of the pool (router.py; or the one
    ``client``) reload it; the previous version's folder is deleted once the servers hold the
    new one (a crash in between leaves at most two). A server that fails the reload leaves the
    pool. ``shards``: FSDP2, rank 0 writes and the servers reload the same folder."""

    def __init__(self, target, folder: str, shards: Shards | None = None):
        self.pool, self.folder, self.shards = ServerPool.of(target), os.path.abspath(folder), shards
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
            if self.shards is None:
                self.pool.load(version, _reload(path))
            else:  # --vllm-url (``mine``): every rank pools the same servers, agreeing on
                # which failed; an owned server is its rank's alone
                shared = self.shards.mine is not None
                self.pool.load(version, _reload(path), mine=self.shards.mine,
                               group=self.shards.ctx.group if shared else None,
                               device=self.shards.ctx.device)
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
    """Writes the adapter at ``folder/v<version>`` and has every server of the pool (or the
    one ``client``) load it by name; ``tuner``: peft's ``LoraModel`` of the policy."""

    def __init__(self, target, folder: str, tuner):
        self.pool, self.folder, self.tuner = ServerPool.of(target), os.path.abspath(folder), tuner
        self.current: str | None = None  # the folder of the adapter served now
        self.name: str | None = None

    def push(self, module: torch.nn.Module, version: int) -> int:
        path = os.path.join(self.folder, f"v{version}")
        nbytes = write_adapter(module, self.tuner, path)
        name = f"{ADAPTER_PREFIX}{version}"
        # a server catching up may have restarted without the previous adapter
        self.pool.load(version, _adapter(name, path, self.name),
                       catch_up=_adapter(name, path, None))
        self.name = name
        if self.current not in (None, path):
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = path
        return nbytes


def _adapter(name: str, path: str, previous: str | None):
    """What one server does to serve the adapter ``path`` as ``name``, ``previous`` (the name
    it served) unloaded; a server catching up (router.py) runs it too."""
    def load(client) -> None:
        client.pause()
        try:
            if previous == name:  # the same version again (a resume at it): a fresh load
                client.unload_lora_adapter(name)
            client.load_lora_adapter(name, path)
            client.model = name  # requests name the adapter from now on
            if previous not in (None, name):
                client.unload_lora_adapter(previous)
        finally:
            client.resume()
    return load
