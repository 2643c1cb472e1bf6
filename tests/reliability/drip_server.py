"""A reward server that never finishes an answer, started as a real process by
tests/reliability/test_deadlines.py:

    python tests/reliability/drip_server.py MARK_FILE

Every POST gets a status line, headers promising a 1000-byte body, then one byte every 0.2 s
until the client goes away: a socket read timeout never fires. The first POST creates
MARK_FILE, so a test knows requests are in flight. Prints ``listening on URL``.
"""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Drip(BaseHTTPRequestHandler):
    mark: Path

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.mark.touch()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client went away
            pass

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    Drip.mark = Path(sys.argv[1])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/reward", flush=True)
    server.serve_forever()
