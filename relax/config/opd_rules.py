"""Rules of the on-policy distillation flags (reinforce_plus_plus.md §7b,
docs/configuration.md "Distillation"). Torch-free, like the rest of validation: the teacher's
directory is checked here; its vocabulary against the student's when the trainer builds it
(relax/trainer/distill.py), before any step."""

from __future__ import annotations

import os

from relax.config.checks import reject

_NEEDS_OPD = ("opd_type", "opd_kl_coef", "opd_teacher_load", "opd_only")


def check_distillation(cfg, explicit: set[str]) -> None:
    if not cfg.distillation.enabled:
        for dest in _NEEDS_OPD:
            if dest in explicit:
                reject(cfg, dest, "has no effect without --use-opd; add it or remove this flag")
        return
    if cfg.distillation.type == "self":
        reject(cfg, "opd_type", "on-policy self-distillation (a privileged-information teacher "
               "with a clipped JSD loss) is not built in Relax; use --opd-type model with "
               "--opd-teacher-load DIR")
    if not cfg.distillation.kl_coef >= 0:
        reject(cfg, "opd_kl_coef", "must be >= 0 (the weight of the reverse KL to the "
               "teacher), e.g. 1.0")
    if cfg.distillation.only and cfg.distillation.kl_coef == 0:
        reject(cfg, ("opd_only", "opd_kl_coef"), "distillation alone with a zero coefficient "
               "trains on nothing; set --opd-kl-coef > 0")
    path = cfg.distillation.teacher_load
    if path is None:
        reject(cfg, "use_opd", "needs a teacher; add --opd-teacher-load DIR (a Hugging Face "
               "model directory with the student's vocabulary)")
    if not os.path.isdir(path):
        reject(cfg, "opd_teacher_load", "no such directory; point it at the teacher's Hugging "
               "Face model directory")
    if not os.path.isfile(os.path.join(path, "config.json")):
        reject(cfg, "opd_teacher_load", "no config.json in it; point it at a Hugging Face "
               "model directory")
    if cfg.placement.fully_async:
        reject(cfg, ("use_opd", "fully_async"), "the teacher pass is not wired to rollout "
               "ranks of their own yet; remove one of the two")
