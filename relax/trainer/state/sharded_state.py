"""Model and optimizer state through torch.distributed.checkpoint (DCP), per-rank RNG files,
and the Hugging Face export of a checkpoint.

Each rank writes only what it holds: under FSDP2 the state dicts of
``torch.distributed.checkpoint.state_dict.get_state_dict`` are DTensor shards, so no rank ever
gathers the whole model or optimizer state; under DDP every rank holds a replica and DCP's
planner spreads the writing of the replicated tensors over the ranks. DCP records every
tensor's global shape and the offsets of its chunks in ``.metadata``, so a checkpoint loads
at another world size, and with or without ``--fsdp`` (the names are the module's own,
without wrapper prefixes).

Loaded state stays data, never code (docs/reliability.md section 7): DCP itself reads
``.metadata`` with ``pickle.load`` and the non-tensor values (the optimizer's
hyper-parameters) with ``torch.load(weights_only=False)``; :class:`SafeReader` and
:class:`SafeLoadPlanner` replace both with readers that accept only the checkpoint
metadata classes and ``weights_only=True`` values.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import random
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._nested_dict import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from relax.errors import InputError
from relax.models import quiet_transformers
from relax.trainer.distributed import unwrap

METADATA = ".metadata"  # DCP writes it last, once every rank's shard is on disk

# DCP says on every single-process save and load that it assumed a single process; that is
# what Relax asks for (no_dist), so the line would only be noise in the run's output
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or "
                        "uninitialized", category=UserWarning)


def rank_file(rank: int) -> str:
    """The per-rank trainer state file (RNG states) of ``rank``."""
    return f"rank_{rank:05d}.pt"


# ---------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    """This process's RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def write_rank_file(folder: str, rank: int, collector: dict | None = None) -> None:
    """This rank's RNG states and its rollout collector's state (plain lists and numbers:
    the responses a partial rollout carries) into ``folder``, fsynced (rank 0 lists it in the
    manifest)."""
    path = os.path.join(folder, rank_file(rank))
    with open(path, "wb") as f:
        torch.save({"rng": rng_state(), "collector": collector}, f)
        f.flush()
        os.fsync(f.fileno())


