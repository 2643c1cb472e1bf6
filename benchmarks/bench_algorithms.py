"""Algorithm-core speed and accuracy at B = 1024, T = 8192, fp32, on the CPU.

Not part of the test suite. Run:  .venv/bin/python benchmarks/bench_algorithms.py
(or `make bench`). Options: --batch, --length, --repeats, --threads.

Every variant is timed in the same process, interleaved round-robin (A, B, C, A, B, C, ...)
so machine noise hits all of them alike; the table quotes medians and two ratios:

* ``x copy``: to one ``clone()`` of a B x T fp32 tensor (a read, a write and the page faults
  of a fresh allocation: the memory floor any op that returns a new tensor pays);
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
    AdvantageSettings,
    compute_advantages_and_returns,
    ppo_clip_loss,
    response_mean,
)


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
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    p.add_argument("--loop-repeats", type=int, default=3, help="repeats of the slow loop variants")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T = args.batch, args.length
    rewards, old, ref, mask, group_index, adv = make_batch(B, T)
    lp = (old + 0.05 * torch.randn(B, T)).requires_grad_(True)

    rpp = lambda gamma: AdvantageSettings("reinforce_plus_plus", True, gamma, 0.01)  # noqa: E731
    base = AdvantageSettings("reinforce_plus_plus_baseline", True)

    def ppo_fwd_bwd():
        lp.grad = None
        pg, _ = ppo_clip_loss(lp, old, adv, mask)
        response_mean(pg, mask).backward()

    variants = {
        "copy (clone of B x T fp32)": lambda: old.clone(),
        "reinforce_plus_plus gamma=1": lambda: compute_advantages_and_returns(
            rpp(1.0), rewards, mask, old_log_probs=old, ref_log_probs=ref),
        "reinforce_plus_plus gamma=0.99": lambda: compute_advantages_and_returns(
            rpp(0.99), rewards, mask, old_log_probs=old, ref_log_probs=ref),
        "reinforce_plus_plus_baseline": lambda: compute_advantages_and_returns(
            base, rewards, mask, group_index=group_index),
        "ppo_clip_loss + response_mean fwd+bwd": ppo_fwd_bwd,
    }
    loops = {
        "reinforce_plus_plus gamma=1": lambda: loop_dispatch(rewards, old, ref, mask, 0.01, 1.0),
        "reinforce_plus_plus gamma=0.99": lambda: loop_dispatch(rewards, old, ref, mask, 0.01, 0.99),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    loop_times: dict[str, list[float]] = {k: [] for k in loops}
    for fn in variants.values():  # warm-up
        fn()
    for rep in range(args.repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        if rep < args.loop_repeats:
            for name, fn in loops.items():
                t0 = time.perf_counter()
                fn()
                loop_times[name].append(time.perf_counter() - t0)

    copy_ms = statistics.median(times["copy (clone of B x T fp32)"]) * 1e3
    print(f"B={B} T={T} fp32, torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"repeats={args.repeats} (loops {args.loop_repeats}), medians\n")
    print("| operation | median ms | x copy | x loop |")
    print("|---|---:|---:|---:|")
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        loop = f"{statistics.median(loop_times[name]) * 1e3 / ms:.1f}" if name in loop_times else "-"
        print(f"| {name} | {ms:.1f} | {ms / copy_ms:.1f} | {loop} |")
    for name, ts in loop_times.items():
        ms = statistics.median(ts) * 1e3
        print(f"| per-timestep loop: {name} | {ms:.1f} | {ms / copy_ms:.1f} | 1.0 |")

    print("\nfp32 returns vs the float64 definition (float64 per-timestep loop):")
    for gamma in (1.0, 0.99):
        ref64 = loop_returns(rewards.double(), old.double(), ref.double(), mask, 0.01, gamma)
        out = compute_advantages_and_returns(rpp(gamma), rewards, mask, old_log_probs=old, ref_log_probs=ref)
        err = (out.returns.double() - ref64).abs().max().item()
        print(f"  gamma={gamma}: max |G_fp32 - G_def| = {err:.2e} (max |G| = {ref64.abs().max().item():.2f})")


if __name__ == "__main__":
    main()
