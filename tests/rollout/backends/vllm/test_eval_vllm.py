"""``relax eval --rollout-backend vllm``: a real vLLM server on the checkpoint's weights.
Greedy decoding gives Relax's engine's metrics (fp32: ties between candidates are out of
reach of the two backends' rounding on this model); the server and its copy of the weights
are gone afterwards; its flags need the backend. ``relax eval --env`` on vLLM:
tests/rollout/backends/vllm/test_vllm_modes.py."""

from __future__ import annotations

import json

import pytest

from tests.eval.test_eval_command import call
from tests.rollout.backends.vllm.test_vllm_server import VLLM_PYTHON, build_model_dir
from tests.rollout.backends.vllm.test_vllm_train import gone, server_group


@pytest.mark.subprocess
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="the vLLM environment is absent: `make "
                    "vllm` builds it (`make test` does)")
def test_greedy_vllm_evaluation_equals_relax_engine(tmp_path):
    ckpt = str(build_model_dir(tmp_path / "ckpt", seed=3))
    argv = [ckpt, "--eval-temperature", "0", "--n-samples-per-eval-prompt", "1",
            "--eval-max-response-len", "12", "--eval-pass-threshold", "0.2"]
    code, out, err = call(["eval", *argv])
    assert (code, err) == (0, ""), err
    relax = json.loads(out)
    code, out, err = call(["eval", *argv, "--rollout-backend", "vllm",
                           "--output-dir", str(tmp_path / "ev")])
    assert (code, err) == (0, ""), err
    vllm = json.loads(out)
    relax.pop("perf/eval_time"), vllm.pop("perf/eval_time")
    assert vllm == pytest.approx(relax, abs=1e-12)
    assert gone(server_group(tmp_path / "ev" / "vllm-server0.log"))
    assert not (tmp_path / "ev" / "vllm-weights-rank0").exists()


@pytest.mark.parametrize("args, needle", [
    (["--vllm-url", "http://127.0.0.1:8000"], "--vllm-url http://127.0.0.1:8000: has no effect"),
    (["--rollout-backend", "vllm", "--vllm-url", "127.0.0.1:8000"], "http(s) URL"),
])
def test_eval_backend_rules_are_one_line(tiny_checkpoint, args, needle):
    code, out, err = call(["eval", tiny_checkpoint, *args])
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert needle in err, err


def test_unreachable_url_is_exit_2(tiny_checkpoint):
    code, out, err = call(["eval", tiny_checkpoint, "--rollout-backend", "vllm", "--vllm-url",
                           "http://127.0.0.1:9"])
    assert code == 2 and out == "", err
    assert err == "relax eval: error: --vllm-url http://127.0.0.1:9: no vLLM server answers " \
                  "there (GET /health); start it or correct the URL\n"
