"""Distributed glue: process group, device, DDP / FSDP2 wrapping with SUMMED gradients.

reinforce_plus_plus.md §7 fixes the loss as a sum over the whole global batch divided by one global count
``B`` (or ``N_step``). Every rank already divides its micro-batch losses by that global count,
so the per-rank gradients must be SUMMED, not averaged: DDP gets a comm hook that all-reduces
without dividing, FSDP2 gets a gradient divide factor of 1 on every sharded module. Then the
gradient of one optimizer step is the gradient of the whole-batch loss, whatever the
micro-batch size and the world size.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from relax.errors import InputError
from relax.models import pick_device, unwrap  # noqa: F401  (the trainer's names for them)


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    group: object  # the data-parallel process group, None in a single process

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _check_launch_env(world_size: int) -> None:
    """What torchrun sets; without it ``init_process_group`` fails with a traceback."""
    rank = os.environ.get("RANK")
    if rank is None or not rank.isdigit() or int(rank) >= world_size:
        raise InputError(f"WORLD_SIZE={world_size} RANK={rank}: a multi-process run needs RANK "
                         f"in 0..{world_size - 1}, MASTER_ADDR and MASTER_PORT; launch with "
                         "torchrun, or unset WORLD_SIZE for a single process")
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise InputError(f"WORLD_SIZE={world_size}: {' and '.join(missing)} not set; launch "
                         "with torchrun, or unset WORLD_SIZE for a single process")


def init_distributed(device_choice: str, timeout_minutes: float | None = None) -> DistContext:
    """Join the torchrun process group when ``WORLD_SIZE`` > 1 (Gloo on CPU, NCCL on GPU).

    ``timeout_minutes`` (``--distributed-timeout-minutes``) bounds every collective: a rank
    whose peer died or hangs raises instead of waiting forever (docs/reliability.md).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_choice, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size == 1:
        return DistContext(0, 1, 0, device, None)
    _check_launch_env(world_size)
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # torchrun's workers
        stop_with_launcher(os.getppid())
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        if timeout_minutes is not None:
            kwargs["timeout"] = datetime.timedelta(minutes=timeout_minutes)
        dist.init_process_group(backend=backend, **kwargs)
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, device, dist.group.WORLD)


def stop_with_launcher(launcher: int, poll_s: float = 1.0) -> threading.Thread:
    """End this rank when the process that launched it (torchrun's agent, pid ``launcher``)
    is gone. torchrun stops its workers when it is stopped, but a SIGKILL (a scheduler's,
    an OOM kill, a timed-out test) cannot be passed on: its workers would live on, waiting in
    a collective for up to --distributed-timeout-minutes, holding memory and devices. An
    orphan's parent becomes another process (init or a subreaper), which is what the daemon
    thread watches for; it says so in one line and ends the process with status 1."""
    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll_s)
        print(f"relax: error: rank {os.environ.get('RANK', '?')}: its launcher (pid "
              f"{launcher}) is gone, so this rank stops too", file=sys.stderr, flush=True)
        os._exit(1)

    thread = threading.Thread(target=watch, name="relax-launcher-watch", daemon=True)
    thread.start()
    return thread


def finish_together(ctx) -> None:
    """Wait until every rank has finished training, so no rank leaves (closing its
    connections and, on rank 0, the rendezvous store) while a peer still completes its last
    collective."""
    if ctx.world_size > 1:
        dist.barrier(group=ctx.group)


def shutdown_distributed(*, peer_failed: bool = False) -> None:
    """Leave the process group. After a peer failure the group is broken: destroying it would
    talk to dead ranks, so it is left alone and the process ends through :func:`exit_rank`."""
    if dist.is_initialized() and not peer_failed:
        dist.destroy_process_group()


