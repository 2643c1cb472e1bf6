"""Activation recompute (relax/trainer/policy/recompute.py): the update's loss and gradient equal the
pass without it (float64; LoRA; bf16 autocast; two ranks under DDP and FSDP2), the chosen
layers really run again in the backward pass and keep fewer saved tensors, and the passes
without autograd (old/ref log-probs, generation through the rollout engine) are untouched."""

import pytest
import torch

from relax.config.sections import RecomputeSection
from relax.errors import InputError
from relax.rollout.generation.generate import generate, tokenize_prompts
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy.logprobs import batched_log_probs
from relax.trainer.policy.recompute import apply_recompute, recomputing
from relax.trainer.policy.update import micro_batch_loss
from tests.distributed_utils import run_distributed
from tests.trainer.workers import B, fixed_experience, one_step, settings

LAYERS = 4
FULL = RecomputeSection("full", None, None)
UNIFORM_2 = RecomputeSection("full", "uniform", 2)
BLOCK_1 = RecomputeSection("full", "block", 1)
BLOCK_3 = RecomputeSection("full", "block", 3)


def _model(recompute=None, *, dtype=torch.float64, lora=False):
    model = build_tiny_model(build_tokenizer(), seed=7, num_hidden_layers=LAYERS)
    if lora:
        from relax.trainer.policy.lora import add_lora

        add_lora(model, rank=4, alpha=8, dropout=0.0, targets=["q_proj", "v_proj", "down_proj"],
                 seed=3)
        with torch.no_grad():  # B non-zero, so the adapter's gradient path is not trivial
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    model = model.to(dtype)
    if recompute is not None:
        assert apply_recompute(model, recompute)
    return model


def _loss_and_grads(model, *, bf16=False, shared_prompts=False):
    exp = fixed_experience(model, shared_prompts=shared_prompts)
    s = settings("reinforce_plus_plus_baseline")  # k2 KL loss and an entropy bonus
    if bf16:
        import dataclasses

        s = dataclasses.replace(s, bf16=True)
    loss, stats = micro_batch_loss(model, exp, s, num_responses=B, num_tokens=None)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None for g in grads.values())
    return loss.detach(), stats, grads


def _assert_same(ref, got, **tol):
    torch.testing.assert_close(got[0], ref[0], **tol)
    torch.testing.assert_close(got[1], ref[1], **tol)
    assert got[2].keys() == ref[2].keys()
    for name, g in ref[2].items():
        torch.testing.assert_close(got[2][name], g, msg=name, **tol)


@pytest.mark.parametrize("recompute", [FULL, UNIFORM_2, BLOCK_1, BLOCK_3],
                         ids=["full", "uniform-2", "block-1", "block-3"])
def test_loss_and_gradient_equal_the_pass_without_recompute(recompute):
    _assert_same(_loss_and_grads(_model()), _loss_and_grads(_model(recompute)),
                 atol=1e-12, rtol=1e-10)


def test_with_lora():
    ref = _loss_and_grads(_model(lora=True))
    got = _loss_and_grads(_model(FULL, lora=True))
    assert all("lora_" in n for n in got[2])  # only the adapter trains
    _assert_same(ref, got, atol=1e-12, rtol=1e-10)


def test_under_bf16_autocast():
    """The recompute runs under the forward's autocast, so it rebuilds the same bf16 values."""
    ref = _loss_and_grads(_model(dtype=torch.float32), bf16=True)
    got = _loss_and_grads(_model(FULL, dtype=torch.float32), bf16=True)
    _assert_same(ref, got, atol=1e-6, rtol=1e-5)


def test_shared_prompt_rows_take_one_pass_while_recomputing():
    """Rows that repeat a prompt share it in one pack, with and without recompute (the
    recomputed layers find the same pack) -- the same function."""
    ref = _loss_and_grads(_model(), shared_prompts=True)
    got = _loss_and_grads(_model(FULL), shared_prompts=True)
    _assert_same(ref, got, atol=1e-6, rtol=1e-5)  # two paths: the fp32 log-softmax rounds


