"""PPO's learned critic on the trainer's ranks (reinforce_plus_plus.md §5c): a value model,
its own AdamW, the values before the update and the clipped value loss trained beside the
policy.

    critic = Critic.build(...)                         # None unless ppo
    exp.values = critic.values(exp, **passes)          # before_update: V_old [B, T], no autograd
    critic.targets(exp, raw_advantages, tracker)       # shape_advantages: exp.returns = A_raw + V_old
    if critic.step(exp, tracker, policy.optimizer, ...):   # train: its optimizer steps on the
        skip the policy's update                           # value loss; True: a critic-only step

It is a training term (relax/trainer/terms/term.py) whose hooks are these calls, with its
checkpoint state and ``--critic-save`` (``finish``).

The value model is the policy's architecture with its output layer replaced by a scalar head
(initialized to zero, so the first values are 0): the backbone starts from the policy's
initial weights (``--hf-checkpoint`` or the built-in tiny model of ``--seed``) or from
``--critic-load`` (relax/trainer/terms/critic_weights.py). It is distributed as the policy is:
replicated with DDP, or sharded with FSDP2 (``--fsdp``: one unit per decoder block, then the
root), gradients summed over ranks and each micro-batch loss divided by the global token
count; sharded ranks run equally many passes. With ``--lora-rank`` it is trained as the
policy is: LoRA adapters (the policy's rank, alpha, dropout and targets) on its frozen
backbone, and the value head, which is new, trained whole (docs/configuration.md "Critic");
``--recompute-granularity`` recomputes its decoder layers as the policy's.

Its state (the trainable weights, their AdamW moments, the warm-up clock and the count of
critic-only steps) goes into every checkpoint under the key ``critic`` of the policy's DCP
checkpoint: each rank writes what it holds, and ``--load`` restores it at any world size and
with or without ``--fsdp``, like the policy's (relax/trainer/state/sharded_state.py).
"""

from __future__ import annotations

import os
from functools import partial

import torch

from relax.algorithms import clipped_value_loss, gae_returns, token_mean, value_statistics
from relax.config.sections.critic import CRITIC_FILE
from relax.errors import InputError, NonFiniteError
from relax.precision import autocast
from relax.seeding import seed_for
from relax.trainer.distributed import (
    decoder_blocks,
    no_grad_sync,
    reshard,
    unwrap,
    wrap_model,
)
from relax.trainer.policy.experience import Experience, micro_batches
from relax.trainer.policy.lora import add_lora, default_targets
from relax.trainer.policy.optimizer_step import build_optimizer, global_tokens, optimizer_step
from relax.trainer.policy.recompute import apply_recompute
from relax.trainer.state import sharded_state
from relax.trainer.terms.critic_weights import STATE_KEY, load_weights, whole_weights, write_weights
from relax.trainer.terms.term import Term, UpdatePlan


