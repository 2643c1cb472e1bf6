"""Rules of the on-policy distillation flags (reinforce_plus_plus.md §7b,
docs/configuration.md "Distillation"). Torch-free, like the rest of validation: the teacher's
directory is checked here; its vocabulary against the student's when the trainer builds it
(relax/trainer/distill.py), before any step."""

from __future__ import annotations

import os

from relax.config.checks import reject
from relax.config.gym_spec import is_reasoning_gym

_NEEDS_OPD = ("opd_type", "opd_kl_coef", "opd_teacher_load", "opd_only")
_NEEDS_SELF = ("opsd_beta", "opsd_jsd_clip", "opsd_privileged_info_key")


def check_distillation(cfg, explicit: set[str]) -> None:
    if not cfg.use_opd:
        for dest in _NEEDS_OPD + _NEEDS_SELF:
            if dest in explicit:
                reject(cfg, dest, "has no effect without --use-opd; add it or remove this flag")
        return
    if cfg.opd_type == "self":
        _check_self(cfg)
    else:
        for dest in _NEEDS_SELF:
            if dest in explicit:
                reject(cfg, dest, "has no effect without --opd-type self; add it or remove "
                       "this flag")
    if not cfg.opd_kl_coef >= 0:
        reject(cfg, "opd_kl_coef", "must be >= 0 (the weight of the reverse KL to the "
               "teacher), e.g. 1.0")
    if cfg.opd_only and cfg.opd_kl_coef == 0:
        reject(cfg, ("opd_only", "opd_kl_coef"), "distillation alone with a zero coefficient "
               "trains on nothing; set --opd-kl-coef > 0")
    path = cfg.opd_teacher_load
    if path is not None:
        _check_teacher_dir(cfg, path)
    elif cfg.opd_type != "self":  # self: the frozen initial model by default
        reject(cfg, "use_opd", "needs a teacher; add --opd-teacher-load DIR (a Hugging Face "
               "model directory with the student's vocabulary)")
    if cfg.fully_async:
        reject(cfg, ("use_opd", "fully_async"), "the teacher pass is not wired to rollout "
               "ranks of their own yet; remove one of the two")


def _check_teacher_dir(cfg, path: str) -> None:
    if not os.path.isdir(path):
        reject(cfg, "opd_teacher_load", "no such directory; point it at the teacher's Hugging "
               "Face model directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        reject(cfg, "opd_teacher_load", "no config.json in it; point it at a Hugging Face "
               "model directory")


def _check_self(cfg) -> None:
    """--opd-type self: the JSD's settings and a data file whose rows carry the key."""
    if not 0.0 <= cfg.opsd_beta <= 1.0:  # NaN fails too
        reject(cfg, "opsd_beta", "must be in [0, 1] (0: forward KL, 1: reverse KL, 0.5: "
               "symmetric JSD)")
    if not cfg.opsd_jsd_clip > 0:
        reject(cfg, "opsd_jsd_clip", "must be > 0 (each token's JSD is clipped to it), e.g. "
               "0.05")
    if cfg.opsd_privileged_info_key is None:
        reject(cfg, "opd_type", "needs --opsd-privileged-info-key KEY, the --prompt-data key "
               "holding the privileged information (the reference solution)")
    if cfg.env is not None or cfg.use_agentic_rollout:
        reject(cfg, ("opd_type", "env" if cfg.env is not None else "use_agentic_rollout"),
               "episodes have no data row to take the privileged information from; remove "
               "one of the two")
    if cfg.partial_rollout:
        reject(cfg, ("opd_type", "partial_rollout"), "the teacher's prompts are not carried "
               "with unfinished groups; remove one of the two")
    if cfg.prompt_data is None or is_reasoning_gym(cfg.prompt_data):
        reject(cfg, "opsd_privileged_info_key", "needs a --prompt-data file (.jsonl or "
               ".parquet) whose rows have the key; the built-in task and reasoning-gym "
               "datasets have no such field")
