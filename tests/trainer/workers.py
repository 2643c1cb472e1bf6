"""Helpers and per-rank workers for the trainer tests (kept out of ``test_*.py`` so spawned
children import only this light module)."""

from __future__ import annotations

import dataclasses
import traceback

import torch
import torch.distributed as dist

from relax.config.sections import OffPolicySection
from relax.tiny_model import build_tiny_model, build_tiny_moe, build_tokenizer
from relax.trainer.distributed import DistContext, reshard, wrap_model
from relax.trainer.policy.logprobs import Experience, batched_log_probs, response_log_probs
from relax.trainer.policy.recompute import apply_recompute
from relax.trainer.policy.update import LossSettings, train_on_rollout
from relax.trainer.terms.off_policy import OffPolicy

B, P, T = 8, 4, 6


SHARED_PROMPTS = ((1, 0), (2, 3), (5, 4), (6, 7))  # (source row, row that repeats its prompt)


def fixed_experience(model, seed: int = 0, shared_prompts: bool = False) -> Experience:
    """A deterministic batch: left-padded prompts, variable-length responses (one empty, one
    with an internal hole in its loss mask, as a partial rollout's off-policy tokens), old/ref log-probs off the current policy so ratios and the
    clip are active, random advantages. ``shared_prompts``: rows pair up on one prompt, as the
    samples of a group do (``SHARED_PROMPTS``)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[1, :2] = False
    prompt_mask[5, :1] = False
    prompt[~prompt_mask] = 0
    if shared_prompts:
        for src, dst in SHARED_PROMPTS:
            prompt[dst], prompt_mask[dst] = prompt[src], prompt_mask[src]
    response = torch.randint(3, vocab, (B, T), generator=g)
    lengths = torch.tensor([6, 3, 1, 0, 5, 2, 6, 4])
    attended = torch.arange(T)[None, :] < lengths[:, None]
    response[~attended] = 0
    response_mask = attended.clone()
    response_mask[6, 2] = False  # an internal hole of the loss mask: read, not trained
    attention = torch.cat([prompt_mask, attended], 1).long()
    exp = Experience(
        input_ids=torch.cat([prompt, response], 1),
        attention_mask=attention,
        position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        response_mask=response_mask,
    )
    with torch.no_grad():
        current, _ = response_log_probs(model, exp)
    exp.old_log_probs = current + 0.3 * torch.randn(B, T, generator=g)
    exp.ref_log_probs = current + 0.2 * torch.randn(B, T, generator=g)
    exp.advantages = torch.where(response_mask, torch.randn(B, T, generator=g), 0.0)
    return exp


# LossSettings' own fields; every other keyword of loss_settings / replace_loss is the
# algorithm section's (per_token: its calculate_per_token_loss)
_RUN = ("off_policy", "temperature", "bf16", "max_tokens", "layout", "opsd")


def loss_settings_of(**kw) -> LossSettings:
    """The update's settings from the algorithm section's fields and LossSettings' own."""
    return replace_loss(LossSettings(), **kw)


def replace_loss(s: LossSettings, **kw) -> LossSettings:
    if "per_token" in kw:
        kw["calculate_per_token_loss"] = kw.pop("per_token")
    own = {k: kw.pop(k) for k in _RUN if k in kw}
    return dataclasses.replace(s, algorithm=dataclasses.replace(s.algorithm, **kw), **own)


def off_policy(tis_clip=None, tis_clip_low=0.0, opsm_delta=None, use_rollout_logprobs=False,
               tis_fn=None) -> OffPolicy:
    """TIS on with a clip, OPSM on with a delta (the off-policy section's switches)."""
    section = OffPolicySection(
        use_rollout_logprobs=use_rollout_logprobs, use_tis=tis_clip is not None,
        tis_clip=2.0 if tis_clip is None else tis_clip, tis_clip_low=tis_clip_low,
        use_opsm=opsm_delta is not None, opsm_delta=1e-4 if opsm_delta is None else opsm_delta)
    return OffPolicy(section, tis_fn)


