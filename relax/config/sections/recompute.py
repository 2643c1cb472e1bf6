"""The recompute section (``cfg.recompute``): activation recompute of the policy's training forward
(relax/trainer/policy/recompute.py), and its rules. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Needs, Section, option, reject

NEEDS_FULL = Needs(lambda cfg: cfg.recompute.recompute_granularity == "full",
                   "has no effect without --recompute-granularity full; add it or remove this "
                   "flag", given="changed")

@dataclass(frozen=True)
class RecomputeSection(Section):
    """Activation recompute of the policy's training forward (relax/trainer/policy/recompute.py):
    less memory for one more forward of the recomputed layers (Megatron's flag names);
    ``recompute_granularity`` None is off."""

    recompute_granularity: str | None = option(
        None,
        "full: the decoder layers' activations are not kept for the backward pass; each "
        'recomputed layer keeps its input hidden state and runs its forward again in the '
        'backward (about one more forward pass of the policy per update). Turn it on when '
        'activations dominate peak memory: long responses, large micro-batches '
        "(--micro-batch-size, --max-tokens-per-gpu). Only the update's forward with autograd "
        "is affected. selective is rejected: Megatron's selective recomputes the core "
        "attention's softmax, which the SDPA/flash attention of Hugging Face decoder layers "
        'never stores.',
        choices=('full', 'selective'),
        default_note='off')
    recompute_method: str | None = option(
        None,
        'Which layers --recompute-granularity full recomputes. uniform: all of them (each its '
        "own checkpoint; Megatron's chunks of --recompute-num-layers layers are not formed). "
        'block: only the first --recompute-num-layers layers of the stack.',
        choices=('uniform', 'block'),
        default_text='uniform',
        requires=NEEDS_FULL)
    recompute_num_layers: int | None = option(
        None,
        "N >= 1, at most the model's decoder layers: with --recompute-method block the first N"
        " layers are recomputed, the rest not; with uniform Megatron's chunk size (checked, no"
        ' effect here: every layer is recomputed).',
        default_text='1 with uniform; block needs it',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 (decoder layers)"),
        requires=NEEDS_FULL)

    @property
    def enabled(self) -> bool:
        return self.recompute_granularity is not None

    def check(self) -> None:
        """Its own rules; the layer count is checked when the model is loaded."""
        if self.recompute_granularity == "selective":
            reject(self, "recompute_granularity", "not available: Megatron's selective "
                   "recompute rebuilds the core attention's softmax, which the SDPA/flash "
                   "attention of Hugging Face decoder layers never stores; use full (with "
                   "--recompute-method block --recompute-num-layers N to recompute only N "
                   "layers)")
        if self.recompute_method == "block" and self.recompute_num_layers is None:
            reject(self, "recompute_method", "block recomputes the first N layers; give "
                   "--recompute-num-layers N")
