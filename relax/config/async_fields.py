"""The placement section (``cfg.placement``): ``--fully-async``, where its rollout and training
ranks run and the staleness between them, and the weight sync to the rollout ranks or vLLM
servers (Relax/slime's flag names; relax/trainer/fully_async/async_layout.py). Rules:
relax/config/async_rules.py. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, option


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
        '--fully-async.')
    actor_num_gpus_per_node: int | None = option(
        None,
        'Training ranks per node; needs --fully-async.',
        default_text='(WORLD_SIZE - --rollout-num-gpus) / --actor-num-nodes')
    rollout_num_gpus: int = option(
        1,
        'Ranks that only sample and score (the last ranks of the torchrun job; on the CPU, '
        'processes); needs --fully-async.')
    max_staleness: int = option(
        1,
        'K: rollout step n trains on the batch sampled with the weights after step n - K (a '
        'fixed lag: runs repeat and resume exactly); 0 waits for the newest weights (the '
        "colocated loop's numbers), K >= 1 overlaps sampling with training and needs --use-tis"
        ' or --use-rollout-logprobs. Needs --fully-async.')
    update_weights_interval: int = option(
        1,
        'Optimizer rollout steps between weight syncs to the rollout ranks (--fully-async) or '
        'to the vLLM servers (--rollout-backend vllm); needs one of the two.')
    weight_sync_bucket_mb: float = option(
        64.0,
        'Size of one weight-sync broadcast (--fully-async) or written file (--rollout-backend '
        'vllm with --fsdp): no rank holds more than one bucket of gathered weights beyond its '
        'shard; needs one of the two.')
