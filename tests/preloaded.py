"""``python -m relax`` and ``torchrun ... -m relax`` without paying their imports each time:
one process per test worker imports torch, transformers and relax once, then forks a child
per command, which runs ``relax`` as ``python -m relax`` would (``runpy``, ``__main__``), in
its own session, with the command's environment, working directory, empty stdin and
stdout/stderr to files, and ends the way that process would (its exit status, its atexit
handlers, a signal's death). A torchrun command's child is torchrun itself: torchrun's own
``main`` with the command's flags plus ``--run-path --start-method fork`` (both torchrun
flags: the agent runs ``relax/__main__.py`` as a function in each rank, and starts the ranks
by fork), so the agent, its rendezvous, its monitoring and its failure handling are
torchrun's, and each rank is a fork of the agent, which has done every import already.

Why: a hostile case is mostly imports (about 4 of its 4.9 CPU seconds here) and the suite
runs some fifty of them; a torchrun launch paid them once per rank and ~1.3 s more for the
agent, and the suite launches about 140 ranks (measured with every process's CPU logged on a
whole `make test`: 560 s of CPU in ranks, 107 s in agents). What the cases check, exit
status, stderr and what is left on disk, comes from the child alone. What a fork shares with
the preloading process, and so is not a fresh process's: the hash seed and state set at
import from the environment (the preloader starts with the tests' own environment; the
commands here change only variables read at run time: OMP_NUM_THREADS is applied by relax
itself through ``torch.set_num_threads``, RELAX_TEST_*, WORLD_SIZE). So two runs compared
for equality here share their hash seed: the tests that show a run repeats in fresh
processes (tests/reliability/test_repeat_under_load.py, test_torchrun.py's CLI launches) do
not come here. A rank started by fork is not ``python -u``: its stdout is block-buffered
until relax flushes it at exit (what tests read after the run). A preloader with more than one
thread could not fork safely: it then refuses to start and :func:`run` falls back to a fresh
process, as it does whenever the preloader is gone (also when it ends before it forks a
command). A preloader that is there but does not fork the command within
:data:`FORK_WAIT_S` seconds is a failure of the test: an AssertionError naming the command and
what the preloader did, and the next command starts a fresh one.

    out = run(["train", "--num-rollout", "2"], env=env, cwd=None, timeout=180)
    # a subprocess.CompletedProcess, as subprocess.run(..., capture_output=True, text=True)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading

PRELOAD = ("torch", "torch._dynamo", "numpy", "transformers", "transformers.masking_utils",
           "transformers.models.qwen3.modeling_qwen3", "tokenizers", "safetensors.torch",
           "torch.distributed.run", "relax.cli", "relax.trainer", "relax.trainer.launch")
RELAX_MAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "relax",
                          "__main__.py")
SERVE = "from tests.preloaded import _serve; _serve()"
FORK_WAIT_S = 30.0  # for the forked command's pid: a fork takes milliseconds


# ------------------------------------------------------------------ the preloading process

def _child(request: dict) -> None:
    """In the fork: become the command's process, then run relax as ``-m relax`` does."""
    import runpy

    os.setsid()  # its own group: a timeout kills what it started too
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if request.get("torchrun") is not None:
        from torch.distributed.run import main as torchrun

        # torchrun's own main, as `python -m torch.distributed.run` runs it: on a rank's
        # failure it raises (and the interpreter ends with status 1 and its report)
        sys.argv = ["torchrun", *request["torchrun"]]
        torchrun([*request["torchrun"], "--run-path", "--start-method", "fork", RELAX_MAIN,
                  *request["args"]])
        sys.exit(0)
    sys.argv = ["relax", *request["args"]]
    # from here on this is the command: SystemExit, an exception or a signal ends the
    # interpreter exactly as it ends `python -m relax`
    runpy.run_module("relax", run_name="__main__", alter_sys=True)
    sys.exit(0)


