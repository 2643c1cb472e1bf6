"""Rules of the activation-recompute flags (relax/trainer/recompute.py). Torch-free, like the
rest of validation; the layer count is checked when the model is loaded."""

from __future__ import annotations

from relax.config.checks import reject


def check_recompute(cfg) -> None:
    if cfg.recompute_granularity == "selective":
        reject(cfg, "recompute_granularity", "not available: Megatron's selective recompute "
               "rebuilds the core attention's softmax, which the SDPA/flash attention of "
               "Hugging Face decoder layers never stores; use full (with --recompute-method "
               "block --recompute-num-layers N to recompute only N layers)")
    for dest in ("recompute_method", "recompute_num_layers"):
        if getattr(cfg, dest) is not None and cfg.recompute_granularity != "full":
            reject(cfg, dest, "has no effect without --recompute-granularity full; add it or "
                   "remove this flag")
    if cfg.recompute_num_layers is not None and cfg.recompute_num_layers < 1:
        reject(cfg, "recompute_num_layers", "must be >= 1 (decoder layers)")
    if cfg.recompute_method == "block" and cfg.recompute_num_layers is None:
        reject(cfg, "recompute_method", "block recomputes the first N layers; give "
               "--recompute-num-layers N")
