"""The LoRA section (``cfg.lora``): low-rank adapters (peft) instead of full fine-tuning, and its
rules. Torch-free."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from relax.config.section import FLOAT32, Needs, Section, option, reject

NEEDS_LORA = Needs(lambda cfg: cfg.lora.lora_rank > 0, "has no effect without --lora-rank R; "
                   "add it or remove this", given="changed")

@dataclass(frozen=True)
class LoraSection(Section):
    """Low-rank adapters (peft) instead of full fine-tuning; ``lora_rank`` 0 is full
    fine-tuning."""

    lora_rank: int = option(
        0,
        'LoRA rank R: train low-rank adapters (peft) on --lora-target-modules instead of the '
        'weights; the reference is the same model with the adapter off.',
        default_note='off: full fine-tuning',
        bound=(lambda v: v >= 0, "must be >= 0; 0 turns LoRA off"))
    lora_alpha: float = option(
        16.0,
        'LoRA scaling alpha (the update is scaled by alpha / R).',
        bound=(FLOAT32, (lambda v: v > 0, "must be > 0, e.g. 16")),
        requires=NEEDS_LORA)
    lora_dropout: float = option(
        0.0,
        "Dropout on the adapter's input, in [0, 1).",
        bound=(lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0"),
        requires=NEEDS_LORA)
    lora_target_modules: tuple | None = option(
        None,
        "Hugging Face module names, or Relax's Megatron names linear_qkv linear_proj "
        'linear_fc1 linear_fc2.',
        nargs='+',
        metavar='NAME',
        default_text='every linear layer of the blocks (q_proj k_proj v_proj o_proj gate_proj up_proj '
        'down_proj; of a mixture of experts, the attention: its experts are not linear layers)',
        requires=NEEDS_LORA)

    @property
    def enabled(self) -> bool:
        return self.lora_rank > 0

    def check(self) -> None:
        if self.enabled and importlib.util.find_spec("peft") is None:
            reject(self, "lora_rank", "needs the peft package; make install in a clone, or "
                   "pip install peft")


# ------------------------------------------------------------------ rules across sections

def check_lora_replication(cfg, explicit: set[str]) -> None:
    """Sections lora, system: LoRA trains with DDP replication."""
    if cfg.lora.enabled and cfg.system.fsdp:
        reject(cfg, ("lora_rank", "fsdp"), "LoRA trains with DDP replication (the adapters are "
               "small); remove --fsdp")
