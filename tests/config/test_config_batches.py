"""Batch arithmetic: rollout samples, global batch, micro batch and WORLD_SIZE."""

from __future__ import annotations

import pytest

# Outside the built-in preset: 4 prompts x 8 samples = 32 samples per rollout step.
BASE = ["train", "--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--dry-run"]


def batches(cfg: dict) -> tuple[int, int, int]:
    return cfg["global_batch_size"], cfg["micro_batch_size"], cfg["num_steps_per_rollout"]


@pytest.mark.parametrize(("world", "extra", "expected"), [
    (None, [], (32, 32, 1)),                                   # one step per rollout
    ("2", [], (32, 16, 1)),                                    # micro = global / world
    ("4", ["--global-batch-size", "16"], (16, 4, 2)),
    ("2", ["--global-batch-size", "8", "--micro-batch-size", "2"], (8, 2, 4)),
    (None, ["--num-steps-per-rollout", "4"], (8, 8, 4)),        # alone: sets the global batch
    (None, ["--num-steps-per-rollout", "2", "--global-batch-size", "16"], (16, 16, 2)),
])
def test_resolution(cli, monkeypatch, world, extra, expected):
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", world)
    cfg = cli([*BASE, *extra]).config()
    assert batches(cfg) == expected
    assert cfg["world_size"] == int(world or 1)
    # the invariants the trainer relies on
    gbs, mbs, steps = expected
    assert gbs * steps == 32 and gbs % (cfg["world_size"] * mbs) == 0


@pytest.mark.parametrize(("world", "extra", "needles"), [
    (None, ["--global-batch-size", "12"], ("--global-batch-size 12", "32 samples")),
    (None, ["--global-batch-size", "64"], ("--global-batch-size 64",)),
    (None, ["--num-steps-per-rollout", "3"], ("--num-steps-per-rollout 3", "32 samples")),
    (None, ["--num-steps-per-rollout", "4", "--global-batch-size", "16"],
     ("--global-batch-size 16", "--num-steps-per-rollout 4")),
    (None, ["--micro-batch-size", "5"], ("--micro-batch-size 5",)),
    (None, ["--micro-batch-size", "64"], ("--micro-batch-size 64",)),
    ("3", [], ("--rollout-batch-size 4", "WORLD_SIZE=3")),      # whole prompt groups per rank
    ("4", ["--global-batch-size", "2"], ("--global-batch-size 2", "WORLD_SIZE=4")),
    ("2", ["--global-batch-size", "8", "--micro-batch-size", "3"],
     ("--micro-batch-size 3", "WORLD_SIZE=2")),
    ("2", ["--micro-batch-size", "32"], ("--micro-batch-size 32",)),  # 2 x 32 > 32
])
def test_rejections(cli, rejected, monkeypatch, world, extra, needles):
    if world is not None:
        monkeypatch.setenv("WORLD_SIZE", world)
    rejected(cli([*BASE, *extra]), *needles)


@pytest.mark.parametrize("bad", ["0", "-2", "two", ""])
def test_bad_world_size(cli, monkeypatch, bad):
    monkeypatch.setenv("WORLD_SIZE", bad)
    r = cli(BASE)
    assert r.code == 2 and r.err.count("\n") == 1 and f"WORLD_SIZE={bad}" in r.err


def test_num_rollout_and_epochs(cli, rejected, prompt_file, hf_dir):
    data = ["train", "--prompt-data", prompt_file, "--rm-type", "math", "--dry-run"]
    cfg = cli(data).config()
    assert (cfg["num_rollout"], cfg["num_epoch"]) == (None, 1)      # one pass over the data
    cfg = cli([*data, "--num-epoch", "3"]).config()
    assert (cfg["num_rollout"], cfg["num_epoch"]) == (None, 3)
    assert cli([*data, "--num-rollout", "5"]).config()["num_rollout"] == 5
    rejected(cli([*data, "--num-rollout", "5", "--num-epoch", "2"]),
                    "--num-rollout 5", "--num-epoch 2")
    # the built-in task is generated without end: it needs a step count, not epochs
    rejected(cli(["train", "--hf-checkpoint", hf_dir, "--dry-run"]), "--num-rollout")
    rejected(cli(["train", "--num-epoch", "2", "--dry-run"]), "--num-epoch 2")
