"""The update's forward + backward and the no-grad log-prob pass of one micro-batch under each
``--pass-layout`` (and, for the packed ones, the pack attention as one SDPA over padded
segments or one SDPA per block / response), in one process, alternating, medians, with each
pass's CPU and wall seconds and peak RSS. A micro-batch shaped like the TRL-comparison step's
(docs/performance.md): ``--groups`` prompts of ``--prompt-len`` tokens x ``--samples``
responses of 20..``--max-response`` tokens (seeded), random token ids, on
SmolLM2-135M-Instruct; ``--lengths longtail`` draws long-tailed responses (the long-response
step), ``--lengths episodes`` multi-turn episodes whose observation tokens the loss mask leaves
out (the GuessTheNumber step: the first turn is the prompt, the rest of the conversation the
response). Not part of the test suite::

    .venv/bin/python benchmarks/pack_passes.py --model models/SmolLM2-135M-Instruct --threads 1
    PYTHONPATH=/tmp/relax-before .venv/bin/python benchmarks/pack_passes.py ...  # an older tree

``--whole-update`` times ``train_on_rollout`` over the batch instead (loss and AdamW
included; ``--both-precisions`` alternates bf16 and fp32), and ``--whole-update --profile
OUT.md`` profiles one bf16 and one fp32 update by op and by phase
(benchmarks/update_profile.py). Peak RSS per pass: the kernel's high-water mark reset before
each pass (``/proc/self/clear_refs``, as benchmarks/profile_step.py does), so it includes what
the process holds at the pass's start (the "rise" column subtracts that).

Times are the process's CPU seconds (``time.process_time``) with one thread, which a busy
machine does not stretch the way it stretches wall time (it still shares caches and memory
bandwidth); the wall seconds are printed beside them. A tree from before ``--pass-layout``
runs its own passes only (arm "before": padded responses, the prompt once per distinct prompt
through the KV cache).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import time

import torch
from profile_step import GIB_PER_KB, status_kb  # benchmarks/, on the path as the script's folder

from relax.config.sections import AlgorithmSection
from relax.models import load_policy, load_tokenizer
from relax.precision import autocast
from relax.trainer.policy.experience import Experience
from relax.trainer.policy.logprobs import response_log_probs

try:
    from relax.trainer.policy import packing
except ImportError:  # a tree from before the packed passes
    packing = None

ARMS = (("padded", "padded", True), ("packed", "packed", True),
        ("shared-prefix/blocks", "shared-prefix", False),
        ("shared-prefix/segments", "shared-prefix", True))


def response_length(a, g: torch.Generator) -> int:
    """One response's length: uniform in [--min-response, --max-response], or ``longtail``:
    exp(N(log --median-response, --sigma)) clipped to that range (the defaults 250 / 2.0 give
    a mean of ~430 tokens and ~25% at a 1,024 cap, as in the long-response step of
    docs/performance.md "Where a long step goes")."""
    lo, hi = a.min_response, a.max_response
    if a.lengths == "longtail":
        x = math.exp(math.log(a.median_response) + a.sigma * float(torch.randn(1, generator=g)))
        return int(min(max(round(x), lo), hi))
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def episode(a, g: torch.Generator) -> tuple[int, list[tuple[int, bool]]]:
    """An episode's response as (tokens, trained) spans: 1..--turns model turns (uniform) of
    1..--turn-tokens tokens (uniform), each turn after the first preceded by an observation
    of --env-tokens tokens that the loss mask leaves out."""
    turns = int(torch.randint(1, a.turns + 1, (1,), generator=g))
    spans = []
    for t in range(turns):
        if t:
            spans.append((a.env_tokens, False))
        spans.append((int(torch.randint(1, a.turn_tokens + 1, (1,), generator=g)), True))
    return sum(n for n, _ in spans), spans


def batch(a, vocab: int) -> Experience:
    """``--groups`` prompts x ``--samples`` responses, seeded random ids, padded layout (the
    draws in the order of the first version of this script, so its batches are unchanged)."""
    g = torch.Generator().manual_seed(a.seed)
    drawn = []
    for i in range(a.groups * a.samples):
        if i % a.samples == 0:
            prompt = torch.randint(3, vocab, (a.prompt_len,), generator=g)
        r, spans = episode(a, g) if a.lengths == "episodes" else (response_length(a, g), None)
        drawn.append((prompt, torch.randint(3, vocab, (r,), generator=g), spans or [(r, True)]))
    # uniform: as wide as --max-response (as the first version); else as wide as the longest
    # response drawn, as a rollout's batch is
    longest = max(len(response) for _, response, _ in drawn)
    P, T = a.prompt_len, a.max_response if a.lengths == "uniform" else longest
    ids = torch.zeros(len(drawn), P + T, dtype=torch.long)
    attention = torch.zeros(len(drawn), P + T, dtype=torch.long)
    trained = torch.zeros(len(drawn), T, dtype=torch.bool)
    for i, (prompt, response, spans) in enumerate(drawn):
        ids[i, :P], ids[i, P:P + len(response)] = prompt, response
        attention[i, :P + len(response)] = 1
        at = 0
        for n, on in spans:
            trained[i, at:at + n] = on
            at += n
    return Experience(ids, attention, (attention.cumsum(-1) - 1).clamp(min=0), trained)


def reset_peak_rss() -> float:
    """Reset the kernel's peak RSS (VmHWM) to the current RSS; returns that RSS in GiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS") * GIB_PER_KB


