"""On-policy self-distillation, ``--use-opd --opd-type self`` (reinforce_plus_plus.md §7b,
"Self mode"): the frozen initial model reads the prompt with the row's privileged information
(relax/rollout/prompts/privileged.py) followed by the student's response, and ``C * min(JSD_beta, c)``
over the full vocabulary is added to the update's loss on every trained token.

    term = SelfDistillation.build(section, ctx, tokenizer=..., student=policy.module, ...)
    term.attach(exp, batch.teacher_prompts, tokenizer)  # the teacher's prompts, once a step
    jsd = term.token_terms(student_rows, mb)        # inside the update's loss, per micro-batch
    loss + C * reduce(jsd)                          # its share of the loss (add_loss)

It is a training term (relax/trainer/terms/term.py): ``before_update`` attaches the teacher's
prompts, ``shape_advantages`` zeroes the estimator's advantage under ``--opd-only``,
``student_rows`` and ``add_loss`` add the JSD to the update's loss with the metrics
:data:`METRICS`.

Memory: the teacher runs once per update micro-batch, without autograd, up to its final
hidden states [b, T, H]; both output layers then run over the valid tokens in chunks of
``CHUNK_ELEMENTS // V`` rows, each a non-reentrant checkpoint (its two [n, V] logits are
recomputed in the backward, not kept), so no [B, T, V] tensor exists when the student's head
allows chunks (relax/trainer/policy/logprobs.py ``_output_layer``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax import models
from relax.algorithms.self_distillation import opsd_token_terms
from relax.errors import InputError
from relax.rollout.generation.generate import tokenize_prompts
from relax.trainer.policy.experience import Experience
from relax.trainer.policy.logprobs import (
    CHUNK_ELEMENTS,
    ResponseRows,
    _hidden_states,
    _output_layer,
    chunk_call,
)
from relax.trainer.terms.teacher import FLAG, check_vocabulary
from relax.trainer.terms.term import LossView, Term

# each reduced like the loss: the clipped JSD (before the weight C), the share of tokens the
# clip bound, the full-vocabulary reverse KL and the teacher's log-prob of the sampled token
METRICS = ("train/opsd_jsd", "train/opsd_jsd_clipfrac", "train/opsd_reverse_kl",
           "train/opsd_teacher_logprob")


@dataclass(frozen=True)
class OpsdSettings:
    beta: float
    clip: float
    coef: float  # --opd-kl-coef: the weight of the JSD loss


def teacher_experience(mb: Experience) -> Experience:
    """The teacher's rows: its prompt (``mb.teacher_prompt_*``) followed by ``mb``'s response
    columns, with positions counting attended tokens like the student's."""
    T = mb.response_mask.shape[1]
    input_ids = torch.cat([mb.teacher_prompt_ids, mb.input_ids[:, -T:]], dim=1)
    attention = torch.cat([mb.teacher_prompt_mask.long(), mb.attention_mask[:, -T:]], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Experience(input_ids, attention, position_ids, mb.response_mask)


def _chunk_terms(s_rows, s_weight, s_bias, t_hidden, t_weight, t_bias, targets, beta, clip,
                 temperature):
    s_logits = s_rows if s_weight is None else torch.nn.functional.linear(s_rows, s_weight,
                                                                          s_bias)
    with torch.no_grad():
        t_logits = torch.nn.functional.linear(t_hidden, t_weight, t_bias)
    return opsd_token_terms(s_logits, t_logits, targets, beta=beta, clip=clip,
                            temperature=temperature)


def chunked_opsd_terms(s_rows, s_head, t_hidden, t_head, targets, *, beta: float, clip: float,
                       temperature: float, chunk_elements: int = CHUNK_ELEMENTS):
    """:func:`~relax.algorithms.self_distillation.opsd_token_terms` over rows [N, *] in chunks:
    ``s_rows`` the student's hidden states with ``s_head`` (weight, bias), or its logits with
    ``s_head`` None; ``t_hidden`` [N, H] the teacher's hidden states and ``t_head`` its output
    layer. Returns the clipped JSD [N] (with the student's gradient) and the statistics [N, 4]."""
    weight, bias = s_head if s_head is not None else (None, None)
    rows = max(1, chunk_elements // t_head[0].shape[0])
    grad = torch.is_grad_enabled() and s_rows.requires_grad
    losses, stats = [], []
    for start in range(0, s_rows.shape[0], rows):
        part = slice(start, start + rows)
        args = (s_rows[part], weight, bias, t_hidden[part], *t_head, targets[part], beta, clip,
                temperature)
        loss, stat = chunk_call(_chunk_terms, args, grad=grad)
        losses.append(loss)
        stats.append(stat)
    if not losses:
        empty = s_rows.new_zeros(0, dtype=torch.float32)
        return empty, empty.new_zeros(0, 4)
    return torch.cat(losses), torch.cat(stats)


class SelfDistillation(Term):
    """The frozen teacher and the JSD's settings; see the module docstring (``tokenizer``:
    the student's, for the teacher's prompts)."""

    metric_names = METRICS
    keeps_zero_advantage_rows = True  # the JSD does not vanish with the advantage

    def __init__(self, teacher: torch.nn.Module, settings: OpsdSettings, *, temperature: float,
                 only: bool = False, tokenizer=None):
        self.teacher, self.settings, self.temperature = teacher, settings, temperature
        self.only, self.tokenizer = only, tokenizer
        self.chunk_elements = CHUNK_ELEMENTS  # logits elements per chunk (tests make it small)
        self.head = _output_layer(teacher)
        if self.head is None:
            raise InputError(f"{FLAG}: --opd-type self needs a teacher whose output layer is a "
                             "plain linear layer (no final logit soft-cap)")
        self.head = self.head[1:]

    @classmethod
    def build(cls, section, ctx, *, tokenizer, student, bf16: bool, initial: str | None,
              seed: int, temperature: float) -> SelfDistillation | None:
        """The teacher of ``--opd-type self`` (``section``: the distillation section):
        ``--opd-teacher-load`` (its vocabulary checked against the student's first), else the
        ``initial`` model (``--hf-checkpoint``, or the built-in model from ``seed``), frozen,
        in bf16 under ``--bf16``; None otherwise. ``temperature``: the rollout's."""
        if not section.self_mode:
            return None
        path = section.opd_teacher_load or initial
        if section.opd_teacher_load is not None:
            check_vocabulary(path, tokenizer, models.load_tokenizer(path, flag=FLAG))
        if path is not None:
            teacher = models.load_judge(path, ctx.device, bf16=bf16, flag=FLAG)
        else:  # the built-in model is a pure function of the seed: its initial weights again
            teacher = models.build_tiny_model(tokenizer, seed).to(
                torch.bfloat16 if bf16 else torch.float32).requires_grad_(False)
            teacher = teacher.to(ctx.device).eval()
        if teacher.get_output_embeddings().weight.shape[0] < \
                student.get_output_embeddings().weight.shape[0]:
            raise InputError(f"{FLAG} {path}: the teacher's output layer has fewer rows than "
                             "the student's; it cannot score every token the student may sample")
        settings = OpsdSettings(section.opsd_beta, section.opsd_jsd_clip, section.opd_kl_coef)
        return cls(teacher, settings, temperature=temperature, only=section.opd_only,
                   tokenizer=tokenizer)

    # ------------------------------------------------------------------ the term's hooks
    def before_update(self, exp, batch, passes: dict) -> None:
        self.attach(exp, batch.teacher_prompts, self.tokenizer)

    def shape_advantages(self, exp, estimate, tracker) -> None:
        exp.advantages = self.advantages(exp)

    def student_rows(self, rows: ResponseRows, mb: Experience):
        return self.token_terms(rows, mb)

    def add_loss(self, loss, view: LossView, rows):
        """``loss + C * reduce(min(JSD, c))``; the stats of :data:`METRICS` (the unclipped JSD
        column of ``token_terms``' statistics is not one)."""
        jsd, stats = rows
        stats = [view.reduce(x) for x in (jsd, *stats.unbind(-1)[1:])]
        return loss + self.settings.coef * stats[0], stats

    def advantages(self, exp: Experience) -> torch.Tensor:
        """The estimator's advantage, or 0 with ``--opd-only`` (the JSD is then the whole
        loss)."""
        return torch.zeros_like(exp.advantages) if self.only else exp.advantages

    def attach(self, exp: Experience, teacher_prompts: list[str] | None, tokenizer) -> None:
        """The teacher's prompts of ``exp``'s rows (texts of the collector), tokenized."""
        if teacher_prompts is None or len(teacher_prompts) != len(exp):
            raise ValueError("--opd-type self: the batch carries no teacher prompt for each row")
        ids, mask = tokenize_prompts(tokenizer, teacher_prompts, exp.input_ids.device)
        exp.teacher_prompt_ids, exp.teacher_prompt_mask = ids, mask

    def token_terms(self, r: ResponseRows, mb: Experience):
        """The clipped JSD [B, T] (with the student's gradient, 0 off the loss mask) and the
        statistics [B, T, 4] of the micro-batch ``mb`` whose student forward gave ``r``."""
        B, T = r.shape
        texp = teacher_experience(mb)
        with torch.no_grad():
            t_hidden = _hidden_states(self.teacher, self.teacher, texp, T, None)
        positions = (torch.arange(B * T, device=r.targets.device) if r.index is None
                     else r.index)
        keep = mb.response_mask.reshape(-1)[positions]  # the trained tokens only
        s = self.settings
        loss, stats = chunked_opsd_terms(
            r.rows[keep], r.head, t_hidden.reshape(B * T, -1)[positions[keep]], self.head,
            r.targets[keep], beta=s.beta, clip=s.clip, temperature=self.temperature,
            chunk_elements=self.chunk_elements)
        grid = ResponseRows(r.rows, r.head, r.targets, positions[keep], (B, T))
        return grid.to_grid(loss), torch.stack([grid.to_grid(c) for c in stats.unbind(-1)], -1)
