"""Crash-safe checkpoints and exact resume (docs/reliability.md).

Layout of ``--save DIR``:

- ``DIR/rollout_000010/`` ...: a checkpoint every ``--save-interval`` rollout steps (and when a
  signal stops the run); ``--keep-last K`` keeps the newest K of them;
- ``DIR/`` itself: the final model, so ``--hf-checkpoint DIR`` and ``relax eval DIR`` load it.

Each checkpoint holds:

- the model as a Hugging Face directory (``config.json``, ``model.safetensors``; weights are
  only ever read from safetensors) and the tokenizer files;
- ``trainer_state.pt``: optimizer state, the RNG states of every rank (python, numpy, torch,
  cuda) and the progress (rollout step, data epoch and position, metrics cursor) -- only
  tensors, numbers, strings and lists, read back with ``torch.load(weights_only=True)``;
- ``relax_save.json``: the manifest (rollout step, progress, size and SHA-256 of every file).

Crash safety: an interval checkpoint is written into ``DIR/.tmp-*``, its files fsynced, the
manifest written last, and the directory renamed into place in one ``rename``. A directory
whose manifest is missing, unreadable or disagrees with a file (size or checksum) is never
loaded: :func:`latest_checkpoint` says why and falls back to the previous complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
import time

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from relax.errors import InputError
from relax.rundirs import SAVE_DIR_MARKER, SAVE_MARKER
from relax.trainer.distributed import DistContext, unwrap

MARKER = SAVE_MARKER  # the manifest (relax/rundirs.py knows it to recognise a save)
STATE = "trainer_state.pt"
FORMAT = 2
_STEP_DIR = re.compile(r"^rollout_(\d{6,})$")
# a resumed model is read from these only (never a pickled *.bin / *.pt weight file)
_SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def _say(message: str) -> None:
    print(f"relax train: {message}", file=sys.stderr, flush=True)


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
    if os.path.isfile(os.path.join(path, MARKER)) or os.path.isfile(
            os.path.join(path, SAVE_DIR_MARKER)):
        return True
    return any(_STEP_DIR.match(d) and os.path.isfile(os.path.join(path, d, MARKER))
               for d in os.listdir(path))


# ---------------------------------------------------------------------------- state


def _state_dicts(model, optimizer, fsdp: bool):
    """Full (unsharded) model and optimizer state dicts on the CPU; a collective under FSDP."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if fsdp:
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(
            model, optimizer, options=opts
        )
    inner = unwrap(model)
    return {k: v.detach().cpu() for k, v in inner.state_dict().items()}, (
        get_optimizer_state_dict(inner, optimizer, options=opts)
    )


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


def _gather_rng(ctx: DistContext) -> list[dict]:
    """Every rank's RNG states, in rank order (a collective when distributed)."""
    mine = rng_state()
    if ctx.group is None:
        return [mine]
    out = [None] * ctx.world_size
    torch.distributed.all_gather_object(out, mine, group=ctx.group)
    return out


# ---------------------------------------------------------------------------- manifest


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(folder: str) -> dict[str, dict]:
    """Size and SHA-256 of every plain file of ``folder`` (not subdirectories), fsynced."""
    files = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name == MARKER or not os.path.isfile(path):
            continue
        _fsync(path)
        files[name] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
    return files


def _write_marker(folder: str, step: int, files: dict, progress: dict, extra: dict) -> None:
    tmp = os.path.join(folder, MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "rollout_step": step, "time": time.time(),
                   "progress": progress, "files": files, **extra}, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, MARKER))


