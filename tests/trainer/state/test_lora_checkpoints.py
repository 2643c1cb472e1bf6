"""LoRA checkpoints: the adapter and its optimizer state resume exactly, the
adapter is written in PEFT's own format (loaded here with peft itself), the final save is the
merged model plus the adapter, and relax eval / relax export accept them."""

from __future__ import annotations

import contextlib
import io
import json

import peft  # the train extra; make installs it, so it is never skipped
import pytest
import torch

from relax.cli import main
from relax.errors import InputError
from relax.trainer.distributed import unwrap
from relax.trainer.state import checkpoint
from relax.trainer.state.resume import check_resume
from relax.trainer.state.sharded_state import SafeReader
from tests.reliability.helpers import deterministic
from tests.trainer.helpers import RECIPES, fit, make_config, write_reward

STEPS = ["--num-rollout", "4"]


def _flags(tmp_path):
    reward = write_reward(tmp_path)
    return [*RECIPES["reinforce_plus_plus_baseline"], "--custom-rm-path", f"{reward}:parity",
            "--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2", "--seed", "5"]


def _lora_state(trainer) -> dict:
    return {n: p.detach().clone() for n, p in unwrap(trainer.policy.model).named_parameters()
            if "lora_" in n}


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


IDS = torch.tensor([[5, 9, 13, 17, 21, 25, 29, 33]])


def test_resume_from_an_adapter_checkpoint_equals_an_uninterrupted_run(tmp_path):
    flags = _flags(tmp_path)
    whole, history, _ = fit(make_config(*flags, *STEPS, output_dir=tmp_path / "whole"))
    save = tmp_path / "save"
    first, _, _ = fit(make_config(*flags, "--num-rollout", "2", "--save", str(save),
                                  output_dir=tmp_path / "part"))
    # the shards hold the adapter and its AdamW moments, not the base weights
    keys = SafeReader(str(save / "rollout_000002")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys)
    assert len(model_keys) == len(_lora_state(first))
    resumed, tail, _ = fit(make_config(*flags, *STEPS, "--load", str(save), "--save", str(save),
                                       output_dir=tmp_path / "part"))
    assert resumed.start_step == 2 and len(tail) == 2
    for got, want in zip(tail, history[2:], strict=True):
        got, want = deterministic(got), deterministic(want)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    a, b = _lora_state(resumed), _lora_state(whole)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_the_adapter_is_peft_format_and_the_final_model_is_merged(tmp_path):
    from transformers import AutoModelForCausalLM

    save = tmp_path / "save"
    trainer, _, moved = fit(make_config(*_flags(tmp_path), *STEPS, "--save", str(save),
                                        output_dir=tmp_path / "run"))
    assert moved > 0
    model = unwrap(trainer.policy.model).eval()
    want = _logits(model, IDS)
    # peft's own loader on the adapter directory (the built-in model's base is saved in it)
    adapter = save / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "base" and config["r"] == 4
    base = AutoModelForCausalLM.from_pretrained(adapter / "base")
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    assert torch.allclose(_logits(loaded, IDS), want, atol=1e-5)
    # the final model in DIR is a plain Hugging Face model with the adapter merged
    merged = AutoModelForCausalLM.from_pretrained(save).eval()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    assert torch.allclose(_logits(merged, IDS), want, atol=1e-5)
    # and the adapter is non-trivial: the base alone (a fresh copy: peft adapted ``base`` in
    # place) differs
    plain = AutoModelForCausalLM.from_pretrained(adapter / "base").eval()
    assert not torch.allclose(_logits(plain, IDS), want, atol=1e-4)


def _call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_relax_eval_and_export_accept_the_merged_model_and_the_adapter(tmp_path):
    save = tmp_path / "save"
    fit(make_config(*_flags(tmp_path), *STEPS, "--save", str(save), output_dir=tmp_path / "run"))
    results = []
    for target in (save, save / "adapter"):
        code, out, err = _call(["eval", str(target), "--eval-temperature", "0", "--device",
                                "cpu"])
        assert code == 0, err
        results.append(json.loads(out))
    for r in results:
        r.pop("perf/eval_time")
    assert results[0] == results[1]
    # relax export of the adapter checkpoint: the merged model again
    code, _, err = _call(["export", str(save / "rollout_000004"), str(tmp_path / "exported")])
    assert code == 0, err
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(save).eval()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    assert torch.allclose(_logits(a, IDS), _logits(b, IDS), atol=1e-6)


def test_resuming_with_another_lora_setting_is_one_line(tmp_path):
    flags = _flags(tmp_path)
    save = tmp_path / "save"
    fit(make_config(*flags, "--num-rollout", "1", "--save", str(save),
                    output_dir=tmp_path / "run"))
    full = [f for f in flags if f not in ("--lora-rank", "4", "--lora-alpha", "8")]
    with pytest.raises(InputError, match="trained with --lora-rank 4, this run has --lora-rank "
                       "0; resume with --lora-rank 4"):
        fit(make_config(*full, *STEPS, "--load", str(save), output_dir=tmp_path / "run"))
    # other target modules: 4 of the 7 adapted layers would be dropped, none would start new
    ckpt, step = checkpoint.latest_checkpoint(str(save))
    fewer = make_config(*flags, *STEPS, "--load", str(save), "--lora-target-modules",
                        "linear_qkv", output_dir=tmp_path / "run")
    with pytest.raises(InputError, match=r"the checkpoint trained LoRA adapters on down_proj, "
                       r"gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj, this run targets "
                       r"k_proj, q_proj, v_proj \(its adapters on down_proj, gate_proj, o_proj, "
                       r"up_proj would be dropped\); resume with no --lora-target-modules"):
        check_resume(fewer, ckpt, step, 4)
    # the same layers by their Megatron names are the same adapters: continued
    same = make_config(*flags, *STEPS, "--load", str(save), "--lora-target-modules",
                       "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2",
                       output_dir=tmp_path / "run")
    assert "--lora-target-modules None -> " in check_resume(same, ckpt, step, 4)


def test_a_missing_base_model_is_named(tmp_path):
    save = tmp_path / "save"
    fit(make_config(*_flags(tmp_path), "--num-rollout", "1", "--save", str(save),
                    output_dir=tmp_path / "run"))
    config = save / "adapter" / "adapter_config.json"
    config.write_text(config.read_text().replace('"base"', '"/nowhere/base-model"'))
    code, out, err = _call(["eval", str(save / "adapter"), "--device", "cpu"])
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "the adapter's base model '/nowhere/base-model' is not a model directory" in err
