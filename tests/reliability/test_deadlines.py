"""Every wait on user code or a service has a deadline (docs/reliability.md, "Deadlines"):
the shared runner of user code (relax/plugins.py) bounds its threads whatever the calls do,
and a second SIGTERM ends a run whose reward requests never finish. Hanging calls wait on an
Event the test sets afterwards, so no worker outlives its test."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from relax.errors import Interrupted, RewardError
from relax.plugins import CallRaised, CallTimeout, DeadlinePool, call_plugin
from relax.trainer.signals import GRACE_S, StopRequest
from relax.waits import future_result, wait_event
from tests.hostile.helpers import SMALL, env
from tests.reliability.helpers import Child

DRIP_SERVER = Path(__file__).with_name("drip_server.py")


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()  # the abandoned calls return and free their workers


def _new_workers(before: set) -> int:
    """Pool workers started since ``before`` (other tests' threads may come and go meanwhile
    in this process, so the process's thread count is no measure)."""
    return sum(t not in before and t.name.startswith("relax-user-code")
               for t in threading.enumerate())


def test_calls_that_never_return_hold_at_most_the_pools_workers(release):
    pool = DeadlinePool(size=4)
    before = set(threading.enumerate())
    outcomes = []
    for _ in range(40):
        try:
            pool.call(release.wait, (30,), 0.01)
        except CallTimeout as e:
            outcomes.append(e.busy)
    # the first 4 ran and were abandoned after their deadline; the other 36 never started
    assert outcomes == [0] * 4 + [4] * 36
    assert pool.threads == 4 and _new_workers(before) == 4
    release.set()
    deadline = time.monotonic() + 30
    while True:  # the workers come back as their calls return
        try:
            assert pool.call(lambda x: x + 1, (1,), 5.0) == 2
            break
        except CallTimeout:
            assert time.monotonic() < deadline, "the released calls did not free their workers"
            time.sleep(0.01)
    assert pool.threads == 4 and _new_workers(before) == 4  # reused, not new


@pytest.fixture
def trainers_sigint():
    """SIGINT handled as relax train handles it: a KeyboardInterrupt is the user code's own."""
    previous = signal.signal(signal.SIGINT, lambda *a: None)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt(), ValueError("bad")])
def test_whatever_user_code_raises_comes_back_to_the_caller(error, trainers_sigint):
    pool = DeadlinePool(size=2)

    def fn():
        raise error

    for timeout in (None, 5.0):  # on this thread and on a worker
        with pytest.raises(CallRaised) as e:
            pool.call(fn, (), timeout)
        assert e.value.error is error
    assert pool.call(lambda: 7, (), 5.0) == 7  # the worker survived a SystemExit


def test_a_plugin_past_its_deadline_is_one_line_naming_the_flag(release):
    with pytest.raises(RewardError, match=r"^--custom-reward-post-process-path: the function "
                       r"did not return within 0.05 s \(--reward-timeout 0.05 s\)$"):
        call_plugin(lambda: release.wait(30), "--custom-reward-post-process-path",
                    timeout=0.05)


def test_a_signal_before_start_up_waits_on_user_code_stops_it_on_entry():
    stop = StopRequest()
    stop.signum = signal.SIGTERM  # what the handler records for a first signal
    with pytest.raises(Interrupted, match=r"^stopped by SIGTERM while building it, before the "
                       r"first rollout step \(nothing to save\)$") as e:
        with stop.at_once("building it"):
            raise AssertionError("not entered")
    assert e.value.at_once and e.value.exit_code == 143


class _Stopped(Exception):
    pass


@pytest.fixture
def sigusr1_stops():
    """A handler like the trainer's: it records that it ran (in the main thread) and raises."""
    handled = threading.Event()

    def handler(signum, frame):
        handled.set()
        raise _Stopped

    previous = signal.signal(signal.SIGUSR1, handler)
    yield handled
    signal.signal(signal.SIGUSR1, previous)


def _signal_own_thread_then_wait(handled: threading.Event, seen: list) -> None:
    """On a worker: the signal goes to this thread (the kernel may pick any thread); records
    whether the main thread ran its handler while this call still ran."""
    time.sleep(0.2)  # the main thread is in its wait by then, the case in question (if it is
    # not, the handler runs at once and the test passes without telling the waits apart)
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    seen.append(handled.wait(20))


def _via_pool(handled, seen):
    DeadlinePool(size=1).call(_signal_own_thread_then_wait, (handled, seen), 60.0)


def _via_future(handled, seen):
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        future_result(pool.submit(_signal_own_thread_then_wait, handled, seen))
    finally:
        pool.shutdown(wait=False)


def _via_event(handled, seen):
    done = threading.Event()
    threading.Thread(target=lambda: (_signal_own_thread_then_wait(handled, seen), done.set()),
                     daemon=True).start()
    wait_event(done)


@pytest.mark.parametrize("wait", [_via_pool, _via_future, _via_event])
def test_a_signal_delivered_to_a_worker_thread_interrupts_the_main_threads_wait(
        sigusr1_stops, wait):
    # a main thread blocked in one long lock wait runs the handler only once the worker's
    # call has returned: the call would then record that it never saw the handler run
    seen: list[bool] = []
    with pytest.raises(_Stopped):
        wait(sigusr1_stops, seen)
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [True]


# ------------------------------------------------------------------ real relax processes

def _drip_server(mark: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(DRIP_SERVER), str(mark)],
                            stdout=subprocess.PIPE, text=True)
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not (line and line[0].startswith("listening on ")):
        proc.kill()
        raise AssertionError(f"the drip server did not start: {line}")
    return proc, line[0].split()[-1]


@pytest.mark.subprocess
def test_a_second_sigterm_ends_the_run_while_reward_requests_never_finish(tmp_path):
    mark = tmp_path / "posted"
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i}+{i}=", "label": str(2 * i)}) + "\n"
                            for i in range(4)))
    server, url = _drip_server(mark)
    try:
        child = Child([*SMALL, "--prompt-data", str(data), "--rm-type", "remote_rm", "--rm-url", url,
                       "--reward-max-concurrency", "4", "--output-dir", str(tmp_path / "run")],
                      env())
        deadline = time.monotonic() + 120
        while not mark.exists():  # requests are in flight, each kept alive byte by byte
            assert child.proc.poll() is None and time.monotonic() < deadline, child.lines[-20:]
            time.sleep(0.05)
        child.proc.send_signal(signal.SIGTERM)
        child.wait_for_line("received SIGTERM")
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        # before: the line was printed and the interpreter's exit joined the request threads
        assert child.finish(timeout=GRACE_S + 20) == 128 + signal.SIGTERM, child.lines[-20:]
        print(f"second SIGTERM to exit: {time.monotonic() - sent:.2f} s")
        (line,) = child.errors()
        assert "stopped at once by a second SIGTERM" in line
        assert "user code did not return" not in line  # it unwound; the watchdog was not needed
    finally:
        server.kill()
        server.wait(timeout=30)
