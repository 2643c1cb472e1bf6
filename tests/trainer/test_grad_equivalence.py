"""SPEC 7: the gradient of one optimizer step is the whole-batch gradient, whatever the
micro-batch size and the data-parallel world size (DDP with a summing comm hook, FSDP2 with a
gradient divide factor of 1)."""

import pytest
import torch

from tests.distributed_utils import run_distributed
from tests.trainer.workers import B, one_step


def _compare(ref, got):
    ref_params, ref_hist = ref
    params, hist = got
    assert ref_params.keys() == params.keys()
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
    for key, value in ref_hist[0].items():
        assert hist[0][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(
    "estimator,per_token,fsdp",
    [
        ("reinforce_plus_plus_baseline", False, False),
        ("reinforce_plus_plus_baseline", False, True),
        ("gspo", True, False),
    ],
)
def test_two_ranks_two_micro_batches_equal_one_process(estimator, per_token, fsdp):
    ref = one_step(estimator, per_token, False, B)  # 1 process x 1 micro-batch
    # the single-process reference actually moved the weights (the test can fail)
    first = one_step(estimator, per_token, False, B // 4)  # 1 process x 4 micro-batches
    _compare(ref, first)
    results = run_distributed(one_step, 2, estimator, per_token, fsdp, B // 4, timeout=120)
    for got in results:  # every rank holds the same weights after the step
        _compare(ref, got)


def test_reference_step_changes_parameters():
    from relax.rollout.tiny_model import build_tiny_model, build_tokenizer

    params, hist = one_step("grpo", False, False, B)
    initial = dict(build_tiny_model(build_tokenizer(), seed=7).named_parameters())
    moved = max((params[n] - p).abs().max().item() for n, p in initial.items())
    assert moved > 1e-3 and hist[0]["train/grad_norm"] > 0
