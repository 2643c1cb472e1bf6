"""What the vLLM weight sync writes (relax/rollout/backends/vllm/vllm_sync.py): the trainer's model as a
Hugging Face safetensors directory a server reloads, whole on one rank
(:func:`write_weights`) or gathered from FSDP2 shards bucket by bucket
(:func:`write_sharded`), and a LoRA adapter in PEFT's format that a server loads by name
(:func:`write_adapter`).

Every writer fills ``path + ".tmp"`` and renames it into place, so a server never reads a
half-written directory. Tied word embeddings are written untied (both tensors,
``tie_word_embeddings`` false): vLLM 0.32's in-place reload replaces the embedding's tensor
and leaves a tied output layer on the old one (measured: log-probs 1.25 nats off after a
changed embedding), so owned servers start from such a directory, where the output layer is
a weight of its own that every reload writes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import torch

INDEX = "model.safetensors.index.json"  # Hugging Face's sharded-checkpoint index


def _fresh(path: str) -> str:
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def _place(tmp: str, path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def _save_untied_config(module: torch.nn.Module, folder: str) -> None:
    config = copy.deepcopy(module.config)
    config.tie_word_embeddings = False
    config.save_pretrained(folder)


def _distinct(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` on the CPU with each tensor in storage of its own: a tied tensor is stored
    once per name (safetensors refuses shared storage)."""
    out, seen = {}, set()
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        key = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if key in seen else tensor.contiguous()
        seen.add(key)
    return out


def write_weights(module: torch.nn.Module, path: str) -> int:
    """``module`` (a Hugging Face model, whole on this rank) as a safetensors directory at
    ``path`` (its untied config and one ``model.safetensors``); returns the safetensors
    bytes."""
    from safetensors.torch import save_file

    tmp = _fresh(path)
    _save_untied_config(module, tmp)
    with torch.no_grad():
        state = _distinct(module.state_dict())
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    _place(tmp, path)
    return os.path.getsize(os.path.join(path, "model.safetensors"))


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (a DTensor) is gathered, a collective of the group
    that shards it; a plain tensor is itself."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor.detach()


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` (bytes), at most ``bucket_bytes`` per bucket; a
    larger tensor goes alone."""
    buckets, total = [], 0
    for i, size in enumerate(sizes):
        if not buckets or total + size > bucket_bytes:
            buckets.append([])
            total = 0
        buckets[-1].append(i)
        total += size
    return buckets


def named_weights(module: torch.nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """What a server loads of ``module``, in order: its state dict's Hugging Face names and
    tensors (FSDP2 shards as they are: their global shapes say the buckets), with
    ``lm_head.weight`` added where tied embeddings left it out (servers are untied)."""
    state = module.state_dict()
    config = getattr(module, "config", None)
    if (getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in state
            and hasattr(module, "get_input_embeddings")):
        state["lm_head.weight"] = module.get_input_embeddings().weight
    return list(state), list(state.values())


def write_sharded(module: torch.nn.Module, path: str, *, is_main: bool,
                  bucket_bytes: int) -> int:
    """Every rank of an FSDP2 ``module``'s group calls this: the whole model written by
    rank 0 (``is_main``) at ``path`` as Hugging Face's sharded format, one
    ``model-0000i-of-0000n.safetensors`` per bucket of at most ``bucket_bytes`` (a larger
    tensor goes alone) and ``model.safetensors.index.json``. The buckets are cut from the
    global shapes alone, so all ranks agree on them; each tensor of a bucket is gathered
    (``DTensor.full_tensor``) on every rank, and dropped once rank 0 has written the
    bucket: no rank holds more than one bucket beyond its shard. Returns the bytes written
    (rank 0; 0 elsewhere)."""
    from safetensors.torch import save_file

    names, tensors = named_weights(module)
    buckets = plan_buckets([t.numel() * t.element_size() for t in tensors], bucket_bytes)
    tmp = _fresh(path) if is_main else None
    if is_main:
        _save_untied_config(module, tmp)
    weight_map, nbytes = {}, 0
    for i, bucket in enumerate(buckets):
        with torch.no_grad():
            part = {names[j]: full_tensor(tensors[j]) for j in bucket}
        if not is_main:
            del part
            continue
        file = f"model-{i + 1:05d}-of-{len(buckets):05d}.safetensors"
        save_file(_distinct(part), os.path.join(tmp, file), metadata={"format": "pt"})
        del part
        nbytes += os.path.getsize(os.path.join(tmp, file))
        weight_map.update(dict.fromkeys((names[j] for j in bucket), file))
    if is_main:
        with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": nbytes}, "weight_map": weight_map}, f)
        _place(tmp, path)
    return nbytes


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def write_adapter(module: torch.nn.Module, tuner, path: str) -> int:
    """The LoRA adapter of ``module`` (peft's ``LoraModel`` ``tuner`` injected it) in PEFT's
    format at ``path``: ``adapter_config.json`` and ``adapter_model.safetensors`` (keys
    ``base_model.model.<module>.lora_A.weight``), what vLLM's ``/v1/load_lora_adapter``
    reads. Returns the safetensors bytes."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    tmp = _fresh(path)
    with torch.no_grad():
        weights = get_peft_model_state_dict(module, adapter_name="default")
        save_file({f"base_model.model.{k}": v.detach().cpu().contiguous()
                   for k, v in weights.items()},
                  os.path.join(tmp, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    tuner.peft_config["default"].save_pretrained(tmp)
    _place(tmp, path)
    return os.path.getsize(os.path.join(path, ADAPTER_WEIGHTS))


def lora_rank_slot(rank: int) -> int | None:
    """The smallest ``--max-lora-rank`` vLLM 0.32 accepts that holds ``rank`` (its allowed
    values), None above them."""
    return next((r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= rank), None)
