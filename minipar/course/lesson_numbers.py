"""Numbers in lessons/*.md that describe this machine, tied to the run that measured them.

In a lesson's text such a number carries an invisible marker naming its record (rich and any
Markdown renderer hide the comment):

    measured the ring at 1.41x<!-- 04-nodes: ring / hierarchical at 16 MiB on 2 x 2 -->

`04-nodes` is lessons/records/04-nodes.json (what `minipar lesson 04 --quick --nodes 2 --json`
wrote), the rest the claim's (or observation's) name; `; predicted` after the name quotes the
prediction instead of the measurement, `@load` the run's load average, `@lost` the share of
the CPU its ranks wanted that other processes took (lessons/README.md). scripts/lesson_numbers.py
rewrites every marked number from its record (`write`) after a new recorded run (`record`);
tests/test_lesson_numbers.py fails when a number and its record disagree beyond the claim's
tolerance (an observation's: +-25%).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from minipar.course import claims
from minipar.course.formats import fmt_value

# a number and its unit joined by a no-break space (as written here), then the marker
MARKED = re.compile(r"([^ \t\n<|]+?)<!-- ([\w-]+): (.+?) -->")
SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
         "x": 1.0, "%": 0.01, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}  # fmt: skip
OBSERVED = claims.relative(0.25)


def marks(text: str) -> list[tuple[str, str, str, str]]:
    """(number as written, record name, claim name, field) for every marked number."""
    out = []
    for found in MARKED.finditer(text):
        written, record, name = found.groups()
        name, _, field = name.partition("; ")
        out.append((written, record, name.strip(), field.strip() or "measured"))
    return out


def load(folder: Path, record: str) -> dict:
    return json.loads((Path(folder) / f"{record}.json").read_text())


def find(data: dict, name: str) -> dict:
    """The claim or observation called `name` in a record."""
    if name == "@load":
        value = max(data["load"]["before"], data["load"]["during"])
        return {"claim": name, "measured": value, "unit": "", "tolerance_kind": "exact"}
    if name == "@lost":  # the share of the CPU its ranks wanted that others took (cpu_share)
        if "cpu" not in data:
            raise KeyError(f"the record of lesson {data['lesson']} predates the CPU share")
        return {"claim": name, "measured": data["cpu"]["lost"], "unit": "fraction"}
    for row in data.get("claims", []) + data.get("observations", []):
        if row["claim"] == name:
            return row
    raise KeyError(f"no claim or observation {name!r} in the record of lesson {data['lesson']}")


def shown(row: dict, field: str) -> str:
    """The number as the text writes it (the unit the printed table uses)."""
    value = row[field]
    if row.get("unit") == "FLOP/s":
        return f"{value / 1e9:.3g}\u00a0GFLOP/s"
    if row["claim"] == "@lost":
        return f"{row['measured']:.0%}"
    if row.get("unit") in ("", "tokens"):
        return f"{value:.2f}" if row["claim"] == "@load" else f"{value:,.0f}"
    return fmt_value(value, row["unit"]).replace(" ", "\u00a0")


def parse(written: str) -> float:
    """'1.41x' -> 1.41, '83.0%' -> 0.83, '231\u00a0MB/s' -> 2.31e8, '1,234' -> 1234."""
    text = written.replace("\u00a0", " ").replace(",", "")
    found = re.fullmatch(r"~?(-?[\d.]+)\s*([A-Za-z/%]*)", text)
    if not found:
        raise ValueError(f"cannot read the number {written!r}")
    unit = found.group(2)
    scale = 1e9 if unit == "GFLOP/s" else SCALE.get(unit, 1.0)
    return float(found.group(1)) * scale


def disagreements(text: str, folder: Path) -> list[str]:
    """What in `text` disagrees with its records beyond the tolerance (empty: all agree)."""
    bad = []
    for written, record, name, field in marks(text):
        row = find(load(folder, record), name)
        if "tolerance_kind" in row and "verdict" in row:
            tolerance = claims.Tolerance(row["tolerance_kind"], row["tolerance_value"])
        else:
            tolerance = claims.relative(0.01) if name in ("@load", "@lost") else OBSERVED
        value = row[field]
        if tolerance.kind in ("at_least", "at_most", "exact"):
            tolerance = claims.relative(0.01)  # the number itself, as written, to rounding
        if not tolerance.holds(value, parse(written)):
            bad.append(f"{written} ({record}: {name}, {field} {shown(row, field)}, {tolerance})")
    return bad


def rewrite(text: str, folder: Path) -> str:
    """`text` with every marked number written afresh from its record."""

    def fresh(found) -> str:
        written, record, name = found.groups()
        name, _, field = name.partition("; ")
        row = find(load(folder, record), name.strip())
        return f"{shown(row, field.strip() or 'measured')}<!-- {record}: {found.group(3)} -->"

    return MARKED.sub(fresh, text)
