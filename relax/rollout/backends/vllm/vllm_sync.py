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

The third transport, weights streamed from memory over vLLM's weight transfer routes and
Relax's Gloo engine (``--vllm-weight-sync collective``, the default for owned servers), is
vllm_collective.py's :class:`CollectiveSync`, with the same ``push``. Not used: vLLM's own
NCCL and CUDA IPC engines (GPUs only; nothing here can run them).
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
from relax.rollout.backends.vllm.vllm_client import ServerError
from relax.rollout.backends.vllm.vllm_weights import write_adapter, write_sharded, write_weights

__all__ = ["DiskSync", "LoraSync", "Shards", "Split", "WeightSync", "write_weights"]


class WeightSync(Protocol):
    def push(self, module: torch.nn.Module, version: int) -> int:
        """Make the server sample with ``module``'s weights, tagged ``version`` (the trainer
        steps behind them); returns the bytes written."""
        ...


@dataclass(frozen=True)
class Shards:
    """An FSDP2 model's sync: ``ctx`` (``group``, ``device``, ``is_main``) the ranks that
    shard it, ``bucket_bytes`` the most any rank gathers at once (--weight-sync-bucket-mb)."""

    ctx: object
    bucket_bytes: int

    def agree(self, error: Exception | None = None) -> None:
        """Every rank gets here before any goes on; one rank's failure is every rank's."""
        GroupAgreement(self.ctx.group, self.ctx.device).raise_together(error)


@dataclass(frozen=True)
class Split:
    """The ranks that pool the same ``--vllm-url`` servers (``ctx``: ``rank``,
    ``world_size``, ``group``, ``device``; the training ranks of a colocated run): server j
    is loaded by rank j mod their number, once per version, and every rank's pool hears
    which failed (router.py ``load``)."""

    ctx: object

    def load(self, pool, version: int, load: Callable, **kw) -> None:
        ranks, rank = self.ctx.world_size, self.ctx.rank
        pool.load(version, load, mine=lambda index: index % ranks == rank % ranks,
                  group=self.ctx.group, device=self.ctx.device, **kw)


def _load(pool, split: Split | None, version: int, load: Callable, **kw) -> None:
    if split is None:
        pool.load(version, load, **kw)
    else:
        split.load(pool, version, load, **kw)


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
    pool. ``shards``: FSDP2, rank 0 writes and the servers reload the same folder; ``split``:
    the ranks pool the same servers, each reloaded by one of them."""

    def __init__(self, target, folder: str, shards: Shards | None = None,
                 split: Split | None = None):
        self.pool, self.folder, self.shards = ServerPool.of(target), os.path.abspath(folder), shards
        self.split = split
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
            _load(self.pool, self.split, version, _reload(path))
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
    one ``client``) load it by name; ``tuner``: peft's ``LoraModel`` of the policy;
    ``split``: the ranks pool the same servers, each loaded by one of them."""

    def __init__(self, target, folder: str, tuner, split: Split | None = None):
        self.pool, self.folder, self.tuner = ServerPool.of(target), os.path.abspath(folder), tuner
        self.split = split
        self.current: str | None = None  # the folder of the adapter served now
        self.name: str | None = None

    def push(self, module: torch.nn.Module, version: int) -> int:
        path = os.path.join(self.folder, f"v{version}")
        nbytes = write_adapter(module, self.tuner, path)
        name = f"{ADAPTER_PREFIX}{version}"
        # every client of the pool names the adapter from now on, loaded here or by the rank
        # that loads its server; a server catching up may have lost the previous adapter, or
        # have this one from another rank's catch-up
        _load(self.pool, self.split, version, _adapter(name, path, self.name),
              catch_up=_catch_up(name, path),
              apply=lambda client: setattr(client, "model", name))
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


def _catch_up(name: str, path: str):
    """A server rejoining the pool (router.py): the adapter ``name`` loaded afresh."""
    def load(client) -> None:
        client.pause()
        try:
            try:
                client.unload_lora_adapter(name)
            except ServerError:
                pass  # not loaded there: the usual case
            client.load_lora_adapter(name, path)
            client.model = name
        finally:
            client.resume()
    return load