def timed(model, exp, layout: str | None, grad: bool, bf16: bool,
          micro_batch: int) -> tuple[float, float, float, float]:
    """(CPU seconds, wall seconds, peak RSS GiB, its rise over the RSS at the start) of one
    pass over ``exp`` in micro-batches of ``micro_batch`` rows."""
    kw = {} if layout is None else {"layout": layout}
    start_rss = reset_peak_rss()
    cpu, wall = time.process_time(), time.perf_counter()
    for first in range(0, len(exp), micro_batch):
        mb = exp.rows(first, first + micro_batch)
        with torch.set_grad_enabled(grad):
            logp, _ = response_log_probs(model, mb, bf16=bf16, with_entropy=grad, **kw)
            if grad:
                (logp * mb.response_mask).sum().backward()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = status_kb("VmHWM") * GIB_PER_KB
    return cpu, wall, peak, peak - start_rss


def update_inputs(exp: Experience) -> None:
    """Seeded reference log-probs and advantages on ``exp`` (what the update's loss reads)."""
    g = torch.Generator().manual_seed(1)
    exp.ref_log_probs = -1.0 - torch.rand(exp.response_mask.shape, generator=g)
    exp.advantages = torch.where(exp.response_mask, torch.randn(exp.response_mask.shape,
                                                                generator=g), 0.0)


def settings(bf16: bool, layout: str | None):
    """GRPO with the k3 KL loss 0.04 (the TRL-comparison step), this tree's default layout
    unless ``layout`` is given."""
    from relax.trainer.policy.update import LossSettings

    kw = {} if layout is None else {"layout": layout}
    return LossSettings(AlgorithmSection(advantage_estimator="grpo", use_kl_loss=True,
                                         kl_loss_type="k3", kl_loss_coef=0.04), bf16=bf16, **kw)


def one_update(model, opt, exp: Experience, s) -> float:
    """CPU seconds of one ``train_on_rollout`` over ``exp`` (one AdamW step, lr 0, so every
    repeat sees the same parameters; micro-batches of 16)."""
    from relax.trainer.distributed import DistContext
    from relax.trainer.policy.update import train_on_rollout

    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    cpu = time.process_time()
    train_on_rollout(model, opt, exp, s, ctx, global_batch_size=len(exp), micro_batch_size=16,
                     clip_grad=1.0)
    return time.process_time() - cpu


@contextlib.contextmanager
def fp32_attention(on: bool):
    """An experiment, not the product's behaviour: a pack's attention (its one SDPA over the
    segments) on fp32 copies of bf16 queries, keys and values, the output cast back. The CPU's
    bf16 SDPA forward + backward takes about twice the fp32 one (docs/performance.md, "Where
    the bf16 update's time goes"); this measures what computing it in fp32 would save."""
    original = packing._segment_attention
    if on:
        def upcast(sdpa, query, key, value, seg):
            return original(sdpa, query.float(), key.float(), value.float(),
                            seg).to(query.dtype)
        packing._segment_attention = upcast
    try:
        yield
    finally:
        packing._segment_attention = original


def whole_update(model, exp: Experience, repeats: int, arms, layout) -> dict:
    """{arm: CPU seconds of each repeat of ``train_on_rollout`` over ``exp``}: the update
    phase of the TRL-comparison step, loss and optimizer included; ``arms`` (name, bf16,
    fp32 attention) alternating after one warm-up update each."""
    update_inputs(exp)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    out = {name: [] for name, _, _ in arms}
    for _ in range(repeats + 1):
        for name, bf16, upcast in arms:
            with fp32_attention(upcast):
                out[name].append(one_update(model, opt, exp, settings(bf16, layout)))
    return {name: runs[1:] for name, runs in out.items()}


