"""Packed training passes: the rows of a micro-batch as one sequence without padding, and the
samples of a prompt sharing one copy of it (PrefixGrouper, Liu et al., arXiv 2506.05433).

The padded layout ([B, P+T], left-padded prompts, right-padded responses) multiplies every
token slot, attended or not, and each row repeats its group's prompt. A pack holds only the
attended tokens, [1, N]:

    layout "packed":         [p0 r0] [p1 r1] [p2 r2] ...        one attention block per row
    layout "shared-prefix":  [p r0 r1 r2 r3] [p' r0' r1'] ...   one block per distinct prompt

Positions are the rows' own (``position_ids`` count attended tokens), so they restart at each
row's prompt and a shared group's responses continue from the prompt's length. Within a block
attention is causal; in a shared block a response's tokens attend to the prompt and to the
earlier tokens of their own response only (:func:`response_mask`). Each query therefore sees
exactly the keys, at the positions, it sees in its padded row, so the outputs equal the padded
forward's; a shared prompt's hidden states are computed once and read by every response, so
its gradient is the sum over the responses, as it is in the padded forward, where each row's
copy receives its response's share (tests/trainer/policy/test_packing.py, float64).

The log-prob of response token t comes from the pack position of the token before it: the
prompt's last token for t = 0 (the shared one in a shared block), the response's own token
t - 1 after that (:class:`PackLayout` ``predict`` / ``target``).

Attention: transformers 5 decoder layers call the function their config's
``_attn_implementation`` names, with the keyword arguments of the model's forward.
:func:`use_packed_attention` switches the model to :data:`ATTENTION`, whose
:func:`block_attention` runs the pack's attention when the call carries one and transformers'
SDPA otherwise. A pack's attention is one SDPA per layer over its query segments (each causal
row, each shared prompt, each shared response with the prompt's keys before its own), padded
to the longest segment (:class:`Segments`): the padding sits in the attention only, never in
the linear layers. Measured on this CPU at SmolLM2's shapes (docs/performance.md, "Packed,
prefix-shared passes"): one SDPA over the whole pack with a block-diagonal mask is 3-8x slower
than SDPA per block (it computes every pair of the pack), and per block, with one call per
response, the update's forward + backward took 1.5x the segments' (many small calls).
``BATCHED_SEGMENTS = False`` keeps the per-block form (benchmarks/pack_passes.py compares).
Only model families whose decoder layers are known to route the keywords to the attention
function take this path (:func:`packing_supported`); others keep the padded one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

ATTENTION = "relax_packed"
BLOCKS_KWARG = "relax_pack_blocks"
# decoder layers that pass the forward's keywords to ALL_ATTENTION_FUNCTIONS (checked in
# tests/trainer/policy/test_packing.py for Llama, Qwen3 and Qwen3-MoE)
PACKED_MODEL_TYPES = ("llama", "qwen3", "qwen3_moe")
LAYOUTS = ("shared-prefix", "packed", "padded")
# the attention of a pack: one SDPA over padded segments (True) or one per block / response
BATCHED_SEGMENTS = True


@dataclass(frozen=True)
class PackLayout:
    """Where the tokens of a padded micro-batch sit in its pack.

    ``token_index`` [N]: flat indices into the [B, S] fields of the tokens in pack order;
    ``blocks``: the :class:`Block` s in pack order; ``predict`` [M]: pack positions whose output predicts ``target`` [M],
    flat indices into [B, T] of the attended response tokens.
    """

    token_index: torch.Tensor
    blocks: tuple
    predict: torch.Tensor
    target: torch.Tensor
    segments: Segments | None = None

    @property
    def tokens(self) -> int:
        return int(self.token_index.shape[0])


@dataclass(frozen=True)
class Segments:
    """The attention of a pack as one batch of ``G`` query segments, each padded: a causal
    sequence, a shared prompt, or a shared response (its keys: the prompt's, then its own).

    ``query`` [G, Q] / ``key`` [G, K]: pack positions (padding points at position 0);
    ``mask`` [G, 1, Q, K] bool: which keys each query reads (a padding query reads key 0, so no
    softmax row is empty); ``order`` [N]: for each pack position its row in the [G * Q]
    outputs. Built once per micro-batch, used by every layer: one SDPA per layer instead of
    one per block or response (fewer, larger calls; the padding is in the attention only,
    never in the linear layers).
    """

    query: torch.Tensor
    key: torch.Tensor
    mask: torch.Tensor
    order: torch.Tensor


def segments_of(blocks, device) -> Segments:
    """:class:`Segments` of a pack's :class:`Block` s."""
    spans = []  # (prefix start, prefix stop, own start, own stop)
    for b in blocks:
        if not b.responses:
            spans.append((0, 0, b.start, b.stop))
            continue
        spans.append((0, 0, b.start, b.prompt_end))
        spans += [(b.start, b.prompt_end, begin, end) for begin, end, _ in b.responses]
    Q = max(e - s for _, _, s, e in spans)
    K = max(pe - ps + e - s for ps, pe, s, e in spans)
    query = torch.zeros(len(spans), Q, dtype=torch.long)
    key = torch.zeros(len(spans), K, dtype=torch.long)
    mask = torch.zeros(len(spans), 1, Q, K, dtype=torch.bool)
    order = torch.zeros(blocks[-1].stop, dtype=torch.long)
    for g, (ps, pe, s, e) in enumerate(spans):
        p, n = pe - ps, e - s
        query[g, :n] = torch.arange(s, e)
        key[g, :p + n] = torch.cat([torch.arange(ps, pe), torch.arange(s, e)])
        mask[g, 0, :n, :p] = True
        mask[g, 0, :n, p:p + n] = torch.ones(n, n, dtype=torch.bool).tril()
        mask[g, 0, n:, 0] = True
        order[s:e] = torch.arange(n) + g * Q
    return Segments(query.to(device), key.to(device), mask.to(device), order.to(device))


@dataclass(frozen=True)
class Block:
    """One attention block of a pack: the sequence ``start:stop`` (causal), or, with
    ``responses``, a shared group: its prompt ``start:prompt_end`` (causal) and each response
    ``(begin, end, mask [r, p + r])`` attending to the prompt and causally to itself."""

    start: int
    prompt_end: int
    stop: int
    responses: tuple = ()


def response_mask(prompt_len: int, response_len: int) -> torch.Tensor:
    """[r, p + r] bool: a shared group's response token i sees the whole prompt and its own
    tokens up to i (never another response)."""
    return torch.cat([torch.ones(response_len, prompt_len, dtype=torch.bool),
                      torch.ones(response_len, response_len, dtype=torch.bool).tril()], dim=1)


def _groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, share: bool) -> list[list[int]]:
    """Rows by equal prompt (token ids and padding), in order of first appearance."""
    if not share:
        return [[i] for i in range(prompt_ids.shape[0])]
    key = torch.cat([prompt_ids, prompt_mask.long()], dim=1)
    inverse = torch.unique(key, dim=0, return_inverse=True)[1].tolist()
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(inverse):
        groups.setdefault(g, []).append(row)
    return list(groups.values())


