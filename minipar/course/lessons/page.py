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
import json
import os
import socket
import sys
import time
from dataclasses import replace

from rich import box
from rich.panel import Panel
from rich.table import Table

import minipar
from minipar import launcher
from minipar.cost.links import EMULATED_LINK_ENV
from minipar.course import claims, cpu_share
from minipar.course.claims import Claim
from minipar.course.formats import fmt_bytes, fmt_rate, fmt_time  # noqa: F401 (the lessons')
from minipar.course.machine import this_machine
from minipar.term import Console

LOAD_BEFORE_ENV = "MINIPAR_LOAD_BEFORE"  # the load average `minipar lesson` read before launching
MIN_WINDOW = 0.25  # s: a shorter CPU window says little; the whole run's is used instead
TIMING_ENV = "MINIPAR_TIMING"  # "shown": timing claims shown, never judged (the tests' runs)
LINK_ENV = EMULATED_LINK_ENV  # the emulated link's rate, bits/s, when run with --nodes


class Page:
    def __init__(self, number: str, title: str, breaks=(), argv=None, min_ranks: int = 1):
        parser = argparse.ArgumentParser(prog=f"minipar lesson {number}")
        parser.add_argument("--quick", action="store_true", help="the short version (tour)")
        parser.add_argument("--break", dest="lab", choices=list(breaks) or None, default=None)
        parser.add_argument("--json", dest="json", default=None, metavar="FILE")
        self.args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        self.quick, self.lab = self.args.quick, self.args.lab
        self.number, self.title = number, title
        self.started = not minipar.is_initialized()  # finish() ends only what the page began
        self.comm = minipar.init()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.console = Console(quiet=self.rank != 0, highlight=False)
        self.failures: list[str] = []
        self.records: list[Claim] = []
        self.observations: list[dict] = []  # measured, not predicted: for the lessons' texts
        self.cores = launcher.cores()
        self.shown_only = os.environ.get(TIMING_ENV) == "shown"
        self.load = self.gather(self._load_now())[0]  # information: the load averages
        self.begun = self.mark = self.snapshot()  # the CPU the run gets, from here
        self.measured_on: cpu_share.Share | None = None  # see machine()
        mode = f"break-it lab: {self.lab}" if self.lab else ("quick" if self.quick else "full")
        ranks = f"{self.size} rank{'s' * (self.size != 1)}"
        self.console.print(
            Panel(
                f"[bold]Lesson {number}: {title}[/]\n{ranks}, {mode}",
                box=box.HEAVY,
                expand=False,
            )
        )
        if self.shown_only:
            self.say(
                f"[yellow]Timing claims are shown, not judged here ({TIMING_ENV}=shown); "
                "bytes, steps and values are judged.[/]"
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
        """A value claim: print PASS or FAIL; a failed check makes the lesson exit 1."""
        return not self.claim(what, True, bool(ok), kind="value", tolerance=claims.EXACT).failed

    def claim(
        self,
        what: str,
        predicted,
        measured,
        unit: str = "",
        tolerance: claims.Tolerance = claims.BANDWIDTH_BOUND,
        kind: str = "time",
        causes=(),
        timed_on: int | None = None,
        **fields,
    ) -> Claim:
        """Judge one predict-then-measure pair, print its verdict and keep its record. causes:
        what this lesson measured that explains a miss (more ranks than cores is added for
        timing claims, counting the `timed_on` ranks that ran the timing when not all of them
        did); fields: bound=(lo, hi), spread=(min, median, max), basis="...",
        reference="..." (a ratio's alternated reference), seconds=(a, b)."""
        share = fields.pop("cpu", None)
        if kind == "time":
            # collective (timing claims are made by every rank, as checks are): rank 0's
            # measurement and the CPU the ranks got while it was measured (the pairs' window,
            # else since the last timing claim, at least MIN_WINDOW), the same on all
            measured, fields["spread"] = self.gather((measured, fields.get("spread")))[0]
            if share is None:
                share = self.cpu_since(self.mark)
                if share.wall < MIN_WINDOW:
                    share = self.cpu_since(self.begun)
            self.mark = self.snapshot()
            self.load = self.gather(self._load_now(during=True))[0]
            causes = [*causes, *claims.environment_causes(timed_on or self.size, self.cores)]
            if self.measured_on and str(fields.get("basis", "")).startswith("measured at"):
                causes.append(f"the prediction's links were measured at this lesson's start "
                              f"while the run did not get its cores: "
                              f"{self.measured_on.describe()}")  # fmt: skip
        record = claims.judge(
            Claim(self.number, what, predicted, measured, unit, tolerance, kind, **fields),
            share,
            causes,
            shown_only=self.shown_only,
        )
        self.records.append(record)
        self.console.print(claims.verdict_line(record))
        if record.failed:
            self.failures.append(what)
        return record

    def alternate(self, a, b, pairs: int) -> claims.Alternated:
        """claims.alternate on every rank (collective: a and b are), rank 0's times for all,
        with the CPU the ranks got while the pairs ran (what the ratio claim is judged with)."""
        start = self.snapshot()
        done = claims.alternate(a, b, pairs)
        return replace(self.gather(done)[0], cpu=self.cpu_since(start))

    def ratio_claim(
        self,
        what,
        predicted,
        pairs: claims.Alternated,
        reference: str,
        tolerance=claims.BANDWIDTH_BOUND,
        causes=(),
        timed_on: int | None = None,
        **fields,
    ) -> Claim:
        """A timing claim measured as a ratio against `reference`, run alternately (page.
        alternate): judged on the pairs' median, the absolute medians kept as information."""
        return self.claim(what, predicted, pairs.ratio, "x", tolerance, "time", causes, timed_on,
                          spread=pairs.spread, reference=reference, seconds=pairs.seconds,
                          cpu=pairs.cpu,
                          **fields)  # fmt: skip

    def machine(self):
        """this_machine (collective), noting whether the run had its cores while the lesson
        measured the links it predicts with (no calibration): if not, that is a cause."""
        start = self.snapshot()
        found = this_machine(self.comm)
        share = self.cpu_since(start)
        if share.busy and not found.basis.startswith("calibrated"):
            self.measured_on = share
        return found

    # -- the CPU the run got ----------------------------------------------------------------
    def snapshot(self) -> cpu_share.Snapshot:
        """Now, on rank 0's machine: the wall clock, /proc/stat and the CPU seconds of every
        rank of this lesson there (collective)."""
        mine = (socket.gethostname(), time.process_time())
        seen = self.gather(mine)
        host = seen[0][0]
        own = sum(cpu for name, cpu in seen if self._one_machine() or name == host)
        return self.gather(cpu_share.Snapshot.now(own) if self.rank == 0 else None)[0]

    def cpu_since(self, start: cpu_share.Snapshot) -> cpu_share.Share:
        """The CPU this lesson's ranks got from `start` to now against what others took."""
        host = self.gather(socket.gethostname())
        here = sum(name == host[0] for name in host)
        ranks = self.size if self._one_machine() else here
        return cpu_share.Share.between(start, self.snapshot(), self.cores, ranks)

    def observe(self, what: str, value: float, unit: str = "") -> float:
        """Keep a measured number the lesson's text quotes (no prediction, no verdict): it goes
        into the --json records beside the claims, where scripts/lesson_numbers.py reads it."""
        self.observations.append({"lesson": self.number, "claim": what, "measured": value,
                                  "unit": unit})  # fmt: skip
        return value

    def _one_machine(self) -> bool:
        """Every rank on this machine (one node, or emulated nodes that share its cores)."""
        return minipar.local_world_size() == self.size or bool(os.environ.get(LINK_ENV))

    def _load_now(self, during: bool = False) -> dict:
        """The load averages, as information only (they lag by a minute): before the ranks
        started (what `minipar lesson` read) and the highest seen while the lesson ran, less
        the lesson's own ranks."""
        own = self.size if self._one_machine() else minipar.local_world_size()
        seen = max(0.0, os.getloadavg()[0] - own)
        if during:
            return {**self.load, "during": max(self.load["during"], seen)}
        before = os.environ.get(LOAD_BEFORE_ENV)
        return {"before": seen if before is None else float(before), "during": seen}

    def write_records(self, path: str, whole: cpu_share.Share) -> None:
        """The lesson's claim records as JSON (rank 0 writes)."""
        if self.rank != 0:
            return
        data = {
            "lesson": self.number,
            "title": self.title,
            "host": socket.gethostname(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "minipar": minipar.__version__,
            "ranks": self.size,
            "cores": self.cores,
            "quick": self.quick,
            "link_bits": float(os.environ[LINK_ENV]) if os.environ.get(LINK_ENV) else None,
            "load": self.load,
            "cpu": whole.record(),
            "busy": whole.busy,
            "tally": claims.tally([r.record() for r in self.records]),
            "timing": claims.timing_tally([r.record() for r in self.records]),
            "claims": [r.record() for r in self.records],
            "observations": self.observations,
        }
        with open(path, "w") as out:
            json.dump(data, out, indent=1)

    def finish(self) -> int:
        status = 0 if not self.failures and self.enough else 1
        counts = claims.tally([r.record() for r in self.records])
        self.say(
            f"\n{counts['claims']} claims: {counts['within']} within tolerance, "
            f"{counts['explained']} outside with a measured cause, {counts['not judged']} not "
            f"judged (timing), {counts['outside'] + counts['impossible']} failed. "
            "[dim](How to read a verdict: lessons/README.md)[/]"
        )
        timing = claims.timing_tally([r.record() for r in self.records])
        if timing["timing"]:
            self.say(f"Timing: {timing['timing']} claims ({timing['ratios']} ratios measured in "
                     f"one run), {timing['judged']} judged, {timing['within']} of those "
                     "within.")  # fmt: skip
        if self.failures:
            self.say(f"[bold red]{len(self.failures)} check(s) failed.[/]")
        whole = self.cpu_since(self.begun)  # collective
        if whole.busy:
            self.say(f"[yellow]This run did not get its cores: {whole.describe()}. Its absolute "
                     "times were shown, not judged; its ratios were judged.[/]")  # fmt: skip
        if self.args.json:
            self.write_records(self.args.json, whole)
        if self.started:  # a program that started minipar itself (a test's ranks) keeps it
            minipar.finalize()
        return status
