"""The trainer (reinforce_plus_plus.md §9): rollout, then update, on every rank, or with
``--fully-async`` on rollout ranks of their own beside the training ranks
(relax/trainer/fully_async/async_layout.py).

``train(cfg) -> int`` takes the resolved configuration of ``relax.config.parse_train_config``
and returns the process exit status (relax/trainer/launch.py). Heavy imports happen inside, so
``import relax.trainer`` is cheap.
"""


def train(cfg) -> int:
    from relax.trainer.launch import train as _train

    return _train(cfg)


__all__ = ["train"]
