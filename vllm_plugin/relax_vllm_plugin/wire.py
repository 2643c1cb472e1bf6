"""The receiving half of Relax's in-memory weight transfer (engine ``relax_gloo``): the Gloo
group a server's worker joins and how one chunk of weights arrives. Torch only, no vLLM
import, so that tests can run it in any process.

The wire format (the same text is in Relax's relax/rollout/backends/vllm/vllm_collective.py,
which sends it):

    group:   one Gloo process group per server: the trainer's sending rank is rank 0, the
             server's worker rank 1 (``rank_offset`` + the worker's rank), world size 2;
             built from the trainer's TCPStore at ``master_address:master_port`` under the
             key prefix ``group_name``.
    chunk:   ``update_info`` = {"names": [str], "dtype_names": [str], "shapes": [[int]]}:
             the tensors of one bucket, in order; ``dtype_names`` are torch dtype names
             ("float32", "bfloat16"); then ONE broadcast from rank 0 of a uint8 tensor of
             sum(numel * itemsize) bytes: each tensor's contiguous bytes (native byte order)
             one after the other, no padding, no header.
    next:    ``update_info`` may also hold ``next_bytes``: the bytes of the chunk that
             follows in this update (0 or absent: none, or not said). The receiver may then
             take that chunk's broadcast while it loads this one; the sender broadcasts a
             chunk before its ``update_info`` goes, and sends the ``update_info`` once the
             previous chunk's was answered, so chunks are taken in order.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

READY_KEY = "ready"  # set by the worker in the group's prefix once it is about to join


def local_address(host: str, port: int) -> str:
    """The address of this machine's interface that reaches ``host:port`` (a UDP connect
    sends nothing; it only picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def join_group(store: dist.Store, group_name: str, rank: int, world_size: int,
               timeout_s: float, address: str) -> dist.ProcessGroupGloo:
    """A Gloo group of ``world_size`` built on ``store`` under ``group_name``, without
    ``init_process_group`` (the process's default group, vLLM's own, stays untouched);
    ``address``: the interface Gloo binds (one that reaches the other rank)."""
    prefixed = dist.PrefixStore(group_name, store)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = timedelta(seconds=timeout_s)
    if rank != 0:
        prefixed.set(f"{READY_KEY}{rank}", b"1")
    return dist.ProcessGroupGloo(prefixed, rank, world_size, options)


def layout(dtype_names: list[str], shapes: list[list[int]]) -> list[tuple[torch.dtype, tuple, int, int]]:
    """(dtype, shape, offset, nbytes) of each tensor of a chunk, in order."""
    out, offset = [], 0
    for dtype_name, shape in zip(dtype_names, shapes, strict=True):
        dtype = getattr(torch, dtype_name)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a torch dtype: {dtype_name!r}")
        numel = 1
        for n in shape:
            numel *= int(n)
        nbytes = numel * dtype.itemsize
        out.append((dtype, tuple(int(n) for n in shape), offset, nbytes))
        offset += nbytes
    return out


def unpack(buffer: torch.Tensor, names: list[str], dtype_names: list[str],
           shapes: list[list[int]]) -> list[tuple[str, torch.Tensor]]:
    """The chunk's ``(name, tensor)`` pairs from its uint8 ``buffer``: views of it, or a copy
    where a tensor's offset is not a multiple of its item size (a view needs alignment)."""
    pieces = layout(dtype_names, shapes)
    total = sum(nbytes for *_, nbytes in pieces)
    if buffer.numel() != total:
        raise ValueError(f"a chunk of {buffer.numel()} bytes for tensors of {total}")
    out = []
    for name, (dtype, shape, offset, nbytes) in zip(names, pieces, strict=True):
        raw = buffer[offset:offset + nbytes]
        if offset % dtype.itemsize:
            raw = raw.clone()
        out.append((name, raw.view(dtype).reshape(shape)))
    return out


class Buffers:
    """Receive buffers reused within an update: a fresh buffer of 64 MB has its pages faulted
    in by the receive (measured at about 1.2 GB/s against 5.6 GB/s into pages touched
    before), so a buffer nothing refers to any more is taken again. The model's load may keep
    views of a chunk (vLLM's layerwise reload holds a layer's weights until the layer is
    complete, which can be in the next chunk): a buffer counts as free only when no tensor
    shares its storage. At most ``keep`` are kept; :meth:`clear` drops them (an update's end)."""

    def __init__(self, keep: int = 4):
        self.keep, self.pool = keep, []

    def get(self, nbytes: int) -> torch.Tensor:
        for buffer in self.pool:
            if buffer.numel() >= nbytes and _unshared(buffer):
                return buffer[:nbytes]
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        if len(self.pool) < self.keep and _unshared(buffer):
            self.pool.append(buffer)
        return buffer[:nbytes]  # a view: while it (or a view of it) lives, the storage is shared

    def clear(self) -> None:
        self.pool = []


def _unshared(buffer: torch.Tensor) -> bool:
    """Whether no other tensor shares ``buffer``'s storage (False where torch cannot say)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    # the buffer's own reference and the storage object asked about
    return count is not None and count(buffer.untyped_storage()._cdata) <= 2


def post(group: dist.ProcessGroup, nbytes: int,
         buffers: Buffers | None = None) -> tuple[object, torch.Tensor]:
    """The receive of one chunk of ``nbytes`` broadcast by rank 0 of ``group``, started (Gloo
    fills the buffer on its own thread): its work and its buffer (from ``buffers``)."""
    buffer = torch.empty(nbytes, dtype=torch.uint8) if buffers is None else buffers.get(nbytes)
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options), buffer


def receive(group: dist.ProcessGroup, names: list[str], dtype_names: list[str],
            shapes: list[list[int]], posted: tuple | None = None,
            buffers: Buffers | None = None) -> list[tuple[str, torch.Tensor]]:
    """One chunk broadcast by rank 0 of ``group``, unpacked (CPU tensors); ``posted``: its
    receive started before (:func:`post`, from the previous chunk's ``next_bytes``)."""
    total = sum(nbytes for *_, nbytes in layout(dtype_names, shapes))
    work, buffer = posted if posted is not None else post(group, total, buffers)
    work.wait()
    return unpack(buffer, names, dtype_names, shapes)
