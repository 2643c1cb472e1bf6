"""On-policy distillation on the trainer's ranks (reinforce_plus_plus.md §7b): the frozen
teacher of ``--use-opd``, its log-probs of the student's sampled tokens, and the advantage
term they give, a training term (relax/trainer/terms/term.py).

    term = Distillation.build(cfg.distillation, ctx, tokenizer=policy.tokenizer,
                              student=policy.module, bf16=bf16)
    exp.teacher_log_probs = term.teacher_log_probs(exp, **passes)   # before_update, no autograd
    exp.advantages = term.advantages(exp, tracker)                  # shape_advantages: A - C * (s - t)

The teacher pass is the reference pass of relax/trainer/policy/logprobs.py (``batched_log_probs``):
the same micro-batches or token budget, the output layer in chunks where the model allows (no
[B, T, V] tensor), and the same sampling temperature as the student's pi_old pass. The teacher is kept in
bf16 under ``--bf16`` (it is never trained), whole on every rank (not sharded by ``--fsdp``).
"""

from __future__ import annotations

import torch

from relax.algorithms.distillation import distilled_advantages, opd_metrics
from relax.trainer.terms.teacher import LocalTeacher
from relax.trainer.terms.teacher_server import ServerTeacher
from relax.trainer.terms.term import Term


class Distillation(Term):
    """The teacher (a :class:`LocalTeacher`, or the server of
    relax/trainer/terms/teacher_server.py) and the term's settings; see the module docstring."""

    def __init__(self, teacher, *, kl_coef: float, only: bool, group=None):
        self.teacher, self.kl_coef, self.only, self.group = teacher, kl_coef, only, group

    @classmethod
    def build(cls, section, ctx, *, tokenizer, student: torch.nn.Module, bf16: bool,
              run_dir: str = ".", seed: int = 0) -> Distillation | None:
        """The teacher of ``--use-opd`` (``section``: the distillation section): a local one
        from ``--opd-teacher-load``, or with ``--opd-type server`` the vLLM teacher (its log in
        ``run_dir``, ``seed`` its own); None without ``--use-opd`` and with ``--opd-type self``
        (relax/trainer/terms/self_distillation.py)."""
        if not section.use_opd or section.self_mode:
            return None
        if section.opd_type == "server":
            teacher = ServerTeacher.open(section, ctx, tokenizer=tokenizer, bf16=bf16,
                                         run_dir=run_dir, seed=seed)
        else:
            teacher = LocalTeacher.load(section.opd_teacher_load, ctx, tokenizer=tokenizer,
                                        student=student, bf16=bf16)
        return cls(teacher, kl_coef=section.opd_kl_coef, only=section.opd_only, group=ctx.group)

    def teacher_log_probs(self, exp, **passes) -> torch.Tensor:
        """log pi_teacher(y_t) [B, T] float32 of ``exp``'s responses, no autograd
        (``passes``: the micro-batching of ``batched_log_probs``; a server gets requests of
        its own size)."""
        return self.teacher.log_probs(exp, **passes)

    def close(self) -> None:
        """An owned teacher server ends with the run."""
        self.teacher.close()

    def before_update(self, exp, batch, passes: dict) -> None:
        exp.teacher_log_probs = self.teacher_log_probs(exp, **passes)

    def shape_advantages(self, exp, estimate, tracker) -> None:
        """After the estimator and its normalization (§7b)."""
        exp.advantages = self.advantages(exp, tracker)

    def advantages(self, exp, tracker) -> torch.Tensor:
        """``A - C * (log pi_old - log pi_teacher)`` [B, T] on the loss mask (the estimator's
        ``A`` replaced by 0 with ``--opd-only``), and the step's ``rollout/opd_reverse_kl``
        and ``rollout/teacher_logprob`` (global over the data-parallel group)."""
        student, teacher, mask = exp.old_log_probs, exp.teacher_log_probs, exp.response_mask
        for name, value in opd_metrics(student, teacher, mask, group=self.group).items():
            tracker.add_global(name, value)
        base = None if self.only else exp.advantages
        return distilled_advantages(base, student, teacher, mask, kl_coef=self.kl_coef)
