"""Which agent's process group a localhost TCP connection comes from (Linux ``/proc``).

The agent endpoint answers a session's calls only from that session's agent: a connection
whose socket is held by a process of *another* episode's agent (its process group) is
refused, so a session id read from another agent's files or ``/proc/PID/environ`` is of no
use. The socket is found in ``/proc/net/tcp`` by its two ports, its holder by scanning the
file descriptors of the agents' processes (only theirs: the processes whose group is an
agent's). A connection held by no agent process, or where ``/proc`` does not tell (another
OS, a sandbox that hides it), is answered: the check never refuses what it cannot attribute.
"""

from __future__ import annotations

import os


def connection_group(client_port: int, server_port: int, groups: set[int]) -> int | None:
    """The process group among ``groups`` whose process holds the client end of the
    connection ``127.0.0.1:client_port -> :server_port``, or None when none does (or it
    cannot be told)."""
    inode = _client_inode(client_port, server_port)
    if inode is None or not groups:
        return None
    target = f"socket:[{inode}]"
    for pid, pgid in _processes_in(groups):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # exited, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return pgid
            except OSError:
                continue
    return None


def _client_inode(client_port: int, server_port: int) -> str | None:
    """The inode of the socket whose local port is ``client_port`` and remote port
    ``server_port`` (IPv4 table; the endpoint listens on 127.0.0.1 only)."""
    try:
        with open("/proc/net/tcp", encoding="ascii") as f:
            lines = f.readlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
        if int(local, 16) == client_port and int(remote, 16) == server_port:
            return fields[9] if fields[9] != "0" else None
    return None


def _processes_in(groups: set[int]):
    """``(pid, pgid)`` of the live processes whose process group is in ``groups``."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
                after = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(after) > 2 and int(after[2]) in groups:
            yield int(name), int(after[2])
