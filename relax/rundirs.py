"""The directories a run writes: claimed before any work, locked for the run's lifetime.

``relax train`` writes into ``--output-dir`` (config.json, metrics.jsonl, samples.jsonl,
TensorBoard), ``--save`` (checkpoints) and ``--critic-save`` (critic.pt): every field declared
with ``option(writes=KIND)`` (relax/config/section.py ``written_dirs``); ``relax eval
--output-dir`` writes eval_metrics.json. Before anything is written, :func:`claim_train_dirs` /
:func:`claim_eval_dir` check (docs/reliability.md, "Hostile conditions"):

- each directory is new, empty, or already marked as Relax's own of the same kind
  (``relax_run.json`` in an output directory, ``relax_save_dir.json`` or a checkpoint manifest
  in a save directory, ``relax_critic_dir.json`` in a critic directory); anything else -- a
  model directory, a home directory, a data folder, another program's critic.pt -- is
  refused, so a run never overwrites a file it did not write;
- the directories written differ from each other and from the model directories;
- a fresh run (no ``--load``) does not continue another run's directory: a save directory
  holding checkpoints or an output directory holding metrics.jsonl is refused with how to
  continue it (``--load``) or start clean;
- each directory is creatable and writable (a probe file is written and removed);
- one run per directory: an exclusive ``flock`` on ``DIR/.relax.lock``, held until the process
  ends (the kernel releases it on any exit, SIGKILL included, so a crashed run never leaves a
  stale lock); the second run is refused with the holder's PID, host and start time. A Relax
  directory that already has its lock file is locked first, before the checks above: while
  a run holds it, what it holds is that run's (its metrics.jsonl is not an earlier run's),
  so "in use" is the answer, whatever that run has written so far.

Only rank 0 claims (all ranks share the directories). Nothing here imports torch.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import time

from relax.errors import InputError

OUTPUT_MARKER = "relax_run.json"
SAVE_DIR_MARKER = "relax_save_dir.json"
SAVE_MARKER = "relax_save.json"  # a checkpoint's manifest, written by relax/trainer/state/checkpoint.py
CRITIC_MARKER = "relax_critic_dir.json"
# kind (``option(writes=...)``) -> (the markers that make a directory Relax's own of that
# kind, the first one written by a claim; what such directories are called)
KINDS = {"output": ((OUTPUT_MARKER,), "run output directories"),
         "save": ((SAVE_DIR_MARKER, SAVE_MARKER), "save directories"),
         "critic": ((CRITIC_MARKER,), "critic directories")}
LOCK = ".relax.lock"
_HELD: list[int] = []  # lock file descriptors, open until the process exits


def _real(path: str | None) -> str | None:
    return None if path is None else os.path.realpath(path)


def _ours(path: str, markers: tuple[str, ...]) -> bool:
    return any(os.path.isfile(os.path.join(path, m)) for m in markers) or (
        OUTPUT_MARKER in markers and _earlier_relax_run(path))


def _earlier_relax_run(path: str) -> bool:
    """An output directory written before the marker existed: metrics.jsonl next to a
    config.json that is a Relax configuration (not a model's)."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    # by section (``algorithm``), or flat as written before sections
    return (isinstance(config, dict) and ("advantage_estimator" in config or "algorithm" in config)
            and os.path.isfile(os.path.join(path, "metrics.jsonl")))


def _has_checkpoints(path: str) -> bool:
    if os.path.isfile(os.path.join(path, SAVE_MARKER)):
        return True
    return any(d.startswith("rollout_") and os.path.isfile(os.path.join(path, d, SAVE_MARKER))
               for d in os.listdir(path))


def _check_kind(path: str, flag: str, markers: tuple[str, ...], what: str) -> None:
    """``path`` is absent, an empty directory, or marked as Relax's ``what``."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise InputError(f"{flag} {path}: exists and is not a directory; choose another path")
    try:
        entries = [e for e in os.listdir(path) if e != LOCK]
    except PermissionError:
        raise InputError(f"{flag} {path}: cannot list the directory (permission denied)") \
            from None
    if entries and not _ours(path, markers):
        example = sorted(entries)[0]
        raise InputError(f"{flag} {path}: the directory holds files Relax did not write (e.g. "
                         f"{example!r}) and no {markers[0]}; Relax only writes into a new or "
                         f"empty directory or one of its own {what}; choose another path")


def _make_writable(path: str, flag: str) -> None:
    """Create ``path`` (and parents) and prove it writable with a probe file."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".relax-probe-{os.getpid()}")
        with open(probe, "w", encoding="utf-8") as f:
            f.write("probe")
        os.remove(probe)
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else type(e).__name__
        if e.errno == errno.ENOSPC:
            reason = "no space left on the device"
        raise InputError(f"{flag} {path}: cannot write there ({reason}); choose a writable "
                         "directory") from None


def _lock(path: str, flag: str, fd: int | None = None) -> None:
    """Hold an exclusive lock on ``path`` until this process exits, recording who holds it
    (``fd``: the lock file, already locked by :func:`_acquire`)."""
    fd = _acquire(path, flag) if fd is None else fd
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode(), 0)
    _HELD.append(fd)


