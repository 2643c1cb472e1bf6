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

import copy
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
    ``path`` (its config and one ``model.safetensors``), written beside it and renamed into
    place; returns the safetensors bytes.

    Tied word embeddings are written untied (both tensors, ``tie_word_embeddings`` false):
    vLLM 0.32's in-place reload replaces the embedding's tensor and leaves a tied output
    layer on the old one (measured: log-probs 1.25 nats off after a changed embedding), so
    owned servers are started from such a directory, where the output layer is a weight of
    its own that every reload writes."""
    from safetensors.torch import save_file

    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    config = copy.deepcopy(module.config)
    config.tie_word_embeddings = False
    config.save_pretrained(tmp)
    state, seen = {}, set()
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            key = tensor.untyped_storage().data_ptr()
            # a tied tensor is stored once per name (safetensors refuses shared storage)
            state[name] = tensor.detach().clone() if key in seen else tensor.detach().contiguous()
            seen.add(key)
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return os.path.getsize(os.path.join(path, "model.safetensors"))
