"""--fully-async's rules (relax/config/sections/placement.py): the placement must add up to
the job's WORLD_SIZE, the staleness needs a correction, what rollout ranks cannot serve is
refused with one line naming both flags, and the rollout side's modes compose with it."""

from __future__ import annotations

import sys

import pytest

GRPO = ["train", "--advantage-estimator", "grpo", "--dry-run"]


@pytest.fixture
def world(monkeypatch):
    def set_world(n: int) -> None:
        monkeypatch.setenv("WORLD_SIZE", str(n))
    return set_world


def test_placement_resolves_the_training_world(cli, world):
    world(4)
    cfg = cli([*GRPO, "--fully-async", "--use-tis", "--rollout-num-gpus", "2",
               "--rollout-batch-size", "2", "--n-samples-per-prompt", "2"]).config()
    assert cfg["world_size"] == 2 and cfg["max_staleness"] == 1
    world(5)  # 2 nodes x 2 training ranks + 1 rollout rank
    cfg = cli([*GRPO, "--fully-async", "--use-tis", "--actor-num-nodes", "2",
               "--actor-num-gpus-per-node", "2", "--rollout-batch-size", "4",
               "--n-samples-per-prompt", "2"]).config()
    assert cfg["world_size"] == 4


@pytest.mark.parametrize("size, flags, needles", [
    (1, ["--fully-async", "--use-tis"], ("--rollout-num-gpus 1", "WORLD_SIZE=1")),
    (3, ["--fully-async", "--use-tis", "--actor-num-gpus-per-node", "1"],
     ("--actor-num-gpus-per-node 1", "WORLD_SIZE=3")),
    (2, ["--fully-async"], ("--max-staleness 1", "--use-tis")),
    (2, ["--fully-async", "--max-staleness", "-1"], ("--max-staleness -1",)),
    (2, ["--fully-async", "--max-staleness", "0", "--update-weights-interval", "0"],
     ("--update-weights-interval 0",)),
    (2, ["--fully-async", "--max-staleness", "0", "--weight-sync-bucket-mb", "0"],
     ("--weight-sync-bucket-mb 0",)),
    (1, ["--max-staleness", "2"], ("--max-staleness 2", "without --fully-async")),
    (1, ["--rollout-num-gpus", "2"], ("--rollout-num-gpus 2", "without --fully-async")),
    # a rollout rank past the training ranks' count would serve no share
    (3, ["--fully-async", "--use-tis", "--rollout-num-gpus", "2"],
     ("--rollout-num-gpus 2", "more rollout ranks than the 1 training ranks", "at most 1")),
])
def test_rejected_with_one_line(cli, rejected, world, tmp_path, size, flags, needles):
    world(size)
    flags = [str(tmp_path / "save") if f == "SAVE" else f for f in flags]
    rejected(cli([*GRPO, *flags]), *needles)


@pytest.mark.parametrize("flags", [
    ["--dynamic-sampling-filter-path", "nonzero_std", "--over-sampling-batch-size", "4"],
    ["--partial-rollout", "--over-sampling-batch-size", "4"],
    ["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "2"],
    ["--use-agentic-rollout", "--agent-command", f"{sys.executable} -c pass"],
], ids=["dynamic-sampling", "partial", "env", "agents"])
def test_the_rollout_sides_modes_run_on_rollout_ranks(cli, world, flags):
    """Two training ranks and one rollout rank: the rollout side is the colocated assembly."""
    world(3)
    cfg = cli([*GRPO, "--fully-async", "--use-tis", "--rollout-batch-size", "2",
               "--n-samples-per-prompt", "2", *flags]).config()
    assert cfg["world_size"] == 2 and cfg["fully_async"]
