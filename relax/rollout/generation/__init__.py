"""Generation: left-padded KV-cache decoding with a policy (generate.py, the static-cache
engine.py for Qwen3/Qwen2/Llama), the Sampler that runs it under the run's precision for
training, episodes and evaluation (sampler.py), one rank's samples of a step (batch.py:
StepBatch) and the KV reuse across an episode's turns (turn_cache.py). Imports nothing else of
rollout/.
"""
