"""The tiny Qwen3-MoE under two Gloo ranks (DDP and FSDP2, whose ``fully_shard`` shards the
experts' 3-D parameters like any other weight) equals one process: one optimizer step's
parameters and metrics, with the router's aux loss and metrics and R3 replaying a
random routing record
(tests/trainer/workers.py ``one_step``)."""

import pytest
import torch

from tests.distributed_utils import run_distributed
from tests.trainer.workers import B, one_step, one_step_cases

pytestmark = pytest.mark.subprocess

# (estimator, per_token, fsdp, micro batch, inert, shared prompts, tied, off_policy,
#  recompute, layout, opsd, correction, moe, router_coef, replay): with the router's aux loss and
#  metrics, and R3 of a random routing record
CASES = {fsdp: ("grpo", False, fsdp, B // 4, False, True, True, False, None, "packed",
                False, False, True, 0.05, True) for fsdp in (False, True)}


def test_two_ranks_equal_one_process_under_ddp_and_fsdp2():
    # the aux loss is a product of per-micro-batch shares (Megatron-LM's, too): the one
    # process cuts the same micro-batches of 2 rows as the two ranks
    ref_params, ref_hist = one_step("grpo", False, False, B // 4, False, True, moe=True,
                                    layout="packed", router_coef=0.05, replay=True)
    assert any("experts.gate_up_proj" in n for n in ref_params)
    assert {"train/moe_aux_loss", "train/moe_expert_load_max",
            "train/moe_router_entropy"} <= ref_hist[0].keys()
    results = run_distributed(one_step_cases, 2, CASES, timeout=240)
    for rank, per_case in enumerate(results):
        for fsdp, (status, value) in per_case.items():
            assert status == "ok", f"rank {rank} fsdp={fsdp}:\n{value}"
            params, hist = value
            for name, p in ref_params.items():
                torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
            for name, v in ref_hist[0].items():
                if not name.startswith("perf/"):
                    assert hist[0][name] == pytest.approx(v, rel=1e-5, abs=1e-7), name
