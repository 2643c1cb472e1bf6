"""The ``RELAX_TEST_DEVICE`` hand-over of tests/algorithms/conftest.py, checked on the CPU.

benchmarks/gpu_check.sh runs the algorithm tests with the hook on CUDA, where nobody watches
it; here the same wrapper runs with the CPU as the "device" (every CPU input is still copied),
so its containers, gradients and pass-through rules are checked by CI.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from tests.algorithms.conftest import back, move, on_device

CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class Pair:
    x: torch.Tensor
    tag: str


class Named(NamedTuple):
    a: torch.Tensor
    b: int


def test_inputs_are_copied_and_outputs_come_back_in_their_containers():
    seen = {}

    def fn(x, pair, named, items, *, scale):
        seen.update(x=x, pair=pair.x, named=named.a, item=items[0])
        return {"sum": x * scale + pair.x, "pair": Pair(x + 1, pair.tag), "named": named}

    x = torch.arange(3.0)
    out = on_device(fn, CPU)(x, Pair(torch.ones(3), "p"), Named(torch.zeros(2), 7),
                             [torch.ones(1)], scale=2.0)
    # the function saw copies, never the caller's storage
    assert seen["x"].data_ptr() != x.data_ptr()
    assert all(t.device == CPU for t in seen.values())
    torch.testing.assert_close(out["sum"], torch.tensor([1.0, 3.0, 5.0]))
    assert isinstance(out["pair"], Pair) and out["pair"].tag == "p"
    assert isinstance(out["named"], Named) and out["named"].b == 7


def test_gradients_flow_back_to_the_callers_leaves():
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    loss = on_device(lambda t: (t ** 2).sum(), CPU)(x)
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_meta_tensors_and_non_tensors_pass_through():
    meta = torch.empty(2, 3, device="meta")
    moved = []
    assert move(meta, CPU, moved) is meta and not moved
    assert move(("a", 1, None), CPU, moved) == ("a", 1, None) and not moved
    assert back(meta, CPU) is meta


def test_the_wrapper_marks_the_original_function():
    def fn(x):
        return x

    wrapped = on_device(fn, CPU)
    assert wrapped.__wrapped_for_device__ is fn and wrapped.__name__ == "fn"
