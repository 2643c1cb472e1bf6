"""The run section (``cfg.run``): the run's outputs, seed, logging and wall-clock budget, and its
rules. Torch-free."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from relax.config.checks import check_not_a_file
from relax.config.section import Section, option, reject


@dataclass(frozen=True)
class RunSection(Section):
    """The run's outputs, seed, logging and wall-clock budget."""

    output_dir: str | None = option(
        None,
        'Gets config.json and the metrics.',
        default_text='runs/<estimator>-<YYYYmmdd-HHMMSS>', writes='output')
    seed: int = option(
        1234,
        'Seed of every RNG.',
        bound=(lambda v: 0 <= v < 2**32, "must lie in [0, 2**32)"))
    exit_duration_in_mins: float | None = option(
        None,
        'A wall-clock budget: after the first rollout step that ends this many minutes after '
        'relax train started, evaluate (with --eval-interval) and save (with --save) as at the'
        ' last step, then exit 0. Resuming with --load continues the remaining steps on a '
        'fresh budget.',
        bound=(lambda v: v is None or v > 0, "must be > 0 minutes"))
    distributed_timeout_minutes: float = option(
        10.0,
        'Collective timeout: a rank that waits longer for its peers exits with an error.',
        bound=(lambda v: 0.0 < v <= 10080.0, "must lie in (0, 10080] minutes (one week); the default is 10"))
    log_samples: int = option(
        4,
        'Samples per rollout step appended to OUTPUT_DIR/samples.jsonl (prompt, response, '
        'reward, label); 0 turns it off.',
        bound=(lambda v: v >= 0, "must be >= 0 samples per rollout step; 0 turns it off"))
    use_tensorboard: bool = option(
        False,
        'Also write TensorBoard event files.')
    use_wandb: bool = option(
        False,
        'Also log to Weights & Biases (needs wandb).')
    dry_run: bool = option(
        False,
        'Validate, print the resolved configuration as JSON, exit 0 without loading a model or'
        ' data.')

    def check(self) -> None:
        check_not_a_file(self, "output_dir")
        if self.use_wandb and importlib.util.find_spec("wandb") is None:
            reject(self, "use_wandb", "wandb is not installed; pip install wandb (in a "
                   "clone: pip install -e '.[wandb]') or remove --use-wandb")
        if self.use_tensorboard and importlib.util.find_spec("tensorboard") is None:
            reject(self, "use_tensorboard", "tensorboard is not installed; make install "
                   "in a clone, or pip install tensorboard, or remove --use-tensorboard")
