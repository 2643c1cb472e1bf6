"""Evaluation: the unbiased pass@k estimator, ``evaluate`` on a model, the training hook
``maybe_evaluate`` and the ``relax eval`` command.

``relax.eval.passk`` is pure Python; everything else imports torch, so it is loaded on first
use (``import relax.eval`` stays cheap for the command line).
"""

from __future__ import annotations

import importlib

from relax.eval.passk import ks_for, mean_pass_at_k, pass_at_k

_LAZY = {
    "EvalSampling": "relax.eval.evaluate",
    "evaluate": "relax.eval.evaluate",
    "EvalSet": "relax.eval.hook",
    "evaluate_sets": "relax.eval.hook",
    "load_eval_sets": "relax.eval.hook",
    "maybe_evaluate": "relax.eval.hook",
    "run_eval_command": "relax.eval.hook",
}

__all__ = ["ks_for", "mean_pass_at_k", "pass_at_k", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'relax.eval' has no attribute {name!r}")
