"""Prompts: what a rollout step samples from -- prompt files and the built-in tasks served one
step at a time (data.py, tasks.py), reasoning-gym sources (reasoning_gym_source.py), the prompt
record every source builds (samples.py) and the self-distillation teacher's prompt
(privileged.py). Torch-free.
"""
