"""The configuration is a tree of frozen sections (relax/config/section.py): every leaf is a
flag declared once; the parser, ``--help`` groups, config.json and the flat names of the
command line all come from the same fields."""

from __future__ import annotations

import dataclasses
import json

import pytest

from relax.config import config_to_json, parse_eval_config, parse_train_config
from relax.config.flags import build_eval_parser, build_train_parser
from relax.config.schema import EVAL_FLAGS, EvalConfig, TrainConfig
from relax.config.section import (
    Section,
    default_words,
    flat_index,
    help_text,
    leaves,
    to_flat,
    value_of,
)
from relax.config.sections import EvaluationSection, RolloutSection, SamplingSection

MANY_FLAGS = [
    "--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
    "--n-samples-per-prompt", "4", "--use-kl-loss", "--kl-loss-type", "k2",
    "--kl-loss-coef", "0.01", "--lora-rank", "4", "--lora-target-modules", "q_proj", "v_proj",
    "--eval-interval", "2", "--n-samples-per-eval-prompt", "4", "--eval-temperature", "0",
    "--rollout-temperature", "0.7", "--rollout-top-k", "5", "--eps-clip-high", "0.28",
    "--dynamic-sampling-filter-path", "nonzero_std", "--over-sampling-batch-size", "32",
    "--dry-run"]


def test_the_parsed_values_reach_the_sections(tmp_path):
    cfg = parse_train_config(MANY_FLAGS + ["--output-dir", str(tmp_path / "run")], environ={})
    assert cfg.algorithm.advantage_estimator == "reinforce_plus_plus_baseline"
    assert cfg.rollout.sampling.rollout_temperature == 0.7
    assert cfg.rollout.sampling.rollout_top_k == 5
    assert cfg.lora.lora_rank == 4 and cfg.lora.enabled
    assert cfg.lora.lora_target_modules == ("q_proj", "v_proj")
    assert cfg.evaluation.eval_interval == 2 and cfg.evaluation.eval_temperature == 0.0
    assert cfg.evaluation.eval_top_k == 5  # resolved: follows the rollout's
    assert cfg.batches.dynamic_sampling_filter_path == "nonzero_std"
    assert cfg.run.dry_run and cfg.algorithm.eps_clip_high == 0.28


def test_every_flag_is_one_leaf_and_every_leaf_one_flag():
    train = {a.dest for a in build_train_parser()._actions} - {"help", "config"}
    flat = {dest for dest, path in flat_index(TrainConfig).items()
            if get_path_field(TrainConfig, path).metadata["cli"]}
    assert train == flat
    evaluate = {a.dest for a in build_eval_parser()._actions if a.dest != "help"}
    assert evaluate == set(EVAL_FLAGS)


def get_path_field(cls, path):
    return dict(leaves(cls))[path]


def test_sections_are_frozen_all_the_way_down(tmp_path):
    cfg = parse_train_config(MANY_FLAGS + ["--output-dir", str(tmp_path / "run")], environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.sampling.rollout_temperature = 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout = None
    assert isinstance(cfg.lora.lora_target_modules, tuple)
    assert all(isinstance(p, tuple) for p in cfg.evaluation.eval_prompt_data or ())
    assert isinstance(cfg.rollout.sampling, SamplingSection)
    assert isinstance(cfg.rollout, RolloutSection) and isinstance(cfg.rollout, Section)


def test_the_json_is_by_section_and_the_flat_view_agrees(tmp_path):
    cfg = parse_train_config(MANY_FLAGS + ["--output-dir", str(tmp_path / "run")], environ={})
    saved = json.loads(config_to_json(cfg))
    assert saved["rollout"]["sampling"]["rollout_temperature"] == 0.7
    assert saved["algorithm"]["advantage_estimator"] == "reinforce_plus_plus_baseline"
    flat = to_flat(cfg)
    assert flat["rollout_temperature"] == 0.7 and flat["lora_rank"] == 4
    # the lookup by flag name gives the same values
    for dest in ("rollout_temperature", "lora_rank", "advantage_estimator", "eval_interval"):
        assert value_of(cfg, dest) == flat[dest]


def test_relax_eval_has_the_same_evaluation_section(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = parse_eval_config([str(tmp_path), "--n-samples-per-eval-prompt", "2"])
    assert type(cfg.evaluation) is EvaluationSection
    assert cfg.evaluation.eval_interval is None and cfg.evaluation.n_samples_per_eval_prompt == 2
    assert cfg.checkpoint == str(tmp_path)


def test_help_is_grouped_by_section():
    text = build_train_parser().format_help()
    for title in ("algorithm:", "rollout.sampling:", "rollout.off_policy:", "batches:",
                  "placement:", "distillation:", "critic:", "evaluation:", "checkpoint:"):
        assert f"\n{title}" in text, title
    groups = {g.title: {a.dest for a in g._group_actions}
              for g in build_train_parser()._action_groups}
    assert groups["rollout.sampling"] == {"rollout_max_response_len", "rollout_temperature",
                                          "rollout_top_p", "rollout_top_k"}


def test_help_writes_the_default_from_the_field():
    for cls in (TrainConfig, EvalConfig):
        for _, f in leaves(cls):
            md = f.metadata
            if not md["cli"] or md["positional"]:
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