def read_rank_file(folder: str, rank: int) -> tuple[dict, dict | None]:
    """(RNG states, the collector's state or None) of ``rank``."""
    path = os.path.join(folder, rank_file(rank))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        rng = state["rng"]
        if not isinstance(rng, dict) or "torch" not in rng:
            raise TypeError("no RNG states")
    except Exception as e:  # sizes were verified, so this is a foreign or incompatible file
        raise InputError(f"--load {folder}: {rank_file(rank)} is not a Relax trainer state "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from e
    collector = state.get("collector")
    return rng, collector if isinstance(collector, dict) else None


# ---------------------------------------------------------------------------- safe reading

# What DCP's .metadata pickle refers to; anything else (a function that runs a command) is
# refused before it is looked up.
_METADATA_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


_METADATA_MODULE = "torch.distributed.checkpoint.metadata"


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        # only the classes defined in DCP's metadata module: a dotted name such as "os.system"
        # would otherwise reach through that module's own imports
        if module == _METADATA_MODULE and "." not in name:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def read_metadata(folder: str):
    """DCP's ``.metadata`` of ``folder``, unpickled through the allow-list (raises what the
    unpickler raises on a corrupt or foreign file)."""
    with open(pathlib.Path(folder) / METADATA, "rb") as f:
        return _MetadataUnpickler(f).load()


def metadata_problem(folder: str) -> str | None:
    """Why the DCP checkpoint in ``folder`` cannot be read, or None: its ``.metadata`` does not
    unpickle to DCP's metadata, or points at shard bytes that are not there. Cheap (the
    metadata is small; shards are only stat'ed), so every candidate checkpoint is checked
    before one is chosen; bytes changed in place are found only by ``--checkpoint-checksums``.
    """
    try:
        metadata = read_metadata(folder)
    except Exception as e:
        return f"corrupt {METADATA} ({type(e).__name__})"
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(getattr(metadata, "state_dict_metadata", None), dict) or \
            not isinstance(storage, dict):
        return f"corrupt {METADATA} (not a checkpoint's metadata)"
    sizes: dict[str, int] = {}
    for info in storage.values():
        name = str(getattr(info, "relative_path", ""))
        if name not in sizes:
            file = pathlib.Path(folder) / name
            if "/" in name or not name or not file.is_file():
                return f"corrupt {METADATA} (it names a shard {name!r} that is not there)"
            sizes[name] = file.stat().st_size
        if int(info.offset) + int(info.length) > sizes[name]:
            return f"shard {name} is shorter than {METADATA} says"
    return None


class SafeReader(FileSystemReader):
    """DCP's file reader, with ``.metadata`` unpickled through an allow-list."""

    def read_metadata(self, *args, **kwargs):
        try:
            metadata = read_metadata(self.path)
        except Exception as e:
            raise InputError(f"--load {self.path}: cannot read {METADATA} "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from e
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rate, betas, ...) read with ``weights_only=True``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# ---------------------------------------------------------------------------- model + optimizer


def _target(model, fsdp: bool):
    # DDP's inner module holds the same parameters under the names without "module."
    return model if fsdp else unwrap(model)


def _options(trainable_only: bool) -> StateDictOptions:
    # LoRA: the frozen base weights are the --hf-checkpoint's and are not saved; loading
    # fills the adapter and leaves the base as loaded (strict=False: the base is absent)
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def sharded_state(model, optimizer, *, fsdp: bool, trainable_only: bool = False) -> dict:
    """``{"model": ..., "optim": ...}`` as this rank holds them (DTensor shards under FSDP2);
    ``trainable_only``: the parameters that train (a LoRA adapter) without the frozen ones.

    Views of the live parameters, not copies: ``dcp.save`` writes them before returning;
    ``dcp.async_save`` copies them to CPU memory first (its stager), so training may go on.
    """
    return _state(_target(model, fsdp), optimizer, trainable_only)


def _state(target, optimizer, trainable_only: bool) -> dict:
    model_sd, optim_sd = get_state_dict(target, optimizer, options=_options(trainable_only))
    if trainable_only:
        # ignore_frozen_params misses the second name of a tied weight (lm_head.weight tied
        # to the frozen embedding): keep exactly the parameters that train
        trainable = {n for n, p in target.named_parameters(remove_duplicate=False)
                     if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return {"model": model_sd, "optim": optim_sd}


def save_sharded(state: dict, folder: str, *, group, asynchronous: bool = False):
    """Write ``state`` into ``folder`` (every rank; a collective over ``group``).

    Synchronous: returns None once every rank's shard and ``.metadata`` are on disk.
    Asynchronous: returns a future that completes then; the write runs on a background
    thread, so ``group`` must be a Gloo group of its own (its collectives would otherwise
    interleave with training's).
    """
    single = not dist.is_initialized()  # else DCP warns on every save that it assumed so
    if asynchronous:
        return dcp.async_save(state, checkpoint_id=folder, process_group=group, no_dist=single)
    dcp.save(state, checkpoint_id=folder, process_group=group, no_dist=single)
    return None


def reason(e: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's ``CheckpointException`` (one per rank)."""
    if isinstance(e, CheckpointException):
        for failure in e.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                return reason(inner)
    return e


def load_sharded(folder: str, model, optimizer, *, fsdp: bool,
                 trainable_only: bool = False, group=None, key: str | None = None,
                 extra: dict | None = None) -> None:
    """Fill this rank's model and optimizer state from the DCP checkpoint in ``folder``
    (any world size it was saved at; a collective over ``group``, the training ranks, when
    distributed); ``trainable_only`` as in :func:`sharded_state`. ``key``: the state was
    saved under that key beside the policy's (the critic's, relax/trainer/terms/critic.py);
    ``extra``: more tensors saved with it, filled in place."""
    target = _target(model, fsdp)
    options = _options(trainable_only)
    state = _state(target, optimizer, trainable_only)
    wanted = {**state, **(extra or {})}
    try:
        dcp.load({key: wanted} if key else wanted, storage_reader=SafeReader(folder),
                 planner=SafeLoadPlanner(), process_group=group,
                 no_dist=not dist.is_initialized())
        set_state_dict(target, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=options)
    except (Exception, CheckpointException) as e:  # another model's checkpoint, a bad shard
        e = reason(e)
        if isinstance(e, InputError):
            raise e from None
        raise InputError(f"--load {folder}: the checkpoint does not fit this model and "
                         f"optimizer ({type(e).__name__}: {' '.join(str(e).split())[:200]})") \
            from e


def saved_shapes(folder: str, prefix: str) -> dict[str, tuple[int, ...]]:
    """The tensors the DCP checkpoint in ``folder`` holds under ``prefix`` (a flattened key
    such as ``"critic.model."``), by their name after it, with their global shapes."""
    metadata = read_metadata(folder)
    return {name[len(prefix):]: tuple(getattr(item, "size", ()))
            for name, item in metadata.state_dict_metadata.items() if name.startswith(prefix)}


def load_tensors(folder: str, tensors: dict, *, key: str, what: str) -> None:
    """Fill ``tensors`` (whole tensors, in place) from the DCP checkpoint in ``folder``, where
    they were saved under ``key``, in this process alone (every rank reads them)."""
    try:
        dcp.load({key: tensors}, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(),
                 no_dist=True)
    except (Exception, CheckpointException) as e:
        e = reason(e)
        if isinstance(e, InputError):
            raise e from None
        raise InputError(f"{what} {folder}: cannot read the weights "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from e


# ---------------------------------------------------------------------------- Hugging Face


def full_model_state(model, *, fsdp: bool, is_main: bool) -> dict | None:
    """The whole model's weights on rank 0's CPU (None elsewhere); a collective under FSDP2.

    Only the model: the optimizer state is never gathered.
    """
    if fsdp:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        return state if is_main else None
    if not is_main:
        return None
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def load_hf_model(folder: str, *, what: str = "CHECKPOINT"):
    """A causal LM built from ``folder/config.json`` with the weights of the DCP checkpoint
    in ``folder``, in one process (for ``relax export`` and ``relax eval``)."""
    quiet_transformers()  # no progress bars between the command's own lines
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as e:
        raise InputError(f"{what} {folder}: cannot build the model from its config.json "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from e
    state = {"model": model.state_dict()}
    try:
        dcp.load(state, storage_reader=SafeReader(folder), planner=SafeLoadPlanner(),
                 no_dist=True)
    except (Exception, CheckpointException) as e:
        e = reason(e)
        if isinstance(e, InputError):
            raise e from None
        raise InputError(f"{what} {folder}: cannot read the model weights "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from e
    model.load_state_dict(state["model"])
    return model
