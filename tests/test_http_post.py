"""relax/http_post.py against a server that sends its headers and its body apart, as
uvicorn (vLLM) and aiohttp servers do: http.client closes a "Connection: close" connection
once it has the headers, and the body must still be read (it was EBADF)."""

from __future__ import annotations

import socket
import threading
import time

from relax import http_post


def _split_answer_server(body: bytes) -> tuple[str, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn, listener:
            conn.recv(65536)  # the request (small, one segment here)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
            time.sleep(0.3)  # the body in a later segment
            conn.sendall(body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/x", thread


def test_a_body_sent_after_the_headers_is_read_for_get_and_post():
    for method in ("GET", "POST"):
        url, thread = _split_answer_server(b'{"ok": true}')
        answer = http_post.request(method, url, None if method == "GET" else b"{}",
                                   limit=10, max_bytes=1024)
        thread.join(10)
        assert (answer.status, answer.body) == (200, b'{"ok": true}'), method
