"""Crash-safe checkpoints and exact resume (docs/reliability.md).

The main test kills ``relax train`` with SIGKILL inside rollout step 4 of 6 (after the
checkpoint of step 3), plants a truncated checkpoint for step 4, resumes, and requires every
metric of steps 4-6 to equal an uninterrupted run within 1e-6.
"""

import json
import os
import shutil
import signal

import pytest
import torch

from relax.errors import InputError
from relax.metrics.sinks import read_metrics
from relax.trainer.policy.bundle import Policy
from relax.trainer.state import checkpoint, resume
from tests.reliability.helpers import (
    BASELINE,
    SMALL,
    deterministic,
    finish,
    gate_env,
    read_rows,
    start_train,
    wait_for_file,
    write_gate_reward,
)
from tests.trainer.helpers import fit, make_config


def _assert_same(got: dict, want: dict, step: int) -> None:
    got, want = deterministic(got), deterministic(want)
    assert sorted(got) == sorted(want), step
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), (step, key)


@pytest.mark.subprocess
def test_kill_9_in_step_4_then_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    reward = write_gate_reward(tmp_path)
    save, out = tmp_path / "save", tmp_path / "run"
    flags = [*SMALL, *BASELINE, "--custom-rm-path", reward, "--num-rollout", "6", "--seed", "7"]
    # gate at the 4th reward call: steps 1-3 and their checkpoints are complete
    proc = start_train([*flags, "--save", str(save), "--save-interval", "1", "--keep-last", "2",
                        "--output-dir", str(out)], gate_env(tmp_path, at=4))
    wait_for_file(tmp_path / "gate_ready", proc)
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    assert proc.returncode == -signal.SIGKILL
    # --keep-last 2: only the two newest interval checkpoints remain
    # (besides the save directory's marker and its lock file, docs/reliability.md section 8)
    assert sorted(p.name for p in save.iterdir()
                  if p.name not in (".relax.lock", "relax_save_dir.json")) == [
        "rollout_000002", "rollout_000003"]
    assert [r["rollout/step"] for r in read_rows(out)] == [1, 2, 3]

    # a checkpoint of step 4 whose shard file was cut short (a disk that filled up, a copy
    # interrupted half way): it must be skipped with a message, never loaded
    bad = save / "rollout_000004"
    shutil.copytree(save / "rollout_000003", bad)
    meta = json.loads((bad / checkpoint.MARKER).read_text())
    meta["rollout_step"] = 4
    (bad / checkpoint.MARKER).write_text(json.dumps(meta))
    weights = bad / "__0_0.distcp"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    # and a row for step 4, as if the run had logged step 4 and died before checkpointing it
    rows = read_rows(out)
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({**rows[-1], "rollout/step": 4}) + "\n")

    resumed_cfg = make_config(*flags, "--load", str(save), "--save", str(save),
                              "--save-interval", "1", "--keep-last", "2", tiny=False,
                              output_dir=out)
    trainer, tail, _ = fit(resumed_cfg)
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "rollout_000004: __0_0.distcp has" in err
    assert trainer.start_step == 3 and len(tail) == 3
    assert "holds 1 rows of steps after 3 from the interrupted run" in err

    _, full, _ = fit(make_config(*flags, tiny=False, output_dir=tmp_path / "full"))
    for step, (got, want) in enumerate(zip(tail, full[3:], strict=True), start=4):
        _assert_same(got, want, step)
    # metrics.jsonl continued: step 4 is in the file twice, once in the final view, and the
    # final view equals the uninterrupted run's rows
    assert [r["rollout/step"] for r in read_rows(out)] == [1, 2, 3, 4, 4, 5, 6]
    rows = read_metrics(str(out))
    assert [r["rollout/step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    full_rows = read_metrics(str(tmp_path / "full"))
    for step, (got, want) in enumerate(zip(rows, full_rows, strict=True), start=1):
        _assert_same(got, want, step)
    # the planted step-4 checkpoint was replaced by a complete one, then pruned by --keep-last
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("rollout")) == [
        "rollout_000005", "rollout_000006"]
    assert checkpoint.verify_checkpoint(str(save / "rollout_000006")) == (6, None)


def _tiny_checkpoint(tmp_path, *flags, steps=2):
    reward = write_gate_reward(tmp_path)
    cfg = make_config(*SMALL, "--custom-rm-path", reward, "--num-rollout", str(steps),
                      "--save", str(tmp_path / "save"), "--save-interval", "1", *flags,
                      tiny=False, output_dir=tmp_path / "run")
    fit(cfg)
    return tmp_path / "save"


def test_partial_and_tampered_checkpoints_are_never_loaded(tmp_path, capsys):
    save = _tiny_checkpoint(tmp_path, "--checkpoint-checksums", steps=3)
    assert checkpoint.latest_checkpoint(str(save)) == (str(save / "rollout_000003"), 3)
    # no manifest: a save interrupted before its rename (a planted copy; a real one is a .tmp)
    (save / "rollout_000003" / checkpoint.MARKER).unlink()
    assert checkpoint.latest_checkpoint(str(save)) == (str(save / "rollout_000002"), 2)
    # DCP's .metadata missing: the shards cannot be read
    (save / "rollout_000002" / ".metadata").unlink()
    # a flipped byte of a shard, same size: only the checksums (on request) see it
    shard = save / "rollout_000001" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert checkpoint.latest_checkpoint(str(save)) == (str(save / "rollout_000001"), 1)
    assert checkpoint.latest_checkpoint(str(save), checksums=True) is None
    err = capsys.readouterr().err
    assert "rollout_000003: no relax_save.json" in err
    assert "rollout_000002: .metadata is missing" in err
    assert "rollout_000001: __0_0.distcp fails its SHA-256 checksum" in err
    # a leftover temporary directory of a killed save is not a checkpoint candidate
    shard.write_bytes(bytes(data[: len(data) // 2]))
    shutil.copytree(save / "rollout_000001", save / ".tmp-4")
    assert checkpoint.latest_checkpoint(str(save)) is None
    assert "rollout_000001: __0_0.distcp has" in capsys.readouterr().err


def test_a_corrupt_metadata_is_skipped_and_the_run_resumes_from_the_previous_one(tmp_path,
                                                                               capsys):
    save = _tiny_checkpoint(tmp_path, steps=2)
    metadata = save / "rollout_000002" / ".metadata"
    metadata.write_bytes(bytes(range(256)) * (metadata.stat().st_size // 256)
                         + b"x" * (metadata.stat().st_size % 256))  # same size, not a pickle
    capsys.readouterr()
    reward = write_gate_reward(tmp_path)
    cfg = make_config(*SMALL, "--custom-rm-path", reward, "--num-rollout", "3",
                      "--load", str(save), tiny=False, output_dir=tmp_path / "run")
    trainer, tail, _ = fit(cfg)
    assert trainer.start_step == 1 and len(tail) == 2
    err = capsys.readouterr().err
    assert "skipping checkpoint " + str(save / "rollout_000002") + ": corrupt .metadata" in err
    assert "Traceback" not in err and "does not fit" not in err


def test_loaded_state_is_safe(tmp_path):
    """Weights only from DCP tensors; every pickle read through weights_only=True or an
    allow-list (DCP's .metadata), so a planted payload is refused, never run."""
    from relax.trainer.state import sharded_state

    save = _tiny_checkpoint(tmp_path, steps=1)
    ckpt = save / "rollout_000001"
    meta = json.loads((ckpt / checkpoint.MARKER).read_text())
    assert {".metadata", "__0_0.distcp", "rank_00000.pt"} <= set(meta["files"])
    # a planted pickle weight file (which a model loader might pick up) voids the checkpoint
    (ckpt / "pytorch_model.bin").write_bytes(b"not listed in the manifest")
    assert checkpoint.verify_checkpoint(str(ckpt)) == (
        None, "unlisted pickle file pytorch_model.bin")
    (ckpt / "pytorch_model.bin").unlink()

    marker = tmp_path / "pwned"

    class Payload:  # unpickling this would run code; the readers must refuse it
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    from relax.trainer.distributed import DistContext

    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    torch.save({"rng": Payload()}, ckpt / "rank_00000.pt")
    with pytest.raises(InputError, match="rank_00000.pt is not a Relax trainer state"):
        sharded_state.read_rank_file(str(ckpt), 0)
    import pickle

    def short(text: str) -> bytes:
        return b"\x8c" + bytes([len(text)]) + text.encode()

    # os.system reached through the allowed module's own "import os" (a dotted global name)
    through = (b"\x80\x04" + short("torch.distributed.checkpoint.metadata") + short("os.system")
               + b"\x93" + short(f"touch {marker}") + b"\x85R.")
    for planted in (pickle.dumps(Payload()), through):
        (ckpt / ".metadata").write_bytes(planted)
        with pytest.raises(InputError, match="cannot read .metadata"):
            resume.load_trainer_state(
                str(ckpt), Policy(model=model, optimizer=optimizer, tokenizer=None, ctx=ctx),
                fsdp=False, ctx=ctx)
    assert not marker.exists()


def test_rng_state_round_trip_covers_python_numpy_torch():
    import random

    import numpy as np

    from relax.trainer.state.sharded_state import rng_state, set_rng_state

    state = rng_state()
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws


def test_torn_metrics_line_is_dropped_on_reopen(tmp_path, capsys):
    from relax.metrics.sinks import JsonlSink

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"rollout/step": 1, "a": 1.0}\n{"rollout/step": 2, "a"')
    sink = JsonlSink(str(path))
    sink.log(2, {"a": 2.0})
    sink.close()
    assert [r["a"] for r in read_metrics(str(path))] == [1.0, 2.0]
    assert "dropped a torn last line" in capsys.readouterr().err
