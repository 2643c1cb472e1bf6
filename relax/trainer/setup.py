"""Building the policy, the frozen reference, the tokenizer and the optimizer.

``--hf-checkpoint DIR``: any local Hugging Face causal LM (local files only, nothing is ever
downloaded). Without it: the built-in tiny Qwen3 and character tokenizer of
``relax.rollout.tiny_model``, whose initial weights depend only on ``--seed``.

Trainable weights are fp32 everywhere (AdamW updates of 1e-6 vanish in bf16); with ``--bf16``
(the default on CUDA, relax/precision.py) the forward passes run under bf16 autocast and the
frozen reference is stored in bf16.
"""

from __future__ import annotations

import os

import torch

from relax.errors import InputError


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _check_model_dir(path: str, flag: str) -> None:
    if not os.path.isdir(path):
        raise InputError(f"{flag} {path}: no such directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError(f"{flag} {path}: no config.json; not a Hugging Face model directory")


def check_model_paths(cfg) -> None:
    """Fail before anything is loaded when a model directory is missing."""
    if cfg.hf_checkpoint:
        _check_model_dir(cfg.hf_checkpoint, "--hf-checkpoint")
    if cfg.ref_load:
        _check_model_dir(cfg.ref_load, "--ref-load")


def load_tokenizer(cfg):
    if cfg.hf_checkpoint is None:
        from relax.rollout.tiny_model import build_tokenizer

        return build_tokenizer()
    quiet_transformers()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(cfg.hf_checkpoint, local_files_only=True)
    except Exception as e:  # broken tokenizer files or config.json: one line, not a traceback
        raise InputError(f"--hf-checkpoint {cfg.hf_checkpoint}: cannot load the tokenizer: "
                         f"{_first_line(e)}") from e
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # pad positions are masked everywhere
    if tok.eos_token_id is None:
        raise InputError(f"--hf-checkpoint {cfg.hf_checkpoint}: the tokenizer has no eos token")
    return tok


def _from_pretrained(path: str, dtype: torch.dtype):
    quiet_transformers()
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except Exception as e:  # a truncated safetensors file, a broken config.json, ...
        raise InputError(f"cannot load a causal LM from {path}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split("\n")[:1]).strip()
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def load_policy(cfg, tokenizer, device: torch.device, *, weights_dir: str | None = None):
    """The trainable model in fp32: from ``weights_dir`` (a resume checkpoint), the
    ``--hf-checkpoint``, or the built-in tiny model."""
    path = weights_dir or cfg.hf_checkpoint
    if path is None:
        from relax.rollout.tiny_model import build_tiny_model

        model = build_tiny_model(tokenizer, cfg.seed)
    else:
        model = _from_pretrained(path, torch.float32)
    model.config.use_cache = False  # training passes do not need a cache; generation asks
    return model.to(device).train()


def load_reference(cfg, tokenizer, device: torch.device, *, bf16: bool = False):
    """The frozen reference: ``--ref-load``, else the initial policy weights; stored in bf16
    when the forward passes run in bf16 (it is never trained)."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    if cfg.ref_load or cfg.hf_checkpoint:
        model = _from_pretrained(cfg.ref_load or cfg.hf_checkpoint, dtype)
    else:
        from relax.rollout.tiny_model import build_tiny_model

        model = build_tiny_model(tokenizer, cfg.seed).to(dtype)
    model.requires_grad_(False)
    return model.to(device).eval()


def needs_reference(cfg) -> bool:
    """Reference log-probs only when a KL term reads them (SPEC 3 shaping, SPEC 7 KL loss)."""
    shaping = cfg.advantage_estimator == "reinforce_plus_plus" and cfg.kl_coef > 0
    return shaping or cfg.use_kl_loss


def needs_old_log_probs(cfg) -> bool:
    """Whether the rollout step needs its own no-grad pass for pi_old (SPEC 7 ratio).

    Not needed when one optimizer step covers the whole rollout (``--num-steps-per-rollout``
    1): every micro-batch of that step runs before ``optimizer.step()``, so the policy of the
    update *is* the policy that pi_old denotes, and ``update.micro_batch_loss`` uses its own
    log-probs, detached (ratio exactly 1, gradient of log pi). Still needed when a later
    optimizer step sees a moved policy, and for REINFORCE++ k1 reward shaping, whose returns
    read pi_old before any update (SPEC 3).
    """
    shaping = cfg.advantage_estimator == "reinforce_plus_plus" and cfg.kl_coef > 0
    return shaping or cfg.num_steps_per_rollout > 1


def cpu_threads(*, cpu_count: int | None = None, local_world_size: int = 1,
                environ=None) -> int:
    """Intra-op threads for CPU training: ``OMP_NUM_THREADS`` when the user set it, else the
    cores divided between the local ranks.

    There used to be one thread for models below 1M parameters; with the rollout engine and
    the skipped backward, two threads beat one at hidden 64 too on a quiet 2-core machine
    (55 vs 65 ms per step, docs/performance.md). On a machine shared with other work, one
    thread per rank (``OMP_NUM_THREADS=1``) is the steadier choice.
    """
    environ = os.environ if environ is None else environ
    if environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(environ["OMP_NUM_THREADS"]))
    return max(1, (cpu_count or os.cpu_count() or 1) // max(1, local_world_size))


def eos_token_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(gen_eos)
    return sorted(i for i in ids if i is not None)


def build_optimizer(model, cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        weight_decay=cfg.weight_decay,
    )
