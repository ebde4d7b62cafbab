"""`minipar calibrate`: measure this machine once (about half a minute on 2 cores) and keep it.

    minipar calibrate                  links, per-step cost, gamma, memory copy, matmul rate
    minipar calibrate --nodes 2        the same, and the emulated link between two nodes
    minipar calibrate --show           what is stored, and how old it is (doctor shows it too)

The record (minipar/cost/calibration.py) lives in a per-user cache file; the lessons' "on this
machine" predictions read it, and say so.
"""

from __future__ import annotations

import os

from minipar import launcher
from minipar.cost import calibration
from minipar.course.formats import fmt_rate, fmt_time
from minipar.launcher.cluster import link as links
from minipar.launcher.cluster.job import emulated
from minipar.launcher.cluster.nodes import EmulationError

EXAMPLES = """\
examples:
  minipar calibrate                  measure this machine (2 ranks, about half a minute)
  minipar calibrate --nodes 2        and the link between two emulated nodes (root)
  minipar calibrate --show           the stored calibration and its age
  MINIPAR_CALIBRATION=f.json minipar calibrate   keep it in f.json instead of the cache
"""


def configure(parser) -> None:
    parser.epilog = EXAMPLES
    parser.add_argument("-n", "--np", dest="n", type=int, default=None, metavar="N",
                        help="ranks (default 2; 4 with --nodes)")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=None, metavar="N",
                        help="on N emulated nodes (root): the link between them too")  # fmt: skip
    parser.add_argument("--link", default="2gbit", metavar="RATE",
                        help="the emulated link's rate (default 2gbit)")  # fmt: skip
    parser.add_argument("--out", default=None, metavar="FILE", help="store here instead")
    parser.add_argument("--show", action="store_true", help="print what is stored; measure nothing")
    parser.add_argument("--timeout", type=float, default=120, metavar="S",
                        help="kill the measurement after S seconds (default 120)")  # fmt: skip


def rows(record: dict) -> list[tuple[str, str]]:
    """(quantity, value) lines of a calibration record, for `--show` and `minipar doctor`."""
    load = record.get("load", {})
    out = [
        ("measured", f"{record.get('date')} on {record.get('host')}, minipar "
         f"{record.get('minipar')}, {calibration.describe_age(calibration.age_seconds(record))}"),
        ("machine", f"{record.get('cores')} cores, {record.get('ranks')} ranks, load average "
         f"{load.get('before', 0):.2f} before, {load.get('during', 0):.2f} during"),
    ]  # fmt: skip
    if record.get("python_prefix"):  # the file is one per user: whose it is
        out.append(("made by", f"minipar at {record.get('minipar_path')}, Python environment "
                    f"{record['python_prefix']}"))  # fmt: skip
    for name, fit in record.get("links", {}).items():
        rate = f" at {fit['rate_bits'] / 1e9:g} Gbit/s" if fit.get("rate_bits") else ""
        if fit.get("physical"):
            value = f"alpha {fmt_time(fit['alpha'])}, 1/beta {fmt_rate(1 / fit['beta'])}{rate}"
        else:
            value = f"not used: {fit.get('why')}"
        out.append((f"link {name}", value))
    if record.get("step_s") is not None:
        out.append(("minipar per step", f"{fmt_time(record['step_s'])} (beside a bare MPI "
                    f"message's {fmt_time(record['bare_message_s'])})"))  # fmt: skip
    out.append(("reduction (1/gamma)", fmt_rate(1 / record["gamma"])))
    out.append(("memory copy", fmt_rate(record["copy_Bps"])))
    out.append(("tiny GPT matmul", f"{record['matmul_flops'] / 1e9:.3g} GFLOP/s"))
    return out


def show(console, where=None) -> bool:
    record = calibration.load(where)
    if record is None:
        console.print(
            f"no calibration yet ({where or calibration.path()}): run `minipar calibrate`"
        )
        return False
    for name, value in rows(record):
        console.print(f"  {name:<22} {value}")
    return True


def main(args) -> int:
    # here, not at the top of the file: rich loads only when used
    from minipar.term import Console

    console, err = Console(highlight=False), Console(stderr=True, highlight=False)
    where = args.out or os.environ.get(calibration.PATH_ENV) or None
    if args.show:
        return 0 if show(console, where) else 1
    n = args.n or (4 if args.nodes else 2)
    if n < 2:
        err.print(f"[bold red]minipar calibrate:[/] -n {n}: needs at least 2 ranks")
        return 2
    argv = ["-m", "minipar.bench.calibrate", *(["--out", os.path.abspath(where)] if where else [])]

    def run(cluster):
        before = os.getloadavg()[0]
        cmd, env = launcher.command(n, argv, cluster=cluster)
        env["MINIPAR_LOAD_BEFORE"] = f"{before:.2f}"
        if cluster is not None:
            console.print(f"{cluster.n_nodes} emulated nodes, link {links.describe(cluster.rate)}")
        return launcher.run_command(cmd, env, args.timeout).returncode

    try:
        if args.nodes is None:
            status = run(None)
        else:
            with emulated(args.nodes, args.link) as cluster:
                status = run(cluster)
    except (ValueError, FileNotFoundError, EmulationError) as error:
        err.print(f"[bold red]minipar calibrate:[/] {error}")
        return 2
    if status == 0:
        show(console, where)
        record = calibration.load(where) or {}
        load = record.get("load", {})
        if max(load.get("before", 0), load.get("during", 0)) > record.get("cores", 1):
            console.print(
                "[yellow]measured on a busy machine (load average above the cores): the "
                "lessons will say so; run it again when the machine is quiet[/]"
            )
    return status
