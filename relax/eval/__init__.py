"""Evaluation: the unbiased pass@k estimator and its accumulator (``passk``), ``evaluate`` on
prompts (``evaluate``) and on ``--env`` episodes (``episodes``), the training hook
``maybe_evaluate`` (``hook``) and the ``relax eval`` command (``command``).

``relax.eval.passk`` is pure Python; everything else imports torch, so import the submodule
you need (``import relax.eval`` stays cheap for the command line).
"""
