"""End to end on the built-in tiny model: every estimator, a user HF directory with jsonl data
and a custom reward, save / reload / resume."""

import math

import pytest
import torch

from relax.trainer.distributed import unwrap
from tests.trainer.helpers import RECIPES, fit, make_config, read_metrics, write_jsonl, write_reward

SPEC_METRICS = [
    "rollout/raw_reward", "rollout/returns", "rollout/advantages", "rollout/response_length",
    "rollout/truncated", "rollout/advantage_raw_mean", "rollout/advantage_raw_std",
    "rollout/advantage_normalized_mean", "rollout/advantage_normalized_std",
    "rollout/valid_tokens", "rollout/advantage_zero_variance", "train/pg_loss",
    "train/pg_clipfrac", "train/ppo_kl", "train/grad_norm", "train/loss", "train/entropy",
]
PERF = ["perf/step_time", "perf/rollout_time", "perf/train_time", "perf/generated_tokens_per_s",
        "perf/peak_memory_gb"]




@pytest.mark.parametrize("estimator", sorted(RECIPES))
def test_two_rollout_steps_per_estimator(estimator, tmp_path):
    reward = write_reward(tmp_path)
    cfg = make_config(*RECIPES[estimator], "--custom-rm-path", f"{reward}:parity",
                      output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    assert moved > 1e-4, "the update did not change the parameters"
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for row in rows:
        for name in SPEC_METRICS + PERF:
            assert name in row and math.isfinite(row[name]), name
        assert ("train/kl_loss" in row) == (estimator == "reinforce_plus_plus_baseline")
        assert row["rollout/valid_tokens"] > 0 and 1 <= row["rollout/response_length"] <= 4
        if estimator.startswith("reinforce_plus_plus"):
            # reinforce_plus_plus.md §6: the global normalization leaves mean 0 and (population)
            # std 1
            assert abs(row["rollout/advantage_normalized_mean"]) < 1e-5
            assert row["rollout/advantage_normalized_std"] == pytest.approx(1.0, abs=1e-4)
            assert row["rollout/advantage_zero_variance"] == 0.0
    if estimator == "rloo":  # reinforce_plus_plus.md §5a: no clip, no normalization
        assert all(r["train/pg_clipfrac"] == 0.0 for r in rows)
        assert all(r["rollout/advantage_normalized_std"] == pytest.approx(
            r["rollout/advantage_raw_std"]) for r in rows)
    if estimator == "reinforce_plus_plus":
        # k1 shaping: the returns differ from the raw reward (§10)
        assert rows[1]["rollout/returns"] != pytest.approx(rows[1]["rollout/raw_reward"])
    assert history[-1]["train/grad_norm"] == pytest.approx(rows[-1]["train/grad_norm"])


def test_micro_batches_and_several_optimizer_steps(tmp_path):
    reward = write_reward(tmp_path)
    cfg = make_config("--custom-rm-path", f"{reward}:parity", "--global-batch-size", "8",
                      "--micro-batch-size", "2", output_dir=tmp_path / "run")
    assert cfg.batches.num_steps_per_rollout == 2
    _, history, moved = fit(cfg)
    # the second optimizer step sees a moved policy, so the ratio leaves 1 there
    assert moved > 1e-4 and history[-1]["train/ppo_kl"] != 0.0


def _write_hf_dir(path, seed=11):
    from relax.tiny_model import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model


def test_hf_directory_jsonl_and_custom_reward_then_reload_the_save(tmp_path):
    _write_hf_dir(tmp_path / "hf")
    data = write_jsonl(tmp_path, [{"question": f"{i}+{i}=", "answer": str(2 * i)}
                                  for i in range(8)])
    reward = write_reward(tmp_path, "def fn(prompts, responses, labels):\n"
                          "    assert all(l is not None for l in labels)\n"
                          "    return [float(len(r) == len(l)) + 0.1 * len(r) for r, l in "
                          "zip(responses, labels)]\n")
    flags = ["--hf-checkpoint", str(tmp_path / "hf"), "--prompt-data", data, "--input-key",
             "question", "--label-key", "answer", "--custom-rm-path", f"{reward}:fn",
             "--lr", "1e-2", "--save", str(tmp_path / "save")]
    trainer, history, moved = fit(make_config(*flags, output_dir=tmp_path / "run"))
    assert moved > 1e-4 and len(history) == 2

    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "save")
    for name, p in unwrap(trainer.policy.model).named_parameters():
        torch.testing.assert_close(dict(saved.named_parameters())[name], p.detach(), msg=name)
    # the save is itself a model directory --hf-checkpoint accepts, and a Relax save that a
    # new run may replace (not refused)
    again = make_config("--hf-checkpoint", str(tmp_path / "save"), "--prompt-data", data,
                        "--input-key", "question", "--label-key", "answer", "--rm-type", "math",
                        "--num-rollout", "1", "--save", str(tmp_path / "save"),
                        output_dir=tmp_path / "run2")
    _, history2, _ = fit(again)
    assert len(history2) == 1


def test_interval_saves_and_exact_resume(tmp_path):
    reward = write_reward(tmp_path)
    common = ["--custom-rm-path", f"{reward}:parity", "--advantage-estimator",
              "reinforce_plus_plus_baseline", "--normalize-advantages", "--use-kl-loss",
              "--kl-loss-type", "k2", "--kl-loss-coef", "0.01"]
    full = make_config(*common, "--num-rollout", "4", output_dir=tmp_path / "full")
    _, uninterrupted, _ = fit(full)

    first = make_config(*common, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                        "--save-interval", "1", output_dir=tmp_path / "part")
    fit(first)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("roll")) \
        == ["rollout_000001", "rollout_000002"]
    resumed = make_config(*common, "--num-rollout", "4", "--load", str(tmp_path / "ckpt"),
                          output_dir=tmp_path / "part")
    trainer, tail, _ = fit(resumed)
    assert trainer.start_step == 2 and len(tail) == 2
    for got, want in zip(tail, uninterrupted[2:], strict=True):
        for key in ("rollout/raw_reward", "train/loss", "train/grad_norm", "train/kl_loss"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    assert [r["rollout/step"] for r in read_metrics(tmp_path / "part")] == [1, 2, 3, 4]


def test_reward_post_process_is_applied(tmp_path):
    reward = write_reward(tmp_path)
    post = write_reward(tmp_path, "import torch\ndef zero(rewards, group_index):\n"
                        "    assert rewards.shape == group_index.shape\n"
                        "    return torch.zeros_like(rewards)\n", "post.py")
    cfg = make_config("--custom-rm-path", f"{reward}:parity", "--custom-reward-post-process-path",
                      f"{post}:zero", "--num-rollout", "1", output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    # every reward is 0 after post-processing: zero advantages, no policy gradient
    assert history[0]["rollout/raw_reward"] == 0.0 and history[0]["rollout/advantages"] == 0.0
    assert history[0]["train/pg_loss"] == 0.0
