"""The system section (``cfg.system``): devices, precision, sharding and host memory. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, option

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
MAX_MMAP_THRESHOLD_KB = 32 << 10  # glibc refuses an M_MMAP_THRESHOLD above 32 MiB (64-bit)

@dataclass(frozen=True)
class SystemSection(Section):
    """Devices, precision, sharding and host memory."""

    fsdp: bool = option(
        False,
        'Shard parameters with FSDP2 fully_shard.',
        default_note='DDP replication')
    context_parallel_size: int = option(
        1,
        'Values other than 1 are rejected (reinforce_plus_plus.md §8, 9).')
    bf16: bool | None = option(
        None,
        'Forward passes under bf16 autocast; fp32 master weights, AdamW state and log-prob '
        'math; reference stored in bf16.',
        default_text='on with CUDA, off on the CPU')
    device: str = option(
        'auto',
        '',
        choices=DEVICES,
        default_note='cuda when available, else cpu')
    peak_tflops: float | None = option(
        None,
        'Peak TFLOP/s per rank that perf/*_mfu divides by.',
        default_text="a known GPU's data sheet, else the best of square matmuls in the run's dtype measured"
        ' at start-up and at every step',
        bound=(lambda v: v is None or v > 0.0, "must be > 0 TFLOP/s, e.g. 989 for an " "H100's bf16 dense peak; leave it out to measure"))
    host_mmap_threshold_kb: int = option(
        0,
        'Host (CPU) memory blocks of at least this many KiB get their own memory map and go '
        "back to the OS when freed (glibc's M_MMAP_THRESHOLD, fixed; relax/host_memory.py). "
        "Turn it on (128) when host memory binds: glibc's dynamic threshold keeps freed "
        "tensors in a fragmenting heap, so a CPU run's peak RSS can be twice its live tensors;"
        ' a fixed one trades that for page faults (SmolLM2, 16 x 256 with recompute: peak 6.2 '
        "-> 3.3 GiB, step time +20-27 percent; docs/performance.md). 0: glibc's dynamic one.",
        default_note="glibc's dynamic threshold",
        bound=(lambda v: 0 <= v <= MAX_MMAP_THRESHOLD_KB, "must be between 0 (glibc's dynamic "
               f"threshold) and {MAX_MMAP_THRESHOLD_KB} KiB, glibc's largest"))

