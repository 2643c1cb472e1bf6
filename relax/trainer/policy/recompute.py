"""Activation recompute (``--recompute-granularity full``): the decoder layers chosen by
``--recompute-method`` / ``--recompute-num-layers`` keep only their input hidden state [B, S, H]
in the forward pass and run again in the backward pass to rebuild the rest, trading one more
forward of those layers for their activations (which dominate peak memory with long responses
or large micro-batches).

    apply_recompute(module, RecomputeSection(...))   # before wrap_model (DDP / FSDP2)
    recomputing(module)                               # True while grad is on and layers are wrapped

Which layers, with Megatron's flag meanings:

- ``block``: the first N layers of the stack are recomputed, each as its own checkpoint; the
  others keep their activations as without recompute.
- ``uniform`` (the default): every layer is recomputed. Megatron checkpoints chunks of N
  consecutive layers as one unit, keeping one hidden state per chunk; here each layer is its
  own checkpoint whatever N, so one hidden state per layer is kept (about 1/10 of a layer's
  activations in Llama-shaped models) and the backward rebuilds one layer at a time, not N.
  A chunk cannot be one checkpoint here without replacing the layers' loop, which FSDP2 and
  Hugging Face own.

How: each chosen layer's ``forward`` (the instance attribute, not the module object) becomes
a non-reentrant ``torch.utils.checkpoint`` of the original. Module hooks stay outside the
checkpoint, so FSDP2's ``fully_shard`` on each block still finds the same modules and gathers
the block's parameters before its backward (where the recompute runs). Without grad
(generation, the old and reference log-prob passes, evaluation) the original forward runs
as it is; the rollout engine reads the layers' weights and never calls ``forward``.

The recompute must see the inputs the forward saw, so a layer that writes a KV cache cannot be
recomputed (the rebuild would append its keys again); the training passes use none (a shared
prompt is one block of a pack, relax/trainer/policy/packing.py), and a recomputed packed layer finds
the same pack in its keyword arguments and the same attention function in its config.
"""

from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint

from relax.errors import InputError
from relax.trainer.distributed import decoder_blocks, unwrap


def recomputed_layers(settings, num_layers: int) -> list[int]:
    """Indices of the layers whose activations are recomputed, out of ``num_layers``."""
    if settings.recompute_granularity != "full":
        return []
    if settings.recompute_method == "block":
        return list(range(settings.recompute_num_layers))
    return list(range(num_layers))  # uniform: all of them


def apply_recompute(module: torch.nn.Module, settings) -> list[int]:
    """Wrap the forward of the decoder layers ``settings`` (a
    :class:`~relax.config.sections.RecomputeSection`) selects; returns their indices.

    Raises :class:`InputError` (exit 2) when the model has no decoder layers to find or fewer
    than ``--recompute-num-layers``."""
    if settings.recompute_granularity is None:
        return []
    blocks = decoder_blocks(module)
    if not blocks:
        raise InputError(f"--recompute-granularity {settings.recompute_granularity}: the model "
                         "has no decoder layers to recompute (model.layers or transformer.h); remove "
                         "the flag")
    if settings.recompute_num_layers is not None and settings.recompute_num_layers > len(blocks):
        raise InputError(f"--recompute-num-layers {settings.recompute_num_layers}: the model has "
                         f"{len(blocks)} decoder layers; give at most {len(blocks)}")
    chosen = recomputed_layers(settings, len(blocks))
    for i in chosen:
        # a method bound to the block (not a closure over its forward): a deepcopy of the
        # model rebinds it to the copy's block
        blocks[i].forward = types.MethodType(_recomputed_forward, blocks[i])
    return chosen


def _recomputed_forward(self, *args, **kwargs):
    """The layer's own (class) forward, checkpointed while grad is enabled."""
    forward = type(self).forward.__get__(self)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
        raise RuntimeError("a recomputed decoder layer got a KV cache with grad enabled: its "
                           "recompute would append the keys twice")
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _is_recomputed(block: torch.nn.Module) -> bool:
    return getattr(block.forward, "__func__", None) is _recomputed_forward


def recomputing(model: torch.nn.Module) -> bool:
    """Whether a forward of ``model`` (wrapped or not) now recomputes any layer in its
    backward: grad is enabled and :func:`apply_recompute` wrapped a layer."""
    return torch.is_grad_enabled() and any(map(_is_recomputed, decoder_blocks(unwrap(model))))
