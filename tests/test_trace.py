"""The timeline: Chrome trace-event JSON from the ledgers (minipar/comm/trace/chrome_trace.py).

- `minipar run -n 3 --trace DIR`: every rank writes its part, merged into DIR/trace.json: valid
  against the format's field rules, one process per rank, as many message events per rank as
  that rank's ledger holds, a collective's span with its algorithm, group and bytes;
- the validator fails what it must (a flow arriving before it left, an unpaired flow, a missing
  field, slices that overlap without nesting): its silence means something;
- the merge orders every message even when a rank's measured clock offset is off;
- the clock offset's estimate itself (Cristian's) on a simulated clock with a skew imposed and
  the delays known: the offset recovered exactly as derived; a merge of ranks 1,000 s apart
  whose measured offsets are right: no correction, and every message's latency as it was
  (real ranks with skewed clocks: tests/ranks/transport.py, clock_skew);
- nothing is recorded while no trace is open (the ledger's hot path stays a test of a list).

A real consumer: Perfetto's Python package (pip install perfetto) reads traces through
trace_processor_shell, a binary it downloads on first use; on a machine without a network that
download fails, so the document is checked against the published field rules instead.
"""

import json
import os
import subprocess
import sys

import pytest

from minipar.comm.trace import chrome_trace, ledger
from minipar.state import process

SCRIPT = """
import numpy as np, minipar
w = minipar.init()
x = np.ones(999, dtype=np.float32)  # 3 equal chunks
minipar.all_reduce(x, algorithm="ring")
if w.rank == 0:
    minipar.send(np.ones(10), dst=1)
if w.rank == 1:
    minipar.recv(np.ones(10), src=0)
minipar.finalize()
"""


