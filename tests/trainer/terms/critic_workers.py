"""The per-rank worker of the two-process critic tests (reinforce_plus_plus.md §5c): one
critic optimizer step on a fixed batch, replicated (DDP) or sharded (FSDP2), and a checkpoint
round trip; kept out of ``test_*.py`` so spawned children import only this light module."""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.config.sections.critic import CriticSection
from relax.metrics.tracker import MetricTracker
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext, decoder_blocks, unwrap, wrap_model
from relax.trainer.state import sharded_state
from relax.trainer.terms.critic import Critic, ValueModel
from tests.trainer.workers import B, fixed_experience

SECTION = CriticSection(value_clip=0.05, critic_load=None, critic_save=None, critic_lr=0.1,
                        critic_lr_warmup_iters=0, num_critic_only_steps=0)


def _context() -> DistContext:
    distributed = dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    return DistContext(rank, world, 0, torch.device("cpu"),
                       dist.group.WORLD if distributed else None)


def _critic(ctx: DistContext, fsdp: bool) -> Critic:
    """The same value model on every rank and in every call (a random head, so the values
    differ between tokens), under SGD with momentum: no scale invariance, so a 2x gradient
    would show, and a state for the checkpoint to hold."""
    lm = build_tiny_model(build_tokenizer(), seed=3)
    value_model = ValueModel(lm)
    torch.nn.init.normal_(value_model.head.weight, std=0.5,
                          generator=torch.Generator().manual_seed(5))
    model = wrap_model(value_model, ctx, fsdp=fsdp, blocks=decoder_blocks(lm))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return Critic(model, optimizer, SECTION, base_lr=0.1, clip_grad=1e6, ctx=ctx, bf16=False,
                  fsdp=fsdp)


def _whole(critic: Critic) -> dict[str, torch.Tensor]:
    """Every parameter whole (FSDP2's shards gathered), by name."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in unwrap(critic.model).named_parameters()}


def _train(critic: Critic, local, micro_batch_size: int, max_tokens: int | None) -> dict:
    tracker = MetricTracker(critic.ctx.group)
    critic.update(local, tracker, global_batch_size=B, micro_batch_size=micro_batch_size,
                  max_tokens=max_tokens)
    return tracker.reduce()


def critic_step(micro_batch_size: int, fsdp: bool = False, folder: str | None = None,
                max_tokens: int | None = None):
    """Values of this rank's rows, the targets' statistics, then one SGD step (lr 0.1, no
    gradient clipping) on the clipped value loss. Returns (parameters, values, metrics) and,
    with ``folder``, the round trip: a second step after saving the critic there, and the
    same step by a fresh critic that loaded it (parameters and metrics of both).
    ``max_tokens``: token-budget micro-batches (with two ranks and 12 tokens, rank 0's rows
    make 3 and rank 1's 4, so sharded ranks must split theirs to stay paired)."""
    ctx = _context()
    critic = _critic(ctx, fsdp)
    exp = fixed_experience(build_tiny_model(build_tokenizer(), seed=7))
    rows = B // ctx.world_size
    local = exp.rows(ctx.rank * rows, (ctx.rank + 1) * rows)
    values = critic.values(local, micro_batch_size=rows, max_tokens=max_tokens, group=ctx.group)
    g = torch.Generator().manual_seed(9)
    mine = slice(ctx.rank * rows, (ctx.rank + 1) * rows)
    # V_old off the current values so the clip binds on some tokens, targets around them
    local.values = values + 0.1 * torch.randn(B, values.shape[1], generator=g)[mine]
    raw = torch.randn(B, values.shape[1], generator=g)[mine] - 0.1 * local.values
    tracker = MetricTracker(ctx.group)
    critic.targets(local, torch.where(local.response_mask, raw, 0.0), tracker)
    metrics = {**tracker.reduce(), **_train(critic, local, micro_batch_size, max_tokens)}
    out = (_whole(critic), values, metrics)
    if folder is None:
        return out
    sharded_state.save_sharded(critic.checkpoint_state(), folder, group=ctx.group)
    resumed = _critic(ctx, fsdp)
    resumed.load(folder)
    loaded = _whole(resumed)
    kept_metrics = _train(critic, local, micro_batch_size, max_tokens)
    again_metrics = _train(resumed, local, micro_batch_size, max_tokens)
    return (*out, loaded, (_whole(critic), kept_metrics), (_whole(resumed), again_metrics))
