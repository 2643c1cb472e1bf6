"""LoRA (``--lora-rank``) on peft: Megatron names, bad targets, the reference as the policy with
its adapter off, only the adapter trained, the engine's LoRA path, and two DDP ranks."""

from __future__ import annotations

import peft  # noqa: F401  (the train extra; make installs it, so it is never skipped)
import pytest
import torch

from relax.errors import InputError
from relax.rollout.generation.engine import unsupported_reason
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import init_distributed, unwrap
from relax.trainer.loop import Trainer
from relax.trainer.policy.lora import adapter_disabled, add_lora, hf_target_names, merged_copy
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, make_config, read_metrics, write_reward


def test_megatron_names_map_to_hugging_face_names():
    assert hf_target_names(["linear_qkv", "linear_fc1", "q_proj"]) == [
        "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]
    assert hf_target_names(["linear_proj", "linear_fc2"]) == ["o_proj", "down_proj"]


def test_unknown_target_module_is_one_line_naming_the_flag():
    model = build_tiny_model(build_tokenizer(), 0)
    with pytest.raises(InputError, match=r"--lora-target-modules qkv: the model has no linear "
                       r"layer named 'qkv'; its linear layers are down_proj, gate_proj"):
        add_lora(model, rank=4, alpha=8, dropout=0.0, targets=["qkv"])


def test_adapter_off_is_the_base_model_and_merge_is_exact():
    model = build_tiny_model(build_tokenizer(), 0)
    x = torch.randint(3, 20, (2, 6))
    base = model(input_ids=x).logits.detach()
    tuner = add_lora(model, rank=4, alpha=8, dropout=0.0, targets=["linear_qkv", "linear_fc2"])
    assert unsupported_reason(model) is None  # the engine runs the adapter's path (dropout 0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    torch.testing.assert_close(model(input_ids=x).logits, base)  # lora_B starts at 0
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.5)
    adapted = model(input_ids=x).logits.detach()
    assert (adapted - base).abs().max() > 1e-3
    with adapter_disabled(tuner):
        torch.testing.assert_close(model(input_ids=x).logits, base)
    merged = merged_copy(tuner)
    torch.testing.assert_close(merged(input_ids=x).logits, adapted, atol=1e-5, rtol=1e-5)
    assert not any("lora" in k for k in merged.state_dict())


def test_training_moves_only_the_adapter_and_the_reference_is_the_base(tmp_path):
    reward = write_reward(tmp_path)
    cfg = make_config(*RECIPES["reinforce_plus_plus_baseline"], "--custom-rm-path",
                      f"{reward}:parity", "--lora-rank", "4", "--lora-target-modules",
                      "linear_qkv", "--lr", "1e-2", output_dir=tmp_path / "run")
    trainer = Trainer(cfg, init_distributed(cfg.system.device), console=False)
    model = unwrap(trainer.policy.model)
    assert trainer.policy.ref is None  # no second copy of the weights
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt_params = sum(p.numel() for g in trainer.policy.optimizer.param_groups for p in g["params"])
    assert opt_params == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    try:
        trainer.fit()
    finally:
        trainer.close()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n for n in moved)
    rows = read_metrics(tmp_path / "run")
    assert rows[0]["train/kl_loss"] == 0.0  # step 1: the adapter is 0, policy == reference
    assert rows[1]["train/kl_loss"] > 0.0


@pytest.mark.subprocess
def test_lora_with_two_ddp_ranks(tmp_path):
    reward = write_reward(tmp_path)
    out = tmp_path / "run"
    proc = torchrun_relax(*RECIPES["reinforce_plus_plus_baseline"], "--num-rollout", "2",
                          "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                          "--rollout-max-response-len", "4", "--custom-rm-path", f"{reward}:parity",
                          "--lora-rank", "4", "--device", "cpu", "--output-dir", str(out),
                          "--save", str(tmp_path / "save"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["rollout/step"] for r in rows] == [1, 2] and rows[0]["train/kl_loss"] == 0.0
    # rank 0 writes the adapter (PEFT format) and the merged model; both ranks the shards
    save = tmp_path / "save"
    assert (save / "adapter" / "adapter_model.safetensors").is_file()
    assert (save / "model.safetensors").is_file()
    assert (save / "rollout_000002" / "adapter" / "adapter_config.json").is_file()
