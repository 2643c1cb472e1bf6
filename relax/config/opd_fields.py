"""The distillation section (``cfg.distillation``): on-policy distillation flags (slime's
names; reinforce_plus_plus.md §7b). Rules: relax/config/opd_rules.py. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, option

# model: a Hugging Face teacher loaded beside the policy (slime's "megatron" mode);
# self: on-policy self-distillation, declared so that asking for it gets a clear refusal
OPD_TYPES: tuple[str, ...] = ("model", "self")


@dataclass(frozen=True)
class DistillationSection(Section):
    """On-policy distillation: a frozen teacher's log-probs of the student's own tokens in the
    advantage (reinforce_plus_plus.md §7b)."""

    enabled: bool = option(
        False,
        "On-policy distillation: a frozen teacher scores the student's sampled tokens and -C *"
        " (log pi_student - log pi_teacher) is added to every valid token's advantage, on top "
        'of any estimator (reinforce_plus_plus.md §7b).',
        flag='use_opd')
    type: str = option(
        'model',
        'Where the teacher comes from: model (--opd-teacher-load, a Hugging Face directory '
        "with the student's vocabulary, run beside the policy). self (on-policy "
        'self-distillation) is not built and is refused.',
        flag='opd_type',
        choices=OPD_TYPES)
    kl_coef: float = option(
        1.0,
        'C >= 0, the weight of the per-token reverse KL to the teacher in the advantage; needs'
        ' --use-opd.',
        flag='opd_kl_coef')
    teacher_load: str | None = option(
        None,
        "The teacher's Hugging Face model directory (same tokenizer vocabulary as the "
        'student); required by --use-opd.',
        flag='opd_teacher_load',
        default_text='none (required by --use-opd)')
    only: bool = option(
        False,
        "Distillation alone: the estimator's advantage is replaced by 0, so the teacher's "
        'reverse KL is the only training signal (the task reward is still computed and logged '
        'as rollout/raw_reward); needs --use-opd.',
        flag='opd_only')