class ValueModel(torch.nn.Module):
    """A causal LM whose output layer is the identity, and a scalar head on its last hidden
    state: ``forward`` gives the value of the state before each response token, [B, T] float32
    (the position that predicts the token, as for the log-probs)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        lm.set_output_embeddings(torch.nn.Identity())
        self.lm = lm
        # the width of the last hidden state (GPT-2 style configs have no hidden_size)
        self.head = torch.nn.Linear(lm.get_input_embeddings().embedding_dim, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids, *, response_len: int,
                bf16: bool = False):
        T = response_len
        with autocast(input_ids.device, bf16):
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False, logits_to_keep=T + 1)
            hidden = out.logits[:, :-1]  # [B, T, H]: the identity "logits" are hidden states
        return self.head(hidden.float()).squeeze(-1)


def _forward(model, mb: Experience, bf16: bool) -> torch.Tensor:
    return model(mb.input_ids, mb.attention_mask, mb.position_ids,
                 response_len=mb.response_mask.shape[1], bf16=bf16)


class Critic(Term):
    """The wrapped value model, its optimizer and its settings; see the module docstring.
    ``lora``: peft's tuner on the value model's backbone, or None."""

    def __init__(self, model, optimizer, section, *, base_lr: float, clip_grad: float,
                 ctx, bf16: bool, fsdp: bool = False, lora=None):
        self.model, self.optimizer, self.section = model, optimizer, section
        self.base_lr, self.clip_grad, self.ctx, self.bf16 = base_lr, clip_grad, ctx, bf16
        self.fsdp, self.lora = fsdp, lora
        self.optimizer_steps = 0  # the learning-rate warm-up's clock
        self.updates = 0  # rollout steps the critic trained on (--num-critic-only-steps)

    @classmethod
    def build(cls, section, ctx, lm: torch.nn.Module, *, bf16: bool, lora, recompute,
              fsdp: bool, optimizer, seed: int) -> Critic:
        """The critic of ``--advantage-estimator ppo`` (``section``: the critic section) on
        ``lm``, the policy's architecture as loaded at its initial weights; ``lora``,
        ``recompute``, ``optimizer``: the policy's sections, ``fsdp`` its sharding."""
        value_model = ValueModel(lm).to(ctx.device)
        if section.critic_load:  # the whole weights; with LoRA they are the frozen backbone
            load_weights(value_model, section.critic_load)
        adapters = _add_adapters(lm, lora, seed) if lora.enabled else None
        # the policy's activation recompute, before wrap_model as for the policy: a critic
        # of the policy's size needs the same memory
        apply_recompute(lm, recompute)
        model = wrap_model(value_model, ctx, fsdp=fsdp, blocks=decoder_blocks(lm))
        base_lr = section.critic_lr if section.critic_lr is not None else optimizer.lr
        return cls(model, build_optimizer(model, optimizer, lr=base_lr), section,
                   base_lr=base_lr, clip_grad=optimizer.clip_grad, ctx=ctx, bf16=bf16,
                   fsdp=fsdp, lora=adapters)

    # ------------------------------------------------------------------ the term's hooks
    def before_update(self, exp, batch, passes: dict) -> None:
        exp.values = self.values(exp, **passes)  # V_old, before the update (§5c)

    def shape_advantages(self, exp, estimate, tracker) -> None:
        self.targets(exp, estimate.returns, tracker)  # the raw GAE plus V_old (§5c)

    def train(self, exp, tracker, plan: UpdatePlan) -> bool:
        return self.step(exp, tracker, plan.policy_optimizer,
                         global_batch_size=plan.global_batch_size,
                         micro_batch_size=plan.micro_batch_size, max_tokens=plan.max_tokens)

    def finish(self) -> None:
        self.save_final(self.section.critic_save)  # --critic-save DIR

    # ------------------------------------------------------------------ values and targets
    def values(self, exp: Experience, *, micro_batch_size: int, max_tokens=None, group=None,
               **_) -> torch.Tensor:
        """V_old [B, T] float32 of ``exp``'s responses, no autograd, 0 outside the mask
        (``group``: sharded ranks run equally many passes)."""
        out = torch.zeros(exp.response_mask.shape, dtype=torch.float32,
                          device=exp.response_mask.device)
        with torch.no_grad():
            for index, mb in micro_batches(exp, size=micro_batch_size, max_tokens=max_tokens,
                                           flag="--log-probs-max-tokens-per-gpu", group=group,
                                           lockstep=self.fsdp):
                v = _forward(unwrap(self.model), mb, self.bf16)
                out[index, : v.shape[1]] = v
        if self.fsdp:  # parameters gathered without autograd must not serve the training pass
            reshard(self.model)
        return torch.where(exp.response_mask, out, 0.0)

    def targets(self, exp: Experience, raw_advantages: torch.Tensor, tracker) -> None:
        """``exp.returns = A_raw + V_old`` (the GAE before any normalization) and the step's
        ``critic/explained_variance`` and ``critic/values_mean`` (global over the ranks)."""
        exp.returns = gae_returns(raw_advantages, exp.values, exp.response_mask).float()
        stats = value_statistics(exp.values, exp.returns, exp.response_mask,
                                 group=self.ctx.group)
        for name, value in stats.items():
            tracker.add_global(name, value)

    def policy_waits(self) -> bool:
        """Whether this rollout step trains only the critic (``--num-critic-only-steps``)."""
        return self.updates < self.section.num_critic_only_steps


    # ------------------------------------------------------------------ training
    def step(self, exp: Experience, tracker, policy_optimizer, **update) -> bool:
        """:meth:`update` on ``exp`` (``update``: its keywords); True when this rollout step
        trains only the critic (``--num-critic-only-steps``), after giving the policy's
        optimizer its state (:func:`hold_still`)."""
        waits = self.policy_waits()
        self.update(exp, tracker, **update)
        if waits:
            hold_still(policy_optimizer)
        return waits

    def _set_lr(self) -> float:
        warmup = self.section.critic_lr_warmup_iters
        lr = self.base_lr * (min(1.0, (self.optimizer_steps + 1) / warmup) if warmup else 1.0)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return lr

    def update(self, exp: Experience, tracker, *, global_batch_size: int,
               micro_batch_size: int, max_tokens=None) -> None:
        """One pass over ``exp`` in optimizer steps of ``global_batch_size`` samples (the
        policy's, so as many as ``--num-steps-per-rollout``, §7), each on the token mean of the clipped value loss over the step's
        global valid tokens; metrics ``critic/value_loss``, ``critic/value_clip_fraction``
        (means over its optimizer steps) and ``critic/lr``."""
        local_step = global_batch_size // self.ctx.world_size
        for start in range(0, len(exp), local_step):
            chunk = exp.rows(start, start + local_step)
            lr = self._set_lr()
            loss, clipfrac = self._optimizer_step(chunk, micro_batch_size, max_tokens)
            tracker.add_global("critic/value_loss", loss)
            tracker.add_global("critic/value_clip_fraction", clipfrac)
            tracker.add_global("critic/lr", lr)
        self.updates += 1

    def _optimizer_step(self, chunk: Experience, micro_batch_size: int, max_tokens):
        """The policy's optimizer step (relax/trainer/policy/optimizer_step.py) on the token mean of
        the clipped value loss; returns the step's (value loss, clipped fraction)."""
        num_tokens = global_tokens(chunk.response_mask, self.ctx.group)
        params = [p for p in self.model.parameters() if p.requires_grad]
        out = optimizer_step(self.optimizer, params,
                             partial(self._accumulate, chunk, micro_batch_size, max_tokens,
                                     num_tokens),
                             clip_grad=self.clip_grad, group=self.ctx.group, check=_checked)
        self.optimizer_steps += 1
        return out

    def _accumulate(self, chunk: Experience, micro_batch_size: int, max_tokens,
                    num_tokens) -> torch.Tensor:
        """Backward over the step's micro-batches; this rank's [2] float64 partial sums of
        the value loss and the clipped fraction."""
        stats = torch.zeros(2, dtype=torch.float64, device=chunk.response_mask.device)
        batches = micro_batches(chunk, size=micro_batch_size, max_tokens=max_tokens,
                                flag="--max-tokens-per-gpu", group=self.ctx.group,
                                lockstep=self.fsdp)
        for i, (_, mb) in enumerate(batches):
            with no_grad_sync(self.model, skip=i < len(batches) - 1):
                values = _forward(self.model, mb, self.bf16)
                per_token, clipped = clipped_value_loss(
                    values, mb.values, mb.returns, mb.response_mask,
                    value_clip=self.section.value_clip)
                loss = token_mean(per_token, mb.response_mask, num_tokens=num_tokens)
                loss.backward()
            stats += torch.stack([loss.detach().double(),
                                  token_mean(clipped.double(), mb.response_mask,
                                             num_tokens=num_tokens)])
        return stats

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict:
        """This rank's ``{"critic": {"model", "optim", "progress"}}`` for the DCP checkpoint,
        beside the policy's state: the trainable weights (a LoRA critic: its adapters and
        head) and their AdamW state as this rank holds them, and the two step counts."""
        state = sharded_state.sharded_state(self.model, self.optimizer, fsdp=self.fsdp,
                                            trainable_only=self.lora is not None)
        state["progress"] = {"optimizer_steps": torch.tensor(self.optimizer_steps),
                             "updates": torch.tensor(self.updates)}
        return {STATE_KEY: state}

    def load(self, folder: str) -> None:
        """Restore what :meth:`checkpoint_state` saved (a collective when distributed)."""
        if not sharded_state.saved_shapes(folder, f"{STATE_KEY}.model."):
            if os.path.isfile(os.path.join(folder, CRITIC_FILE)):
                return self._load_file(os.path.join(folder, CRITIC_FILE))
            raise InputError(f"--load {folder}: the checkpoint holds no critic; it was not "
                             "written by a ppo run")
        progress = {"optimizer_steps": torch.tensor(0), "updates": torch.tensor(0)}
        sharded_state.load_sharded(folder, self.model, self.optimizer, fsdp=self.fsdp,
                                   trainable_only=self.lora is not None, group=self.ctx.group,
                                   key=STATE_KEY, extra={"progress": progress})
        self.optimizer_steps = int(progress["optimizer_steps"])
        self.updates = int(progress["updates"])

    def _load_file(self, file: str) -> None:
        """A checkpoint of an earlier Relax, with the replicated critic in ``critic.pt``."""
        state = torch.load(file, map_location=self.ctx.device, weights_only=True)
        unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])
        self.optimizer_steps, self.updates = state["optimizer_steps"], state["updates"]

    def save_final(self, path: str | None) -> None:
        """``--critic-save DIR``: the critic's whole weights in ``DIR/critic.pt`` (gathered on
        rank 0, a collective under FSDP2; a LoRA critic's adapters merged)."""
        if not path:
            return
        weights = whole_weights(self.model, fsdp=self.fsdp, is_main=self.ctx.is_main,
                                lora=self.lora)
        if self.ctx.is_main:
            write_weights(path, weights)