def settings(estimator: str, per_token: bool = False) -> LossSettings:
    kl = estimator != "reinforce_plus_plus"
    return loss_settings_of(advantage_estimator=estimator, eps_clip=0.2, eps_clip_high=0.28,
                            use_kl_loss=kl, kl_loss_type="k2", kl_loss_coef=0.1 if kl else 0.0,
                            entropy_coef=0.01, per_token=per_token)


INERT_ROWS = [1, 4, 5, 6, 7]  # with two ranks: rank 1 holds only zero-advantage rows


OFF_POLICY = off_policy(tis_clip=1.5, tis_clip_low=0.5, opsm_delta=0.05)
# every §7c part at once: sequence weights truncated, IcePop, the veto
CORRECTION = OffPolicySection(rollout_is="sequence", rollout_is_threshold=1.5,
                              rollout_is_threshold_lower=0.5,
                              rollout_rs="token", rollout_rs_threshold=2.5,
                              rollout_token_veto_threshold=0.3)

OPSD_CLIP = 0.08  # the clip bounds about half of the batch's tokens (JSD 0.04 - 0.14)


def attach_self_distillation(exp: Experience, seed: int = 1):
    """--opd-type self on ``exp``: teacher prompts of other lengths than the student's (left
    padding of their own) and the teacher, another tiny model; returns the SelfDistillation
    with small output-layer chunks (several per micro-batch)."""
    from relax.trainer.terms.self_distillation import OpsdSettings, SelfDistillation

    g = torch.Generator().manual_seed(seed)
    Pt = P + 3
    lengths = torch.tensor([7, 2, 5, 3, 6, 4, 7, 1])
    mask = torch.arange(Pt)[None, :] >= Pt - lengths[:, None]
    ids = torch.where(mask, torch.randint(3, 40, (B, Pt), generator=g), 0)
    exp.teacher_prompt_ids, exp.teacher_prompt_mask = ids, mask
    teacher = build_tiny_model(build_tokenizer(), seed=8).requires_grad_(False).eval()
    with torch.no_grad():  # sharper than the student: JSDs well above 0
        teacher.model.norm.weight.mul_(4.0)
    opsd = SelfDistillation(teacher, OpsdSettings(beta=0.5, clip=OPSD_CLIP, coef=0.7),
                            temperature=1.0)
    opsd.chunk_elements = 5 * teacher.config.vocab_size
    return opsd


