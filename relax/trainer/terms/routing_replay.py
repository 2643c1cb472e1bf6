"""Routing replay for a mixture-of-experts policy (docs/moe.md, "Routing replay"), and the
routing-mismatch metrics, replayed or not.

The sampler records the experts its forward of each token used (``Experience.routed_experts``,
relax/rollout/generation/generate.py ``Rollout``). Forward hooks on the routers of the policy
(transformers' ``Qwen3MoeTopKRouter``, which returns ``(logits, weights, experts)``) replace
the router's choice by a record wherever one exists, the gate weights recomputed from the
current router's logits over the recorded experts (relax/algorithms/routing.py
``replayed_gate_weights``, R3's softmax over the selected logits); tokens without a record keep
the router's own choice:

    --use-rollout-routing-replay (R3)   every pass of the policy module (pi_old, the update,
                                        the reference of a LoRA run, which is the same module)
                                        replays the sampler's record
    --use-routing-replay (R2)           the update replays the old policy's routing, recorded
                                        by one no-grad padded pass before the update
                                        (``before_update``)

Every forward of the policy goes through ``relax/trainer/policy/logprobs.py``
``response_rows``, which hands this object the micro-batch and the pack's token order
(``begin``); the records stay set until the next ``begin``, so a recomputed layer
(``--recompute-granularity``) replays the same experts in the backward as in the forward.

Metrics, over the (token, layer) pairs of the update's trained micro-batches that have a
sampler record (a recomputed layer is not counted twice):

    train/moe_routing_mismatch           the router's own top-k set differs from the
                                         sampler's (the trainer/sampler routing mismatch)
    train/moe_replayed_routing_mismatch  the experts the update used differ from the
                                         sampler's: the mismatch above without replay, 0 with
                                         R3, the old policy's against the sampler's with R2
"""

from __future__ import annotations

from functools import partial

import torch

from relax.algorithms.routing import replayed_gate_weights
from relax.collectives import all_reduce
from relax.errors import InputError
from relax.trainer.distributed import reshard
from relax.trainer.policy.experience import Experience
from relax.trainer.policy.logprobs import ROUTING_ATTRIBUTE
from relax.trainer.terms.router import sparse_blocks
from relax.trainer.terms.term import Term

STEP_METRICS = ("train/moe_routing_mismatch", "train/moe_replayed_routing_mismatch")
MODES = {"rollout": "--use-rollout-routing-replay", "old": "--use-routing-replay"}


def _flat(records: torch.Tensor | None, order: torch.Tensor | None):
    """[B, S, L, k] records -> [N, L, k] long in a forward's token order (None: all B * S)."""
    if records is None:
        return None
    flat = records.reshape(-1, *records.shape[2:])
    return (flat if order is None else flat[order]).long()


