"""On-policy self-distillation's clipped generalized JSD (reinforce_plus_plus.md §7b, "Self
mode") against float64 references written here, which call none of the production math."""

import math

import pytest
import torch

from relax.algorithms.self_distillation import STAT_NAMES, generalized_jsd, opsd_token_terms


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True) if a > 0)


def _ref_jsd(p_s, p_t, beta):
    """JSD_beta from two probability lists, one Python float at a time."""
    if beta == 0:
        return _kl(p_t, p_s)
    if beta == 1:
        return _kl(p_s, p_t)
    m = [(1 - beta) * a + beta * b for a, b in zip(p_s, p_t, strict=True)]
    return beta * _kl(p_t, m) + (1 - beta) * _kl(p_s, m)


def _logits(probs):
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_hand_computed_jsd_on_a_three_token_vocabulary(beta):
    p_s, p_t = [0.5, 0.25, 0.25], [0.25, 0.5, 0.25]
    got = generalized_jsd(_logits(p_s) + 3.0, _logits(p_t) - 1.0, beta=beta)  # shift-invariant
    assert float(got[0]) == pytest.approx(_ref_jsd(p_s, p_t, beta), rel=1e-12)
    if beta == 0.5:  # the symmetric JSD written out: m = (3/8, 3/8, 1/4)
        by_hand = 0.5 * (0.25 * math.log(2 / 3) + 0.5 * math.log(4 / 3)) \
            + 0.5 * (0.5 * math.log(4 / 3) + 0.25 * math.log(2 / 3))
        assert float(got[0]) == pytest.approx(by_hand, rel=1e-12)


def test_clipped_jsd_and_its_statistics_by_hand():
    p_s, p_t = [0.7, 0.2, 0.1], [0.1, 0.2, 0.7]  # far apart: JSD_0.5 ~ 0.26
    close_s, close_t = [0.34, 0.33, 0.33], [0.33, 0.34, 0.33]  # ~ 1e-5
    s = torch.cat([_logits(p_s), _logits(close_s)])
    t = torch.cat([_logits(p_t), _logits(close_t)])
    clip = 0.05
    loss, stats = opsd_token_terms(s, t, torch.tensor([0, 1]), beta=0.5, clip=clip)
    far, near = _ref_jsd(p_s, p_t, 0.5), _ref_jsd(close_s, close_t, 0.5)
    assert far > clip > near
    assert loss.tolist() == pytest.approx([clip, near], rel=1e-12)
    col = {name: stats[:, i].tolist() for i, name in enumerate(STAT_NAMES)}
    assert col["jsd"] == pytest.approx([far, near], rel=1e-12)
    assert col["clipped"] == [1.0, 0.0]
    assert col["reverse_kl"] == pytest.approx([_kl(p_s, p_t), _kl(close_s, close_t)], rel=1e-12)
    assert col["teacher_logprob"] == pytest.approx([math.log(0.1), math.log(0.34)], rel=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_teacher_equal_to_student_gives_zero_and_no_gradient(beta):
    z = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)
    loss, stats = opsd_token_terms(z, z.detach().clone(), torch.arange(5), beta=beta, clip=1.0,
                                   temperature=0.7)
    assert loss.abs().max() < 1e-15 and stats[:, 2].abs().max() < 1e-15
    (grad,) = torch.autograd.grad(loss.sum(), z)
    assert grad.abs().max() < 1e-14


def _ref_loss(student, teacher, beta, clip, temperature):
    """sum over rows of min(JSD, clip), written with softmax as exp / sum (float64)."""
    def probs(z):
        e = torch.exp(z / temperature - (z / temperature).max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1, keepdim=True)

    p, q = probs(student), probs(teacher)
    if beta == 0:
        jsd = (q * (q.log() - p.log())).sum(-1)
    elif beta == 1:
        jsd = (p * (p.log() - q.log())).sum(-1)
    else:
        m = (1 - beta) * p + beta * q
        jsd = beta * (q * (q / m).log()).sum(-1) + (1 - beta) * (p * (p / m).log()).sum(-1)
    return torch.minimum(jsd, torch.full_like(jsd, clip)).sum()


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_gradients_match_a_float64_autograd_reference(beta):
    g = torch.Generator().manual_seed(3)
    student = (torch.randn(6, 9, generator=g, dtype=torch.float64) * 1.5).requires_grad_()
    scale = torch.tensor([0.05, 0.1, 0.3, 1.0, 2.0, 4.0], dtype=torch.float64)[:, None]
    teacher = student.detach() + torch.randn(6, 9, generator=g, dtype=torch.float64) * scale
    clip = 0.1  # near rows below it, far rows above
    loss, stats = opsd_token_terms(student, teacher, torch.zeros(6, dtype=torch.long),
                                   beta=beta, clip=clip, temperature=1.3)
    assert 0 < float(stats[:, 1].sum()) < 6, "the test needs clipped and unclipped rows"
    (got,) = torch.autograd.grad(loss.sum(), student)
    ref_student = student.detach().clone().requires_grad_()
    ref = _ref_loss(ref_student, teacher, beta, clip, 1.3)
    (want,) = torch.autograd.grad(ref, ref_student)
    assert float(loss.sum().detach()) == pytest.approx(float(ref.detach()), rel=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    clipped = stats[:, 1].bool()
    assert torch.equal(got[clipped], torch.zeros_like(got[clipped]))  # a clipped token: no grad


def test_the_teacher_gets_no_gradient_and_bad_arguments_are_refused():
    s = torch.randn(2, 4, requires_grad=True)
    t = torch.randn(2, 4, requires_grad=True)
    loss, _ = opsd_token_terms(s, t, torch.tensor([0, 1]), beta=0.5, clip=1.0)
    loss.sum().backward()
    assert t.grad is None and s.grad is not None and loss.dtype == torch.float32
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(s, t, beta=1.5)
    with pytest.raises(ValueError, match="clip"):
        opsd_token_terms(s, t, torch.tensor([0, 1]), beta=0.5, clip=0.0)
