"""Messages between the pytest process and a warm job's ranks: one JSON object per line, over a
local TCP socket (127.0.0.1), one connection per rank.

    pytest -> rank   {"op": "run", "suite": PATH, "names": [...], "env": {...}, "unset": [...],
                      "timeout": SECONDS}                       a batch of cases of one suite
                     {"op": "quit"}
    rank -> pytest   {"op": "hello", "rank": R, "pid": PID, "token": T}   once, when warm
                     {"op": "case", "name": N, "ok", "error", "output", "seconds"}
                     {"op": "synced", "name": N, "error": ..., "rebuild": ...}
                     {"op": "done"}                             the batch is over

A rank sends "case" as soon as its case returns and "synced" once every rank has compared notes
after it (minipar.testing.isolation), so a rank that never sends "case" is the one that hung or
died in it. JSON rather than pickle: nothing a rank sends can run code in the pytest process.
"""

from __future__ import annotations

import json
import socket

TOKEN_ENV = "MINIPAR_TEST_POOL_TOKEN"  # the pytest process accepts only its own ranks' hello


class Connection:
    """One socket, read line by line (buffered), written one message at a time."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self) -> dict | None:
        """The next message, blocking; None once the other side has closed the connection."""
        while b"\n" not in self._buffer:
            if not self._fill():
                return None
        return self._pop()

    def ready(self) -> list[dict]:
        """Read what the socket holds now (call when select says it is readable); the complete
        messages it finished. Raises EOFError once the other side has closed."""
        if not self._fill():
            raise EOFError
        messages = []
        while b"\n" in self._buffer:
            messages.append(self._pop())
        return messages

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 16)
        self._buffer += chunk
        return bool(chunk)

    def _pop(self) -> dict:
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)


def connect(address: str, timeout: float = 60.0) -> Connection:
    """The rank's end: connect to the pytest process at "HOST:PORT"."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.settimeout(None)
    return Connection(sock)
