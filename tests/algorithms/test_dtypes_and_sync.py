"""reinforce_plus_plus.md §13 cross-cutting rules: output dtypes for low-precision inputs, and
no host sync.

Host-sync check: the normalization, the returns and the losses are run on ``meta``
tensors, which carry shapes and dtypes but no data. ``.item()``, ``bool(tensor)``,
``.tolist()`` or any Python branch on a tensor value raises there, so a pass shows the
code path forces no device-to-host synchronisation on valid inputs.
"""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from relax.config.sections import AlgorithmSection
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, random_mask

LOW = [torch.bfloat16, torch.float16]


def _inputs(dtype, B=4, T=6, seed=0):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=(1,))
    old = torch.tensor(rng.normal(-1.0, 0.5, size=(B, T))).to(dtype)
    lp = (old.double() + torch.tensor(rng.normal(0, 0.3, size=(B, T)))).to(dtype)
    A = torch.tensor(rng.normal(size=(B, T))).to(dtype)
    R = torch.tensor(rng.choice([0.0, 1.0], size=B)).to(dtype)
    return mask, old, lp, A, R


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_inputs_give_float32_outputs(dtype):
    mask, old, lp, A, R = _inputs(dtype)
    gi = torch.tensor([0, 0, 1, 1])
    # Reference on the same (rounded) values; tolerance of float32 outputs.
    checks = {
        "returns": (alg.reinforce_plus_plus_returns(R, old, lp, mask, kl_coef=0.1, gamma=0.9),
                    ref.rpp_returns(R, old, lp, mask, kl_coef=0.1, gamma=0.9)),
        "baseline": (alg.reinforce_plus_plus_baseline_advantages(R, gi, mask),
                     ref.baseline_advantages(R, gi, mask)),
        "group": (alg.group_relative_advantages(R, gi, mask),
                  ref.group_relative_advantages(R, gi, mask)),
        "normalize": (alg.masked_population_normalize(A, mask)[0],
                      ref.population_normalize([A], [mask])[0][0]),
        "whiten": (alg.masked_whiten(A, mask), ref.whiten([A], [mask])[0]),
        "ppo": (alg.ppo_clip_loss(lp, old, A, mask)[0], ref.ppo_clip_loss(lp, old, A, mask)[0]),
        "gspo": (alg.gspo_loss(lp, old, A, mask, eps_clip=0.2)[0],
                 ref.gspo_loss(lp, old, A, mask)[0]),
        "sapo": (alg.sapo_loss(lp, old, A, mask), ref.sapo_loss(lp, old, A, mask)),
        "rloo_advantages": (alg.rloo_advantages(R, gi, mask), ref.rloo_advantages(R, gi, mask)),
        "cispo": (alg.cispo_loss(lp, old, A, mask)[0], ref.cispo_loss(lp, old, A, mask)[0]),
        "rloo": (alg.rloo_loss(lp, A, mask), ref.rloo_loss(lp, A, mask)),
        "kl": (alg.approx_kl(lp, old, "k3"), ref.approx_kl(lp, old, "k3")),
    }
    for name, (got, expected) in checks.items():
        assert got.dtype == torch.float32, f"{name}: {dtype} input gave {got.dtype}"
        assert_ref(got, expected, torch.float32, what=name)


def test_dispatcher_bf16_inputs_float32_outputs():
    mask, old, lp, A, R = _inputs(torch.bfloat16, B=4)
    out = alg.compute_advantages_and_returns(
        AlgorithmSection(advantage_estimator="reinforce_plus_plus", normalize_advantages=True,
                              kl_coef=0.01), R, mask, old_log_probs=old, ref_log_probs=lp)
    assert out.advantages.dtype == torch.float32 and out.returns.dtype == torch.float32
    adv, returns, _ = ref.advantages_and_returns("reinforce_plus_plus", R, mask,
                                                 old_log_probs=old, ref_log_probs=lp,
                                                 normalize_advantages=True, kl_coef=0.01)
    assert_ref(out.advantages, adv, torch.float32)
    assert_ref(out.returns, returns, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_host_sync_in_normalization_returns_and_losses(dtype):
    B, T = 3, 5
    kw = dict(device="meta", dtype=dtype)
    v = torch.empty(B, T, **kw)
    lp = torch.empty(B, T, **kw).requires_grad_(True)
    mask = torch.empty(B, T, device="meta", dtype=torch.bool)
    R = torch.empty(B, **kw)

    a, stats = alg.masked_population_normalize(v, mask)
    assert a.shape == (B, T) and stats.count.dtype == torch.int64
    assert alg.masked_whiten(v, mask).shape == (B, T)
    for gamma in (1.0, 0.99):
        g = alg.reinforce_plus_plus_returns(R, v, v, mask, kl_coef=0.01, gamma=gamma)
        assert g.shape == (B, T)
    losses = [
        alg.ppo_clip_loss(lp, v, v, mask, eps_clip_c=3.0)[0],
        alg.gspo_loss(lp, v, v, mask, eps_clip=0.2)[0],
        alg.sapo_loss(lp, v, v, mask),
        alg.cispo_loss(lp, v, v, mask, eps_clip_high=0.28)[0],
        alg.rloo_loss(lp, v, mask),
    ]
    for pg in losses:
        loss = alg.response_mean(pg, mask, num_responses=7) + alg.token_mean(pg, mask)
        (grad,) = torch.autograd.grad(loss, lp)
        assert grad.shape == (B, T)
