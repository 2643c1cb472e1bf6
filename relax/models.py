"""Loading Hugging Face models and tokenizers, the device, and the module under a wrapper.

The layer below ``trainer/`` and ``eval/``: both load models through here (``relax train``
and ``relax eval`` read the same directories the same way). ``--hf-checkpoint DIR``: any
local Hugging Face causal LM (local files only, nothing is ever downloaded). Without it: the
built-in tiny Qwen3 and character tokenizer of ``relax.tiny_model``, whose initial
weights depend only on ``--seed``. Trainable weights are fp32 (AdamW updates of 1e-6 vanish in
bf16); with ``--bf16`` the frozen reference is stored in bf16 (relax/precision.py).
"""

from __future__ import annotations

import os

import torch

from relax.errors import InputError
from relax.tiny_model import build_tiny_model, build_tokenizer


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _check_model_dir(path: str, flag: str) -> None:
    if not os.path.isdir(path):
        raise InputError(f"{flag} {path}: no such directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError(f"{flag} {path}: no config.json; not a Hugging Face model directory")


def check_model_paths(model_section) -> None:
    """Fail before anything is loaded when a model directory of ``model_section`` (the
    configuration's model section) is missing."""
    if model_section.hf_checkpoint:
        _check_model_dir(model_section.hf_checkpoint, "--hf-checkpoint")
    if model_section.ref_load:
        _check_model_dir(model_section.ref_load, "--ref-load")


def load_tokenizer(path: str | None, flag: str = "--hf-checkpoint"):
    """The tokenizer of the model directory ``path`` (left padding, a pad token), or the
    built-in character tokenizer when ``path`` is None; ``flag`` names ``path`` in errors."""
    if path is None:
        return build_tokenizer()
    quiet_transformers()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # broken tokenizer files or config.json: one line, not a traceback
        raise InputError(f"{flag} {path}: cannot load the tokenizer: {_first_line(e)}") from e
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # pad positions are masked everywhere
    if tok.eos_token_id is None:
        raise InputError(f"{flag} {path}: the tokenizer has no eos token")
    return tok


ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path: str) -> bool:
    """A PEFT adapter directory (what ``--lora-rank`` runs save), not a whole model."""
    return (os.path.isfile(os.path.join(path, ADAPTER_CONFIG))
            and not os.path.isfile(os.path.join(path, "config.json")))


def load_adapter_model(path: str, dtype: torch.dtype = torch.float32):
    """The base model of the PEFT adapter in ``path`` with the adapter merged into its weights:
    a plain causal LM. The base is the adapter config's ``base_model_name_or_path``, a
    directory (relative paths are taken from ``path``: the built-in model's base is saved
    next to its adapter)."""
    import json

    from peft import PeftModel

    with open(os.path.join(path, ADAPTER_CONFIG), encoding="utf-8") as f:
        base = json.load(f).get("base_model_name_or_path") or ""
    base_dir = base if os.path.isabs(base) else os.path.join(path, base)
    if not base or not os.path.isfile(os.path.join(base_dir, "config.json")):
        raise InputError(f"{path}: the adapter's base model {base!r} is not a model directory "
                         f"here; put the base model there (or edit base_model_name_or_path in "
                         f"{ADAPTER_CONFIG}), or use the merged model the run saved")
    model = _from_pretrained(base_dir, dtype)
    try:
        return PeftModel.from_pretrained(model, path).merge_and_unload()
    except Exception as e:
        raise InputError(f"{path}: cannot apply the adapter to {base_dir}: {_first_line(e)}") from e


def _from_pretrained(path: str, dtype: torch.dtype):
    if is_adapter_dir(path):
        return load_adapter_model(path, dtype)
    quiet_transformers()
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except Exception as e:  # a truncated safetensors file, a broken config.json, ...
        raise InputError(f"cannot load a causal LM from {path}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split("\n")[:1]).strip()
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def load_policy(path: str | None, tokenizer, device: torch.device, *, seed: int):
    """The trainable model in fp32 from the model directory ``path`` (a Hugging Face model or
    a resume checkpoint), or the built-in tiny model initialised from ``seed``."""
    if path is None:
        model = build_tiny_model(tokenizer, seed)
    else:
        model = _from_pretrained(path, torch.float32)
    model.config.use_cache = False  # training passes do not need a cache; generation asks
    return model.to(device).train()


def load_reference(model_section, tokenizer, device: torch.device, *, seed: int,
                   bf16: bool = False):
    """The frozen reference: ``--ref-load``, else the initial policy weights (``model_section``:
    the configuration's model section; ``seed``: the built-in model's); stored in bf16 when
    the forward passes run in bf16 (it is never trained)."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    if model_section.ref_load or model_section.hf_checkpoint:
        model = _from_pretrained(model_section.ref_load or model_section.hf_checkpoint, dtype)
    else:
        model = build_tiny_model(tokenizer, seed).to(dtype)
    model.requires_grad_(False)
    return model.to(device).eval()


def load_judge(path: str, device: torch.device, *, bf16: bool, flag: str = "--genrm-model-path"):
    """A frozen causal LM for judging (relax/rollout/reward/genrm.py), stored in bf16 when the
    forward passes run in bf16, like the reference; a load failure names ``flag``."""
    try:
        model = _from_pretrained(path, torch.bfloat16 if bf16 else torch.float32)
    except InputError as e:
        raise InputError(f"{flag} {path}: {e}") from e
    model.requires_grad_(False)
    return model.to(device).eval()


def eos_token_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return sorted(i for i in ids if i is not None)


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available; use --device cpu or auto")
    return torch.device("cuda", local_rank)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face module under a DDP wrapper (FSDP2 keeps the module itself)."""
    return model.module if hasattr(model, "module") and hasattr(model, "no_sync") else model
