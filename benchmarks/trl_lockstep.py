"""Relax's update fed TRL's own batches: do the two trainers take the same step?

``compare_trl.py`` compares whole runs, whose rewards differ from seed to seed far more than
any implementation difference. This check removes the sampling noise: TRL's ``GRPOTrainer``
trains ``--steps`` steps on the setup of ``compare_trl.py``; every step's batch (prompt and
completion ids, masks, rewards, advantages, reference log-probs) and the parameters after its
optimizer step are recorded. Relax then starts from the same initial model and replays those
batches through its own path -- ``compute_advantages_and_returns`` on TRL's rewards,
``train_on_rollout`` with the optimizer of ``relax train`` -- and after each step prints the
distance between the two parameter vectors next to how far each has moved from the start.

Two trainers that take the same step stay together; a difference in the update rule makes the
distance grow step after step. A second Relax replica at another micro-batch size shows the
size of pure rounding. Last, at step ``--probe-step``, the policy-loss and the KL-loss
gradients of both on one batch are compared (cosine).

    .venv/bin/python benchmarks/trl_lockstep.py --size h256 --setting kl --steps 10
    # --trl-bias-corrected-kl: keep trl 1.16's default ratio-weighted KL (see below)

Relies on TRL internals of the pinned ``bench`` release (``_compute_loss``,
``shuffle_sequence_dict``); TRL shuffles the rows of a generation batch before its optimizer
step, which is turned off so that the recorded rewards line up with the rows (one optimizer
step over the whole batch does not depend on the row order).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_trl as C  # noqa: E402


def record_trl(a, model_dir, data):
    """Train TRL ``a.steps`` steps; return its trainer, initial state and per-step records."""
    import trl.trainer.grpo_trainer as grpo
    from transformers import TrainerCallback

    grpo.shuffle_sequence_dict = lambda batch: batch  # keep rows in reward order
    rec = {"rewards": [], "inputs": [], "params": []}

    class AfterStep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **_):
            rec["params"].append({n: p.detach().clone() for n, p in model.named_parameters()})

    trainer = C.trl_trainer(model_dir, data, os.path.join(a.workdir, "lockstep-trl"),
                            steps=a.steps, beta=a.beta, lr=a.lr, seed=a.seed,
                            on_rewards=rec["rewards"].append,
                            bias_corrected_kl=a.trl_bias_corrected_kl, callbacks=[AfterStep()])
    init = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    compute_loss = trainer._compute_loss

    def recording_loss(m, inputs):
        rec["inputs"].append({k: v.detach().clone() if torch.is_tensor(v) else v
                              for k, v in inputs.items()})
        return compute_loss(m, inputs)

    trainer._compute_loss = recording_loss
    trainer.train()
    trainer._compute_loss = compute_loss
    return trainer, init, rec


def experience(inputs, ref_log_probs=None):
    """TRL's batch as a Relax ``Experience`` (the same tokens, masks and positions)."""
    from relax.rollout.generation.generate import Rollout
    from relax.trainer.policy.logprobs import experience_from_rollout

    mask = inputs["completion_mask"].bool()
    exp = experience_from_rollout(Rollout(inputs["prompt_ids"], inputs["prompt_mask"].bool(),
                                          inputs["completion_ids"], mask, ~mask[:, -1]))
    if ref_log_probs is not None:
        exp.ref_log_probs = torch.where(mask, ref_log_probs, 0.0)
    return exp


