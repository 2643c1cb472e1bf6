"""``--partial-rollout --env`` (relax/rollout/partial_episodes.py): a step stops playing once
it holds its groups of finished episodes, the others continue in the next step on their own
environments; a seeded run repeats exactly, and --load continues exactly by replaying each
carried episode's recorded turns into a fresh environment, or stops in one line when the
environment answers them differently."""

from __future__ import annotations

import json

import pytest

from relax.errors import InputError
from relax.trainer.state import sharded_state
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, fit, make_config, read_metrics

# eight groups of two episodes started per step, four trained; episodes last 1 to 3 turns
FLAGS = [*RECIPES["grpo"], "--env", "tests.rollout.agents.scripted:ragged", "--max-turns", "3",
         "--partial-rollout", "--rollout-batch-size", "4", "--over-sampling-batch-size", "8",
         "--n-samples-per-prompt", "2", "--rollout-temperature", "1.5", "--use-tis",
         "--lr", "1e-2"]
KEYS = ("rollout/raw_reward", "train/loss", "train/grad_norm", "rollout/partial_carried_groups",
        "rollout/partial_offpolicy_tokens", "rollout/episode_turns", "train/tis_weight_mean")


def _same(got_rows, want_rows):
    for got, want in zip(got_rows, want_rows, strict=True):
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key


def test_episodes_cut_between_turns_continue_repeat_and_resume_exactly(tmp_path):
    trainer, full, moved = fit(make_config(*FLAGS, "--num-rollout", "4",
                                           output_dir=tmp_path / "full"))
    assert moved > 0
    assert all(r["rollout/partial_carried_groups"] > 0 for r in full)
    # carried episodes were continued: trained turns sampled a step earlier
    assert any(r["rollout/partial_offpolicy_tokens"] > 0 for r in full[1:])
    collector = trainer.collector
    assert all(g[0].aborted <= 2 for g in collector.carried)
    cut = {e.seed: e.turns for g in collector.carried for e in g if e.live}
    assert cut, "episodes cut between their turns are carried"
    labels = collector.collect(4).labels + collector.collect(5).labels
    # trained later with the turns they played before the cut and after it
    assert any(x["turns"] > cut[x["env_seed"]] for x in labels if x["env_seed"] in cut)
    _, again, _ = fit(make_config(*FLAGS, "--num-rollout", "4", output_dir=tmp_path / "again"))
    _same(again, full)  # a seeded run repeats exactly

    fit(make_config(*FLAGS, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    _, state = sharded_state.read_rank_file(str(tmp_path / "ckpt" / "rollout_000002"), 0)
    cut = [e for g in state["carried"] for e in g if e["live"] and e["log"]]
    assert cut, "the checkpoint holds episodes cut between their turns, with their turns"
    trainer, tail, _ = fit(make_config(*FLAGS, "--num-rollout", "4", "--load",
                                       str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    assert trainer.start_step == 2
    _same(tail, full[2:])


def test_an_environment_that_answers_a_replay_differently_stops_the_resume(tmp_path):
    flags = [f.replace(":ragged", ":drifting") for f in FLAGS]
    fit(make_config(*flags, "--num-rollout", "1", "--save", str(tmp_path / "ckpt"),
                    output_dir=tmp_path / "run"))
    with pytest.raises(InputError, match=r"--load: --env tests.rollout.agents.scripted:drifting: the "
                       r"episode in flight of seed \d+ does not replay: turn 1 answered .*"
                       "resume without --partial-rollout"):
        fit(make_config(*flags, "--num-rollout", "2", "--load", str(tmp_path / "ckpt"),
                        output_dir=tmp_path / "run"))


@pytest.mark.subprocess
def test_two_ranks_play_and_carry_episodes(tmp_path):
    out = tmp_path / "run"
    proc = torchrun_relax(*FLAGS, "--num-rollout", "2", "--device", "cpu", "--log-samples",
                          "16", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert len(rows) == 2 and all(r["rollout/partial_carried_groups"] > 0 for r in rows)
    with open(out / "samples.jsonl", encoding="utf-8") as f:
        seeds = [json.loads(line)["label"]["env_seed"] for line in f]
    assert len(set(seeds)) == len(seeds) // 2  # rank 0: two episodes a group, no group twice


@pytest.mark.subprocess
def test_episodes_in_flight_are_dealt_out_and_replayed_on_two_ranks(tmp_path):
    fit(make_config(*FLAGS, "--num-rollout", "1", "--save", str(tmp_path / "ckpt"),
                    output_dir=tmp_path / "one"))
    _, state = sharded_state.read_rank_file(str(tmp_path / "ckpt" / "rollout_000001"), 0)
    proc = torchrun_relax(*FLAGS, "--num-rollout", "2", "--device", "cpu", "--load",
                          str(tmp_path / "ckpt"), "--output-dir", str(tmp_path / "two"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"the {len(state['carried'])} partial rollout groups in flight are dealt" \
        in proc.stderr
    assert read_metrics(tmp_path / "two")[-1]["rollout/partial_offpolicy_tokens"] > 0
