"""The trainer's weights streamed from memory to its vLLM servers (``--vllm-weight-sync
collective``), instead of written to disk and reloaded (vllm_sync.py ``DiskSync``).

    sync = CollectiveSync(pool, timeout=600.0, bucket_bytes=64 << 20)  # shards=, split=
    nbytes = sync.push(module, version)        # the servers sample with these weights from now

Each server runs vLLM's weight transfer routes with Relax's engine ``relax_gloo`` (the plugin
in vllm_plugin/, which ``make vllm`` installs; owned servers start with
``--weight-transfer-config '{"backend": "relax_gloo"}'``). Per server one Gloo process group
of two: this rank is rank 0, the server's worker rank 1, built from a TCPStore this process
hosts (port 0, bound once and kept) and never from ``init_process_group``, on both sides.
One group per server, so a dead or slow server fails its own group only (bounded by
--vllm-request-timeout) and leaves the pool as any failed load does. The group is set up at
the first push to the server, and again after it failed one.

A push, per server: ``/pause`` (requests in flight finish on the old weights),
``/start_weight_update`` (a session a dead trainer left open is finished first:
:meth:`CollectiveSync._start`), then per bucket of at most --weight-sync-bucket-mb: ``POST
/update_weights`` naming the bucket's tensors (on a thread; it answers once the worker has
loaded them) while this rank broadcasts the bucket; ``/finish_weight_update``,
``/reset_prefix_cache``, ``/resume``; then the pool's version check (router.py ``confirm``).
The tensors are the model's state dict under its Hugging Face names, the output layer's
weight included when tied (servers start from an untied directory, vllm_weights.py), in
the trainer's dtype (the server converts).

Overlap: a bucket is released as soon as its bytes are on the wire, so the next one is
packed (under FSDP2 gathered) while the server loads this one; the next bucket's names go
once the server answered (its chunks stay in order). A bucket of several tensors is packed
into one buffer per push (its pages faulted in once); a bucket of one contiguous tensor is
sent from that tensor's storage, no copy. A server whose ``/update_weights`` answers an
error while its broadcast waits (it rejected the chunk and will not join) fails at once and
leaves the pool (its group is dropped); the other servers finish the push.

Under FSDP2 (``shards``) every rank gathers the model bucket by bucket (the same order
everywhere, ``DTensor.full_tensor``), and sends each gathered bucket to the servers it
loads; a rank loading none still joins the gathers. No rank holds more than one packed
bucket and one gathered tensor beyond its shard: each tensor is copied into the bucket and
dropped as it arrives (a bucket of one tensor is that gathered tensor), and the next bucket
is gathered once every server of this rank has its bytes and nothing holds it any more. A
server that fails keeps taking the buckets, unsent, so the gathers never wait for it.

The wire format (the same text is in vllm_plugin/relax_vllm_plugin/wire.py, which receives
it):

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

import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from relax.rollout.backends.vllm.router import ServerPool
from relax.rollout.backends.vllm.vllm_client import ServerDown, ServerError
from relax.rollout.backends.vllm.vllm_weights import full_tensor, named_weights, plan_buckets

ENGINE = "relax_gloo"  # the plugin's engine name (vllm_plugin/relax_vllm_plugin/__init__.py)
READY_KEY = "ready1"  # what the worker sets under the group's prefix just before it joins
_POLL_S = 0.05
_SPIN_S = 0.001  # how often a broadcast in progress looks at the server's answer


@dataclass(frozen=True)
class Chunk:
    """One packed bucket: ``info`` the update_info of the wire format, ``data`` its bytes."""

    info: dict
    data: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def pack(names: list[str], tensors: list[torch.Tensor], whole=None,
         buffer: torch.Tensor | None = None) -> Chunk:
    """The wire format's chunk of ``tensors`` (any device, any dtype): one uint8 CPU tensor
    of their contiguous bytes in order, and the names, dtype names and shapes. ``whole``:
    each tensor's whole one (FSDP2: ``full_tensor``, a collective), taken one at a time and
    dropped once copied, so that the chunk and one whole tensor are all this holds.
    ``buffer``: a uint8 CPU tensor to pack into when it holds the chunk's bytes (a push reuses
    one for all its buckets: its pages are faulted in once, not once per bucket; a fresh
    64 MB buffer was measured to pack at 0.3-1.2 GB/s). A chunk of one contiguous CPU tensor
    is that tensor's own bytes, no copy (it must not change until the chunk is sent)."""
    info = {"names": list(names), "dtype_names": [str(t.dtype).removeprefix("torch.")
                                                  for t in tensors],
            "shapes": [list(t.shape) for t in tensors]}
    if len(tensors) == 1:
        full = tensors[0] if whole is None else whole(tensors[0])
        if full.device.type == "cpu" and full.is_contiguous():
            return Chunk(info, full.detach().reshape(-1).view(torch.uint8))
        tensors = [full]
        whole = None
    total = sum(t.numel() * t.element_size() for t in tensors)
    fits = buffer is not None and buffer.numel() >= total
    data = buffer[:total] if fits else torch.empty(total, dtype=torch.uint8)
    offset = 0
    for t in tensors:
        full = t if whole is None else whole(t)
        flat = full.detach().contiguous().reshape(-1).view(torch.uint8)
        _copy(data[offset:offset + flat.numel()], flat)
        offset += flat.numel()
        del full, flat
    return Chunk(info, data)


