"""One case on one rank: run it, time it, keep its traceback and everything it printed.

The rank's file descriptors 1 and 2 point at a file of its own (`Capture`), emptied before each
case, so a case's output is whatever reached stdout or stderr while it ran, print() and C
libraries alike (MPI's warnings, faulthandler's dumps). When a rank hangs or dies in a case, the
pytest process reads that file itself: the failure shows what the rank printed up to the end.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

OUTPUT_CHARS = 20_000  # the end of a case's output that travels with its result


class Capture:
    """This process's stdout and stderr (the descriptors, not only sys.stdout) into `path`."""

    def __init__(self, path: str):
        self.path = path
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)  # both descriptors share one offset: output lands in the order written
        os.dup2(fd, 2)
        os.close(fd)

    def start(self) -> None:
        """Empty the file: what follows is the next case's output."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.ftruncate(1, 0)
        os.lseek(1, 0, os.SEEK_SET)

    def text(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        return read_tail(self.path)


def read_tail(path: str, chars: int = OUTPUT_CHARS) -> str:
    """The last `chars` characters of a capture file ('' if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * chars))
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    return text[-chars:]


def run(fn, capture: Capture | None) -> dict:
    """{"ok", "error" (the traceback, if it raised), "output", "seconds"} of one call of fn."""
    if capture is not None:
        capture.start()
    start = time.perf_counter()
    try:
        fn()
        result = {"ok": True, "error": None}
    except BaseException:  # noqa: BLE001  (report everything, keep going)
        result = {"ok": False, "error": traceback.format_exc()}
    result["seconds"] = round(time.perf_counter() - start, 4)
    result["output"] = capture.text() if capture is not None else ""
    return result
