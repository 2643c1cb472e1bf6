"""The fast paths keep the semantics: no old-log-prob pass with one optimizer step
per rollout, the entropy metric outside autograd, the CPU thread rule."""

import copy

import pytest
import torch

from relax.cpu_threads import cpu_threads
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext
from relax.trainer.policy import passes
from relax.trainer.policy.logprobs import batched_log_probs, response_log_probs
from relax.trainer.policy.update import micro_batch_loss, train_on_rollout
from tests.trainer.helpers import make_config
from tests.trainer.workers import SHARED_PROMPTS, B, P, T, fixed_experience, loss_settings_of

CTX = DistContext(0, 1, 0, torch.device("cpu"), None)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tokenizer(), seed=5)


def test_log_probs_and_entropy_against_a_float64_log_softmax(model):
    exp = fixed_experience(model)
    temperature = 0.7
    logp, entropy = response_log_probs(model, exp, temperature=temperature, with_entropy=True,
                                       entropy_grad=False)
    with torch.no_grad():
        logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                       position_ids=exp.position_ids).logits[:, -T - 1:-1].double()
    ref = torch.log_softmax(logits / temperature, -1)
    ref_logp = ref.gather(-1, exp.input_ids[:, -T:, None]).squeeze(-1)
    ref_entropy = -(ref.exp() * ref).sum(-1)
    read = exp.attention_mask[:, -T:].bool()  # the packed passes leave 0 past a response
    torch.testing.assert_close(logp.double()[read], ref_logp[read], atol=2e-6, rtol=0)
    torch.testing.assert_close(entropy.double()[read], ref_entropy[read], atol=2e-6, rtol=0)
    # the log-probs carry the gradient; the metric-only entropy does not
    assert logp.requires_grad and not entropy.requires_grad
    _, with_grad = response_log_probs(model, exp, with_entropy=True, entropy_grad=True)
    assert with_grad.requires_grad


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "sapo", "cispo", "rloo"])
def test_first_step_without_old_pass_equals_the_recomputed_old(model, estimator):
    """One optimizer step per rollout: using the update's own detached log-probs as pi_old
    gives the loss, metrics and gradient of a separate no-grad pass (up to rounding)."""
    exp = fixed_experience(model)
    exp.old_log_probs = batched_log_probs(model, exp, micro_batch_size=B, temperature=1.0)
    s = loss_settings_of(advantage_estimator=estimator, use_kl_loss=True, kl_loss_type="k3",
                         kl_loss_coef=0.1)
    results = []
    for old in (exp.old_log_probs, None):
        model.zero_grad(set_to_none=True)
        mb = copy.copy(exp)
        mb.old_log_probs = old
        loss, stats = micro_batch_loss(model, mb, s, num_responses=B, num_tokens=None)
        loss.backward()
        results.append((loss.detach(), stats, [p.grad.clone() for p in model.parameters()]))
    (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(stats_b, stats_a, atol=1e-6, rtol=1e-5)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)
    names = s.metric_names
    assert stats_b[names.index("train/ppo_kl")] == 0.0
    assert stats_b[names.index("train/pg_clipfrac")] == 0.0
    assert loss_a != 0.0  # the comparison is not between two zeros


