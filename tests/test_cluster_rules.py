"""The emulated cluster's rules that need no namespace, on one process: which keeper (or job
owner) counts as alive (a zombie or a reused pid does not), the rootless switch (on at "1" only),
the kernel switches read at the values that allow as well as those that forbid.

Checks: minipar/launcher/cluster/leftovers.py (owner_alive, started_at), rootless.py (wanted,
why_not). What needs namespaces, root or a second user (a keeper SIGKILLed with its cluster up,
the sweep of its nodes) is in tests/test_cluster_standing.py and tests/test_cluster_rootless.py;
a real kernel's refusal needs such a kernel: only the files standing in for /proc are read here.
"""

import os
import subprocess
import sys
import time

import pytest

from minipar.launcher.cluster import leftovers, rootless


def test_an_owner_is_alive_only_while_its_process_is_the_one_that_made_the_names():
    me, now = os.getpid(), time.time()
    assert leftovers.owner_alive(me, now)  # this process began before the names were made
    began = leftovers.started_at(me)
    assert began is not None and began <= now
    # names made 10 s before this process began: the pid was reused, their owner is gone
    assert not leftovers.owner_alive(me, began - 10)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # reaped: no such process
    assert leftovers.started_at(done.pid) is None and not leftovers.owner_alive(done.pid, now)


def test_a_keeper_that_died_unreaped_is_not_alive():
    """A child that exited and was not waited for is a zombie (state Z in /proc/PID/stat): its
    pid still exists, but its owner is dead."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.02)
        else:
            pytest.fail("the child never exited")
        assert leftovers.started_at(child.pid) is None
        assert not leftovers.owner_alive(child.pid, time.time())
    finally:
        child.wait()


@pytest.mark.parametrize("value,forced", [("1", True), ("0", False), ("", False), (None, False)])
def test_the_rootless_way_is_forced_by_1_only(monkeypatch, value, forced):
    if value is None:
        monkeypatch.delenv(rootless.FORCE_ENV, raising=False)
    else:
        monkeypatch.setenv(rootless.FORCE_ENV, value)
    assert rootless.wanted() == (forced or os.geteuid() != 0)


def test_a_kernel_switch_at_a_value_that_allows_is_not_named(monkeypatch, tmp_path):
    """max_user_namespaces 15000, unprivileged_userns_clone 1, apparmor's restriction 0: none
    forbids, so the probe decides (`true` standing in for unshare: it succeeds)."""
    allowing = {"max_user_namespaces": "15000", "unprivileged_userns_clone": "1",
                "apparmor_restrict_unprivileged_userns": "0"}  # fmt: skip
    assert {os.path.basename(p) for p in rootless.SYSCTLS} == set(allowing)
    files = {}
    for path, off in rootless.SYSCTLS.items():
        fake = tmp_path / os.path.basename(path)
        fake.write_text(allowing[fake.name] + "\n")
        files[str(fake)] = off
    monkeypatch.setattr(rootless, "SYSCTLS", files)
    monkeypatch.setattr(rootless, "UNSHARE", ["true"])
    assert rootless.why_not() == ""