def _mlp_calls_in_backward(recompute) -> list[int]:
    """Indices of the layers whose MLP starts during the backward pass (a pre-hook: the
    recompute stops once the last tensor the backward needs is rebuilt, inside the MLP)."""
    model = _model(recompute)
    exp = fixed_experience(model)
    calls, phase = [], {"backward": False}
    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_pre_hook(
            lambda m, a, i=i: calls.append(i) if phase["backward"] else None)
    loss, _ = micro_batch_loss(model, exp, settings("reinforce_plus_plus_baseline"),
                               num_responses=B, num_tokens=None)
    phase["backward"] = True
    loss.backward()
    return sorted(calls)


def test_the_chosen_layers_run_again_in_the_backward_pass():
    assert _mlp_calls_in_backward(None) == []
    assert _mlp_calls_in_backward(FULL) == list(range(LAYERS))
    assert _mlp_calls_in_backward(UNIFORM_2) == list(range(LAYERS))
    assert _mlp_calls_in_backward(BLOCK_1) == [0]
    assert _mlp_calls_in_backward(BLOCK_3) == [0, 1, 2]


def _saved_bytes(recompute) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward pass of the update."""
    model = _model(recompute)
    exp = fixed_experience(model)
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        micro_batch_loss(model, exp, settings("reinforce_plus_plus_baseline"),
                         num_responses=B, num_tokens=None)
    return sum(seen.values())


def test_recompute_keeps_fewer_activations():
    plain, block, full = _saved_bytes(None), _saved_bytes(BLOCK_1), _saved_bytes(FULL)
    assert full < 0.5 * plain, (full, plain)
    assert full < block < plain, (full, block, plain)


def test_passes_without_autograd_are_untouched():
    """The old/ref log-prob pass and generation (the rollout engine reads the layers' weights)
    give what the model without recompute gives."""
    plain, wrapped = _model(dtype=torch.float32), _model(FULL, dtype=torch.float32)
    assert recomputing(wrapped) and not recomputing(plain)
    with torch.no_grad():
        assert not recomputing(wrapped)
    exp = fixed_experience(plain)
    kw = dict(micro_batch_size=4, temperature=1.0)
    assert torch.equal(batched_log_probs(wrapped, exp, **kw), batched_log_probs(plain, exp, **kw))
    tok = build_tokenizer()
    ids, mask = tokenize_prompts(tok, ["12+3=", "ab=", "ab="], "cpu")

    def sample(model):
        return generate(model.eval(), ids, mask, max_new_tokens=8, eos_token_ids=[1],
                        pad_token_id=0, generator=torch.Generator().manual_seed(0))

    a, b = sample(plain), sample(wrapped)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=0, rtol=0)


def test_more_layers_than_the_model_has_is_one_line():
    with pytest.raises(InputError, match=rf"--recompute-num-layers 5: the model has {LAYERS} "
                       rf"decoder layers; give at most {LAYERS}"):
        _model(RecomputeSection("full", "block", 5))


def test_a_deep_copy_recomputes_its_own_layers():
    """LoRA's merged copy is a deepcopy: its layers must run their own weights."""
    import copy

    model = _model(FULL)
    clone = copy.deepcopy(model)
    assert clone.model.layers[0].forward.__self__ is clone.model.layers[0]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
@pytest.mark.subprocess
def test_two_ranks_equal_one_process_without_recompute(fsdp):
    """One optimizer step on two ranks with recompute gives the parameters and metrics of one
    process without it (FSDP2: each block stays its own fully_shard unit)."""
    ref_params, ref_hist = one_step("reinforce_plus_plus_baseline", False, False, B)
    results = run_distributed(one_step, 2, "reinforce_plus_plus_baseline", False, fsdp, B // 4,
                              False, False, True, False, FULL, timeout=120)
    for params, hist in results:
        assert params.keys() == ref_params.keys()
        for name, p in ref_params.items():
            torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
        for key, value in ref_hist[0].items():
            if not key.startswith("perf/"):
                assert hist[0][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
