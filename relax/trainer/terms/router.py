"""A mixture-of-experts policy's router: its metrics every step and the optional auxiliary
load-balancing loss (``--moe-aux-loss-coef``; docs/moe.md, "Router metrics and aux loss").

:class:`RouterCapture` keeps, by forward hooks on each top-k router (transformers'
``Qwen3MoeTopKRouter``), the router logits [N, E] and the experts used [N, k] of the latest
forward; :class:`RouterTerm` reads them right after the update's student forward
(``student_rows``), so the loss and the metrics are of the pass the gradient comes from:

    train/moe_aux_loss          mean over layers of (E / k) sum_e f_e P_e (routing.py), the
                                step's mean over micro-batches weighted as the policy loss's
                                reduction weighs them; in the loss as coef * the sum over
                                layers (Megatron-LM adds each layer's), 0: not in the loss
    train/moe_expert_load_max   max_e / mean_e of the tokens routed to each expert over the
                                step (all ranks), averaged over layers: 1 balanced, E / k when
                                every token uses the same k experts
    train/moe_router_entropy    mean entropy (nats) of the router's softmax per token and layer

Tokens counted: every token the forward runs (prompt and response; a prompt that the
shared-prefix layout runs once counts once). Qwen3-MoE has no expert capacity, so no token is
ever dropped and no dropped-token metric exists.
"""

from __future__ import annotations

from functools import partial

import torch

from relax.algorithms.routing import expert_counts, load_balancing_loss, router_entropy
from relax.collectives import all_reduce
from relax.errors import InputError
from relax.trainer.terms.term import LossView, Term

METRICS = ("train/moe_aux_loss",)
STEP_METRICS = ("train/moe_expert_load_max", "train/moe_router_entropy")


def sparse_blocks(module) -> list:
    """The mixture-of-experts blocks of ``module``, in layer order."""
    from relax.rollout.generation.experts import is_sparse_block

    return [m for m in module.modules() if is_sparse_block(m)]


class RouterCapture:
    """Forward hooks on the routers of ``blocks``: ``take()`` gives the latest forward's
    ``[(logits [N, E], experts used [N, k]), ...]`` per layer (hooks run in the order they
    were registered: installed after a routing replay, this sees the replayed experts)."""

    def __init__(self, blocks):
        self.layers: list = [None] * len(blocks)
        self.handles = [b.gate.register_forward_hook(partial(self._keep, i))
                        for i, b in enumerate(blocks)]

    def _keep(self, i: int, module, args, output) -> None:
        self.layers[i] = (output[0], output[2])

    def take(self) -> list:
        out, self.layers = self.layers, [None] * len(self.layers)
        if any(x is None for x in out):
            raise RuntimeError("a router did not run in the forward the router term read")
        return out


class RouterTerm(Term):
    """The router's metrics and ``coef`` times its load-balancing loss (see the module)."""

    metric_names = METRICS

    def __init__(self, capture: RouterCapture, coef: float, num_experts: int, group=None):
        self.capture, self.coef, self.num_experts, self.group = capture, coef, num_experts, group
        self.sums: torch.Tensor | None = None  # [L, E] counts, then entropy sum, tokens

    @classmethod
    def build(cls, module, coef: float, group=None) -> RouterTerm | None:
        """The term of a mixture-of-experts ``module``; None for a dense one (a coefficient
        for it stops the run: it would have nothing to balance)."""
        blocks = sparse_blocks(module)
        if not blocks:
            if coef:
                raise InputError(f"--moe-aux-loss-coef {coef}: the model (model_type "
                                 f"{getattr(module.config, 'model_type', '?')!r}) has no "
                                 "Qwen3-MoE mixture-of-experts layers; remove the flag")
            return None
        # the model's own aux loss is never in Relax's objective (the forward gets no
        # labels); computing it would only cost time
        if getattr(module.config, "output_router_logits", False):
            module.config.output_router_logits = False
        return cls(RouterCapture(blocks), coef, blocks[0].gate.num_experts, group)

    @property
    def keeps_zero_advantage_rows(self) -> bool:
        return bool(self.coef)

    def student_rows(self, rows, mb):
        layers = self.capture.take()
        n = layers[0][0].shape[0]
        # the padded forward runs [B, S] slots (padding weighs 0); a pack only real tokens
        weight = (mb.attention_mask.reshape(-1) if rows.index is None
                  else torch.ones(n, device=layers[0][0].device))
        return layers, weight

    def add_loss(self, loss, view: LossView, rows):
        layers, weight = rows
        per_layer = torch.stack([load_balancing_loss(logits, used, self.num_experts, weight)
                                 for logits, used in layers])
        # this micro-batch's share of the step, as the policy loss's reduction weighs it
        share = view.reduce(torch.ones_like(view.mask, dtype=per_layer.dtype))
        self._accumulate(layers, weight)
        if self.coef:
            loss = loss + self.coef * share * per_layer.sum()
        return loss, [share * per_layer.detach().mean()]

    @torch.no_grad()
    def _accumulate(self, layers, weight) -> None:
        counts = torch.stack([expert_counts(used, self.num_experts, weight)
                              for _, used in layers])
        entropy = sum(router_entropy(logits, weight) for logits, _ in layers) / len(layers)
        tokens = weight.double().sum()
        part = torch.cat([counts.reshape(-1), (entropy * tokens).reshape(1), tokens.reshape(1)])
        self.sums = part if self.sums is None else self.sums + part

    def after_update(self, tracker) -> None:
        if self.sums is None:  # no update this step
            return
        sums, self.sums = self.sums, None
        all_reduce(sums, self.group)
        counts = sums[:-2].view(-1, self.num_experts)
        load = (counts.max(1).values / counts.mean(1).clamp(min=1e-12)).mean()
        tracker.add_global(STEP_METRICS[0], load)
        tracker.add_global(STEP_METRICS[1], sums[-2] / sums[-1].clamp(min=1))