def _copy(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target[:] = source`` (uint8): on one thread where both are in CPU memory (numpy's
    copy). Torch's copy runs on its OpenMP threads, which, while the server loads the last
    bucket on the same cores, wait for each other: packing 64 MB was measured at 0.3-0.6 s
    that way during a push, against 8 ms for one thread's copy on the same busy machine."""
    if source.device.type == "cpu":
        target.numpy()[:] = source.numpy()
    else:
        target.copy_(source)


def local_address(host: str, port: int) -> str:
    """The address of this machine's interface that reaches ``host:port`` (a UDP connect
    sends nothing; it only picks the route)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def _group(store, name: str, address: str, timeout: float) -> dist.ProcessGroupGloo:
    """Rank 0 of the group ``name`` (wire format) on ``store``, Gloo bound to ``address``."""
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = timedelta(seconds=timeout)
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), 0, 2, options)


class Relay:
    """The packed buckets from this rank's producer (the push, on the pool's calling thread)
    to its ``n`` senders (one thread per server): :meth:`put` returns once every sender has
    taken and sent (or dropped) the bucket, so one bucket is alive at a time."""

    END = object()

    def __init__(self, n: int):
        self.n, self.serial, self.item, self.pending = n, 0, None, 0
        self.cond = threading.Condition()

    def put(self, item) -> None:
        with self.cond:
            self.item, self.serial, self.pending = item, self.serial + 1, self.n
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.pending == 0)
            self.item = None

    def take(self, seen: int) -> tuple[int, object]:
        """The item after serial ``seen`` (blocks until it is put)."""
        with self.cond:
            self.cond.wait_for(lambda: self.serial > seen)
            return self.serial, self.item

    def done(self) -> None:
        with self.cond:
            self.pending -= 1
            self.cond.notify_all()

    def drain(self, seen: int) -> None:
        """Take and drop every item after ``seen`` through the end (a sender that failed)."""
        item = None
        while item is not Relay.END:
            seen, item = self.take(seen)
            self.done()


class CollectiveSync:
    """Streams ``module``'s weights to every server of the pool (router.py; or the one
    ``client``), each through its own Gloo group; a server that fails leaves the pool and
    rejoins at a later push (router.py ``streamed``). ``shards``: FSDP2, every rank gathers;
    ``split``: the ranks pool the same servers, each loaded by one of them (vllm_sync.py);
    ``timeout``: seconds any step of a server's transfer may take."""

    def __init__(self, target, *, timeout: float, bucket_bytes: int, shards=None,
                 split=None):
        self.pool, self.shards, self.split = ServerPool.of(target), shards, split
        self.timeout, self.bucket_bytes = timeout, bucket_bytes
        self.store: dist.TCPStore | None = None
        self._store_lock = threading.Lock()  # the senders' threads connect at once
        self.groups: dict[int, dist.ProcessGroupGloo] = {}  # id(client): its group
        self._names = itertools.count()

    def push(self, module: torch.nn.Module, version: int) -> int:
        names, tensors = named_weights(module)
        sizes = [t.numel() * t.element_size() for t in tensors]
        buckets = plan_buckets(sizes, self.bucket_bytes)
        relay: list[Relay] = []

        def feed(n: int) -> None:
            relay.append(Relay(n))
            # one buffer for every bucket of more than one tensor (a bucket of one is sent
            # from its own storage): reused once the senders have put the last one on the wire
            many = [sum(sizes[j] for j in b) for b in buckets if len(b) > 1]
            buffer = torch.empty(max(many), dtype=torch.uint8) if many else None
            try:
                for k, bucket in enumerate(buckets):
                    with torch.no_grad():
                        chunk = pack([names[j] for j in bucket],
                                     [tensors[j] for j in bucket], whole=full_tensor,
                                     buffer=buffer)
                    if k + 1 < len(buckets):  # the server takes its bytes while loading this
                        chunk.info["next_bytes"] = sum(sizes[j] for j in buckets[k + 1])
                    relay[0].put(chunk)
                    del chunk  # gone before the next bucket is gathered
            finally:
                relay[0].put(Relay.END)

        def load(client) -> None:
            while not relay:  # the pool starts the senders just before the feed
                time.sleep(0.001)
            self._send(client, relay[0])

        error = None
        try:
            kw = dict(streamed=True, feed=feed)
            if self.split is None:
                self.pool.load(version, load, **kw)
            else:
                self.split.load(self.pool, version, load, **kw)
        except Exception as e:
            error = e
        if self.shards is not None:
            self.shards.agree(error)
        elif error is not None:
            raise error
        return sum(sizes)

    def _send(self, client, relay: Relay) -> None:
        """One server's part of a push (on the pool's thread for it). A bucket is handed back
        to the producer as soon as its bytes are on the wire, so that the next one is packed
        (and, under FSDP2, gathered) while the server loads this one; the next bucket's
        broadcast starts at once (the server took its receive early: wire format "next"),
        its names once this one is answered, which keeps the server's chunks in order."""
        seen, ended = 0, False
        try:
            group = self._connect(client)
            client.pause()
            try:
                self._start(client)
                answer = None  # the last chunk's
                with ThreadPoolExecutor(max_workers=1) as thread:
                    while True:
                        seen, chunk = relay.take(seen)
                        if chunk is Relay.END:
                            ended = True
                            relay.done()
                            break
                        try:
                            answer = self._send_chunk(client, group, chunk, thread, answer)
                        finally:
                            chunk = None  # not held while the next bucket is gathered
                            relay.done()
                    if answer is not None:
                        answer.result()
                client.finish_weight_update()
            finally:
                client.resume()
        except BaseException:
            self.groups.pop(id(client), None)  # the next push connects afresh
            if not ended:  # after the end nothing more comes: draining would wait forever
                relay.drain(seen)
            raise

    @staticmethod
    def _start(client) -> None:
        """``/start_weight_update``; a server still in an update session that a trainer
        began and never finished (it died, or failed between two buckets: vLLM's worker then
        refuses every new session until restarted) has that session finished first. What
        the old session had loaded is overwritten by this push, which sends every weight."""
        try:
            client.start_weight_update()
        except ServerDown:
            raise
        except ServerError as e:
            try:
                client.finish_weight_update()  # a server without a session refuses it
            except ServerError:
                raise e from None
            client.start_weight_update()

    def _send_chunk(self, client, group, chunk: Chunk, thread: ThreadPoolExecutor, last):
        """The chunk's bytes over the group, and its names over HTTP (on ``thread``) once
        ``last`` (the previous chunk's answer) came; returns once the bytes are sent, with
        this chunk's answer (the server answers once its worker has loaded them). An answer
        that is an error while the broadcast waits (the server will not receive these bytes)
        is raised at once instead of the broadcast waiting for the group's timeout: the
        broadcast is left to Gloo's thread (Gloo's ``abort`` was measured not to end it; it
        ends when the server drops its end of the group, at its next connection, or at the
        timeout), and the group is never used again."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        work, answer = group.broadcast([chunk.data], options), None
        try:
            if last is not None:
                last.result()
            answer = thread.submit(client.update_weights, chunk.info)
            while not work.is_completed():
                if answer.done() and answer.exception() is not None:
                    answer.result()
                time.sleep(_SPIN_S)
            work.wait()
        except RuntimeError as e:
            if answer is not None and answer.done():
                answer.result()  # the server's own error first, when it has one
            raise ServerError(f"{client.describe()} failed to receive weights: "
                              f"{str(e).splitlines()[0] if str(e) else e}") from e
        return answer

    def _connect(self, client) -> dist.ProcessGroupGloo:
        """The server's group: the one set up before, or a new one (its engine joins while
        this rank does; a server out of the pool may have restarted, so it gets a new one)."""
        member = next((m for m in self.pool.members if m.client is client), None)
        group = self.groups.get(id(client))
        if group is not None and (member is None or member.in_pool):
            return group
        url = urlsplit(client.url)
        address = local_address(url.hostname, url.port or 80)
        with self._store_lock:
            if self.store is None:  # bound once on port 0 and kept: no port to race for
                self.store = dist.TCPStore(address, 0, is_master=True,
                                           wait_for_workers=False,
                                           timeout=timedelta(seconds=self.timeout))
        # a connection of its own to the store per group: a store client answers one call at
        # a time, and Gloo's connect blocks in it until the server's worker has written its
        # address, which for a server dying as it joins is the whole timeout; on a shared
        # client that wait would hold every other server's connect as well
        store = dist.TCPStore(address, self.store.port, is_master=False,
                              timeout=timedelta(seconds=self.timeout))
        name = f"relax-{os.getpid()}-{next(self._names)}"
        info = {"master_address": address, "master_port": self.store.port,
                "group_name": name, "rank_offset": 1, "world_size": 2,
                "timeout_s": self.timeout}
        with ThreadPoolExecutor(max_workers=1) as thread:
            answer = thread.submit(client.init_weight_transfer_engine, info)
            self._wait_ready(client, store, name, answer)
            group = self._join(client, store, name, address, answer)
            answer.result()
        self.groups[id(client)] = group
        return group

    def _join(self, client, store, name: str, address: str, answer) -> dist.ProcessGroupGloo:
        """Rank 0 of the group ``name``, built on a thread of its own while ``answer`` (the
        server's /init_weight_transfer_engine) is watched: a server that dies between saying
        it is ready and joining never connects, and Gloo's connect would hold this push (and
        every other server's, which wait for this one's senders to take each bucket) for
        the whole --vllm-request-timeout. Its failed answer ends the wait at once; the
        abandoned connect ends on its own at the timeout (a daemon thread: it holds no exit)."""
        built: list = []

        def build() -> None:
            try:
                built.append(_group(store, name, address, self.timeout))
            except BaseException as e:  # noqa: BLE001 - raised on the waiting thread
                built.append(e)

        threading.Thread(target=build, name=f"relax-join-{name}", daemon=True).start()
        while not built:
            if answer.done() and answer.exception() is not None:
                answer.result()
            time.sleep(_SPIN_S)
        if isinstance(built[0], BaseException):
            raise built[0]
        return built[0]

    def _wait_ready(self, client, store, name: str, answer) -> None:
        """Until the server's worker is about to join ``name`` on ``store``, or its answer
        came first (a failure: it then never joins)."""
        prefixed = dist.PrefixStore(name, store)
        deadline = time.monotonic() + self.timeout
        while not prefixed.check([READY_KEY]):
            if answer.done():
                try:
                    answer.result()
                except ServerError as e:
                    raise ServerError(
                        f"{e}; --vllm-weight-sync collective needs Relax's vLLM plugin in "
                        "the server's environment (`make vllm`, or pip install vllm_plugin/) "
                        "and the server started with --weight-transfer-config "
                        f"'{{\"backend\": \"{ENGINE}\"}}'; or pass --vllm-weight-sync "
                        "disk") from None
                raise ServerError(f"{client.describe()} answered /init_weight_transfer_engine "
                                  "without joining the transfer group")
            if time.monotonic() > deadline:
                raise ServerError(f"{client.describe()} did not join the weight transfer "
                                  f"group within --vllm-request-timeout {self.timeout:g} s")
            time.sleep(_POLL_S)
