"""Partial rollouts (relax/rollout/partial.py): the step stops decoding once it holds its
groups, unfinished groups continue in the next step, a seeded run repeats exactly and --load
continues exactly with the carried responses from the checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from relax.rollout.partial import deal_carried
from relax.trainer.distributed import init_distributed
from relax.trainer.loop import Trainer
from relax.trainer.state import sharded_state
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, fit, make_config, read_metrics, write_reward

# eight groups started per step, four trained, responses of up to 12 tokens: the tiny model's
# answers end at EOS at very different lengths, so groups are carried over
PARTIAL = ["--partial-rollout", "--rollout-batch-size", "4", "--over-sampling-batch-size", "8",
           "--n-samples-per-prompt", "2", "--rollout-max-response-len", "12",
           "--rollout-temperature", "1.5", "--use-tis", "--lr", "1e-2"]
KEYS = ("rollout/raw_reward", "train/loss", "train/grad_norm", "rollout/partial_carried_groups",
        "rollout/partial_offpolicy_tokens", "train/tis_weight_mean")


def _flags(tmp_path, *extra):
    reward = write_reward(tmp_path)
    return [*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity", *PARTIAL, *extra]


def _assert_same(got_rows, want_rows):
    for got, want in zip(got_rows, want_rows, strict=True):
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key


def test_partial_rollouts_carry_groups_repeat_and_resume_exactly(tmp_path):
    flags = _flags(tmp_path)
    full = make_config(*flags, "--num-rollout", "4", output_dir=tmp_path / "full")
    trainer, uninterrupted, moved = fit(full)
    assert moved > 0
    # groups were carried and continued: some trained tokens were sampled a step earlier
    assert all(r["rollout/partial_carried_groups"] > 0 for r in uninterrupted)
    assert any(r["rollout/partial_offpolicy_tokens"] > 0 for r in uninterrupted[1:])
    assert all(g[0]["aborted"] <= 2 for g in trainer.collector.carried)
    _, again, _ = fit(make_config(*flags, "--num-rollout", "4", output_dir=tmp_path / "again"))
    _assert_same(again, uninterrupted)  # a seeded run repeats exactly

    fit(make_config(*flags, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    _, carried = sharded_state.read_rank_file(str(tmp_path / "ckpt" / "rollout_000002"), 0)
    assert carried["carried"], "the checkpoint holds the groups in flight"
    resumed = make_config(*flags, "--num-rollout", "4", "--load", str(tmp_path / "ckpt"),
                          output_dir=tmp_path / "part")
    trainer, tail, _ = fit(resumed)
    assert trainer.start_step == 2
    _assert_same(tail, uninterrupted[2:])


def test_masking_leaves_older_tokens_out_of_the_loss(tmp_path):
    flags = [f for f in _flags(tmp_path) if f != "--use-tis"]
    cfg = make_config(*flags, "--mask-offpolicy-in-partial-rollout",
                      "--partial-rollout-max-aborted-count", "1", "--num-rollout", "1",
                      output_dir=tmp_path / "run")
    trainer, _, _ = fit(cfg)
    collector = trainer.collector
    assert collector.carried and all(g[0]["aborted"] == 1 for g in collector.carried
                                     if not all(collector._complete(r) for r in g))
    batch = collector.collect(1)  # groups carried once must finish in this step
    assert not any(g[0]["aborted"] > 1 for g in collector.carried)
    r = batch.rollout
    old = r.context_mask & ~r.response_mask  # tokens of step 0 among the trained rows
    assert old.any() and r.context_mask is not None
    assert torch.equal(r.response_mask | old, r.context_mask)


FILTERED = ("rollout/groups_generated", "rollout/groups_kept", "rollout/groups_trained",
            "rollout/filtered_fraction", "rollout/sampling_rounds")


def test_filter_judges_each_group_once_repeats_and_resumes_exactly(tmp_path):
    """Groups are scored and filtered when they complete: a failing group is dropped, a
    passing one is trained (the first quota of them) or carried with its verdict."""
    flags = _flags(tmp_path, "--dynamic-sampling-filter-path", "nonzero_std",
                   "--dynamic-sampling-max-rounds", "3")
    keys = (*KEYS, *FILTERED)
    trainer, full, _ = fit(make_config(*flags, "--num-rollout", "4",
                                       output_dir=tmp_path / "full"))
    assert sum(r["rollout/groups_generated"] - r["rollout/groups_kept"] for r in full) > 0
    assert all(r["rollout/groups_trained"] <= 4 for r in full)
    assert any(r["rollout/groups_trained"] > 0 for r in full)
    collector = trainer.collector
    judged = [g for g in collector.carried if "passed" in g[0]]
    assert all(g[0]["passed"] for g in judged), "a failing group is never carried"
    batch = collector.collect(4)  # every trained group passes the filter
    per_group = batch.rewards.view(-1, 2)
    assert bool((per_group[:, 0] != per_group[:, 1]).all())
    _, again, _ = fit(make_config(*flags, "--num-rollout", "4", output_dir=tmp_path / "again"))
    for got, want in zip(again, full, strict=True):
        assert {k: got[k] for k in keys} == pytest.approx({k: want[k] for k in keys}, nan_ok=True)

    fit(make_config(*flags, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    trainer, tail, _ = fit(make_config(*flags, "--num-rollout", "4", "--load",
                                       str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    assert trainer.start_step == 2
    for got, want in zip(tail, full[2:], strict=True):
        assert {k: got[k] for k in keys} == pytest.approx({k: want[k] for k in keys},
                                                          rel=1e-6, abs=1e-9, nan_ok=True)


@pytest.mark.subprocess
def test_two_ranks_share_the_stream_and_carry_groups(tmp_path):
    out = tmp_path / "run"
    proc = torchrun_relax(*_flags(tmp_path), "--num-rollout", "3", "--device", "cpu",
                          "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    # both ranks carried groups (the sum over ranks is above one rank's bound of 4)
    assert len(rows) == 3 and all(r["rollout/partial_carried_groups"] > 0 for r in rows)
    assert all(math.isfinite(r["train/loss"]) for r in rows)


def test_a_filter_that_passes_nothing_drops_every_group_and_skips_the_update(tmp_path,
                                                                             capsys):
    none = write_reward(tmp_path, "def none(r, s, y):\n    return False\n", "none.py")
    flags = _flags(tmp_path, "--dynamic-sampling-filter-path", f"{none}:none",
                   "--dynamic-sampling-max-rounds", "2")
    trainer, rows, moved = fit(make_config(*flags, "--num-rollout", "2",
                                           output_dir=tmp_path / "run"))
    assert moved == 0.0  # nothing passed: no update
    assert all(r["rollout/groups_trained"] == 0 and r["rollout/groups_kept"] == 0
               and r["rollout/groups_generated"] > 0 for r in rows)
    # a failing group is dropped when it completes: only unfinished groups are carried
    assert all(not trainer.collector._group_complete(g) for g in trainer.collector.carried)
    assert "hold 0 of 4 passing groups per rank after" in capsys.readouterr().err


@pytest.mark.subprocess
def test_two_ranks_agree_on_the_filtered_groups_they_train(tmp_path):
    out = tmp_path / "run"
    proc = torchrun_relax(*_flags(tmp_path), "--dynamic-sampling-filter-path", "nonzero_std",
                          "--dynamic-sampling-max-rounds", "2", "--num-rollout", "2",
                          "--device", "cpu", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    # summed over the ranks: both trained as many groups, at most their share each
    assert all(r["rollout/groups_trained"] % 2 == 0 and r["rollout/groups_trained"] <= 4
               for r in rows)
    assert all(math.isfinite(r["train/loss"]) for r in rows)


@pytest.mark.subprocess
@pytest.mark.timeout(600)  # three torchrun runs
def test_fsdp_ranks_repeat_and_resume_exactly(tmp_path):
    """--fsdp with a filter and token-budget micro-batches of carried rows: every decode runs
    the same forward calls on both ranks (the sharded parameters are gathered in each; ranks
    asking for different lengths: tests/rollout/generation/test_generate.py). A seeded 2-rank run
    repeats exactly and --load continues exactly."""
    # about three groups in four fail: dropped groups, and steps short of passing ones
    few = write_reward(tmp_path, "def few(r, s, y):\n    return sum(map(len, s)) % 4 == 0\n",
                       "few.py")
    flags = [*_flags(tmp_path, "--dynamic-sampling-filter-path", f"{few}:few",
                     "--dynamic-sampling-max-rounds", "3"), "--fsdp", "--use-dynamic-batch-size",
             "--max-tokens-per-gpu", "48", "--device", "cpu"]
    keys = (*KEYS, *FILTERED)

    def run(name, *extra):
        proc = torchrun_relax(*flags, *extra, "--output-dir", str(tmp_path / name),
                              timeout=300, hang="the FSDP ranks did not finish")
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [{k: r[k] for k in keys} for r in read_metrics(tmp_path / name)]

    whole = run("whole", "--num-rollout", "3")
    assert any(r["rollout/partial_carried_groups"] > 0 for r in whole)
    save = tmp_path / "ckpt"
    part = run("part", "--num-rollout", "2", "--save", str(save))
    assert _carried(save / "rollout_000002", 2), "the checkpoint holds the groups in flight"
    tail = run("tail", "--num-rollout", "3", "--load", str(save))
    for got, want in zip(part + tail, whole, strict=True):  # repeats, then continues, exactly
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9, nan_ok=True)


def _carried(checkpoint, world):
    return [g for r in range(world)
            for g in sharded_state.read_rank_file(str(checkpoint), r)[1]["carried"]]


@pytest.mark.subprocess
def test_another_world_size_deals_out_the_carried_groups(tmp_path):
    """2 Gloo ranks save, 1 resumes with every carried group (rank 0's first); that rank
    saves, and 2 ranks resume and continue the groups it carried."""
    flags = _flags(tmp_path)
    two = tmp_path / "two"
    proc = torchrun_relax(*flags, "--num-rollout", "1", "--device", "cpu", "--save", str(two),
                          "--output-dir", str(tmp_path / "run2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = _carried(two / "rollout_000001", 2)
    assert saved, "both ranks carried groups"
    cfg = make_config(*flags, "--num-rollout", "2", "--load", str(two), "--save",
                      str(tmp_path / "one"), output_dir=tmp_path / "run1")
    trainer = Trainer(cfg, init_distributed("cpu"), console=False)
    try:
        assert trainer.collector.carried == saved  # all of them, in global order
        trainer.fit()
    finally:
        trainer.close()
    kept = _carried(tmp_path / "one" / "rollout_000002", 1)
    assert kept
    proc = torchrun_relax(*flags, "--num-rollout", "3", "--device", "cpu", "--load",
                          str(tmp_path / "one"), "--save", str(tmp_path / "again"),
                          "--output-dir", str(tmp_path / "run3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"the {len(kept)} partial rollout groups in flight are dealt out" in proc.stderr
    rows = read_metrics(tmp_path / "run3")
    # the resumed step trained tokens sampled before the checkpoint: the dealt groups
    assert rows[-1]["rollout/partial_offpolicy_tokens"] > 0


def test_deal_carried_is_round_robin_in_global_order():
    states = [{"cursor": 16, "carried": [["a"], ["b"], ["c"]]}, {"cursor": 16, "carried": [["d"]]}]
    assert deal_carried(states, 0, 3) == {"cursor": 16, "carried": [["a"], ["d"]]}
    assert deal_carried(states, 2, 3) == {"cursor": 16, "carried": [["c"]]}
    assert deal_carried(states, 0, 1)["carried"] == [["a"], ["b"], ["c"], ["d"]]
    assert deal_carried([{"cursor": 16}], 0, 2) is None  # not partial rollouts: dropped
