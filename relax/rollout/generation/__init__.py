"""Generation: left-padded KV-cache decoding with a policy (generate.py, the static-cache
engine.py for Qwen3/Qwen2/Llama), the Sampler that runs it under the run's precision for
training, episodes and evaluation (sampler.py), one rank's samples of a step (batch.py:
StepBatch), the KV reuse across an episode's turns (turn_cache.py) and the prefill of prefixes
shared by groups of rows once per group (shared_prefix.py). Imports nothing else of rollout/.
"""
