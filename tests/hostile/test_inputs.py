"""Every input path ends in one line: invalid text in data and flags, broken model
directories and checkpoints, out-of-range timeouts, a half-set distributed environment, a
huge data line, evaluation prompts beyond the context, and relax plot on bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.hostile.helpers import SMALL, env, one_error_line, relax, write

pytestmark = pytest.mark.subprocess  # every test here starts `relax` processes (conftest.py)

ROW = {"input": "ab=", "label": "ab"}


def jsonl(path, *rows):
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


def test_lone_surrogates_in_data_eval_data_and_flags(model_dir, tmp_path):
    # a JSON \ud800 escape decodes to a lone surrogate: valid JSON, invalid text
    bad = write(tmp_path / "bad.jsonl", json.dumps(ROW) + "\n" + '{"input": "x\\ud800=", '
                '"label": "x"}\n')
    good = jsonl(tmp_path / "good.jsonl", ROW, ROW)
    base = [*SMALL, "--hf-checkpoint", model_dir, "--rm-type", "copy"]
    out = relax("train", *base, "--prompt-data", bad, "--output-dir", tmp_path / "o1")
    assert out.returncode == 2 and f"{bad}:2: key 'input': not valid UTF-8" in one_error_line(out)
    out = relax("train", *base, "--prompt-data", good, "--eval-interval", "1",
                "--eval-prompt-data", "e", bad, "--output-dir", tmp_path / "o2")
    assert out.returncode == 2 and "--eval-prompt-data e" in one_error_line(out)
    # an argument that is not UTF-8 reaches Python as a lone surrogate (surrogateescape)
    proc = subprocess.run([sys.executable.encode(), b"-m", b"relax", b"train", b"--num-rollout",
                           b"1", b"--system-prompt", b"caf\xe9", b"--dry-run"],
                          capture_output=True, timeout=120, env=env())
    assert proc.returncode == 2
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    assert len(err) == 1 and err[0].startswith("relax train: error: --system-prompt")
    assert "not valid UTF-8" in err[0]


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path):
    from relax.errors import InputError
    from relax.rollout.prompts.data import _jsonl_rows

    path = write(tmp_path / "big.jsonl", json.dumps(ROW) + "\n" + json.dumps(
        {"input": "x" * 5000, "label": "x"}) + "\n")
    with pytest.raises(InputError, match=r"big.jsonl:2: line longer than 0 MiB"):
        list(_jsonl_rows(str(path), max_line_bytes=1000))
    data = write(tmp_path / "huge.jsonl", '{"input": "' + "a" * (9 << 20) + '", "label": "a"}\n')
    out = relax("train", *SMALL, "--prompt-data", data, "--rm-type", "copy", "--hf-checkpoint",
                tmp_path / "missing", "--output-dir", tmp_path / "o", "--dry-run")
    assert out.returncode == 2  # the model check comes first in validation; now the real read:
    out = relax("train", *SMALL, "--prompt-data", data, "--rm-type", "copy",
                "--output-dir", tmp_path / "o")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "line longer than 8 MiB" in one_error_line(out)


def test_broken_model_directories(model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    data = jsonl(tmp_path / "d.jsonl", ROW, ROW)
    out = relax("train", *SMALL, "--hf-checkpoint", broken, "--prompt-data", data, "--rm-type",
                "copy", "--output-dir", tmp_path / "o1")
    assert out.returncode == 2 and "cannot load a causal LM" in one_error_line(out)
    out = relax("eval", broken, "--eval-prompt-data", data, "--rm-type", "copy")
    assert out.returncode == 2 and "cannot load a causal LM" in one_error_line(out, "eval")
    (broken / "config.json").write_text('{"model_type": "qwen3", "vocab')
    out = relax("train", *SMALL, "--hf-checkpoint", broken, "--prompt-data", data, "--rm-type",
                "copy", "--output-dir", tmp_path / "o2")
    assert out.returncode == 2 and "--hf-checkpoint" in one_error_line(out)


def test_malformed_manifest_and_foreign_trainer_state(tmp_path):
    import torch

    save = tmp_path / "save"
    assert relax("train", *SMALL, "--save", save, "--save-interval", "1",
                 "--output-dir", tmp_path / "o").returncode == 0
    step2 = save / "rollout_000002"
    manifest = json.loads((step2 / "relax_save.json").read_text())
    manifest["files"]["config.json"] = "not an entry"
    (step2 / "relax_save.json").write_text(json.dumps(manifest))
    out = relax("train", *SMALL, "--num-rollout", "3", "--load", save, "--save", save,
                "--output-dir", tmp_path / "o")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "malformed entry for 'config.json'" in out.stderr
    assert "resuming from" in out.stderr and "rollout_000001" in out.stderr
    # a rank state file from elsewhere, with a manifest that matches it
    step1 = save / "rollout_000001"
    torch.save({"optimizer": {"foo": 1}, "rng": "x"}, step1 / "rank_00000.pt")
    from relax.trainer.state.checkpoint import _list_files, _write_marker

    meta = json.loads((step1 / "relax_save.json").read_text())
    _write_marker(str(step1), {**meta, "files": _list_files(str(step1), checksums=False)})
    for d in save.iterdir():
        if d.name != "rollout_000001" and d.is_dir():
            import shutil

            shutil.rmtree(d)
    (save / "relax_save.json").unlink(missing_ok=True)
    out = relax("train", *SMALL, "--num-rollout", "3", "--load", save, "--save", save,
                "--output-dir", tmp_path / "o")
    assert out.returncode == 2
    assert "rank_00000.pt is not a Relax trainer state" in one_error_line(out)


@pytest.mark.parametrize("flags, head", [
    (["--reward-timeout", "1e300"], "--reward-timeout 1e+300"),
    (["--distributed-timeout-minutes", "1e12"], "--distributed-timeout-minutes 1e+12"),
])
def test_timeouts_out_of_range(flags, head):
    out = relax("train", *SMALL, *flags, "--dry-run")
    assert out.returncode == 2 and one_error_line(out).startswith(f"relax train: error: {head}")


def test_world_size_without_rank(tmp_path):
    out = relax("train", *SMALL, "--output-dir", tmp_path / "o", extra_env={"WORLD_SIZE": "2"})
    assert out.returncode == 2 and "needs RANK in 0..1" in one_error_line(out)


def test_eval_prompts_must_fit_the_context(model_dir, tmp_path):
    long = jsonl(tmp_path / "long.jsonl", {"input": "a" * 300 + "=", "label": "a"})
    data = jsonl(tmp_path / "d.jsonl", ROW, ROW)
    out = relax("train", *SMALL, "--hf-checkpoint", model_dir, "--prompt-data", data,
                "--rm-type", "copy", "--eval-interval", "1", "--eval-prompt-data", "e", long,
                "--output-dir", tmp_path / "o")
    assert out.returncode == 2
    line = one_error_line(out)
    assert "--eval-prompt-data e prompt 1" in line and "--eval-max-response-len" in line
    out = relax("eval", model_dir, "--eval-prompt-data", "e", long, "--rm-type", "copy")
    assert out.returncode == 2 and "exceeds the model context" in one_error_line(out, "eval")


def test_plot_on_bad_files_and_outputs(tmp_path):
    run = tmp_path / "run"
    write(run / "metrics.jsonl", '{"rollout/step": 1, "rollout/raw_reward": 0.5}\n')
    out = relax("plot", run, "--output", tmp_path)
    assert out.returncode == 2 and "is a directory" in one_error_line(out, "plot")
    (run / "metrics.jsonl").write_bytes(b'{"rollout/step": 1, "x": "\xff\xfe"}\n')
    out = relax("plot", run, "--output", tmp_path / "a.png")
    assert out.returncode == 2 and "not UTF-8 text" in one_error_line(out, "plot")
    write(run / "metrics.jsonl", '{"rollout/step": 1e400, "rollout/raw_reward": 0.5}\n'
          '{"rollout/step": 2, "rollout/raw_reward": 0.5}\n')
    out = relax("plot", run, "--output", tmp_path / "a.png")
    assert out.returncode == 2 and "metrics.jsonl:1" in one_error_line(out, "plot")
    write(run / "metrics.jsonl", '{"rollout/step": 1, "rollout/raw_reward": 1' + "0" * 400 +
          '}\n')
    blocker = write(tmp_path / "blocker", "x")
    out = relax("plot", run, "--output", blocker / "a.png")
    assert out.returncode == 2 and "cannot write the image" in one_error_line(out, "plot")
    out = relax("plot", run, "--output", tmp_path / "ok.png")
    assert out.returncode == 0 and os.path.getsize(tmp_path / "ok.png") > 0