def padding_is_plain(attention_mask: torch.Tensor, T: int) -> bool:
    """Prompts left-padded and responses right-padded, every prompt non-empty: what a pack
    needs (a hole in the attention would change which token predicts the next)."""
    P = attention_mask.shape[1] - T
    prompt, response = attention_mask[:, :P].bool(), attention_mask[:, P:].bool()
    return bool((prompt[:, 1:] >= prompt[:, :-1]).all() and prompt[:, -1].all()
                and (response[:, 1:] <= response[:, :-1]).all())


def build_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, T: int, *,
                 share: bool) -> PackLayout | None:
    """The pack of a padded micro-batch ([B, S] fields, the last ``T`` columns the
    responses), rows with one prompt sharing it when ``share``; None when the padding is not
    plain (:func:`padding_is_plain`), then the padded forward runs."""
    S = input_ids.shape[1]
    P = S - T
    if P <= 0 or not padding_is_plain(attention_mask, T):
        return None
    prompt_lens = attention_mask[:, :P].sum(1).tolist()
    response_lens = attention_mask[:, P:].sum(1).tolist()
    if not sum(response_lens):  # nothing to score: the padded forward keeps the graph whole
        return None
    device = input_ids.device
    tokens, predict, target, blocks = [], [], [], []
    n = 0
    for rows in _groups(input_ids[:, :P], attention_mask[:, :P], share):
        start, lp = n, prompt_lens[rows[0]]
        tokens.append(torch.arange(P - lp, P) + rows[0] * S)
        n += lp
        responses = []
        for r in rows:
            lr = response_lens[r]
            tokens.append(torch.arange(P, P + lr) + r * S)
            # token 0 from the prompt's last position, token t from the response's t - 1
            predict.append(torch.cat([torch.tensor([start + lp - 1]), torch.arange(n, n + lr - 1)])
                           if lr else torch.zeros(0, dtype=torch.long))
            target.append(torch.arange(lr) + r * T)
            if lr:
                responses.append((n, n + lr, response_mask(lp, lr).to(device)))
            n += lr
        blocks.append(Block(start, start + lp, n, tuple(responses) if len(rows) > 1 else ()))
    return PackLayout(token_index=torch.cat(tokens).to(device), blocks=tuple(blocks),
                      predict=torch.cat(predict).to(device), target=torch.cat(target).to(device),
                      segments=segments_of(blocks, device))


