"""Argument checks shared by the algorithm functions (reinforce_plus_plus.md §13, "Bad input").

Every check raises ``ValueError`` naming the argument and the offending shape, dtype or
value. Nothing here touches tensor *values*, so the checks never synchronise with a device.
"""

from __future__ import annotations

import struct

import numpy as np
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


# Bitwise selection. ``torch.where`` with a bool condition runs ~4x slower than a plain
# elementwise pass on the CPU; AND-ing the IEEE bit pattern with an all-ones/all-zeros word
# is the same boolean select (exact; NaN and Inf become +0.0, nothing is multiplied) at
# memory speed. The selects take "keep" words from keep_bits:
#
# * on the CPU (NumPy path): int8, -1 (all ones) or 0, one byte per token. NumPy ANDs them
#   into float32/float64 bit patterns with a sign-extending cast on the fly, as fast as an
#   AND of equal widths, and the mask costs 8 MB instead of 32 at 1024 x 8192 (torch's
#   mixed-width AND measured ~3x slower than NumPy's, so torch never sees them);
# * elsewhere (torch path, what accelerators run): the float's width (int32 / int64).
_INT_OF = {torch.float32: torch.int32, torch.float64: torch.int64}
_NP_INT_OF = {torch.float32: np.int32, torch.float64: np.int64}

# Several helpers take a NumPy path for CPU tensors, where NumPy's vectorised byte and
# integer loops beat torch's (measured in each docstring). The torch path is what
# accelerators run; the tests set this to False to run that path on the CPU too.
NUMPY_ON_CPU = True


def numpy_path(t: Tensor) -> bool:
    """Whether ``t`` takes the NumPy fast path (a CPU tensor, see :data:`NUMPY_ON_CPU`)."""
    return NUMPY_ON_CPU and t.device.type == "cpu"


def keep_bits(mask: Tensor, dtype: torch.dtype, *, invert: bool = False) -> Tensor:
    """Keep words for selecting ``dtype`` values: all ones where ``mask`` (bool [B, T]),
    0 elsewhere (where ``~mask`` with ``invert``). int8 on the NumPy path (one pass over
    the mask bytes: ``-int8(mask)`` or ``int8(mask) - 1``), else ``dtype``'s integer width."""
    if numpy_path(mask):
        flags = mask.detach().numpy().view(np.int8)
        return torch.from_numpy(np.subtract(flags, 1) if invert else np.negative(flags))
    bits = torch.empty(mask.shape, dtype=_INT_OF[dtype], device=mask.device)
    bits.copy_(mask)
    return bits.sub_(1) if invert else bits.neg_()


def float_bits(value: float, dtype: torch.dtype) -> int:
    """The IEEE bit pattern of ``value`` rounded to ``dtype`` (float32/float64), as a signed
    int of that width: a constant for the bitwise selects, computed on the host from a
    Python float (no tensor involved)."""
    fmt, ifmt = ("<f", "<i") if dtype == torch.float32 else ("<d", "<q")
    return struct.unpack(ifmt, struct.pack(fmt, value))[0]


def select_into(x: Tensor, keep: Tensor, out: Tensor) -> Tensor:
    """``out = x where keep else +0.0`` for float tensors ``x``/``out`` of one dtype
    (``out`` may be ``x``; ``x`` may also be a [B, 1] column broadcast over the rows).
    Returns ``out``. No autograd."""
    if keep.dtype == torch.int8:  # NumPy path, see above
        np_int = _NP_INT_OF[out.dtype]
        np.bitwise_and(x.detach().numpy().view(np_int), keep.numpy(), out=out.detach().numpy().view(np_int),
                       dtype=np_int, casting="unsafe")
        return out
    int_dtype = _INT_OF[out.dtype]
    torch.bitwise_and(x.detach().view(int_dtype).expand_as(keep), keep, out=out.view(int_dtype))
    return out


def select_(x: Tensor, keep: Tensor) -> Tensor:
    """In place: keep ``x`` where ``keep`` is all ones, set +0.0 elsewhere. Returns ``x``."""
    return select_into(x, keep, x)


def select_copy(x: Tensor, keep: Tensor, dtype: torch.dtype) -> Tensor:
    """A new contiguous ``dtype`` tensor equal to ``x`` where ``keep``, +0.0 elsewhere.

    The copy is made by torch (a fresh buffer's page faults spread over its threads), the
    select runs in place."""
    return select_(x.detach().to(dtype, copy=True, memory_format=torch.contiguous_format), keep)


def select_rows(rows: Tensor, keep: Tensor) -> Tensor:
    """A new [B, T] tensor: ``rows[i]`` ([B], float) where ``keep``, +0.0 elsewhere."""
    out = rows[:, None].expand(keep.shape).contiguous()  # torch writes (and faults) the buffer
    return select_(out, keep)


def row_counts(mask: Tensor) -> Tensor:
    """``L_i`` = number of ``True`` per row of a bool [B, T] mask, int64 [B], on mask's device.

    On the CPU NumPy sums the mask bytes (~1/20 of a B x T copy); torch's integer
    reduction along a row measured 20-30x slower there. Elsewhere torch reduces on the device.
    """
    if not numpy_path(mask):
        return mask.sum(dim=1)
    counts = mask.detach().numpy().view(np.uint8).sum(axis=1, dtype=np.uint32)
    return torch.from_numpy(counts.astype(np.int64))


def count_true(mask: Tensor) -> Tensor:
    """Number of ``True`` in a bool mask as a 0-d int64 tensor on the mask's device
    (NumPy on the CPU: ~30x faster than ``torch.count_nonzero`` there)."""
    if not numpy_path(mask):
        return torch.count_nonzero(mask)
    return torch.tensor(int(np.count_nonzero(mask.detach().numpy())), dtype=torch.int64)
