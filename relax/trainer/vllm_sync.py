"""The trainer's weights to its vLLM server (``--rollout-backend vllm``), behind one small
interface so other transports can be added beside the one built here.

    sync = DiskSync(client, folder)
    nbytes = sync.push(module, version)   # the server samples with these weights from now

:class:`DiskSync` is prime-rl's filesystem mode: the trainer writes the model as a Hugging
Face safetensors directory, the server is paused (``/pause?mode=wait``: requests in flight
finish with the old weights, so no response mixes two versions), reloads the directory
(``/collective_rpc`` calling the model runner's ``reload_weights`` with ``weights_path``;
``load_weights`` directly is broken on the CPU build), drops its prefix cache and resumes.
It works on every machine, and across nodes where the folder is on shared storage.

Not built: vLLM's native transfer (``/init_weight_transfer_engine``, ``/update_weights``:
NCCL between GPUs or CUDA IPC on one GPU), the faster path on GPUs. It would be a second
class with the same ``push`` and its own test on GPUs with vLLM; nothing here can run it
(docs/configuration.md, "Rollout backend").
"""

from __future__ import annotations

import os
import shutil
from typing import Protocol

import torch


class WeightSync(Protocol):
    def push(self, module: torch.nn.Module, version: int) -> int:
        """Make the server sample with ``module``'s weights, tagged ``version`` (the trainer
        steps behind them); returns the bytes moved."""
        ...


class DiskSync:
    """Writes ``folder/v<version>`` and has the server reload it; the previous version's
    folder is deleted once the server holds the new one (a crash in between leaves at most
    two)."""

    def __init__(self, client, folder: str):
        self.client, self.folder = client, os.path.abspath(folder)
        self.current: str | None = None

    def push(self, module: torch.nn.Module, version: int) -> int:
        path = os.path.join(self.folder, f"v{version}")
        nbytes = write_weights(module, path)
        self.client.pause()
        try:
            self.client.reload_weights(path)
        finally:
            self.client.resume()
        if self.current and self.current != path:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = path
        return nbytes


def write_weights(module: torch.nn.Module, path: str) -> int:
    """``module`` (a Hugging Face model, whole on this rank) as a safetensors directory at
    ``path``, written beside it and renamed into place; returns the safetensors bytes."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.no_grad():
        module.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".safetensors"))