def _acquire(path: str, flag: str) -> int:
    """The lock file of ``path``, locked exclusively; one line naming the holder when another
    process holds it."""
    lock_path = os.path.join(path, LOCK)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        os.close(fd)
        try:
            info = json.loads(holder)
            who = (f"pid {info['pid']} on {info['host']}, started "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['time']))}")
        except (ValueError, KeyError, TypeError):
            who = "another process"
        raise InputError(f"{flag} {path}: in use by another relax run ({who}); wait for it "
                         "to finish or choose another directory") from None
    return fd


def _mark(path: str, marker: str, kind: str) -> None:
    file = os.path.join(path, marker)
    if not os.path.exists(file):
        with open(file, "w", encoding="utf-8") as f:
            json.dump({"kind": kind, "created": time.time()}, f)


def _distinct(dirs, models: dict[str, str | None]) -> None:
    """No two written directories are one, and none is a model directory Relax reads
    (``models``: flag -> directory, e.g. ``--hf-checkpoint``)."""
    models = {flag: _real(path) for flag, path in models.items()}
    seen: dict = {}
    for flag, path, _ in dirs:
        real = _real(path)
        if real in seen:
            other, other_path = seen[real]
            raise InputError(f"{other} {other_path} and {flag} {path}: the same directory; "
                             "one run's files would overwrite the other's (config.json, the "
                             "saved model, critic.pt); give them different directories")
        seen[real] = (flag, path)
        for model_flag, model in models.items():
            if real == model:
                raise InputError(f"{flag} {path}: is the {model_flag} model directory; Relax "
                                 "never writes into the model it reads; choose another path")


def _check_fresh(dirs, load: str | None) -> None:
    """A fresh run (no ``--load``) continues no earlier run's metrics or checkpoints."""
    paths = {flag: path for flag, path, _ in dirs}
    output_dir, save = paths.get("--output-dir"), paths.get("--save")
    fresh = load is None
    if fresh and output_dir is not None and os.path.isfile(
            os.path.join(output_dir, "metrics.jsonl")):
        raise InputError(f"--output-dir {output_dir}: holds metrics.jsonl of an earlier "
                         "run; continue that run with --load SAVE_DIR, or choose a new "
                         "--output-dir")
    if save is not None and os.path.isdir(save) and _has_checkpoints(save) and (
            fresh or _real(load) != _real(save)):
        how = (f"continue it with --load {save}" if fresh else
               f"save into --save {load} to continue the run you load")
        raise InputError(f"--save {save}: holds checkpoints of an earlier run; {how}, or "
                         "choose an empty --save directory")


def claim_train_dirs(dirs, *, models: dict[str, str | None], load: str | None) -> None:
    """All checks of the module docstring for ``relax train``; ``dirs`` are the
    ``(--flag, directory, kind)`` the run writes into (relax.config.section.written_dirs),
    ``models`` the model directories it reads (flag -> directory or None), ``load`` its
    ``--load``. Every check passes before any directory is created, locked or marked, except
    the lock of a Relax directory of its kind that has its lock file already (the module's
    docstring; nothing is written there until every check has passed). Raises
    :class:`InputError`."""
    _distinct(dirs, models)
    early: dict[str, int] = {}  # path -> its lock file, locked
    try:
        for flag, path, kind in dirs:
            if os.path.isfile(os.path.join(path, LOCK)) and _ours(path, KINDS[kind][0]):
                early[path] = _acquire(path, flag)
        for flag, path, kind in dirs:
            markers, what = KINDS[kind]
            _check_kind(path, flag, markers, what)
        _check_fresh(dirs, load)
    except InputError:
        for fd in early.values():  # refused: the directories stay as they were, unlocked
            os.close(fd)
        raise
    for flag, path, kind in dirs:
        _make_writable(path, flag)
        _lock(path, flag, early.get(path))
        _mark(path, KINDS[kind][0][0], kind)


def claim_eval_dir(output_dir: str | None, checkpoint: str) -> None:
    """``relax eval --output-dir``: new, empty or an earlier eval's; not the ``checkpoint``
    it evaluates; writable; locked."""
    if output_dir is None:
        return
    if _real(output_dir) == _real(checkpoint):
        raise InputError(f"--output-dir {output_dir}: is the checkpoint being evaluated; "
                         "choose another directory")
    _check_kind(output_dir, "--output-dir", (OUTPUT_MARKER, "eval_metrics.json"),
                "output directories")
    _make_writable(output_dir, "--output-dir")
    _lock(output_dir, "--output-dir")
    _mark(output_dir, OUTPUT_MARKER, "eval")


# fp32 weights + AdamW's two fp32 moments per parameter; the tokenizer and manifest are small
CHECKPOINT_BYTES_PER_PARAMETER = 12


def check_free_space(save: str | None, parameters: int, *, disk_usage=None) -> None:
    """Refuse to start when ``--save`` cannot hold one more checkpoint of ``parameters``
    trainable parameters (a checkpoint is written whole before it replaces anything)."""
    if save is None:
        return
    need = parameters * CHECKPOINT_BYTES_PER_PARAMETER
    where = os.path.abspath(save)
    while not os.path.exists(where):  # not created yet: the file system it will be on
        where = os.path.dirname(where)
    free = (disk_usage or shutil.disk_usage)(where).free
    if free < need:
        raise InputError(f"--save {save}: {free / 2**30:.2f} GiB free, one checkpoint needs "
                         f"about {need / 2**30:.2f} GiB ({parameters:,} parameters: fp32 weights "
                         "and AdamW state); free some space or choose another --save")

