"""Where one ``train_on_rollout`` spends its CPU time, by op and by phase: torch.profiler over
the update, each op's self time put in one group of the table below. Used by
``benchmarks/pack_passes.py --whole-update --profile OUT.md`` (bf16 and fp32 side by side).

Phases come from labels this module puts around the update's functions for the profiled run
only (:func:`labelled`): the model forward up to the final hidden states (``response_rows``),
one chunk of the output layer and its log-softmax (``_chunk_log_probs``, which the backward
runs again: the chunk is a checkpoint), the pack's attention (``block_attention``: the segment
gathers and SDPA; transformers' own SDPA on padded rows), the rest of ``micro_batch_loss`` (the
policy and KL loss terms and metrics), ``_clip_and_reduce`` (gradient norm and clip) and
AdamW's step. A backward op belongs to the phase of the forward op that recorded its node
(the profiler's sequence numbers pair them); a backward op inside the output-layer label is
the chunk's recompute. Kinds: matrix products (``aten::mm`` / ``bmm`` / ``addmm``, their FLOPs
from the recorded shapes), SDPA kernels, dtype casts (``aten::_to_copy`` and what runs inside
it) and the rest.

The profiler's times are the thread's wall time inside each op; on a busy machine they include
time the thread waited for a core, spread over the ops roughly in proportion. So the table
gives each group's fraction of the profiled total, and seconds as that fraction of the update's
process CPU time (``time.process_time``), which waiting does not stretch.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict

from torch.profiler import ProfilerActivity, profile, record_function

MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addmv", "aten::mv")
BACKWARD = "autograd::engine::evaluate_function: "
# the rows of the table, in order: (group, what it holds)
GROUPS = (
    ("model matmuls, forward", "the decoder's linear layers (q/k/v/o, MLP), forward"),
    ("model matmuls, backward", "their input and weight gradients"),
    ("attention", "segment gathers, SDPA forward and backward"),
    ("output layer matmuls", "the chunked [n, H] x [H, V] products: forward, recompute, backward"),
    ("output layer log-softmax", "logsumexp, gather, entropy and their backward, in fp32"),
    ("casts", "aten::_to_copy: autocast's weight / activation casts, their backward, .float()"),
    ("loss", "policy and KL loss terms, metrics (forward + backward)"),
    ("model, other", "norms, activations, rotary, embedding, residual adds (forward + backward)"),
    ("gradient accumulation", "AccumulateGrad: each micro-batch's gradients added to .grad"),
    ("gradient clip + reduce", "the gradient norm over all parameters and the clip"),
    ("optimizer step", "AdamW over the fp32 parameters"),
    ("other", "autograd bookkeeping, packing, zero_grad, micro-batch slicing"),
)
LABELS = {"relax:model": "model", "relax:output_layer": "output", "relax:attention": "attention",
          "relax:loss": "loss", "relax:clip": "clip"}


def _wrap(owner, name: str, label: str, stack: contextlib.ExitStack) -> None:
    """``owner.name`` under ``record_function(label)`` until ``stack`` closes."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        with record_function(label):
            return original(*args, **kwargs)

    setattr(owner, name, wrapped)
    stack.callback(setattr, owner, name, original)


@contextlib.contextmanager
def labelled():
    """The update's functions under the labels of :data:`LABELS` (module attributes swapped
    for this context only; the packed attention function is registered by reference on the
    first packed pass, so this must be entered before the model's first pass)."""
    from relax.trainer.policy import logprobs, packing, update

    with contextlib.ExitStack() as stack:
        for owner, name in ((update, "response_rows"), (logprobs, "response_rows")):
            _wrap(owner, name, "relax:model", stack)
        _wrap(logprobs, "_chunk_log_probs", "relax:output_layer", stack)
        _wrap(packing, "block_attention", "relax:attention", stack)
        _wrap(update, "micro_batch_loss", "relax:loss", stack)
        _wrap(update, "_clip_and_reduce", "relax:clip", stack)
        yield


def profiled(fn):
    """(profiler events, process CPU seconds, wall seconds) of ``fn()``."""
    import time

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return prof.events(), cpu, wall


def _ancestors(e):
    while e is not None:
        yield e
        e = e.cpu_parent


def _label(e) -> str | None:
    return next((LABELS[a.name] for a in _ancestors(e) if a.name in LABELS), None)


def matmul_flops(e) -> float:
    """FLOPs of one matrix-product event from its recorded input shapes."""
    shapes = [s for s in e.input_shapes if s]
    if e.name in ("aten::addmm", "aten::baddbmm", "aten::addmv"):
        shapes = shapes[1:]  # the bias / input added comes first
    if len(shapes) < 2:
        return 0.0
    a, b = shapes[0], shapes[1]
    batch = a[0] if len(a) == 3 else 1
    n = b[-1] if len(b) >= 2 else 1
    return 2.0 * batch * a[-2] * a[-1] * n if len(a) >= 2 else 2.0 * a[-1] * n


def classify(events):
    """{group: [self microseconds, matmul FLOPs]}, {op name: self microseconds} and
    {(group, op, shapes, backward): [calls, self microseconds, FLOPs]} of the matrix products,
    over the events of one profiled update."""
    forward_phase = {}  # sequence number -> label of the forward op that recorded the node
    for e in events:
        if e.sequence_nr >= 0 and not any(a.name.startswith(BACKWARD) for a in _ancestors(e)):
            forward_phase.setdefault(e.sequence_nr, _label(e))
    groups = defaultdict(lambda: [0.0, 0.0])
    ops = defaultdict(float)
    shapes = defaultdict(lambda: [0, 0.0, 0.0])
    for e in events:
        us = e.self_cpu_time_total
        if us <= 0:
            continue
        ops[e.name] += us
        group = _group(e, forward_phase)
        groups[group][0] += us
        if e.name in MATMULS:
            flops = matmul_flops(e)
            groups[group][1] += flops
            backward = any(a.name.startswith(BACKWARD) for a in _ancestors(e))
            row = shapes[(group, e.name, str([s for s in e.input_shapes if s]), backward)]
            row[0], row[1], row[2] = row[0] + 1, row[1] + us, row[2] + flops
    return groups, ops, shapes


