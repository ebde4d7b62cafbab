"""The bench job's events: one JSON line per finished cell, written by rank 0 alone, followed by
the launching process while the job runs (the progress bar), read whole at the end.

    out = Writer(path)          # rank 0 only: the file locked, each record one write
    out.emit("row", ...)
    follow = Follower(path)     # the launching process
    follow.read()               # the records completed since the last call

A row carries every iteration's time (up to thousands of floats: tens of kB), longer than one
buffered write, so a reader can find a record half written. Reading a growing file line by line
in text mode, Python returns the half it found as a line without its newline, and the next line
it returns is the rest: a line that starts inside a record (`json.decoder.JSONDecodeError:
Extra data`, the crash of issue 56). So the writer hands each record to the kernel in one
os.write (looping only if the kernel takes less), on a file it holds an exclusive lock on (a
second writer, a second rank 0 or a second job given the same file, is refused by name); the
follower reads bytes from where it stopped, keeps a record without its newline for the next
call, and counts a line it cannot parse instead of raising.
"""

from __future__ import annotations

import fcntl
import json
import os


class Writer:
    """The one writer of a job's events file (append, exclusive lock)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise RuntimeError(
                f"another process writes the bench events file {path}: only rank 0 of one job "
                "may (two jobs given the same file?)"
            ) from None

    def emit(self, kind: str, **fields) -> None:
        data = (json.dumps({"type": kind, **fields}) + "\n").encode()
        while data:  # a regular file takes it in one write; the loop is for a short one
            data = data[os.write(self.fd, data) :]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the lock goes with it
            self.fd = None


class Follower:
    """Reads a growing events file: each call, the records completed since the last."""

    def __init__(self, path: str):
        self.path, self.offset, self.events, self.unreadable = path, 0, [], 0

    def read(self) -> list[dict]:
        """Every record read so far (a list that grows); a line that is not one JSON record
        (never written by Writer) is counted in `unreadable`, not raised."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.events
        whole = data.rfind(b"\n") + 1  # what follows the last newline is still being written
        self.offset += whole
        for line in data[:whole].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                self.unreadable += 1
                continue
            if isinstance(event, dict) and "type" in event:
                self.events.append(event)
            else:
                self.unreadable += 1
        return self.events


def read(path: str) -> list[dict]:
    """The whole file's records (a finished job's), unreadable lines left out."""
    return Follower(path).read()
