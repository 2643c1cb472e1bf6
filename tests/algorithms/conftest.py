"""Shared settings for the algorithm tests: a modest, deterministic hypothesis profile, and
``RELAX_TEST_DEVICE`` to run the functions under test on another device.

``RELAX_TEST_DEVICE=cuda pytest tests/algorithms`` (benchmarks/gpu_check.sh) wraps every
public function of ``relax.algorithms``: the CPU tensors a test passes in are copied to the
device (differentiably, so gradients flow back to the test's leaves), the function runs there,
and what it returns comes back to the CPU for the test's assertions against its float64
reference. The tests stay written for the CPU; the math they check runs on the device. Meta
tensors are left where they are (they test shapes and synchronisation, not values), and a call
that already receives device tensors (one algorithm function calling another) is not touched.
Unset, nothing is wrapped. The multi-process tests (Gloo) keep their ranks on the CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "relax",
    max_examples=75,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("relax")

DEVICE_VARIABLE = "RELAX_TEST_DEVICE"


def move(obj, device: torch.device, moved: list):
    """``obj`` with every CPU tensor in it (tuples, lists, dicts, dataclasses) copied to
    ``device``; appends to ``moved`` when anything was. A same-device copy is still a copy, so
    the CPU dry run (``RELAX_TEST_DEVICE=cpu``) exercises the same hand-over."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            return obj
        moved.append(True)
        return obj.to(device, copy=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple
        return type(obj)(*(move(v, device, moved) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(move(v, device, moved) for v in obj)
    if isinstance(obj, dict):
        return {k: move(v, device, moved) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: move(getattr(obj, f.name), device, moved)
                   for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def back(obj, device: torch.device):
    """``obj`` with every tensor on ``device`` returned to the CPU (same containers)."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu() if obj.device == device else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(back(v, device) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(back(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: back(v, device) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: back(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def on_device(fn, device: torch.device):
    """``fn`` run on ``device`` for CPU callers (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        moved = []
        args, kwargs = move(args, device, moved), move(kwargs, device, moved)
        out = fn(*args, **kwargs)
        return back(out, device) if moved else out

    wrapper.__wrapped_for_device__ = fn
    return wrapper


def wrap_public_functions(device: torch.device) -> list[str]:
    """Replace each public function of ``relax.algorithms`` (its ``__all__``) by
    :func:`on_device`; the tests call them as ``alg.name``. Returns the names wrapped."""
    import relax.algorithms as alg

    names = []
    for name in alg.__all__:
        fn = getattr(alg, name)
        if inspect.isfunction(fn) and not hasattr(fn, "__wrapped_for_device__"):
            setattr(alg, name, on_device(fn, device))
            names.append(name)
    return names


if os.environ.get(DEVICE_VARIABLE):
    TEST_DEVICE = torch.device(os.environ[DEVICE_VARIABLE])
    if TEST_DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{DEVICE_VARIABLE}={TEST_DEVICE}: no CUDA device is visible")
    # at conftest import, before the test modules bind anything from the package
    WRAPPED = wrap_public_functions(TEST_DEVICE)
