"""The sections of a config (relax/config/sections.py) are views of its flat flags, and
``--help`` writes each flag's default from the field (relax/config/schema.py)."""

from __future__ import annotations

import dataclasses

import pytest

from relax.config import parse_eval_config, parse_train_config
from relax.config.fields import GROUPS, default_words, help_text
from relax.config.schema import EvalConfig, TrainConfig
from relax.config.sections import (
    AlgorithmSection,
    BatchSection,
    CheckpointSection,
    EvaluationSection,
    LoraSection,
    RolloutSection,
)

TRAIN_SECTIONS = {"algorithm": AlgorithmSection, "batches": BatchSection,
                  "rollout": RolloutSection, "lora": LoraSection,
                  "evaluation": EvaluationSection, "checkpoint": CheckpointSection}

TRAIN_ARGVS = [
    [],
    ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
     "--n-samples-per-prompt", "4", "--use-kl-loss", "--kl-loss-type", "k2",
     "--kl-loss-coef", "0.01", "--lora-rank", "4", "--lora-target-modules", "q_proj", "v_proj",
     "--eval-interval", "2", "--n-samples-per-eval-prompt", "4", "--eval-temperature", "0",
     "--rollout-temperature", "0.7", "--rollout-top-k", "5", "--eps-clip-high", "0.28",
     "--dynamic-sampling-filter-path", "nonzero_std", "--over-sampling-batch-size", "32",
     "--dry-run"],
]


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _assert_mirrors(section, cfg):
    for name, flag in type(section).flags().items():
        expected = _frozen(getattr(cfg, flag, None))
        assert getattr(section, name) == expected, (type(section).__name__, name, flag)


@pytest.mark.parametrize("argv", TRAIN_ARGVS, ids=["preset", "many-flags"])
def test_every_section_field_equals_its_flag(argv, tmp_path):
    cfg = parse_train_config(argv + ["--output-dir", str(tmp_path / "run")], environ={})
    for prop, cls in TRAIN_SECTIONS.items():
        section = getattr(cfg, prop)
        assert type(section) is cls
        _assert_mirrors(section, cfg)


def test_the_parsed_values_reach_the_sections(tmp_path):
    cfg = parse_train_config(TRAIN_ARGVS[1] + ["--output-dir", str(tmp_path / "run")],
                             environ={})
    assert cfg.algorithm.estimator == "reinforce_plus_plus_baseline"
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.top_k == 5
    assert cfg.lora.rank == 4 and cfg.lora.enabled
    assert cfg.lora.target_modules == ("q_proj", "v_proj")
    assert cfg.evaluation.interval == 2 and cfg.evaluation.temperature == 0.0
    assert cfg.evaluation.top_k == 5  # resolved: follows the rollout's
    assert cfg.batches.filter_path == "nonzero_std"


def test_relax_eval_has_the_same_evaluation_section(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = parse_eval_config([str(tmp_path), "--n-samples-per-eval-prompt", "2"])
    assert type(cfg.evaluation) is EvaluationSection
    _assert_mirrors(cfg.evaluation, cfg)
    assert cfg.evaluation.interval is None and cfg.evaluation.n_samples == 2


def test_sections_are_frozen_views_not_fields(tmp_path):
    cfg = parse_train_config(["--output-dir", str(tmp_path / "run")], environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.temperature = 0.5
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not names & set(TRAIN_SECTIONS), "a section name shadows a flag"
    assert not set(cfg.to_dict()) & set(TRAIN_SECTIONS)


def test_every_section_reads_existing_flags():
    train = {f.name for f in dataclasses.fields(TrainConfig)}
    for cls in TRAIN_SECTIONS.values():
        assert set(cls.flags().values()) <= train, cls.__name__
    evaluate = {f.name for f in dataclasses.fields(EvalConfig)}
    assert set(EvaluationSection.flags().values()) - evaluate == {"eval_interval"}


@pytest.mark.parametrize("group,cls", [("algorithm", AlgorithmSection),
                                       ("batches", BatchSection), ("lora", LoraSection)])
def test_a_help_group_and_its_section_hold_the_same_flags(group, cls):
    assert group in GROUPS
    flags = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("group") == group}
    assert flags == set(cls.flags().values())


def test_help_writes_the_default_from_the_field():
    for cls in (TrainConfig, EvalConfig):
        for f in dataclasses.fields(cls):
            md = f.metadata
            if not md.get("flag", True) or md["positional"]:
                continue
            assert not md["help"].startswith("Default"), (
                f"{f.name}: the help repeats its default; use default_note= / default_text=")
            text = help_text(f)
            if md["default_text"] is None:
                assert text.startswith(f"Default {default_words(f.default)}"), (f.name, text)
            else:
                assert text.startswith(f"Default: {md['default_text']}."), (f.name, text)


def test_default_words():
    assert [default_words(v) for v in (True, False, None, 1e-6, 0.2, 16.0, 8, "grpo")] == [
        "on", "off", "none", "1e-6", "0.2", "16", "8", "grpo"]
