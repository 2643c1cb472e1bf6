"""Freed host memory goes back to the operating system (``--host-mmap-threshold-kb N``).

glibc's malloc serves a block of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at start) from a
memory map of its own, returned to the OS by ``free``; smaller blocks come from the heap,
whose freed space stays in the process for reuse. The threshold is dynamic: each time a mapped
block is freed, glibc raises it to that block's size (up to 32 MiB on 64-bit). A training step
frees tensors of every size many times over, so after the first step nearly every tensor under
32 MiB (a decoder layer's activations, a gradient) lives in the heap, and the heap fragments:
the process keeps gigabytes it no longer uses.

Fixing the threshold (``mallopt``, which also stops the dynamic adjustment) returns them, at
the price of faulting every large tensor in afresh. Measured on SmolLM2-135M, 16 x 256 tokens
in fp32 with recompute (docs/performance.md, "What sets the peak"): peak RSS 6.2 GB with the
dynamic threshold, 3.3 GB with 128 KiB, the step 20-27% slower. So it is off by default, a
lever for runs whose host memory binds. It acts on host memory only (on CUDA the GPU's caching
allocator is untouched). Where the C library is not glibc (macOS, musl) nothing is set; an
explicit ``MALLOC_MMAP_THRESHOLD_`` in the environment is glibc's own setting and wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
ENV = "MALLOC_MMAP_THRESHOLD_"


def _glibc():
    """glibc's ``mallopt``, or None where the C library is another one."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # gnu_get_libc_version exists in glibc only; another C library's mallopt takes other codes
    return libc.mallopt if hasattr(libc, "gnu_get_libc_version") else None


def set_mmap_threshold(kib: int) -> bool:
    """Serve host blocks of at least ``kib`` KiB from their own memory maps from now on (and
    stop glibc raising that threshold); ``kib`` 0 leaves glibc's dynamic threshold. True when
    the threshold was set."""
    if kib <= 0 or os.environ.get(ENV):
        return False
    mallopt = _glibc()
    return bool(mallopt and mallopt(M_MMAP_THRESHOLD, kib * 1024) == 1)