@pytest.mark.own_job  # `minipar run --trace`
def test_run_trace_merges_every_rank(tmp_path):
    script, folder = tmp_path / "job.py", tmp_path / "tr"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "minipar", "run", "-n", "3", "--trace", str(folder), str(script)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trace of every rank" in done.stderr, done.stderr
    doc = json.loads((folder / "trace.json").read_text())
    assert chrome_trace.validate(doc) == []
    events = doc["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1, 2}
    for rank in range(3):
        part = json.loads((folder / f"rank{rank}.json").read_text())
        mine = [e for e in events if e.get("cat") == "message" and e["pid"] == rank]
        assert len(mine) == len(part["messages"]) > 0, rank
    ring = [e for e in events if e["ph"] == "X" and e["name"] == "all_reduce"]
    assert len(ring) == 3 and all(e["args"]["algorithm"] == "ring" for e in ring)
    assert all(e["args"]["bytes_sent"] == 2 * 2 * 999 * 4 // 3 for e in ring)  # 2(p-1)/p n
    flows = [e for e in events if e["ph"] == "s"]
    assert len(flows) == 3 * 4 + 1  # ring: 2(p-1) messages per rank; one send of the user's


def flow(ident, ts, ph, pid=0):
    return {"ph": ph, "id": ident, "name": "message", "cat": "message", "ts": ts, "pid": pid,
            "tid": 0}  # fmt: skip


def test_validator_catches_bad_documents():
    span = {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 0, "tid": 0}
    good = {"traceEvents": [span, {**span, "pid": 1}, flow(1, 2, "s"), flow(1, 5, "f", 1)]}
    assert chrome_trace.validate(good) == []
    backwards = {"traceEvents": [span, {**span, "pid": 1}, flow(1, 5, "s"), flow(1, 2, "f", 1)]}
    assert any("before it left" in p for p in chrome_trace.validate(backwards))
    unpaired = {"traceEvents": [span, flow(1, 2, "s")]}
    assert any("not one s and one f" in p for p in chrome_trace.validate(unpaired))
    no_ts = {"traceEvents": [{k: v for k, v in span.items() if k != "ts"}]}
    assert any("ts missing" in p for p in chrome_trace.validate(no_ts))
    overlap = {"traceEvents": [span, {**span, "ts": 5}]}
    assert any("overlaps" in p for p in chrome_trace.validate(overlap))
    outside = {"traceEvents": [span, flow(1, 20, "s"), flow(1, 30, "f")]}
    assert any("inside no slice" in p for p in chrome_trace.validate(outside))


def part(rank, offset, messages, spans):
    return {"rank": rank, "offset": offset, "error": 1e-3, "groups": {"world": [0, 1]},
            "threads": [[7, "MainThread"]], "calls": [], "messages": messages,
            "spans": spans, "counters": []}  # fmt: skip


def test_merge_orders_messages_despite_a_wrong_offset():
    """Rank 1's clock reads 1 s behind and its measured offset missed 3 ms of it: the merge
    moves it forward just enough that its receive ends after rank 0's send began."""
    send = ["world", 0, "p2p", -1, "send", 1, 8, 5, 10.000, 7, None, None, None]
    recv = ["world", 1, "p2p", -1, "recv", 0, 8, 5, 8.999, 7, 9.0005, 7, None]  # its own clock
    spans0 = [["Send", "p2p", 9.999, 10.001, 7, {}]]
    spans1 = [["Recv", "p2p", 8.998, 9.001, 7, {}]]
    doc = chrome_trace.merge([part(0, 0.0, [send], spans0), part(1, 0.997, [recv], spans1)])
    assert chrome_trace.validate(doc) == []
    assert abs(doc["otherData"]["clock_correction_s"] - 0.0025) < 1e-6


def test_nothing_is_recorded_without_a_trace():
    assert not process.traces
    assert ledger.span("x") is ledger.span("y")  # one shared do-nothing context
    assert ledger.open_span("x") is None
    assert ledger.record(None, "p2p", "p2p", -1, 0, "send", 1, 8) is None
    with ledger.trace() as t:
        with ledger.span("x", "test", k=1):
            ledger.counter("c", 3)
    assert [(s.name, s.cat, s.args) for s in t.spans] == [("x", "test", {"k": 1})]
    assert t.counters[0][1:] == ("c", 3)
    assert not os.environ.get("MINIPAR_TRACE_DIR")


def test_messages_between_nodes_are_named_and_coloured_apart():
    """With a node map in the parts, a message from node 0 to node 1 is "message between nodes"
    (cname "terrible"), one inside a node stays "message" ("good"); both keep the category."""
    parts = []
    for rank in range(3):  # ranks 0, 1 on node 0; rank 2 on node 1; 0 -> 1 and 1 -> 2
        messages, spans = [], [["Step", "p2p", 9.0, 11.0, 7, {}]]
        if rank < 2:
            messages.append(["world", rank, "p2p", -1, "send", rank + 1, 8, 5, 10.0, 7,
                             None, None, None])  # fmt: skip
        if rank > 0:
            messages.append(["world", rank, "p2p", -1, "recv", rank - 1, 8, 5, 10.0, 7,
                             10.001, 7, None])  # fmt: skip
        one = part(rank, 0.0, messages, spans)
        parts.append({**one, "groups": {"world": [0, 1, 2]}, "nodes": [0, 0, 1]})
    doc = chrome_trace.merge(parts)
    assert chrome_trace.validate(doc) == []
    starts = {e["pid"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    assert starts[0]["name"] == "message" and starts[0]["cname"] == "good"
    assert starts[1]["name"] == "message between nodes" and starts[1]["cname"] == "terrible"
    assert starts[1]["args"]["between_nodes"] and not starts[0]["args"]["between_nodes"]
    assert {e["cat"] for e in doc["traceEvents"] if e["ph"] in "sf"} == {"message"}


def simulated(skew, delays):
    """(ask, clock) of a rank whose clock reads the reference's + skew, each question taking
    d_out to arrive and its answer d_back (the pairs in `delays`, in turn)."""
    now, pending = [1000.0], list(delays)

    def clock():
        return now[0] + skew

    def ask():
        d_out, d_back = pending.pop(0)
        now[0] += d_out
        answer = now[0]  # the reference's clock, when it answers
        now[0] += d_back
        return answer

    return ask, clock


@pytest.mark.parametrize("skew", [5.0, -3.25])
def test_clock_estimate_recovers_an_imposed_skew(skew):
    """The true offset is -skew. The fastest round trip wins; the estimate is then the true one
    + (d_out - d_back) / 2 (chrome_trace.estimate_offset's docstring), exact when the two
    delays are equal, and the error bound is half that round trip."""
    slow, fast = (4e-3, 1e-3), (2e-4, 2e-4)  # round trips 5 ms and 0.4 ms
    ask, clock = simulated(skew, [slow, fast, (3e-3, 3e-3), slow])
    offset, error = chrome_trace.estimate_offset(ask, clock, rounds=4)
    assert abs(offset - (-skew)) < 1e-9, offset
    assert abs(error - 2e-4) < 1e-12, error
    lopsided = (1e-4, 5e-4)  # the fastest, 0.6 ms, its answer five times slower than its question
    ask, clock = simulated(skew, [slow, lopsided, (2e-3, 1e-4)])
    offset, error = chrome_trace.estimate_offset(ask, clock, rounds=3)
    assert abs(offset - (-skew + (1e-4 - 5e-4) / 2)) < 1e-9, offset
    assert abs(error - 3e-4) < 1e-12 and abs(offset + skew) <= error, (offset, error)


def test_merge_of_ranks_1000_s_apart():
    """Rank 1's clock reads 1,000 s ahead; its measured offset is -1,000 s + 10 us (within its
    error bound). Messages both ways, 300 us each: the merge needs no correction and shows each
    latency as 300 us +- the offset's 10 us; a wrong offset (a sign, a rank's offset not
    applied, a correction from zero) moves them by up to 2,000 s."""
    skew, missed = 1000.0, 1e-5
    sends = [
        ["world", 0, "p2p", -1, "send", 1, 8, 5, 10.000, 7, None, None, None],
        ["world", 0, "p2p", -1, "recv", 1, 8, 6, 10.0005, 7, 10.0013, 7, None],
    ]
    recvs = [
        ["world", 1, "p2p", -1, "recv", 0, 8, 5, 9.9990 + skew, 7, 10.0003 + skew, 7, None],
        ["world", 1, "p2p", -1, "send", 0, 8, 6, 10.0010 + skew, 7, None, None, None],
    ]
    spans0 = [["Send", "p2p", 9.9995, 10.0015, 7, {}]]
    spans1 = [["Recv", "p2p", 9.9985 + skew, 10.0012 + skew, 7, {}]]
    doc = chrome_trace.merge([part(0, 0.0, sends, spans0), part(1, -skew + missed, recvs, spans1)])
    assert chrome_trace.validate(doc) == []
    assert doc["otherData"]["clock_correction_s"] == 0.0
    assert doc["otherData"]["clock_offsets_s"]["1"] == -skew + missed
    flows = {(e["id"], e["ph"]): e["ts"] for e in doc["traceEvents"] if e["ph"] in ("s", "f")}
    gaps = sorted(flows[i, "f"] - flows[i, "s"] for i in (0, 1))  # 1 -> 0 first, then 0 -> 1
    assert gaps == pytest.approx([300 - 10, 300 + 10], abs=0.01), gaps
    spans = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert spans["Recv"]["ts"] - spans["Send"]["ts"] == pytest.approx(-1000 + 10, abs=0.01)
