"""A stub of a vLLM 0.32 OpenAI-compatible server as a real process on 127.0.0.1, for the
pool's tests (test_vllm_pool.py): the routes Relax calls, an answer that depends only on
the request (so a request sent again to another stub comes back the same), and faults on
demand. Standard library only: it starts in a fraction of a second.

    python stub_vllm.py --model-dir DIR [--delay S] [--fail-reload] [--kill-after K]
                        [--misreport JSON] [--fail-transfer] [--fail-update]
                        [--stale-session]

It binds port 0 and prints ``PORT <port>`` as its first line, so the port is the one the
child holds (never chosen by the parent, released and bound again).

- ``/v1/completions``: ``max_tokens`` ids ``5 + (seed + sum(prompt) + k) % 7`` with
  log-prob -0.25 each, after ``--delay`` seconds; ``--kill-after K``: the (K+1)-th request
  to arrive SIGKILLs the process (a server dying mid-step, its requests in flight unanswered).
- ``/collective_rpc`` (the weight reload): HTTP 500 with ``--fail-reload``, else recorded.
- ``POST /update_weight_version`` ``{"new_version": str}`` and ``GET /weight_info``
  ``{"weight_version": str}``: vLLM 0.32's routes, the version kept as the string set
  (``"default"`` until one is; a body that is not a string is HTTP 422, as FastAPI answers);
  ``--misreport JSON``: ``/weight_info`` answers that value instead (a server that missed
  the update, or an answer that is not a version).
- The weight transfer routes (``/init_weight_transfer_engine``, ``/start_weight_update``,
  ``/update_weights``, ``/finish_weight_update``): a real receiver of Relax's engine
  ``relax_gloo`` (vllm_plugin/relax_vllm_plugin/wire.py; torch imported at the first
  init only), which starts the next chunk's receive before answering when told its size
  (``next_bytes``), each chunk's names and the sum of its float32 values recorded;
  ``--fail-transfer``: the init answers HTTP 500 as a server without the engine does;
  ``--fail-update``: ``/update_weights`` answers HTTP 500 without joining the broadcast (a
  server that rejects the chunk). The update session as vLLM 0.32's worker keeps it: a
  start while one is active, a finish or an update without one answer HTTP 500, and a
  failed update ends it; ``--stale-session``: one is active from the start (a trainer died
  in the middle of an update); ``--die-joining``: the init says the worker is ready (the
  group's ready key) and the server is SIGKILLed before it joins (a server dying at that
  moment).
- ``GET /stats``: the prompts answered, the reload paths, the versions set, the chunks
  received (``[[names], sum]``) and the session's starts and finishes, in order.
- ``POST /control`` ``{"down": bool, "misreport": JSON or null}``: while down, every route
  but ``/control`` and ``/stats`` closes the connection without an answer (a hung or
  unreachable server); ``misreport`` replaces ``--misreport`` (null: answer the truth).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 4,
                      "vllm_plugin")


def tokens(prompt: list[int], seed: int, n: int) -> list[int]:
    return [5 + (seed + sum(prompt) + k) % 7 for k in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802
        state = self.server.state
        if self.path == "/stats":
            with state["lock"]:
                return self._send(200, {"prompts": state["prompts"], "reloads": state["reloads"],
                                        "versions": state["versions"],
                                        "chunks": state["chunks"],
                                        "steps": state["steps"]})
        if state["down"]:
            return self._drop()
        if self.path == "/weight_info":
            with state["lock"]:
                told = state["versions"][-1] if state["versions"] else "default"
                shown = told if state["misreport"] is None else state["misreport"]["value"]
            return self._send(200, {"weight_version": shown})
        routes = {"/health": b"", "/version": {"version": "0.32.0"},
                  "/v1/models": {"data": [{"id": "m", "root": state["model_dir"]}]}}
        if self.path in routes:
            return self._send(200, routes[self.path])
        return self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        state = self.server.state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/control":
            with state["lock"]:
                state["down"] = bool(body.get("down", state["down"]))
                if "misreport" in body:
                    state["misreport"] = _misreport(body["misreport"])
            return self._send(200, b"")
        if state["down"]:
            return self._drop()
        if self.path == "/v1/completions":
            return self._complete(state, body)
        if self.path == "/update_weight_version":
            if not isinstance(body.get("new_version"), str):
                return self._send(422, {"detail": "new_version: Input should be a valid string"})
            with state["lock"]:
                state["versions"].append(body["new_version"])
            return self._send(200, {"success": True, "new_version": body["new_version"]})
        if self.path in ("/init_weight_transfer_engine", "/update_weights"):
            return self._transfer(state, body)
        if self.path in ("/start_weight_update", "/finish_weight_update"):
            return self._session(state)
        if self.path == "/collective_rpc":
            if state["fail_reload"]:
                return self._send(500, {"detail": "reload failed"})
            with state["lock"]:
                state["reloads"].append(body["kwargs"]["weights_path"])
        return self._send(200, b"")  # /pause, /resume, /reset_prefix_cache

    def _complete(self, state, body) -> None:
        with state["lock"]:
            state["arrived"] += 1
            if state["kill_after"] is not None and state["arrived"] > state["kill_after"]:
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(state["delay"])
        prompt, n = body["prompt"][0], body["max_tokens"]
        ids = tokens(prompt, body["seed"], n)
        with state["lock"]:
            state["prompts"].append(prompt)
        self._send(200, {"choices": [{"index": 0, "text": "", "token_ids": ids,
                                      "finish_reason": "length",
                                      "logprobs": {"token_logprobs": [-0.25] * n}}]})

    def _session(self, state) -> None:
        """vLLM's worker: one update session at a time, and no finish without a start."""
        start = self.path == "/start_weight_update"
        with state["lock"]:
            state["steps"].append(self.path)
            if state["session"] == start:
                return self._send(500, {"error": "start_weight_update called while a weight "
                                        "update is already active" if start else
                                        "finish_weight_update called without a matching "
                                        "start_weight_update"})
            state["session"] = start
        return self._send(200, b"")

    def _transfer(self, state, body) -> None:
        """Relax's engine's part, with the plugin's own receiving code."""
        if self.path == "/init_weight_transfer_engine" and state["fail_transfer"]:
            return self._send(500, {"detail": "Weight transfer not configured"})
        sys.path.insert(0, PLUGIN)
        from relax_vllm_plugin import wire  # torch: imported by the first transfer only

        if self.path == "/init_weight_transfer_engine":
            import torch.distributed as dist
            info = body["init_info"]
            store = dist.TCPStore(info["master_address"], info["master_port"],
                                  is_master=False)
            state["posted"] = None
            if state["die_joining"]:
                dist.PrefixStore(info["group_name"], store).set(
                    f"{wire.READY_KEY}{info['rank_offset']}", b"1")
                os.kill(os.getpid(), signal.SIGKILL)
            state["group"] = (store, wire.join_group(
                store, info["group_name"], info["rank_offset"], info["world_size"],
                info["timeout_s"], wire.local_address(info["master_address"],
                                                      info["master_port"])))
            return self._send(200, {"message": "Weight transfer initialized"})
        with state["lock"]:
            if not state["session"] or state["fail_update"]:
                state["session"] = False  # vLLM's worker ends the session on a failed update
                return self._send(500, {"error": "update refused"})
        info = body["update_info"]
        posted, state["posted"] = state.get("posted"), None
        buffers = state.setdefault("buffers", wire.Buffers())  # the engine's reuse, too
        weights = wire.receive(state["group"][1], info["names"], info["dtype_names"],
                               info["shapes"], posted=posted, buffers=buffers)
        if info.get("next_bytes"):  # as the engine does: the next chunk's receive started
            state["posted"] = wire.post(state["group"][1], info["next_bytes"], buffers)
        with state["lock"]:
            state["chunks"].append([[n for n, _ in weights],
                                    float(sum(t.double().sum() for _, t in weights))])
        return self._send(200, {"message": "Weights updated"})

    def _drop(self) -> None:
        self.close_connection = True  # no status line: the client sees the connection end

    def _send(self, status: int, payload) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # uvicorn's backlog is 2048; the default 5 resets a burst of 64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail-reload", action="store_true")
    parser.add_argument("--kill-after", type=int, default=None)
    parser.add_argument("--misreport", type=json.loads, default=None)
    parser.add_argument("--fail-transfer", action="store_true")
    parser.add_argument("--fail-update", action="store_true")
    parser.add_argument("--stale-session", action="store_true")
    parser.add_argument("--die-joining", action="store_true")
    args = parser.parse_args()
    server = Server(("127.0.0.1", 0), Handler)
    server.state = {"model_dir": args.model_dir, "delay": args.delay, "down": False,
                    "fail_reload": args.fail_reload, "kill_after": args.kill_after,
                    "arrived": 0, "prompts": [], "reloads": [], "versions": [],
                    "fail_transfer": args.fail_transfer, "chunks": [], "group": None,
                    "fail_update": args.fail_update, "session": args.stale_session,
                    "steps": [], "die_joining": args.die_joining,
                    "misreport": None if args.misreport is None else _misreport(args.misreport),
                    "lock": threading.Lock()}
    print(f"PORT {server.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    server.serve_forever(0.05)


def _misreport(value) -> dict | None:
    """What ``/weight_info`` answers in place of the version set (None: that version); a
    box, so that a JSON null can be misreported too."""
    return None if value is None else {"value": value}


def _exit_with_parent() -> None:
    """A test process that dies without its fixture's cleanup leaves no stub behind."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