def verify_checkpoint(path: str) -> tuple[int | None, str | None]:
    """``(rollout step, None)`` for a complete checkpoint, else ``(None, why not)``."""
    marker = os.path.join(path, MARKER)
    if not os.path.isfile(marker):
        return None, f"no {MARKER} (an interrupted save)"
    try:
        with open(marker, encoding="utf-8") as f:
            meta = json.load(f)
        step = int(meta["rollout_step"])
        files = meta.get("files")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable {MARKER} ({type(e).__name__})"
    if not isinstance(files, dict):
        return None, f"{MARKER} lists no files (written by an older Relax?)"
    if STATE not in files or not any(w in files for w in _SAFE_WEIGHTS):
        return None, f"{MARKER} lists no {STATE} or safetensors weights"
    # a pickled weight file the manifest does not list could be picked up by a model loader
    stray = [n for n in os.listdir(path) if n not in files and n != MARKER
             and n.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))]
    if stray:
        return None, f"unlisted pickle file {sorted(stray)[0]} (only safetensors weights load)"
    for name, want in sorted(files.items()):
        if not (isinstance(name, str) and isinstance(want, dict)):
            return None, f"{MARKER} has a malformed entry for {name!r}"
        file = os.path.join(path, name)
        if os.path.basename(name) != name or not os.path.isfile(file):
            return None, f"{name} is missing"
        if os.path.getsize(file) != want.get("size"):
            return None, f"{name} has {os.path.getsize(file)} bytes, expected {want.get('size')}"
        if _sha256(file) != want.get("sha256"):
            return None, f"{name} fails its SHA-256 checksum"
    return step, None


def _candidates(load_dir: str) -> list[tuple[int, str]]:
    """(claimed step, path) of every checkpoint-like directory, newest first."""
    found = []
    for d in os.listdir(load_dir):
        m = _STEP_DIR.match(d)
        if m and os.path.isdir(os.path.join(load_dir, d)):
            found.append((int(m.group(1)), os.path.join(load_dir, d)))
    if any(os.path.exists(os.path.join(load_dir, f)) for f in (MARKER, STATE)):
        try:
            with open(os.path.join(load_dir, MARKER), encoding="utf-8") as f:
                step = int(json.load(f)["rollout_step"])
        except (OSError, ValueError, KeyError, TypeError):
            step = 1 << 62  # try it first, so its rejection is reported
        found.append((step, load_dir))
    # newest first; at equal steps the final save in DIR itself before rollout_N
    return sorted(found, key=lambda c: (c[0], c[1] == load_dir), reverse=True)


def latest_checkpoint(load_dir: str, *, report: bool = True) -> tuple[str, int] | None:
    """The newest complete checkpoint under ``--load DIR`` (or DIR itself).

    Incomplete or corrupt ones are skipped, each with one line on stderr saying why.
    """
    for _, path in _candidates(load_dir):
        step, why = verify_checkpoint(path)
        if step is not None:
            return path, step
        if report:
            _say(f"--load: skipping checkpoint {path}: {why}; falling back to the previous "
                 "complete one")
    return None


# ---------------------------------------------------------------------------- save / load


def _move_aside(path: str) -> str | None:
    """Rename an existing directory out of the way (a rename, so never half deleted)."""
    if not os.path.exists(path):
        return None
    aside = f"{path}.old-{os.getpid()}-{time.monotonic_ns()}"
    os.replace(path, aside)
    return aside


def is_write_failure(e: BaseException) -> str | None:
    """The reason when ``e`` is a failed file write (a full disk, a quota, a removed
    directory), as each writer reports it; else None. safetensors and torch.save wrap the
    OS error in their own exception types."""
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    text = " ".join(str(e).split())
    if type(e).__name__ == "SafetensorError" and "I/O error" in text:
        return text.split("I/O error: ", 1)[-1][:120]
    if isinstance(e, RuntimeError) and ("file write failed" in text or "inline_container" in text):
        return "file write failed"
    return None


def remove_stale_temps(save_dir: str | None) -> None:
    """Drop ``.tmp-*`` directories a killed run left behind (never loaded anyway)."""
    if save_dir and os.path.isdir(save_dir):
        for d in os.listdir(save_dir):
            if d.startswith(".tmp-") or ".old-" in d:
                shutil.rmtree(os.path.join(save_dir, d), ignore_errors=True)


