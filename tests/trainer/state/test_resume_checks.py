"""relax/trainer/state/resume.py: which checkpoints a configuration may continue, checked on
hand-written manifests (no model, no training). tests/hostile/test_directories.py runs the
same refusals end to end through `relax train`."""

from __future__ import annotations

import json

import pytest

from relax.config import replace_flat
from relax.config.files import RENAMED
from relax.config.section import to_flat, value_of
from relax.errors import ConfigError, InputError
from relax.rundirs import SAVE_MARKER
from relax.trainer.state.resume import check_resume
from tests.trainer.helpers import make_config

MODEL = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32}


def _checkpoint(path, cfg, *, manifest=None, model=None, **config_changes):
    """A checkpoint directory whose manifest records ``cfg`` (with ``config_changes``)."""
    path.mkdir(parents=True)
    # by section as the trainer writes it; the changes by flag name, as older files were
    saved = {**json.loads(json.dumps(cfg.to_dict(), default=str)), **config_changes}
    flat = {**to_flat(cfg), **config_changes}
    body = {"kind": "checkpoint", "rollout_step": 2,
            "progress": {"seed": flat["seed"]},
            "advantage_estimator": flat["advantage_estimator"], "config": saved}
    (path / SAVE_MARKER).write_text(json.dumps(body if manifest is None else manifest))
    (path / "config.json").write_text(json.dumps(MODEL if model is None else model))
    return str(path)


@pytest.fixture
def cfg(tmp_path):
    return make_config("--num-rollout", "4", output_dir=tmp_path / "out",
                       load=str(tmp_path / "save"))


def test_an_unchanged_configuration_continues_silently(cfg, tmp_path):
    ckpt = _checkpoint(tmp_path / "save" / "rollout_000002", cfg)
    assert check_resume(cfg, ckpt, 2, 4) is None
    assert check_resume(cfg, ckpt, 4, 4) is None  # the last step itself: nothing left, no error


def test_changed_settings_are_listed_in_one_line_and_local_ones_are_not(cfg, tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt", cfg, lr=0.5, rollout_batch_size=8, num_rollout=2,
                       save="/elsewhere", output_dir="/old", keep_last=3)
    line = check_resume(cfg, ckpt, 2, 4)
    assert line == (f"relax train: continuing {ckpt} (step 2) with changed settings: "
                    f"--lr 0.5 -> {cfg.optimizer.lr}, --rollout-batch-size 8 -> {cfg.batches.rollout_batch_size}")


