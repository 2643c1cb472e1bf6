"""The optimizer section (``cfg.optimizer``): AdamW at a constant learning rate. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import FLOAT32, Section, option


@dataclass(frozen=True)
class OptimizerSection(Section):
    """AdamW, constant learning rate."""

    lr: float = option(
        1e-06,
        'Learning rate > 0.',
        bound=((lambda v: v > 0.0, "must be > 0, e.g. 1e-6"), FLOAT32))
    weight_decay: float = option(
        0.0,
        'AdamW weight decay.',
        bound=((lambda v: v >= 0.0, "must be >= 0"), FLOAT32))
    adam_beta1: float = option(
        0.9,
        'AdamW beta1.',
        bound=(lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0.9"))
    adam_beta2: float = option(
        0.999,
        'AdamW beta2.',
        bound=(lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0.999"))
    clip_grad: float = option(
        1.0,
        'Gradient-norm clip > 0.',
        bound=(lambda v: v > 0.0, "must be > 0 (gradient-norm clip); the default is 1.0"))
