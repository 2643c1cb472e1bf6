"""The teacher of on-policy distillation (reinforce_plus_plus.md §7b), loaded in this process:
``--opd-teacher-load`` on every rank, its vocabulary checked against the student's (a check
the vLLM teacher of relax/trainer/terms/teacher_server.py and the self-distillation teacher
pass too). The term that uses it is relax/trainer/terms/distillation.py.
"""

from __future__ import annotations

import torch

from relax import models
from relax.errors import InputError
from relax.trainer.policy.logprobs import batched_log_probs

FLAG = "--opd-teacher-load"


def check_vocabulary(path: str, student_tokenizer, teacher_tokenizer) -> None:
    """The teacher must give the student's token ids the same meaning: equal vocabularies
    (token -> id, added tokens included), else one line naming the flag and the first
    difference."""
    s, t = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if s == t:
        return
    if len(s) != len(t):
        raise InputError(f"{FLAG} {path}: the teacher's tokenizer has {len(t)} tokens, the "
                         f"student's {len(s)}; distillation needs the student's vocabulary")
    token = next(tok for tok in sorted(s) if s[tok] != t.get(tok))
    raise InputError(f"{FLAG} {path}: token {token!r} is id {s[token]} for the student but "
                     f"{t.get(token)} for the teacher; distillation needs the student's "
                     "vocabulary")


def _output_rows(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


class LocalTeacher:
    """A frozen causal LM on this rank, scored with the reference pass's micro-batching."""

    def __init__(self, model: torch.nn.Module, *, bf16: bool):
        self.model, self.bf16 = model, bf16

    @classmethod
    def load(cls, path: str, ctx, *, tokenizer, student: torch.nn.Module,
             bf16: bool) -> LocalTeacher:
        """``--opd-teacher-load`` after its vocabulary is checked against the student's
        (tokenizer first, before any weight is read)."""
        check_vocabulary(path, tokenizer, models.load_tokenizer(path, flag=FLAG))
        # a frozen causal LM loaded like the judge: bf16 with --bf16, eval, no gradients
        model = models.load_judge(path, ctx.device, bf16=bf16, flag=FLAG)
        if _output_rows(model) < _output_rows(student):
            raise InputError(f"{FLAG} {path}: the teacher's output layer has "
                             f"{_output_rows(model)} rows, fewer than the student's "
                             f"{_output_rows(student)}; it cannot score every token the "
                             "student may sample")
        return cls(model, bf16=bf16)

    def log_probs(self, exp, **passes) -> torch.Tensor:
        return batched_log_probs(self.model, exp, bf16=self.bf16, **passes)

    def close(self) -> None:
        """Nothing outside the process."""
