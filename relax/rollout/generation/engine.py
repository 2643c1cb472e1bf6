"""A lean sampling forward for Llama-family causal LMs (Qwen3, Qwen2, Llama, Qwen3-MoE): the
rollout engine.

Why it exists: for the small models Relax trains on a CPU, one decode step through the
Hugging Face module stack costs far more than its matrix products -- a causal mask rebuilt per
step, a KV cache grown with ``torch.cat``, a flash-attention kernel for a single query, and a
Python call per module. This engine computes the same function from the same parameters
(read, never copied, at each rollout, so it always samples from the current policy) with:

* a preallocated KV cache written in place, one column per step;
* attention for the single new query as two batched products over the filled columns, with the
  prompt padding as an additive bias built once;
* RoPE cos/sin looked up from a table made once per rollout by the model's own rotary module
  (so every RoPE variant the model supports is honoured);
* the prompt prefill run once per distinct prompt: the n samples of a group share their
  prompt, so its keys and values are computed once and indexed out to the n rows;
* rows that ended (EOS) leave the batch (``keep``, called by ``generate`` once they are an
  eighth of the rows still computed), so long length limits cost only what rows use.
* between the turns of an episode the rows' caches are kept (``retain``, ``chunks``) and the
  next prefill computes only each row's new tokens, the rest copied from ``past``
  (relax/rollout/generation/turn_cache.py);
* a mixture-of-experts layer (Qwen3-MoE) runs its router and the chosen experts from their
  parameters (relax/rollout/generation/experts.py);
* rows whose groups share a beginning (``shared``: the judging prompts of one question's
  samples, relax/rollout/generation/shared_prefix.py) prefill each group's shared tokens once
  and then, as a next turn does, only each row's own.

The architecture contract it relies on is checked by ``unsupported_reason``; a model that does
not match (another family, sliding-window layers, an activation other than SiLU, a sharded
FSDP2 model whose parameters are DTensors, peft layers other than plain LoRA linears) is
decoded through its own ``forward`` instead. A peft LoRA linear layer (``--lora-rank``) runs as
its base weight plus the adapter's low-rank path.
The logits equal the model's own forward up to float rounding
(tests/rollout/generation/test_engine.py checks both against a float64 run of the Hugging Face model).
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.nn.functional as F

from relax.rollout.generation.experts import SparseMoe, is_sparse_block, unsupported_block

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "qwen3_moe")


def unsupported_reason(model) -> str | None:
    """Why ``model`` cannot use the engine, or None when it can."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (the engine implements SiLU gating)"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "sliding-window attention layers"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "no model.layers / lm_head"
    for layer in inner.layers:  # a mixture-of-experts layer: a block the engine implements
        reason = unsupported_block(layer.mlp) if is_sparse_block(layer.mlp) else None
        if reason is not None:
            return reason
    # a peft layer wraps a base module (its .weight is the frozen base): plain LoRA linear
    # layers run through _Linear; anything else (DoRA, embeddings, an active dropout) would be
    # skipped by reading weights
    for m in model.modules():
        if (type(m).__module__.startswith("peft.") and hasattr(m, "base_layer")
                and _lora_parts(m) is None):
            return f"peft layer {type(m).__name__} (the engine runs plain LoRA linear layers)"
    # no DTensor can exist unless its module was imported (importing it costs ~0.5 s and sympy)
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and any(isinstance(p, dtensor.DTensor) for p in model.parameters()):
        return "sharded parameters (FSDP2)"
    return None


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """The distinct rows of a left-padded prompt batch: ``(ids [U, P], mask [U, P] long,
    inverse [B])`` with row i of the batch equal to row ``inverse[i]`` (the n samples of a
    group share their prompt, so U is about B / n)."""
    P = prompt_ids.shape[1]
    key = torch.cat([prompt_ids, prompt_mask.long()], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    return unique[:, :P], unique[:, P:], inverse


def cache_argument(model) -> str:
    """The keyword of the model's forward that takes a KV cache: transformers 5 renamed
    ``past_key_values`` to ``cache``; accept models of either vintage."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else (
        "past_key_values")


def _lora_parts(module):
    """``(base linear, [(A, B, scale), ...])`` of a peft LoRA linear layer and its active
    adapters (none while disabled or merged into the base weight), or None for a peft layer
    the engine cannot run exactly: DoRA, a LoRA dropout that is not the identity (the engine
    samples without dropout), a base that is not a Linear (embeddings), other tuners."""
    base, lora_a, lora_b = module.base_layer, getattr(module, "lora_A", None), getattr(
        module, "lora_B", None)
    if lora_a is None or lora_b is None or type(base) is not torch.nn.Linear:
        return None
    parts = []
    if not (module.disable_adapters or module.merged):
        for name in module.active_adapters:
            if name not in lora_a:
                continue
            if module.use_dora.get(name) or not isinstance(module.lora_dropout[name],
                                                           torch.nn.Identity):
                return None
            parts.append((lora_a[name].weight, lora_b[name].weight, module.scaling[name]))
    return base, parts


class _Linear:
    """A linear layer as the engine computes it: ``F.linear`` with the module's weight and bias
    (references, read when the engine is built for a rollout), plus for a peft LoRA layer each
    active adapter's ``scale * B (A x)``, peft's own formula without its module calls."""

    def __init__(self, module):
        if hasattr(module, "base_layer"):
            base, self.adapters = _lora_parts(module)
        else:
            base, self.adapters = module, []
        self.weight, self.bias = base.weight, getattr(base, "bias", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        for a, b, scale in self.adapters:
            out = out + F.linear(F.linear(x, a), b) * scale
        return out


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the Hugging Face RMSNorm: statistics in float32, then the weight in the input dtype
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as the model applies it: x * cos + rotate_half(x) * sin (halves, not pairs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _Layer:
    """One decoder layer's parameters (references, not copies) and constants."""

    def __init__(self, layer, num_heads: int, num_kv_heads: int, head_dim: int):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = (_Linear(m) for m in (attn.q_proj, attn.k_proj,
                                                                  attn.v_proj, attn.o_proj))
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        self.scaling = getattr(attn, "scaling", head_dim**-0.5)
        self.in_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        # a mixture-of-experts layer (Qwen3-MoE) or a dense SwiGLU one
        self.moe = SparseMoe(mlp) if is_sparse_block(mlp) else None
        if self.moe is None:
            self.gate, self.up, self.down = (_Linear(m) for m in (mlp.gate_proj, mlp.up_proj,
                                                                  mlp.down_proj))
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def qkv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """h [..., H] -> q [..., nh, hd], k and v [..., nkv, hd]; normed and rotated."""
        lead = h.shape[:-1]
        q = self.q(h).view(*lead, self.num_heads, self.head_dim)
        k = self.k(h).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v(h).view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
            q = _rms(q, self.q_norm.weight, self.q_norm.variance_epsilon)
            k = _rms(k, self.k_norm.weight, self.k_norm.variance_epsilon)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = _rms(x, self.post_norm.weight, self.post_norm.variance_epsilon)
        if self.moe is not None:
            return x + self.moe(h)
        act = F.silu(self.gate(h)) * self.up(h)
        return x + self.down(act)


class DecodeEngine:
    """Incremental sampling forward over a static KV cache.

    ``prefill(prompt_ids [B, P], prompt_mask [B, P], max_new_tokens)`` returns the logits [B, V]
    for the first new token; each ``step(tokens [B])`` appends one column and returns the next
    logits [B, V]. Prompts are left-padded, so every row writes the same cache column per step.
    With ``retain``, ``chunks()`` hands every row's cache to the next call's ``past`` (the
    turns of an episode, relax/rollout/generation/turn_cache.py).
    """

    def __init__(self, model, *, retain: bool = False):
        self.retain = retain  # keep the cache of rows that leave the batch (``chunks``)
        self.routes = None  # a mixture of experts: the experts each column used (``routed``)
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the decode engine cannot run this model: {reason}")
        cfg = model.config
        inner = model.model
        self.embed, self.final_norm = inner.embed_tokens, inner.norm
        self.lm_head = _Linear(model.lm_head)
        self.rotary = inner.rotary_emb
        num_heads = cfg.num_attention_heads
        num_kv_heads = getattr(cfg, "num_key_value_heads", None) or num_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.groups = num_heads // num_kv_heads
        self.layers = [_Layer(layer, num_heads, num_kv_heads, head_dim) for layer in inner.layers]
        self.moe = [layer.moe for layer in self.layers if layer.moe is not None]

    # ------------------------------------------------------------------ prefill
    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
                past=None, shared=None):
        """Logits [B, V] of the first new token after the left-padded ``prompt_ids`` [B, P].

        ``past`` (relax/rollout/generation/turn_cache.py ``Past``): the keys and values of each row's
        first ``past.cached[i]`` real tokens, kept from an earlier call; only the rest of each
        row is computed (at least one token per row). ``shared``
        (relax/rollout/generation/shared_prefix.py ``SharedPrefixes``, not with ``past``): the
        groups' shared first tokens are prefilled once per group and make the past. None of
        either computes every row."""
        if past is not None and shared is not None:
            raise ValueError("prefill takes a past or shared prefixes, not both")
        B, P = prompt_ids.shape
        device = prompt_ids.device
        positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, P]
        # one cos/sin row per position any row can reach during this rollout
        table_pos = torch.arange(P + max_new_tokens, device=device)[None]
        cos, sin = self.rotary(self.embed.weight[:1], table_pos)
        self.cos, self.sin = cos[0], sin[0]  # [L, hd]
        self.next_position = positions[:, -1] + 1  # [B]
        # the rows still computed (``keep``) by their index in this batch, and the cache of
        # the rows that left, for ``chunks`` (kept only with ``retain``)
        self.rows, self.retired = torch.arange(B, device=device), []
        L = P + max_new_tokens
        if shared is not None:
            past = self._shared_past(prompt_ids, prompt_mask, shared)
        if past is None:
            last = self._prefill_distinct(prompt_ids, prompt_mask, L)
        else:
            last = self._prefill_new(prompt_ids, prompt_mask, positions, L, past)
        if self.moe:
            self._record_prefill(prompt_mask, L, fresh=past is not None)
        # padded prompt columns never receive attention from a generated token
        bias = torch.zeros(B, L, dtype=last.dtype, device=device)
        bias[:, :P].masked_fill_(~prompt_mask, float("-inf"))
        self.bias = bias[:, None, None, :]  # [B, 1, 1, L]
        self.length = self.prompt_width = P
        return self._logits(last)

    def _prefill_distinct(self, prompt_ids, prompt_mask, L: int) -> torch.Tensor:
        """Every column of every row into a fresh cache of ``L`` columns; the last hidden
        state [B, H]. The n samples of a group share their prompt: each distinct prompt runs
        once."""
        B, P = prompt_ids.shape
        device = prompt_ids.device
        u_ids, u_mask, inverse = distinct_prompts(prompt_ids, prompt_mask)
        u_pos = (u_mask.cumsum(-1) - 1).clamp(min=0)
        u_mask = u_mask.bool()
        U = u_ids.shape[0]
        # causal and padding; a padded query may see itself so no softmax row is empty (its
        # output is never read: padded keys are masked for every real query)
        causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        allowed = (causal & u_mask[:, None, :]) | torch.eye(P, dtype=torch.bool, device=device)
        allowed = allowed[:, None]  # [U, 1, P, P]
        self.inverse = inverse  # the prefill's rows of the batch's (routing record)
        x = self.embed(u_ids)  # [U, P, H]
        cos, sin = self.cos[u_pos], self.sin[u_pos]  # [U, P, hd]
        self.k_cache, self.v_cache = [], []
        for layer in self.layers:
            h = _rms(x, layer.in_norm.weight, layer.in_norm.variance_epsilon)
            q, k, v = layer.qkv(h, cos, sin)  # [U, P, heads, hd]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, scale=layer.scaling, enable_gqa=self.groups > 1
            )
            x = x + layer.o(out.transpose(1, 2).reshape(U, P, -1))
            x = layer.mlp(x)
            kc = k.new_empty(B, self.num_kv_heads, L, self.head_dim)
            vc = torch.empty_like(kc)
            kc[:, :, :P] = k[inverse]
            vc[:, :, :P] = v[inverse]
            self.k_cache.append(kc)
            self.v_cache.append(vc)
        return x[inverse, -1]

    def _shared_past(self, ids, mask, shared):
        """The ``Past`` of ``shared``: its groups' prefixes prefilled as one batch (each
        distinct one once, at the positions they have in the rows), columns per row."""
        pre_ids, pre_mask = shared.prefix_batch(ids, mask)
        self._prefill_distinct(pre_ids, pre_mask, pre_ids.shape[1])
        return shared.past(self.k_cache, self.v_cache, mask)

    def _prefill_new(self, ids, mask, positions, L: int, past) -> torch.Tensor:
        """The columns of each row that ``past`` does not hold, into a cache of ``L`` columns
        whose other columns ``past`` fills; the last hidden state [B, H].

        Ragged: row i computes its last ``m_i`` columns, so the block of the last ``M = max
        m_i`` columns runs for every row and a row keeps the block's keys and values only on
        its own new columns (the others come from ``past``, or are padding)."""
        B, P = ids.shape
        device = ids.device
        new = mask.sum(-1) - past.cached  # [B] >= 1
        self.new_counts = new
        M = int(new.max())
        block = torch.arange(P - M, P, device=device)
        fresh = (block[None] >= (P - new)[:, None])[:, None, :, None]  # [B, 1, M, 1]
        # a query sees the row's tokens up to itself; a padded one sees itself (no empty
        # softmax row), a cached one computes what is never read
        columns = torch.arange(P, device=device)
        allowed = (columns[None, None] <= block[None, :, None]) & mask[:, None, :]
        allowed = (allowed | (columns[None, None] == block[None, :, None]))[:, None]
        x = self.embed(ids[:, P - M:])  # [B, M, H]
        cos, sin = self.cos[positions[:, P - M:]], self.sin[positions[:, P - M:]]
        self.k_cache, self.v_cache = [], []
        for index, layer in enumerate(self.layers):
            h = _rms(x, layer.in_norm.weight, layer.in_norm.variance_epsilon)
            q, k, v = layer.qkv(h, cos, sin)  # [B, M, heads, hd]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            # zeros, not garbage, in the padding columns: a masked key still meets its value
            kc = k.new_zeros(B, self.num_kv_heads, L, self.head_dim)
            vc = torch.zeros_like(kc)
            past.fill(index, kc, vc)
            kc[:, :, P - M:P] = torch.where(fresh, k, kc[:, :, P - M:P])
            vc[:, :, P - M:P] = torch.where(fresh, v, vc[:, :, P - M:P])
            out = F.scaled_dot_product_attention(
                q, kc[:, :, :P], vc[:, :, :P], attn_mask=allowed, scale=layer.scaling,
                enable_gqa=self.groups > 1)
            x = x + layer.o(out.transpose(1, 2).reshape(B, M, -1))
            x = layer.mlp(x)
            self.k_cache.append(kc)
            self.v_cache.append(vc)
        return x[:, -1]

    # ------------------------------------------------------------------ one token
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B] at column ``self.length`` -> logits [B, V] for the column after it."""
        B = tokens.shape[0]
        col = self.length
        n = col + 1
        x = self.embed(tokens)  # [B, H]
        cos, sin = self.cos[self.next_position], self.sin[self.next_position]  # [B, hd]
        bias = self.bias[..., :n]
        for layer, kc, vc in zip(self.layers, self.k_cache, self.v_cache, strict=True):
            h = _rms(x, layer.in_norm.weight, layer.in_norm.variance_epsilon)
            q, k, v = layer.qkv(h, cos, sin)  # q [B, nh, hd]; k, v [B, nkv, hd]
            kc[:, :, col] = k
            vc[:, :, col] = v
            # grouped-query attention of one query per row: [B, nkv, g, hd] x [B, nkv, hd, n]
            q = q.view(B, self.num_kv_heads, self.groups, self.head_dim)
            scores = torch.matmul(q, kc[:, :, :n].transpose(-1, -2)) * layer.scaling + bias
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, vc[:, :, :n]).reshape(B, -1)
            x = x + layer.o(out)
            x = layer.mlp(x)
        if self.routes is not None:
            for j, moe in enumerate(self.moe):
                self.routes[self.rows, col, j] = moe.last.to(self.routes.dtype)
        self.length = n
        self.next_position = self.next_position + 1
        return self._logits(x)

    def keep(self, rows: torch.Tensor) -> None:
        """Continue with the rows ``rows`` [k] only (rows that ended stop costing compute).
        With ``retain`` the others' filled columns are kept for ``chunks``."""
        if self.retain:
            gone = torch.ones(self.rows.shape[0], dtype=torch.bool, device=rows.device)
            gone[rows] = False
            self.retired.append((self.rows[gone],
                                 [kc[gone, :, :self.length] for kc in self.k_cache],
                                 [vc[gone, :, :self.length] for vc in self.v_cache]))
        self.rows = self.rows[rows]
        self.k_cache = [kc[rows] for kc in self.k_cache]
        self.v_cache = [vc[rows] for vc in self.v_cache]
        self.bias, self.next_position = self.bias[rows], self.next_position[rows]

    def chunks(self) -> list[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]]:
        """Every row's cache after the decode: ``(rows [r], keys, values)`` per group of rows
        (those that left together with ``keep``, and the rows computed to the end), keys and
        values per layer [r, kv heads, columns, head_dim]. Row i's context sits in the
        columns of the left-padded prefill, its j-th generated token in column P + j (the last
        one drawn was never fed, so it is not there)."""
        return [*self.retired, (self.rows, self.k_cache, self.v_cache)]

    # ------------------------------------------------------------------ routing record
    def _record_prefill(self, mask, L: int, fresh: bool) -> None:
        """The experts each prompt column used, per MoE layer, into ``routes`` [B, L, layers,
        k] (-1: no record: padding, and columns a ``past`` held, computed by another call)."""
        B, P = mask.shape
        k = self.moe[0].top_k
        self.routes = torch.full((B, L, len(self.moe), k), -1, dtype=torch.int16,
                                 device=mask.device)
        for j, moe in enumerate(self.moe):
            if fresh:  # _prefill_new: the last M columns of every row, kept where new
                chosen = moe.last.view(B, -1, k)
                M = chosen.shape[1]
                new = mask[:, P - M:] & (torch.arange(P - M, P, device=mask.device)[None]
                                         >= (P - self.new_counts)[:, None])
                self.routes[:, P - M:P, j] = torch.where(new[..., None], chosen.to(torch.int16),
                                                         -1)
            else:
                chosen = moe.last.view(-1, P, k)[self.inverse]
                self.routes[:, :P, j] = torch.where(mask[..., None], chosen.to(torch.int16), -1)

    def routed(self, T: int) -> torch.Tensor | None:
        """The routing record of the decode [B, P + T, MoE layers, k] int16: column c holds the
        experts the sampler's forward of the token in column c used (prompt columns, then the
        generated tokens that were fed; -1 where no forward ran: padding, the last token drawn
        when the decode ended), or None for a dense model."""
        if self.routes is None:
            return None
        return self.routes[:, :self.prompt_width + T]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = _rms(x, self.final_norm.weight, self.final_norm.variance_epsilon)
        return self.lm_head(h)