def _group(e, forward_phase) -> str:
    """The row of :data:`GROUPS` that event ``e``'s self time belongs to."""
    chain = list(_ancestors(e))
    names = [a.name for a in chain]
    if any(n.startswith("Optimizer.step") for n in names):
        return "optimizer step"
    label = _label(e)
    node = next((a for a in chain if a.name.startswith(BACKWARD)), None)
    backward = node is not None
    if backward and label != "output":  # a recompute keeps its forward label
        label = forward_phase.get(node.sequence_nr)
    if "aten::_to_copy" in names:
        return "casts"
    if any("AccumulateGrad" in n for n in names):
        return "gradient accumulation"
    if label == "clip":
        return "gradient clip + reduce"
    if label == "attention" or any("scaled_dot_product" in n for n in names):
        return "attention"
    if label == "output":
        return "output layer matmuls" if e.name in MATMULS else "output layer log-softmax"
    if label == "model":
        if e.name in MATMULS:
            return "model matmuls, backward" if backward else "model matmuls, forward"
        return "model, other"
    if label == "loss":
        return "loss"
    return "other"


def table(results: dict, top: int = 15) -> str:
    """Markdown: the groups of each precision's profiled update side by side, then the ops
    with the most self time. ``results``: {name: (events, CPU s, wall s)}."""
    names = list(results)
    parsed = {k: classify(ev) for k, (ev, _, _) in results.items()}
    totals = {k: sum(v[0] for v in parsed[k][0].values()) for k in names}
    cpu = {k: results[k][1] for k in names}
    head = " | ".join(f"{k}: CPU s | {k}: share | {k}: GFLOP/s" for k in names)
    lines = [f"| group | {head} | what |", "|---|" + "---:|---:|---:|" * len(names) + "---|"]
    for group, what in GROUPS:
        cells = []
        for k in names:
            us, flops = parsed[k][0].get(group, (0.0, 0.0))
            share = us / totals[k]
            rate = f"{flops / (share * cpu[k]) / 1e9:.1f}" if flops else ""
            cells.append(f"{share * cpu[k]:.2f} | {share:.1%} | {rate}")
        lines.append(f"| {group} | {' | '.join(cells)} | {what} |")
    lines.append("| **update** | " + " | ".join(
        f"**{cpu[k]:.2f}** | 100% | " for k in names) + " | process CPU s (wall s: "
        + ", ".join(f"{results[k][2]:.1f}" for k in names) + ") |")
    lines += ["", _outside(parsed, totals, cpu), "", _ops(parsed, totals, cpu, top)]
    for k in names:
        lines += ["", _shapes(k, parsed[k][2], totals[k], cpu[k])]
    return "\n".join(lines)


def _shapes(name: str, shapes: dict, total: float, cpu: float, top: int = 12) -> str:
    """The ``top`` matrix-product shapes of one precision by time: calls, CPU s, GFLOP/s (per
    CPU second: the profiler's time scaled to the update's CPU time)."""
    lines = [f"| {name}: matmul (group, op, input shapes, in a backward) | calls | CPU s "
             "| GFLOP/s |", "|---|---:|---:|---:|"]
    for key in sorted(shapes, key=lambda k: shapes[k][1], reverse=True)[:top]:
        calls, us, flops = shapes[key]
        group, op, dims, backward = key
        lines.append(f"| {group}, `{op}` {dims}{', backward' if backward else ''} | {calls} "
                     f"| {us / total * cpu:.2f} | {flops / (us / total * cpu) / 1e9:.1f} |")
    return "\n".join(lines)


def _outside(parsed, totals, cpu) -> str:
    """One line per precision: the update's CPU s in matrix products and outside them."""
    out = []
    for k in parsed:
        groups = parsed[k][0]
        mm = sum(groups.get(g, (0.0,))[0] for g in ("model matmuls, forward",
                                                     "model matmuls, backward",
                                                     "output layer matmuls"))
        flops = sum(v[1] for v in groups.values())
        share = mm / totals[k]
        out.append(f"- {k}: matrix products {share * cpu[k]:.2f} s ({share:.0%}, "
                   f"{flops / 1e9:.0f} GFLOP at {flops / max(share * cpu[k], 1e-9) / 1e9:.1f} GFLOP/s "
                   "of CPU time), outside "
                   f"them {(1 - share) * cpu[k]:.2f} s ({1 - share:.0%})")
    return "\n".join(out)


def _ops(parsed, totals, cpu, top: int) -> str:
    """The ``top`` ops by self time (over all precisions), CPU s of each precision."""
    names = list(parsed)
    score = defaultdict(float)
    for k in names:
        for op, us in parsed[k][1].items():
            score[op] += us / totals[k]
    lines = ["| op (self time) | " + " | ".join(f"{k}: CPU s (share)" for k in names) + " |",
             "|---|" + "---:|" * len(names)]
    for op in sorted(score, key=score.get, reverse=True)[:top]:
        cells = [f"{parsed[k][1].get(op, 0.0) / totals[k] * cpu[k]:.2f} "
                 f"({parsed[k][1].get(op, 0.0) / totals[k]:.1%})" for k in names]
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
