"""A reward server for ``relax train --rm-type remote_rm --rm-url URL`` that scores with the
built-in math verifier (relax/rollout/math_reward.py: the last ``\\boxed{}`` or ``####``
answer against the label).

    python examples/reward_server/math_reward_server.py --port 8000 &
    relax train --prompt-data train.jsonl --rm-type remote_rm \\
        --rm-url http://127.0.0.1:8000/reward ...

It speaks the wire format of docs/reward_services.md: POST /reward with one sample
``{"prompt", "response", "label", "metadata"}`` answers its reward as a JSON number; an array
of samples is answered by an array of rewards. ``GET /health`` answers ``ok``. A request that
is not that shape gets HTTP 400 and the reason. It prints ``listening on URL`` once it accepts
connections (``--port 0`` picks a free port).

Built on the standard library's ``http.server`` (one thread per request): it needs nothing
installed beyond this repository, which is all an example of the protocol needs. A reward
model on a GPU would sit behind a production server that batches requests (e.g. FastAPI with
uvicorn, or an inference server's own HTTP front end) with the same two routes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from relax.rollout.math_reward import math_reward  # noqa: E402  (after the path above)

MAX_BODY_BYTES = 64 << 20


class BadRequest(ValueError):
    pass


def score_samples(samples: list[dict]) -> list[float]:
    """The math verifier's 0/1 reward of each sample."""
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or not isinstance(s.get("response"), str):
            raise BadRequest(f"sample {i} is not an object with a string 'response'")
    return math_reward([s.get("prompt", "") for s in samples],
                       [s["response"] for s in samples], [s.get("label") for s in samples])


class RewardHandler(BaseHTTPRequestHandler):
    """POST /reward and GET /health; subclasses override :meth:`score` (tests add faults)."""

    protocol_version = "HTTP/1.1"

    def score(self, samples: list[dict]) -> list[float]:
        return score_samples(samples)

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path == "/health":
            self.answer(200, "ok", "text/plain")
        else:
            self.answer(404, "not found; POST /reward or GET /health", "text/plain")

    def do_POST(self):  # noqa: N802
        if self.path != "/reward":
            self.answer(404, "not found; POST /reward", "text/plain")
            return
        try:
            body = self.read_json()
            single = isinstance(body, dict)
            rewards = self.score([body] if single else body)
        except BadRequest as e:
            self.answer(400, str(e), "text/plain")
            return
        self.answer(200, json.dumps(rewards[0] if single else rewards))

    def read_json(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            raise BadRequest(f"a JSON body of 1..{MAX_BODY_BYTES} bytes is needed")
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as e:
            raise BadRequest(f"the body is not JSON: {e}") from None
        if not isinstance(body, (dict, list)):
            raise BadRequest("the body must be one sample object or an array of them")
        return body

    def answer(self, status: int, text: str, content_type: str = "application/json"):
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):  # one line per request would flood a training log
        pass


def serve(handler=RewardHandler, argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/reward", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    serve()