def block_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                    scaling: float | None = None, **kwargs):
    """The attention of :data:`ATTENTION`: a pack's (``kwargs[BLOCKS_KWARG]`` given) or else
    transformers' own SDPA, unchanged. Packed: query [1, Hq, N, D], key / value [1, Hkv, N, D]
    -> output [1, N, Hq, D] (transformers' attention-function contract), SDPA once per causal
    block, and per shared group once for its prompt and once per response."""
    pack = kwargs.pop(BLOCKS_KWARG, None)
    if pack is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise RuntimeError("packed attention with a sliding window is not implemented")
    sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention,
                             dropout_p=dropout, scale=scaling,
                             enable_gqa=query.shape[1] != key.shape[1])
    if isinstance(pack, Segments):
        return _segment_attention(sdpa, query, key, value, pack), None
    out = []
    for b in pack:
        if not b.responses:
            out.append(sdpa(query[:, :, b.start:b.stop], key[:, :, b.start:b.stop],
                            value[:, :, b.start:b.stop], is_causal=True))
            continue
        prompt = slice(b.start, b.prompt_end)
        out.append(sdpa(query[:, :, prompt], key[:, :, prompt], value[:, :, prompt],
                        is_causal=True))
        # each response against [prompt keys, its own keys]: r x (p + r) scores, where one
        # masked block over the whole group would compute (p + sum r)^2 (8x more at 8 x 400)
        for begin, end, mask in b.responses:
            k = torch.cat([key[:, :, prompt], key[:, :, begin:end]], dim=2)
            v = torch.cat([value[:, :, prompt], value[:, :, begin:end]], dim=2)
            out.append(sdpa(query[:, :, begin:end], k, v, attn_mask=mask))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


def take(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` gathered along ``dim`` at ``index`` (any shape, which replaces ``dim`` in the
    result), with a gradient that repeats bit for bit.

    Why not ``x[..., index]``: its backward is ``index_put_(accumulate=True)``, whose CPU kernel
    adds the contributions of a repeated index in parallel, in whatever order the threads get
    there (PyTorch lists it among the nondeterministic operations). A shared prompt's keys are
    read by every response of its group and its last position predicts each response's first
    token, so their gradients changed in the last bits with thread scheduling: seeded runs on a
    busy machine drifted apart after ~15-20 steps (docs/performance.md, "Packed,
    prefix-shared passes"). ``index_select`` backpropagates through ``index_add_``, which sums
    repeated indices one after another in index order on the CPU."""
    return x.index_select(dim, index.reshape(-1)).unflatten(dim, index.shape)


def _segment_attention(sdpa, query, key, value, seg: Segments) -> torch.Tensor:
    """[1, N, Hq, D]: every segment's queries in one SDPA over [G, H, Q | K, D] gathers."""
    q = take(query[0], seg.query, 1).transpose(0, 1)  # [G, Hq, Q, D]
    k = take(key[0], seg.key, 1).transpose(0, 1)  # [G, Hkv, K, D]
    v = take(value[0], seg.key, 1).transpose(0, 1)
    out = sdpa(q, k, v, attn_mask=seg.mask)  # [G, Hq, Q, D]
    out = out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3])  # [G * Q, Hq, D]
    return take(out, seg.order, 0)[None]


def packing_supported(inner) -> bool:
    """Whether the Hugging Face module ``inner`` can run packed: a known decoder family with
    full attention in every layer, running transformers' SDPA (or already :data:`ATTENTION`)."""
    cfg = getattr(inner, "config", None)
    if getattr(cfg, "model_type", None) not in PACKED_MODEL_TYPES:
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    return getattr(cfg, "_attn_implementation", None) in ("sdpa", ATTENTION)


def use_packed_attention(inner) -> None:
    """Switch ``inner``'s decoder layers to :data:`ATTENTION` (for good: a recomputed layer
    runs its forward again in the backward pass, after any context of the forward has
    closed). Calls without a pack run transformers' SDPA and its mask exactly as before; the
    one model-specific hook of the packed passes."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, block_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    if inner.config._attn_implementation != ATTENTION:
        inner.config._attn_implementation = ATTENTION


# A 4D mask is taken as given by transformers' mask functions (no [N, N] mask is built for a
# pack); block_attention never reads it.
_NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)


def packed_forward(model, inner, input_ids: torch.Tensor, position_ids: torch.Tensor,
                   layout: PackLayout) -> torch.Tensor:
    """The model's output [N, ...] (logits, or hidden states with the head swapped out) over
    the pack of ``layout`` ([B, S] ``input_ids`` / ``position_ids``)."""
    use_packed_attention(inner)
    ids = input_ids.reshape(-1)[layout.token_index][None]
    pos = position_ids.reshape(-1)[layout.token_index][None]
    attention = layout.segments if BATCHED_SEGMENTS else layout.blocks
    out = model(input_ids=ids, position_ids=pos, attention_mask=_NO_MASK.to(ids.device),
                use_cache=False, **{BLOCKS_KWARG: attention})
    return out.logits[0]
