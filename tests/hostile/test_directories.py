"""Data loss: Relax writes only into directories that are new, empty or its own; never into
a model directory; one run per directory; a fresh run does not continue another run's save or
metrics; a full disk mid-run keeps the last complete checkpoint and names it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest

from tests.hostile.helpers import SMALL, env, one_error_line, relax, write


def snapshot(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


@pytest.mark.subprocess
def test_output_dir_pointed_at_a_model_directory_leaves_it_untouched(model_dir, tmp_path):
    before = snapshot(model_dir)
    for flags in (["--output-dir", model_dir], ["--hf-checkpoint", model_dir, "--output-dir",
                                                  model_dir, "--rm-type", "copy"]):
        out = relax("train", *SMALL, *flags)
        assert out.returncode == 2
        line = one_error_line(out)
        assert "--output-dir" in line
    assert snapshot(model_dir) == before


@pytest.mark.subprocess
def test_save_pointed_at_the_model_or_the_output_dir_is_refused(model_dir, tmp_path):
    out = relax("train", *SMALL, "--hf-checkpoint", model_dir, "--save", model_dir,
                "--output-dir", tmp_path / "o")
    assert out.returncode == 2 and "is the --hf-checkpoint model directory" in one_error_line(out)
    same = tmp_path / "same"
    out = relax("train", *SMALL, "--save", same, "--output-dir", same)
    assert out.returncode == 2 and "the same directory" in one_error_line(out)
    assert not same.exists()


@pytest.mark.subprocess
def test_foreign_directories_are_refused_before_any_write(tmp_path):
    home = tmp_path / "home"
    write(home / "notes.txt", "mine")
    for flag in ("--output-dir", "--save"):
        other = ["--output-dir", tmp_path / "o"] if flag == "--save" else []
        out = relax("train", *SMALL, flag, home, *other)
        assert out.returncode == 2
        assert "holds files Relax did not write (e.g. 'notes.txt')" in one_error_line(out)
        assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]


@pytest.mark.subprocess
def test_a_fresh_run_does_not_continue_another_runs_directories(tmp_path):
    save, first = tmp_path / "save", tmp_path / "first"
    assert relax("train", *SMALL, "--save", save, "--output-dir", first).returncode == 0
    saved = snapshot(save)
    out = relax("train", *SMALL, "--seed", "9", "--save", save, "--output-dir", tmp_path / "b")
    assert out.returncode == 2
    assert f"continue it with --load {save}" in one_error_line(out)
    out = relax("train", *SMALL, "--seed", "9", "--output-dir", first)
    assert out.returncode == 2 and "holds metrics.jsonl of an earlier run" in one_error_line(out)
    out = relax("train", *SMALL, "--output-dir", save)  # another run's save directory
    assert out.returncode == 2 and "holds files Relax did not write" in one_error_line(out)
    assert snapshot(save) == saved
    # continuing it is what --load is for
    out = relax("train", *SMALL, "--num-rollout", "3", "--load", save, "--save", save,
                "--output-dir", first)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.subprocess
def test_one_run_per_directory_and_no_stale_lock_after_a_kill(tmp_path):
    gate = write(tmp_path / "slow.py", "import time\ndef f(p, r, l):\n    time.sleep(600)\n"
                 "    return [0.0] * len(p)\n")
    out_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "relax", "train", *SMALL, "--output-dir",
                              str(out_dir), "--custom-rm-path", f"{gate}:f",
                              "--reward-timeout", "600"],
                             env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out_dir / "config.json").exists():
            assert first.poll() is None and time.monotonic() < deadline, "first run did not start"
            time.sleep(0.05)
        second = relax("train", *SMALL, "--output-dir", out_dir, "--load", tmp_path / "nope")
        assert second.returncode == 2  # --load missing: rejected by validation first
        second = relax("train", *SMALL, "--save", tmp_path / "s2", "--output-dir", out_dir)
        assert second.returncode == 2
        line = one_error_line(second)
        assert "in use by another relax run (pid " in line and f"{first.pid}" in line
    finally:
        first.kill()
        first.wait(timeout=60)
    # the kernel dropped the lock with the process: the directory can be continued at once
    os.remove(out_dir / "metrics.jsonl") if (out_dir / "metrics.jsonl").exists() else None
    again = relax("train", *SMALL, "--output-dir", out_dir)
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.subprocess
def test_unwritable_paths_are_refused_before_training(tmp_path):
    blocker = write(tmp_path / "file", "x")
    out = relax("train", *SMALL, "--save", blocker / "sub", "--output-dir", tmp_path / "o")
    assert out.returncode == 2 and "--save" in one_error_line(out)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "ro"
        locked.mkdir()
        locked.chmod(0o500)
        out = relax("train", *SMALL, "--output-dir", locked / "run")
        assert out.returncode == 2 and "cannot write there" in one_error_line(out)


def _limit_file_size():
    # real writes fail past 200 KB (EFBIG: Python ignores SIGXFSZ), as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


@pytest.mark.parametrize("saving", [[], ["--async-save"]], ids=["sync", "async"])
@pytest.mark.subprocess
def test_a_full_disk_mid_run_keeps_and_names_the_last_checkpoint(tmp_path, saving):
    """The tiny model's checkpoint is ~1.6 MB: the first interval save fails like a full disk
    (with --async-save on the writer thread, reported when the run waits for it)."""
    save = tmp_path / "save"
    proc = subprocess.run(
        [sys.executable, "-m", "relax", "train", *SMALL, "--save", str(save), "--save-interval",
         "1", *saving, "--output-dir", str(tmp_path / "o")], capture_output=True, text=True,
        timeout=180,
        env=env(), preexec_fn=_limit_file_size)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = one_error_line(proc)
    assert "writing the checkpoint of rollout step 1 failed" in line
    assert "no complete checkpoint was written" in line
    assert not [p for p in save.iterdir() if p.name.startswith((".tmp-", "rollout_"))]


def test_free_space_is_checked_for_one_checkpoint(tmp_path):
    from relax.errors import InputError
    from relax.rundirs import check_free_space

    check_free_space(str(tmp_path), 1000)
    with pytest.raises(InputError, match="one checkpoint needs about"):
        check_free_space(str(tmp_path), 10 ** 16)  # 120 PB


@pytest.mark.subprocess
def test_resume_must_continue_this_configuration(tmp_path):
    save, out = tmp_path / "save", tmp_path / "o"
    assert relax("train", *SMALL, "--num-rollout", "3", "--save", save,
                 "--output-dir", out).returncode == 0
    manifest = json.loads((save / "relax_save.json").read_text())
    cases = {
        ("--num-rollout", "2"): "at rollout step 3, beyond this run's 2 steps",
        ("--num-rollout", "4", "--seed", "7"): "trained with --seed 1234",
        ("--num-rollout", "4", "--advantage-estimator", "gspo"): "--advantage-estimator grpo",
    }
    for flags, words in cases.items():
        res = relax("train", *SMALL, *flags, "--load", save, "--save", save, "--output-dir", out)
        assert res.returncode == 2 and words in one_error_line(res), res.stderr[-1000:]
    assert json.loads((save / "relax_save.json").read_text()) == manifest  # untouched
    res = relax("train", *SMALL, "--num-rollout", "4", "--lr", "1e-3", "--load", save,
                "--save", save, "--output-dir", out)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "with changed settings: --lr 0.003 -> 0.001" in res.stderr


@pytest.mark.subprocess
def test_resume_with_another_model_is_refused(model_dir, tmp_path):
    from relax.tiny_model import build_tiny_model, build_tokenizer

    other = tmp_path / "other"
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0, hidden_size=32, head_dim=8).save_pretrained(other)
    tokenizer.save_pretrained(other)
    save = tmp_path / "save"
    base = [*SMALL, "--rm-type", "copy", "--prompt-data"]
    data = write(tmp_path / "d.jsonl", "\n".join(json.dumps({"input": f"{c}=", "label": c})
                                                 for c in "abcd") + "\n")
    assert relax("train", *base, data, "--hf-checkpoint", model_dir, "--save", save,
                 "--output-dir", tmp_path / "o").returncode == 0
    res = relax("train", *base, data, "--hf-checkpoint", other, "--num-rollout", "3",
                "--load", save, "--save", save, "--output-dir", tmp_path / "o")
    assert res.returncode == 2
    assert "the checkpoint's model differs from --hf-checkpoint" in one_error_line(res)
