"""relax/trainer/state/checkpoint.py in one process: the Checkpointer's save, poll, keep-last and
final save, and the helpers around it (latest_checkpoint, verify_checkpoint, check_save_dir,
remove_stale_temps). The real-process cases (kill -9, signals, several ranks) live in
tests/reliability/."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch

from relax.errors import InputError, RelaxError
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext
from relax.trainer.policy.bundle import Policy
from relax.trainer.state import checkpoint, sharded_state
from relax.trainer.state.checkpoint import (
    MARKER,
    Checkpointer,
    check_save_dir,
    latest_checkpoint,
    remove_stale_temps,
    step_dir,
    verify_checkpoint,
)
from relax.trainer.state.resume import load_trainer_state

CTX = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), group=None)
META = {"progress": {"seed": 1234, "cursor": 7}, "advantage_estimator": "grpo"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def state(tokenizer):
    """A tiny model and an AdamW that has taken one step (so it has moments to save)."""
    model = build_tiny_model(tokenizer, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return {"model": model, "optimizer": optimizer, "tokenizer": tokenizer}


def _checkpointer(save, state: dict, **kw) -> Checkpointer:
    """A Checkpointer of the state's model and optimizer (a full fine-tuning policy)."""
    policy = Policy(model=state["model"], optimizer=state["optimizer"],
                    tokenizer=state["tokenizer"], ctx=CTX)
    return Checkpointer(None if save is None else str(save), CTX, policy, fsdp=False, **kw)


def _meta(step: int) -> dict:
    return {**META, "progress": {**META["progress"], "step": step}}


def _save(ck: Checkpointer, step: int, state: dict, **kw) -> str:
    return ck.save(step, meta=_meta(step), **kw)


def _load(path: str, model, optimizer) -> dict:
    policy = Policy(model=model, optimizer=optimizer, tokenizer=None, ctx=CTX)
    return load_trainer_state(path, policy, fsdp=False, ctx=CTX)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_save_is_complete_listed_and_loads_back_exactly(tmp_path, state):
    save = str(tmp_path / "save")
    path = _save(_checkpointer(save, state), 3, state)
    assert path == step_dir(save, 3) == os.path.join(save, "rollout_000003")
    assert sorted(os.listdir(save)) == ["rollout_000003"]  # no .tmp- left behind
    manifest = json.loads((tmp_path / "save" / "rollout_000003" / MARKER).read_text())
    assert manifest["kind"] == "checkpoint" and manifest["rollout_step"] == 3
    assert manifest["world_size"] == 1 and manifest["fsdp"] is False
    assert manifest["progress"] == {"seed": 1234, "cursor": 7, "step": 3}
    files = manifest["files"]
    for name in (sharded_state.METADATA, sharded_state.rank_file(0), "config.json"):
        assert files[name]["size"] == os.path.getsize(os.path.join(path, name))
    assert not any("sha256" in f for f in files.values())  # sizes only without checksums
    assert verify_checkpoint(path) == (3, None)
    assert latest_checkpoint(save) == (path, 3)

    saved = _weights(state["model"])
    moments = state["optimizer"].state_dict()["state"]
    with torch.no_grad():
        for p in state["model"].parameters():
            p.add_(1.0)
    state["optimizer"].state.clear()
    progress = _load(path, state["model"], state["optimizer"])
    assert progress == {"seed": 1234, "cursor": 7, "step": 3}
    for name, value in _weights(state["model"]).items():
        assert torch.equal(value, saved[name]), name
    restored = state["optimizer"].state_dict()["state"]
    assert restored.keys() == moments.keys()
    for k in moments:
        assert torch.equal(restored[k]["exp_avg"], moments[k]["exp_avg"])


def test_checksums_are_recorded_and_checked(tmp_path, state):
    save = str(tmp_path / "save")
    path = _save(_checkpointer(save, state, checksums=True), 1, state)
    files = json.loads(open(os.path.join(path, MARKER)).read())["files"]
    assert all(len(f["sha256"]) == 64 for f in files.values())
    config = os.path.join(path, "config.json")
    text = open(config).read()
    flipped = text.replace('"', "'", 1)  # same size, other bytes: only a checksum sees it
    assert len(flipped) == len(text) and flipped != text
    open(config, "w").write(flipped)
    assert verify_checkpoint(path) == (1, None)
    assert verify_checkpoint(path, checksums=True) == (None, "config.json fails its SHA-256 "
                                                             "checksum")


def test_keep_last_prunes_older_checkpoints_but_not_later_ones(tmp_path, state):
    save = tmp_path / "save"
    later = save / "rollout_000009"  # an interrupted earlier run that got further
    later.mkdir(parents=True)
    (later / "leftover").write_text("x")
    ck = _checkpointer(str(save), state, keep_last=2)
    for step in (1, 2, 3, 4):
        _save(ck, step, state)
    assert sorted(os.listdir(save)) == ["rollout_000003", "rollout_000004", "rollout_000009"]
    assert latest_checkpoint(str(save), report=False) == (str(save / "rollout_000004"), 4)


