"""The update's forward + backward and the no-grad log-prob pass of one micro-batch under each
``--pass-layout`` (and, for the packed ones, the pack attention as one SDPA over padded
segments or one SDPA per block / response), in one process, alternating, medians. A
micro-batch shaped like the TRL-comparison step's (docs/performance.md): ``--groups`` prompts
of ``--prompt-len`` tokens x ``--samples`` responses of 20..``--max-response`` tokens (seeded),
random token ids, on SmolLM2-135M-Instruct. Not part of the test suite::

    .venv/bin/python benchmarks/pack_passes.py --model models/SmolLM2-135M-Instruct --threads 1
    PYTHONPATH=/tmp/relax-before .venv/bin/python benchmarks/pack_passes.py ...  # an older tree

Times are the process's CPU seconds (``time.process_time``) with one thread, which a busy
machine does not stretch the way it stretches wall time (it still shares caches and memory
bandwidth); the wall seconds are printed beside them. A tree from before ``--pass-layout``
runs its own passes only (arm "before": padded responses, the prompt once per distinct prompt
through the KV cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from relax.config.sections import AlgorithmSection
from relax.models import load_policy, load_tokenizer
from relax.precision import autocast
from relax.trainer.experience import Experience
from relax.trainer.logprobs import response_log_probs

try:
    from relax.trainer import packing
except ImportError:  # a tree from before the packed passes
    packing = None

ARMS = (("padded", "padded", True), ("packed", "packed", True),
        ("shared-prefix/blocks", "shared-prefix", False),
        ("shared-prefix/segments", "shared-prefix", True))


def batch(a, vocab: int) -> Experience:
    g = torch.Generator().manual_seed(a.seed)
    rows = a.groups * a.samples
    P, T = a.prompt_len, a.max_response
    ids = torch.zeros(rows, P + T, dtype=torch.long)
    attention = torch.zeros(rows, P + T, dtype=torch.long)
    for i in range(rows):
        if i % a.samples == 0:
            prompt = torch.randint(3, vocab, (P,), generator=g)
        r = int(torch.randint(20, T + 1, (1,), generator=g))
        ids[i, :P] = prompt
        ids[i, P:P + r] = torch.randint(3, vocab, (r,), generator=g)
        attention[i, :P + r] = 1
    return Experience(ids, attention, (attention.cumsum(-1) - 1).clamp(min=0),
                      attention[:, P:].bool())


def timed(model, exp, layout: str | None, grad: bool, bf16: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one pass."""
    kw = {} if layout is None else {"layout": layout}
    cpu, wall = time.process_time(), time.perf_counter()
    with torch.set_grad_enabled(grad):
        logp, _ = response_log_probs(model, exp, bf16=bf16, with_entropy=grad, **kw)
        if grad:
            (logp * exp.response_mask).sum().backward()
    return time.process_time() - cpu, time.perf_counter() - wall


def whole_update(model, exp: Experience, repeats: int) -> list[float]:
    """CPU seconds of ``train_on_rollout`` over ``exp`` (GRPO, k3 KL loss 0.04, one AdamW
    step, micro-batches of 16): the update phase of the TRL-comparison step, loss and
    optimizer included, with this tree's default layout."""
    from relax.trainer.distributed import DistContext
    from relax.trainer.update import LossSettings, train_on_rollout

    g = torch.Generator().manual_seed(1)
    exp.ref_log_probs = -1.0 - torch.rand(exp.response_mask.shape, generator=g)
    exp.advantages = torch.where(exp.response_mask, torch.randn(exp.response_mask.shape,
                                                                generator=g), 0.0)
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    s = LossSettings(AlgorithmSection(estimator="grpo", use_kl_loss=True, kl_loss_type="k3",
                                      kl_loss_coef=0.04))
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    out = []
    for _ in range(repeats + 1):
        cpu = time.process_time()
        train_on_rollout(model, opt, exp, s, ctx, global_batch_size=len(exp),
                         micro_batch_size=16, clip_grad=1.0)
        out.append(time.process_time() - cpu)
    return out[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=44)
    p.add_argument("--max-response", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--whole-update", action="store_true",
                   help="time train_on_rollout over the batch instead (CPU seconds)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = load_policy(a.model, load_tokenizer(a.model), torch.device("cpu"), seed=0)
    exp = batch(a, model.config.vocab_size)
    if a.whole_update:
        runs = whole_update(model, exp, a.repeats)
        print(f"train_on_rollout, {len(exp)} rows: CPU s {[round(x, 2) for x in runs]}, "
              f"median {statistics.median(runs):.2f}, load {os.getloadavg()[0]:.2f}")
        return
    attended = int(exp.attention_mask.sum())
    print(f"threads {a.threads}, bf16 {a.bf16}, {len(exp)} rows, {attended} attended tokens "
          f"of {exp.attention_mask.numel()} slots, load {os.getloadavg()[0]:.2f}", flush=True)
    arms = ARMS if packing is not None else (("before", None, True),)
    times = {(name, grad): [] for name, _, _ in arms for grad in (False, True)}
    with autocast(torch.device("cpu"), False):
        for _ in range(a.repeats + 1):  # the first round warms up and is dropped
            for name, layout, batched in arms:
                if packing is not None:
                    packing.BATCHED_SEGMENTS = batched
                for grad in (False, True):
                    model.zero_grad(set_to_none=True)
                    times[(name, grad)].append(timed(model, exp, layout, grad, a.bf16))
    print("| layout | no-grad pass CPU s (wall) | forward + backward CPU s (wall) |")
    print("|---|---:|---:|")
    for name, _, _ in arms:
        cells = []
        for grad in (False, True):
            runs = times[(name, grad)][1:]
            cells.append(f"{statistics.median(c for c, _ in runs):.2f} "
                         f"({statistics.median(w for _, w in runs):.2f})")
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
