"""DAPO-style dynamic sampling (``--dynamic-sampling-filter-path``): rounds until enough groups
pass, training on the kept groups only, the normalization over the kept batch (checked against
the float64 reference), the round bound, bad filters, and two Gloo ranks agreeing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relax.errors import RewardError
from relax.rollout.filters import check_reward_nonzero_std, kept_groups
from relax.rollout.generation.generate import Rollout, concat_rollouts
from relax.rollout.prompts.data import PromptSource
from relax.rollout.prompts.tasks import get_task
from relax.trainer.distributed import init_distributed, unwrap
from relax.trainer.loop import Trainer
from tests.algorithms import reference as ref
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, make_config, read_metrics, write_reward

# one sample in two is rewarded at random: many groups mixed, some all-equal
COIN = "import random\ndef coin(p, r, l):\n    return [float(random.random() < 0.5) for _ in p]\n"


def test_builtin_filter_and_wrong_return_type():
    assert check_reward_nonzero_std([0.0, 1.0], ["a", "b"], None)
    assert not check_reward_nonzero_std([0.5, 0.5], ["a", "b"], None)
    keep = kept_groups(check_reward_nonzero_std, [1, 1, 0, 1, 0, 0], list("abcdef"), [0] * 6, 2)
    assert keep == [1]
    with pytest.raises(RewardError, match="--dynamic-sampling-filter-path: the filter must "
                       "return True or False for a group, got int"):
        kept_groups(lambda r, s, y: 1, [1.0, 0.0], ["a", "b"], [0, 0], 2)


def test_prompt_stream_take_matches_step_batches():
    source = PromptSource(batch_size=4, seed=3, task=get_task("copy"))
    assert source.take(8, 4) == source.batch(2)
    assert source.take(6, 4) == source.batch(1)[2:] + source.batch(2)[:2]
    assert source.position_at(10) == {"epoch": 0, "index": 10}


def test_concat_and_select_keep_every_row():
    a = Rollout(torch.tensor([[0, 5]]), torch.tensor([[False, True]]), torch.tensor([[7, 8, 9]]),
                torch.tensor([[True, True, False]]), torch.tensor([False]))
    b = Rollout(torch.tensor([[4, 5, 6]]), torch.ones(1, 3, dtype=torch.bool),
                torch.tensor([[3]]), torch.tensor([[True]]), torch.tensor([True]))
    both = concat_rollouts([a, b], pad_token_id=0)
    assert both.prompt_ids.tolist() == [[0, 0, 5], [4, 5, 6]]
    assert both.prompt_mask.tolist() == [[False, False, True], [True, True, True]]
    assert both.response_ids.tolist() == [[7, 8, 9], [3, 0, 0]]
    assert both.response_mask.tolist() == [[True, True, False], [True, False, False]]
    assert both.select([1]).truncated.tolist() == [True]


def _run(tmp_path, *flags, record=None, name="run"):
    reward = write_reward(tmp_path, COIN, "coin.py")
    cfg = make_config(*RECIPES["reinforce_plus_plus_baseline"], "--custom-rm-path",
                      f"{reward}:coin", *flags, output_dir=tmp_path / name)
    trainer = Trainer(cfg, init_distributed(cfg.system.device), console=False)
    if record is not None:
        advantages = trainer.advantages

        def spy(exp, rewards, group_index):
            out = advantages(exp, rewards, group_index)
            record.append((rewards.clone(), group_index.clone(), exp.response_mask.clone(),
                           out.advantages.clone()))
            return out

        trainer.advantages = spy
    initial = [p.detach().clone() for p in unwrap(trainer.policy.model).parameters()]
    try:
        trainer.fit()
    finally:
        trainer.close()
    moved = max((p.detach() - q).abs().max().item()
                for p, q in zip(unwrap(trainer.policy.model).parameters(), initial, strict=True))
    return read_metrics(tmp_path / name), moved


def test_trains_on_kept_groups_normalized_over_the_kept_batch(tmp_path):
    record = []
    rows, moved = _run(tmp_path, "--dynamic-sampling-filter-path", "nonzero_std",
                       "--over-sampling-batch-size", "4", record=record)
    assert moved > 1e-5 and len(record) == 2
    for row, (rewards, group_index, mask, advantages) in zip(rows, record, strict=True):
        assert row["rollout/groups_trained"] == 4 and row["rollout/groups_kept"] >= 4
        assert row["rollout/groups_generated"] == 4 * row["rollout/sampling_rounds"]
        assert row["rollout/filtered_fraction"] == pytest.approx(
            1 - row["rollout/groups_kept"] / row["rollout/groups_generated"])
        # every trained group passed the filter: its rewards are not all equal
        r = rewards.view(-1, 4)
        assert bool((r.max(dim=1).values != r.min(dim=1).values).all())
        # REINFORCE++-baseline's global normalization runs over the kept batch (float64 reference)
        expect, _, _ = ref.advantages_and_returns(
            "reinforce_plus_plus_baseline", rewards, mask, group_index=group_index,
            normalize_advantages=True)
        np.testing.assert_allclose(advantages.double().numpy(), expect, rtol=2e-5, atol=2e-5)


def test_round_bound_trains_on_fewer_groups_or_skips(tmp_path, capsys):
    none = write_reward(tmp_path, "def none(r, s, y):\n    return False\n", "none.py")
    rows, moved = _run(tmp_path, "--dynamic-sampling-filter-path", f"{none}:none",
                       "--dynamic-sampling-max-rounds", "2")
    assert moved == 0.0  # nothing passed: no update
    assert all(r["rollout/groups_trained"] == 0 and r["rollout/sampling_rounds"] == 2 for r in rows)
    assert "kept 0 of 4 groups per rank after 2 rounds" in capsys.readouterr().err
    # keeps the first group of each round of 4 whose coin flips differ (a group of equal
    # rewards has zero advantage and would move nothing: the coin is not seeded)
    first = write_reward(tmp_path, "state = {'n': 0, 'kept': False}\n"
                         "def first(r, s, y):\n"
                         "    if state['n'] % 4 == 0:\n"
                         "        state['kept'] = False\n"
                         "    state['n'] += 1\n"
                         "    keep = not state['kept'] and len(set(r)) > 1\n"
                         "    state['kept'] = state['kept'] or keep\n"
                         "    return keep\n", "first.py")
    rows, moved = _run(tmp_path, "--dynamic-sampling-filter-path", f"{first}:first",
                       "--dynamic-sampling-max-rounds", "1", "--micro-batch-size", "8",
                       name="short")
    assert moved > 0 and all(r["rollout/groups_trained"] == 1 for r in rows)


@pytest.mark.subprocess
def test_two_ranks_agree_on_rounds_and_kept_groups(tmp_path):
    reward = write_reward(tmp_path, COIN, "coin.py")
    out = tmp_path / "run"
    proc = torchrun_relax(*RECIPES["reinforce_plus_plus_baseline"], "--num-rollout", "2",
                          "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                          "--rollout-max-response-len", "4", "--custom-rm-path", f"{reward}:coin",
                          "--dynamic-sampling-filter-path", "nonzero_std",
                          "--over-sampling-batch-size", "4", "--device", "cpu", "--output-dir",
                          str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in read_metrics(out):
        assert r["rollout/groups_trained"] == 4  # 2 per rank, summed
        assert abs(r["rollout/advantage_normalized_mean"]) < 1e-5
