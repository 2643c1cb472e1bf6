"""A fake vLLM server in this process, on 127.0.0.1, for tests of what Relax does with a
server's answers (relax/rollout/backends/vllm/vllm_answers.py): it answers the routes Relax calls the
way vLLM 0.32 does, except ``/v1/completions``, whose answer the test gives.

    with fake_vllm(lambda body: {...}, model_dir=path) as url:   # --vllm-url url
        ...

``answer(body) -> object``: the JSON of a ``/v1/completions`` answer to the request ``body``
(written with Python's json, so NaN and Infinity go out as such), or ``bytes`` sent as they
are. ``tokenizer``: ``/tokenize`` answers its ids (a teacher's probe), else 404.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        fake = self.server.fake
        routes = {"/health": b"", "/version": {"version": "0.32.0"},
                  "/v1/models": {"data": [{"id": "m", "root": fake["model_dir"]}]},
                  "/weight_info": {"weight_version": fake["weight_version"]}}
        if self.path in routes:
            self._send(200, routes[self.path])
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        fake = self.server.fake
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/v1/completions":
            self._send(200, fake["answer"](body))
        elif self.path == "/tokenize" and fake["tokenizer"] is not None:
            ids = fake["tokenizer"](body["prompt"], add_special_tokens=False)["input_ids"]
            self._send(200, {"tokens": ids})
        elif self.path == "/tokenize":
            self._send(404, {"detail": "Not Found"})
        elif self.path == "/update_weight_version":  # vLLM keeps the string it is given
            fake["weight_version"] = body["new_version"]
            self._send(200, {"success": True, "new_version": body["new_version"]})
        else:  # /pause, /resume, /collective_rpc, /reset_prefix_cache
            self._send(200, b"")

    def _send(self, status: int, payload) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def fake_vllm(answer, *, model_dir: str = "m", tokenizer=None):
    """The server, serving until the block ends; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.fake = {"answer": answer, "model_dir": str(model_dir), "tokenizer": tokenizer,
                   "weight_version": "default"}
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def sampled(ids: list[int], log_probs: list, finish: str = "length") -> dict:
    """A ``/v1/completions`` answer of one sampled response."""
    return {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
                         "logprobs": {"token_logprobs": log_probs}}]}
