"""Evaluation: the unbiased pass@k estimator and its accumulator (``passk``), ``evaluate`` on
prompts (``evaluate``) and on ``--env`` episodes (``env_eval``), the evaluation sets and the
training hook ``maybe_evaluate`` (``sets``) and the ``relax eval`` command (``command``,
sampling through the rollout backend, relax/rollout/backends/).

``relax.eval.passk`` is pure Python; everything else imports torch, so import the submodule
you need (``import relax.eval`` stays cheap for the command line).
"""
