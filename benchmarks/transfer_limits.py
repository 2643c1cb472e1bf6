"""This machine's limits for moving a weight bucket: memcpy GB/s (a 64 MB CPU tensor into a
buffer written before, and into a fresh one, whose pages are faulted in by the copy) and
loopback Gloo broadcast GB/s (two processes, a group built as the streamed weight sync
builds it: vllm_collective.py and vllm_plugin/relax_vllm_plugin/wire.py), medians of
``--repeats``, as JSON. Not part of the test suite::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/transfer_limits.py --mb 64 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _group(store, rank: int) -> dist.ProcessGroupGloo:
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._timeout = timedelta(seconds=120)
    return dist.ProcessGroupGloo(dist.PrefixStore("limits", store), rank, 2, options)


def _receiver(port: int, nbytes: int, repeats: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    group = _group(store, 1)
    options = dist.BroadcastOptions()
    options.rootRank = 0
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    for _ in range(repeats + 1):
        group.broadcast([buffer], options).wait()
        group.barrier().wait()


def broadcast_s(nbytes: int, repeats: int) -> list[float]:
    """Seconds of each broadcast of ``nbytes`` to a second process (after one warm-up),
    the receiver's buffer allocated once, each timed until the receiver has it (a barrier
    after, whose own time is a round trip of a few bytes)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    peer = mp.get_context("spawn").Process(target=_receiver,
                                           args=(store.port, nbytes, repeats))
    peer.start()
    group = _group(store, 0)
    options = dist.BroadcastOptions()
    options.rootRank = 0
    data = torch.ones(nbytes, dtype=torch.uint8)
    seconds = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        group.broadcast([data], options).wait()
        group.barrier().wait()
        seconds.append(time.perf_counter() - start)
    peer.join(60)
    return seconds[1:]


def copy_s(nbytes: int, repeats: int, fresh: bool) -> list[float]:
    source = torch.ones(nbytes, dtype=torch.uint8)
    target = torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        if fresh:
            target = torch.empty(nbytes, dtype=torch.uint8)
        target.copy_(source)
        seconds.append(time.perf_counter() - start)
        if fresh:
            del target
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    nbytes = int(args.mb * 2**20)
    result = {"bytes": nbytes, "threads": torch.get_num_threads()}
    for name, seconds in (("memcpy_reused", copy_s(nbytes, args.repeats, False)),
                          ("memcpy_fresh", copy_s(nbytes, args.repeats, True)),
                          ("gloo_broadcast", broadcast_s(nbytes, args.repeats))):
        median = statistics.median(seconds)
        result[name] = {"median_s": median, "gb_per_s": nbytes / median / 1e9,
                        "seconds": [round(s, 4) for s in seconds]}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
