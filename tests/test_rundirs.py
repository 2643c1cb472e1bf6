"""Every write goes where Relax may write (relax/rundirs.py): each flag that names a directory
Relax writes into is declared with ``option(writes=KIND)``, and ``relax train`` refuses such a
directory when it holds another program's files, naming the flag, before anything is written.
In-process (``relax.cli.main`` with a stand-in trainer that must never be reached)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import types

import pytest

from relax import rundirs
from relax.cli import main
from relax.config.schema import EvalConfig, TrainConfig
from relax.config.section import dest_of, leaves, written_dirs

# the flags naming a directory Relax writes into, each with what makes it valid and the file
# another program could hold there under the name Relax would write
WRITTEN = {
    "output_dir": ([], "config.json"),
    "save": ([], "rollout_000001"),
    "critic_save": (["--advantage-estimator", "ppo"], "critic.pt"),
}
# every other flag naming a path: Relax reads it, never writes into it
READ = {"hf_checkpoint", "ref_load", "prompt_data", "eval_prompt_data", "custom_rm_path",
        "custom_advantage_function_path", "custom_reward_post_process_path",
        "custom_tis_function_path", "dynamic_sampling_filter_path", "genrm_model_path",
        "genrm_prompt_template", "opd_teacher_load", "critic_load", "load", "checkpoint",
        "agent_command", "env"}
# str flags whose help mentions data or paths but that name no path
NOT_PATHS = {"input_key", "label_key", "opd_teacher_url", "opsd_privileged_info_key"}
_PATH_WORDS = ("dir", "file", "path", "save", "load", "checkpoint", "output", "data")


def _path_like(cls) -> set[str]:
    """The str-valued flags whose name or help says they name a file system path."""
    out = set()
    for _, f in leaves(cls):
        if "str" not in str(f.type) or f.metadata.get("choices"):
            continue
        text = f"{dest_of(f)} {f.metadata['help']}".lower()
        if any(word in text for word in _PATH_WORDS):
            out.add(dest_of(f))
    return out


def test_every_path_flag_is_declared_read_or_written():
    # a new flag naming an output path must carry option(writes=...) (and a row above)
    written = {dest_of(f) for cls in (TrainConfig, EvalConfig) for _, f in leaves(cls)
               if f.metadata.get("writes")}
    assert written == set(WRITTEN)
    undeclared = (_path_like(TrainConfig) | _path_like(EvalConfig)) - written - READ - NOT_PATHS
    assert not undeclared, f"declare these with option(writes=KIND) or add them to READ: " \
        f"{sorted(undeclared)}"
    # nothing read is declared written
    assert not READ & written


@pytest.fixture
def no_trainer(monkeypatch):
    """relax.trainer replaced by a module whose train() fails the test if reached."""
    module = types.ModuleType("relax.trainer")

    def train(cfg):
        raise AssertionError("the run started although a directory was refused")

    module.train = train
    monkeypatch.setitem(sys.modules, "relax.trainer", module)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["train", "--num-rollout", "1", *argv])
    return code, err.getvalue()


def _snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("dest", WRITTEN)
def test_a_foreign_directory_under_each_written_flag_is_refused(dest, tmp_path, no_trainer):
    extra, name = WRITTEN[dest]
    foreign = tmp_path / "foreign"
    (foreign / name).parent.mkdir(parents=True, exist_ok=True)
    if name.startswith("rollout_"):  # another program's folder named like a checkpoint
        (foreign / name).mkdir()
        (foreign / name / "weights.bin").write_bytes(b"theirs")
    else:
        (foreign / name).write_bytes(b"another program's file")
    others = {d: str(tmp_path / f"new-{d}") for d in WRITTEN if d != dest}
    argv = [*extra, f"--{dest.replace('_', '-')}", str(foreign)]
    for other, path in others.items():
        if other != "critic_save" or "ppo" in extra:
            argv += [f"--{other.replace('_', '-')}", path]
    before = _snapshot(tmp_path)
    code, err = _run(argv)
    flag = "--" + dest.replace("_", "-")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"relax train: error: {flag} {foreign}: "), err
    assert "Relax did not write" in err, err
    assert _snapshot(tmp_path) == before  # nothing written, created, locked or marked


def _release_locks() -> None:
    """Close the directory locks this process took (a run holds them until it exits)."""
    while rundirs._HELD:
        os.close(rundirs._HELD.pop())


def test_written_directories_are_claimed_as_relax_s_own_and_reused(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "relax.trainer", types.SimpleNamespace(train=lambda cfg: 0))
    argv = ["--advantage-estimator", "ppo", "--output-dir", str(tmp_path / "o"), "--save",
            str(tmp_path / "s"), "--critic-save", str(tmp_path / "c")]
    held = len(rundirs._HELD)
    assert _run(argv) == (0, "")
    assert len(rundirs._HELD) == held + 3  # each written directory locked
    _release_locks()
    assert (tmp_path / "c" / "relax_critic_dir.json").is_file()
    (tmp_path / "c" / "critic.pt").write_bytes(b"an earlier run's critic")
    (tmp_path / "o" / "config.json").unlink()  # a fresh run again (no metrics.jsonl)
    assert _run(argv) == (0, "")  # Relax's own critic directory: written over
    _release_locks()


def test_a_directory_a_live_run_holds_is_in_use_whatever_that_run_wrote(tmp_path, monkeypatch):
    """A run that has written its metrics.jsonl still holds its directory: a second run is
    told the directory is in use (by whom), not that it holds an earlier run's metrics (which
    depended on how far the first run had got: a test failed on it under load)."""
    monkeypatch.setitem(sys.modules, "relax.trainer", types.SimpleNamespace(train=lambda cfg: 0))
    out = tmp_path / "o"
    argv = ["--output-dir", str(out)]
    assert _run(argv) == (0, "")  # the first run claims it and holds its lock
    (out / "metrics.jsonl").write_text('{"rollout/step": 1}\n')
    code, err = _run(argv)
    assert code == 2 and "in use by another relax run (pid " in err, err
    assert f"pid {os.getpid()} " in err and "metrics.jsonl" not in err
    _release_locks()
    code, err = _run(argv)  # the holder gone: now it is an earlier run's directory
    assert code == 2 and "holds metrics.jsonl of an earlier run" in err, err


@pytest.mark.parametrize("first,second", [("output_dir", "critic_save"),
                                          ("save", "critic_save")])
def test_two_written_flags_on_one_directory_are_refused(first, second, tmp_path, no_trainer):
    same = str(tmp_path / "same")
    code, err = _run(["--advantage-estimator", "ppo", f"--{first.replace('_', '-')}", same,
                      f"--{second.replace('_', '-')}", same])
    assert code == 2 and "the same directory" in err and f"--{second.replace('_', '-')}" in err
    assert not (tmp_path / "same").exists()


def test_written_dirs_lists_the_set_fields_with_their_kinds(tmp_path):
    from relax.config import parse_train_config
    cfg = parse_train_config(["--advantage-estimator", "ppo", "--output-dir", "o",
                              "--critic-save", "c"], environ={})
    assert written_dirs(cfg) == (("--critic-save", "c", "critic"), ("--output-dir", "o", "output"))
    assert all(dataclasses.is_dataclass(c) for c in (TrainConfig, EvalConfig))
