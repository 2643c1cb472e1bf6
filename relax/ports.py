"""A TCP port on 127.0.0.1 held for a child process that will listen on it.

Binding port 0, reading the port and closing the socket hands the child a port that is free
no longer than that: until the child binds it (seconds later: a vLLM server imports for
10-30 s first), the OS may give it to anyone (another test's or job's port-0 bind, the local
end of an outgoing connection), and the child then fails to bind or, worse, its peers meet
a stranger listening there. A :class:`PortReservation` keeps the port bound here, with
``SO_REUSEADDR`` and not listening, until :meth:`~PortReservation.release`: the OS hands a
bound port to no one else, while a child whose listener also sets ``SO_REUSEADDR`` (uvicorn
under vLLM, torch's ``TCPStore``) binds and listens on it as usual. A process that asks for
that port number explicitly with ``SO_REUSEADDR`` can still take it, which is why the vLLM
server also starts again on a fresh port when its own bind fails
(relax/rollout/backends/vllm/vllm_server.py).

    with PortReservation() as port:       # released when the block ends
        child = start_server(port=port)
        wait_until_listening(child)
"""

from __future__ import annotations

import socket


class PortReservation:
    """``port``: held until :meth:`release` (or the end of a ``with`` block)."""

    def __init__(self, host: str = "127.0.0.1"):
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, 0))
        except BaseException:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        """Stop holding the port (once the child listens on it, or has given up); idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> int:
        return self.port

    def __exit__(self, *exc) -> None:
        self.release()