def save_checkpoint(save_dir: str, *, model, optimizer, tokenizer, step: int, ctx: DistContext,
                    fsdp: bool, final: bool, progress: dict | None = None,
                    extra: dict | None = None, keep_last: int | None = None) -> str:
    """Write the checkpoint of ``step`` (every rank calls this; rank 0 writes)."""
    extra, progress = extra or {}, progress or {}
    model_sd, optim_sd = _state_dicts(model, optimizer, fsdp)
    rng = _gather_rng(ctx)
    target = save_dir if final else os.path.join(save_dir, f"rollout_{step:06d}")
    if ctx.is_main:
        os.makedirs(save_dir, exist_ok=True)
        tmp = os.path.join(save_dir, f".tmp-{'final' if final else step}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        unwrap(model).save_pretrained(tmp, state_dict=model_sd, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save({"optimizer": optim_sd, "rng": rng, "progress": progress},
                   os.path.join(tmp, STATE))
        files = _manifest(tmp)
        if final:
            # DIR also holds the interval checkpoints, so its files move in one by one: the
            # old manifest goes first and the new one comes last, so a crash in between
            # leaves DIR without a manifest (skipped), never a mix that looks complete.
            old_marker = os.path.join(save_dir, MARKER)
            if os.path.exists(old_marker):
                _say(f"replacing the earlier Relax save in {save_dir}")
                os.remove(old_marker)
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(save_dir, name))
            os.rmdir(tmp)
            _write_marker(save_dir, step, files, progress, extra)
        else:
            _write_marker(tmp, step, files, progress, extra)
            _fsync(tmp)
            aside = _move_aside(target)  # the same step saved again after a resume
            os.replace(tmp, target)
            _fsync(save_dir)
            if aside:
                shutil.rmtree(aside, ignore_errors=True)
            if keep_last:
                prune(save_dir, keep_last, newest=step)
    if ctx.group is not None:
        torch.distributed.barrier(group=ctx.group)
    return target


def prune(save_dir: str, keep_last: int, *, newest: int) -> list[str]:
    """Delete interval checkpoints older than the ``keep_last`` newest up to step ``newest``.

    Directories of later steps (left by an interrupted run that got further) stay: the run
    replaces them when it gets there, and a verified one may be all a later resume has.
    """
    steps = sorted(
        (int(m.group(1)), d) for d in os.listdir(save_dir)
        if (m := _STEP_DIR.match(d)) and int(m.group(1)) <= newest
    )
    removed = []
    for _, d in steps[: max(0, len(steps) - keep_last)]:
        path = os.path.join(save_dir, d)
        marker = os.path.join(path, MARKER)
        if os.path.exists(marker):
            os.remove(marker)  # first, so a half-deleted directory never looks complete
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def load_trainer_state(path: str, model, optimizer, *, fsdp: bool, ctx: DistContext) -> dict:
    """Restore the optimizer state and this rank's RNG states; return the saved progress."""
    try:
        state = torch.load(os.path.join(path, STATE), map_location="cpu", weights_only=True)
    except Exception as e:  # verified above, so this is an incompatible or foreign file
        raise InputError(f"--load {path}: cannot read {STATE}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from e
    target = model if fsdp else unwrap(model)
    try:
        set_optimizer_state_dict(
            target, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=fsdp)
        )
        rng = state["rng"]
        if not isinstance(rng, list) or not rng:
            raise TypeError("no RNG states")
    except Exception as e:  # loaded, but not the state of this model's optimizer
        raise InputError(f"--load {path}: {STATE} is not a Relax trainer state for this model "
                         f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from e
    if len(rng) != ctx.world_size and ctx.is_main:
        _say(f"--load {path}: saved with {len(rng)} ranks, resuming with {ctx.world_size}; "
             "RNG states are reused by rank modulo")
    set_rng_state(rng[ctx.rank % len(rng)])
    return dict(state.get("progress") or {})
