"""perf/*_mfu: the model-FLOP formula against PyTorch's own FLOP counter, the per-phase
arithmetic, and the start-up measurements of the device's limits."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from relax.errors import InputError
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.perf.flops import (
    BANDWIDTH_ENV,
    PEAK_ENV,
    ModelShape,
    measure_bandwidth,
    measure_peak_flops,
    phase_metrics,
)


@pytest.mark.parametrize("tied", [True, False])
def test_forward_flops_equal_the_counted_matmuls(tied):
    """No padding, eager attention (scores and values over the full n x n, as the formula
    counts): the formula equals what FlopCounterMode counts in the model's forward."""
    model = build_tiny_model(build_tokenizer(), seed=0, tie_word_embeddings=tied)
    model.config._attn_implementation = "eager"
    B, n, k = 3, 17, 5
    ids = torch.randint(3, model.config.vocab_size, (B, n))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, logits_to_keep=k)
    shape = ModelShape.of(model)
    ours = shape.forward_flops(torch.full((B,), n), torch.full((B,), k))
    assert ours == counter.get_total_flops()
    unique = {id(p): p for p in model.parameters()}.values()  # a tied weight is read once
    assert shape.weight_bytes == 4 * sum(p.numel() for p in unique)


def test_shared_prompt_flops_count_the_prompt_once():
    """Two samples of one prompt and a row alone: the linear layers' FLOPs equal what
    FlopCounterMode counts in the packed forward (SDPA is not counted there; its score pairs
    are written out by hand), the prompt counted once."""
    from relax.trainer.policy.packing import build_layout, packed_forward

    model = build_tiny_model(build_tokenizer(), seed=0)
    P, T = 4, 5
    ids = torch.randint(3, model.config.vocab_size, (3, P + T),
                        generator=torch.Generator().manual_seed(0))
    ids[1, :P] = ids[0, :P]
    attention = torch.ones_like(ids)
    attention[0, P + 3:] = 0  # responses of 3 and 5 tokens on the shared prompt of 4
    attention[2, :1] = 0  # a row of its own: prompt 3, response 5
    layout = build_layout(ids, attention, T, share=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        packed_forward(model, model, ids, (attention.cumsum(-1) - 1).clamp(min=0), layout)
    shape = ModelShape.of(model)
    # the pack's head ran on all N tokens; the formula keeps the logits of the M predicting ones
    linear = (counter.get_total_flops()
              - 2 * shape.head_weights * (layout.tokens - layout.predict.numel()))
    pairs = (4 * 4 + 3 * (4 + 3) + 5 * (4 + 5)) + 8 * 8  # the group; the row alone
    attention_flops = 4 * shape.layers * shape.attn_width * pairs
    got = shape.shared_forward_flops(ids[:, :P], attention[:, :P], attention[:, P:].sum(-1))
    assert got == linear + attention_flops
    assert layout.tokens == 4 + 3 + 5 + 8
    alone = shape.forward_flops(torch.tensor([8]), torch.tensor([5]))
    assert shape.shared_forward_flops(ids[2:, :P], attention[2:, :P],
                                      attention[2:, P:].sum(-1)) == alone


def test_phase_metrics_arithmetic():
    times = {"step": 10.0, "update": 4.0, "log_prob": 1.0, "generate": 5.0}
    out = phase_metrics(100.0, log_prob_passes=2, skipped_fraction=0.5, times=times,
                        peak_flops=50.0, decode_steps=8, weight_bytes=1000, bandwidth=400.0)
    # update 100 * (3 - 1) = 200 over 4 s; log-probs 200 over 1 s; all 500 over 10 s
    assert out["perf/update_mfu"] == pytest.approx(200 / (4 * 50))
    assert out["perf/log_prob_mfu"] == pytest.approx(200 / (1 * 50))
    assert out["perf/mfu"] == pytest.approx(500 / (10 * 50))
    assert out["perf/generate_bandwidth_fraction"] == pytest.approx(8 * 1000 / 5 / 400)
    none = phase_metrics(100.0, log_prob_passes=0, skipped_fraction=0.0,
                         times={"step": 1.0, "update": 1.0}, peak_flops=1.0, decode_steps=1,
                         weight_bytes=1, bandwidth=1.0)
    assert "perf/log_prob_mfu" not in none and "perf/generate_bandwidth_fraction" not in none


@pytest.mark.parametrize("bf16", [False, True])
def test_measured_limits_are_positive(bf16, monkeypatch):
    # the suite gives both limits through the environment (tests/conftest.py); measure here
    monkeypatch.delenv(PEAK_ENV, raising=False)
    monkeypatch.delenv(BANDWIDTH_ENV, raising=False)
    peak = measure_peak_flops(torch.device("cpu"), bf16, size=256, repeats=2)
    assert math.isfinite(peak) and peak > 1e6
    bandwidth = measure_bandwidth(torch.device("cpu"), megabytes=8, repeats=2)
    assert math.isfinite(bandwidth) and bandwidth > 1e6


def test_limits_given_in_the_environment_are_not_measured(monkeypatch):
    monkeypatch.setenv(PEAK_ENV, "2.5")
    monkeypatch.setenv(BANDWIDTH_ENV, "40")
    # a size no machine could multiply in the test's time: the value must come back unmeasured
    assert measure_peak_flops(torch.device("cpu"), False, size=1 << 20) == 2.5e12
    assert measure_bandwidth(torch.device("cpu"), megabytes=1 << 20) == 40e9
    monkeypatch.setenv(PEAK_ENV, " ")  # empty: measured again
    assert measure_peak_flops(torch.device("cpu"), False, size=64, repeats=1) > 0


@pytest.mark.parametrize("env", [PEAK_ENV, BANDWIDTH_ENV])
@pytest.mark.parametrize("raw", ["0", "-3", "fast", "inf", "nan"])
def test_a_bad_limit_in_the_environment_is_one_line_naming_it(env, raw, monkeypatch):
    monkeypatch.setenv(env, raw)
    measure = (lambda: measure_peak_flops(torch.device("cpu"), False)) if env == PEAK_ENV \
        else (lambda: measure_bandwidth(torch.device("cpu")))
    with pytest.raises(InputError, match=rf"^{env}='{raw}': must be a number > 0"):
        measure()


def test_a_mixture_of_experts_counts_its_active_weights():
    """The tiny Qwen3-MoE with transformers' eager experts (each token through its top_k
    experts): the router and the active experts' matmuls, as FlopCounterMode counts them."""
    from relax.tiny_model import build_tiny_moe

    model = build_tiny_moe(build_tokenizer(), seed=0)
    model.config._attn_implementation = "eager"
    model.set_experts_implementation("eager")
    B, n, k = 2, 11, 3
    ids = torch.randint(3, model.config.vocab_size, (B, n))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, logits_to_keep=k)
    ours = ModelShape.of(model).forward_flops(torch.full((B,), n), torch.full((B,), k))
    assert ours == counter.get_total_flops()
