"""Mismatch soak: randomized calls, about one in 50 with a mistake injected on one rank; every
mistake must raise MismatchError on every rank of its group, and no clean call may raise.

    minipar run -n 4 scripts/mismatch_soak.py --calls 10000 --seed 7     # the full form
    minipar run -n 4 scripts/mismatch_soak.py --calls 300 --rate 20      # the short form (tests)

Default settings: no debug mode, the default mismatch_after; each group's timeout is --timeout
(20 s), so a mistake nobody caught shows as a CommTimeoutError (a miss), not a hang.
Every rank draws the same calls from the seed (scripts/soak.py's draw: collective, algorithm,
dtype, size, root, op) on one of a few groups made with new_group (every rank, a half, the even
or the odd ranks); the results of clean calls are checked against numpy (soak.py's checks).
An injected call has a kind and a victim rank of its group, which makes that call differently:

    root       broadcast with another src        dst        reduce or gather with another dst
    src        scatter with another src          group      the same call on a twin group
    count      one more element per block        dtype      another dtype of the same size
    op         another reduction op              collective another collective
    algorithm  another (named) algorithm         skipped    no call at all

Then every rank of the group calls barrier() on it until it raises (the program going on): each
must raise MismatchError within --deadline seconds of the last rank's bad call. Outcomes travel
on a control group of their own; the failed groups are made anew, in the same order everywhere.
Rank 0 prints the counts and, per kind, the time from the last rank's bad call to the last
rank's MismatchError (min / median / max). Exit status 0 only when every injection was caught on
every rank, no clean call raised and nothing hung.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import soak  # scripts/soak.py, beside this file: the calls and their numpy checks

import minipar
from minipar.errors import MiniparError, MismatchError

KINDS = ["root", "dst", "src", "group", "count", "dtype", "op", "collective", "algorithm",
         "skipped"]  # fmt: skip
FORCED = {"root": ["broadcast"], "dst": ["reduce", "gather"], "src": ["scatter"],
          "op": ["all_reduce", "reduce", "reduce_scatter_tensor"]}  # fmt: skip
SAME_SIZE = {"float64": "int64", "int64": "float64", "float32": "int32", "int32": "float32",
             "float16": "int16", "int8": "uint8", "uint8": "int8"}  # fmt: skip
OTHER = {"broadcast": "all_reduce", "all_reduce": "broadcast", "reduce": "all_reduce"}


class Groups:
    """The groups calls run on: for each member set a group and its twin (same members)."""

    def __init__(self, world, timeout: float):
        p = world.size
        self.members = [list(range(p)), list(range(p // 2)), list(range(p // 2, p)),
                        list(range(0, p, 2)), list(range(1, p, 2))]  # fmt: skip
        self.members = [m for m in self.members if len(m) >= 2] or [list(range(p))]
        self.timeout, self.made = timeout, 0
        self.pairs = [self.make(m) for m in self.members]

    def make(self, ranks):
        """A group and its twin on `ranks` (every rank calls new_group: the same order)."""
        self.made += 1
        pair = []
        for half in ("", "twin"):
            group = minipar.new_group(ranks, self.timeout, name=f"g{self.made}{half}{ranks}")
            pair.append(group)
        return pair

    def failed(self, k: int, rank: int) -> bool:
        """Whether pair k failed on this rank (a member)."""
        pair = self.pairs[k]
        return rank in self.members[k] and any(g._failure is not None for g in pair)

    def remake(self, failed: set[int]) -> None:
        for k in sorted(failed):
            self.pairs[k] = self.make(self.members[k])


def draw_call(rng, groups, world, max_bytes: int, rate: int):
    """(spec for soak.run_call, injection or None), the same on every rank."""
    k = int(rng.integers(len(groups.members)))
    pair = groups.pairs[k]
    spec = soak.draw(rng, [(groups.members[k], pair[0])], max_bytes)
    spec["async_op"], spec["k"] = False, k
    if rng.random() >= 1 / rate:
        return spec, None
    kind = KINDS[int(rng.integers(len(KINDS)))]
    if kind in FORCED:
        spec["collective"] = FORCED[kind][int(rng.integers(len(FORCED[kind])))]
    elif spec["collective"] == "barrier":  # nothing to disagree about but the call itself
        spec["collective"] = "all_reduce"
    named = [a for a in minipar.algorithms(spec["collective"]) if a != "auto"]
    spec["algorithm"] = named[int(rng.integers(len(named)))]
    spec["block"] = max(spec["block"], 1)
    if spec["dtype"].kind != "f" and spec["op"] == "avg":
        spec["op"] = "sum"
    victim = int(rng.integers(len(spec["ranks"])))
    return spec, {"kind": kind, "victim": victim, "named": named, "pair": pair}


def mistaken(spec, injection):
    """The victim's version of the call (a changed copy of spec), or None: it skips it."""
    kind, theirs = injection["kind"], dict(spec)
    n = len(spec["ranks"])
    if kind in ("root", "dst", "src"):
        theirs["root"] = (spec["root"] + 1) % n
    elif kind == "group":
        theirs["group"] = injection["pair"][1]
    elif kind == "count":
        theirs["block"] = spec["block"] + 1
    elif kind == "dtype":
        theirs["dtype"] = np.dtype(SAME_SIZE[spec["dtype"].name])
        if theirs["dtype"].kind != "f" and theirs["op"] == "avg":
            theirs["op"] = "sum"
    elif kind == "op":
        theirs["op"] = "max" if spec["op"] != "max" else "min"
    elif kind == "collective":
        theirs["collective"] = OTHER.get(spec["collective"], "broadcast")
        theirs["algorithm"] = "auto"
    elif kind == "algorithm":
        named = injection["named"]
        theirs["algorithm"] = named[(named.index(spec["algorithm"]) + 1) % len(named)]
        if len(named) == 1:  # nothing else to pick: call it with another root instead
            theirs["root"] = (spec["root"] + 1) % n
    elif kind == "skipped":
        return None
    return theirs


