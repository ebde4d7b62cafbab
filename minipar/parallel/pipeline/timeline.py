"""What each pipeline rank computed when: measured (from a step) or simulated (from verify).

    tl = Timeline.gather(pipe)        # every rank calls it after pipe.step(); all get the same
    tl.bubble_fraction                # idle share of the step, averaged over ranks
    tl.print()                        # a Gantt chart in the terminal (rich)
    tl.save_png("pipe.png")           # the same with matplotlib (the plot extra)

Bubble: the makespan runs from the first compute start to the last compute end on any rank;
a rank's bubble is the part of it that rank spent not computing (waiting for messages included).
Measured clocks are time.perf_counter(), one monotonic clock for every process on a host.
"""

from __future__ import annotations

from dataclasses import dataclass

LETTERS = {"Forward": "F", "Backward": "B", "BackwardInput": "b", "BackwardWeight": "w"}
COLOURS = {"F": "cyan", "B": "magenta", "b": "green", "w": "yellow"}
KEY = "F3 micro-batch 3's forward, B backward, b input grad, w weight grad; - going on, . idle"


@dataclass
class Timeline:
    rows: list  # per rank: [(kind letter, mb, chunk, start, end)], times from the first start

    @classmethod
    def from_events(cls, per_rank) -> Timeline:
        """per_rank[r]: [(instruction, start, end)] with any common clock."""
        starts = [s for events in per_rank for _, s, _ in events]
        t0 = min(starts) if starts else 0.0
        rows = [
            [(LETTERS[type(ins).__name__], ins.mb, ins.chunk, s - t0, e - t0) for ins, s, e in ev]
            for ev in per_rank
        ]
        return cls(rows)

    @classmethod
    def gather(cls, pipe) -> Timeline:
        """Collective over the pipeline's group: everyone's measured events of the last step."""
        mine = pipe.events
        return cls.from_events(pipe.comm.allgather_object(mine, "pipeline timeline"))

    @classmethod
    def simulated(cls, report) -> Timeline:
        """From verify()'s Report: the predicted timeline in cost units."""
        return cls.from_events(report.events)

    @property
    def makespan(self) -> float:
        ends = [e for row in self.rows for *_, e in row]
        return max(ends) if ends else 0.0

    @property
    def busy(self) -> list[float]:
        return [sum(e - s for *_, s, e in row) for row in self.rows]

    @property
    def bubble(self) -> list[float]:
        span = self.makespan
        return [1 - b / span if span else 0.0 for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        return sum(self.bubble) / len(self.rows) if self.rows else 0.0

    def text(self, width: int = 72, fold: int | None = None):
        """A rich Text: one line per rank, one character per time slot (`width` slots over the
        step). Each task opens with its kind's letter and the micro-batch's last digit ('F3':
        micro-batch 3's forward), '-' while it lasts, '.' idle: readable without colour (piped,
        printed); the colour (by kind) only helps the eye. A task of one slot shows its letter
        alone. With `fold`, the chart is cut into blocks of that many slots, one under the
        other (each rank's bubble after the last block)."""
        from rich.text import Text

        rows = [self._cells(row, width) for row in self.rows]
        fold = fold or width
        out = Text()
        for start in range(0, width, fold):
            last_block = start + fold >= width
            if start:
                out.append(f"{'':7}... from {start / width:.0%} of the step\n", style="dim")
            for rank, cells in enumerate(rows):
                out.append(f"rank {rank} ", style="bold")
                for char, style in cells[start : start + fold]:
                    out.append(char, style=style)
                out.append(f"  bubble {self.bubble[rank]:.0%}\n" if last_block else "\n")
        out.append(KEY)
        return out

    def _cells(self, row, width: int) -> list[tuple[str, str]]:
        """One rank's (character, style) per slot; a task covers the slots its start and end
        round to (at least one), so a task two slots long never loses its digit."""
        span = self.makespan or 1.0
        cells = [(".", "dim")] * width
        for kind, mb, _, s, e in row:
            first = min(int(s / span * width + 0.5), width - 1)
            last = min(max(first, int(e / span * width + 0.5) - 1), width - 1)
            label = f"{kind}{mb % 10}"
            for i in range(first, last + 1):
                char = label[i - first] if i - first < len(label) else "-"
                cells[i] = (char, f"bold {COLOURS[kind]}")
        return cells

    def labelled_width(self, line: int, most: int = 3) -> int:
        """Slots enough for the shortest task to span two (its letter and digit), in whole
        lines of `line` slots: one line at least, `most` at most."""
        spans = [e - s for row in self.rows for *_, s, e in row if e > s]
        need = int(2 * self.makespan / min(spans)) + 1 if spans else line
        return min(-(-need // line), most) * line

    def print(self, console=None, width: int = 72) -> None:
        """The chart in lines of `width` slots, folded into as many blocks as the shortest task
        needs to keep its label (labelled_width)."""
        # here, not at the top of the file: rich loads only when used
        from minipar.term import Console

        (console or Console()).print(self.text(self.labelled_width(width), fold=width))

    def save_png(self, path: str, title: str = "") -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        colours = {"F": "tab:cyan", "B": "tab:purple", "b": "tab:green", "w": "tab:olive"}
        fig, ax = plt.subplots(figsize=(10, 0.6 * len(self.rows) + 1.2))
        for rank, row in enumerate(self.rows):
            for kind, mb, _, s, e in row:
                ax.broken_barh([(s, e - s)], (rank - 0.4, 0.8), color=colours[kind])
                ax.text((s + e) / 2, rank, str(mb), ha="center", va="center", fontsize=7)
        ax.set_yticks(range(len(self.rows)), [f"rank {r}" for r in range(len(self.rows))])
        ax.invert_yaxis()
        ax.set_xlabel("time")
        ax.set_title(title or f"bubble {self.bubble_fraction:.1%}")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
