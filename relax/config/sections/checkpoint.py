"""The checkpoint section (``cfg.checkpoint``): where and when checkpoints are written and read
(docs/reliability.md), and its rules. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import check_dir, check_not_a_file
from relax.config.section import Needs, Section, option, reject

NEEDS_SAVE = Needs(lambda cfg: cfg.checkpoint.save is not None, "nothing is saved without "
                   "--save DIR; add --save", given="changed")

@dataclass(frozen=True)
class CheckpointSection(Section):
    """Where and when checkpoints are written and read (docs/reliability.md)."""

    save: str | None = option(
        None,
        'Checkpoint directory.',
        default_note='no checkpoints', writes='save')
    load: str | None = option(
        None,
        'Checkpoint directory to resume from.')
    save_interval: int | None = option(
        None,
        'Rollout steps between checkpoints; needs --save.',
        default_text='only at the end',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 rollout steps"),
        requires=NEEDS_SAVE)
    keep_last: int | None = option(
        None,
        'Keep only the newest K interval checkpoints; needs --save.',
        default_text='keep all',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 checkpoints"),
        requires=NEEDS_SAVE)
    async_save: bool = option(
        False,
        'Write each interval checkpoint on a background thread while the next rollout step '
        'runs; a checkpoint counts only once completely written (docs/reliability.md).',
        requires=NEEDS_SAVE)
    checkpoint_checksums: bool = option(
        False,
        'Record the SHA-256 of every checkpoint file when saving and compare it at --load '
        '(reads every byte of the checkpoint).',
        default_note='file sizes only')

    def check(self) -> None:
        check_dir(self, "load", "a checkpoint directory written by --save")
        check_not_a_file(self, "save")


# ------------------------------------------------------------------ rules across sections

def check_save_interval(cfg, explicit: set[str]) -> None:
    """Sections checkpoint, batches: the interval is reached within the run."""
    interval, steps = cfg.checkpoint.save_interval, cfg.batches.num_rollout
    if interval is not None and steps is not None and interval > steps:
        reject(cfg, ("save_interval", "num_rollout"), "the interval is never reached, so no "
               "checkpoint but the last one (always written) would be saved; use a "
               "--save-interval of at most --num-rollout, or leave it out")
