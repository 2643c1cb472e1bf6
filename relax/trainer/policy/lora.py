"""LoRA policy training (``--lora-rank R``), built on the ``peft`` library.

The adapter is injected into the policy's own Hugging Face module, so generation, log-probs,
DDP and the update see one ordinary model whose only trainable parameters are the LoRA
matrices (AdamW keeps state for those only). The reference policy is the same module with the
adapter switched off (:func:`adapter_disabled`): no second copy of the weights exists.

Checkpoints of a LoRA run hold the trainable (adapter) weights and their optimizer state only
(relax/trainer/state/sharded_state.py, ``trainable_only``), and an ``adapter/`` directory in PEFT's
format (:func:`save_adapter`); the final save is the merged model plus that directory.
"""

from __future__ import annotations

import contextlib
import copy
import os

import torch

from relax.errors import InputError
from relax.seeding import seed_for

# Relax's Megatron-style names -> the Hugging Face Llama/Qwen module names they cover
MEGATRON_NAMES: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def hf_target_names(names: list[str]) -> list[str]:
    """``--lora-target-modules`` with Megatron names mapped to Hugging Face ones, in order."""
    out: list[str] = []
    for name in names:
        for hf in MEGATRON_NAMES.get(name, (name,)):
            if hf not in out:
                out.append(hf)
    return out


def _linear_names(model: torch.nn.Module) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear)})


def add_lora(model: torch.nn.Module, *, rank: int, alpha: float, dropout: float,
             targets: list[str], seed: int = 0):
    """Inject LoRA adapters into ``model`` (in place) and return peft's tuner (a ``LoraModel``,
    for switching the adapter off and saving it); ``model`` stays the module to train.

    peft draws the initial ``lora_A`` from the global RNG; it is drawn here from ``seed`` (the
    run's --seed) in a forked RNG, so a run's adapter starts the same whatever ran before it
    in the process, and the global stream is left as it was."""
    from peft import LoraConfig, LoraModel

    names = hf_target_names(targets)
    present = _linear_names(model)
    missing = [n for n in names if n not in present]
    if missing:
        raise InputError(f"--lora-target-modules {' '.join(targets)}: the model has no linear "
                         f"layer named {missing[0]!r}; its linear layers are "
                         f"{', '.join(present)} (or Megatron names {', '.join(MEGATRON_NAMES)})")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=names,
                        bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tuner = LoraModel(model, config, "default")
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return tuner


@contextlib.contextmanager
def adapter_disabled(tuner):
    """The base model (the reference policy) for the duration of the block."""
    tuner.disable_adapter_layers()
    try:
        yield
    finally:
        tuner.enable_adapter_layers()


def merged_copy(tuner) -> torch.nn.Module:
    """A plain Hugging Face model with the adapter merged into its weights (the export); the
    training model is left as it is."""
    return copy.deepcopy(tuner).merge_and_unload()


ADAPTER_DIR = "adapter"  # inside a checkpoint and inside the final --save directory


def save_adapter(model: torch.nn.Module, tuner, folder: str, *, base: str | None,
                 tokenizer) -> None:
    """Write the adapter in PEFT's format into ``folder`` (new): ``adapter_config.json``,
    ``adapter_model.safetensors`` (keys ``base_model.model.<module>.lora_A.weight``) and the
    tokenizer, so ``PeftModel.from_pretrained(base_model, folder)`` and ``relax eval folder``
    load it. ``base``: the --hf-checkpoint directory, recorded as the base model; None (the
    built-in model, which exists only in code) saves the base into ``folder/base``."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    os.makedirs(folder)
    weights = get_peft_model_state_dict(model, adapter_name="default")
    save_file({f"base_model.model.{k}": v.detach().cpu().contiguous()
               for k, v in weights.items()},
              os.path.join(folder, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(tuner.peft_config["default"])
    if base is None:
        copy.deepcopy(tuner).unload().save_pretrained(os.path.join(folder, "base"))
        tokenizer.save_pretrained(os.path.join(folder, "base"))
        config.base_model_name_or_path = "base"
    else:
        config.base_model_name_or_path = os.path.abspath(base)
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def default_targets(model: torch.nn.Module) -> list[str]:
    """The layers of :data:`ALL_LINEAR` that ``model`` has: all of them in a dense model; the
    attention projections (and any dense MLP layer's) in a mixture of experts, whose experts are
    3-D parameters and whose router is not a Linear either (docs/moe.md, "LoRA")."""
    present = _linear_names(model)
    return [n for n in ALL_LINEAR if n in present]


def add_configured(module: torch.nn.Module, section, seed: int):
    """The run's adapter (``cfg.lora``, a LoraSection) on ``module``, its A drawn from the run's
    seed: the training policy and a --fully-async rollout rank build the same adapter."""
    return add_lora(module, rank=section.lora_rank, alpha=section.lora_alpha,
                    dropout=section.lora_dropout,
                    targets=list(section.lora_target_modules or default_targets(module)),
                    seed=seed_for(seed, "lora"))

