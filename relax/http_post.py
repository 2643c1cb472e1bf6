"""One HTTP POST under one total deadline: the transport of relax/rollout/reward/remote_reward.py.

A socket timeout bounds each read, so a server that sends one byte every half second (in the
status line, the headers or the body) holds a request made with ``urllib`` forever. Here every
send and receive of the connection is given only what is left of the request's deadline, and
none may start after it: the request ends by ``limit`` seconds whatever the server does (with
one exception, the name lookup, below).

The rules (docs/reward_services.md, section "Failures"):

- **Redirects are not followed.** A 3xx is returned to the caller as it is, ``Location``
  included (urllib would re-send a POST as a GET without its body after a 301/302/303).
- **A body cut short is a connection error**: an answer that closes before its
  ``Content-Length`` is reached raises :class:`CutShort` (a ``ConnectionError``); a chunked
  answer cut short raises http.client's ``IncompleteRead``. An answer without a length ends
  where the server closes the connection.
- One connection per request (``Connection: close``), no proxy (as slime's aiohttp client:
  ``trust_env`` off): the URL is reached directly.

Limits: the host name is resolved before the deadline applies to anything (``getaddrinfo``
cannot be given one); an IP address or ``localhost`` resolves at once. An ``https`` handshake
is bounded per read by the time left when it starts, not as a whole (the tests cover ``http``).
"""

from __future__ import annotations

import http.client
import io
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


class CutShort(ConnectionError):
    """The server closed the connection before the answer's ``Content-Length`` was reached."""


class TooLarge(Exception):
    """The answer announced or sent more than the caller's ``max_bytes``."""


@dataclass
class Answer:
    status: int
    location: str | None  # the Location header of a redirect
    body: bytes  # at most max_bytes


def post(url: str, body: bytes, *, limit: float, max_bytes: int,
         content_type: str = "application/json") -> Answer:
    """POST ``body`` to ``url`` and read the answer, all within ``limit`` seconds
    (:func:`request`)."""
    return request("POST", url, body, limit=limit, max_bytes=max_bytes,
                   content_type=content_type)


def request(method: str, url: str, body: bytes | None, *, limit: float, max_bytes: int,
            content_type: str = "application/json") -> Answer:
    """``method`` ``url`` with ``body`` and read the answer, all within ``limit`` seconds.

    Raises TimeoutError at the deadline, :class:`CutShort` (or ``IncompleteRead``) for a body
    cut short, :class:`TooLarge` past ``max_bytes``, and any other ``OSError`` or
    ``http.client.HTTPException`` of the connection as it comes.
    """
    deadline = time.monotonic() + limit
    parts = urlsplit(url)
    kind = _TLS if parts.scheme == "https" else _Plain
    conn = kind(parts.hostname, parts.port, deadline=deadline)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    answer = None
    try:
        conn.request(method, target, body=body,
                     headers={"Content-Type": content_type, "Connection": "close"})
        answer = conn.getresponse()
        expected = answer.length  # None: chunked, or read until the server closes
        if expected is not None and expected > max_bytes:
            raise TooLarge(f"announced {expected} bytes")
        raw = answer.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise TooLarge(f"sent more than {max_bytes} bytes")
        if expected is not None and len(raw) < expected:
            raise CutShort(f"the connection closed after {len(raw)} of the {expected} bytes "
                           "the answer announced (Content-Length)")
        return Answer(answer.status, answer.getheader("Location"), raw)
    finally:
        if answer is not None:
            answer.close()  # its reader: the socket closes once both are closed
        conn.close()


def _left(deadline: float) -> float:
    """Seconds left before ``deadline``; TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed")
    return left


class _DeadlineSocket:
    """A connected socket (plain or TLS) whose sends and receives share one deadline."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline = sock, deadline
        # http.client closes the connection as soon as it has the headers of a
        # "Connection: close" answer and reads the body through makefile()'s reader after
        # that: the socket closes when both are done (as socket.socket counts its files)
        self._readers, self._closed = 0, False

    def sendall(self, data) -> None:
        self.sock.settimeout(_left(self.deadline))  # sendall's timeout bounds the whole send
        self.sock.sendall(data)

    def recv_into(self, buffer) -> int:
        self.sock.settimeout(_left(self.deadline))
        return self.sock.recv_into(buffer)

    def makefile(self, mode="rb", *args, **kwargs):  # http.client reads the answer through it
        self._readers += 1
        return io.BufferedReader(_Reader(self))

    def release(self) -> None:
        """A reader from makefile() is closed."""
        self._readers -= 1
        self._close_when_done()

    def close(self) -> None:
        self._closed = True
        self._close_when_done()

    def _close_when_done(self) -> None:
        if self._closed and self._readers <= 0:
            self.sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.release()
        super().close()


class _Bounded:
    """Connects within what is left of ``deadline``, then hands http.client a socket whose
    every read and write is bounded by it."""

    def __init__(self, host, port, *, deadline: float):
        super().__init__(host, port, timeout=_left(deadline))
        self.deadline = deadline

    def connect(self) -> None:
        self.timeout = _left(self.deadline)
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _Plain(_Bounded, http.client.HTTPConnection):
    pass


class _TLS(_Bounded, http.client.HTTPSConnection):
    pass
