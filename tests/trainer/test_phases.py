"""The loop's parts as objects: a collector's state carries a run across a resume, the policy
bundle says what a checkpoint holds, run control ends a run the four documented ways."""

from __future__ import annotations

import signal
import time

import pytest
import torch

from relax.errors import Interrupted
from relax.trainer.distributed import DistContext, init_distributed
from relax.trainer.loop import Trainer
from relax.trainer.run_control import RunControl, StepEnd
from relax.trainer.signals import StopRequest
from tests.trainer.helpers import RECIPES, make_config, write_jsonl

CPU = DistContext(0, 1, 0, torch.device("cpu"), None)


def _trainer(tmp_path, *flags, name="run"):
    cfg = make_config(*RECIPES["grpo"], *flags, output_dir=tmp_path / name)
    return Trainer(cfg, init_distributed("cpu"), console=False)


def test_a_prompt_collector_restored_from_its_state_collects_what_the_first_would(tmp_path):
    data = write_jsonl(tmp_path, [{"prompt": f"{i} + 1 =", "label": str(i + 1)}
                                  for i in range(10)])
    flags = ("--prompt-data", data, "--rm-type", "math", "--input-key", "prompt",
             "--label-key", "label")
    first = _trainer(tmp_path, *flags, name="a")
    try:
        first.collector.collect(0)
        state = first.collector.state_dict()
        assert state == {"cursor": 4}  # one step consumed --rollout-batch-size prompts
        expected = first.collector.collect(1)
    finally:
        first.close()
    second = _trainer(tmp_path, *flags, name="b")
    try:
        second.collector.load_state_dict(state)
        got = second.collector.collect(1)
    finally:
        second.close()
    assert got.prompts == expected.prompts and got.labels == expected.labels
    assert torch.equal(got.rollout.response_ids, expected.rollout.response_ids)
    assert torch.equal(got.rewards, expected.rewards)
    assert second.collector.position()["cursor"] == 8


def test_dynamic_sampling_wraps_the_prompt_collector_and_shares_its_state(tmp_path):
    trainer = _trainer(tmp_path, "--n-samples-per-prompt", "4", "--dynamic-sampling-filter-path",
                       "nonzero_std", "--over-sampling-batch-size", "8")
    try:
        assert type(trainer.collector).__name__ == "DynamicSampling"
        batch = trainer.collector.collect(0)
        rounds = trainer.tracker.reduce()["rollout/sampling_rounds"]
        # every round took --over-sampling-batch-size prompts from the inner stream
        assert trainer.collector.state_dict() == {"cursor": 8 * int(rounds)}
        assert len(batch.prompts) % 4 == 0 and len(batch.prompts) <= 16
    finally:
        trainer.close()


def test_policy_checkpoint_state_is_the_adapter_only_with_lora(tmp_path):
    pytest.importorskip("peft")
    full = _trainer(tmp_path, name="full")
    lora = _trainer(tmp_path, "--lora-rank", "4", name="lora")
    try:
        full_keys = set(full.policy.checkpoint_state()["model"])
        lora_keys = set(lora.policy.checkpoint_state()["model"])
        assert "lm_head.weight" in full_keys or "model.embed_tokens.weight" in full_keys
        assert lora_keys and all("lora_" in k for k in lora_keys)
        assert lora.policy.weights() is None  # the final save merges the adapter instead
        assert set(full.policy.weights()) >= full_keys
    finally:
        full.close()
        lora.close()


def _control(total=3, minutes=None, started=None):
    return RunControl(CPU, StopRequest(), total_steps=total, exit_duration_in_mins=minutes,
                      started=started)


def test_run_control_after_a_step():
    assert _control().after_step(1) == StepEnd(last=False)
    assert _control().after_step(3) == StepEnd(last=True)  # finished: nothing else matters
    late = _control(minutes=1.0, started=time.monotonic() - 61.0)
    assert late.after_step(1) == StepEnd(last=True, cut_short=True)
    assert late.ended_early == "stopped by --exit-duration-in-mins 1 after rollout step 1 of 3"
    assert _control(minutes=1.0).after_step(1) == StepEnd(last=False)  # budget not spent
    signalled = _control()
    signalled.stop.signum = signal.SIGTERM
    assert signalled.after_step(2) == StepEnd(last=False, signum=signal.SIGTERM)
    assert signalled.after_step(3) == StepEnd(last=True)  # after the last step: just finish
    assert signalled.signal_before_start() == signal.SIGTERM
    with pytest.raises(Interrupted, match="stopped by SIGTERM after rollout step 2 of 3; x") as e:
        signalled.interrupt(signal.SIGTERM, 2, "; x")
    assert e.value.exit_code == 128 + signal.SIGTERM


def test_budget_wins_over_a_signal_in_the_same_step():
    control = _control(minutes=1.0, started=time.monotonic() - 61.0)
    control.stop.signum = signal.SIGINT
    assert control.after_step(1) == StepEnd(last=True, cut_short=True)
