"""Did a run get its cores (minipar/course/cpu_share.py)? Hand-made /proc/stat snapshots with the
expected shares worked out here, and one real check: a busy loop beside a short measurement
shows the CPU it took."""

import os
import subprocess
import sys
import time

import pytest

from minipar.course import cpu_share
from minipar.course.cpu_share import Share, Snapshot

HZ = 100


def stat(user, system, idle, iowait=0, steal=0):
    """/proc/stat's first lines with these ticks (nice, irq, softirq 0; guest 0)."""
    return (f"cpu  {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\n"
            f"cpu0 {user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0\nintr 1 2\n")  # fmt: skip


def test_machine_seconds_count_every_busy_tick_and_not_idle_or_iowait():
    busy, total = cpu_share.machine_seconds(stat(300, 100, 500, iowait=50, steal=50), HZ)
    assert busy == pytest.approx((300 + 100 + 50) / HZ)  # steal: the core ran someone else
    assert total == pytest.approx(1000 / HZ)
    with pytest.raises(ValueError, match="not /proc/stat"):
        cpu_share.machine_seconds("intr 1 2\n", HZ)


def window(ticks_before, ticks_after, own_before, own_after, wall, ranks=2, cores=2):
    start = Snapshot(0.0, cpu_share.machine_seconds(stat(*ticks_before), HZ)[0], own_before)
    end = Snapshot(wall, cpu_share.machine_seconds(stat(*ticks_after), HZ)[0], own_after)
    return Share.between(start, end, cores=cores, ranks=ranks)


def test_beside_two_busy_loops_the_ranks_lose_half():
    # 2 s on 2 cores, every tick busy (400 ticks); the ranks got 2.0 CPU seconds of the 4.0
    # they wanted, two busy loops the other 2.0
    share = window((1000, 0, 5000), (1380, 20, 5000), 10.0, 12.0, wall=2.0)
    wanted, others = 2 * 2.0, (380 + 20) / HZ - 2.0
    assert share.wanted == wanted and share.others == pytest.approx(others)
    assert share.stolen == pytest.approx(min(others, wanted - 2.0))
    assert share.lost == pytest.approx(0.5) and share.busy
    assert "took 50%" in share.describe()


def test_a_quiet_machine_loses_nothing_even_where_the_ranks_sleep():
    # 1 s: the ranks got 1.2 CPU seconds (they slept part of it), nobody else ran
    share = window((1000, 0, 5000), (1110, 10, 5080), 3.0, 4.2, wall=1.0)
    assert share.others == pytest.approx((110 + 10) / HZ - 1.2)  # 0.0: only the ranks
    assert share.lost == pytest.approx(0.0) and not share.busy


def test_others_on_a_core_the_ranks_did_not_want_take_nothing_from_them():
    # 1 rank on 2 cores for 1 s: it got its whole core, a busy loop had the other one
    share = window((0, 0, 0), (200, 0, 0), 0.0, 1.0, wall=1.0, ranks=1)
    assert share.others == pytest.approx(1.0) and share.stolen == 0.0 and not share.busy


def test_oversubscribed_ranks_want_only_the_cores_there_are():
    # 4 ranks on 2 cores for 1 s: 1.5 CPU seconds theirs, 0.5 another process's
    share = window((0, 0, 0), (200, 0, 0), 0.0, 1.5, wall=1.0, ranks=4)
    assert share.wanted == 2.0 and share.lost == pytest.approx(0.5 / 2.0) and share.busy


def test_without_proc_stat_nothing_is_known_and_nothing_is_blamed(tmp_path):
    snap = Snapshot.now(1.0, stat=str(tmp_path / "no-such-stat"))
    share = Share.between(snap, Snapshot(snap.wall + 1, None, 1.5), cores=2, ranks=2)
    assert share.machine is None and share.lost == 0.0 and not share.busy
    assert "no /proc/stat" in share.describe()


@pytest.mark.skipif(not os.path.exists(cpu_share.STAT), reason="no /proc/stat here")
@pytest.mark.timeout(60)
def test_a_busy_loop_beside_a_measurement_shows_the_cpu_it_took():
    """This process spins on one core for 0.6 s while a busy loop per core spins beside it:
    it gets at most about half of the core it wanted (the loops take the rest). The machine's
    own processes (other engineers') only add to what others take."""
    cores = os.cpu_count() or 1
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.3)  # the loops are running
        start = Snapshot.now(time.process_time())
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.6:
            pass
        share = Share.between(start, Snapshot.now(time.process_time()), cores=cores, ranks=1)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    got = share.own / share.wall
    assert got < 0.8, share.describe()  # cores + 1 spinners on `cores` cores
    assert share.lost == pytest.approx(1 - got, abs=0.15), share.describe()
    assert share.busy, share.describe()
