"""Fixtures shared across test packages, the machine limits the suite gives every run, and the
two tiers.

Tiers: a test that starts another process (``torchrun``, ``python -m relax``, a
multiprocessing spawn, an agent program, a shell recipe) carries the ``subprocess`` marker.
``make test-fast`` deselects those (``-m "not subprocess"``); ``make test`` runs everything.
The marker is enforced rather than trusted: a test without it that starts a process fails,
naming the marker, so the fast tier stays free of process start-ups as tests are added.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys

import pytest

# Known figures instead of the start-up benchmark of every in-process trainer (a 1024^3 matmul
# and a 128 MB copy; relax/trainer/perf/flops.py). Set in os.environ, so child processes inherit
# them. tests/trainer/perf/test_flops.py clears them where the measurement itself is under test.
MACHINE_LIMITS = {"RELAX_PEAK_TFLOPS": "1", "RELAX_MEMORY_BANDWIDTH_GBPS": "10"}
# One intra-op thread per process (the trainer's setup.cpu_threads honours it): the tiny
# model's products are too small to split, and two threads per process on a 2-core machine
# doubled tests/trainer/test_e2e.py's wall time (35 s vs 17 s with one). Child processes
# inherit it, as the multi-process helpers already set it for their ranks.
THREADS = {"OMP_NUM_THREADS": "1"}

MARKER = "subprocess"
_started: list[str] = []


def _recording(original, what):
    def wrapper(*args, **kwargs):
        _started.append(what(*args))
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original
    return wrapper


def _argv0(popen, args, *rest) -> str:
    return str(args if isinstance(args, (str, bytes)) else list(args)[:3])


def pytest_configure(config):
    for name, value in {**MACHINE_LIMITS, **THREADS}.items():
        os.environ.setdefault(name, value)
    if "torch" in sys.modules:  # imported before this ran: it read the variable already
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # every way this suite starts a process: subprocess.run/Popen (torchrun, python -m relax,
    # bash recipes, agent programs), multiprocessing (any start method), a bare fork
    subprocess.Popen._execute_child = _recording(subprocess.Popen._execute_child, _argv0)
    multiprocessing.process.BaseProcess.start = _recording(
        multiprocessing.process.BaseProcess.start, lambda p: f"multiprocessing {p.name}")
    os.fork = _recording(os.fork, lambda: "os.fork()")


def _check_tier(item) -> None:
    started, _started[:] = list(_started), []
    if started and item.get_closest_marker(MARKER) is None:
        pytest.fail(f"{item.nodeid} started a process ({started[0]}) but is not marked "
                    f"@pytest.mark.{MARKER}: mark it (or its module: pytestmark = "
                    f"pytest.mark.{MARKER}) so that `make test-fast` leaves it out",
                    pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _started.clear()
    result = yield  # a failed setup raises here and is reported as it is
    _check_tier(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _started.clear()
    result = yield
    _check_tier(item)
    return result


# Longest first. xdist hands out tests in collection order (after the xdist_group modules,
# which it sends first), so a long module collected late ran alone at the end while the other
# worker idled: the subprocess tier's last 15 % took a quarter of its 46 min in one measured
# run. These modules took longest in that run (seconds of test time summed over their
# slowest tests, 2 workers on 2 busy cores): fully_async 760, vllm_train 540, fully_async_modes
# 390, vllm_lora 117, vllm_fully_async 105, partial_rollout 117, critic 150, eval_vllm 78,
# fully_async_distill 69. They go first, then the rest of the subprocess tier, then the
# in-process tests, whose thousand short ones fill the last minutes on both workers. Only the
# order changes.
FIRST = [
    "tests/trainer/fully_async/test_fully_async.py",
    "tests/reliability/test_repeat_under_load.py",  # two runs at once beside a busy core
    "tests/rollout/backends/vllm/test_vllm_train.py",
    "tests/trainer/fully_async/test_fully_async_modes.py",
    "tests/trainer/terms/test_critic.py",
    "tests/rollout/backends/vllm/test_vllm_lora.py",
    "tests/trainer/test_partial_rollout.py",
    "tests/rollout/backends/vllm/test_vllm_fully_async.py",
    "tests/rollout/backends/vllm/test_eval_vllm.py",
    "tests/trainer/fully_async/test_fully_async_distill.py",
]


@pytest.hookimpl(trylast=True)  # after pytest-xdist's hook: _keep_groups checks its write
def pytest_collection_modifyitems(config, items):
    """Run the longest modules first (FIRST), then the other subprocess tests, then the rest;
    a stable sort, so each module keeps its own order. Then make sure ``xdist_group`` keeps
    its tests on one worker (_keep_groups)."""
    rank = {path: i for i, path in enumerate(FIRST)}

    def key(item):
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(FIRST)), item.get_closest_marker(MARKER) is None

    items.sort(key=key)
    _keep_groups(config, items)


def _keep_groups(config, items) -> None:
    """``--dist loadgroup`` keeps the tests of one ``xdist_group`` on one worker by the
    ``@group`` suffix that pytest-xdist (3.8) writes into each such test's node id on the
    workers. pytest 9.2 keeps the node id elsewhere (``item._id``), so that write no longer
    reaches it (a known pytest-xdist bug, reported upstream): nothing failed, the groups were
    spread over the workers, and each worker started a group's module-scoped server again (the fp32 vLLM
    server, the teacher, the Gloo ranks). Where the suffix is missing it is written where this
    pytest keeps the id; with a pytest that reads ``_nodeid``, xdist's own write stands."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's loadgroup workers
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(names)}")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The built-in tiny model and tokenizer saved as a Hugging Face directory (seed 0), for
    tests that run `relax` on a model directory. Read only: no test may write into it."""
    from relax.tiny_model import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler during the test, whatever the runner inherited: a suite
    started in the background by a shell without job control inherits SIGINT ignored, and
    the tests that stop on Ctrl-C are about Python's handler."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
