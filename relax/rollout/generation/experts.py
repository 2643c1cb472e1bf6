"""The decode engine's feed-forward block of a mixture-of-experts layer (Qwen3-MoE's
``Qwen3MoeSparseMoeBlock``: a top-k router over E SwiGLU experts stored as
``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I]).

Same function as the module (relax/algorithms/routing.py ``top_k_route`` is its router), from
its parameters read by reference, without its module calls; each call keeps the experts it
chose (``last``, [N, k]) so the engine can record the routing of every token it feeds
(docs/algorithms/moe.md, "Routing record").
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from relax.algorithms.routing import top_k_route


def is_sparse_block(mlp) -> bool:
    """Whether ``mlp`` is Qwen3-MoE's kind of block: a top-k router with ``norm_topk_prob``
    over experts stored as 3-D parameters. (Mixtral's is close but weighs in float32 and
    always renormalizes; other families are not checked here, so they are not this.)"""
    gate, experts = getattr(mlp, "gate", None), getattr(mlp, "experts", None)
    return (gate is not None and experts is not None and hasattr(gate, "top_k")
            and hasattr(gate, "norm_topk_prob")
            and isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor)
            and isinstance(getattr(experts, "down_proj", None), torch.Tensor))


def unsupported_block(mlp) -> str | None:
    """Why the engine cannot run the sparse block ``mlp`` (None when it can)."""
    experts = mlp.experts
    for name in ("has_bias", "has_post_expert_norm", "is_transposed"):
        if getattr(experts, name, False):
            return f"experts with {name}"
    if not getattr(experts, "is_concatenated", True) or not getattr(experts, "has_gate", True):
        return "experts without a concatenated gate / up projection"
    if type(experts.gate_up_proj).__name__ == "DTensor":
        return "sharded parameters (FSDP2)"
    return None


class SparseMoe:
    """``h`` [..., H] -> the block's output [..., H]; the experts chosen per token in
    ``last`` [N, k] (N the tokens of the call, in the order of ``h``'s leading dimensions)."""

    def __init__(self, mlp):
        gate, experts = mlp.gate, mlp.experts
        self.router = gate.weight  # [E, H]
        self.top_k, self.normalize = gate.top_k, bool(gate.norm_topk_prob)
        self.gate_up, self.down = experts.gate_up_proj, experts.down_proj
        self.last: torch.Tensor | None = None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        flat = h.reshape(-1, h.shape[-1])
        weights, chosen = top_k_route(F.linear(flat, self.router), self.top_k, self.normalize)
        self.last = chosen
        out = torch.zeros_like(flat)
        # each expert once over the tokens routed to it (ascending, as the module adds them)
        for e in torch.unique(chosen).tolist():
            token, slot = torch.nonzero(chosen == e, as_tuple=True)
            gate, up = F.linear(flat[token], self.gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down[e]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out.view_as(h)


class RouterRecorder:
    """The routing record of a decode through the model's own forward (the generic loop:
    FSDP2, families the engine does not run): while ``armed``, forward hooks on the routers of
    ``model``'s mixture-of-experts blocks keep the experts each call chose; ``prefill`` /
    ``step`` write them into ``routes`` [B, columns, MoE layers, k] int16 (-1: no record), as
    the engine's ``routed`` has them."""

    def __init__(self, model):
        self.blocks = [m for m in model.modules() if is_sparse_block(m)]
        self.last: list = [None] * len(self.blocks)
        self.routes: torch.Tensor | None = None

    @contextlib.contextmanager
    def armed(self):
        """Hooks on the routers for one forward call, removed after it, whatever happens."""
        handles = [b.gate.register_forward_hook(self._keeper(i))
                   for i, b in enumerate(self.blocks)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _keeper(self, i: int):
        def keep(module, args, output):
            self.last[i] = output[2]
        return keep

    def prefill(self, mask: torch.Tensor, columns: int) -> None:
        if not self.blocks:
            return
        B, P = mask.shape
        k = self.blocks[0].gate.top_k
        self.routes = torch.full((B, columns, len(self.blocks), k), -1, dtype=torch.int16,
                                 device=mask.device)
        for j, chosen in enumerate(self.last):
            self.routes[:, :P, j] = torch.where(mask[..., None], chosen.view(B, P, k).to(
                torch.int16), -1)

    def step(self, col: int) -> None:
        if self.routes is not None:
            for j, chosen in enumerate(self.last):
                self.routes[:, col, j] = chosen.view(self.routes.shape[0], -1).to(torch.int16)
