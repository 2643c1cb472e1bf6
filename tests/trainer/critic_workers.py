"""The per-rank worker of the two-process critic test (reinforce_plus_plus.md §5c): one critic
optimizer step on a fixed batch, kept out of ``test_*.py`` so spawned children import only
this light module."""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.config.critic_fields import CriticSection
from relax.metrics.tracker import MetricTracker
from relax.rollout.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.critic import Critic, ValueModel
from relax.trainer.distributed import DistContext, unwrap, wrap_model
from tests.trainer.workers import B, fixed_experience

SECTION = CriticSection(value_clip=0.05, load=None, save=None, lr=0.1,
                        lr_warmup_iters=0, num_critic_only_steps=0)


def critic_step(micro_batch_size: int):
    """Values of this rank's rows, then one SGD step (lr 0.1, no clipping: a 2x gradient
    scale would show) on the clipped value loss; returns (parameters, values, metrics)."""
    distributed = dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    ctx = DistContext(rank, world, 0, torch.device("cpu"), dist.group.WORLD if distributed else None)
    tok = build_tokenizer()
    exp = fixed_experience(build_tiny_model(tok, seed=7))
    value_model = ValueModel(build_tiny_model(tok, seed=3))
    torch.nn.init.normal_(value_model.head.weight, std=0.5, generator=torch.Generator().manual_seed(5))
    model = wrap_model(value_model, ctx, fsdp=False)
    critic = Critic(model, torch.optim.SGD(model.parameters(), lr=0.1), SECTION, base_lr=0.1,
                    clip_grad=1e6, ctx=ctx, bf16=False)
    rows = B // world
    local = exp.rows(rank * rows, (rank + 1) * rows)
    values = critic.values(local, micro_batch_size=rows)
    g = torch.Generator().manual_seed(9)
    # V_old off the current values so the clip binds on some tokens, targets around them
    local.values = values + 0.1 * torch.randn(B, values.shape[1], generator=g)[rank * rows:][:rows]
    local.returns = values + torch.randn(B, values.shape[1], generator=g)[rank * rows:][:rows]
    tracker = MetricTracker(ctx.group)
    critic.update(local, tracker, global_batch_size=B, micro_batch_size=micro_batch_size)
    params = {n: p.detach().clone() for n, p in unwrap(model).named_parameters()}
    return params, values, tracker.reduce()
