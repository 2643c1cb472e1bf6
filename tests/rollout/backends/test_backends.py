"""relax/rollout/backends/: every rollout backend has the protocol's methods with its
parameters; Relax's engine samples the module it was started on, in place, and is never due
a push; ``--rollout-backend`` is read in one place (open.py). relax/rollout/reward/sources.py:
one builder picks the reward source for training and evaluation."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

from relax.config.sections import RewardsSection
from relax.metrics.tracker import MetricTracker
from relax.rollout.backends.local import LocalBackend
from relax.rollout.backends.open import open_backend, open_eval_backend
from relax.rollout.backends.protocol import RolloutBackend
from relax.rollout.backends.vllm.vllm_backend import VllmBackend
from relax.rollout.generation.sampler import Sampler, SamplingParams
from relax.rollout.reward.rewards import math_reward
from relax.rollout.reward.sources import (
    FunctionReward,
    JudgeReward,
    ServerReward,
    reward_source,
)
from relax.tiny_model import build_tiny_model, build_tokenizer
from tests.trainer.helpers import RECIPES, make_config

METHODS = ("start", "sampler", "due", "behind", "push", "served", "record", "close")


def test_the_protocol_is_complete():
    declared = {n for n, v in vars(RolloutBackend).items()
                if callable(v) and not n.startswith("_")}
    assert declared == set(METHODS)


@pytest.mark.parametrize("cls", [LocalBackend, VllmBackend])
def test_every_backend_has_the_protocols_methods_with_its_parameters(cls):
    for name in METHODS:
        want = list(inspect.signature(getattr(RolloutBackend, name)).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == want, (cls, name)
    assert isinstance(cls.remote, bool)


def test_the_local_engine_samples_its_module_in_place_and_is_never_pushed():
    tokenizer = build_tokenizer()
    module = build_tiny_model(tokenizer, seed=0)
    backend = LocalBackend(torch.device("cpu"))
    backend.start(module, bf16=False)
    sampler = backend.sampler(SamplingParams(temperature=1.0), eos_token_ids=[1],
                              pad_token_id=tokenizer.pad_token_id)
    assert isinstance(sampler, Sampler) and sampler.model is module
    assert sampler.sync_group is None and sampler.after is None
    assert not backend.remote and not backend.due(4) and not backend.behind(4)
    assert backend.push(module, 4) == 0
    assert backend.served() is None  # its version is the weights it holds: nothing to report
    tracker = MetricTracker()
    backend.record(tracker)  # the engine's metrics are the step's own
    assert tracker.reduce() == {}
    backend.close()


def test_a_sharded_module_releases_what_each_decode_gathered():
    released = []
    backend = LocalBackend(torch.device("cpu"), sync_group="group", release=released.append)
    backend.start("module", bf16=True)
    sampler = backend.sampler(SamplingParams(), eos_token_ids=[1], pad_token_id=0)
    sampler.after()
    assert released == ["module"] and sampler.sync_group == "group" and sampler.bf16


def test_the_default_backend_is_relaxs_engine_for_train_and_eval(tmp_path):
    cfg = make_config(*RECIPES["grpo"], output_dir=tmp_path / "run")
    assert type(open_backend(cfg.rollout, 0, torch.device("cpu"), placement=cfg.placement,
                             model=cfg.model, run=cfg.run)) is LocalBackend


def test_eval_opens_relaxs_engine_without_a_scratch_folder(tmp_path, monkeypatch):
    from relax.config import parse_eval_config

    made = []
    monkeypatch.setattr("tempfile.mkdtemp", lambda **kw: made.append(kw) or str(tmp_path))
    (tmp_path / "config.json").write_text("{}")  # a model directory, as far as parsing goes
    cfg = parse_eval_config([str(tmp_path), "--device", "cpu"])
    assert type(open_eval_backend(cfg.rollout, torch.device("cpu"), checkpoint=cfg.checkpoint,
                                  run=cfg.run)) is LocalBackend and made == []


def _rewards(**fields):
    return replace(RewardsSection(), **fields)


def test_the_reward_source_is_the_judge_the_server_or_a_function():
    judge = object()
    source = reward_source(_rewards(rm_type="genrm", genrm_model_path="m"), builtin_task=None,
                           gym_answer=None, judge=judge)
    assert isinstance(source, JudgeReward) and source.batch_fn is judge
    assert source.name == "--genrm-model-path m"
    server = reward_source(_rewards(rm_type="remote_rm", rm_url="http://127.0.0.1:9"),
                           builtin_task=None, gym_answer=None)
    assert isinstance(server, ServerReward) and not server.bounded
    assert server.batch_fn is server.remote
    plain = reward_source(_rewards(rm_type="math"), builtin_task=None, gym_answer=None)
    assert isinstance(plain, FunctionReward) and plain.bounded
    assert (plain.fn, plain.name, plain.batch_fn) == (math_reward, "math", math_reward)


def test_a_group_reward_is_called_per_prompts_samples_in_evaluation():
    source = reward_source(_rewards(rm_type="math", group_rm=True), builtin_task=None,
                           gym_answer=None)
    calls = []
    grouped = FunctionReward(lambda p, r, y: calls.append(list(p)) or [1.0] * len(p), "g",
                             group=True).batch_fn
    assert grouped(["a", "a", "b"], ["x", "y", "z"], [0, 0, 0]) == [1.0, 1.0, 1.0]
    assert calls == [["a", "a"], ["b"]]
    assert source.group and source.batch_fn is not math_reward
