"""Reward servers with faults, started as real processes by tests/rollout/reward/test_remote_reward.py:

    python tests/rollout/reward/reward_servers.py MODE --port 0

MODE: ``math`` (the example server as it is), ``slow`` (every POST waits DELAY seconds before
it is scored), ``flaky`` (odd-numbered POSTs, counted from 1 over the process, get HTTP 503),
``garbage`` (every POST gets HTTP 200 and an HTML page), ``drip-status`` / ``drip-body``
(one byte every DRIP seconds of the status line / of a body of 1000 announced bytes, for up to
DRIP_FOR seconds), ``redirect-302`` / ``redirect-307`` (every POST is redirected to
``/elsewhere``, where a GET or a POST is scored 1.0 whatever it holds), ``cut`` (odd-numbered
POSTs get a body cut short: 2 of 50 announced bytes, then the connection closes), ``huge``
(every reward is -1e300). Every mode adds ``GET /stats``:
``{"posts": ..., "max_in_flight": ..., "bodies": [the last 64 request bodies]}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "examples", "reward_server"))

from math_reward_server import RewardHandler, serve  # noqa: E402

DELAY = 0.5
DRIP, DRIP_FOR = 0.5, 120.0
GARBAGE = "<html><body>" + "Service temporarily unavailable. " * 20 + "</body></html>"

_lock = threading.Lock()
_stats = {"posts": 0, "in_flight": 0, "max_in_flight": 0, "bodies": []}


class Counting(RewardHandler):
    mode = "math"

    def do_GET(self):  # noqa: N802
        if self.path == "/elsewhere":
            with _lock:
                _stats["elsewhere_gets"] = _stats.get("elsewhere_gets", 0) + 1
            self.answer(200, "1.0")
        elif self.path == "/stats":
            with _lock:
                self.answer(200, json.dumps({k: v for k, v in _stats.items()
                                             if k != "in_flight"}))
        else:
            super().do_GET()

    def do_POST(self):  # noqa: N802
        if self.path == "/elsewhere":
            self.answer(200, "1.0")
            return
        with _lock:
            _stats["posts"] += 1
            number = _stats["posts"]
            _stats["in_flight"] += 1
            _stats["max_in_flight"] = max(_stats["max_in_flight"], _stats["in_flight"])
        self.counted = True
        try:
            self.fault(number)
        finally:
            self.done()

    def done(self) -> None:
        """The request is no longer in flight (once per POST)."""
        if getattr(self, "counted", False):
            self.counted = False
            with _lock:
                _stats["in_flight"] -= 1

    def answer(self, status: int, text: str, content_type: str = "application/json"):
        # out of flight before the answer leaves: once the client has it, it may send its
        # next request, and a loaded machine may run that one's handler before this thread
        # gets back to it (max_in_flight 3 under a concurrency of 2 was seen that way)
        self.done()
        super().answer(status, text, content_type)

    def fault(self, number: int) -> None:
        if self.mode == "slow":
            time.sleep(DELAY)
        if self.mode == "flaky" and number % 2 == 1:
            self.read_json()
            self.answer(503, "overloaded, try again", "text/plain")
        elif self.mode == "garbage":
            self.read_json()
            self.answer(200, GARBAGE, "text/html")
        elif self.mode.startswith("drip-"):
            self.read_json()
            self.drip()
        elif self.mode.startswith("redirect-"):
            self.read_json()
            self.send_response(int(self.mode.split("-")[1]))
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.mode == "cut" and number % 2 == 1:
            self.read_json()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 50\r\n\r\n1.")
            self.close_connection = True
        else:
            super().do_POST()

    def drip(self) -> None:
        """One byte every DRIP seconds: of the status line, or of the body after the headers."""
        data = b"HTTP/1.1 200 OK" + b" " * 1000  # the reason phrase never ends
        if self.mode == "drip-body":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n")
            data = b" " * 1000  # whitespace: valid JSON padding, were it ever complete
        start = time.monotonic()
        try:
            for byte in data:
                if time.monotonic() - start > DRIP_FOR:
                    break
                self.wfile.write(bytes([byte]))
                time.sleep(DRIP)
        except OSError:  # the client gave up: what a deadline is for
            pass
        self.close_connection = True

    def score(self, samples):
        with _lock:
            _stats["bodies"] = (_stats["bodies"] + [samples])[-64:]
        if self.mode == "huge":
            return [-1e300] * len(samples)
        return super().score(samples)


if __name__ == "__main__":
    Counting.mode = sys.argv[1]
    serve(Counting, sys.argv[2:])
