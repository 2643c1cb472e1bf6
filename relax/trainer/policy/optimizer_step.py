"""One optimizer step of a trained model, shared by the policy (relax/trainer/policy/update.py,
reinforce_plus_plus.md §7) and the critic (relax/trainer/terms/critic.py, §5c): AdamW as the
optimizer section says, the step's global token count, and the step itself -- gradients
zeroed in place, accumulated, clipped, the step's metric partial sums summed over the ranks,
checked finite before ``optimizer.step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from relax.collectives import all_reduce

Result = TypeVar("Result")


def build_optimizer(model, optimizer, *, lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, as the optimizer section says (``lr``: another
    learning rate than the section's, the critic's ``--critic-lr``)."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optimizer.lr if lr is None else lr,
        betas=(optimizer.adam_beta1, optimizer.adam_beta2), weight_decay=optimizer.weight_decay)


def global_tokens(mask: torch.Tensor, group) -> torch.Tensor:
    """The step's valid tokens over every rank of ``group``, float64 on the device (one
    all-reduce, no host sync): the denominator of a token-mean loss."""
    return all_reduce(mask.sum().to(torch.float64), group)


def optimizer_step(optimizer: torch.optim.Optimizer, params: list, accumulate: Callable,
                   *, clip_grad: float, group,
                   check: Callable[[list[float], torch.Tensor], Result]) -> Result:
    """One step: ``accumulate()`` runs the backward passes and returns this rank's metric
    partial sums (float64); their sums over ``group`` and the clipped gradient norm go to
    ``check``, which raises on a non-finite value (nothing is stepped then) and gives what the
    step returns.

    The gradients are zeroed in place, not freed: gradients allocated once stay where they
    are instead of being allocated again amid each backward's activations, which fragments the
    host heap (SmolLM2, 16 x 256 with recompute: peak RSS 6.1 -> 5.0 GiB, docs/performance.md
    "What sets the peak"). The gradients are bitwise the same (0 + g = g); a parameter that had
    a gradient once and takes no part in this step gets a zero one, and AdamW then moves it
    (moment decay, weight decay) where None would skip it: no model Relax trains has such
    conditional parameters (no mixture of experts).
    """
    optimizer.zero_grad(set_to_none=False)
    stats = accumulate()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_grad)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    result = check(all_reduce(stats, group).tolist(), grad_norm)
    optimizer.step()
    return result
