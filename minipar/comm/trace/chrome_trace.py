"""The trace ledgers of every rank as one timeline: Chrome's trace-event JSON, opened by Perfetto
(ui.perfetto.dev) and chrome://tracing.

    with minipar.trace() as t:
        t.align()              # collective: each rank's clock offset to rank 0, measured now
        train_step()
    t.save("x.json")           # collective: rank 0 writes every rank's part, merged

What the file holds (the Trace Event Format: an object whose "traceEvents" is a list of events,
each with ph, the phase, ts in microseconds, pid and tid):
- one process per rank (pid: the world rank, named "rank r"), one thread per thread that did
  something (the main one; the progress thread that runs async collectives: DDP's buckets);
- a complete event (ph "X") per collective call: its name, and in args the algorithm, group,
  bytes sent and received and steps; and one per span a strategy marked (ledger.span):
  pipeline instructions, FSDP units' forward and backward, DDP's bucket launches and waits,
  recomputation;
- each message as a flow from the span that sent it to the span that received it: ph "s" at
  the sender when it was posted, ph "f" (bound to the enclosing slice: bp "e") at the receiver
  when the receive completed, with one id; a message whose partner is not in the file (traced
  on one side only) is an instant event (ph "i"). Every message of the ledger is one event.
  A message between nodes (the node map, runtime/nodes.py) is named "message between nodes"
  and coloured apart (cname "terrible", a red; inside a node "good", a green), and a call's
  args count its bytes_between_nodes;
- counter events (ph "C"): the saved activation bytes (parallel/activation_memory.py).

Clocks. Each rank stamps with its own time.perf_counter(). `clock_offset` measures, for each
rank, what to add to its clock to read rank 0's: it asks rank 0 the time 8 times and keeps the
fastest round trip (Cristian's algorithm: rank 0 answered at some moment inside it, so the
error is at most half that round trip). The merge then checks every message: one that would
arrive before it left (an estimate's error larger than the message's latency) moves its
receiver's clock forward by the least amount that orders it, propagated over the ranks until
every message is in order (difference constraints, relaxed as in Bellman-Ford); the largest
correction is in otherData, beside the measured bounds. On one host perf_counter is one clock
for every process and the offsets come out within microseconds of zero.

`validate(doc)` checks a document against the format's field rules (tests/test_trace.py):
Perfetto's own reader, trace_processor, is a binary its Python package downloads on first use,
which a machine without a network cannot.
"""

from __future__ import annotations

import json
import os
import time

from minipar.state import process

CLOCK_TAG = (1 << 15) + 2  # beside comm/transport/base.py's control tags, below every collective's
ROUNDS = 8
FLOW = "message"  # the name and category of every flow event
BETWEEN = "message between nodes"  # the name of a flow from one node to another
COLOURS = {False: "good", True: "terrible"}  # cname: trace viewers' reserved colour names


def clock_offset(comm, rounds: int = ROUNDS, clock=time.perf_counter) -> tuple[float, float]:
    """(offset, error): seconds to add to this rank's clock to read group rank 0's, and the
    bound on its error (half the fastest round trip). Collective: rank 0 answers each rank in
    turn, `rounds` times; 16 bytes a round, outside the ledger. Rank 0: (0.0, 0.0). `clock`:
    time.perf_counter (the ledger's), or another in tests (a skew imposed on purpose)."""
    # here, not at the top of the file: numpy loads only when used
    import numpy as np

    if comm.size == 1:
        return 0.0, 0.0
    stamp = np.zeros(1, dtype=np.float64)
    if comm.rank == 0:
        for peer in range(1, comm.size):
            for _ in range(rounds):
                comm._post_recv(stamp, peer, CLOCK_TAG).wait()
                stamp[0] = clock()
                comm._post_send(stamp, peer, CLOCK_TAG).wait()
        return 0.0, 0.0

    def ask() -> float:
        comm._post_send(stamp, 0, CLOCK_TAG).wait()
        comm._post_recv(stamp, 0, CLOCK_TAG).wait()
        return float(stamp[0])

    return estimate_offset(ask, clock, rounds)


