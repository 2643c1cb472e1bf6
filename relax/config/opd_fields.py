"""The distillation section (``cfg.distillation``): on-policy distillation flags (slime's
names; reinforce_plus_plus.md §7b). Rules: relax/config/opd_rules.py. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, option

# model: a Hugging Face teacher loaded beside the policy (slime's "megatron" mode);
# self: on-policy self-distillation, the frozen initial model seeing privileged information
# (relax/trainer/self_distill.py); server: a vLLM server's prompt log-probs
# (relax/trainer/teacher_server.py)
OPD_TYPES: tuple[str, ...] = ("model", "self", "server")


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
        "with the student's vocabulary, run beside the policy; its reverse KL enters the "
        'advantage) or self (on-policy self-distillation: the frozen initial model, or '
        "--opd-teacher-load, reads the prompt with the sample's privileged information and a "
        'clipped full-vocabulary JSD to it is added to the loss) or server (a vLLM server '
        'scores the sampled tokens: --opd-teacher-url, or one Relax starts per rank from '
        '--opd-teacher-load; needs --rollout-temperature 1).',
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
        'student); required by --use-opd --opd-type model. --opd-type self: the frozen '
        'initial model by default (--hf-checkpoint, or the built-in model).',
        flag='opd_teacher_load',
        default_text='none (required by --opd-type model)')
    only: bool = option(
        False,
        "Distillation alone: the estimator's advantage is replaced by 0, so the teacher's "
        'reverse KL is the only training signal (the task reward is still computed and logged '
        'as rollout/raw_reward); needs --use-opd.',
        flag='opd_only')
    teacher_url: str | None = option(
        None,
        '--opd-type server: the base URL of a running vLLM server (OpenAI API) serving the '
        'teacher; without it Relax starts one per rank from --opd-teacher-load.',
        flag='opd_teacher_url', metavar='URL')
    teacher_timeout: float = option(
        600.0,
        '--opd-type server: seconds an owned teacher server may take to start, and one '
        'scoring request may take; then the run stops naming the server and its log.',
        flag='opd_teacher_timeout', metavar='SECONDS')
    opsd_beta: float = option(
        0.5,
        "--opd-type self: the JSD's mixture weight beta in [0, 1] (0: forward KL "
        'KL(teacher || student), 1: reverse KL KL(student || teacher), 0.5: symmetric).')
    opsd_jsd_clip: float = option(
        0.05,
        "--opd-type self: c > 0, each token's JSD is clipped to min(JSD, c), so a token beyond "
        'c adds c and no gradient.')
    privileged_info_key: str | None = option(
        None,
        '--opd-type self: the key of each --prompt-data row holding the privileged '
        "information (the reference solution) that only the teacher's prompt shows; required "
        'by --opd-type self.',
        flag='opsd_privileged_info_key', metavar='KEY',
        default_text='none (required by --opd-type self)')

    @property
    def self_mode(self) -> bool:
        return self.enabled and self.type == "self"
