"""A reward server for ``relax train --rm-type remote_rm --rm-url URL`` that scores with the
built-in math verifier (relax/rollout/reward/math_reward.py: the last ``\\boxed{}`` or ``####``
answer against the label).

    python examples/reward_server/math_reward_server.py --port 8000 &
    relax train --prompt-data train.jsonl --rm-type remote_rm \\
        --rm-url http://127.0.0.1:8000/reward ...

It speaks the wire format of docs/reward_services.md: POST /reward with one sample
``{"prompt", "response", "label", "metadata"}`` answers its reward as a JSON number; an array
of samples is answered by an array of rewards. ``GET /health`` answers ``ok``. A request that
is not that shape -- a ``Content-Length`` that is missing, not a number or over 64 MiB, a body
that is not JSON or nested too deeply, a sample that is not an object with a string
``response`` and a string or number ``label`` -- gets HTTP 400 and the reason, never a dropped
connection (which a client would retry). Each request has ``--request-timeout`` seconds
(default 60), from its first byte to the last of the answer: a client that sends slowly, or
stops, is disconnected then, so it holds a thread that long at most. It prints ``listening on
URL`` once it accepts connections (``--port 0`` picks a free port).

Built on the standard library's ``http.server`` (one thread per connection): it needs nothing
installed beyond this repository, which is all an example of the protocol needs. A reward
model on a GPU would sit behind a production server that batches requests (e.g. FastAPI with
uvicorn, or an inference server's own HTTP front end) with the same two routes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from relax.rollout.reward.math_reward import math_reward  # noqa: E402  (after the path above)

MAX_BODY_BYTES = 64 << 20
REQUEST_TIMEOUT_S = 60.0


class BadRequest(ValueError):
    pass


def check_sample(i: int, sample) -> None:
    """A BadRequest saying why ``sample`` cannot be scored by the math verifier, if it cannot."""
    if not isinstance(sample, dict):
        raise BadRequest(f"sample {i} is a {type(sample).__name__}, not an object")
    if not isinstance(sample.get("response"), str):
        raise BadRequest(f"sample {i} has no string 'response'")
    label = sample.get("label")
    if label is None:
        raise BadRequest(f"sample {i} has no 'label'; the math verifier compares the response's "
                         "final answer with it")
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise BadRequest(f"sample {i} has a {type(label).__name__} 'label'; it must be a string "
                         "or a number")
    if not isinstance(sample.get("prompt", ""), str):
        raise BadRequest(f"sample {i} has a 'prompt' that is not a string")


def score_samples(samples: list) -> list[float]:
    """The math verifier's 0/1 reward of each sample."""
    if not samples:
        raise BadRequest("no samples: send one sample object or a non-empty array of them")
    for i, s in enumerate(samples):
        check_sample(i, s)
    return math_reward([s.get("prompt", "") for s in samples],
                       [s["response"] for s in samples], [s["label"] for s in samples])


class RewardHandler(BaseHTTPRequestHandler):
    """POST /reward and GET /health; subclasses override :meth:`score` (tests add faults)."""

    protocol_version = "HTTP/1.1"
    request_timeout = REQUEST_TIMEOUT_S  # serve() sets it from --request-timeout
    timeout = REQUEST_TIMEOUT_S  # each read's own limit, as socketserver applies it

    def handle_one_request(self):
        """One request under one deadline: at ``request_timeout`` the socket is shut down,
        which ends any read or write still waiting (a per-read timeout alone lets a client
        sending a byte a second hold the thread forever)."""
        timer = threading.Timer(self.request_timeout, self._cut_off)
        timer.daemon = True
        timer.start()
        try:
            super().handle_one_request()
        finally:
            timer.cancel()

    def _cut_off(self):
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass

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
        except Exception as e:  # a bug of this server, said in the answer, not a dropped line
            self.answer(500, f"the verifier failed: {type(e).__name__}: {e}"[:1000], "text/plain")
            return
        self.answer(200, json.dumps(rewards[0] if single else rewards))

    def read_json(self):
        """The request's JSON body, or a BadRequest saying why it is not one."""
        text = self.headers.get("Content-Length")
        try:
            length = int(text or 0)
        except ValueError:
            self.close_connection = True  # the body's end is unknown: nothing after it is read
            raise BadRequest(f"Content-Length {text[:40]!r} is not a number of bytes") from None
        if not 0 < length <= MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(f"a JSON body of 1..{MAX_BODY_BYTES} bytes with its Content-Length "
                             "is needed")
        raw = self.rfile.read(length)
        if len(raw) < length:
            self.close_connection = True
            raise BadRequest(f"the body ended after {len(raw)} of {length} bytes")
        try:
            body = json.loads(raw)
        except RecursionError:
            raise BadRequest("the body is JSON nested too deeply") from None
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
    parser.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                        help="seconds a request may take, from its first byte to the answer's "
                        "last (a slow or stalled client is disconnected then)")
    args = parser.parse_args(argv)
    if not 0 < args.request_timeout <= 86400:
        parser.error("--request-timeout must lie in (0, 86400] seconds")
    handler.request_timeout = handler.timeout = args.request_timeout
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
