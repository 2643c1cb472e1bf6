"""Argument checks shared by the algorithm functions (reinforce_plus_plus.md §13, "Bad input").

Every check raises ``ValueError`` naming the argument and the offending shape, dtype or
value. Nothing here reads tensor *values*, so the checks never synchronise with a device.
"""

from __future__ import annotations

import torch
from torch import Tensor

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def as_bool_mask(mask: Tensor, name: str = "mask") -> Tensor:
    """Return ``mask`` as a bool tensor; a numeric mask is read as ``mask != 0`` (reinforce_plus_plus.md §1)."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"{name} must be 2-D [B, T], got shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise ValueError(f"{name} must be bool or real numeric, got dtype {mask.dtype}")
    return mask != 0


def check_float(x: Tensor, name: str) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}")


def check_like_mask(x: Tensor, mask: Tensor, name: str) -> None:
    """``x`` must be a float tensor with the mask's [B, T] shape."""
    check_float(x, name)
    if x.shape != mask.shape:
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but mask has shape {tuple(mask.shape)}; "
            "they must match [B, T]"
        )


def check_per_response(x: Tensor, mask: Tensor, name: str) -> None:
    """``x`` must be a 1-D float tensor with one entry per row of the mask."""
    check_float(x, name)
    if x.dim() != 1 or x.shape[0] != mask.shape[0]:
        raise ValueError(
            f"{name} must have shape [B] = [{mask.shape[0]}] (one value per response of "
            f"mask {tuple(mask.shape)}), got {tuple(x.shape)}"
        )


def check_group_index(group_index: Tensor, mask: Tensor) -> None:
    if not isinstance(group_index, Tensor):
        raise ValueError(f"group_index must be a torch.Tensor, got {type(group_index).__name__}")
    if group_index.dtype.is_floating_point or group_index.is_complex() or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got dtype {group_index.dtype}")
    if group_index.dim() != 1 or group_index.shape[0] != mask.shape[0]:
        raise ValueError(
            f"group_index must have shape [B] = [{mask.shape[0]}] (one prompt id per response "
            f"of mask {tuple(mask.shape)}), got {tuple(group_index.shape)}"
        )


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """float64 when any input is float64, else float32 (reinforce_plus_plus.md §13: outputs are float32 for
    float32/bf16/fp16 inputs and float64 for float64 inputs)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32
