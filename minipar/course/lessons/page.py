"""What every lesson module shares: start minipar, print on rank 0 only, tables, checks.

    page = Page("03", "Ring and tree algorithms", breaks=("wrong-chunk",))
    page.prediction("The formulas")          # a heading: what we expect, before running
    page.table("Steps", ["rank", "sends"], rows)
    page.measurement("What the ledger saw")  # a heading: what really happened
    page.check(ok, "ring bytes match the formula")
    return page.finish()                     # 0 when every check passed

Every rank runs the lesson; only rank 0 prints, so the other ranks' consoles are quiet. Checks
must be decided from data every rank has (gathered with `page.gather`), so all ranks return the
same exit status.
"""

from __future__ import annotations

import argparse
import sys

from rich import box
from rich.panel import Panel
from rich.table import Table

import minipar
from minipar.term import Console


class Page:
    def __init__(self, number: str, title: str, breaks=(), argv=None, min_ranks: int = 1):
        parser = argparse.ArgumentParser(prog=f"minipar lesson {number}")
        parser.add_argument("--quick", action="store_true", help="the short version (tour)")
        parser.add_argument("--break", dest="lab", choices=list(breaks) or None, default=None)
        self.args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        self.quick, self.lab = self.args.quick, self.args.lab
        self.started = not minipar.is_initialized()  # finish() ends only what the page began
        self.comm = minipar.init()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.console = Console(quiet=self.rank != 0, highlight=False)
        self.failures: list[str] = []
        mode = f"break-it lab: {self.lab}" if self.lab else ("quick" if self.quick else "full")
        self.console.print(
            Panel(
                f"[bold]Lesson {number}: {title}[/]\n{self.size} ranks, {mode}",
                box=box.HEAVY,
                expand=False,
            )
        )
        self.enough = self.size >= min_ranks
        if not self.enough:
            self.say(
                f"[red]This lesson needs at least {min_ranks} ranks; run it with "
                f"`minipar lesson {number} -n {max(min_ranks, 4)}`.[/]"
            )

    # -- printing (rank 0) -----------------------------------------------------------------
    def say(self, text: str = "") -> None:
        self.console.print(text)

    def section(self, heading: str) -> None:
        self.console.print()
        self.console.rule(f"[bold]{heading}[/]", align="left")

    def prediction(self, heading: str) -> None:
        self.section(f"Prediction: {heading}")

    def measurement(self, heading: str) -> None:
        self.section(f"Measured: {heading}")

    def table(self, title: str | None, columns, rows, caption: str | None = None) -> None:
        """A table; a column given as "name>" is right-aligned (numbers)."""
        t = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, title_justify="left")
        for col in columns:
            right = col.endswith(">")
            t.add_column(col.rstrip(">"), justify="right" if right else "left")
        for row in rows:
            t.add_row(*[str(cell) for cell in row])
        self.console.print(t)

    def try_this(self, prompts) -> None:
        self.section("Try this")
        for prompt in prompts:
            self.console.print(f"  - {prompt}")

    # -- cross-rank --------------------------------------------------------------------------
    def gather(self, obj) -> list:
        """Every rank's small picklable object, in rank order, on every rank (control plane:
        not a minipar collective, so it never shows in a trace)."""
        return self.comm.allgather_object(obj)

    def check(self, ok: bool, what: str) -> bool:
        """Print a pass/fail line; a failed check makes the lesson exit 1."""
        mark = "[green]PASS[/]" if ok else "[bold red]FAIL[/]"
        self.console.print(f"  {mark}  {what}")
        if not ok:
            self.failures.append(what)
        return ok

    def finish(self) -> int:
        status = 0 if not self.failures and self.enough else 1
        if self.failures:
            self.say(f"\n[bold red]{len(self.failures)} check(s) failed.[/]")
        if self.started:  # a program that started minipar itself (a test's ranks) keeps it
            minipar.finalize()
        return status


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (powers of two, as message sizes are)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_time(seconds: float) -> str:
    """Seconds in the unit that reads best: 12.3 us, 4.56 ms, 1.23 s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_rate(bytes_per_second: float) -> str:
    """Bytes per second in decimal units, as datasheets quote bandwidth: 900 GB/s, 1.8 TB/s."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:.3g} {unit}"
    return f"{bytes_per_second:.3g} B/s"
