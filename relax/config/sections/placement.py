"""The placement section (``cfg.placement``): ``--fully-async``, where its rollout and training
ranks run and the staleness between them, and the weight sync to the rollout ranks or vLLM
servers (Relax/slime's flag names; relax/trainer/fully_async/async_layout.py), and their rules
(docs/configuration.md, "Fully asynchronous"). Torch-free.

The rollout side is the colocated loop's assembly (relax/rollout/assembly.py), so dynamic
sampling, partial rollouts, ``--env`` episodes and agent programs run on the rollout ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Needs, Section, option, reject

_NO_EFFECT = "has no effect without --fully-async; add it or remove this flag"
NEEDS_FULLY_ASYNC = Needs(lambda cfg: cfg.placement.fully_async, _NO_EFFECT)
# the vLLM backend syncs its servers every --update-weights-interval steps too, in buckets of
# --weight-sync-bucket-mb under FSDP2
NEEDS_A_WEIGHT_SYNC = Needs(
    lambda cfg: cfg.placement.fully_async or cfg.rollout.backend.rollout_backend == "vllm",
    _NO_EFFECT)


@dataclass(frozen=True)
class PlacementSection(Section):
    """Synchronous training on every rank, or --fully-async: rollout ranks and training ranks
    under one torchrun, weights synced over torch.distributed, a fixed staleness
    (reinforce_plus_plus.md §9)."""

    fully_async: bool = option(
        False,
        'Sample and score on --rollout-num-gpus ranks of their own while the other ranks '
        'train, with a fixed lag of --max-staleness steps (relax/trainer/fully_async/async_layout.py); '
        'rejected for the REINFORCE++ variants, whose normalization needs a closed synchronous'
        ' global batch (reinforce_plus_plus.md §8).')
    actor_num_nodes: int = option(
        1,
        'Nodes of the training ranks (the first ranks of the torchrun job); needs '
        '--fully-async.',
        bound=(lambda v: v >= 1, "must be >= 1"),
        requires=NEEDS_FULLY_ASYNC)
    actor_num_gpus_per_node: int | None = option(
        None,
        'Training ranks per node; needs --fully-async.',
        default_text='(WORLD_SIZE - --rollout-num-gpus) / --actor-num-nodes',
        bound=(lambda v: v is None or v >= 1, "must be >= 1"),
        requires=NEEDS_FULLY_ASYNC)
    rollout_num_gpus: int = option(
        1,
        'Ranks that only sample and score (the last ranks of the torchrun job; on the CPU, '
        'processes); needs --fully-async.',
        bound=(lambda v: v >= 1, "must be >= 1"),
        requires=NEEDS_FULLY_ASYNC)
    max_staleness: int = option(
        1,
        'K: rollout step n trains on the batch sampled with the weights after step n - K (a '
        'fixed lag: runs repeat and resume exactly); 0 waits for the newest weights (the '
        "colocated loop's numbers), K >= 1 overlaps sampling with training and needs --use-tis"
        ' or --use-rollout-logprobs. Needs --fully-async.',
        bound=(lambda v: v >= 0, "must be >= 0 (0: every batch sampled with the newest "
               "weights)"),
        requires=NEEDS_FULLY_ASYNC)
    update_weights_interval: int = option(
        1,
        'Optimizer rollout steps between weight syncs to the rollout ranks (--fully-async) or '
        'to the vLLM servers (--rollout-backend vllm); needs one of the two.',
        bound=(lambda v: v >= 1, "must be >= 1"),
        requires=NEEDS_A_WEIGHT_SYNC)
    weight_sync_bucket_mb: float = option(
        64.0,
        'Size of one weight-sync broadcast (--fully-async) or written file (--rollout-backend '
        'vllm with --fsdp): no rank holds more than one bucket of gathered weights beyond its '
        'shard; needs one of the two.',
        bound=(lambda v: v > 0, "must be > 0, e.g. 64"),
        requires=NEEDS_A_WEIGHT_SYNC)


# ------------------------------------------------------------------ rules across sections

def check_staleness(cfg, explicit: set[str]) -> None:
    """Sections placement, rollout.off_policy: batches sampled with older weights need an
    importance correction."""
    if cfg.placement.fully_async and cfg.placement.max_staleness > 0 and not \
            cfg.rollout.off_policy.corrects_sampler:
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
