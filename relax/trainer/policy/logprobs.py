"""Token log-probabilities of the sampled responses under a model (policy, old, reference).

The batch fields follow one vocabulary: ``input_ids`` / ``attention_mask`` / ``position_ids``
[B, P+T] are the left-padded prompt followed by the right-padded response; ``response_mask``
[B, T] marks the generated tokens up to and including EOS. Logits are kept only for the T
positions that predict response tokens (``logits_to_keep``), so the log-softmax never runs over
the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax.precision import autocast
from relax.trainer.distributed import unwrap
from relax.trainer.policy.experience import Experience, experience_from_rollout, micro_batches  # noqa: F401
from relax.trainer.policy.packing import (
    PackLayout,
    build_layout,
    packed_forward,
    packing_supported,
    take,
)


def _response_logits(model, batch: Experience, T: int) -> torch.Tensor:
    """Logits [B, T, V] at the positions that predict the T response tokens: the padded
    forward, one pass over prompt + response per row."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask,
        position_ids=batch.position_ids, use_cache=False, logits_to_keep=T + 1,
    )
    return out.logits[:, :-1]  # the last kept logit predicts a token after the response


def packs(model, layout: str) -> bool:
    """Whether ``model``'s passes under ``layout`` run packed (token budgets then count the
    tokens of a pack, not the padded slots)."""
    return layout != "padded" and packing_supported(unwrap(model))


def token_slots(model, batch: Experience, layout: str) -> tuple[int, int]:
    """(token slots the pass multiplies, of them tokens that are not padding): a pack's
    tokens twice (a shared prompt counted once), else the padded micro-batch's slots and its
    attended tokens."""
    pack = pack_layout(model, batch, layout)
    if pack is not None:
        return pack.tokens, pack.tokens
    return batch.attention_mask.numel(), int(batch.attention_mask.sum())


def pack_layout(model, batch: Experience, layout: str) -> PackLayout | None:
    """The pack the passes run ``batch`` as (relax/trainer/policy/packing.py), or None for the
    padded forward: ``layout`` "padded", a model family without the packed attention, or
    padding that is not plain left / right."""
    if not packs(model, layout):
        return None
    return build_layout(batch.input_ids, batch.attention_mask, batch.response_mask.shape[1],
                        share=layout == "shared-prefix")


# the attribute of a Hugging Face module that holds its routing replay
# (relax/trainer/policy/routing_replay.py), set by the replay when it is installed
ROUTING_ATTRIBUTE = "relax_routing_replay"

# Tokens per chunk of the output layer: the [chunk, V] logits of one chunk (and, in a backward,
# their recomputation) are all that is ever held, instead of [B, T, V] logits and their
# softmax copies. 2^24 elements = 64 MiB of fp32 logits (341 tokens at V = 49,152).
CHUNK_ELEMENTS = 1 << 24


def _output_layer(inner):
    """``(module, weight, bias)`` of a model's output projection when the log-probs can be
    computed in chunks from the hidden states; None when the model's own head must run (no
    plain Linear head, a final logit soft-cap, or weights sharded by FSDP2 -- a DTensor is
    only gathered inside its module's forward)."""
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return None
    if getattr(inner.config, "final_logit_softcapping", None):
        return None
    if type(head.weight).__name__ == "DTensor" or type(head.weight.data).__name__ == "DTensor":
        return None
    return head, head.weight, head.bias


def _hidden_states(model, inner, batch: Experience, T: int,
                   pack: PackLayout | None) -> torch.Tensor:
    """The final hidden states at the positions that predict the response tokens, [B, T, H]
    padded or [M, H] packed: the forward with the output layer replaced by the identity."""
    head = inner.get_output_embeddings()
    inner.set_output_embeddings(torch.nn.Identity())
    try:
        if pack is None:
            return _response_logits(model, batch, T)
        return take(packed_forward(model, inner, batch.input_ids, batch.position_ids, pack),
                    pack.predict, 0)
    finally:
        inner.set_output_embeddings(head)


