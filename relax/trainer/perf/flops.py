"""Model FLOPs of a rollout step against the machine's limits: ``perf/*_mfu`` and the decode's
fraction of the memory-bandwidth roofline (formulas: docs/performance.md, "Distance to the
limit").

Forward FLOPs of one sequence of ``n`` attended tokens whose last ``k`` positions produce
logits (a matmul of an ``a x b`` weight costs ``2ab`` FLOPs per token)::

    F(n, k) = 2 * W_body * n  +  2 * W_head * k  +  4 * L * d_attn * n^2

``W_body``: weights of every Linear layer but the output layer (and in a mixture of experts
the router and the ``top_k`` experts a token runs: its active weights); ``W_head``: the output layer
(``V x H``, counted once when tied to the embedding, whose lookup costs nothing); ``L`` layers
of attention ``d_attn = heads x head_dim`` wide, scores and values over the full ``n x n``
(the common convention; a causal kernel does about half). A backward costs twice a forward.
Per rollout step, ``F`` summed over the rows: generation ``F`` (prefill and decode together),
each no-grad log-prob pass ``F``, the update ``F x (3 - 2 s)`` with ``s`` the share of rows
whose backward is skipped. Recomputation (the chunked output layer) is not model FLOPs.

A prompt the passes share (``--pass-layout shared-prefix``, relax/trainer/policy/packing.py; the
decode engine's prefill) counts once per group: a group of ``n >= 2`` rows with a prompt of
``p`` tokens and responses of ``r_j`` tokens executes::

    G = 2 * W_body * (p + sum r_j)  +  2 * W_head * sum r_j  +  4 * L * d_attn * (p^2 + sum r_j (p + r_j))

(the prompt's scores over itself, each response's over the prompt and itself: what the packed
attention computes), and a group of one row ``F(p + r, r)``. Rows are grouped by equal prompt
over the rank's batch, as the passes group them when a group's rows share a micro-batch (the
default micro-batch holds whole groups; a group that token budgets split runs its prompt once
per part, slightly more than counted).

The peak is measured on the run's device and dtype (the best of a few square matmuls), unless
a flag, the environment or a known GPU's data sheet gives it (relax/trainer/perf/limits.py, which
also keeps the best of the start-up and per-step measurements: a busy machine measures low).
Decoding reads every weight once per step, so its roofline is ``decode steps x weight bytes /
time`` against a measured copy bandwidth. Both measurements can be replaced by known figures
through the environment (``RELAX_PEAK_TFLOPS``, ``RELAX_MEMORY_BANDWIDTH_GBPS``): a short run
or a test suite need not spend a second on them.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch

from relax.errors import InputError

# Known limits instead of the start-up measurements (docs/performance.md); --peak-tflops,
# when given, still wins over PEAK_ENV.
PEAK_ENV = "RELAX_PEAK_TFLOPS"  # TFLOP/s per rank in the run's compute dtype
BANDWIDTH_ENV = "RELAX_MEMORY_BANDWIDTH_GBPS"  # copy bandwidth in GB/s (1e9 bytes/s)


def _active_expert_weights(model) -> int:
    """Weights a token multiplies in the mixture-of-experts layers, which are not Linear
    modules: the router (E x H) and ``top_k`` experts' gate / up / down projections."""
    from relax.rollout.generation.experts import is_sparse_block

    total = 0
    for m in model.modules():
        if is_sparse_block(m):
            per_expert = m.experts.gate_up_proj[0].numel() + m.experts.down_proj[0].numel()
            total += m.gate.weight.numel() + m.gate.top_k * per_expert
    return total


