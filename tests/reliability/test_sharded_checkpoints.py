"""Sharded checkpoints (torch.distributed.checkpoint): the layout of a two-rank FSDP2 save,
a resume at another world size and without --fsdp, ``relax export``, and an asynchronous
save that counts only once complete (docs/reliability.md section 1)."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from relax.cli import main
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext, init_distributed
from relax.trainer.loop import Trainer
from relax.trainer.policy.bundle import Policy
from relax.trainer.state import checkpoint, sharded_state
from tests.reliability.helpers import SMALL, finish_all, start_ranks, write_gate_reward
from tests.trainer.helpers import make_config


def _weights_of(path) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(path, "model.safetensors"))


@pytest.mark.subprocess
def test_two_rank_fsdp_save_is_sharded_and_resumes_in_one_process(tmp_path, capsys):
    save = tmp_path / "save"
    flags = [*SMALL, "--custom-rm-path", write_gate_reward(tmp_path), "--rollout-batch-size",
             "4", "--num-rollout", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = start_ranks([*flags, "--fsdp", "--async-save", "--save", str(save),
                         "--save-interval", "1", "--output-dir", str(tmp_path / "run")], env)
    assert finish_all(ranks) == [0, 0], ranks[0].lines[-20:] + ranks[1].lines[-20:]

    ckpt = save / "rollout_000002"
    meta = json.loads((ckpt / checkpoint.MARKER).read_text())
    assert (meta["world_size"], meta["fsdp"], meta["rollout_step"]) == (2, True, 2)
    shards = {n: f["size"] for n, f in meta["files"].items() if n.endswith(".distcp")}
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    # each rank wrote its own half of the model and AdamW state: neither holds all of it
    assert max(shards.values()) < 0.7 * sum(shards.values()), shards
    assert {"rank_00000.pt", "rank_00001.pt", ".metadata", "config.json"} <= set(meta["files"])
    assert not any("sha256" in f for f in meta["files"].values())  # sizes only by default
    final = _weights_of(save)  # the Hugging Face model of step 2, gathered on rank 0
    from transformers import AutoModelForCausalLM

    want = AutoModelForCausalLM.from_pretrained(save).state_dict()

    # one process, no --fsdp: DCP reshards the two halves into whole tensors
    resumed = make_config(*flags[:-2], "--num-rollout", "3", "--load", str(save), "--save",
                          str(save), tiny=False, output_dir=tmp_path / "resumed")
    trainer = Trainer(resumed, init_distributed("cpu"), console=False)
    try:
        assert trainer.start_step == 2
        state = trainer.policy.model.state_dict()
        for name, value in final.items():
            assert torch.equal(state[name], value), name
        moments = [s["exp_avg"] for s in trainer.policy.optimizer.state.values()]
        assert len(moments) == len(list(trainer.policy.model.parameters()))
        assert all(float(s["step"]) == 2 for s in trainer.policy.optimizer.state.values())
        assert any(m.abs().sum() > 0 for m in moments)
        assert len(trainer.fit()) == 1
    finally:
        trainer.close()
    err = capsys.readouterr().err
    assert "saved with 2 ranks, resuming with 1" in err and "not as an exact continuation" in err
    assert checkpoint.verify_checkpoint(str(save / "rollout_000003")) == (3, None)

    # relax export: the same model as the final save of step 2, as a Hugging Face directory
    out = tmp_path / "exported"
    assert main(["export", str(ckpt), str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert sorted(exported) == sorted(want)
    assert all(torch.equal(exported[k], want[k]) for k in want)
    assert {"config.json", "tokenizer.json"} <= set(os.listdir(out))
    assert main(["export", str(ckpt), str(out)]) == 2  # never into a non-empty directory
    assert "OUTPUT_DIR" in capsys.readouterr().err
    assert main(["eval", str(ckpt)]) == 2  # shards, not a model: says to export it first
    assert "relax export CHECKPOINT OUTPUT_DIR" in capsys.readouterr().err


def _tiny(seed=0):
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.arange(6).view(1, 6)).logits.sum().backward()
    optimizer.step()
    return tokenizer, model, optimizer


def test_async_save_counts_only_once_complete_and_holds_the_step_it_started_at(tmp_path):
    save, crashed = tmp_path / "save", tmp_path / "crashed"
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    tokenizer, model, optimizer = _tiny()
    policy = Policy(model=model, optimizer=optimizer, tokenizer=tokenizer, ctx=ctx)
    saver = checkpoint.Checkpointer(str(save), ctx, policy, fsdp=False, async_save=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    target = saver.save(1, meta={"progress": {}})
    with torch.no_grad():  # the next step changes the weights while the write may still run
        for p in model.parameters():
            p.add_(1.0)
    # written or not, it is not a checkpoint until it is published (manifest, rename)
    assert not os.path.exists(target) and checkpoint.latest_checkpoint(str(save)) is None
    saver.pending.future.result()
    # killed now: shards and .metadata complete, no manifest, no rename -> never loaded,
    # removed when the next run starts
    shutil.copytree(save, crashed)
    assert os.path.isfile(crashed / ".tmp-1" / ".metadata")
    assert checkpoint.latest_checkpoint(str(crashed)) is None
    checkpoint.remove_stale_temps(str(crashed))
    assert not os.path.exists(crashed / ".tmp-1")

    saver.poll()
    assert checkpoint.latest_checkpoint(str(save)) == (target, 1)
    _, fresh, fresh_optimizer = _tiny(seed=5)
    sharded_state.load_sharded(target, fresh, fresh_optimizer, fsdp=False)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, before[name]), name
    for mine, saved in zip(fresh_optimizer.state.values(), optimizer.state.values(),
                           strict=True):
        assert torch.equal(mine["exp_avg"], saved["exp_avg"])


def test_async_and_checksummed_runs_train_like_a_plain_run(tmp_path):
    """Saving never changes training: --async-save and --checkpoint-checksums runs log the
    same metrics as a run without them, and their checkpoints resume (checksums checked)."""
    reward = write_gate_reward(tmp_path)
    flags = [*SMALL, "--custom-rm-path", reward, "--num-rollout", "3"]
    runs = {}
    for name, extra in (("plain", []), ("async", ["--async-save", "--save-interval", "1",
                                                   "--checkpoint-checksums", "--keep-last",
                                                   "2"])):
        cfg = make_config(*flags, *extra, *(["--save", str(tmp_path / name)] if extra else []),
                          tiny=False, output_dir=tmp_path / f"{name}-run")
        trainer = Trainer(cfg, init_distributed("cpu"), console=False)
        try:
            runs[name] = trainer.fit()
        finally:
            trainer.close()
    for got, want in zip(runs["async"], runs["plain"], strict=True):
        assert {k: v for k, v in got.items() if not k.startswith("perf/")} == pytest.approx(
            {k: v for k, v in want.items() if not k.startswith("perf/")}, rel=1e-6, abs=1e-6)
    save = tmp_path / "async"
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("rollout")) == [
        "rollout_000002", "rollout_000003"]
    meta = json.loads((save / "rollout_000003" / checkpoint.MARKER).read_text())
    assert all("sha256" in f for f in meta["files"].values())
    assert checkpoint.latest_checkpoint(str(save), checksums=True) == (
        str(save / "rollout_000003"), 3)


@pytest.mark.subprocess
def test_one_process_checkpoint_resumes_on_two_fsdp_ranks(tmp_path, capsys):
    """The other direction: saved by one process, continued by two FSDP2 ranks (each reads
    only its half); switching --fsdp at the same world size is named as well."""
    save = tmp_path / "save"
    flags = [*SMALL, "--custom-rm-path", write_gate_reward(tmp_path), "--rollout-batch-size",
             "4"]
    first = make_config(*flags, "--num-rollout", "2", "--fsdp", "--save", str(save),
                        tiny=False, output_dir=tmp_path / "run")
    trainer = Trainer(first, init_distributed("cpu"), console=False)
    try:
        trainer.fit()
    finally:
        trainer.close()
    switched = make_config(*flags, "--num-rollout", "3", "--load", str(save), tiny=False,
                           output_dir=tmp_path / "switched")
    Trainer(switched, init_distributed("cpu"), console=False).close()
    assert "saved with --fsdp, resuming without" in capsys.readouterr().err

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = start_ranks([*flags, "--num-rollout", "3", "--fsdp", "--load", str(save), "--save",
                         str(save), "--output-dir", str(tmp_path / "two")], env)
    assert finish_all(ranks) == [0, 0], ranks[0].lines[-20:] + ranks[1].lines[-20:]
    assert any("saved with 1 ranks, resuming with 2" in x for x in ranks[0].lines)
    meta = json.loads((save / "rollout_000003" / checkpoint.MARKER).read_text())
    assert meta["world_size"] == 2
    assert sorted(n for n in meta["files"] if n.endswith(".distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
