"""reinforce_plus_plus.md §7 on the trainer side: one micro-batch's loss is

    loss = L_PG + kl_loss_coef * L_KL - entropy_coef * L_entropy

with every term the response mean over the step's global B, and its metrics are those
terms. Checked against a float64 recomputation written here from the model's logits (none of
relax's loss, reduction or KL functions), so a wrong sign, weight or denominator fails."""

import pytest
import torch

from relax.rollout.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.update import LossSettings, micro_batch_loss
from tests.trainer.workers import B, T, fixed_experience

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

    s = LossSettings(estimator="grpo", eps_clip=EPS, use_kl_loss=True, kl_loss_type="k2",
                     kl_loss_coef=KL_COEF, entropy_coef=ENT_COEF)
    loss, stats = micro_batch_loss(model, exp, s, num_responses=num, num_tokens=None)
    got = dict(zip(s.metric_names, stats.tolist(), strict=True))
    assert float(loss.detach()) == pytest.approx(expect["train/loss"], abs=2e-6)
    for name, value in expect.items():
        assert got[name] == pytest.approx(value, abs=2e-6), name
    assert expect["train/pg_clipfrac"] > 0 and expect["train/kl_loss"] > 0  # terms are live