def injected(seed, i, spec, injection, me, deadline: float):
    """Run the mistaken call on this rank, then barriers until it raises:
    (start, end, outcome, message)."""
    mine = mistaken(spec, injection) if me == injection["victim"] else spec
    start = time.time()
    try:
        if mine is not None:
            soak.run_call(seed, i, mine, me)
        group = spec["group"] if mine is None else mine["group"]
        while time.time() < start + deadline:
            minipar.barrier(group=group)
            time.sleep(0.01)
    except MismatchError as error:
        return start, time.time(), "caught", str(error)
    except MiniparError as error:
        return start, time.time(), type(error).__name__, str(error)
    return start, time.time(), "missed", ""


def clean(seed, i, spec, me) -> str | None:
    """Run a clean call and check its result: None, or what went wrong (a false alarm)."""
    try:
        work, check = soak.run_call(seed, i, spec, me)
        check()
    except Exception as error:  # noqa: BLE001  (counted and reported below)
        return f"{type(error).__name__}: {error}"
    return None


def summary(times: dict) -> str:
    rows = []
    for kind in KINDS:
        t = sorted(times.get(kind, []))
        if t:
            spread = f"{t[0]:.2f} / {t[len(t) // 2]:.2f} / {t[-1]:.2f} s"
            rows.append(f"  {kind:<10} {len(t):4d} injected, caught in {spread} (min/median/max)")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    parser.add_argument("--rate", type=int, default=50, help="one call in RATE is injected")
    parser.add_argument("--max-bytes", default="4KiB", help="largest buffer (default 4KiB)")
    parser.add_argument("--timeout", type=float, default=20.0, help="each group's timeout")
    parser.add_argument("--deadline", type=float, default=5.0, help="seconds to catch one")
    args = parser.parse_args()
    world = minipar.init()
    control = world.split(list(range(world.size)), name="soak-control")
    seed = args.seed
    if seed is None:
        seed = control.allgather_object(int(np.random.SeedSequence().entropy % 2**31))[0]
    if world.rank == 0:
        print(f"mismatch soak: seed {seed}, {args.calls} calls on {world.size} ranks, one in "
              f"{args.rate} injected", flush=True)  # fmt: skip
    rng = np.random.default_rng(seed)
    groups = Groups(world, args.timeout)
    max_bytes = soak.parse_bytes(args.max_bytes)
    counts = {"injected": 0, "caught": 0, "missed": 0, "false": 0}
    times: dict = {}
    problems = []
    begin = time.monotonic()
    for i in range(args.calls):
        spec, injection = draw_call(rng, groups, world, max_bytes, args.rate)
        member = world.rank in spec["ranks"]
        me = spec["ranks"].index(world.rank) if member else None
        if injection is None:
            wrong = clean(seed, i, spec, me) if member else None
            if wrong is None:
                continue
            counts["false"] += 1
            problems.append(f"call {i} (clean, {soak.describe(i, spec)}): {wrong}")
            continue
        outcome = injected(seed, i, spec, injection, me, args.deadline) if member else None
        everyone = control.allgather_object(outcome)
        seen = [o for o in everyone if o is not None]
        counts["injected"] += 1
        kind = injection["kind"]
        if all(o[2] == "caught" for o in seen):
            counts["caught"] += 1
            times.setdefault(kind, []).append(max(o[1] for o in seen) - max(o[0] for o in seen))
        else:
            counts["missed"] += 1
            problems.append(f"call {i} ({kind} on rank {injection['victim']} of "
                            f"{spec['ranks']}, {soak.describe(i, spec)}): "
                            f"{[(o[2], o[3][:200]) for o in seen]}")  # fmt: skip
        failed = {k for k in range(len(groups.pairs)) if groups.failed(k, world.rank)}
        groups.remake(set().union(*control.allgather_object(failed)))
        if world.rank == 0 and counts["injected"] % 25 == 0:
            print(f"mismatch soak: {i + 1} calls, {counts['injected']} injected, "
                  f"{time.monotonic() - begin:.0f} s", flush=True)  # fmt: skip
    falses = control.allgather_object(counts["false"])
    if world.rank == 0:
        verdict = (f"mismatch soak: seed {seed}: {args.calls} calls on {world.size} ranks, "
                   f"{counts['injected']} injected, {counts['caught']} caught on every rank, "
                   f"{counts['missed']} missed, {sum(falses)} false alarms, 0 hangs, "
                   f"{time.monotonic() - begin:.0f} s")  # fmt: skip
        print(verdict + "\n" + summary(times), flush=True)
    for problem in problems[:20]:
        print(f"[rank {world.rank}] {problem}", file=sys.stderr, flush=True)
    ok = counts["missed"] == 0 and sum(falses) == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
