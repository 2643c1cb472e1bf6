"""``--fully-async`` with a mixture-of-experts policy and R3: the rollout rank's routing
record travels with its batches to the training rank (the update replays it: its replayed
mismatch is 0, a metric that exists only where records arrived), and the lagless run equals
the colocated one."""

import pytest

from relax.tiny_model import build_tiny_moe, build_tokenizer
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, read_metrics, write_reward

pytestmark = pytest.mark.subprocess  # torchrun (conftest.py)

# test_fully_async.py's run, on the tiny MoE
STEPS = ["--num-rollout", "3", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
         "--rollout-max-response-len", "8", "--rollout-temperature", "1.5", "--lr", "1e-2",
         "--device", "cpu", "--log-samples", "0", "--seed", "5"]
SKIP = ("perf/", "async/")


def _run(tmp_path, name, *flags, nproc):
    reward = write_reward(tmp_path)
    out = tmp_path / name
    proc = torchrun_relax(*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:parity",
                          *flags, "--output-dir", str(out), nproc=nproc, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return read_metrics(out)


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key in [k for k in w if not k.startswith(SKIP)]:
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-9), (g["rollout/step"], key)


def test_the_routing_record_travels_to_the_training_rank(tmp_path):
    tok = build_tokenizer()
    moe = tmp_path / "tiny_moe"
    build_tiny_moe(tok, seed=4).save_pretrained(moe)
    tok.save_pretrained(moe)
    flags = ["--hf-checkpoint", str(moe), "--use-rollout-routing-replay"]
    colocated = _run(tmp_path, "colocated", *flags, nproc=1)
    lagless = _run(tmp_path, "async", *flags, "--fully-async", "--max-staleness", "0", nproc=2)
    _same(lagless, colocated)
    for row in lagless:
        assert row["train/moe_replayed_routing_mismatch"] == 0.0
        assert 0.0 <= row["train/moe_routing_mismatch"] <= 1.0