def estimate_offset(ask, clock, rounds: int = ROUNDS) -> tuple[float, float]:
    """Cristian's estimate: `rounds` times read t0 = clock(), ask the reference its time s
    (ask()), read t1 = clock(); keep the fastest round trip and return (s - (t0 + t1) / 2,
    (t1 - t0) / 2). If the question took d_out to arrive and the answer d_back, the reference
    answered at our t0 + d_out, and the estimate is the true offset + (d_out - d_back) / 2:
    exact for equal delays, never off by more than half the round trip (d_out + d_back) / 2,
    the error returned."""
    best = (float("inf"), 0.0)
    for _ in range(rounds):
        t0 = clock()
        s = ask()
        t1 = clock()
        best = min(best, (t1 - t0, s - (t0 + t1) / 2))
    return best[1], best[0] / 2


def part(trace, rank: int) -> dict:
    """This rank's records, on its own clock, as plain JSON data (what `minipar run --trace`
    writes per rank and `merge` reads)."""
    offset, error = getattr(trace, "clock", (0.0, 0.0))
    calls = [
        [c.group, c.collective, c.algorithm, c.seq, c.start, c.end, c.thread, c.bytes_sent,
         c.bytes_received, c.steps, c.bytes_between_nodes]
        for c in trace.calls
        if c.start is not None
    ]  # fmt: skip
    messages = []
    for m in trace.messages:
        k = m.clock
        messages.append([m.group, m.rank, m.collective, m.seq, m.kind, m.peer, m.nbytes, m.tag,
                         k.posted, k.thread, k.done, k.done_thread, k.peer])  # fmt: skip
    return {
        "rank": rank,
        "offset": offset,
        "error": error,
        "groups": trace.groups,
        "threads": [[ident, name] for ident, name in trace.threads.items()],
        "calls": calls,
        "messages": messages,
        "spans": [[s.name, s.cat, s.start, s.end, s.thread, s.args] for s in trace.spans],
        "counters": [list(c) for c in trace.counters],
        "nodes": list(process.nodes.node_of) if process.nodes is not None else None,
    }


def pair_messages(parts) -> tuple[list, list]:
    """([(send, receive)] of messages found on both sides, [unmatched]), each message as
    (rank, its row in the part). A send and a receive pair when they are the k-th between the
    same two ranks on the same call (or point-to-point tag) of the same group: MPI delivers the
    messages of one (sender, tag, communicator) in the order they were sent."""
    sends, recvs = {}, {}
    for p in parts:
        for row in p["messages"]:
            group, _, _, seq, kind, peer, _, tag, *_rest, any_peer = row
            ranks = p["groups"][group]
            other = any_peer if peer == -1 else peer
            if other is None:  # a receive from any rank that never completed
                recvs.setdefault(None, []).append((p["rank"], row))
                continue
            src, dst = (p["rank"], ranks[other]) if kind == "send" else (ranks[other], p["rank"])
            key = (group, seq if seq >= 0 else ("p2p", tag), src, dst)
            (sends if kind == "send" else recvs).setdefault(key, []).append((p["rank"], row))
    pairs, unmatched = [], list(recvs.pop(None, []))
    for key, out in sends.items():
        inn = recvs.pop(key, [])
        pairs += zip(out, inn)
        unmatched += out[len(inn) :] + inn[len(out) :]
    for rest in recvs.values():
        unmatched += rest
    return pairs, unmatched


def causal_offsets(parts, pairs) -> tuple[dict, float]:
    """Each rank's offset (measured), moved forward as little as needed so that every paired
    message completes no earlier than it was posted; and the largest move, in seconds."""
    offset = {p["rank"]: p["offset"] for p in parts}
    edges = [
        (s[0], r[0], s[1][8] - r[1][10]) for s, r in pairs if r[1][10] is not None
    ]  # (sender, receiver, posted - done): offset[receiver] - offset[sender] >= that
    for _ in range(len(offset) + 1):
        moved = False
        for src, dst, gap in edges:
            if offset[dst] - offset[src] < gap:
                offset[dst] = offset[src] + gap
                moved = True
        if not moved:
            break
    else:
        raise ValueError("trace merge: the messages' times admit no consistent clock offsets")
    return offset, max((offset[p["rank"]] - p["offset"] for p in parts), default=0.0)