def _checked(sums: list[float], grad_norm: torch.Tensor) -> tuple[float, float]:
    """The step's (value loss, clipped fraction), or a stop before the optimizer's step on a
    non-finite loss or gradient norm."""
    loss, clipfrac = sums
    if not (torch.isfinite(grad_norm) and torch.isfinite(torch.tensor(loss))):
        raise NonFiniteError(f"non-finite critic value loss ({loss}) or gradient norm "
                             f"({float(grad_norm)}); stopped before the optimizer step, "
                             "nothing was saved. Try a lower --critic-lr or --clip-grad")
    return loss, clipfrac


def _add_adapters(lm: torch.nn.Module, section, seed: int):
    """The policy's kind of adapters (the LoRA section) on the value model's backbone, their A
    drawn from a stream of the run's seed of their own (not the policy's adapters' draw)."""
    return add_lora(lm, rank=section.lora_rank, alpha=section.lora_alpha,
                    dropout=section.lora_dropout,
                    targets=list(section.lora_target_modules or default_targets(lm)),
                    seed=seed_for(seed, "critic_lora"))


def hold_still(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer that has not stepped yet its state now, as a checkpoint would.

    A checkpoint's optimizer state dict (torch.distributed.checkpoint) initializes an empty
    optimizer with one step at learning rate 0 on zero gradients: step count 1, zero
    moments, no parameter moved. After ``--num-critic-only-steps`` the policy's AdamW is still
    empty, so a run saved during them and one that was not would differ in the bias
    correction of every later step. Doing the same here, in every run, keeps a resumed run
    equal to the uninterrupted one (the policy's first real step counts as AdamW's second)."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs, strict=True):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
