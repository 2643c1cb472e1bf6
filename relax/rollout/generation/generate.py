"""Sampling responses with the current policy: a lean decode loop over the model's KV cache.

Prompts are left-padded so every row's next token sits in the last column; each step feeds one
token per row and reuses the cache. A row stops at its first EOS (kept in the response, inside the
mask) or at ``max_new_tokens`` (then it counts as truncated). Positions after a row's EOS hold the
pad token and are outside the mask.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from relax.rollout.generation.engine import DecodeEngine, cache_argument, unsupported_reason
from relax.rollout.generation.experts import RouterRecorder


@dataclass
class Rollout:
    """One rank's sampled batch.

    prompt_ids [B, P] (left-padded), prompt_mask [B, P] bool, response_ids [B, T] (right-padded
    with pad), response_mask [B, T] bool (generated tokens up to and including EOS),
    truncated [B] bool (no EOS within the length limit). ``context_mask`` [B, T] bool: the
    response tokens the model attends to, when they are more than the trained ones (an
    episode's environment turns, relax/rollout/agents/episodes.py); None means ``response_mask``.
    ``log_probs`` [B, T] float32: the sampler's log-prob of each generated token
    (:func:`sampled_log_probs`), 0 outside ``response_mask``; None when the rows were not
    sampled here. ``policy_version`` [B] int64: the trainer step whose weights sampled each
    row, where the sampler is not the trainer's own model (a vLLM server); None otherwise.
    ``routed_experts`` [B, P+T, MoE layers, k] int16: a mixture-of-experts sampler's routing
    record, the experts its forward of the token in each column (prompt, then response) used,
    -1 where it has none (padding, a row's last token when no forward of it ran, columns a
    kept cache held); None for
    a dense model or a sampler that does not record (docs/moe.md, "Routing record").
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    truncated: torch.Tensor
    context_mask: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    policy_version: torch.Tensor | None = None
    routed_experts: torch.Tensor | None = None

    def select(self, index) -> Rollout:
        """The rows picked by ``index`` (a list or an index tensor)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.prompt_ids.device)
        return Rollout(*(None if getattr(self, f.name) is None else getattr(self, f.name)[index]
                         for f in fields(self)))


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Rows of several rollouts in one: prompts left-padded and responses right-padded to the
    widest part, so every row keeps its tokens and positions (padding is masked)."""
    P = max(r.prompt_ids.shape[1] for r in parts)
    T = max(r.response_ids.shape[1] for r in parts)

    def pad(x, width, value, left):
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    return Rollout(
        torch.cat([pad(r.prompt_ids, P, pad_token_id, True) for r in parts]),
        torch.cat([pad(r.prompt_mask, P, False, True) for r in parts]),
        torch.cat([pad(r.response_ids, T, pad_token_id, False) for r in parts]),
        torch.cat([pad(r.response_mask, T, False, False) for r in parts]),
        torch.cat([r.truncated for r in parts]),
        None if all(r.context_mask is None for r in parts) else torch.cat([
            pad(r.response_mask if r.context_mask is None else r.context_mask, T, False, False)
            for r in parts]),
        None if any(r.log_probs is None for r in parts) else torch.cat([
            pad(r.log_probs, T, 0.0, False) for r in parts]),
        None if any(r.policy_version is None for r in parts) else torch.cat([
            r.policy_version for r in parts]),
        None if any(r.routed_experts is None for r in parts) else torch.cat([
            routes_padded(r.routed_experts, r.prompt_ids.shape[1], P, T) for r in parts]),
    )


def routes_padded(routes: torch.Tensor, P_own: int, P: int, T: int) -> torch.Tensor:
    """A routing record [B, P_own + T_own, ...] padded with -1 to [B, P + T, ...]: its prompt
    columns on the left, its response columns on the right (as the tokens are)."""
    prompt, response = routes[:, :P_own], routes[:, P_own:]
    pad = (0, 0, 0, 0)  # the layer and k dimensions stay
    return torch.cat([torch.nn.functional.pad(prompt, pad + (P - P_own, 0), value=-1),
                      torch.nn.functional.pad(response, pad + (0, T - response.shape[1]),
                                              value=-1)], dim=1)


def tokenize_prompts(tokenizer, texts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids [B, P] and mask [B, P] bool. Special tokens are the template's business."""
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    for i, r in enumerate(rows):
        if not r:
            raise ValueError(f"prompt {i} tokenizes to nothing: {texts[i][:60]!r}")
    return left_pad(rows, tokenizer.pad_token_id, device)


def left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as left-padded ids [B, P] and mask [B, P] bool (the layout generation and
    the training batch expect: every row's next token in the last column)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = True
    return ids.to(device), mask.to(device)


def sample_next(logits, *, temperature: float, top_p: float, top_k: int, generator=None,
                uniforms=None):
    """One token per row from logits [B, V] (float32); ``uniforms`` [B] float64 in [0, 1) fix
    the draws (else they come from ``generator``)."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return draw(logits.softmax(-1), generator, uniforms)


def sampled_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float
                      ) -> torch.Tensor:
    """The sampler's log-prob [B] float32 of ``tokens`` [B] under logits [B, V]: the log-softmax
    of ``logits / temperature`` (temperature 0, greedy: of the logits), before top-p / top-k
    truncation.

    Before truncation because that is the distribution the trainer's log-probs describe
    (relax/trainer/policy/logprobs.py: the same temperature, no truncation), so the two differ only by
    numerics (kernels, precision) and the PPO ratio compares like with like; the truncated
    distribution would put the truncation itself into every ratio. Computed from the logits the
    decode step already holds: no extra forward pass."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    chosen = scaled.gather(-1, tokens[:, None]).squeeze(-1)
    return chosen - torch.logsumexp(scaled, dim=-1)


def draw(probs: torch.Tensor, generator=None, uniforms=None) -> torch.Tensor:
    """One index per row of probs [B, V], row i drawn with probability probs[i] / sum(probs[i]).

    Inverse-CDF sampling with one uniform per row: the cumulative sum is taken in float64 (its
    rounding then cannot shift the mass of a 150k-token vocabulary measurably) and a
    zero-probability index has an empty interval, so it is never drawn. ``torch.multinomial``
    draws an exponential per vocabulary entry instead, a pass over the vocabulary more per row.
    """
    cdf = probs.double().cumsum(-1)
    if uniforms is None:
        uniforms = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device,
                              generator=generator)
    u = uniforms[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def row_uniforms(generator, rows: int, device) -> torch.Tensor:
    """One float64 uniform per row [rows]: from one stream for the batch (a ``Generator`` or
    None), or from each row's own stream (a sequence of ``rows`` generators), so that a row's
    draws do not depend on which rows share its batch or their order (agent calls batched
    together, relax/rollout/agents/agent_server.py)."""
    if not isinstance(generator, (list, tuple)):
        return torch.rand(rows, dtype=torch.float64, device=device, generator=generator)
    if len(generator) != rows:
        raise ValueError(f"{len(generator)} generators for {rows} rows")
    return torch.cat([torch.rand(1, dtype=torch.float64, device=device, generator=g)
                      for g in generator])


def generate(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    generator: torch.Generator | list[torch.Generator] | None = None,
    sync_group=None,
    inference_mode: bool = True,
    budgets: torch.Tensor | None = None,
    stop=None,
    cache=None,
    shared=None,
) -> Rollout:
    """Sample up to ``max_new_tokens`` per row (``budgets`` [B]: fewer for some rows; a row at
    its budget ends as truncated).

    ``stop(finished [B] bool) -> bool``, asked after every decode step, ends the decode early
    (partial rollouts: the rows not finished then are continued later, relax/rollout/partial.py).
    ``sync_group``: with a sharded model (FSDP) every rank must run the same number of forward
    passes, so the "all rows finished" (or stop) decision is all-reduced over this group, and
    every rank decodes up to the longest ``max_new_tokens`` any rank asks for (its own rows
    keep their limits as budgets).
    ``inference_mode=False`` runs under plain ``no_grad``: FSDP2 reuses its all-gather buffers
    in later training passes, and inference tensors cannot be updated outside inference mode.
    ``cache`` (relax/rollout/generation/turn_cache.py ``CachedRows``): the rows' KV caches of earlier
    turns, used for the tokens they cover and replaced by this call's. ``shared``
    (relax/rollout/generation/shared_prefix.py ``SharedPrefixes``, not with ``cache``): rows
    whose groups share their first tokens, which are prefilled once per group. ``generator``:
    one random stream for the batch, or a list of one per row (:func:`row_uniforms`).
    """
    with torch.no_grad(), torch.inference_mode(inference_mode):
        return _decode(
            model, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens,
            eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, temperature=temperature,
            top_p=top_p, top_k=top_k, generator=generator, sync_group=sync_group,
            budgets=budgets, stop=stop, cache=cache, shared=shared,
        )


def _decode(model, prompt_ids, prompt_mask, *, max_new_tokens, eos_token_ids, pad_token_id,
            temperature, top_p, top_k, generator, sync_group, budgets=None, stop=None,
            cache=None, shared=None) -> Rollout:
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    if sync_group is not None:
        max_new_tokens, budgets = _shared_length(max_new_tokens, budgets, B, sync_group, device)
    eos = torch.tensor(eos_token_ids, device=device)
    forward, cache = _forward(model, cache)
    # the past is not held here: its tensors are freed once the prefill copied them
    past = None if cache is None else cache.past(prompt_ids, prompt_mask)
    logits = forward.prefill(prompt_ids, prompt_mask, max_new_tokens, past=past, shared=shared)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    ended_eos = torch.zeros(B, dtype=torch.bool, device=device)
    alive = None  # the rows the forward still computes (None: all B)
    tokens, masks, log_probs = [], [], []
    for t in range(max_new_tokens):
        # one uniform per row and step for every row: a row's token never depends on which
        # other rows are still being computed
        u = row_uniforms(generator, B, device)
        tok, lp = _draw(logits, u, alive, pad_token_id, temperature=temperature, top_p=top_p,
                        top_k=top_k)
        masks.append(~finished)
        tok = torch.where(finished, torch.full_like(tok, pad_token_id), tok)
        tokens.append(tok)
        log_probs.append(torch.where(finished, torch.zeros_like(lp), lp))
        hit_eos = torch.isin(tok, eos) & ~finished
        ended_eos |= hit_eos
        finished = finished | hit_eos
        if budgets is not None:
            finished = finished | (budgets <= t + 1)
        if t == max_new_tokens - 1:
            break
        ended = int(finished.sum())  # the step's one host sync: early stop and dropped rows
        if _done(ended == B or (stop is not None and bool(stop(finished))), sync_group, device):
            break
        if hasattr(forward, "keep") and ended < B:  # (all ended: another rank still decodes)
            alive = _drop_finished(forward, alive, finished, ended)
        logits = forward.step(tok if alive is None else tok[alive])
    response_ids = torch.stack(tokens, dim=1)
    response_mask = torch.stack(masks, dim=1)
    if cache is not None:
        cache.store(forward.chunks(), prompt_ids, prompt_mask, response_ids, response_mask)
    routes = forward.routed(response_ids.shape[1])
    if routes is not None:  # columns past a row's end were fed padding: no record of it
        routes = routes.clone()
        routes[:, prompt_ids.shape[1]:][~response_mask] = -1
    return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, ~ended_eos,
                   log_probs=torch.stack(log_probs, dim=1), routed_experts=routes)


def _draw(logits, u, alive, pad_token_id: int, *, temperature, top_p, top_k):
    """One decode step's tokens [B] and their sampler log-probs [B] from ``logits`` [A, V] of
    the ``alive`` rows (None: all B), drawn with the rows' uniforms ``u`` [B]; rows not
    computed get ``pad_token_id`` and 0."""
    logits = logits.float()  # once: the draw and the sampler's log-prob both read it
    tok = sample_next(logits, temperature=temperature, top_p=top_p, top_k=top_k,
                      uniforms=u if alive is None else u[alive])
    lp = sampled_log_probs(logits, tok, temperature)
    if alive is not None:
        B = u.shape[0]
        tok = torch.full((B,), pad_token_id, dtype=torch.long, device=u.device).index_copy_(
            0, alive, tok)
        lp = torch.zeros(B, dtype=lp.dtype, device=u.device).index_copy_(0, alive, lp)
    return tok, lp


def _forward(model, cache):
    """The decode's forward (the engine, or the model's own for what the engine does not run:
    every turn and every shared prefix prefilled whole, so no cache) and the cache it uses."""
    if unsupported_reason(model):
        return _ModelSteps(model), None
    return DecodeEngine(model, retain=cache is not None), cache


def _shared_length(max_new_tokens: int, budgets, B: int, sync_group, device):
    """(the most new tokens any rank of ``sync_group`` asks for, this rank's ``budgets`` [B]).
    The decode's last token step ends the loop without the agreement of :func:`_done`, so with
    a sharded model it must be the same step on every rank; ranks can ask for different
    lengths (partial rollouts continue carried rows with the tokens they have left,
    relax/rollout/partial.py), so every rank decodes the longest and each row keeps its own
    limit as its budget."""
    own = torch.full((B,), max_new_tokens, device=device)
    budgets = own if budgets is None else torch.minimum(budgets.to(device), own)
    longest = torch.tensor(max_new_tokens, dtype=torch.int64, device=device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=sync_group)
    return int(longest), budgets


def _done(done: bool, sync_group, device) -> bool:
    """``done`` agreed by every rank of ``sync_group`` (a sharded model: every rank runs the
    same number of forward passes)."""
    if sync_group is None:
        return done
    flag = torch.tensor(int(done), dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=sync_group)
    return bool(flag)


def _drop_finished(engine, alive, finished, ended: int):
    """Stop computing rows that have ended once they are an eighth of those still computed:
    each drop copies the KV cache once, so it is batched. ``ended`` counts the finished rows
    of the whole batch. Returns the new ``alive``."""
    B = finished.shape[0]
    computed = B if alive is None else alive.shape[0]
    if (ended - (B - computed)) * 8 < computed:  # rows outside `alive` have all ended
        return alive
    rows = torch.arange(B, device=finished.device) if alive is None else alive
    live = ~finished[rows]
    engine.keep(live.nonzero().squeeze(-1))
    return rows[live]


class _ModelSteps:
    """The same prefill/step interface over the model's own forward and its dynamic KV cache:
    for architectures the engine does not cover and for sharded (FSDP2) models. A mixture of
    experts' routing is recorded by hooks on its routers (``RouterRecorder``)."""

    def __init__(self, model):
        self.model = model
        self.cache_arg = cache_argument(model)
        self.recorder = RouterRecorder(model)

    def prefill(self, prompt_ids, prompt_mask, max_new_tokens, past=None, shared=None):
        """Every row whole: the model's own cache has no columns to copy a past into."""
        self.attn = prompt_mask.long()
        position = (self.attn.cumsum(-1) - 1).clamp(min=0)
        with self.recorder.armed():
            out = self.model(
                input_ids=prompt_ids, attention_mask=self.attn, position_ids=position,
                use_cache=True, logits_to_keep=1,
            )
        self.prompt_width = self.column = prompt_ids.shape[1]
        self.recorder.prefill(prompt_mask, self.prompt_width + max_new_tokens)
        self.cache = out[self.cache_arg]
        self.next_position = position[:, -1:] + 1
        return out.logits[:, -1]

    def step(self, tokens):
        self.attn = torch.cat([self.attn, torch.ones_like(self.attn[:, :1])], dim=1)
        with self.recorder.armed():
            out = self.model(
                input_ids=tokens[:, None], attention_mask=self.attn,
                position_ids=self.next_position, use_cache=True, **{self.cache_arg: self.cache},
            )
        self.recorder.step(self.column)
        self.column += 1
        self.cache = out[self.cache_arg]
        self.next_position = self.next_position + 1
        return out.logits[:, -1]

    def routed(self, T: int):
        """The decode's routing record [B, P + T, MoE layers, k] (the engine's ``routed``)."""
        routes = self.recorder.routes
        return None if routes is None else routes[:, :self.prompt_width + T]
