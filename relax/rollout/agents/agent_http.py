"""The agents' HTTP endpoint (relax/rollout/agents/agent_server.py serves it): the Chat
Completions route per session, the request body checked in the handler thread before anything
reaches the tokenizer (relax/rollout/agents/chat_schema.py: 400 with the reason, 413 over
``MAX_BODY_BYTES``), a call from another episode's agent refused with 403
(relax/rollout/agents/peer.py), and a call the step will not answer refused with 410. The
handler only queues a checked call and waits for the batch loop's reply.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from relax.rollout.agents.chat_schema import MAX_BODY_BYTES, parse_request
from relax.rollout.agents.episodes import Episode
from relax.rollout.agents.peer import connection_group

DISCARD_BYTES = 256 << 20  # of a body over the cap: read and dropped before the socket closes


@dataclass
class _Session:
    """One agent run: its recorded episode and the messages it has been answered for."""

    episode: Episode | None = None
    messages: list = field(default_factory=list)  # the last call's messages + our reply
    ended: bool = True  # the last model turn ended with EOS
    error: str | None = None  # the conversation can no longer be recorded
    refused: str | None = None  # why the last refused call was refused
    group: int | None = None  # the agent's process group (its pid: a session of its own)
    index: int = 0  # the episode's sample index: with the turn, its calls' random streams


@dataclass
class _Request:
    session: _Session
    body: dict
    done: threading.Event = field(default_factory=threading.Event)
    reply: tuple[int, dict] | None = None
    arrived: float = field(default_factory=time.monotonic)


class _Server(ThreadingHTTPServer):
    # every agent of a step may connect at once; the default backlog of 5 refuses the rest
    request_queue_size = 1024
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    server_version = "relax"
    timeout = 60  # seconds a client may take to send its request (socket timeout)

    def log_message(self, *args):  # the trainer's log is not an access log
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _from_another_agent(self, session: _Session) -> bool:
        """Whether the connection is held by a process of another session's agent."""
        groups = {s.group for s in list(self.server.sessions.values()) if s.group is not None}
        owner = connection_group(self.client_address[1], self.server.server_address[1], groups)
        return owner is not None and owner != session.group

    def _body(self) -> dict | None:
        """The checked request body, or None after answering 4xx. The size is checked before
        anything is read: a body over the cap is never held in memory."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._send(411, _error("send the body with a Content-Length"))
            return None
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if length < 0:
            self._send(411, _error("a Content-Length header (bytes) is required"))
            return None
        if length > MAX_BODY_BYTES:
            self._send(413, _error(f"the request body of {length} bytes is over the cap of "
                                   f"{MAX_BODY_BYTES} bytes ({MAX_BODY_BYTES >> 20} MiB)"))
            self._discard(length)
            return None
        body, why = parse_request(self.rfile.read(length))
        if why is not None:
            self._send(400, _error(f"bad request: {why}"))
            return None
        return body

    def _discard(self, length: int) -> None:
        """Read and drop a refused body in small pieces (up to ``DISCARD_BYTES``), so a client
        that writes all of it before reading gets the answer instead of a reset connection."""
        left = min(length, DISCARD_BYTES)
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:  # the client gave up or timed out
            pass

    def do_GET(self):
        if self.path.rstrip("/").endswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "relax", "object": "model"}]})
        else:
            self._send(404, _error("unknown path"))

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        # sessions/<id>/v1/chat/completions
        if len(parts) != 5 or parts[0] != "sessions" or parts[2:] != ["v1", "chat",
                                                                       "completions"]:
            self._send(404, _error(f"unknown path {self.path}"))
            return
        session = self.server.sessions.get(parts[1])
        if session is None:
            self._send(404, _error(f"unknown session {parts[1][:64]}"))
            return
        if self._from_another_agent(session):
            self._send(403, _error("this session belongs to another episode's agent"))
            return
        body = self._body()
        if body is None:
            return
        request = _Request(session, body)
        self.server.requests.put(request)
        # The batch loop answers every call it takes, and the step's end refuses the rest; the
        # loop is bounded by the agents' deadlines, so the wait is too. A call may wait a
        # whole --agent-timeout for another agent (batches wait for every running agent).
        while not request.done.wait(1.0):
            if self.server.sessions.get(parts[1]) is not session:
                self._send(410, _error("the episode has ended"))
                return
        try:
            self._send(*request.reply)
        except OSError:  # the agent went away while waiting
            pass


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _refuse_ended(request: _Request) -> None:
    request.reply = (410, _error("the episode has ended"))
    request.done.set()