def test_the_same_step_is_saved_once_and_a_repeated_step_replaces_the_old(tmp_path, state):
    save = str(tmp_path / "save")
    ck = _checkpointer(save, state)
    path = _save(ck, 2, state)
    stamp = os.stat(os.path.join(path, MARKER)).st_mtime_ns
    assert _save(ck, 2, state, blocking=True) == path  # a signal right after an interval save
    assert os.stat(os.path.join(path, MARKER)).st_mtime_ns == stamp
    # a resumed run saves step 2 again: the new checkpoint replaces the old in one rename
    with torch.no_grad():
        next(state["model"].parameters()).add_(1.0)
    _save(_checkpointer(save, state), 2, state)
    assert sorted(os.listdir(save)) == ["rollout_000002"]  # no .old- directory left
    fresh = build_tiny_model(state["tokenizer"], seed=1)
    _load(path, fresh, torch.optim.AdamW(fresh.parameters()))
    assert torch.equal(next(fresh.parameters()), next(state["model"].parameters()))


def test_an_async_save_appears_only_when_polled_or_waited_for(tmp_path, state):
    save = tmp_path / "save"
    ck = _checkpointer(str(save), state, async_save=True)
    target = _save(ck, 1, state)
    assert target == step_dir(str(save), 1)
    # the shards are written in the background; the rename happens on the trainer's thread
    assert not os.path.exists(target) and latest_checkpoint(str(save), report=False) is None
    ck.pending.future.result()
    ck.poll()
    assert verify_checkpoint(target) == (1, None) and ck.pending is None
    target = _save(ck, 2, state)
    assert not os.path.exists(target)
    ck.wait()
    assert latest_checkpoint(str(save)) == (target, 2)
    ck.poll()  # nothing pending: no error
    ck.wait()


def test_save_final_writes_the_last_checkpoint_and_a_hugging_face_model(tmp_path, state):
    from transformers import AutoModelForCausalLM

    save = tmp_path / "save"
    ck = _checkpointer(str(save), state)
    assert ck.save_final(5, meta=META) == str(save)
    assert verify_checkpoint(str(save / "rollout_000005")) == (5, None)
    manifest = json.loads((save / MARKER).read_text())
    assert manifest["kind"] == "model" and manifest["rollout_step"] == 5
    assert "model.safetensors" in manifest["files"] and (save / "tokenizer.json").is_file()
    assert not [d for d in os.listdir(save) if d.startswith(".tmp")]
    loaded = AutoModelForCausalLM.from_pretrained(str(save))
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, state["model"].state_dict()[name]), name
    # the final model is not trainer state: --load DIR resumes its last checkpoint
    assert latest_checkpoint(str(save)) == (str(save / "rollout_000005"), 5)
    # a second final save of a step saved already does not write that checkpoint again
    stamp = os.stat(save / "rollout_000005" / MARKER).st_mtime_ns
    ck.save_final(5, meta=META)
    assert os.stat(save / "rollout_000005" / MARKER).st_mtime_ns == stamp


def test_a_failed_write_names_the_last_complete_checkpoint(tmp_path, state, monkeypatch):
    save = str(tmp_path / "save")
    ck = _checkpointer(save, state)
    _save(ck, 2, state)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.sharded_state, "save_sharded", full_disk)
    with pytest.raises(RelaxError) as failed:
        _save(ck, 3, state)
    assert str(failed.value) == (
        f"--save {save}: writing the checkpoint of rollout step 3 failed (No space left on "
        f"device); the last complete checkpoint is {step_dir(save, 2)} (step 2); free space "
        f"and continue with --load {save}")
    assert sorted(os.listdir(save)) == ["rollout_000002"]  # the half-written one is gone
    # an error that is not a failed write stays what it is
    monkeypatch.setattr(checkpoint.sharded_state, "save_sharded",
                        lambda *a, **k: (_ for _ in ()).throw(KeyError("bug")))
    with pytest.raises(KeyError):
        _save(ck, 4, state)


def _complete(tmp_path, state, steps) -> str:
    save = str(tmp_path / "save")
    ck = _checkpointer(save, state)
    for step in steps:
        _save(ck, step, state)
    return save


