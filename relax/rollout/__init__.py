"""Rollout: the rollout phase as objects, and what they are built from.

On top, the collectors: ``collect(step) -> StepBatch`` with a ``state_dict`` -- prompt groups
and dynamic sampling around them (``collectors``, with the ``filters`` of dynamic sampling),
``--env`` environments and agent programs (``episode_collector``), ``--partial-rollout``'s
carried groups (``partial``) -- and ``assembly``, which builds them from the configuration
(they agree through relax/agreement.py). Below them, sub-packages by
concern, each importing only those before it: ``generation`` (decoding, the Sampler,
StepBatch), ``prompts`` (prompt data, built-in tasks, reasoning-gym), ``reward`` (reward
functions, reward servers, the judge, the Scorer), ``agents`` (environments, episodes, agent
programs); ``backends`` (who samples: Relax's engine or vLLM servers, behind one protocol)
uses ``generation``. docs/architecture.md draws it.

Submodules are imported on use so that ``import relax.rollout.prompts.tasks`` stays light.
"""
