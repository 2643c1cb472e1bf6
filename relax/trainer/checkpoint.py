"""Saving and resuming (kept simple and correct; the reliability issue hardens it).

Layout of ``--save DIR``:

- ``DIR/`` itself: the final model as a Hugging Face directory (``config.json``,
  ``model.safetensors``, tokenizer files) -- load it with ``--hf-checkpoint DIR`` -- plus
  ``trainer_state.pt`` and the marker ``relax_save.json``;
- ``DIR/rollout_000010/`` ...: the same content every ``--save-interval`` rollout steps.

``trainer_state.pt`` holds the optimizer state and RNG states (only tensors, numbers and
strings: read back with ``torch.load(weights_only=True)``); ``relax_save.json`` holds the rollout
step and is written last, so its presence marks a complete save. A checkpoint directory is
written under a temporary name and renamed into place. ``DIR`` must be empty, absent or an
earlier Relax save: anything else is refused before training starts.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time

import torch

from relax.trainer.distributed import DistContext, unwrap
from relax.trainer.errors import InputError

MARKER = "relax_save.json"
STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^rollout_(\d{6,})$")


def check_save_dir(path: str | None) -> None:
    """Refuse a ``--save`` directory that holds something other than a Relax save."""
    if path is None or not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise InputError(f"--save {path}: exists and is not a directory")
    if os.listdir(path) and not _is_relax_save(path):
        raise InputError(
            f"--save {path}: the directory is not empty and holds no Relax save "
            f"({MARKER} missing); choose an empty or new directory"
        )


def _is_relax_save(path: str) -> bool:
    """A final save, or a run that only got as far as its interval checkpoints."""
    if os.path.isfile(os.path.join(path, MARKER)):
        return True
    return any(_STEP_DIR.match(d) and os.path.isfile(os.path.join(path, d, MARKER))
               for d in os.listdir(path))


def _state_dicts(model, optimizer, fsdp: bool):
    """Full (unsharded) model and optimizer state dicts on the CPU; a collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    if fsdp:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(
            model, optimizer, options=opts
        )
    inner = unwrap(model)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.detach().cpu() for k, v in inner.state_dict().items()}, (
        get_optimizer_state_dict(inner, optimizer, options=opts)
    )


def _rng_state() -> dict:
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _write_checkpoint(tmp: str, *, model, tokenizer, model_sd, optim_sd, step: int, extra: dict):
    os.makedirs(tmp)
    unwrap(model).save_pretrained(tmp, state_dict=model_sd)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optim_sd, "rng": _rng_state()}, os.path.join(tmp, STATE))


def _write_marker(path: str, step: int, extra: dict) -> None:
    tmp = os.path.join(path, MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": 1, "rollout_step": step, "time": time.time(), **extra}, f, indent=2)
    os.replace(tmp, os.path.join(path, MARKER))


def save_checkpoint(save_dir: str, *, model, optimizer, tokenizer, step: int, ctx: DistContext,
                    fsdp: bool, final: bool, extra: dict | None = None) -> str:
    """Write the checkpoint of ``step`` (all ranks call this; rank 0 writes)."""
    extra = extra or {}
    model_sd, optim_sd = _state_dicts(model, optimizer, fsdp)
    target = save_dir if final else os.path.join(save_dir, f"rollout_{step:06d}")
    if ctx.is_main:
        os.makedirs(save_dir, exist_ok=True)
        tmp = os.path.join(save_dir, f".tmp-{'final' if final else step}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        _write_checkpoint(tmp, model=model, tokenizer=tokenizer, model_sd=model_sd,
                          optim_sd=optim_sd, step=step, extra=extra)
        if final:
            # DIR also holds the interval checkpoints, so move the files in one by one; the
            # old marker goes first, the new one last, so a crash never marks mixed files
            # as a complete save.
            old_marker = os.path.join(save_dir, MARKER)
            if os.path.exists(old_marker):
                print(f"relax train: replacing the earlier Relax save in {save_dir}",
                      file=sys.stderr)
                os.remove(old_marker)
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(save_dir, name))
            os.rmdir(tmp)
        else:
            if os.path.exists(target):
                shutil.rmtree(target)
            os.replace(tmp, target)
        _write_marker(target, step, extra)
    if ctx.group is not None:
        torch.distributed.barrier(group=ctx.group)
    return target


def latest_checkpoint(load_dir: str) -> tuple[str, int] | None:
    """The complete checkpoint with the highest rollout step under ``--load DIR`` (or DIR)."""
    candidates = []
    for path in [load_dir] + [
        os.path.join(load_dir, d) for d in os.listdir(load_dir) if _STEP_DIR.match(d)
    ]:
        marker = os.path.join(path, MARKER)
        if os.path.isfile(marker) and os.path.isfile(os.path.join(path, STATE)):
            with open(marker, encoding="utf-8") as f:
                candidates.append((int(json.load(f)["rollout_step"]), path))
    if not candidates:
        return None
    step, path = max(candidates)
    return path, step


def load_trainer_state(path: str, model, optimizer, *, fsdp: bool) -> None:
    """Restore the optimizer state and RNG states of a checkpoint (weights load separately)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = torch.load(os.path.join(path, STATE), map_location="cpu", weights_only=True)
    target = model if fsdp else unwrap(model)
    set_optimizer_state_dict(
        target, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=fsdp)
    )
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