def test_latest_checkpoint_falls_back_past_broken_ones_and_says_why(tmp_path, state, capsys):
    save = _complete(tmp_path, state, (1, 2, 3, 4))
    os.remove(os.path.join(step_dir(save, 4), MARKER))  # interrupted before the rename
    with open(os.path.join(step_dir(save, 3), sharded_state.METADATA), "ab") as f:
        f.write(b"x")  # a file longer than the manifest says
    os.makedirs(os.path.join(save, "rollout_000007"))  # an empty directory of a later step
    assert latest_checkpoint(save) == (step_dir(save, 2), 2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"relax train: --load: skipping checkpoint {step_dir(save, 7)}: no "
                        f"{MARKER} (an interrupted save); falling back to the previous complete "
                        "one")
    assert f"{step_dir(save, 4)}: no {MARKER}" in lines[1]
    assert f"{step_dir(save, 3)}: .metadata has" in lines[2] and "bytes, expected" in lines[2]
    assert len(lines) == 3
    assert latest_checkpoint(save, report=False) == (step_dir(save, 2), 2)
    assert capsys.readouterr().err == ""
    for step in (1, 2):
        os.remove(os.path.join(step_dir(save, step), MARKER))
    assert latest_checkpoint(save, report=False) is None


@pytest.mark.parametrize("tamper,why", [
    (lambda m, p: m.update(format=2), "written by another Relax version (format 2); its model can "
                                          "still be used with --hf-checkpoint"),
    (lambda m, p: m.pop("files"), f"{MARKER} lists no files"),
    (lambda m, p: m["files"].pop("config.json"), f"{MARKER} does not list config.json"),
    (lambda m, p: m.update(world_size=2), f"{MARKER} does not list rank_00001.pt"),
    (lambda m, p: m["files"].update({"../outside": {"size": 1}}), "../outside is missing"),
    (lambda m, p: m["files"].update({"x": 3}), f"{MARKER} has a malformed entry for 'x'"),
    (lambda m, p: open(os.path.join(p, "pytorch_model.bin"), "wb").close(),
     "unlisted pickle file pytorch_model.bin"),
    (lambda m, p: m.pop("rollout_step"), f"unreadable {MARKER} (KeyError)"),
])
def test_verify_checkpoint_rejects_what_cannot_be_trusted(tmp_path, state, tamper, why):
    path = step_dir(_complete(tmp_path, state, (1,)), 1)
    with open(os.path.join(path, MARKER)) as f:
        manifest = json.load(f)
    tamper(manifest, path)
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump(manifest, f)
    assert verify_checkpoint(path) == (None, why)


def test_check_save_dir_accepts_only_new_empty_or_relax_directories(tmp_path, state):
    check_save_dir(None)
    check_save_dir(str(tmp_path / "new"))
    (tmp_path / "empty").mkdir()
    check_save_dir(str(tmp_path / "empty"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"^--save .*file: exists and is not a directory$"):
        check_save_dir(str(tmp_path / "file"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(InputError, match=rf"the directory is not empty and holds no Relax save "
                                         rf"\({MARKER} missing\); choose an empty or new"):
        check_save_dir(str(tmp_path / "other"))
    save = _complete(tmp_path, state, (1,))  # interval checkpoints only
    check_save_dir(save)
    os.remove(os.path.join(step_dir(save, 1), MARKER))  # ... none of them complete
    with pytest.raises(InputError, match="holds no Relax save"):
        check_save_dir(save)


def test_remove_stale_temps_drops_only_leftovers_of_killed_saves(tmp_path):
    save = tmp_path / "save"
    for name in (".tmp-3", ".tmp-final-123", "rollout_000002.old-1-2", "rollout_000002",
                 "adapter"):
        (save / name).mkdir(parents=True)
        (save / name / "f").write_text("x")
    (save / MARKER).write_text("{}")
    remove_stale_temps(str(save))
    assert sorted(os.listdir(save)) == ["adapter", MARKER, "rollout_000002"]
    remove_stale_temps(None)
    remove_stale_temps(str(tmp_path / "missing"))


def test_the_cadence_is_the_checkpointers(tmp_path, state):
    """maybe_save: an interval checkpoint when --save-interval divides the step, the final save
    on the last step; finish writes the final save once; a signal stop saves a new step only."""
    save = tmp_path / "save"
    ck = _checkpointer(save, state, save_interval=2)
    steps = [s for s in (1, 2, 3) if ck.maybe_save(s, lambda s=s: _meta(s), last=False)]
    assert steps == [2] and sorted(os.listdir(save)) == ["rollout_000002"]
    assert ck.maybe_save(4, lambda: _meta(4), last=True) == str(save)  # the last step: final
    assert verify_checkpoint(str(save / "rollout_000004")) == (4, None)
    stamp = os.stat(save / MARKER).st_mtime_ns
    assert ck.finish(4, lambda: _meta(4)) is None  # written already: not again
    assert os.stat(save / MARKER).st_mtime_ns == stamp
    assert ck.save_for_stop(4, lambda: _meta(4), new=False) == "; no new step to save"
    assert ck.save_for_stop(5, lambda: _meta(5), new=True) == (
        f"; checkpoint {step_dir(str(save), 5)}; continue with --load {save}")
    # without --save nothing is written and nothing is said
    none = _checkpointer(None, state)
    assert none.maybe_save(2, lambda: _meta(2), last=True) is None
    assert none.save_for_stop(2, lambda: _meta(2), new=True) == ""
