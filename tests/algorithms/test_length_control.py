"""reinforce_plus_plus.md §7d against float64 values computed here: the soft overlong
punishment over the buffer before the limit, and the linear length penalty."""

import pytest
import torch

from relax.algorithms.length_control import length_penalty, overlong_penalty


def _ref_overlong(length, max_len, buffer, factor):
    start = max_len - buffer
    if length <= start:
        return 0.0
    return -factor * min(length - start, buffer) / buffer


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
@pytest.mark.parametrize("max_len,buffer,factor", [(16, 4, 1.0), (16, 16, 0.5), (7, 1, 2.0)])
def test_overlong_penalty_equals_the_reference(max_len, buffer, factor, dtype):
    lengths = torch.arange(0, max_len + 3).to(dtype)  # 0 tokens, the limit, beyond it
    got = overlong_penalty(lengths, max_len=max_len, buffer=buffer, factor=factor)
    want = [_ref_overlong(int(x), max_len, buffer, factor) for x in lengths]
    assert got.tolist() == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert got[max_len].item() == pytest.approx(-factor)  # the factor at the limit
    assert got[max_len - buffer].item() == 0.0  # nothing before the buffer
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def test_length_penalty_equals_the_reference():
    lengths = torch.tensor([0, 1, 5, 10], dtype=torch.float64)
    got = length_penalty(lengths, max_len=10, coef=0.3)
    assert got.tolist() == pytest.approx([0.0, -0.03, -0.15, -0.3], rel=1e-12, abs=0)
