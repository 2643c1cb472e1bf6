"""Relax: a reinforcement-learning post-training engine for language models.

The numerical contract lives in :mod:`relax.algorithms` (pure tensor functions);
see ``docs/`` and docs/algorithms/reinforce_plus_plus.md for the formulas.
"""

__version__ = "0.1.0"
