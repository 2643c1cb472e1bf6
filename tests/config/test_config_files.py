"""``relax train --config FILE``: the sections as keys (YAML, TOML or JSON), flags over the
file, one line for a bad key, and a run's config.json loads back to the same configuration."""

from __future__ import annotations

import dataclasses
import json

import pytest

from relax.config import ConfigError, config_to_json, parse_train_config
from relax.config.files import RENAMED
from relax.config.schema import TrainConfig
from relax.config.section import flat_index

RUNS = {
    "preset": [],
    "many": ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
             "--n-samples-per-prompt", "4", "--use-kl-loss", "--kl-loss-type", "k2",
             "--kl-loss-coef", "0.01", "--lora-rank", "4", "--lora-target-modules", "q_proj",
             "v_proj", "--eval-interval", "2", "--n-samples-per-eval-prompt", "4",
             "--eval-temperature", "0", "--rollout-temperature", "0.7", "--rollout-top-k", "5",
             "--eps-clip-high", "0.28", "--dynamic-sampling-filter-path", "nonzero_std",
             "--over-sampling-batch-size", "32", "--seed", "7"],
    "sapo-steps": ["--advantage-estimator", "sapo", "--num-steps-per-rollout", "2",
                   "--micro-batch-size", "4", "--get-mismatch-metrics"],
}


def _parse(argv, tmp_path, name="run"):
    return parse_train_config(argv + ["--output-dir", str(tmp_path / name)], environ={})


@pytest.mark.parametrize("argv", RUNS.values(), ids=RUNS.keys())
def test_the_saved_config_loads_back_to_the_same_configuration(argv, tmp_path):
    cfg = _parse(argv, tmp_path)
    saved = tmp_path / "config.json"
    saved.write_text(config_to_json(cfg))
    again = parse_train_config(["--config", str(saved)], environ={})
    assert again == cfg
    assert config_to_json(again) == config_to_json(cfg)


def _former_names(values: dict, path: tuple[str, ...] = ()) -> dict:
    """``values`` (by section) with every renamed field under its former name, as files
    written before the fields were named like their flags have it (RENAMED, inverted)."""
    former = {(*old.split(".")[:-1], new): old.split(".")[-1] for old, new in RENAMED.items()}
    return {former.get((*path, key), key): (_former_names(value, (*path, key))
                                            if isinstance(value, dict) else value)
            for key, value in values.items()}


@pytest.mark.parametrize("argv", RUNS.values(), ids=RUNS.keys())
def test_a_config_json_with_the_former_field_names_loads_to_the_same_configuration(argv,
                                                                                    tmp_path):
    cfg = _parse(argv, tmp_path)
    saved = json.loads(config_to_json(cfg))
    old = _former_names(saved)
    assert old != saved and "estimator" in old["algorithm"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    again = parse_train_config(["--config", str(path)], environ={})
    assert again == cfg
    assert json.loads(config_to_json(again)) == saved  # written under the names of now


@pytest.mark.parametrize("name,text,keys", [
    ("run.yaml", "algorithm: {estimator: sapo, advantage_estimator: grpo}\n",
     ("'estimator'", "'advantage_estimator'")),
    ("config.json", '{"lora": {"lora_rank": 2, "rank": 2}}', ("'rank'", "'lora_rank'")),
])
def test_a_field_given_under_its_former_and_its_name_is_refused(tmp_path, name, text, keys):
    line = _refusal(tmp_path, name, text)
    assert all(key in line for key in keys) and "former name" in line, line


def test_yaml_and_toml_give_the_flags_values(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("algorithm:\n  advantage_estimator: sapo\nrollout:\n  sampling:\n"
                         "    rollout_temperature: 0.7\nbatches: {rollout_batch_size: 16}\n")
    toml_file = tmp_path / "run.toml"
    toml_file.write_text('[algorithm]\nadvantage_estimator = "sapo"\n[rollout.sampling]\n'
                         'rollout_temperature = 0.7\n[batches]\nrollout_batch_size = 16\n')
    flags = _parse(["--advantage-estimator", "sapo", "--rollout-temperature", "0.7",
                    "--rollout-batch-size", "16"], tmp_path)
    for path in (yaml_file, toml_file):
        cfg = _parse(["--config", str(path)], tmp_path)
        assert cfg == flags
        assert cfg.rollout.sampling.rollout_temperature == 0.7
        assert cfg.batches.rollout_batch_size == 16


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[rollout.sampling]\nrollout_temperature = 0.7\n[run]\nseed = 3\n')
    cfg = _parse(["--config", str(path), "--rollout-temperature", "0.9"], tmp_path)
    assert cfg.rollout.sampling.rollout_temperature == 0.9 and cfg.run.seed == 3


def test_flat_names_of_old_config_files_are_read(tmp_path):
    cfg = _parse(["--rollout-temperature", "0.7", "--lora-rank", "2"], tmp_path)
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"rollout_temperature": 0.7, "lora_rank": 2}))
    assert _parse(["--config", str(path)], tmp_path) == cfg