def exit_rank(status: int, *, run_exit_handlers: bool = True) -> NoReturn:
    """End a data-parallel rank's process now, without the interpreter's finalization.

    ``destroy_process_group`` does not stop Gloo's worker threads; they live until the
    interpreter frees the group at exit. A worker that drops the last reference to a finished
    collective (the final barrier holds the all-reduces before it) must take the GIL to free
    the tensors' Python objects; if that happens during finalization, CPython ends the thread
    mid-destructor and the C++ runtime aborts the process: "terminate called without an
    active exception", status -6 (or -11) after a run that printed its summary. Measured
    in 4 of 90 two-rank runs of the test suite's small run (docs/reliability.md section 4).

    Exit handlers (``atexit``: a custom reward module's clean-up) run first, while the
    interpreter is whole; after a peer failure they are skipped (``run_exit_handlers=False``)
    because a handler that touches the broken group would wait on dead ranks. Metrics,
    checkpoints and loggers are closed by the trainer before this is called; the standard
    streams are flushed here.
    """
    _before_exit(run_exit_handlers)
    os._exit(status)


def _before_exit(run_exit_handlers: bool) -> None:
    """What a rank does before its process ends without finalization: its exit handlers
    (``atexit``, what Py_FinalizeEx would call, here while all is alive), then its output."""
    if run_exit_handlers:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe must not change status
            stream.flush()


def leave_rank(status: int, *, run_exit_handlers: bool = True) -> int:
    """End a data-parallel rank: :func:`exit_rank`, or ``status`` returned when multiprocessing
    started this process (torchrun ``--run-path`` or ``--start-method``, ``elastic_launch``
    with a function). Such a launcher waits for the function to return (torchrun's agent
    waited forever for a rank that called ``os._exit``), and multiprocessing itself ends the
    process with ``os._exit`` once it has, so the interpreter's finalization never runs; nor
    do exit handlers, which run here first, as :func:`exit_rank` runs them."""
    if multiprocessing.parent_process() is None:
        exit_rank(status, run_exit_handlers=run_exit_handlers)
    _before_exit(run_exit_handlers)
    return status


def is_peer_failure(error: BaseException) -> bool:
    """A collective that failed because another rank died, hung or lost its connection."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        k in text for k in ("gloo", "nccl", "connection", "timed out", "timeout", "peer"))


def _allreduce_sum_hook(process_group, bucket):
    """DDP comm hook: sum the gradient bucket over ranks (the default hook divides by world)."""
    tensor = bucket.buffer()
    work = dist.all_reduce(tensor, group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def wrap_model(model: torch.nn.Module, ctx: DistContext, *, fsdp: bool,
               blocks: list[torch.nn.Module] | None = None) -> torch.nn.Module:
    """Replicate (DDP) or shard (FSDP2) ``model`` so gradients are summed over ranks;
    ``blocks``: FSDP2's units when ``model`` is not itself a Hugging Face causal LM (the
    critic's value model wraps one), else its decoder blocks."""
    if fsdp:
        if ctx.world_size == 1 and not dist.is_initialized():
            return model  # nothing to shard over; a single process behaves the same
        mesh = _mesh(ctx)
        # one FSDP unit per transformer block, then the root (embeddings, norm, head)
        for block in decoder_blocks(model) if blocks is None else blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                # plain SUM collectives: a factor of 1 would otherwise become PREMUL_SUM,
                # which Gloo lacks (and the division by 1 is skipped anyway)
                module.set_force_sum_reduction_for_comms(True)
        return model
    if ctx.world_size == 1:
        return model
    ddp = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
              process_group=ctx.group)
    ddp.register_comm_hook(ctx.group, _allreduce_sum_hook)
    return ddp


def _mesh(ctx: DistContext):
    """The device mesh of the data-parallel group: the whole job, or with --fully-async its
    training ranks only (None: fully_shard's default, the world)."""
    if ctx.group is None or ctx.group is dist.group.WORLD:
        return None
    return DeviceMesh.from_group(ctx.group, ctx.device.type)


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a Hugging Face causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "transformer", None), "h", None)  # GPT-2 style
    return list(layers) if layers is not None else []


def reshard(model: torch.nn.Module) -> None:
    """Free the gathered parameters an FSDP2 model keeps after a no-grad pass.

    The root unit stays unsharded after a forward; if the next (training) forward reuses those
    parameters gathered without autograd, their gradients never reach the shards (measured:
    a wrong gradient norm). Call this after generation and after the old log-prob pass.
    """
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def no_grad_sync(model: torch.nn.Module, skip: bool):
    """Skip the gradient all-reduce of a micro-batch that is not the last of its step."""
    if skip and hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(not skip)
    return contextlib.nullcontext()
