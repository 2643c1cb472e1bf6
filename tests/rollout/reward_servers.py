"""Reward servers with faults, started as real processes by tests/rollout/test_remote_reward.py:

    python tests/rollout/reward_servers.py MODE --port 0

MODE: ``math`` (the example server as it is), ``slow`` (every POST waits DELAY seconds before
it is scored), ``flaky`` (odd-numbered POSTs, counted from 1 over the process, get HTTP 503),
``garbage`` (every POST gets HTTP 200 and an HTML page). Every mode adds ``GET /stats``:
``{"posts": ..., "max_in_flight": ..., "bodies": [the last 64 request bodies]}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "reward_server"))

from math_reward_server import RewardHandler, serve  # noqa: E402

DELAY = 0.5
GARBAGE = "<html><body>" + "Service temporarily unavailable. " * 20 + "</body></html>"

_lock = threading.Lock()
_stats = {"posts": 0, "in_flight": 0, "max_in_flight": 0, "bodies": []}


class Counting(RewardHandler):
    mode = "math"

    def do_GET(self):  # noqa: N802
        if self.path == "/stats":
            with _lock:
                self.answer(200, json.dumps({k: v for k, v in _stats.items()
                                             if k != "in_flight"}))
        else:
            super().do_GET()

    def do_POST(self):  # noqa: N802
        with _lock:
            _stats["posts"] += 1
            number = _stats["posts"]
            _stats["in_flight"] += 1
            _stats["max_in_flight"] = max(_stats["max_in_flight"], _stats["in_flight"])
        try:
            self.fault(number)
        finally:
            with _lock:
                _stats["in_flight"] -= 1

    def fault(self, number: int) -> None:
        if self.mode == "slow":
            time.sleep(DELAY)
        if self.mode == "flaky" and number % 2 == 1:
            self.read_json()
            self.answer(503, "overloaded, try again", "text/plain")
        elif self.mode == "garbage":
            self.read_json()
            self.answer(200, GARBAGE, "text/html")
        else:
            super().do_POST()

    def score(self, samples):
        with _lock:
            _stats["bodies"] = (_stats["bodies"] + [samples])[-64:]
        return super().score(samples)


if __name__ == "__main__":
    Counting.mode = sys.argv[1]
    serve(Counting, sys.argv[2:])