@pytest.mark.parametrize("text,needle", [
    ("algorithm:\n  estimater: sapo\n", "unknown key 'estimater'"),
    ("algorythm:\n  estimator: sapo\n", "unknown key 'algorythm'"),
    ("rollout:\n  sampling: 0.7\n", "key 'sampling'"),
    ("- a\n", "expected a mapping"),
    ("algorithm: {estimator: [\n", "not valid YAML"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, needle):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        _parse(["--config", str(path)], tmp_path)
    line = str(e.value)
    assert "\n" not in line and str(path) in line and needle in line, line


def test_a_bad_value_in_a_file_names_the_flag(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout.sampling]\nrollout_temperature = -1.0\n")
    with pytest.raises(ConfigError, match="--rollout-temperature -1"):
        _parse(["--config", str(path)], tmp_path)


@pytest.mark.parametrize("text,needle", [
    ('[rollout.sampling]\nrollout_temperature = "hot"\n', "--rollout-temperature"),
    ("[algorithm]\nadvantage_estimator = \"grpx\"\n", "--advantage-estimator"),
    ("[run]\nuse_wandb = 3\n", "--use-wandb 3: a switch"),
])
def test_a_value_of_the_wrong_type_is_the_flags_error(tmp_path, text, needle):
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        _parse(["--config", str(path)], tmp_path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _refusal(tmp_path, name: str, text: str) -> str:
    """The one-line ConfigError of ``--config`` with a file ``name`` holding ``text``, checked
    to name the file."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        _parse(["--config", str(path)], tmp_path)
    line = str(e.value)
    assert "\n" not in line and str(path) in line, line
    return line


@pytest.mark.parametrize("name,text,needle", [
    ("run.json", '{"algorithm": {"advantage_estimator": "sapo", "advantage_estimator": '
     '"grpo"}}', "'advantage_estimator'"),
    ("run.json", '{"run": {"seed": 1}, "run": {"seed": 2}}', "'run'"),
    ("run.yaml", "algorithm:\n  advantage_estimator: sapo\n  advantage_estimator: grpo\n",
     "'advantage_estimator'"),
    ("run.yaml", "run: {seed: 1}\nrun: {seed: 2}\n", "'run'"),
])
def test_a_key_given_twice_is_refused(tmp_path, name, text, needle):
    # JSON and YAML parsers keep the last of two equal keys silently
    line = _refusal(tmp_path, name, text)
    assert needle in line and "twice" in line, line


@pytest.mark.parametrize("text,needle", [
    ("rollout_temperature: 0.7\nrollout:\n  sampling: {temperature: 0.9}\n",
     "--rollout-temperature"),
    ("rollout_temperature: 0.7\nrollout:\n  sampling: {temperature: 0.7}\n",
     "--rollout-temperature"),
    ("advantage_estimator: sapo\nalgorithm: {estimator: grpo}\n", "--advantage-estimator"),
    ("seed: 3\nrun: {seed: 3}\n", "--seed"),
])
def test_a_flag_set_flat_and_in_its_section_is_refused(tmp_path, text, needle):
    line = _refusal(tmp_path, "run.yaml", text)
    assert needle in line and "second time" in line and "keep one" in line, line


@pytest.mark.parametrize("text,key", [("colocate: true\n", "colocate"),
                                      ("placement: {hybrid: false}\n", "hybrid")])
def test_a_removed_flag_in_a_file_is_refused_naming_the_key(tmp_path, text, key):
    line = _refusal(tmp_path, "run.yaml", text)
    assert f"key {key!r}: --{key} is removed" in line, line


def test_a_file_value_equal_to_the_default_is_not_replaced_by_the_preset(tmp_path):
    # --lr 1e-6 is the flag's default; the built-in preset's is 0.003
    path = tmp_path / "run.yaml"
    path.write_text("optimizer: {lr: 1.0e-6}\nbatches: {rollout_batch_size: 8}\n")
    cfg = _parse(["--config", str(path)], tmp_path)
    assert cfg.builtin_preset_applied
    assert cfg.optimizer.lr == 1e-6 and cfg.batches.rollout_batch_size == 8
    assert cfg.batches.n_samples_per_prompt == 8  # the preset's, for what the file leaves out


def test_several_files_merge_in_order_and_flags_win(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.toml"
    first.write_text("algorithm: {advantage_estimator: sapo}\nrun: {seed: 3}\n"
                     "rollout: {sampling: {rollout_temperature: 0.7}}\n")
    second.write_text("[run]\nseed = 5\n[rollout.sampling]\ntop_k = 4\n")
    cfg = _parse(["--config", str(first), "--config", str(second),
                  "--rollout-temperature", "0.9"], tmp_path)
    assert cfg.algorithm.advantage_estimator == "sapo"  # only in the first
    assert cfg.run.seed == 5  # the later file wins
    assert cfg.rollout.sampling.rollout_top_k == 4
    assert cfg.rollout.sampling.rollout_temperature == 0.9  # a flag wins over every file


def test_each_former_name_leads_to_a_field_of_its_section_and_is_none_itself():
    """RENAMED (former sectioned name -> name now) stays true: the name now is a field of that
    section, and the former one is neither a field nor a flag name there (else a key would be
    read two ways)."""
    assert len(RENAMED) == 60
    for old, new in RENAMED.items():
        *path, former = old.split(".")
        cls = TrainConfig
        for name in path:
            cls = next(f for f in dataclasses.fields(cls) if f.name == name).metadata["section"]
        names = {f.name for f in dataclasses.fields(cls)}
        assert new in names and former not in names and former not in flat_index(cls), old
