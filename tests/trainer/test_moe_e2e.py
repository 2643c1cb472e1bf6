"""``relax train --hf-checkpoint TINY_MOE_DIR``: the tiny Qwen3-MoE decodes with the
static-KV engine, trains, repeats when seeded and resumes exactly (the pattern of
tests/trainer/test_e2e.py ``test_interval_saves_and_exact_resume``)."""

import math

import pytest

from relax.rollout.generation.engine import unsupported_reason
from relax.tiny_model import build_tiny_moe, build_tokenizer
from relax.trainer.distributed import unwrap
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward

KEYS = ("rollout/raw_reward", "train/loss", "train/grad_norm", "train/kl_loss")


@pytest.fixture
def moe_dir(tmp_path):
    tok = build_tokenizer()
    path = tmp_path / "tiny_moe"
    build_tiny_moe(tok, seed=4).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _flags(tmp_path, moe_dir, *extra):
    reward = write_reward(tmp_path)
    return ["--hf-checkpoint", moe_dir, "--custom-rm-path", f"{reward}:parity",
            "--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
            "--use-kl-loss", "--kl-loss-type", "k2", "--kl-loss-coef", "0.01", "--seed", "3", "--lr", "1e-3",
            *extra]


def test_trains_with_the_engine_repeats_and_resumes_exactly(tmp_path, moe_dir):
    common = _flags(tmp_path, moe_dir)
    full = make_config(*common, "--num-rollout", "4", output_dir=tmp_path / "full")
    trainer, uninterrupted, moved = fit(full)
    module = unwrap(trainer.policy.model)
    assert module.config.model_type == "qwen3_moe" and unsupported_reason(module) is None
    assert trainer.step_metrics.shared_generation  # the engine decoded (one prefill per prompt)
    assert moved > 1e-4 and any("experts" in n for n, p in module.named_parameters()
                                if p.requires_grad)
    again = make_config(*common, "--num-rollout", "4", output_dir=tmp_path / "again")
    _, repeated, _ = fit(again)
    for got, want in zip(repeated, uninterrupted, strict=True):
        for key in KEYS:
            assert got[key] == want[key], key

    first = make_config(*common, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                        "--save-interval", "1", output_dir=tmp_path / "part")
    fit(first)
    resumed = make_config(*common, "--num-rollout", "4", "--load", str(tmp_path / "ckpt"),
                          output_dir=tmp_path / "part")
    trainer, tail, _ = fit(resumed)
    assert trainer.start_step == 2 and len(tail) == 2
    for got, want in zip(tail, uninterrupted[2:], strict=True):
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    rows = read_metrics(tmp_path / "part")
    assert [r["rollout/step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:  # the router's metrics, every step (relax/trainer/terms/router.py)
        assert 1.0 <= row["train/moe_expert_load_max"] <= 2.0  # E / k = 2
        assert 0.0 < row["train/moe_router_entropy"] <= math.log(4)
        assert row["train/moe_aux_loss"] > 0.5  # about 1 near balance


@pytest.mark.parametrize("extra", [("--bf16",), ("--lora-rank", "4"),
                                   ("--recompute-granularity", "full"),
                                   ("--moe-aux-loss-coef", "0.01"),
                                   ("--use-rollout-routing-replay", "--bf16"),
                                   ("--use-routing-replay", "--num-steps-per-rollout", "2"),
                                   ("--use-rollout-routing-replay", "--use-dynamic-batch-size",
                                    "--max-tokens-per-gpu", "64")],
                         ids=["bf16", "lora", "recompute", "aux-loss", "r3", "r2",
                              "r3-token-budgets"])
def test_bf16_lora_and_recompute_train(tmp_path, moe_dir, extra):
    cfg = make_config(*_flags(tmp_path, moe_dir, *extra), output_dir=tmp_path / "run")
    trainer, history, moved = fit(cfg)
    assert moved > 1e-5 and len(history) == 2
    names = [n for n, p in unwrap(trainer.policy.model).named_parameters() if p.requires_grad]
    if "--lora-rank" in extra:  # the attention's adapters: the experts are not linear layers
        assert names and all("lora_" in n and "self_attn" in n for n in names)
    rows = read_metrics(tmp_path / "run")
    for row in rows:  # the sampler recorded its routing; the trainer's is compared with it
        assert 0.0 <= row["train/moe_routing_mismatch"] <= 1.0
        if "--use-rollout-routing-replay" in extra:  # R3: the update used the sampler's
            assert row["train/moe_replayed_routing_mismatch"] == 0.0
        if "--bf16" not in extra and "--use-routing-replay" not in extra \
                and "--use-rollout-routing-replay" not in extra:
            # the same float32 numerics on both sides: nothing flips, replay or not
            assert row["train/moe_replayed_routing_mismatch"] == row[
                "train/moe_routing_mismatch"]


def test_partial_rollouts_carry_the_routing_record_through_a_resume(tmp_path, moe_dir):
    """--partial-rollout with R3: carried rows keep the newest sampler's record of every
    token (in the checkpoint too), the update replays it, and --load continues exactly."""
    from relax.trainer.state import sharded_state
    from tests.trainer.test_partial_rollout import PARTIAL

    flags = [*_flags(tmp_path, moe_dir), *PARTIAL, "--use-rollout-routing-replay"]
    full = make_config(*flags, "--num-rollout", "4", output_dir=tmp_path / "full")
    _, uninterrupted, _ = fit(full)
    assert all(r["rollout/partial_carried_groups"] > 0 for r in uninterrupted)
    assert all(r["train/moe_replayed_routing_mismatch"] == 0.0 for r in uninterrupted)
    fit(make_config(*flags, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    _, carried = sharded_state.read_rank_file(str(tmp_path / "ckpt" / "rollout_000002"), 0)
    rows = [r for g in carried["carried"] for r in g]
    assert rows and all("routes" in r for r in rows)
    for r in rows:  # the record of the prompt and of every token fed (the last one perhaps not)
        n = len(r["prompt"]) + len(r["ids"])
        assert r["routes"].shape == (n, 2, 2) and (r["routes"][:n - 1] >= 0).all()
    trainer, tail, _ = fit(make_config(*flags, "--num-rollout", "4", "--load",
                                       str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    assert trainer.start_step == 2
    for got, want in zip(tail, uninterrupted[2:], strict=True):
        for key in (*KEYS[:3], "train/moe_routing_mismatch"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
