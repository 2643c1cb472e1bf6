"""relax/rollout/assembly.py: one assembly of the rollout side for the colocated trainer and
the rollout ranks of ``--fully-async``, and the Collector protocol every collector satisfies
(the loop and the rollout ranks call nothing else)."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from relax.agreement import GroupAgreement
from relax.rollout.assembly import build_collector, build_scorer, load_inputs
from relax.rollout.collectors import Collector, DynamicSampling, PromptCollector
from relax.rollout.episode_collector import EpisodeCollector
from relax.rollout.partial import PartialRollouts
from relax.trainer.distributed import DistContext
from relax.trainer.fully_async.remote_rollout import RemoteRollout
from tests.trainer.helpers import RECIPES, make_config

METHODS = ("collect", "position", "state_dict", "load_state_dict", "close")


def test_the_protocol_is_complete():
    declared = {n for n, v in vars(Collector).items() if callable(v) and not n.startswith("_")}
    assert declared == set(METHODS)


@pytest.mark.parametrize("cls", [PromptCollector, DynamicSampling, PartialRollouts,
                                 EpisodeCollector, RemoteRollout])
def test_every_collector_has_the_protocols_methods_with_its_parameters(cls):
    for name in METHODS:
        want = list(inspect.signature(getattr(Collector, name)).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == want, (cls, name)


@pytest.mark.parametrize("flags, built", [
    ([], PromptCollector),
    (["--dynamic-sampling-filter-path", "nonzero_std", "--over-sampling-batch-size", "8"],
     DynamicSampling),
    (["--partial-rollout", "--over-sampling-batch-size", "8", "--use-tis"], PartialRollouts),
    (["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "2"], EpisodeCollector),
    (["--use-agentic-rollout", "--agent-command", f"{sys.executable} -c pass"],
     EpisodeCollector),
])
def test_the_assembly_builds_the_configured_collector_on_any_share(tmp_path, flags, built):
    """Share 1 of 2 in this process (as on a rollout rank): what the configuration asks for,
    a Collector, agreeing through the agreement it is given."""
    cfg = make_config(*RECIPES["grpo"], *flags, output_dir=tmp_path / "run")
    share = DistContext(1, 2, 0, torch.device("cpu"), None)
    agree = GroupAgreement(None, share.device)
    inputs = load_inputs(cfg.rollout, cfg.batches, seed=cfg.run.seed,
                         privileged_key=cfg.distillation.opsd_privileged_info_key)
    scorer = build_scorer(cfg.rollout, share, agree, samples=inputs.samples,
                          post_process_path=cfg.algorithm.custom_reward_post_process_path)
    collector = build_collector(cfg.rollout, cfg.batches, share, agree, sampler=None,
                                seed=cfg.run.seed, inputs=inputs, scorer=scorer,
                                tokenizer=None, envs=None, context=None, eos_token_id=0,
                                timer=None, tracker=None)
    try:
        assert type(collector) is built and isinstance(collector, Collector)
        assert collector.agree is agree and scorer.agree is agree
        assert collector.position()["cursor"] == 0
    finally:
        collector.close()
