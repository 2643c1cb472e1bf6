"""``--fully-async`` weight sync: the training ranks' trainable weights to the rollout ranks,
streamed in buckets over the sync group (training rank 0 and the rollout ranks; Gloo on the
CPU, NCCL on GPUs), and the control header that precedes each sync or ends the run.

What travels: the parameters with ``requires_grad`` in ``named_parameters()`` order (full
fine-tuning: all of them; LoRA: the adapter only, the frozen base is loaded on both sides from
--hf-checkpoint). Both sides build the same module, so both cut the same buckets from the
shapes alone (:func:`plan_buckets`) and no metadata travels. Under FSDP2 every training rank
takes part in gathering one bucket's parameters (``DTensor.full_tensor``, a collective of the
training group); only training rank 0 broadcasts it, then drops it: no rank holds more than one
bucket of gathered weights beyond its shard. Weights travel in their own dtype (fp32
masters), so a rollout rank samples with exactly the training weights.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

WEIGHTS, STOP = 1, 0  # header kinds


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What a sync sends, in a fixed order both sides share."""
    return [p for _, p in module.named_parameters() if p.requires_grad]


def signature(module: torch.nn.Module) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of what a sync sends, in order: both sides must build the same, or the
    broadcasts would not match (compared once at start, relax/trainer/fully_async/rollout_worker.py)."""
    return [(tuple(p.shape), str(p.dtype)) for p in trainable(module)]


def signature_difference(mine: list, theirs: list) -> str | None:
    """Where two :func:`signature` lists first differ, in words; None when they agree."""
    if len(mine) != len(theirs):
        return f"{len(theirs)} trainable tensors on the training ranks, {len(mine)} here"
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if tuple(a[0]) != tuple(b[0]) or a[1] != b[1]:
            return (f"trainable tensor {i} is {list(b[0])} {b[1]} on the training ranks, "
                    f"{list(a[0])} {a[1]} here")
    return None


def plan_buckets(params: list, bucket_bytes: int) -> list[list[int]]:
    """Consecutive parameter indices, at most ``bucket_bytes`` per bucket (a larger parameter
    goes alone) and one dtype per bucket."""
    buckets, size, dtype = [], 0, None
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        if not buckets or size + nbytes > bucket_bytes or p.dtype != dtype:
            buckets.append([])
            size, dtype = 0, p.dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


def broadcast(tensor: torch.Tensor, group, timeout_minutes: float) -> None:
    """Training rank 0's ``tensor`` to the sync group, waiting at most ``timeout_minutes``
    (--distributed-timeout-minutes): measured with Gloo, the root of a blocking broadcast
    waits for a receiver that never comes past the group's timeout."""
    work = dist.broadcast(tensor, src=0, group=group, async_op=True)
    work.wait(timeout=datetime.timedelta(minutes=timeout_minutes))


def send_header(kind: int, version: int, group, device, timeout_minutes: float) -> None:
    """Training rank 0: what follows on the sync group (weights of ``version``, or the end)."""
    broadcast(torch.tensor([kind, version], dtype=torch.int64, device=device), group,
              timeout_minutes)


def recv_header(group, device, timeout_minutes: float) -> tuple[int, int]:
    """A rollout rank: (kind, version) of the next :func:`send_header`."""
    header = torch.empty(2, dtype=torch.int64, device=device)
    broadcast(header, group, timeout_minutes)
    kind, version = header.tolist()
    return int(kind), int(version)


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole parameter (an FSDP2 shard is gathered: a collective of the training group)."""
    full = getattr(p, "full_tensor", None)
    return full() if full is not None else p.detach()


def publish(module: torch.nn.Module, *, sender: bool, group, device,
            bucket_bytes: int, gather: bool, timeout_minutes: float) -> int:
    """Every training rank: stream the weights (``sender``: training rank 0, which
    broadcasts; ``gather``: FSDP2, where every training rank joins each gather). Returns the
    bytes sent. The header goes first (:func:`send_header`)."""
    params = trainable(module)
    sent = 0
    for bucket in plan_buckets(params, bucket_bytes):
        if not (sender or gather):
            continue
        with torch.no_grad():
            parts = [_full(params[i]) for i in bucket]
            if not sender:
                continue
            flat = torch.cat([t.reshape(-1) for t in parts]).to(device)
        broadcast(flat, group, timeout_minutes)
        sent += flat.numel() * flat.element_size()
    return sent


def receive(module: torch.nn.Module, *, group, device, bucket_bytes: int,
            timeout_minutes: float) -> int:
    """A rollout rank: the weights :func:`publish` streams, copied into ``module``; returns the
    bytes received."""
    params = trainable(module)
    got = 0
    for bucket in plan_buckets(params, bucket_bytes):
        total = sum(params[i].numel() for i in bucket)
        flat = torch.empty(total, dtype=params[bucket[0]].dtype, device=device)
        broadcast(flat, group, timeout_minutes)
        offset = 0
        with torch.no_grad():
            for i in bucket:
                n = params[i].numel()
                params[i].copy_(flat[offset:offset + n].view_as(params[i]))
                offset += n
        got += flat.numel() * flat.element_size()
    return got
