"""Fully asynchronous training (``--fully-async``): the roles, groups and fixed-lag schedule of
the torchrun job (async_layout.py), the weights sent from the training ranks to the rollout
ranks (weight_sync.py, publish.py), a rollout rank (rollout_worker.py) and its batches on a
training rank (remote_rollout.py). Below the trainer's composition roots (loop.py, launch.py,
build.py), above its parts (distributed.py, lora.py, runtime.py).
"""
