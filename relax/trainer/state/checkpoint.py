"""Crash-safe sharded checkpoints and exact resume (docs/reliability.md).

Layout of ``--save DIR``:

- ``DIR/rollout_000010/`` ...: a checkpoint every ``--save-interval`` rollout steps, when a
  signal stops the run, and at the last step (so a finished run can be continued with a
  higher ``--num-rollout``); ``--keep-last K`` keeps the newest K of them;
- ``DIR/`` itself: the final model as a Hugging Face directory (safetensors), so
  ``--hf-checkpoint DIR`` and ``relax eval DIR`` load it. Only the model: gathered once, at
  the end, on rank 0; ``relax export`` writes the same for any checkpoint.

A checkpoint directory holds:

- the model and optimizer state written through torch.distributed.checkpoint: ``.metadata``
  and one ``__<rank>_0.distcp`` shard file per writing rank (relax/trainer/state/sharded_state.py);
- ``rank_NNNNN.pt``, one per rank: that rank's RNG states (python, numpy, torch, cuda), read
  back with ``torch.load(weights_only=True)``;
- ``config.json`` and the tokenizer files (the model the state belongs to; what ``relax
  export`` copies into a Hugging Face directory);
- ``relax_save.json``: the manifest, written last (rollout step, progress, world size, the
  run's configuration, and the byte size -- with ``--checkpoint-checksums`` also the SHA-256
  -- of every other file).

Crash safety: every rank writes into ``DIR/.tmp-<step>``; once DCP has written ``.metadata``
(it does so after every rank's shard is on disk) rank 0 writes the manifest and renames the
directory to ``rollout_NNNNNN`` in one ``rename``. A directory whose manifest is missing,
unreadable or disagrees with a file's size is never loaded: :func:`latest_checkpoint` says why
and falls back to the previous complete one. With ``--async-save`` the shards are written on a
background thread while the next rollout step runs; the rename happens only after the write
completed, so an interrupted asynchronous save is as invisible as an interrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass

import torch.distributed as dist

from relax.errors import InputError, RelaxError
from relax.rundirs import SAVE_DIR_MARKER, SAVE_MARKER
from relax.trainer.distributed import DistContext
from relax.trainer.state import sharded_state
from relax.trainer.state.sharded_state import METADATA, rank_file

MARKER = SAVE_MARKER  # the manifest (relax/rundirs.py knows it to recognise a save)
FORMAT = 3  # 2: the gathered torch.save layout of earlier Relax versions
_STEP_DIR = re.compile(r"^rollout_(\d{6,})$")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _say(message: str, prog: str = "relax train") -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)


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


def step_dir(save_dir: str, step: int) -> str:
    return os.path.join(save_dir, f"rollout_{step:06d}")


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


def _list_files(folder: str, *, checksums: bool) -> dict[str, dict]:
    """Size (and SHA-256 when asked) of every plain file of ``folder``, each fsynced.

    Sizes alone catch a truncated or missing file at the cost of a ``stat``; a checksum
    reads every byte, which at billions of parameters is minutes per save and per resume.
    """
    files = {}
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)  # "adapter/adapter_model.safetensors"
            if rel == MARKER or not os.path.isfile(path) or os.path.islink(path):
                continue
            _fsync(path)
            files[rel] = {"size": os.path.getsize(path)}
            if checksums:
                files[rel]["sha256"] = _sha256(path)
    return files


def _write_marker(folder: str, meta: dict) -> None:
    tmp = os.path.join(folder, MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "time": time.time(), **meta}, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, MARKER))


def read_manifest(path: str) -> dict:
    with open(os.path.join(path, MARKER), encoding="utf-8") as f:
        meta = json.load(f)
    if not isinstance(meta, dict):
        raise TypeError("not a JSON object")
    return meta


def verify_checkpoint(path: str, *, checksums: bool = False) -> tuple[int | None, str | None]:
    """``(rollout step, None)`` for a complete checkpoint, else ``(None, why not)``.

    The cheap check: the manifest is there (so the rename happened), DCP's ``.metadata``, a
    state file for every rank and the model config are listed, every listed file exists with
    its size, no unlisted pickle file lies beside them, and ``.metadata`` reads as DCP's
    metadata whose shard ranges exist (a corrupt one is skipped like a missing file). ``checksums`` also compares the
    SHA-256 of every file whose checksum the manifest records.
    """
    if not os.path.isfile(os.path.join(path, MARKER)):
        return None, f"no {MARKER} (an interrupted save)"
    try:
        meta = read_manifest(path)
        step = int(meta["rollout_step"])
        files = meta.get("files")
        world = int(meta.get("world_size", 0))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable {MARKER} ({type(e).__name__})"
    if meta.get("format") != FORMAT:
        return None, (f"written by another Relax version (format {meta.get('format')}); "
                      "its model can still be used with --hf-checkpoint")
    if not isinstance(files, dict):
        return None, f"{MARKER} lists no files"
    need = [METADATA, "config.json", *(rank_file(r) for r in range(world))]
    missing = [n for n in need if n not in files]
    if world < 1 or missing:
        return None, f"{MARKER} does not list {missing[0] if missing else 'a world size'}"
    # a pickled weight file the manifest does not list could be picked up by a model loader
    stray = [n for n in os.listdir(path) if n not in files and n != MARKER
             and n.endswith(_PICKLE_SUFFIXES)]
    if stray:
        return None, f"unlisted pickle file {sorted(stray)[0]}"
    for name, want in sorted(files.items()):
        if not (isinstance(name, str) and isinstance(want, dict)):
            return None, f"{MARKER} has a malformed entry for {name!r}"
        file = os.path.join(path, name)
        # names are relative paths inside the checkpoint ("adapter/..."), never outside it
        parts = name.split("/")
        if os.path.isabs(name) or ".." in parts or "" in parts or not os.path.isfile(file):
            return None, f"{name} is missing"
        if os.path.getsize(file) != want.get("size"):
            return None, f"{name} has {os.path.getsize(file)} bytes, expected {want.get('size')}"
        if checksums and "sha256" in want and _sha256(file) != want["sha256"]:
            return None, f"{name} fails its SHA-256 checksum"
    problem = sharded_state.metadata_problem(path)
    return (None, problem) if problem else (step, None)


def _candidates(load_dir: str) -> list[tuple[int, str]]:
    """(claimed step, path) of every checkpoint-like directory, newest first."""
    found = []
    for d in os.listdir(load_dir):
        m = _STEP_DIR.match(d)
        if m and os.path.isdir(os.path.join(load_dir, d)):
            found.append((int(m.group(1)), os.path.join(load_dir, d)))
    if os.path.exists(os.path.join(load_dir, MARKER)):
        try:
            meta = read_manifest(load_dir)
            kind, step = meta.get("kind"), int(meta["rollout_step"])
        except (OSError, ValueError, KeyError, TypeError):
            kind, step = None, 1 << 62  # try it first, so its rejection is reported
        if kind != "model":  # the final model of DIR is no trainer state; its step's is
            found.append((step, load_dir))
    # newest first; at equal steps --load's own directory first (it was named)
    return sorted(found, key=lambda c: (c[0], c[1] == load_dir), reverse=True)


def latest_checkpoint(load_dir: str, *, report: bool = True, checksums: bool = False,
                      prog: str = "relax train", where: str = "--load"
                      ) -> tuple[str, int] | None:
    """The newest complete checkpoint under ``--load DIR`` (or DIR itself).

    Incomplete or corrupt ones are skipped, each with one line on stderr saying why.
    ``checksums``: also compare the SHA-256 the manifests record (none without
    ``--checkpoint-checksums`` at save time: then sizes only).
    """
    for _, path in _candidates(load_dir):
        step, why = verify_checkpoint(path, checksums=checksums)
        if step is not None:
            return path, step
        if report:
            _say(f"{where}: skipping checkpoint {path}: {why}; falling back to the previous "
                 "complete one", prog)
    return None


# ---------------------------------------------------------------------------- housekeeping


def _move_aside(path: str) -> str | None:
    """Rename an existing directory out of the way (a rename, so never half deleted)."""
    if not os.path.exists(path):
        return None
    aside = f"{path}.old-{os.getpid()}-{time.monotonic_ns()}"
    os.replace(path, aside)
    return aside


def write_failure_reason(e: BaseException) -> str | None:
    """The reason when ``e`` is a failed file write (a full disk, a quota, a removed
    directory), as each writer reports it; else None. safetensors, torch.save and DCP wrap
    the OS error in their own exception types (DCP's holds one per failing rank)."""
    e = sharded_state.reason(e)
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


# ---------------------------------------------------------------------------- save


@dataclass
class _Pending:
    """A started save: its DCP future (None once written) and where it goes."""

    step: int
    tmp: str
    target: str
    meta: dict
    future: object = None


class Checkpointer:
    """Writes the checkpoints of one run (every rank holds one; rank 0 renames and prunes).

    ``async_save``: the shards are written by a background thread through a Gloo group of
    their own; :meth:`poll` (after every step) publishes a finished save, :meth:`wait` blocks
    until it is on disk (before the next save, a signal stop and the final save).
    """

    def __init__(self, save_dir: str | None, ctx: DistContext, policy, *, fsdp: bool,
                 async_save: bool = False, checksums: bool = False,
                 keep_last: int | None = None, save_interval: int | None = None,
                 rank_state=None, extra_state=None, async_group=None):
        self.save_dir, self.ctx, self.fsdp = save_dir, ctx, fsdp
        # what a checkpoint holds is the policy's to say (relax/trainer/policy/bundle.py)
        self.policy = policy
        self.async_save, self.checksums, self.keep_last = async_save, checksums, keep_last
        self.save_interval = save_interval
        self.rank_state = rank_state  # () -> this rank's collector state (rank file)
        # () -> this rank's share of another model's state saved beside the policy's (the
        # critic's, under its own key of the same DCP checkpoint)
        self.extra_state = extra_state
        # the background writes' Gloo group over ctx.group's ranks: given under --fully-async
        # (the training ranks', which every rank of the job created: split_roles), else
        # created here by every rank in the same order (new_group is collective)
        if async_group is None and save_dir and async_save and ctx.group is not None:
            async_group = dist.new_group(backend="gloo")
        self.async_group = async_group if save_dir and async_save else None
        self.pending: _Pending | None = None
        self.saved_step: int | None = None  # the newest step saved (or being saved) by this run
        self.final_step: int | None = None  # the step of the final save, once written

    @classmethod
    def of(cls, section, ctx: DistContext, policy, *, fsdp: bool, rank_state=None,
           extra_state=None, async_group=None) -> Checkpointer:
        """From the configuration's checkpoint section (relax/config/sections/checkpoint.py)."""
        return cls(section.save, ctx, policy, fsdp=fsdp, async_save=section.async_save,
                   checksums=section.checkpoint_checksums, keep_last=section.keep_last,
                   save_interval=section.save_interval, rank_state=rank_state,
                   extra_state=extra_state, async_group=async_group)

    def maybe_save(self, step: int, meta, *, last: bool) -> str | None:
        """After rollout step ``step``: the final save when ``last``, an interval checkpoint
        when ``--save-interval`` divides ``step``, else nothing; an ``--async-save`` that has
        finished is published either way. ``meta()`` gives the manifest's fields. Without
        ``--save`` nothing is written."""
        if self.save_dir is None:
            return None
        self.poll()
        if last:
            return self.finish(step, meta)
        if self.save_interval and step % self.save_interval == 0:
            return self.save(step, meta=meta())
        return None

    def finish(self, step: int, meta) -> str | None:
        """The final save of a run that ended after ``step`` (once; nothing without
        ``--save``)."""
        if self.save_dir is None or self.final_step == step:
            return None
        self.final_step = step
        return self.save_final(step, meta=meta())

    def save_for_stop(self, step: int, meta, *, new: bool) -> str:
        """A signal stop after ``step``: its checkpoint when it is ``new`` (a step this run
        trained), waited for; returns the clause the stop line ends with."""
        if self.save_dir is None:
            return ""
        if not new:
            return "; no new step to save"
        path = self.save(step, meta=meta(), blocking=True)
        return f"; checkpoint {path}; continue with --load {self.save_dir}"

    def save(self, step: int, *, meta: dict, blocking: bool = False) -> str:
        """Start the checkpoint of ``step`` (every rank calls this); return its directory.

        Returns once it is complete unless ``--async-save`` and not ``blocking``. A step saved
        (or being saved) already is only waited for: a signal after an interval save.
        """
        if step == self.saved_step:
            if blocking:
                self.wait()
            return step_dir(self.save_dir, step)
        self.wait()
        pending = _Pending(step, os.path.join(self.save_dir, f".tmp-{step}"),
                           step_dir(self.save_dir, step), meta)
        try:
            os.makedirs(pending.tmp, exist_ok=True)
            sharded_state.write_rank_file(pending.tmp, self.ctx.rank,
                                          self.rank_state() if self.rank_state else None)
            if self.ctx.is_main:
                self.policy.write_checkpoint_files(pending.tmp)
            state = self.policy.checkpoint_state()
            if self.extra_state is not None:
                state.update(self.extra_state())
            asynchronous = self.async_save and not blocking
            pending.future = sharded_state.save_sharded(
                state, pending.tmp, asynchronous=asynchronous,
                group=self.async_group if asynchronous else self.ctx.group)
        except BaseException as e:  # DCP's CheckpointException is not an Exception
            self._fail(pending, e)
        self.pending, self.saved_step = pending, step
        if pending.future is None:
            self.wait()
        return pending.target

    def poll(self) -> None:
        """Publish an asynchronous save that has finished (no collective; rank 0 renames)."""
        p = self.pending
        if p is not None and p.future is not None and p.future.done() and \
                p.future.exception() is None:
            self.wait()

    def wait(self) -> None:
        """Block until the started save is complete and, on rank 0, renamed into place."""
        p = self.pending
        if p is None:
            return
        try:
            if p.future is not None:
                p.future.result()
                p.future = None
            if self.ctx.is_main:
                self._publish(p)
        except BaseException as e:
            self._fail(p, e)
        self.pending = None
        if self.ctx.group is not None and self.async_group is None:
            # a synchronous save returns on every rank once the checkpoint is in place
            dist.barrier(group=self.ctx.group)

    def _publish(self, p: _Pending) -> None:
        files = _list_files(p.tmp, checksums=self.checksums)
        _write_marker(p.tmp, {"kind": "checkpoint", "rollout_step": p.step,
                              "world_size": self.ctx.world_size, "fsdp": self.fsdp,
                              "files": files, **p.meta})
        _fsync(p.tmp)
        aside = _move_aside(p.target)  # the same step saved again after a resume
        os.replace(p.tmp, p.target)
        _fsync(self.save_dir)
        if aside:
            shutil.rmtree(aside, ignore_errors=True)
        if self.keep_last:
            prune(self.save_dir, self.keep_last, newest=p.step)

    def _fail(self, p: _Pending, e: BaseException):
        """A failed write becomes one line naming the last complete checkpoint."""
        self.pending = None
        reason = write_failure_reason(e)
        if reason is None:
            raise e
        if self.ctx.is_main:
            shutil.rmtree(p.tmp, ignore_errors=True)
        last = latest_checkpoint(self.save_dir, report=False)
        kept = (f"the last complete checkpoint is {last[0]} (step {last[1]}); free space and "
                f"continue with --load {self.save_dir}" if last else
                "no complete checkpoint was written")
        raise RelaxError(f"--save {self.save_dir}: writing the checkpoint of rollout step "
                         f"{p.step} failed ({reason}); {kept}") from e

    def save_final(self, step: int, *, meta: dict) -> str:
        """The checkpoint of the last step (unless saved already), then the final model as a
        Hugging Face directory in ``DIR`` itself, gathered on rank 0 only."""
        if self.saved_step != step:
            self.save(step, meta=meta, blocking=True)
        self.wait()
        weights = self.policy.weights()
        if self.ctx.is_main:
            tmp = os.path.join(self.save_dir, f".tmp-final-{os.getpid()}")
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                os.makedirs(tmp)
                self.policy.write_model(tmp, weights)
                files = _list_files(tmp, checksums=self.checksums)
                # DIR also holds the checkpoints, so the files move in one by one: the old
                # manifest goes first and the new one comes last, so a crash in between leaves
                # DIR without a manifest, never a mix that looks complete
                old_marker = os.path.join(self.save_dir, MARKER)
                if os.path.exists(old_marker):
                    _say(f"replacing the earlier Relax save in {self.save_dir}")
                    os.remove(old_marker)
                for name in os.listdir(tmp):
                    target = os.path.join(self.save_dir, name)
                    if os.path.isdir(target) and not os.path.islink(target):
                        shutil.rmtree(target)  # an earlier final save's adapter/
                    os.replace(os.path.join(tmp, name), target)
                os.rmdir(tmp)
                _write_marker(self.save_dir, {"kind": "model", "rollout_step": step,
                                              "files": files, **meta})
            except Exception as e:
                self._fail(_Pending(step, tmp, self.save_dir, meta), e)
        if self.ctx.group is not None:
            dist.barrier(group=self.ctx.group)
        return self.save_dir