def test_a_checkpoint_beyond_the_last_step_is_refused(cfg, tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt", cfg)
    with pytest.raises(InputError) as refused:
        check_resume(cfg, ckpt, 5, 4)
    assert str(refused.value) == (
        f"--load {cfg.checkpoint.load}: the checkpoint {ckpt} is at rollout step 5, beyond this run's 4 "
        "steps; raise --num-rollout above 5 to continue it (relax eval evaluates it as it is)")


@pytest.mark.parametrize("key,flag,other", [("seed", "--seed", 7),
                                            ("advantage_estimator", "--advantage-estimator",
                                             "gspo")])
def test_another_seed_or_estimator_is_another_run(cfg, tmp_path, key, flag, other):
    ckpt = _checkpoint(tmp_path / "ckpt", cfg, **{key: other})
    with pytest.raises(InputError) as refused:
        check_resume(cfg, ckpt, 2, 4)
    assert str(refused.value) == (
        f"--load {cfg.checkpoint.load}: the checkpoint was trained with {flag} {other}, this run has "
        f"{flag} {value_of(cfg, key)}; resume with {flag} {other}, or start a new run without "
        "--load")


def test_the_progress_seed_wins_over_the_config_and_missing_records_pass(cfg, tmp_path):
    # the seed a run actually used is its progress's (a preset may have changed the config's)
    body = {"progress": {"seed": 99}, "config": {"seed": cfg.run.seed}}
    ckpt = _checkpoint(tmp_path / "a", cfg, manifest=body)
    with pytest.raises(InputError, match="trained with --seed 99"):
        check_resume(cfg, ckpt, 2, 4)
    # an older manifest that records neither cannot be checked, so it is not refused
    assert check_resume(cfg, _checkpoint(tmp_path / "b", cfg, manifest={}), 2, 4) is None


@pytest.mark.parametrize("saved_rank,rank,words", [
    (8, 0, "trained with --lora-rank 8, this run has --lora-rank 0; resume with --lora-rank 8"),
    (0, 8, "trained with full fine-tuning, this run has --lora-rank 8; resume with no "
           "--lora-rank"),
    (4, 8, "trained with --lora-rank 4, this run has --lora-rank 8; resume with --lora-rank 4"),
])
def test_adapter_and_full_checkpoints_do_not_load_into_each_other(cfg, tmp_path, saved_rank,
                                                                   rank, words):
    ckpt = _checkpoint(tmp_path / "ckpt", cfg, lora_rank=saved_rank)
    with pytest.raises(InputError, match=words):
        check_resume(replace_flat(cfg, lora_rank=rank), ckpt, 2, 4)


def test_the_model_must_be_the_hf_checkpoint_model(cfg, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({**MODEL, "hidden_size": 32,
                                                  "torch_dtype": "float32"}))
    cfg = replace_flat(cfg, hf_checkpoint=str(base))
    ckpt = _checkpoint(tmp_path / "ckpt", cfg)
    with pytest.raises(InputError) as refused:
        check_resume(cfg, ckpt, 2, 4)
    assert str(refused.value) == (
        f"--load {cfg.checkpoint.load}: the checkpoint's model differs from --hf-checkpoint {base} "
        "(hidden_size 16 vs 32); the reference model and the tokenizer come from "
        "--hf-checkpoint, so point it at the model this run started from")
    # keys outside the architecture (dtype, names) may differ
    (base / "config.json").write_text(json.dumps({**MODEL, "torch_dtype": "bfloat16"}))
    assert check_resume(cfg, ckpt, 2, 4) is None


@pytest.mark.parametrize("damage,words", [
    (lambda p: (p / SAVE_MARKER).unlink(), f"cannot read .*{SAVE_MARKER} \\(FileNotFoundError\\)"),
    (lambda p: (p / SAVE_MARKER).write_text("{not json"), "\\(JSONDecodeError\\)"),
    (lambda p: (p / SAVE_MARKER).write_text("[1, 2]"), f"{SAVE_MARKER} is not a JSON object"),
])
def test_an_unreadable_manifest_is_bad_input(cfg, tmp_path, damage, words):
    ckpt = _checkpoint(tmp_path / "ckpt", cfg)
    damage(tmp_path / "ckpt")
    with pytest.raises(InputError, match=rf"^--load {cfg.checkpoint.load}: .*{words}"):
        check_resume(cfg, ckpt, 2, 4)


def test_a_checkpoint_saved_with_flat_keys_still_resumes(cfg, tmp_path):
    """Manifests written before sections hold the flags by flat name (and flags since
    removed): they are read the same way."""
    old = {**json.loads(json.dumps(to_flat(cfg), default=str)), "colocate": True,
           "hybrid": False}
    manifest = {"kind": "checkpoint", "rollout_step": 2, "progress": {"seed": old["seed"]},
                "advantage_estimator": old["advantage_estimator"], "config": old}
    ckpt = _checkpoint(tmp_path / "ckpt", cfg, manifest=manifest)
    assert check_resume(cfg, ckpt, 2, 4) is None
    manifest["config"] = {**old, "lora_rank": 4}
    (tmp_path / "ckpt" / SAVE_MARKER).write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="trained with --lora-rank 4"):
        check_resume(cfg, ckpt, 2, 4)


def _former_names(values: dict, path: tuple[str, ...] = ()) -> dict:
    """``values`` (by section) with every renamed field under its former name (RENAMED,
    inverted), as manifests written before the fields were named like their flags hold it."""
    former = {(*old.split(".")[:-1], new): old.split(".")[-1] for old, new in RENAMED.items()}
    return {former.get((*path, key), key): (_former_names(value, (*path, key))
                                            if isinstance(value, dict) else value)
            for key, value in values.items()}


def test_a_checkpoint_saved_with_the_former_field_names_still_resumes(tmp_path):
    """A manifest by section under the fields' former names (``lora: {rank: 4}``) is read as
    the names of now: unchanged it continues silently, a change under a former name is seen."""
    cfg = make_config("--num-rollout", "4", "--lora-rank", "4", output_dir=tmp_path / "out", load=str(tmp_path / "save"))
    saved = json.loads(json.dumps(cfg.to_dict(), default=str))
    old = _former_names(saved)
    assert old["lora"]["rank"] == 4 and "lora_rank" not in old["lora"]
    manifest = {"kind": "checkpoint", "rollout_step": 2, "progress": {"seed": cfg.run.seed},
                "advantage_estimator": cfg.algorithm.advantage_estimator, "config": old}
    ckpt = _checkpoint(tmp_path / "ckpt", cfg, manifest=manifest)
    assert check_resume(cfg, ckpt, 2, 4) is None
    manifest["config"] = {**old, "batches": {**old["batches"], "samples_per_prompt": 8}}
    (tmp_path / "ckpt" / SAVE_MARKER).write_text(json.dumps(manifest))
    assert check_resume(cfg, ckpt, 2, 4) == (
        f"relax train: continuing {ckpt} (step 2) with changed settings: "
        f"--n-samples-per-prompt 8 -> {cfg.batches.n_samples_per_prompt}")
    manifest["config"] = {**old, "lora": {**old["lora"], "lora_rank": 4}}
    (tmp_path / "ckpt" / SAVE_MARKER).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as refused:
        check_resume(cfg, ckpt, 2, 4)
    assert "keys 'rank' and 'lora_rank'" in str(refused.value)