@torch.no_grad()
def distance(params, other) -> float:
    return float(sum(((p - other[n]) ** 2).sum() for n, p in params).sqrt())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="/tmp/relax-vs-trl")
    p.add_argument("--size", default="h256", choices=list(C.SIZES))
    p.add_argument("--setting", default="kl", choices=["nokl", "kl"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--probe-step", type=int, default=None,
                   help="compare the two gradients on this step's batch (default: the last)")
    p.add_argument("--trl-bias-corrected-kl", action="store_true",
                   help="trl 1.16's default: its k3 KL times the importance ratio, whose "
                        "gradient (value 1 on-policy) makes the KL gradient logp - logp_ref")
    a = p.parse_args(argv)
    if a.setting == "nokl":
        a.beta = 0.0
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    from relax.algorithms import compute_advantages_and_returns
    from relax.config import parse_train_config
    from relax.trainer.distributed import DistContext
    from relax.trainer.policy.optimizer_step import build_optimizer
    from relax.trainer.policy.update import LossSettings, micro_batch_loss, train_on_rollout

    model_dir, data = C.prepare(a.workdir, a.size, a.steps)
    trainer, init, rec = record_trl(a, model_dir, data)

    # Relax: the configuration `relax train` would build from compare_trl's command line
    argv = C.relax_command(model_dir, data, a.steps, os.path.join(a.workdir, "lockstep-relax"),
                           beta=a.beta, lr=a.lr, seed=a.seed)
    cfg = parse_train_config(argv[argv.index("train") + 1:])
    adv = cfg.algorithm  # the dispatcher and the loss take the algorithm section as it is
    loss = LossSettings(cfg.algorithm, temperature=cfg.rollout.sampling.rollout_temperature,
                        layout=cfg.batches.pass_layout)
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    B = C.PROMPTS * C.SAMPLES
    group = torch.arange(C.PROMPTS).repeat_interleave(C.SAMPLES)
    # Relax on its own advantages at two micro-batch sizes, and on TRL's advantages (TRL divides
    # by std + 1e-4, reinforce_plus_plus.md §5 by std + 1e-6: this third replica shows what
    # that alone does)
    replicas = []
    for mbs in (B, B // 4, B):
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
        replicas.append((m, build_optimizer(m, cfg.optimizer), mbs))
    print("step | reward | max |A_relax - A_trl| | |relax - trl| | moved: trl, relax | "
          f"|relax mbs {B} - mbs {B // 4}| | |relax on TRL's A - trl|")
    for t, inputs in enumerate(rec["inputs"]):
        exp = experience(inputs, inputs.get("ref_per_token_logps"))
        rewards = torch.tensor(rec["rewards"][t], dtype=torch.float32)
        exp.advantages = compute_advantages_and_returns(adv, rewards, exp.response_mask,
                                                        group_index=group).advantages
        gap = (exp.advantages[:, 0] - inputs["advantages"]).abs().max()
        trl_adv = copy.deepcopy(exp)
        trl_adv.advantages = torch.where(exp.response_mask, inputs["advantages"][:, None], 0.0)
        for (m, opt, mbs), batch in zip(replicas, (exp, copy.deepcopy(exp), trl_adv), strict=True):
            train_on_rollout(m, opt, batch, loss, ctx, global_batch_size=B,
                             micro_batch_size=mbs, clip_grad=cfg.optimizer.clip_grad)
        (m, _, _), (m2, _, _), (m3, _, _) = replicas
        trl_params = rec["params"][t]
        print(f"{t + 1} | {rewards.mean():.4f} | {gap:.1e} | "
              f"{distance(m.named_parameters(), trl_params):.3e} | "
              f"{distance(((n, trl_params[n]) for n in init), init):.3f}, "
              f"{distance(m.named_parameters(), init):.3f} | "
              f"{distance(m.named_parameters(), dict(m2.named_parameters())):.1e} | "
              f"{distance(m3.named_parameters(), trl_params):.1e}")

    # one batch, the same parameters, TRL's advantages and reference: the two gradients
    k = (a.probe_step or len(rec["inputs"])) - 1
    inputs = rec["inputs"][k]
    start = rec["params"][k - 1] if k else init

    def gradient(loss_of, trl_head=False):
        m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
        m.load_state_dict(start, strict=False)
        if trl_head:  # TRL computes its log-probs through a fused LM head it patches in
            import trl.trainer.grpo_trainer as grpo
            grpo.add_fused_lm_head(m, temperature=1.0, outputs=("log_probs", "entropy"),
                                   cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
        loss_of(m).backward()
        return torch.cat([q.grad.flatten() for q in m.parameters()]).double()

    parts = [("policy loss", 0.0, inputs["advantages"])]
    if a.beta:
        parts.append(("KL loss", a.beta, torch.zeros_like(inputs["advantages"])))
    for name, beta, advantages in parts:
        trainer.beta = beta
        batch = {**inputs, "advantages": advantages}
        g_trl = gradient(lambda m, batch=batch: trainer._compute_loss(m, batch), trl_head=True)
        exp = experience(inputs, inputs.get("ref_per_token_logps"))
        exp.advantages = torch.where(exp.response_mask, advantages[:, None], 0.0)
        s = dataclasses.replace(loss, algorithm=dataclasses.replace(
            loss.algorithm, use_kl_loss=beta > 0, kl_loss_coef=beta))
        g_relax = gradient(lambda m, exp=exp, s=s: micro_batch_loss(
            m, exp, s, num_responses=B, num_tokens=None)[0])
        cos = torch.nn.functional.cosine_similarity(g_trl, g_relax, dim=0)
        print(f"step {k + 1} batch, {name} gradient: norm TRL {g_trl.norm():.5f}, Relax "
              f"{g_relax.norm():.5f}, cosine {cos:.5f}")


if __name__ == "__main__":
    main()