def _serve() -> None:
    """Read one JSON request per line on stdin; answer ``{"pid"}`` once forked and
    ``{"status"}`` (subprocess's returncode) once the child is over."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    out = sys.stdout
    tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if tasks != 1 or threading.active_count() != 1:
        print(json.dumps({"refused": f"{tasks} threads after the imports"}), file=out,
              flush=True)
        return
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=out, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), file=out, flush=True)


# ------------------------------------------------------------------ the tests' side

class _Gone(Exception):
    """The preloader ended before it forked the command: the command runs in a fresh
    process instead."""


class _Preloader:
    def __init__(self, env: dict, code: str = SERVE):
        """The preloader ``python -c code`` (a test's stand-in where ``code`` is not
        :data:`SERVE`), once it says it is ready."""
        self.ended = False  # its output closed: it is ending
        self.proc = subprocess.Popen([sys.executable, "-c", code],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=os.path.dirname(os.path.dirname(
                                         os.path.abspath(__file__))))
        answer = self._read(120)
        if not answer or not answer.get("ready"):
            self.close()
            raise RuntimeError(f"preloader did not start: {answer}")

    def _read(self, timeout: float) -> dict | None:
        """The next answer; None when none came within ``timeout`` s or the preloader closed
        its output (then ``self.ended``)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        self.ended = not line
        return json.loads(line) if line else None

    def _forked(self, args: list[str]) -> int:
        """The pid of the child forked for ``args``; :class:`_Gone` when the preloader ended
        instead. When it answers anything else, or nothing within :data:`FORK_WAIT_S` s, it is
        stopped and an AssertionError names the command and what the preloader did."""
        answer = self._read(FORK_WAIT_S)
        if isinstance(answer, dict) and isinstance(answer.get("pid"), int):
            return answer["pid"]
        if answer is None and (self.ended or self.proc.poll() is not None):
            raise _Gone
        pid = self.proc.pid
        did = (f"answered {answer!r}" if answer is not None else
               f"is running but forked nothing within {FORK_WAIT_S:g} s")
        self.close()  # a stuck preloader would fail every later command too
        raise AssertionError(f"relax {' '.join(args)}: the preloader (pid {pid}, "
                             f"tests/preloaded.py) {did}; it is stopped and the next "
                             "command starts a fresh one")

    def run(self, args: list[str], env: dict, cwd: str, timeout: float,
            torchrun: list[str] | None = None):
        with tempfile.TemporaryDirectory() as folder:
            paths = {k: os.path.join(folder, k) for k in ("stdout", "stderr")}
            try:
                self.proc.stdin.write(json.dumps({"args": args, "env": env, "cwd": cwd,
                                                  "torchrun": torchrun, **paths}) + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:  # it ended since run() looked
                raise _Gone from None
            pid = self._forked(args)
            answer = self._read(timeout)
            if answer is None:  # a hang is a failure: the child and all it started die
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._read(30)
            text = {k: open(p, errors="replace").read() for k, p in paths.items()}
            if answer is None:
                raise subprocess.TimeoutExpired(["relax", *args], timeout, text["stdout"],
                                                text["stderr"])
        return subprocess.CompletedProcess(["relax", *args], answer["status"], text["stdout"],
                                           text["stderr"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_PRELOADER: _Preloader | None = None
_LOCK = threading.Lock()


def run(args: list[str], *, env: dict, base_env: dict, cwd: str | None, timeout: float,
        torchrun: list[str] | None = None):
    """``relax ARGS`` with ``env`` as a child of this worker's preloader (started at the
    first call, with ``base_env``: what every command's environment shares), or as a fresh
    ``python -m relax`` where no preloader can start. ``torchrun``: torchrun's flags (e.g.
    ``["--standalone", "--nproc_per_node", "2"]``): the command is ``torchrun FLAGS -m relax
    ARGS``, its ranks forked by torchrun's agent (the module's docstring)."""
    global _PRELOADER
    args = [str(a) for a in args]
    with _LOCK:
        if _PRELOADER is None or _PRELOADER.proc.poll() is not None:
            try:
                _PRELOADER = _Preloader(base_env)
            except (RuntimeError, OSError):
                _PRELOADER = None
        if _PRELOADER is not None:
            try:
                return _PRELOADER.run(args, env, os.path.abspath(cwd or os.getcwd()), timeout,
                                      torchrun)
            except _Gone:  # it ended before it forked the command: nothing of it ran
                _PRELOADER = None
    launch = [sys.executable] if torchrun is None else [
        sys.executable, "-m", "torch.distributed.run", *torchrun]
    return subprocess.run([*launch, "-m", "relax", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


if __name__ == "__main__":
    _serve()
