"""Wall time and peak memory per rank of one interval checkpoint of a two-rank FSDP2 run,
for two code states of Relax side by side (A, B, A, B, ...).

Not part of the test suite. Each state is a directory holding a checkout of ``relax/`` (make
one with ``git archive COMMIT relax | tar -x -C /tmp/relax-before``); every run starts two
Gloo ranks on 127.0.0.1 with that directory first on ``PYTHONPATH``, so they import that
state's checkpoint code and call it as its trainer does:

- a state with ``checkpoint.Checkpointer`` (sharded torch.distributed.checkpoint saves) saves
  through it, also once with ``async_save`` (then the table gives the time until training
  may continue and the time until the checkpoint is complete);
- an older state calls ``checkpoint.save_checkpoint`` (whole state gathered, rank 0
  ``torch.save`` and SHA-256 of every file).

Each rank loads the model, shards it with FSDP2 (``relax.trainer.distributed.wrap_model``),
takes one AdamW step so the optimizer state exists, then saves. Memory: the kernel's
high-water mark of the rank's resident set (``VmHWM``), reset just before the save
(``/proc/self/clear_refs``), minus the resident set just before it: what the save itself
adds on that rank. ::

    .venv/bin/python benchmarks/checkpoint_save.py --a /tmp/relax-before --b . \\
        --model models/SmolLM2-135M-Instruct --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def _rss_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current resident set


def worker(model_dir: str, save_dir: str, mode: str) -> None:
    """One rank: build, shard, step, save once; print one JSON line."""
    import torch
    import torch.distributed as dist

    from relax.models import load_policy, load_tokenizer
    from relax.trainer.distributed import init_distributed, wrap_model
    from relax.trainer.state import checkpoint

    ctx = init_distributed("cpu", 10)
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(model_dir)
    model = wrap_model(load_policy(model_dir, tokenizer, ctx.device, seed=0), ctx, fsdp=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    ids = ((torch.arange(16) + 7 * (ctx.rank + 1)) % vocab).view(1, 16)
    model(input_ids=ids).logits.float().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    meta = {"progress": {}, "config": {}}
    dist.barrier()
    before = _rss_kb("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    returned = None
    if hasattr(checkpoint, "Checkpointer"):
        from relax.trainer.policy.bundle import Policy

        policy = Policy(model=model, optimizer=optimizer, tokenizer=tokenizer, ctx=ctx, fsdp=True)
        saver = checkpoint.Checkpointer(save_dir, ctx, policy, fsdp=True,
                                        async_save=mode == "async")
        saver.save(1, meta=meta)
        returned = time.perf_counter() - start
        saver.wait()
    else:
        checkpoint.save_checkpoint(save_dir, model=model, optimizer=optimizer,
                                   tokenizer=tokenizer, step=1, ctx=ctx, fsdp=True, final=False,
                                   progress={}, extra={})
    dist.barrier()
    wall = time.perf_counter() - start
    peak = _rss_kb("VmHWM")
    print(json.dumps({"rank": ctx.rank, "wall_s": wall, "returned_s": returned,
                      "rss_before_mb": before / 1024, "save_peak_extra_mb": (peak - before) / 1024,
                      "sharded": hasattr(checkpoint, "Checkpointer")}), flush=True)
    dist.destroy_process_group()


def _reserve_port() -> socket.socket:
    """A port held bound (SO_REUSEADDR, not listening) until closed: rank 0's TCPStore binds
    it too, and no other process is handed it meanwhile (as relax/ports.py; a released port
    may be taken before rank 0 binds it; kept here since the arms import older trees)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def run_arm(state: str, model_dir: str, mode: str, workdir: str) -> list[dict]:
    save_dir = tempfile.mkdtemp(prefix="ckpt-", dir=workdir)
    reservation = _reserve_port()
    port = str(reservation.getsockname()[1])
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": os.path.abspath(state), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", model_dir, save_dir, mode],
            env=env, cwd=workdir, stdout=subprocess.PIPE, text=True))
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"a rank of {state} ({mode}) exited with {p.returncode}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    reservation.close()
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(save_dir)
               for f in fs)
    shutil.rmtree(save_dir)
    for row in rows:
        row["written_mb"] = size / 2**20
    return sorted(rows, key=lambda r: r["rank"])


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="directory of state A (before)")
    ap.add_argument("--b", required=True, help="directory of state B (after)")
    ap.add_argument("--model", required=True, help="a Hugging Face causal LM directory")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where the checkpoints go (removed after)")
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="ckpt-bench-")
    model = os.path.abspath(args.model)
    arms = [("A", args.a, "sync"), ("B", args.b, "sync"), ("B", args.b, "async")]
    results: dict[tuple[str, str], list[list[dict]]] = {}
    for repeat in range(args.repeats):
        for name, state, mode in arms:
            rows = run_arm(state, model, mode, workdir)
            results.setdefault((name, mode), []).append(rows)
            print(f"repeat {repeat + 1} {name} {mode}: " + "; ".join(
                f"rank {r['rank']} {r['wall_s']:.1f} s +{r['save_peak_extra_mb']:.0f} MB"
                for r in rows), file=sys.stderr, flush=True)
    print("| state | save | wall s (median) | returns after s | peak extra MB rank 0 | "
          "rank 1 | written MB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (name, mode), runs in results.items():
        wall = statistics.median(max(r["wall_s"] for r in rows) for rows in runs)
        back = [rows[0]["returned_s"] for rows in runs if rows[0]["returned_s"] is not None]
        peaks = [statistics.median(rows[k]["save_peak_extra_mb"] for rows in runs)
                 for k in (0, 1)]
        print(f"| {name} | {mode} | {wall:.1f} | "
              f"{statistics.median(back) if back else wall:.1f} | {peaks[0]:.0f} | "
              f"{peaks[1]:.0f} | {runs[0][0]['written_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
