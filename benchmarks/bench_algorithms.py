"""Algorithm-core speed and accuracy at B = 1024, T = 8192, fp32, on the CPU.

Not part of the test suite. Run:  .venv/bin/python benchmarks/bench_algorithms.py
(or `make bench`). Options: --batch, --length, --repeats, --threads.

Every variant is timed in the same process, interleaved round-robin (A, B, C, A, B, C, ...)
so machine noise hits all of them alike; the table quotes the median and the minimum of the
repeats (the minimum is the least disturbed by other processes) and two ratios:

* ``x copy``: to one ``clone()`` of a B x T fp32 tensor (a read, a write and the page faults
  of a fresh allocation: the memory floor any op that returns a new tensor pays), timed
  just before every run of every operation. Both ratio columns divide by the *median* copy:
  "median" is the operation's median run, "min" its best (least disturbed) run. The copy's
  own minimum is printed but not used: on the VMs measured, a clone is bimodal (~2 ms when
  its 32 MB happen to come back already faulted in, 10-30 ms otherwise), so a min-over-min
  ratio would compare an operation with a copy that skipped the page faults;
* ``x loop``: to the per-timestep Python loop peer frameworks use for the same result.

It also prints the accuracy of the fp32 REINFORCE++ returns against the float64 definition
(evaluated by the float64 per-timestep loop) at gamma 1 and 0.99.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from relax.algorithms import (
    compute_advantages_and_returns,
    gspo_loss,
    ppo_clip_loss,
    response_mean,
    sapo_loss,
)
from relax.config.sections import AlgorithmSection


def loop_returns(rewards, old, ref, mask, kl_coef, gamma):
    """Peer-framework style: shaped reward, then a backward loop over timesteps."""
    m = mask.to(old.dtype)
    r = -kl_coef * (old - ref) * m
    last = (mask.cumsum(1) == mask.sum(1, keepdim=True)) & mask
    r = r + last.to(r.dtype) * rewards[:, None]
    out = torch.zeros_like(r)
    running = torch.zeros_like(rewards)
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return out * m


def loop_dispatch(rewards, old, ref, mask, kl_coef, gamma):
    """The loop returns plus a naive masked normalization (what the loop variant would run)."""
    G = loop_returns(rewards, old, ref, mask, kl_coef, gamma)
    m = mask.to(G.dtype)
    n = m.sum()
    mu = (G * m).sum() / n
    var = (((G - mu) * m) ** 2).sum() / n
    return (G - mu) * torch.rsqrt(var.clamp(min=1e-8)) * m


def make_batch(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    holes = torch.rand(B, T, generator=g) < 0.02
    mask &= ~holes
    old = -torch.rand(B, T, generator=g) * 3
    ref = old + 0.1 * torch.randn(B, T, generator=g)
    rewards = (torch.rand(B, generator=g) < 0.5).float()
    group_index = torch.arange(B) // 8
    adv = torch.randn(B, T, generator=g)
    return rewards, old, ref, mask, group_index, adv


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    p.add_argument("--loop-repeats", type=int, default=3, help="repeats of the slow loop variants")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T = args.batch, args.length
    rewards, old, ref, mask, group_index, adv = make_batch(B, T)
    lp = (old + 0.05 * torch.randn(B, T)).requires_grad_(True)

    rpp = lambda gamma: AlgorithmSection("reinforce_plus_plus", True, gamma, 0.01)  # noqa: E731
    base = AlgorithmSection("reinforce_plus_plus_baseline", True)

    def loss_fwd_bwd(loss, **kw):
        def run():
            lp.grad = None
            pg = loss(lp, old, adv, mask, **kw)
            response_mean(pg[0] if isinstance(pg, tuple) else pg, mask).backward()
        return run

    variants = {
        "copy (clone of B x T fp32)": lambda: old.clone(),
        "reinforce_plus_plus gamma=1": lambda: compute_advantages_and_returns(
            rpp(1.0), rewards, mask, old_log_probs=old, ref_log_probs=ref),
        "reinforce_plus_plus gamma=0.99": lambda: compute_advantages_and_returns(
            rpp(0.99), rewards, mask, old_log_probs=old, ref_log_probs=ref),
        "reinforce_plus_plus_baseline": lambda: compute_advantages_and_returns(
            base, rewards, mask, group_index=group_index),
        "ppo_clip_loss + response_mean fwd+bwd": loss_fwd_bwd(ppo_clip_loss),
        "gspo_loss + response_mean fwd+bwd": loss_fwd_bwd(gspo_loss, eps_clip=0.2),
        "sapo_loss + response_mean fwd+bwd": loss_fwd_bwd(sapo_loss),
    }
    loops = {
        "reinforce_plus_plus gamma=1": lambda: loop_dispatch(rewards, old, ref, mask, 0.01, 1.0),
        "reinforce_plus_plus gamma=0.99": lambda: loop_dispatch(rewards, old, ref, mask, 0.01, 0.99),
    }
    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    copy = variants.pop("copy (clone of B x T fp32)")
    times: dict[str, list[float]] = {k: [] for k in variants}
    copies: list[float] = []
    loop_times: dict[str, list[float]] = {k: [] for k in loops}
    for fn in (copy, *variants.values()):  # warm-up
        fn()
    for rep in range(args.repeats):
        for name, fn in variants.items():
            copies.append(timed(copy))  # a copy before every run: the reference sees the same load
            times[name].append(timed(fn))
        if rep < args.loop_repeats:
            for name, fn in loops.items():
                loop_times[name].append(timed(fn))

    med = statistics.median
    c_med, c_min = med(copies), min(copies)
    print(f"B={B} T={T} fp32, torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"repeats={args.repeats} (loops {args.loop_repeats}), copy timed {len(copies)} times\n")
    print("| operation | median ms | min ms | x copy (median) | x copy (min) | x loop (median) |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| copy (clone of B x T fp32) | {c_med * 1e3:.1f} | {c_min * 1e3:.1f} | 1.0 | - | - |")
    for name, ts in times.items():
        loop = f"{med(loop_times[name]) / med(ts):.1f}" if loop_times.get(name) else "-"
        print(f"| {name} | {med(ts) * 1e3:.1f} | {min(ts) * 1e3:.1f} | {med(ts) / c_med:.1f} | "
              f"{min(ts) / c_med:.1f} | {loop} |")
    for name, ts in loop_times.items():
        if ts:
            print(f"| per-timestep loop: {name} | {med(ts) * 1e3:.1f} | {min(ts) * 1e3:.1f} | "
                  f"{med(ts) / c_med:.1f} | {min(ts) / c_med:.1f} | 1.0 |")

    print("\nfp32 returns vs the float64 definition (float64 per-timestep loop):")
    for gamma in (1.0, 0.99):
        ref64 = loop_returns(rewards.double(), old.double(), ref.double(), mask, 0.01, gamma)
        out = compute_advantages_and_returns(rpp(gamma), rewards, mask, old_log_probs=old, ref_log_probs=ref)
        err = (out.returns.double() - ref64).abs().max().item()
        print(f"  gamma={gamma}: max |G_fp32 - G_def| = {err:.2e} (max |G| = {ref64.abs().max().item():.2f})")


if __name__ == "__main__":
    main()