def profile_updates(model, exp: Experience, layout, path: str) -> None:
    """torch.profiler over one update in bf16 and one in fp32 (each after a warm-up update);
    the table of benchmarks/update_profile.py to ``path``."""
    import update_profile

    update_inputs(exp)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    results = {}
    with update_profile.labelled():
        for name, bf16 in (("bf16", True), ("fp32", False)):
            s = settings(bf16, layout)
            one_update(model, opt, exp, s)
            results[name] = update_profile.profiled(lambda s=s: one_update(model, opt, exp, s))
    text = update_profile.table(results)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=44)
    p.add_argument("--lengths", choices=("uniform", "longtail", "episodes"), default="uniform",
                   help="response lengths: uniform in [--min-response, --max-response] (the "
                   "batch as wide as --max-response); longtail: lognormal (--median-response, "
                   "--sigma) clipped to that range; episodes: multi-turn (--turns, "
                   "--turn-tokens, --env-tokens), observation tokens masked out of the loss")
    p.add_argument("--min-response", type=int, default=20)
    p.add_argument("--max-response", type=int, default=64)
    p.add_argument("--median-response", type=float, default=250.0)
    p.add_argument("--sigma", type=float, default=2.0)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--env-tokens", type=int, default=30)
    p.add_argument("--micro-batch", type=int, default=0,
                   help="rows per micro-batch of the passes (0: all rows at once)")
    p.add_argument("--arms", default="",
                   help="comma-separated arms to run (default: all of " +
                   ", ".join(n for n, _, _ in ARMS) + ")")
    p.add_argument("--recompute", action="store_true",
                   help="--recompute-granularity full (every decoder layer recomputed)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="rounds of the layout comparison run first and dropped")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--whole-update", action="store_true",
                   help="time train_on_rollout over the batch instead (CPU seconds)")
    p.add_argument("--both-precisions", action="store_true",
                   help="with --whole-update: bf16 and fp32 alternating")
    p.add_argument("--fp32-attention", action="store_true",
                   help="with --whole-update: also a bf16 arm whose pack attention runs on fp32 "
                   "copies (an experiment; needs a packed layout)")
    p.add_argument("--layout", default=None,
                   help="with --whole-update: --pass-layout (default: this tree's default)")
    p.add_argument("--profile", metavar="OUT.md",
                   help="with --whole-update: profile one bf16 and one fp32 update instead "
                   "(benchmarks/update_profile.py) and write the table to OUT.md")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = load_policy(a.model, load_tokenizer(a.model), torch.device("cpu"), seed=0)
    if a.recompute:
        from relax.config.sections import RecomputeSection
        from relax.trainer.policy.recompute import apply_recompute

        apply_recompute(model, RecomputeSection(recompute_granularity="full"))
    exp = batch(a, model.config.vocab_size)
    attended = int(exp.attention_mask.sum())
    lengths = exp.attention_mask[:, a.prompt_len:].sum(1).tolist()
    print(f"threads {a.threads}, bf16 {a.bf16}, {len(exp)} rows, {attended} attended tokens "
          f"of {exp.attention_mask.numel()} slots, {int(exp.response_mask.sum())} trained "
          f"response tokens, response lengths {lengths}, load {os.getloadavg()[0]:.2f}",
          flush=True)
    if a.profile:
        profile_updates(model, exp, a.layout, a.profile)
        return
    if a.whole_update:
        arms = ((("bf16", True, False), ("fp32", False, False)) if a.both_precisions
                else (("bf16" if a.bf16 else "fp32", a.bf16, False),))
        if a.fp32_attention:
            arms += (("bf16, fp32 attention", True, True),)
        for name, runs in whole_update(model, exp, a.repeats, arms, a.layout).items():
            print(f"train_on_rollout, {len(exp)} rows, {name}: CPU s "
                  f"{[round(x, 2) for x in runs]}, median {statistics.median(runs):.2f}")
        print(f"load {os.getloadavg()[0]:.2f}")
        return
    compare_layouts(model, exp, a)


def compare_layouts(model, exp: Experience, a) -> None:
    """The no-grad pass and the forward + backward under each arm, alternating, medians."""
    arms = ARMS if packing is not None else (("before", None, True),)
    if a.arms:
        arms = [arm for arm in arms if arm[0] in a.arms.split(",")]
    micro_batch = a.micro_batch or len(exp)
    times = {(name, grad): [] for name, _, _ in arms for grad in (False, True)}
    with autocast(torch.device("cpu"), False):
        for _ in range(a.repeats + a.warmup):  # the warm-up rounds are dropped
            for name, layout, batched in arms:
                if packing is not None:
                    packing.BATCHED_SEGMENTS = batched
                for grad in (False, True):
                    model.zero_grad(set_to_none=True)
                    times[(name, grad)].append(timed(model, exp, layout, grad, a.bf16,
                                                     micro_batch))
                    print(name, "grad" if grad else "no-grad",
                          [round(x, 2) for x in times[(name, grad)][-1]], flush=True)
    print("| layout | no-grad pass CPU s (wall) | forward + backward CPU s (wall) "
          "| no-grad peak RSS GiB (rise) | forward + backward peak RSS GiB (rise) |")
    print("|---|---:|---:|---:|---:|")
    for name, _, _ in arms:
        cells, memory = [], []
        for grad in (False, True):
            runs = times[(name, grad)][a.warmup:]
            cells.append(f"{statistics.median(r[0] for r in runs):.2f} "
                         f"({statistics.median(r[1] for r in runs):.2f})")
            memory.append(f"{statistics.median(r[2] for r in runs):.2f} "
                          f"({statistics.median(r[3] for r in runs):.2f})")
        print(f"| {name} | {cells[0]} | {cells[1]} | {memory[0]} | {memory[1]} |")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