def merge(parts) -> dict:
    """One trace-event document from every rank's part (see the module docstring)."""
    parts = sorted(parts, key=lambda p: p["rank"])
    pairs, unmatched = pair_messages(parts)
    offset, moved = causal_offsets(parts, pairs)
    times = [row[8] + offset[p["rank"]] for p in parts for row in p["messages"]]
    times += [s[2] + offset[p["rank"]] for p in parts for s in p["spans"]]
    times += [c[4] + offset[p["rank"]] for p in parts for c in p["calls"]]
    t0 = min(times, default=0.0)
    tids = {p["rank"]: {ident: i for i, (ident, _) in enumerate(p["threads"])} for p in parts}

    def us(rank, t):
        return round((t + offset[rank] - t0) * 1e6, 3)

    def tid(rank, ident):
        return tids[rank].setdefault(ident, len(tids[rank]))

    events = []
    for p in parts:
        r = p["rank"]
        events += _metadata(r, p["threads"])
        for group, coll, algo, seq, start, end, thread, sent, received, steps, *rest in p["calls"]:
            args = {"algorithm": algo, "group": group, "seq": seq, "bytes_sent": sent,
                    "bytes_received": received, "steps": steps,
                    "bytes_between_nodes": rest[0] if rest else 0}  # fmt: skip
            events.append(_slice(coll, "collective", us(r, start), us(r, end), r,
                                 tid(r, thread), args))  # fmt: skip
        for name, cat, start, end, thread, args in p["spans"]:
            events.append(_slice(name, cat, us(r, start), us(r, end), r, tid(r, thread), args))
        for t, name, value in p["counters"]:
            events.append({"ph": "C", "name": name, "ts": us(r, t), "pid": r, "tid": 0,
                           "args": {"bytes": value}})  # fmt: skip
    node_of = next((p["nodes"] for p in parts if p.get("nodes")), None)
    for n, ((rs, send), (rr, recv)) in enumerate(pairs):
        across = node_of is not None and node_of[rs] != node_of[rr]
        args = {"bytes": send[6], "group": send[0], "collective": send[2],
                "between_nodes": across}  # fmt: skip
        name, colour = BETWEEN if across else FLOW, COLOURS[across]
        events.append({"ph": "s", "id": n, "name": name, "cat": FLOW, "ts": us(rs, send[8]),
                       "pid": rs, "tid": tid(rs, send[9]), "args": args,
                       "cname": colour})  # fmt: skip
        done, thread = (recv[10], recv[11]) if recv[10] is not None else (recv[8], recv[9])
        events.append({"ph": "f", "bp": "e", "id": n, "name": name, "cat": FLOW,
                       "ts": us(rr, done), "pid": rr, "tid": tid(rr, thread),
                       "cname": colour})  # fmt: skip
    for r, row in unmatched:
        events.append({"ph": "i", "s": "t", "name": f"{row[4]} (unmatched)", "cat": FLOW,
                       "ts": us(r, row[8]), "pid": r, "tid": tid(r, row[9]),
                       "args": {"bytes": row[6], "group": row[0]}})  # fmt: skip
    events = _enclose_flows(events)
    events.sort(key=lambda e: (e["ph"] != "M", e["ts"], -e.get("dur", 0)))
    other = {
        "clock_offsets_s": {str(p["rank"]): offset[p["rank"]] for p in parts},
        "clock_error_bounds_s": {str(p["rank"]): p["error"] for p in parts},
        "clock_correction_s": moved,
        "messages": sum(len(p["messages"]) for p in parts),
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _metadata(rank: int, threads) -> list:
    meta = {"ph": "M", "ts": 0, "pid": rank, "tid": 0}
    out = [{**meta, "name": "process_name", "args": {"name": f"rank {rank}"}},
           {**meta, "name": "process_sort_index", "args": {"sort_index": rank}}]  # fmt: skip
    for i, (_, name) in enumerate(threads):
        label = "main" if name == "MainThread" else name
        out.append({**meta, "tid": i, "name": "thread_name", "args": {"name": label}})
    return out


def _slice(name, cat, ts, end, pid, tid, args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": round(max(end - ts, 0.0), 3),
            "pid": pid, "tid": tid, "args": args}  # fmt: skip


def _enclose_flows(events) -> list:
    """A flow binds to the slice around its timestamp on its thread; a message sent or received
    outside every span (a plain send of the user's) gets a slice of its own, "send"/"recv",
    one microsecond long or up to the next slice on that thread."""
    slices: dict = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():
        spans.sort()
    extra = []
    for e in events:
        if e["ph"] not in ("s", "f"):
            continue
        spans = slices.setdefault((e["pid"], e["tid"]), [])
        if any(a <= e["ts"] <= b for a, b in spans):
            continue
        later = [a for a, _ in spans if a > e["ts"]]
        end = min([e["ts"] + 1.0, *later])
        name = "send" if e["ph"] == "s" else "recv"
        extra.append(_slice(name, "p2p", e["ts"], end, e["pid"], e["tid"], {}))
        spans.append((e["ts"], end))
        spans.sort()
    return events + extra


def write(doc: dict, path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def save(trace, path: str, group=None) -> str | None:
    """Trace.save: every rank's part gathered (a pickled all-gather on the control plane), merged
    and written by group rank 0 (global ranks as pids). Outside a minipar world: this process
    alone. Clocks: the offsets `Trace.align` measured, else measured now."""
    comm = group if group is not None else process.world
    if comm is None:
        return write(merge([part(trace, 0)]), path)
    if not hasattr(trace, "clock"):
        trace.clock = clock_offset(comm)
    mine = part(trace, comm.global_ranks[comm.rank])
    parts = comm.allgather_object(mine, "trace: gathering every rank's part")
    return write(merge(parts), path) if comm.rank == 0 else None


def merge_folder(folder: str, out: str | None = None) -> str:
    """`minipar run --trace DIR`: the ranks' parts (DIR/rank*.json) merged into DIR/trace.json."""
    names = sorted(n for n in os.listdir(folder) if n.startswith("rank") and n.endswith(".json"))
    if not names:
        raise ValueError(f"no rank*.json trace parts in {folder}")
    parts = []
    for name in names:
        with open(os.path.join(folder, name)) as f:
            parts.append(json.load(f))
    return write(merge(parts), out or os.path.join(folder, "trace.json"))


PHASES = {"X", "B", "E", "i", "I", "C", "s", "t", "f", "M", "b", "e", "n"}


def validate(doc) -> list[str]:
    """The problems of a trace-event document against the format's field rules (empty: none):
    a "traceEvents" list of objects, each with ph (a known phase), ts (microseconds), pid and tid
    (integers) and a name; complete events with a non-negative dur, properly nested on each
    thread; counters with numeric args; instant events with a scope; flows paired (one "s" and
    one "f" per id, the same name and category), their finish not before their start, and
    each end inside a slice of its thread (where Perfetto binds it)."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        return ["no traceEvents list"]
    problems, flows, slices = [], {}, {}
    for n, e in enumerate(events):
        where = f"event {n} ({e.get('name')!r}, ph {e.get('ph')!r})" if isinstance(e, dict) else n
        if not isinstance(e, dict):
            problems.append(f"event {n} is not an object")
            continue
        if e.get("ph") not in PHASES:
            problems.append(f"{where}: unknown phase")
        for key, kind in (("ts", (int, float)), ("pid", int), ("tid", int), ("name", str)):
            if not isinstance(e.get(key), kind) or isinstance(e.get(key), bool):
                problems.append(f"{where}: {key} missing or not a {kind}")
        ph = e.get("ph")
        if not isinstance(e.get("ts"), (int, float)):
            continue  # said above; nothing else about it can be checked
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                problems.append(f"{where}: dur missing or negative")
            else:
                slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        if ph == "C" and not all(isinstance(v, (int, float)) for v in e.get("args", {}).values()):
            problems.append(f"{where}: a counter's args must be numbers")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: an instant event's scope must be g, p or t")
        if ph in ("s", "t", "f"):
            flows.setdefault(e.get("id"), []).append(e)
    for ident, ends in flows.items():
        phases = sorted(x["ph"] for x in ends)
        if phases != ["f", "s"]:
            problems.append(f"flow {ident}: phases {phases}, not one s and one f")
            continue
        s, f = sorted(ends, key=lambda x: x["ph"] != "s")
        if (s.get("name"), s.get("cat")) != (f.get("name"), f.get("cat")):
            problems.append(f"flow {ident}: start and finish differ in name or category")
        if f["ts"] < s["ts"]:
            problems.append(f"flow {ident}: arrives at {f['ts']} us, before it left at {s['ts']}")
        for x in (s, f):
            if not any(a <= x["ts"] <= b for a, b in slices.get((x["pid"], x["tid"]), ())):
                problems.append(f"flow {ident}: its {x['ph']} is inside no slice of its thread")
    problems += _nesting(slices)
    return problems


def _nesting(slices) -> list[str]:
    """Complete events on one thread must nest: each one ends before its parent does."""
    problems = []
    for (pid, tid), spans in slices.items():
        open_ends = []
        for a, b in sorted(spans, key=lambda x: (x[0], -x[1])):
            while open_ends and open_ends[-1] <= a:
                open_ends.pop()
            if open_ends and b > open_ends[-1] + 1e-3:  # rounding to the nanosecond
                problems.append(f"pid {pid} tid {tid}: slice [{a}, {b}] overlaps its parent")
            open_ends.append(b)
    return problems
