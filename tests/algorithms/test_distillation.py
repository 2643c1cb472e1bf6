"""On-policy distillation (reinforce_plus_plus.md §7b) against float64 references written here,
which call none of the production math: the reverse-KL advantage term, its masks, its metrics
in one process and over two real Gloo ranks."""

import math

import pytest
import torch

from relax.algorithms.distillation import distilled_advantages, opd_metrics, opd_reverse_kl
from tests.algorithms import opd_dist_worker as w
from tests.distributed_utils import run_distributed

NAN, INF = float("nan"), float("inf")


def _ref_advantages(base, student, teacher, mask, coef):
    """A - C * (s - t) on the valid tokens, 0 elsewhere, one Python float at a time."""
    B, T = len(mask), len(mask[0])
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if mask[i][t]:
                a = 0.0 if base is None else base[i][t]
                out[i][t] = a - coef * (student[i][t] - teacher[i][t])
    return torch.tensor(out, dtype=torch.float64)


def _ref_means(student, teacher, mask):
    d = [s - t for rs, rt, rm in zip(student, teacher, mask, strict=True)
         for s, t, m in zip(rs, rt, rm, strict=True) if m]
    q = [t for rt, rm in zip(teacher, mask, strict=True) for t, m in zip(rt, rm, strict=True) if m]
    n = len(d)
    return (sum(d) / n, sum(q) / n) if n else (0.0, 0.0)


def _batch(seed=0, B=4, T=6):
    g = torch.Generator().manual_seed(seed)
    student = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    teacher = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    base = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[1, 2] = False  # an internal hole
    mask[3] = False  # a fully masked response
    return base, student, teacher, mask


def test_teacher_equal_to_student_gives_zero_term():
    base, student, _, mask = _batch()
    assert torch.equal(distilled_advantages(None, student, student.clone(), mask, kl_coef=2.0),
                       torch.zeros_like(student))
    out = distilled_advantages(base, student, student.clone(), mask, kl_coef=2.0)
    assert torch.equal(out, torch.where(mask, base, 0.0))
    metrics = opd_metrics(student, student.clone(), mask)
    assert float(metrics["rollout/opd_reverse_kl"]) == 0.0


def test_hand_computed_reverse_kl_on_a_three_token_vocabulary():
    # student p = (1/2, 1/4, 1/4), teacher q = (1/4, 1/2, 1/4):
    # KL(p || q) = 1/2 ln 2 + 1/4 ln(1/2) + 0 = ln(2) / 4. The per-token term is the
    # single-sample estimate, so its expectation over the student's own tokens is that KL.
    p, q = [0.5, 0.25, 0.25], [0.25, 0.5, 0.25]
    student = torch.tensor([[math.log(x) for x in p]], dtype=torch.float64)
    teacher = torch.tensor([[math.log(x) for x in q]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    d = opd_reverse_kl(student, teacher, mask)
    assert d[0].tolist() == pytest.approx([math.log(2), -math.log(2), 0.0], abs=1e-15)
    expectation = sum(pi * di for pi, di in zip(p, d[0].tolist(), strict=True))
    assert expectation == pytest.approx(math.log(2) / 4, abs=1e-15)
    adv = distilled_advantages(None, student, teacher, mask, kl_coef=0.5)
    assert adv[0].tolist() == pytest.approx([-0.5 * math.log(2), 0.5 * math.log(2), 0.0])


@pytest.mark.parametrize("coef", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("with_base", [True, False])
def test_advantages_match_reference(coef, with_base):
    base, student, teacher, mask = _batch(seed=3)
    b = base if with_base else None
    out = distilled_advantages(b, student, teacher, mask, kl_coef=coef)
    expected = _ref_advantages(None if b is None else b.tolist(), student.tolist(),
                               teacher.tolist(), mask.tolist(), coef)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=1e-14)


def test_masked_positions_are_inert_even_with_nan_and_inf():
    base, student, teacher, mask = _batch(seed=5)
    student = torch.where(mask, student, NAN)
    teacher = torch.where(mask, teacher, -INF)
    base = torch.where(mask, base, INF)
    out = distilled_advantages(base, student, teacher, mask, kl_coef=1.0)
    assert torch.isfinite(out).all()
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    expected = _ref_advantages(base.tolist(), student.tolist(), teacher.tolist(),
                               mask.tolist(), 1.0)
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=1e-14)
    rkl, tlp = _ref_means(student.tolist(), teacher.tolist(), mask.tolist())
    m = opd_metrics(student, teacher, mask)
    assert float(m["rollout/opd_reverse_kl"]) == pytest.approx(rkl, rel=1e-12)
    assert float(m["rollout/teacher_logprob"]) == pytest.approx(tlp, rel=1e-12)


def test_term_is_detached_and_dtypes_follow_the_inputs():
    _, student, teacher, mask = _batch(seed=7)
    s32 = student.float().requires_grad_()
    out = distilled_advantages(None, s32, teacher.float(), mask, kl_coef=1.0)
    assert out.dtype == torch.float32 and not out.requires_grad
    assert distilled_advantages(None, student.bfloat16(), teacher.bfloat16(), mask,
                                kl_coef=1.0).dtype == torch.float32


def test_empty_mask_gives_zero_metrics():
    _, student, teacher, mask = _batch()
    m = opd_metrics(student, teacher, torch.zeros_like(mask))
    assert float(m["rollout/opd_reverse_kl"]) == 0.0 and float(m["rollout/teacher_logprob"]) == 0.0


def test_bad_arguments_name_themselves():
    base, student, teacher, mask = _batch()
    with pytest.raises(ValueError, match="kl_coef"):
        distilled_advantages(base, student, teacher, mask, kl_coef=-0.1)
    with pytest.raises(ValueError, match="teacher_log_probs"):
        distilled_advantages(base, student, teacher[:, :2], mask, kl_coef=1.0)
    with pytest.raises(ValueError, match="term="):
        distilled_advantages(base, student, teacher, mask, kl_coef=1.0, term="forward_kl")


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_two_gloo_ranks_equal_the_concatenated_population():
    results = run_distributed(w.worker, w.WORLD, timeout=90)
    student, teacher, mask = [], [], []
    for rank in range(w.WORLD):
        s, t, m = w.rank_data(rank)
        student += s.tolist()
        teacher += t.tolist()
        mask += m.tolist()
    rkl, tlp = _ref_means(student, teacher, mask)
    for rank, res in enumerate(results):
        assert res["rollout/opd_reverse_kl"] == pytest.approx(rkl, rel=1e-12), rank
        assert res["rollout/teacher_logprob"] == pytest.approx(tlp, rel=1e-12), rank
