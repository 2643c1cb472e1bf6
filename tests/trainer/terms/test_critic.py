"""PPO with a learned critic end to end on the tiny model (reinforce_plus_plus.md §5c): the
critic's metrics are finite and its value loss falls on a fixed reward, a seeded run resumed
from a checkpoint equals the uninterrupted run (critic included), --num-critic-only-steps
leaves the policy alone, --critic-save / --critic-load round-trip, and a critic file that does
not fit the model is one line, exit 2, before training."""

import math

import pytest
import torch

from relax.errors import InputError
from relax.trainer import train
from relax.trainer.distributed import unwrap
from relax.trainer.state import sharded_state
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward

CRITIC_METRICS = ("critic/value_loss", "critic/explained_variance", "critic/value_clip_fraction",
                  "critic/values_mean", "critic/lr")
ONE = "def one(prompts, responses, labels):\n    return [1.0] * len(responses)\n"


def _ppo(tmp_path, *flags):
    reward = write_reward(tmp_path, ONE, name="one.py")
    return ["--advantage-estimator", "ppo", "--custom-rm-path", f"{reward}:one",
            "--critic-lr", "1e-3", *flags]


def test_ppo_trains_and_the_value_loss_falls_on_a_fixed_reward(tmp_path):
    # reward 1 for every response, gamma = lambda = 1: every token's target is 1, the zero head
    # starts at V = 0 (value loss 0.5) and the critic learns to predict 1
    cfg = make_config(*_ppo(tmp_path), "--num-rollout", "5", output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    for row in history:
        for name in CRITIC_METRICS:
            assert name in row and math.isfinite(row[name]), (name, row.get(name))
    losses = [row["critic/value_loss"] for row in history]
    assert losses[0] == pytest.approx(0.5, rel=1e-6)  # 0.5 * (0 - 1)^2 before the first step
    # --value-clip 0.2 bounds how far a step moves V, so the fall is steady, not sudden
    assert all(b < a for a, b in zip(losses[:-1], losses[1:], strict=True)) and losses[-1] < 0.75 * losses[0], \
        losses
    assert history[-1]["critic/values_mean"] > history[0]["critic/values_mean"]
    assert moved > 0  # the policy trains too (A = 1 - V != 0)
    assert history[0]["critic/lr"] == pytest.approx(1e-3)


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    common = _ppo(tmp_path, "--gamma", "0.9", "--lambd", "0.8", "--critic-lr-warmup-iters", "3",
                  "--num-critic-only-steps", "1")
    _, uninterrupted, _ = fit(make_config(*common, "--num-rollout", "4",
                                          output_dir=tmp_path / "full"))
    fit(make_config(*common, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                    "--save-interval", "1", output_dir=tmp_path / "part"))
    # the critic's state is in the checkpoint's DCP shards, under its own key
    saved = sharded_state.saved_shapes(str(tmp_path / "ckpt" / "rollout_000002"), "critic.")
    assert {"model.head.weight", "progress.optimizer_steps", "progress.updates"} <= set(saved)
    assert any(k.startswith("optim.state.") for k in saved)
    trainer, tail, _ = fit(make_config(*common, "--num-rollout", "4", "--load",
                                       str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    assert trainer.start_step == 2 and len(tail) == 2
    for got, want in zip(tail, uninterrupted[2:], strict=True):
        for key in ("rollout/raw_reward", "train/loss", "train/grad_norm", *CRITIC_METRICS):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    assert [r["rollout/step"] for r in read_metrics(tmp_path / "part")] == [1, 2, 3, 4]


def test_token_budgets_and_several_optimizer_steps(tmp_path):
    cfg = make_config(*_ppo(tmp_path, "--global-batch-size", "8", "--micro-batch-size", "2",
                            "--use-dynamic-batch-size", "--max-tokens-per-gpu", "24",
                            "--normalize-advantages"),
                      "--num-rollout", "2", output_dir=tmp_path / "run")
    assert cfg.batches.num_steps_per_rollout == 2
    _, history, moved = fit(cfg)
    assert moved > 0
    for row in history:
        for name in CRITIC_METRICS:
            assert math.isfinite(row[name]), name
    assert history[1]["critic/value_loss"] < history[0]["critic/value_loss"]


def test_critic_only_steps_leave_the_policy_alone(tmp_path):
    # the command line refuses a run of critic-only steps alone (no policy step left), so the
    # two steps are an override: the trainer's own behaviour stays tested
    cfg = make_config(*_ppo(tmp_path, "--num-critic-only-steps", "2"), "--num-rollout", "3",
                      output_dir=tmp_path / "run", num_rollout=2)
    trainer, history, moved = fit(cfg)
    assert moved == 0.0
    assert all("train/loss" not in row for row in history)
    assert history[-1]["critic/value_loss"] < history[0]["critic/value_loss"]
    assert trainer.critic.updates == 2


def test_critic_save_then_load_starts_from_the_saved_values(tmp_path):
    fit(make_config(*_ppo(tmp_path, "--critic-save", str(tmp_path / "critic")), "--num-rollout",
                    "3", "--save", str(tmp_path / "ckpt"), output_dir=tmp_path / "a"))
    trainer, history, _ = fit(make_config(*_ppo(tmp_path, "--critic-load",
                                                str(tmp_path / "critic")),
                                          "--num-rollout", "1", output_dir=tmp_path / "b"))
    assert history[0]["critic/values_mean"] > 0.05  # a fresh zero head would give exactly 0
    saved = torch.load(tmp_path / "critic" / "critic.pt", weights_only=True)["model"]
    assert set(saved) == set(unwrap(trainer.critic.model).state_dict())
    # a checkpoint directory holds the same critic (in its DCP shards)
    _, from_checkpoint, _ = fit(make_config(*_ppo(tmp_path, "--critic-load",
                                                  str(tmp_path / "ckpt" / "rollout_000003")),
                                            "--num-rollout", "1", output_dir=tmp_path / "c"))
    assert from_checkpoint[0]["critic/values_mean"] == history[0]["critic/values_mean"]


def test_a_critic_that_does_not_fit_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    torch.save({"model": {"head.weight": torch.zeros(1, 3)}}, tmp_path / "bad" / "critic.pt")
    cfg = make_config(*_ppo(tmp_path, "--critic-load", str(tmp_path / "bad")),
                      output_dir=tmp_path / "run")
    assert train(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("relax train: error: --critic-load"), err
    assert "does not fit the model" in err[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


STEP_METRICS = ("critic/value_loss", "critic/value_clip_fraction", "critic/explained_variance",
                "critic/values_mean")


@pytest.mark.subprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_ranks_equal_one_process_and_resume_exactly(tmp_path, fsdp):
    # one critic step on a fixed batch: the values, the step's metrics and the parameters
    # after it are those of one process holding the whole batch; a checkpoint written by the
    # two ranks (DCP, each its own part) loads into a fresh critic that then takes the same
    # next step as the critic that wrote it
    from tests.distributed_utils import run_distributed
    from tests.trainer.terms.critic_workers import critic_step

    # token budgets: the two ranks' rows make 3 and 4 micro-batches (sharded ranks split)
    ref_params, ref_values, ref_metrics = critic_step(2, fsdp, None, 12)
    assert 0 < ref_metrics["critic/value_clip_fraction"] < 1  # the clip binds on some tokens
    assert 0.05 < abs(ref_metrics["critic/explained_variance"]) < 10
    ranks = run_distributed(critic_step, 2, 2, fsdp, str(tmp_path / "ckpt"), 12, timeout=200)
    values = torch.cat([r[1] for r in ranks])
    torch.testing.assert_close(values, ref_values, atol=1e-6, rtol=1e-5)
    for params, _, metrics, loaded, (kept, kept_metrics), (again, again_metrics) in ranks:
        for name, p in ref_params.items():
            torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
            assert torch.equal(loaded[name], params[name]), name
            assert not torch.equal(kept[name], params[name]) or "embed" in name
            assert torch.equal(again[name], kept[name]), name
        for key in STEP_METRICS:
            assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5, abs=1e-7), key
        assert again_metrics == kept_metrics


def test_resuming_ppo_from_a_grpo_checkpoint_is_one_line_exit_2(tmp_path, capsys):
    reward = write_reward(tmp_path, ONE, name="one.py")
    fit(make_config("--custom-rm-path", f"{reward}:one", "--num-rollout", "1", "--save",
                    str(tmp_path / "ckpt"), output_dir=tmp_path / "a"))
    cfg = make_config(*_ppo(tmp_path), "--num-rollout", "2", "--load", str(tmp_path / "ckpt"),
                      output_dir=tmp_path / "b")
    capsys.readouterr()
    assert train(cfg) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if "error" in line]
    # the checkpoint has no critic: the resume check refuses the other estimator first
    assert len(err) == 1 and "--advantage-estimator ppo" in err[0], err


def test_multi_turn_skips_the_environment_tokens(tmp_path, monkeypatch):
    # the environment's tokens are holes of the loss mask: no value, no advantage, no target
    # there, and GAE runs over the model's tokens (reinforce_plus_plus.md §5c)
    from relax.trainer.terms.critic import Critic

    seen = []
    original = Critic.targets

    def spy(self, exp, raw, tracker):
        original(self, exp, raw, tracker)
        seen.append((exp.response_mask.clone(), exp.attention_mask.clone(), exp.values.clone(),
                     exp.returns.clone(), raw.clone()))

    monkeypatch.setattr(Critic, "targets", spy)
    cfg = make_config("--advantage-estimator", "ppo", "--gamma", "0.9", "--lambd", "0.9",
                      "--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3",
                      "--num-rollout", "1", output_dir=tmp_path / "run")
    fit(cfg)
    for name in CRITIC_METRICS:
        assert math.isfinite(read_metrics(tmp_path / "run")[0][name]), name
    (mask, attention, values, returns, raw), = seen
    env_tokens = attention[:, -mask.shape[1]:].bool() & ~mask
    assert env_tokens.any(), "the episodes had no environment turn"
    for t in (values, returns, raw):
        assert torch.equal(t[env_tokens], torch.zeros_like(t[env_tokens]))
    torch.testing.assert_close(returns[mask], (raw + values)[mask].float())


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_fsdp_run_resumes_exactly_and_its_checkpoint_loads_in_one_process(tmp_path):
    # two FSDP2 ranks: a run continued from its step-2 checkpoint repeats the uninterrupted
    # step 3 exactly; the critic of the final checkpoint, sharded over two ranks, loads whole
    # into one process without --fsdp and equals what --critic-save gathered on rank 0
    from tests.distributed_utils import torchrun_relax

    reward = write_reward(tmp_path)
    flags = ["--advantage-estimator", "ppo", "--custom-rm-path", f"{reward}:parity",
             "--critic-lr", "1e-3", "--lambd", "0.9", "--critic-lr-warmup-iters", "2",
             "--num-critic-only-steps", "1", "--rollout-batch-size", "2",
             "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
             "--micro-batch-size", "1", "--num-rollout", "3"]
    save, out = tmp_path / "save", tmp_path / "full"
    proc = torchrun_relax(*flags, "--fsdp", "--device", "cpu", "--save", str(save),
                          "--save-interval", "1", "--critic-save", str(tmp_path / "critic"),
                          "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # each rank wrote its own half of the critic's decoder blocks
    layers = {k: v for k, v in sharded_state.read_metadata(
        str(save / "rollout_000002")).state_dict_metadata.items()
        if k.startswith("critic.model.lm.model.layers.") and k.endswith("proj.weight")}
    assert layers and all(len(v.chunks) == 2 for v in layers.values())
    proc = torchrun_relax(*flags, "--fsdp", "--device", "cpu", "--load",
                          str(save / "rollout_000002"), "--output-dir", str(tmp_path / "tail"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    want, got = read_metrics(out)[2], read_metrics(tmp_path / "tail")[-1]
    assert got["rollout/step"] == want["rollout/step"] == 3
    for key in ("rollout/raw_reward", "train/loss", "train/grad_norm", *CRITIC_METRICS):
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key

    from relax.trainer.distributed import init_distributed
    from relax.trainer.loop import Trainer

    whole = torch.load(tmp_path / "critic" / "critic.pt", weights_only=True)["model"]
    trainer = Trainer(make_config(*flags, "--load", str(save), output_dir=tmp_path / "one",
                                  tiny=False), init_distributed("cpu"), console=False)
    try:
        assert trainer.start_step == 3 and trainer.critic.updates == 3
        state = unwrap(trainer.critic.model).state_dict()
        assert sorted(state) == sorted(whole)
        for name, value in whole.items():
            assert torch.equal(state[name], value), name
    finally:
        trainer.close()


def test_a_lora_critic_trains_adapters_and_head_and_resumes_exactly(tmp_path):
    # --lora-rank: the critic, as the policy, trains LoRA adapters on its frozen backbone, and
    # its new value head whole; its checkpoint holds those only and resumes exactly;
    # --critic-save writes the adapters merged, which a plain critic loads to the same values
    from relax.trainer.terms.critic import ValueModel
    from relax.trainer.terms.critic_weights import load_weights
    from tests.trainer.workers import fixed_experience

    common = _ppo(tmp_path, "--lora-rank", "4", "--lora-alpha", "8", "--gamma", "0.9",
                  "--lambd", "0.8", "--critic-lr-warmup-iters", "2")
    full, uninterrupted, _ = fit(make_config(*common, "--num-rollout", "3", "--critic-save",
                                             str(tmp_path / "critic"),
                                             output_dir=tmp_path / "full"))
    named = dict(unwrap(full.critic.model).named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    assert trained and all("lora_" in n or n.startswith("head.") for n in trained)
    assert {"head.weight", "head.bias"} <= trained
    optimized = {id(p) for g in full.critic.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(named[n]) for n in trained}
    assert any(p.abs().max() > 0 for n, p in named.items() if "lora_B" in n)  # they trained

    fit(make_config(*common, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                    output_dir=tmp_path / "part"))
    saved = sharded_state.saved_shapes(str(tmp_path / "ckpt" / "rollout_000002"),
                                       "critic.model.")
    assert set(saved) == trained  # the adapters and the head, not the frozen backbone
    _, tail, _ = fit(make_config(*common, "--num-rollout", "3", "--load",
                                 str(tmp_path / "ckpt"), output_dir=tmp_path / "part"))
    for key in ("rollout/raw_reward", "train/loss", "train/grad_norm", *CRITIC_METRICS):
        assert tail[0][key] == pytest.approx(uninterrupted[2][key], rel=1e-6, abs=1e-9), key

    plain = ValueModel(full.policy.module.__class__(full.policy.module.config))
    with pytest.raises(InputError, match="adapters only"):  # a LoRA checkpoint's critic
        load_weights(plain, str(tmp_path / "ckpt" / "rollout_000002"))
    load_weights(plain, str(tmp_path / "critic"))
    exp = fixed_experience(full.policy.module)
    with torch.no_grad():
        want = full.critic.values(exp, micro_batch_size=8)
        got = plain(exp.input_ids, exp.attention_mask, exp.position_ids,
                    response_len=exp.response_mask.shape[1])
    assert want.abs().max() > 0.01
    torch.testing.assert_close(torch.where(exp.response_mask, got, 0.0), want, atol=1e-5,
                               rtol=1e-4)


def test_recompute_covers_the_critic_and_changes_no_number(tmp_path):
    from relax.trainer.policy.recompute import recomputing

    runs = {}
    for name, flags in (("plain", []), ("recompute", ["--recompute-granularity", "full"])):
        trainer, history, _ = fit(make_config(*_ppo(tmp_path, *flags), "--num-rollout", "1",
                                              output_dir=tmp_path / name))
        lm = unwrap(trainer.critic.model).lm
        with torch.enable_grad():
            assert recomputing(lm) == bool(flags)
        runs[name] = (history[0], dict(unwrap(trainer.critic.model).named_parameters()))
    (want, want_params), (got, got_params) = runs["plain"], runs["recompute"]
    for key in CRITIC_METRICS:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), key
    for name, p in want_params.items():
        torch.testing.assert_close(got_params[name], p, atol=1e-6, rtol=1e-5, msg=name)
