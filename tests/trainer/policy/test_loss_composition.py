"""reinforce_plus_plus.md §7 on the trainer side: one micro-batch's loss is

    loss = L_PG + kl_loss_coef * L_KL - entropy_coef * L_entropy

with every term the response mean over the step's global B (the token mean over the step's
global N for rloo and cispo, §5a, §5b), and its metrics are those terms. Checked against a float64 recomputation written here from the model's logits (none of
relax's loss, reduction or KL functions), so a wrong sign, weight or denominator fails."""

import pytest
import torch

from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy.update import micro_batch_loss
from tests.trainer.workers import B, T, fixed_experience, loss_settings_of

EPS, KL_COEF, ENT_COEF = 0.2, 0.05, 0.03


def _response_mean64(values, mask, num_responses):
    total = 0.0
    for i in range(mask.shape[0]):
        valid = [float(values[i, t]) for t in range(mask.shape[1]) if mask[i, t]]
        total += sum(valid) / len(valid) if valid else 0.0
    return total / num_responses


def test_micro_batch_loss_is_pg_plus_kl_minus_entropy_in_float64():
    model = build_tiny_model(build_tokenizer(), seed=11)
    exp = fixed_experience(model)
    mask = exp.response_mask
    with torch.no_grad():
        logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                       position_ids=exp.position_ids).logits[:, -T - 1:-1].double()
    logsm = torch.log_softmax(logits, -1)
    logp = logsm.gather(-1, exp.input_ids[:, -T:, None]).squeeze(-1)
    entropy = -(logsm.exp() * logsm).sum(-1)
    old, ref, adv = exp.old_log_probs.double(), exp.ref_log_probs.double(), exp.advantages.double()
    rho = torch.exp(logp - old)
    pg = torch.maximum(-adv * rho, -adv * rho.clamp(1 - EPS, 1 + EPS))
    clipped = (-adv * rho.clamp(1 - EPS, 1 + EPS) > -adv * rho).double()
    k2 = 0.5 * (logp - ref) ** 2
    num = 2 * B  # as if this batch were one of two micro-batches of the optimizer step
    expect = {name: _response_mean64(v, mask, num) for name, v in (
        ("train/pg_loss", pg), ("train/pg_clipfrac", clipped), ("train/ppo_kl", old - logp),
        ("train/entropy", entropy), ("train/kl_loss", k2))}
    expect["train/loss"] = (expect["train/pg_loss"] + KL_COEF * expect["train/kl_loss"]
                            - ENT_COEF * expect["train/entropy"])

    s = loss_settings_of(advantage_estimator="grpo", eps_clip=EPS, use_kl_loss=True,
                         kl_loss_type="k2", kl_loss_coef=KL_COEF, entropy_coef=ENT_COEF)
    loss, stats = micro_batch_loss(model, exp, s, num_responses=num, num_tokens=None)
    got = dict(zip(s.metric_names, stats.tolist(), strict=True))
    assert float(loss.detach()) == pytest.approx(expect["train/loss"], abs=2e-6)
    for name, value in expect.items():
        assert got[name] == pytest.approx(value, abs=2e-6), name
    assert expect["train/pg_clipfrac"] > 0 and expect["train/kl_loss"] > 0  # terms are live


def _token_mean64(values, mask, num_tokens):
    return sum(float(values[i, t]) for i in range(mask.shape[0]) for t in range(mask.shape[1])
               if mask[i, t]) / num_tokens


@pytest.mark.parametrize("estimator", ["cispo", "rloo"])
def test_token_mean_estimators_compose_and_their_gradient_treats_the_weight_as_a_constant(
        estimator):
    """reinforce_plus_plus.md §5a, §5b on the trainer side: every term is the token mean over
    the step's global N, CISPO's weight min/max(rho, bound) and RLOO's 1 are constants, so
    the gradient is that of ``-sg(w) A log pi``, recomputed here in autograd from the logits."""
    model = build_tiny_model(build_tokenizer(), seed=12)
    exp = fixed_experience(model)
    mask = exp.response_mask
    old, ref, adv = exp.old_log_probs.double(), exp.ref_log_probs.double(), exp.advantages.double()

    def log_probs():
        logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                       position_ids=exp.position_ids).logits[:, -T - 1:-1]
        logsm = torch.log_softmax(logits.double(), -1)
        return logsm, logsm.gather(-1, exp.input_ids[:, -T:, None]).squeeze(-1)

    logsm, logp = log_probs()
    rho = torch.exp(logp.detach() - old)
    if estimator == "cispo":
        w = torch.where(adv >= 0, rho.clamp(max=1 + 0.28), rho.clamp(min=1 - EPS))
        clipped = (w != rho).double()
    else:
        w, clipped = torch.ones_like(rho), torch.zeros_like(rho)
    num = 2 * int(mask.sum())  # as if this batch were one of two micro-batches of the step
    pg = -w * adv * logp
    k2 = 0.5 * (logp - ref) ** 2
    entropy = -(logsm.exp() * logsm).sum(-1)
    expect = {name: _token_mean64(v.detach(), mask, num) for name, v in (
        ("train/pg_loss", pg), ("train/pg_clipfrac", clipped),
        ("train/ppo_kl", old - logp.detach()), ("train/entropy", entropy), ("train/kl_loss", k2))}
    surrogate = (pg + KL_COEF * k2 - ENT_COEF * entropy)[mask].sum() / num
    model.zero_grad(set_to_none=True)
    surrogate.backward()
    want = [p.grad.clone() for p in model.parameters()]

    s = loss_settings_of(advantage_estimator=estimator, eps_clip=EPS, eps_clip_high=0.28,
                         use_kl_loss=True, kl_loss_type="k2", kl_loss_coef=KL_COEF,
                         entropy_coef=ENT_COEF, per_token=True)
    model.zero_grad(set_to_none=True)
    loss, stats = micro_batch_loss(model, exp, s, num_responses=2 * B,
                                   num_tokens=torch.tensor(float(num), dtype=torch.float64))
    loss.backward()
    got = dict(zip(s.metric_names, stats.tolist(), strict=True))
    assert float(loss.detach()) == pytest.approx(float(surrogate.detach()), abs=2e-6)
    for name, value in expect.items():
        assert got[name] == pytest.approx(value, abs=2e-6), name
    for p, g in zip(model.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g.to(p.grad.dtype), atol=2e-6, rtol=1e-4)
    assert expect["train/pg_loss"] != 0 and expect["train/kl_loss"] > 0
    assert (expect["train/pg_clipfrac"] > 0) == (estimator == "cispo")