class RoutingReplay(Term):
    """The routers' hooks of one policy module; ``mode``: "rollout" (R3), "old" (R2) or None
    (the metrics only)."""

    def __init__(self, module, mode: str | None = None, group=None):
        self.blocks, self.owner = sparse_blocks(module), module
        self.mode, self.group = mode, group
        self.sampler = self.replay = None  # [N, L, k] of the current forward
        self.counted: set[int] = set()
        self.sums: torch.Tensor | None = None  # pairs, own differs, used differs
        self.handles = [b.gate.register_forward_hook(partial(self._route, j))
                        for j, b in enumerate(self.blocks)]
        # the records apply to the one forward of the module that follows ``begin`` (and its
        # layers' recomputation in the backward, which does not call the module again): any
        # other forward -- a decode through the model's own loop, an evaluation -- routes
        # itself, whatever records are left
        self.pending = self.active = False
        self.handles.append(module.register_forward_pre_hook(self._start))
        setattr(module, ROUTING_ATTRIBUTE, self)

    @classmethod
    def build(cls, module, off_policy, group=None) -> RoutingReplay | None:
        """The replay of ``module`` (``off_policy``: the off-policy section, its replay
        switches); None for a dense model, whose replay flags stop the run."""
        mode = ("rollout" if off_policy.use_rollout_routing_replay
                else "old" if off_policy.use_routing_replay else None)
        if not sparse_blocks(module):
            if mode is not None:
                raise InputError(f"{MODES[mode]}: the model (model_type "
                                 f"{getattr(module.config, 'model_type', '?')!r}) has no "
                                 "Qwen3-MoE mixture-of-experts layers; remove the flag")
            return None
        return cls(module, mode, group)

    def begin(self, batch: Experience, order: torch.Tensor | None) -> None:
        """The records of the forward about to run over ``batch`` (``order``: a pack's
        token indices into its [B, S] grid; None: the padded grid itself)."""
        self.sampler = _flat(batch.routed_experts, order)
        source = {"rollout": batch.routed_experts, "old": batch.old_routed_experts}.get(
            self.mode)
        self.replay = _flat(source, order)
        self.counted = set()
        self.pending = True

    def _start(self, module, args) -> None:
        self.active, self.pending = self.pending, False

    def _route(self, j: int, module, args, output):
        if not self.active:
            return None
        logits, weights, own = output
        if self.replay is not None:
            replay = self.replay[:, j]
            if replay.shape[0] != logits.shape[0]:
                raise RuntimeError(f"routing replay: {replay.shape[0]} records for "
                                   f"{logits.shape[0]} tokens in MoE layer {j}")
            have = (replay >= 0).all(-1, keepdim=True)
            used = torch.where(have, replay, own)
            weights = replayed_gate_weights(logits, used, bool(module.norm_topk_prob))
            output = (logits, weights, used)
        if self.sampler is not None and torch.is_grad_enabled() and j not in self.counted:
            self.counted.add(j)
            self._count(self.sampler[:, j], own, output[2])
        return output

    @torch.no_grad()
    def _count(self, record, own, used) -> None:
        have = (record >= 0).all(-1)
        rec = record.sort(-1).values
        differs = [(x.sort(-1).values != rec).any(-1) & have for x in (own, used)]
        part = torch.stack([have.sum(), differs[0].sum(), differs[1].sum()]).double()
        self.sums = part if self.sums is None else self.sums + part

    def before_update(self, exp, batch, passes: dict) -> None:
        """R2: the old policy's routing of every row, one no-grad padded pass (the update's
        forwards then replay it)."""
        if self.mode == "old":
            exp.old_routed_experts = self.record(exp, passes["micro_batch_size"])

    def record(self, exp: Experience, rows: int) -> torch.Tensor:
        """[B, S, L, k] int16: the experts the module's routers choose for every attended
        token of ``exp`` (padded forwards of ``rows`` rows, no replay), -1 on padding."""
        kept = []
        hooks = [b.gate.register_forward_hook(lambda m, a, o: kept.append(o[2]))
                 for b in self.blocks]
        out = []
        saved, self.mode = self.mode, None
        try:
            with torch.no_grad():
                for i in range(0, len(exp), rows):
                    mb = exp.rows(i, i + rows)
                    kept.clear()
                    self.forward(mb)
                    B, S = mb.input_ids.shape
                    chosen = torch.stack([c.view(B, S, -1) for c in kept], 2)
                    real = mb.attention_mask.bool()[..., None, None]
                    out.append(torch.where(real, chosen, -1).to(torch.int16))
        finally:
            self.mode = saved
            for h in hooks:
                h.remove()
        reshard(self.owner)  # FSDP2: free the gathered parameters, as the no-grad passes do
        return torch.cat(out)

    def forward(self, mb: Experience) -> None:
        self.sampler = self.replay = None
        self.owner(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                   position_ids=mb.position_ids, use_cache=False, logits_to_keep=1)

    def after_update(self, tracker) -> None:
        self.sampler = self.replay = None
        if self.sums is None:
            return
        sums, self.sums = self.sums, None
        all_reduce(sums, self.group)
        pairs = max(float(sums[0]), 1.0)
        tracker.add_global(STEP_METRICS[0], float(sums[1]) / pairs)
        tracker.add_global(STEP_METRICS[1], float(sums[2]) / pairs)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