@dataclass(frozen=True)
class ModelShape:
    body_weights: int
    head_weights: int
    layers: int
    attn_width: int
    weight_bytes: int  # what one decode step reads: every parameter once, in its stored dtype

    @classmethod
    def of(cls, model) -> ModelShape:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        head_weights = head.weight.numel() if isinstance(head, torch.nn.Linear) else 0
        body = sum(m.weight.numel() for m in linears if m is not head) + _active_expert_weights(
            model)
        cfg = model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        seen, size = set(), 0
        for p in model.parameters():
            if id(p) not in seen:  # a tied weight is read once
                seen.add(id(p))
                size += p.numel() * p.element_size()
        return cls(body, head_weights, cfg.num_hidden_layers, heads * head_dim, size)

    def forward_flops(self, lengths: torch.Tensor, kept: torch.Tensor) -> float:
        """Forward FLOPs of rows of ``lengths`` [B] attended tokens, ``kept`` [B] of which
        produce logits (see the module docstring)."""
        n = lengths.double()
        return float((2 * self.body_weights * n + 2 * self.head_weights * kept.double()
                      + 4 * self.layers * self.attn_width * n * n).sum())

    def shared_forward_flops(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                             responses: torch.Tensor) -> float:
        """Forward FLOPs of rows [B] (left-padded ``prompt_ids`` / ``prompt_mask`` [B, P],
        ``responses`` [B] attended response tokens, all producing logits) whose groups of equal
        prompts run the prompt once (``G`` of the module docstring)."""
        key = torch.cat([prompt_ids, prompt_mask.long()], dim=1)
        inverse = torch.unique(key, dim=0, return_inverse=True)[1]
        p_rows = prompt_mask.sum(-1).double()
        r = responses.double()
        groups = int(inverse.max()) + 1 if len(inverse) else 0
        zeros = torch.zeros(groups, dtype=torch.float64, device=r.device)
        count = zeros.index_add(0, inverse, torch.ones_like(r))
        p = zeros.scatter(0, inverse, p_rows)  # equal prompts: equal lengths
        r_sum = zeros.index_add(0, inverse, r)
        pairs = zeros.index_add(0, inverse, r * (p_rows + r))
        shared = (2 * self.body_weights * (p + r_sum) + 2 * self.head_weights * r_sum
                  + 4 * self.layers * self.attn_width * (p * p + pairs))
        n = p + r_sum  # a group of one: F(p + r, r)
        alone = (2 * self.body_weights * n + 2 * self.head_weights * r_sum
                 + 4 * self.layers * self.attn_width * n * n)
        return float(torch.where(count > 1, shared, alone).sum())


def phase_metrics(forward: float, *, log_prob_passes: int, skipped_fraction: float,
                  generate_forward: float | None = None,
                  times: dict[str, float], peak_flops: float, decode_steps: int,
                  weight_bytes: int, bandwidth: float) -> dict[str, float]:
    """``perf/mfu`` (all model FLOPs of the step over its time), ``perf/update_mfu``,
    ``perf/log_prob_mfu`` and ``perf/generate_bandwidth_fraction``.

    ``forward`` is the forward FLOPs of the rows the step trains on, summed over every rank
    (``generate_forward`` those of every generated row when dynamic sampling filtered some), and
    ``peak_flops`` the peak of all ranks together; ``times`` holds ``step``, ``update``,
    ``log_prob`` and ``generate`` seconds (the slowest rank's); ``decode_steps`` x
    ``weight_bytes`` is what one rank's decode read in ``times["generate"]``.
    """
    flops = {"generate": forward if generate_forward is None else generate_forward,
             "log_prob": forward * log_prob_passes,
             "update": forward * (3 - 2 * skipped_fraction)}
    out = {}
    if times.get("step", 0) > 0:
        out["perf/mfu"] = sum(flops.values()) / (times["step"] * peak_flops)
    for phase in ("update", "log_prob"):
        if times.get(phase, 0) > 0 and flops[phase] > 0:
            out[f"perf/{phase}_mfu"] = flops[phase] / (times[phase] * peak_flops)
    if times.get("generate", 0) > 0:
        out["perf/generate_bandwidth_fraction"] = (
            decode_steps * weight_bytes / times["generate"] / bandwidth)
    return out


def given_limit(name: str) -> float | None:
    """The positive number the environment variable ``name`` holds, None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{name}={raw!r}: must be a number > 0; unset it to measure at "
                         "start-up")
    return value


def _best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: allocation, thread pool
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_flops(device: torch.device, bf16: bool, size: int = 1024,
                       repeats: int = 5) -> float:
    """FLOP/s of a square matmul in the run's compute dtype (best of ``repeats``), or
    ``RELAX_PEAK_TFLOPS`` x 1e12 when that is set (nothing is measured then)."""
    given = given_limit(PEAK_ENV)
    if given is not None:
        return given * 1e12
    dtype = torch.bfloat16 if bf16 else torch.float32
    if device.type == "cuda":
        size = max(size, 8192)  # a small product does not fill a GPU
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)

    def product():
        a @ b
        _sync(device)

    return 2 * size ** 3 / _best_seconds(product, repeats)


def measure_bandwidth(device: torch.device, megabytes: int = 128, repeats: int = 3) -> float:
    """Bytes/s of a large copy (read + write), the decode's roofline (best of ``repeats``), or
    ``RELAX_MEMORY_BANDWIDTH_GBPS`` x 1e9 when that is set (nothing is measured then)."""
    given = given_limit(BANDWIDTH_ENV)
    if given is not None:
        return given * 1e9
    src = torch.empty(megabytes << 18, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)
        _sync(device)

    return 2 * src.numel() * 4 / _best_seconds(copy, repeats)
