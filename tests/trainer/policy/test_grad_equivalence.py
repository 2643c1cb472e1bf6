"""reinforce_plus_plus.md §7: the gradient of one optimizer step is the whole-batch gradient,
whatever the
micro-batch size and the data-parallel world size (DDP with a summing comm hook, FSDP2 with a
gradient divide factor of 1).

Every two-rank case of this module runs in ONE spawn of the two Gloo ranks (the module
fixture ``two_ranks``), one case after the other: starting the ranks costs more than the
steps. Each test then compares its own case with its one-process reference."""

import pytest
import torch

from tests.distributed_utils import run_distributed
from tests.trainer.workers import B, one_step, one_step_cases

MICRO = [
    ("reinforce_plus_plus_baseline", False, False),
    ("reinforce_plus_plus_baseline", False, True),
    ("gspo", True, False),
    ("cispo", True, False),  # the global token mean of reinforce_plus_plus.md §5a, §5b
    ("rloo", True, False),
]
# key -> one_step's arguments on each of the two ranks
CASES = {
    **{("micro", *case): (*case, B // 4) for case in MICRO},
    **{("shared", fsdp): ("grpo", False, fsdp, B // 4, False, True) for fsdp in (False, True)},
    **{("untied", fsdp): ("grpo", False, fsdp, B // 4, False, False, False)
       for fsdp in (False, True)},
    **{("inert", fsdp): ("grpo", False, fsdp, B // 4, True) for fsdp in (False, True)},
    ("off-policy",): ("grpo", False, False, B // 4, False, False, True, True),
    **{("correction", fsdp): ("grpo", False, fsdp, B // 4, False, False, True, True, None,
                              "shared-prefix", False, True) for fsdp in (False, True)},
    **{("opsd", fsdp): ("grpo", False, fsdp, B // 4, False, False, True, False, None,
                        "shared-prefix", True) for fsdp in (False, True)},
}


# under `make test`'s workers the tests sharing the fixture stay on one, so it spawns once
pytestmark = pytest.mark.xdist_group("grad-equivalence")


@pytest.fixture(scope="module")
def two_ranks():
    return run_distributed(one_step_cases, 2, CASES, timeout=240)


def _ranks(two_ranks, key) -> list:
    """Each rank's one_step result of case ``key``."""
    out = []
    for rank, results in enumerate(two_ranks):
        status, value = results[key]
        assert status == "ok", f"rank {rank} {key} raised:\n{value}"
        out.append(value)
    return out


def _compare(ref, got):
    ref_params, ref_hist = ref
    params, hist = got
    assert ref_params.keys() == params.keys()
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
    for key, value in ref_hist[0].items():
        if key.startswith("perf/"):
            continue  # how the work was done, not its result
        assert hist[0][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("estimator,per_token,fsdp", MICRO)
@pytest.mark.subprocess
def test_two_ranks_two_micro_batches_equal_one_process(two_ranks, estimator, per_token, fsdp):
    ref = one_step(estimator, per_token, False, B)  # 1 process x 1 micro-batch
    # the single-process reference actually moved the weights (the test can fail)
    first = one_step(estimator, per_token, False, B // 4)  # 1 process x 4 micro-batches
    _compare(ref, first)
    results = _ranks(two_ranks, ("micro", estimator, per_token, fsdp))
    for got in results:  # every rank holds the same weights after the step
        _compare(ref, got)


@pytest.mark.subprocess
def test_importance_correction_under_micro_batches_and_two_ranks(two_ranks):
    """reinforce_plus_plus.md §7a: the TIS weights and the OPSM mask are per token and per row,
    so the corrected step is the same whatever the micro-batches and the ranks."""
    ref = one_step("grpo", False, False, B, off_policy=True)
    plain = one_step("grpo", False, False, B)
    assert ref[1][0]["train/tis_clipfrac"] > 0  # both clips act on this batch
    assert 0 < ref[1][0]["train/opsm_masked_fraction"] < 1
    assert ref[1][0]["train/pg_loss"] != pytest.approx(plain[1][0]["train/pg_loss"])
    _compare(ref, one_step("grpo", False, False, B // 4, off_policy=True))
    for got in _ranks(two_ranks, ("off-policy",)):
        _compare(ref, got)


@pytest.mark.parametrize("fsdp", [False, True])
@pytest.mark.subprocess
def test_rollout_correction_under_micro_batches_and_two_ranks(two_ranks, fsdp):
    """reinforce_plus_plus.md §7c: every factor is a function of one row, so the corrected
    step is the same whatever the micro-batches and the ranks, under DDP and FSDP2."""
    ref = one_step("grpo", False, False, B, off_policy=True, correction=True)
    plain = one_step("grpo", False, False, B)
    metrics = ref[1][0]
    for name in ("train/rollout_is_truncated_fraction", "train/rollout_rs_masked_fraction",
                 "train/rollout_veto_fraction"):
        assert 0 < metrics[name] < 1, name  # every part acts on this batch, none on all of it
    assert metrics["train/pg_loss"] != pytest.approx(plain[1][0]["train/pg_loss"])
    _compare(ref, one_step("grpo", False, False, B // 4, off_policy=True, correction=True))
    for got in _ranks(two_ranks, ("correction", fsdp)):
        _compare(ref, got)


@pytest.mark.parametrize("fsdp", [False, True])
@pytest.mark.subprocess
def test_self_distillation_loss_under_micro_batches_and_two_ranks(two_ranks, fsdp):
    """reinforce_plus_plus.md §7b "Self mode": the clipped JSD is reduced like the policy loss
    (the global B), so micro-batches, chunks and two ranks (DDP, FSDP2) equal one process; its
    metrics too."""
    ref = one_step("grpo", False, False, B, opsd=True)
    plain = one_step("grpo", False, False, B)
    h = ref[1][0]
    assert h["train/opsd_jsd"] > 0 and 0 < h["train/opsd_jsd_clipfrac"] < 1
    assert h["train/loss"] == pytest.approx(plain[1][0]["train/loss"] + 0.7 * h["train/opsd_jsd"],
                                            rel=1e-6)
    _compare(ref, one_step("grpo", False, False, B // 4, opsd=True, layout="padded"))
    for got in _ranks(two_ranks, ("opsd", fsdp)):
        _compare(ref, got)


@pytest.mark.parametrize("fsdp", [False, True])
@pytest.mark.subprocess
def test_shared_prompt_forward_under_two_ranks(two_ranks, fsdp):
    """Rows that repeat a prompt run it once, in one pack per micro-batch (DDP and FSDP2 alike:
    one forward through the wrapper, one backward); both equal one process."""
    ref = one_step("grpo", False, False, B, False, True)
    results = _ranks(two_ranks, ("shared", fsdp))
    for got in results:
        _compare(ref, got)


@pytest.mark.parametrize("fsdp", [False, True])
@pytest.mark.subprocess
def test_untied_output_layer_under_two_ranks(two_ranks, fsdp):
    """An output layer of its own (not the embedding) gets its gradient through the chunked
    log-probs, outside the DDP forward (DDP), or keeps the model's head (FSDP2 shards it):
    both equal one process."""
    ref = one_step("grpo", False, False, B, False, False, False)
    assert "lm_head.weight" in ref[0]
    results = _ranks(two_ranks, ("untied", fsdp))
    for got in results:
        _compare(ref, got)


@pytest.mark.parametrize("fsdp", [False, True])
@pytest.mark.subprocess
def test_skipped_backward_of_zero_advantage_rows_keeps_the_step(two_ranks, fsdp):
    """Rank 1 holds only zero-advantage rows (its backward is skipped but for one row that
    joins the all-reduce with a zero gradient); the step still equals one process."""
    ref = one_step("grpo", False, False, B, True)
    results = _ranks(two_ranks, ("inert", fsdp))
    for got in results:
        _compare(ref, got)
    # rows 1 and 3 (no tokens) on rank 0; rows 5, 6, 7 on rank 1, which keeps row 4 active
    assert ref[1][0]["perf/backward_skipped_fraction"] == 6 / B
    skipped = 0.0 if fsdp else 5 / B
    assert results[0][1][0]["perf/backward_skipped_fraction"] == skipped


def test_reference_step_changes_parameters():
    from relax.tiny_model import build_tiny_model, build_tokenizer

    params, hist = one_step("grpo", False, False, B)
    initial = dict(build_tiny_model(build_tokenizer(), seed=7).named_parameters())
    moved = max((params[n] - p).abs().max().item() for n, p in initial.items())
    assert moved > 1e-3 and hist[0]["train/grad_norm"] > 0