def test_old_log_probs_required_for_a_second_optimizer_step(model):
    exp = fixed_experience(model)
    exp.old_log_probs = None
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="old log-probs are required: 2 optimizer steps"):
        train_on_rollout(model, opt, exp, loss_settings_of(advantage_estimator="grpo"), CTX,
                         global_batch_size=B // 2, micro_batch_size=B // 2, clip_grad=1.0)


def test_needs_old_log_probs(tmp_path):
    def cfg(*flags):  # the sections needs_old_log_probs reads
        c = make_config(*flags, output_dir=tmp_path)
        return c.algorithm, c.batches, c.distillation

    assert not passes.needs_old_log_probs(*cfg("--advantage-estimator", "grpo"))
    assert not passes.needs_old_log_probs(*cfg("--advantage-estimator", "grpo", "--use-kl-loss",
                                             "--kl-loss-type", "k3", "--kl-loss-coef", "0.1"))
    assert passes.needs_old_log_probs(*cfg("--advantage-estimator", "grpo",
                                         "--num-steps-per-rollout", "2"))
    # REINFORCE++ k1 shaping reads pi_old in the returns, before any update
    assert passes.needs_old_log_probs(*cfg("--advantage-estimator", "reinforce_plus_plus",
                                         "--normalize-advantages", "--kl-coef", "0.01",
                                         "--kl-loss-type", "k1"))
    assert not passes.needs_old_log_probs(*cfg("--advantage-estimator", "reinforce_plus_plus",
                                             "--normalize-advantages", "--kl-coef", "0"))


def test_cpu_threads():
    assert cpu_threads(cpu_count=16, local_world_size=4, environ={}) == 4
    assert cpu_threads(cpu_count=2, local_world_size=4, environ={}) == 1
    assert cpu_threads(cpu_count=2, environ={}) == 2
    assert cpu_threads(cpu_count=16, environ={"OMP_NUM_THREADS": "3"}) == 3
    assert cpu_threads(cpu_count=16, environ={"OMP_NUM_THREADS": ""}) == 16


@pytest.mark.parametrize("estimator,per_token", [("grpo", False), ("gspo", False),
                                                 ("sapo", False), ("grpo", True),
                                                 ("cispo", True), ("rloo", True)])
def test_zero_advantage_rows_skip_the_backward_with_the_same_step(model, estimator, per_token,
                                                                  monkeypatch):
    """Two optimizer steps with old log-probs off the policy (ratios far from 1, clipping on):
    skipping the backward of all-zero-advantage rows leaves the parameters and every metric as
    the full pass has them, and only the active rows run with autograd."""
    from relax.trainer.policy import update

    exp = fixed_experience(model)
    exp.advantages[[0, 2, 3, 5]] = 0.0  # rows 3 (no tokens) and the rest: nothing to learn
    s = loss_settings_of(advantage_estimator=estimator, per_token=per_token)
    grad_rows = []
    loss_of = update.micro_batch_loss

    def counting(model, mb, *args, **kwargs):
        if torch.is_grad_enabled():
            grad_rows.append(len(mb))
        return loss_of(model, mb, *args, **kwargs)

    monkeypatch.setattr(update, "micro_batch_loss", counting)

    def run():
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        history = train_on_rollout(m, opt, exp, s, CTX, global_batch_size=B // 2,
                                   micro_batch_size=2, clip_grad=1e6)
        return dict(m.named_parameters()), history

    params, history = run()
    rows_with_grad = sum(grad_rows)
    monkeypatch.setattr(update, "inert_rows", lambda mb, s: None)
    full_params, full_history = run()
    assert rows_with_grad == B - 4
    for name, p in full_params.items():
        torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
        assert not torch.equal(p, dict(model.named_parameters())[name]) or "norm" in name
    for got, ref, inert in zip(history, full_history, (3, 1), strict=True):
        assert got.pop("perf/backward_skipped_fraction") == inert / (B // 2)
        assert ref.pop("perf/backward_skipped_fraction") == 0.0
        # the passes differ (inert rows run apart, forward only), so does their padding
        for padding in (got.pop("perf/update_padding_fraction"),
                        ref.pop("perf/update_padding_fraction")):
            assert 0.0 <= padding < 1.0
        assert got == pytest.approx(ref, rel=1e-5, abs=1e-7)
        assert abs(ref["train/ppo_kl"]) > 1e-3  # ratios away from 1: the factors are not trivial


def test_kl_or_entropy_terms_keep_every_row(model):
    from relax.trainer.policy.update import inert_rows

    exp = fixed_experience(model)
    exp.advantages[:] = 0.0
    assert inert_rows(exp, loss_settings_of(advantage_estimator="grpo")).all()
    assert inert_rows(exp, loss_settings_of(advantage_estimator="grpo", entropy_coef=0.01)) is None
    assert inert_rows(exp, loss_settings_of(advantage_estimator="grpo", use_kl_loss=True,
                                            kl_loss_type="k3", kl_loss_coef=0.1)) is None
    exp.advantages[1, 0] = float("nan")  # a NaN advantage is not zero: the row stays active
    assert not inert_rows(exp, loss_settings_of(advantage_estimator="grpo"))[1]


def test_shared_prompt_forward_equals_one_pass(model):
    """Rows that repeat a prompt: one pack with each prompt once (relax/trainer/policy/packing.py)
    gives the log-probs, entropy and gradient of one padded pass over prompt + response."""
    exp = fixed_experience(model, shared_prompts=True)
    calls = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)

    def run(layout):
        model.zero_grad(set_to_none=True)
        logp, entropy = response_log_probs(model, exp, temperature=0.8, with_entropy=True,
                                           layout=layout)
        (logp * exp.response_mask).sum().backward()
        return logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    try:
        shared = run("shared-prefix")
        # 4 distinct prompts once, then every response's tokens
        tokens = int(exp.attention_mask[:, P:].sum()) + sum(
            int(exp.attention_mask[src, :P].sum()) for src, _ in SHARED_PROMPTS)
        assert calls == [(1, tokens)]
        calls.clear()
        single = run("padded")
        assert calls == [(B, P + T)]
    finally:
        hook.remove()
    m = exp.response_mask
    torch.testing.assert_close(shared[0][m], single[0][m], atol=2e-6, rtol=0)
    torch.testing.assert_close(shared[1][m], single[1][m], atol=2e-6, rtol=0)
    for a, b in zip(shared[2], single[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert max(g.abs().max() for g in single[2]) > 1e-3
