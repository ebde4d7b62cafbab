"""Emulated nodes without root: every namespace of the job made inside a user namespace.

    holder = Holder.start()             # a user namespace where this user is root, and PID 1
    run([*holder.inside, "ip", "netns", "add", "minipar-...-node0"])   # as root, in there
    holder.stop()                       # PID 1 exits: the kernel kills all inside, nodes gone

Linux lets an unprivileged user make a user namespace in which it is root (`unshare --user
--map-root-user`), and inside it network namespaces, veths, tc queues, hostnames and mounts,
where the kernel allows it (user.max_user_namespaces above 0, no
kernel.unprivileged_userns_clone=0, no AppArmor restriction as Ubuntu 24.04's). What stays
refused is writing the machine's /run/netns, where `ip netns add` names its namespaces; so the
holder, a small process that is PID 1 of the job's own user, mount, network and PID
namespaces, mounts a private tmpfs over /run (the machine's entries bound back, /run/netns
new and empty), and every command of the job enters the holder's namespaces first
(`inside`: nsenter -t HOLDER ...). The nodes, the link and the launcher are then made by the
same commands as with root.

The holder reads a pipe from its owner (the `minipar run` or the standing cluster's keeper)
and exits when it closes, however the owner ends, SIGKILL included; when PID 1 of a PID
namespace exits the kernel kills every process inside, and the namespaces go with them. So a
rootless job needs no sweep: nothing of it outlives its owner but its folder in the temporary
directory, which leftovers.py removes as it does root's.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys

UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--net", "--uts", "--pid",
           "--fork", "--kill-child", "--mount-proc"]  # fmt: skip
# what the probe tries, as a job would: a veth, a token bucket, a private mount
PROBE = ("ip link add mp0 mtu 9000 type veth peer name mp1 && "
         "tc qdisc add dev mp0 root tbf rate 1gbit burst 65536 latency 20ms && "
         "mount -t tmpfs tmpfs /run && hostname node0")  # fmt: skip
SYSCTLS = {  # the kernel's switches that forbid unprivileged user namespaces, and their "off"
    "/proc/sys/user/max_user_namespaces": "0",
    "/proc/sys/kernel/unprivileged_userns_clone": "0",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1",
}
FORCE_ENV = "MINIPAR_ROOTLESS"  # 1: the rootless way even as root (to try it)


def wanted() -> bool:
    """Whether this process makes its nodes the rootless way (not root, or asked to)."""
    return os.geteuid() != 0 or os.environ.get(FORCE_ENV) == "1"


def why_not() -> str:
    """'' where this user can make the job's namespaces without root, else why not: the
    kernel switch that forbids it, or what the probe (a veth, tc, a mount, a hostname inside a
    user namespace) was refused."""
    for path, off in SYSCTLS.items():
        try:
            with open(path) as f:
                if f.read().strip() == off:
                    return f"unprivileged user namespaces are off here ({_sysctl(path)} = {off})"
        except OSError:
            pass
    try:
        done = subprocess.run([*UNSHARE, "sh", "-c", PROBE], capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare --user --map-root-user` could not run: {error}"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return (
            "this kernel or container refuses an unprivileged user namespace with its own "
            f"network (`unshare --user --map-root-user --net ...`: {said[-1] if said else '?'})"
        )
    return ""


def _sysctl(path: str) -> str:
    return path.removeprefix("/proc/sys/").replace("/", ".")


def inside(holder: int) -> list[str]:
    """The words that run a command in the namespaces of the holder with pid `holder`, as root
    there, in this folder (entering a mount namespace would start it at /)."""
    return ["nsenter", "-t", str(holder), "--user", "--mount", "--net", "--uts", "--pid",
            "--preserve-credentials", f"--wd={os.getcwd()}", "--"]  # fmt: skip


class Holder:
    """The job's user namespace, held by its PID 1 until this process closes the pipe."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.pid = _child_of(proc.pid)  # PID 1 inside: unshare forked it

    @property
    def inside(self) -> list[str]:
        return inside(self.pid)

    @classmethod
    def start(cls) -> Holder:
        cmd = [*UNSHARE, sys.executable, "-m", "minipar.launcher", "hold"]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        said = proc.stdout.readline().strip()  # "ready", or nothing when it failed
        if said != "ready":
            proc.stdin.close()
            err = proc.stderr.read().strip()
            proc.wait()
            raise OSError(f"the job's user namespace could not be held: {err or said}")
        return cls(proc)

    def stop(self) -> None:
        """Close the pipe: PID 1 exits and the kernel kills every process of the job."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # unshare --kill-child takes PID 1 with it
                self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()


def _child_of(pid: int) -> int:
    """The one child of process pid (unshare --fork's PID 1 of the new namespaces)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        pass  # a kernel without CONFIG_PROC_CHILDREN: look for the process whose parent it is
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:  # field 4: the parent
                    return int(entry)
        except (OSError, IndexError, ValueError):
            continue
    raise OSError(f"unshare (pid {pid}) has no child holding the namespaces")


# -- the holder itself: PID 1 inside (python -m minipar.launcher hold) ---------------------------
MS_BIND, MS_REC = 4096, 16384


def _mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags, None):
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def private_run() -> None:
    """A tmpfs over /run in this mount namespace, the machine's entries bound back into it (a
    socket or a runtime folder a program looks for stays where it was), /run/netns new."""
    old = os.open("/run", os.O_RDONLY | os.O_DIRECTORY)  # the machine's /run, once covered
    entries = os.listdir("/run")
    _mount("tmpfs", "/run", "tmpfs", 0)
    os.chmod("/run", 0o755)
    for name in entries:
        if name == "netns":
            continue
        source, target = f"/proc/self/fd/{old}/{name}", f"/run/{name}"
        try:
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
                continue
            if os.path.isdir(source):
                os.mkdir(target)
            else:
                open(target, "w").close()
            _mount(source, target, None, MS_BIND | MS_REC)
        except OSError:
            pass  # an entry this user may not see: the job goes without it
    os.close(old)
    os.mkdir("/run/netns")


def hold() -> int:
    """Make /run private, say "ready", then reap orphans until the owner's pipe closes."""
    try:
        private_run()
    except OSError as error:
        print(f"minipar: a private /run for the job's namespaces: {error}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([0], [], [], 1.0)
        _reap()
        if ready and not os.read(0, 4096):
            return 0


def _reap() -> None:
    """PID 1 adopts every orphan of the job: collect the ones that ended."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