def one_step(estimator: str, per_token: bool, fsdp: bool, micro_batch_size: int,
             inert: bool = False, shared_prompts: bool = False, tied: bool = True,
             off_policy: bool = False, recompute=None, layout: str = "shared-prefix",
             opsd: bool = False, correction: bool = False, moe: bool = False,
             router_coef: float | None = None, replay: bool = False):
    """One optimizer step (SGD, lr 0.1, no clipping) on the fixed batch; rank r takes its rows.

    ``inert``: no KL or entropy term and all-zero advantages in ``INERT_ROWS``, rows whose
    backward the update skips. ``off_policy``: sampler log-probs off the old ones, with TIS
    (both clips active) and OPSM (reinforce_plus_plus.md §7a). ``recompute``: a
    :class:`~relax.config.sections.RecomputeSection` applied before wrapping; ``layout``:
    ``--pass-layout``; ``opsd``: the self-distillation JSD added to the loss
    (:func:`attach_self_distillation`); ``correction``: with ``off_policy``, the §7c rollout
    correction (``CORRECTION``) instead of TIS and OPSM; ``moe``: the tiny Qwen3-MoE instead of
    the dense model, ``router_coef``: with its router term (relax/trainer/terms/router.py) and
    this --moe-aux-loss-coef, its step metrics added to the first step's; ``replay``: R3 of a
    random routing record (relax/trainer/terms/routing_replay.py). Returns (full parameters by name,
    the step's metrics) from every rank."""
    distributed = dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    ctx = DistContext(rank, world, 0, torch.device("cpu"), dist.group.WORLD if distributed else None)
    tok = build_tokenizer()
    model = (build_tiny_moe if moe else build_tiny_model)(tok, seed=7, tie_word_embeddings=tied)
    exp = fixed_experience(model, shared_prompts=shared_prompts)
    loss_settings = settings(estimator, per_token)
    if inert:
        exp.advantages[INERT_ROWS] = 0.0
        loss_settings = loss_settings_of(advantage_estimator=estimator, eps_clip=0.2,
                                         per_token=per_token)
    if off_policy:
        g = torch.Generator().manual_seed(11)
        # a sampler that puts a little more mass on its tokens than pi_old: OPSM finds rows
        exp.rollout_log_probs = exp.old_log_probs + 0.4 * torch.randn(B, T, generator=g) + 0.2
        loss_settings = dataclasses.replace(
            loss_settings, off_policy=OffPolicy() if correction else OFF_POLICY)
    loss_settings = dataclasses.replace(loss_settings, layout=layout, opsd=opsd)
    terms = (attach_self_distillation(exp),) if opsd else ()
    if correction:
        from relax.trainer.terms.rollout_correction import RolloutCorrection
        terms += (RolloutCorrection(CORRECTION),)
    rows = B // world
    local = exp.rows(rank * rows, (rank + 1) * rows)
    if replay:
        from relax.trainer.terms.routing_replay import RoutingReplay

        g = torch.Generator().manual_seed(13)
        S, L, E = exp.input_ids.shape[1], model.config.num_hidden_layers, model.config.num_experts
        k = model.config.num_experts_per_tok
        exp.routed_experts = torch.rand(B, S, L, E, generator=g).argsort(-1)[..., :k].to(
            torch.int16)
        RoutingReplay(model, "rollout")
    if router_coef is not None:
        from relax.trainer.terms.router import RouterTerm

        terms += (RouterTerm.build(model, router_coef, ctx.group),)
    if recompute is not None:
        apply_recompute(model, recompute)
    model = wrap_model(model, ctx, fsdp=fsdp)
    if moe and fsdp:  # the experts' 3-D parameters are sharded like any other weight
        experts = model.model.layers[0].mlp.experts.gate_up_proj
        assert type(experts).__name__ == "DTensor" and experts.to_local().shape[0] < \
            experts.shape[0], "FSDP2 left the experts unsharded"
    # a no-grad pass through the wrapped model first, as the loop does for old log-probs
    # (under FSDP2 this once left gathered parameters that broke the next gradient)
    old = batched_log_probs(model, local, micro_batch_size=rows, temperature=1.0,
                            inference_mode=not fsdp, layout=layout)
    if fsdp:
        reshard(model)
    assert old.shape == local.response_mask.shape
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = train_on_rollout(model, opt, local, loss_settings, ctx,
                               global_batch_size=B, micro_batch_size=micro_batch_size,
                               clip_grad=1e6,  # no clipping: it would hide a 2x scale
                               terms=terms)
    if router_coef is not None:
        from relax.metrics.tracker import MetricTracker

        tracker = MetricTracker(ctx.group)
        terms[-1].after_update(tracker)
        history[0].update(tracker.reduce())
    params = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        params[name.removeprefix("module.")] = full.detach().clone()
    return params, history


def one_step_cases(cases: dict) -> dict:
    """:func:`one_step` of every case (``{key: args}``) on this rank, one after the other in
    the same process group, so a test module pays for one spawn of its ranks. Returns
    ``{key: ("ok", result)}``, or ``("raised", traceback)`` for a case that failed."""
    out = {}
    for key, args in cases.items():
        try:
            out[key] = ("ok", one_step(*args))
        except Exception:  # reported by the case's own test
            out[key] = ("raised", traceback.format_exc())
    return out
