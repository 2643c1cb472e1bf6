"""The critic's whole weights as files: what ``--critic-load`` reads and ``--critic-save``
writes (reinforce_plus_plus.md §5c; docs/configuration.md "Critic").

- ``--critic-save DIR`` writes ``DIR/critic.pt`` = ``{"model": weights}``, the value model's
  whole weights under its own names (``lm.*``, ``head.*``), gathered on rank 0 under FSDP2;
  a LoRA critic writes them with its adapters merged, so any run can load them.
- ``--critic-load DIR`` reads ``DIR/critic.pt``, or the critic of a checkpoint directory
  (its DCP shards under :data:`STATE_KEY`, read whole by every rank), into the value model
  before it is wrapped; a tensor that does not fit is one line naming the flag and the key.

Checkpoints hold the critic's sharded training state instead (relax/trainer/terms/critic.py).
"""

from __future__ import annotations

import os

import torch

from relax.config.sections.critic import CRITIC_FILE
from relax.errors import InputError
from relax.trainer.distributed import unwrap
from relax.trainer.policy.lora import merged_copy
from relax.trainer.state import sharded_state

LOAD_FLAG = "--critic-load"
STATE_KEY = "critic"  # the critic's key in a checkpoint's DCP state, beside the policy's


def _saved_shapes(path: str) -> tuple[dict[str, tuple[int, ...]], dict | None]:
    """(name -> shape, the weights when they are in critic.pt) of the critic in ``path``."""
    file = os.path.join(path, CRITIC_FILE)
    if os.path.isfile(file):
        try:
            saved = torch.load(file, map_location="cpu", weights_only=True)["model"]
        except Exception as e:  # a truncated or foreign file
            raise InputError(f"{LOAD_FLAG} {path}: {CRITIC_FILE} is not a Relax critic "
                             f"({type(e).__name__})") from e
        return {k: tuple(v.shape) for k, v in saved.items()}, saved
    try:
        shapes = sharded_state.saved_shapes(path, f"{STATE_KEY}.model.")
    except Exception as e:
        raise InputError(f"{LOAD_FLAG} {path}: neither {CRITIC_FILE} nor a readable "
                         f"checkpoint ({type(e).__name__})") from e
    if not shapes:
        raise InputError(f"{LOAD_FLAG} {path}: the checkpoint holds no critic; it was not "
                         "written by a ppo run")
    if any("lora_" in k for k in shapes):
        raise InputError(f"{LOAD_FLAG} {path}: the checkpoint holds a LoRA critic's adapters "
                         "only, not its weights; point --critic-load at that run's "
                         "--critic-save directory (the adapters merged)")
    return shapes, None


def load_weights(value_model: torch.nn.Module, path: str) -> None:
    """``--critic-load DIR`` into the unwrapped ``value_model``, or one line naming the flag
    and the first tensor that does not fit."""
    shapes, saved = _saved_shapes(path)
    own = value_model.state_dict()
    where = f"{LOAD_FLAG} {path}: the critic there does not fit the model:"
    for key, tensor in own.items():
        if key not in shapes:
            raise InputError(f"{where} it has no {key}")
        if shapes[key] != tuple(tensor.shape):
            raise InputError(f"{where} {key} is {shapes[key]} there, {tuple(tensor.shape)} here")
    extra = sorted(set(shapes) - set(own))
    if extra:
        raise InputError(f"{where} unexpected {extra[0]}")
    if saved is None:  # a checkpoint: its shards, read whole into a copy of our tensors
        saved = {k: torch.empty_like(v, device="cpu") for k, v in own.items()}
        sharded_state.load_tensors(path, {"model": saved}, key=STATE_KEY, what=LOAD_FLAG)
    value_model.load_state_dict(saved)


def whole_weights(model, *, fsdp: bool, is_main: bool, lora=None) -> dict | None:
    """The value model's whole weights on rank 0's CPU, None elsewhere (a collective under
    FSDP2); ``lora`` (peft's tuner on the value model's ``lm``): the adapters merged."""
    if lora is None:
        return sharded_state.full_model_state(model, fsdp=fsdp, is_main=is_main)
    if not is_main:
        return None
    merged = merged_copy(lora)  # a plain copy of the lm; the training model is left as it is
    return {**{f"lm.{k}": v.detach().cpu() for k, v in merged.state_dict().items()},
            **{f"head.{k}": v.detach().cpu() for k, v in unwrap(model).head.state_dict().items()}}


def write_weights(folder: str, weights: dict) -> None:
    """Rank 0: ``folder/critic.pt`` for ``--critic-save``."""
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": weights}, os.path.join(folder, CRITIC_FILE))
