"""The policy bundle: the trained model with its optimizer, its LoRA adapter and its reference,
behind one object that the loop, the checkpointer and evaluation ask.

    policy = Policy.build(module, ctx, tokenizer, bf16=False, ...)   # relax/trainer/build.py
    old = policy.log_probs(exp, **passes)          # pi_old [B, T], no autograd
    ref = policy.ref_log_probs(exp, **passes)      # pi_ref [B, T] or None
    policy.checkpoint_state()                      # what a DCP checkpoint holds

The reference is a frozen copy (``--ref-load`` or the initial weights) or, with LoRA, the same
module with its adapter switched off: no second copy of the weights. What differs between full
fine-tuning and LoRA in checkpoints (what the shards hold, what goes beside them, what the
final save writes) is decided here once, so relax/trainer/state/checkpoint.py has no LoRA branch.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from relax.trainer.distributed import reshard, unwrap, wrap_model
from relax.trainer.policy.logprobs import batched_log_probs
from relax.trainer.policy.lora import (
    ADAPTER_DIR,
    adapter_disabled,
    add_configured,
    merged_copy,
    save_adapter,
)
from relax.trainer.policy.optimizer_step import build_optimizer
from relax.trainer.policy.recompute import apply_recompute
from relax.trainer.state import sharded_state


class Policy:
    """``model``: the wrapped (DDP / FSDP2) training model; ``lora``: peft's tuner or None;
    ``ref``: a frozen reference model or None (then, with ``has_reference``, the adapter off
    is the reference); ``base``: the --hf-checkpoint a LoRA adapter adapts."""

    def __init__(self, *, model, optimizer, tokenizer, ctx, eos_token_ids: list[int] = (),
                 ref=None, lora=None, has_reference: bool = False, fsdp: bool = False,
                 bf16: bool = False, base: str | None = None):
        self.model, self.optimizer, self.tokenizer = model, optimizer, tokenizer
        self.eos_token_ids, self.ref, self.lora = list(eos_token_ids), ref, lora
        self.has_reference, self.ctx, self.fsdp, self.bf16 = has_reference, ctx, fsdp, bf16
        self.base = base

    @classmethod
    def build(cls, module: torch.nn.Module, ctx, tokenizer, *, eos_token_ids: list[int],
              bf16: bool, lora, recompute, fsdp: bool, optimizer, seed: int, base: str | None,
              reference: Callable[[], torch.nn.Module] | None, ref_load: str | None) -> Policy:
        """Adapter (``lora``: the LoRA section, its A drawn from ``seed``), activation
        recompute (the recompute section), reference, data-parallel wrapping (``fsdp``) and
        AdamW (the optimizer section) around the loaded Hugging Face ``module`` of ``base``
        (--hf-checkpoint). ``reference``: loads the frozen reference (relax/models.py), None
        when no KL term reads it; with LoRA and no ``ref_load`` (--ref-load) the policy with
        its adapter off is the reference instead."""
        adapters = add_configured(module, lora, seed) if lora.enabled else None
        # before wrap_model: FSDP2 shards the same blocks, its hooks outside the checkpoint
        apply_recompute(module, recompute)
        has_reference = reference is not None
        # the reference is the initial weights (or --ref-load), also when resuming; with LoRA
        # the initial weights are the policy with its adapter switched off
        ref = reference() if has_reference and not (adapters and not ref_load) else None
        model = wrap_model(module, ctx, fsdp=fsdp)
        return cls(model=model, optimizer=build_optimizer(model, optimizer), tokenizer=tokenizer,
                   eos_token_ids=eos_token_ids, ref=ref, lora=adapters,
                   has_reference=has_reference, ctx=ctx, fsdp=fsdp, bf16=bf16, base=base)

    @property
    def module(self) -> torch.nn.Module:
        """The Hugging Face module itself (for FSDP2 the sharded module)."""
        return unwrap(self.model)

    @property
    def context(self) -> int | None:
        """The model's maximum positions, if it declares them."""
        return getattr(self.module.config, "max_position_embeddings", None)

    def trainable_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    # ------------------------------------------------------------------ generation, log-probs
    def log_probs(self, exp, **passes) -> torch.Tensor:
        """The current policy's log-probs [B, T] of ``exp``'s responses, no autograd
        (``passes``: relax/trainer/policy/logprobs.py ``batched_log_probs`` micro-batching)."""
        out = batched_log_probs(self.module, exp, bf16=self.bf16, inference_mode=not self.fsdp,
                                **passes)
        if self.fsdp:
            reshard(self.model)
        return out

    def ref_log_probs(self, exp, **passes) -> torch.Tensor | None:
        """The reference's log-probs [B, T], or None when no KL term reads them."""
        if self.ref is not None:
            return batched_log_probs(self.ref, exp, bf16=self.bf16, **passes)
        if not self.has_reference:
            return None
        with adapter_disabled(self.lora):  # LoRA: the policy with its adapter off
            return batched_log_probs(self.module, exp, bf16=self.bf16, **passes)

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict:
        """This rank's ``{"model", "optim"}`` for a DCP checkpoint: the trainable parameters
        and their AdamW state (a LoRA run: the adapter's only; the base is --hf-checkpoint)."""
        return sharded_state.sharded_state(self.model, self.optimizer, fsdp=self.fsdp,
                                           trainable_only=self.lora is not None)

    def load_checkpoint_state(self, folder: str) -> None:
        """Restore what :meth:`checkpoint_state` saved (a collective when distributed)."""
        sharded_state.load_sharded(folder, self.model, self.optimizer, fsdp=self.fsdp,
                                   trainable_only=self.lora is not None, group=self.ctx.group)

    def write_checkpoint_files(self, folder: str) -> None:
        """Rank 0's files beside the shards: the model config, the tokenizer and, for LoRA,
        the adapter in PEFT's format (``folder/adapter``)."""
        self.module.config.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        if self.lora is not None:
            save_adapter(self.module, self.lora, os.path.join(folder, ADAPTER_DIR),
                         base=self.base, tokenizer=self.tokenizer)

    def weights(self) -> dict | None:
        """The whole model's weights on rank 0's CPU (None elsewhere; a collective under
        FSDP2); a LoRA run has them merged when the model is written, so None here."""
        if self.lora is not None:
            return None
        return sharded_state.full_model_state(self.model, fsdp=self.fsdp,
                                              is_main=self.ctx.is_main)

    def write_model(self, folder: str, weights: dict | None) -> None:
        """Rank 0: the final model as a Hugging Face directory (``weights`` from
        :meth:`weights`); a LoRA run writes the merged model and the adapter beside it."""
        if self.lora is None:
            self.module.save_pretrained(folder, state_dict=weights, safe_serialization=True)
        else:
            merged_copy(self.lora).save_pretrained(folder, safe_serialization=True)
            save_adapter(self.module, self.lora, os.path.join(folder, ADAPTER_DIR),
                         base=self.base, tokenizer=self.tokenizer)
        self.tokenizer.save_pretrained(folder)
