"""Rules of ``--fully-async`` (docs/configuration.md, "Fully asynchronous"): the placement of
training and rollout ranks in the torchrun job, the staleness bound and what it needs.
Torch-free, like the rest of validation.

The rollout side is the colocated loop's assembly (relax/rollout/assembly.py), so dynamic
sampling, partial rollouts, ``--env`` episodes and agent programs run on the rollout ranks.
"""

from __future__ import annotations

from relax.config.checks import reject
from relax.config.section import value_of

_FLAGS = ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus", "max_staleness",
          "update_weights_interval", "weight_sync_bucket_mb")


def check_fully_async(cfg, explicit: set[str]) -> None:
    for dest in _FLAGS:
        # the vLLM backend syncs its servers every --update-weights-interval steps too, in
        # buckets of --weight-sync-bucket-mb under FSDP2
        vllm_sync = (dest in ("update_weights_interval", "weight_sync_bucket_mb")
                     and cfg.rollout.backend.name == "vllm")
        if dest in explicit and not cfg.placement.fully_async and not vllm_sync:
            reject(cfg, dest, "has no effect without --fully-async; add it or remove this flag")
    if not cfg.placement.fully_async:
        return
    for dest in ("actor_num_nodes", "rollout_num_gpus", "update_weights_interval"):
        if value_of(cfg, dest) < 1:
            reject(cfg, dest, "must be >= 1")
    if cfg.placement.actor_num_gpus_per_node is not None and cfg.placement.actor_num_gpus_per_node < 1:
        reject(cfg, "actor_num_gpus_per_node", "must be >= 1")
    if cfg.placement.max_staleness < 0:
        reject(cfg, "max_staleness", "must be >= 0 (0: every batch sampled with the newest "
               "weights)")
    if cfg.placement.weight_sync_bucket_mb <= 0:
        reject(cfg, "weight_sync_bucket_mb", "must be > 0, e.g. 64")
    if cfg.placement.max_staleness > 0 and not (cfg.rollout.off_policy.use_tis or cfg.rollout.off_policy.use_rollout_logprobs):
        reject(cfg, "max_staleness", "batches sampled with weights up to K steps old need an "
               "importance correction: add --use-tis (or --use-rollout-logprobs), or set "
               "--max-staleness 0")


def training_world_size(cfg, world_size: int) -> int:
    """The data-parallel ranks that train: all of ``WORLD_SIZE`` unless ``--fully-async``,
    which takes ``--rollout-num-gpus`` of them (the last ones) for sampling."""
    if not cfg.placement.fully_async:
        return world_size
    trainers = world_size - cfg.placement.rollout_num_gpus
    if cfg.placement.actor_num_gpus_per_node is not None:
        trainers = cfg.placement.actor_num_nodes * cfg.placement.actor_num_gpus_per_node
    if trainers < 1 or trainers + cfg.placement.rollout_num_gpus != world_size:
        reject(cfg, ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus"),
               f"the job has WORLD_SIZE={world_size} ranks; training ranks (nodes x ranks per "
               "node) plus rollout ranks must add up to it, with at least one of each (e.g. "
               f"torchrun --nproc_per_node {cfg.placement.rollout_num_gpus + 1} for one training rank)")
    if cfg.placement.rollout_num_gpus > trainers:
        reject(cfg, "rollout_num_gpus", f"more rollout ranks than the {trainers} training "
               "ranks: each rollout rank samples whole training ranks' shares, so the others "
               f"would serve none; use at most {trainers}")
    if trainers % cfg.placement.actor_num_nodes:
        reject(cfg, ("actor_num_nodes", "rollout_num_gpus"), f"{trainers} training ranks do "
               "not split evenly over the actor nodes")
    return trainers
