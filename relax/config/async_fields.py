"""The ``--fully-async`` placement and staleness flags (Relax/slime's names), a base of
:class:`~relax.config.schema.TrainConfig` so the schema module stays readable; rules:
relax/config/async_rules.py."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.fields import option


@dataclass(frozen=True)
class FullyAsyncFields:
    actor_num_nodes: int = option(
        1, "Nodes of the training ranks (the first ranks of the torchrun job); needs "
        "--fully-async.", group="async")
    actor_num_gpus_per_node: int | None = option(
        None, "Training ranks per node; needs --fully-async.",
        default_text="(WORLD_SIZE - --rollout-num-gpus) / --actor-num-nodes", group="async")
    rollout_num_gpus: int = option(
        1, "Ranks that only sample and score (the last ranks of the torchrun job; on the "
        "CPU, processes); needs --fully-async.", group="async")
    max_staleness: int = option(
        1, "K: rollout step n trains on the batch sampled with the weights after step "
        "n - K (a fixed lag: runs repeat and resume exactly); 0 waits for the newest weights "
        "(the colocated loop's numbers), K >= 1 overlaps sampling with training and needs "
        "--use-tis or --use-rollout-logprobs. Needs --fully-async.", group="async")
    update_weights_interval: int = option(
        1, "Optimizer rollout steps between weight syncs to the rollout ranks "
        "(--fully-async) or to the vLLM servers (--rollout-backend vllm); needs one of the "
        "two.", group="async")
    weight_sync_bucket_mb: float = option(
        64.0, "Size of one weight-sync broadcast (--fully-async) or written file (--rollout-"
        "backend vllm with --fsdp): no rank holds more than one bucket of gathered weights "
        "beyond its shard; needs one of the two.", group="async")
