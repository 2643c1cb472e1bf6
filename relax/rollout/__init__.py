"""Rollout: the rollout phase as objects, and what they are built from.

- ``assembly``: the rollout side built from the configuration (the trainer's and the rollout
  ranks' one assembly); ``agreement``: how a step's shares agree (a process group, or a
  rollout rank's shares in lockstep);
- ``collectors``: the ``Collector`` protocol, ``collect(step) -> StepBatch`` with a
  ``state_dict``: prompt groups (``PromptCollector``) and dynamic sampling around them
  (``DynamicSampling``); ``partial``: partial rollouts;
- ``episode_collector``: ``--env`` environments and ``--use-agentic-rollout`` agent programs;
- ``sampler``: generation with a policy under the run's precision (training and evaluation);
- ``scoring``: rewards of a step's samples, their failures and post-processing;
- ``batch``: ``StepBatch``, one rank's samples of a step;
- ``generate`` / ``engine``: left-padded KV-cache decoding (the sampler's log-probs with every
  token), the static-cache engine for Qwen3/Qwen2/Llama;
- ``tiny_model``, ``tasks``, ``math_reward``, ``rewards``, ``data``, ``reasoning_gym_source``,
  ``filters``, ``envs``, ``episodes``, ``agent_server``: the built-in model and tasks, reward
  functions and plug-ins, prompt data, dynamic-sampling filters, environments and agents.

Submodules are imported on use so that ``import relax.rollout.tasks`` stays light.
"""