def _log_probs_from_logits(logits, targets, temperature: float, with_entropy: bool,
                           entropy_grad: bool):
    """log pi(target) [...] and the entropy [...] (or None) from logits [..., V], in fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    if not with_entropy:
        return log_probs, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return log_probs, entropy


def chunk_call(fn, args: tuple, *, grad: bool):
    """``fn(*args)`` for one chunk of an output-layer pass; with ``grad`` its [rows, V] logits
    are freed after the forward and rebuilt for the backward (checkpointed), so a pass over
    many chunks never holds more than one chunk's logits."""
    if grad:
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def _chunk_log_probs(hidden, weight, bias, targets, temperature: float, with_entropy: bool,
                     entropy_grad: bool):
    """One chunk: logits [n, V] in the matmul dtype of the ambient autocast, then fp32."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return _log_probs_from_logits(logits, targets, temperature, with_entropy, entropy_grad)


def _autocast_weight(weight: torch.Tensor, device_type: str) -> torch.Tensor:
    """``weight`` [V, H] in the ambient autocast's matmul dtype, cast once for all chunks.

    Autocast caches its cast of a trainable weight only while its region is open, so each
    chunk's recompute in the backward cast the whole [V, H] weight again (SmolLM2: 28M
    elements per chunk; docs/performance.md "Where the bf16 update's time goes"). The forward
    already used one cast for every chunk (the cache), so the values and the gradient path
    (one cast node whose bf16 input gradient sums the chunks') are the same; the cast copy
    lives until the backward (56 MiB for SmolLM2 in bf16) instead of being made again."""
    if not torch.is_autocast_enabled(device_type):
        return weight
    dtype = torch.get_autocast_dtype(device_type)
    return weight.to(dtype) if weight.is_floating_point() and weight.dtype != dtype else weight


def chunked_token_log_probs(hidden, weight, bias, targets, *, temperature: float = 1.0,
                            with_entropy: bool = False, entropy_grad: bool = True,
                            chunk_elements: int = CHUNK_ELEMENTS):
    """log pi(target) [N] float32 and the entropy [N] (or None) from hidden states [N, H] and
    an output layer ``weight`` [V, H] (+ ``bias`` [V]), ``chunk_elements // V`` rows at a time.

    With autograd each chunk is a non-reentrant checkpoint: its logits are recomputed in the
    backward instead of kept, so peak memory grows with the chunk, not with N x V (one more
    output-layer matmul per token than keeping them). Equal to the one-pass computation up to
    float rounding (tests/trainer/policy/test_chunked_logprobs.py).
    """
    rows = max(1, chunk_elements // weight.shape[0])
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    weight = _autocast_weight(weight, hidden.device.type) if grad else weight
    logps, ents = [], []
    for start in range(0, hidden.shape[0], rows):
        args = (hidden[start:start + rows], weight, bias, targets[start:start + rows],
                temperature, with_entropy, entropy_grad)
        lp, ent = chunk_call(_chunk_log_probs, args, grad=grad)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


@dataclass
class ResponseRows:
    """One forward's rows at the positions that predict response tokens: ``rows`` [N, H] final
    hidden states with ``head`` = (weight [V, H], bias) of the output layer to apply in chunks,
    or [N, V] logits with ``head`` None (the model's own head ran); ``targets`` [N] the tokens
    they predict; ``index`` [N] their flat positions in [B * T] (None: all of them, in order)."""

    rows: torch.Tensor
    head: tuple | None
    targets: torch.Tensor
    index: torch.Tensor | None
    shape: tuple[int, int]  # (B, T)

    def to_grid(self, values: torch.Tensor) -> torch.Tensor:
        """[N] values -> [B, T], 0 at positions no row stands for (differentiable)."""
        B, T = self.shape
        if self.index is None:
            return values.view(B, T)
        return values.new_zeros(B * T).index_put((self.index,), values).view(B, T)


def response_rows(model, batch: Experience, *, layout: str = "shared-prefix") -> ResponseRows:
    """The forward of :func:`response_log_probs` up to the output layer (call it under the
    same autocast): hidden states when the model allows chunks (:func:`_output_layer`), else the
    model's own logits; packed when ``layout`` packs (:func:`pack_layout`)."""
    B, T = batch.response_mask.shape
    inner = unwrap(model)
    layer = _output_layer(inner)
    pack = pack_layout(model, batch, layout)
    replay = getattr(inner, ROUTING_ATTRIBUTE, None)
    if replay is not None:  # a mixture of experts: this forward's routing records, in its order
        replay.begin(batch, None if pack is None else pack.token_index)
    targets = batch.input_ids[:, -T:].reshape(-1)
    index = None if pack is None else pack.target
    if pack is not None:
        targets = targets[pack.target]
    if layer is not None:
        hidden = _hidden_states(model, inner, batch, T, pack)
        rows, head = hidden.reshape(targets.numel(), -1), layer[1:]
    elif pack is None:
        rows, head = _response_logits(model, batch, T).reshape(B * T, -1), None
    else:
        rows, head = take(packed_forward(model, inner, batch.input_ids, batch.position_ids,
                                         pack), pack.predict, 0), None
    return ResponseRows(rows, head, targets, index, (B, T))


def rows_log_probs(r: ResponseRows, *, temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = True):
    """log pi(target) [N] float32 and the entropy [N] (or None) of ``r``'s rows."""
    if r.head is not None:
        return chunked_token_log_probs(r.rows, r.head[0], r.head[1], r.targets,
                                       temperature=temperature, with_entropy=with_entropy,
                                       entropy_grad=entropy_grad)
    return _log_probs_from_logits(r.rows, r.targets, temperature, with_entropy, entropy_grad)


def response_log_probs(
    model, batch: Experience, *, temperature: float = 1.0, with_entropy: bool = False,
    entropy_grad: bool = True, bf16: bool = False, layout: str = "shared-prefix",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(a_t | context) [B, T] float32 and, on request, the entropy [B, T].

    Logits are divided by the sampling temperature so that the ratio compares the same
    distribution the responses were drawn from. ``entropy_grad=False`` computes the entropy
    outside autograd (a metric only). The forward runs under ``--bf16`` autocast when ``bf16``;
    the log-softmax is fp32 either way. The output layer runs in chunks over the tokens
    (:func:`chunked_token_log_probs`) whenever the model allows (:func:`_output_layer`), so no
    [B, T, V] tensor exists; otherwise the model's own head makes the full logits.

    ``layout`` (``--pass-layout``): "shared-prefix" / "packed" run the rows as one pack
    (:func:`pack_layout`); positions past a row's attended response are 0 then, where the
    padded forward leaves a value no loss or metric reads (every reduction is masked).
    """
    with autocast(batch.input_ids.device, bf16):
        r = response_rows(model, batch, layout=layout)
        log_probs, entropy = rows_log_probs(r, temperature=temperature,
                                            with_entropy=with_entropy, entropy_grad=entropy_grad)
    return r.to_grid(log_probs), None if entropy is None else r.to_grid(entropy)


def batched_log_probs(model, batch: Experience, *, micro_batch_size: int, temperature: float,
                      bf16: bool = False, inference_mode: bool = True,
                      max_tokens: int | None = None, group=None,
                      flag: str = "--log-probs-max-tokens-per-gpu",
                      layout: str = "shared-prefix"):
    """``response_log_probs`` [B, T] over the whole batch in micro-batches, without autograd:
    ``micro_batch_size`` rows at a time, or token-budget micro-batches of at most
    ``max_tokens`` tokens (:func:`relax.trainer.policy.experience.micro_batches`; packed tokens
    when ``layout`` packs, :func:`packs`).

    ``inference_mode=False`` (plain ``no_grad``) for an FSDP2 model, whose all-gather buffers
    must stay usable by the training passes; its ranks then run equally many passes (``group``).
    """
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32,
                      device=batch.response_mask.device)
    with torch.no_grad(), torch.inference_mode(inference_mode):
        for index, mb in micro_batches(batch, size=micro_batch_size, max_tokens=max_tokens,
                                       flag=flag, group=group, lockstep=not inference_mode,
                                       packed=packs(model, layout)):
            lp = response_log_probs(model, mb, temperature=temperature, bf16=bf16,
                                    layout=layout)[0]
            out[index, : lp.shape[1]] = lp
    return out.clone()  # outside inference mode: a normal tensor the loss may save for backward
