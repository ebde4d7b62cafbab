"""The GPU check's driver (scripts/gpu_check.sh runs it): every rank-side GPU suite at 2 and 4
ranks, the all-reduce bench, a results file (JSON and a markdown table for docs/gpu-results.md),
exit status 1 on any failure.

    python scripts/gpu_check.py OUTDIR [--cpu-dry-run] [--sizes 2,4]

--cpu-dry-run runs the very same suites and bench with CPU tensors (minipar.device() is the CPU
there): it proves the driver and the suites run, not the GPU path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the rank suites import their neighbours


def suite(name):
    return os.path.join(ROOT, "tests", "ranks", name)


def plan(sizes, aware: bool, dry_run: bool):
    """(label, suite, size, backend, environment overrides) for every launch."""
    runs = []
    for p in sizes:
        runs.append((f"collectives vs CPU p={p}", "cuda.py", p, "mpi", {}))
        runs.append((f"collectives vs torch.distributed and math p={p}", "cuda_vs_torch.py", p,
                     "mpi", {}))  # fmt: skip
        runs.append(
            (f"DDP, FSDP, TP, PP, CP, EP, GPT mesh p={p}", "cuda_strategies.py", p, "mpi", {})
        )
    # the pipelined staged path with chunks small enough that every message is cut up
    staged = {"MINIPAR_CUDA_AWARE": "0", "MINIPAR_STAGE_CHUNK": "4096"}
    if dry_run:  # CPU tensors through the same chunked code (plain copies for the stream's)
        staged["MINIPAR_STAGE_HOST"] = "1"
    runs.append(("collectives, staged-pipelined (4 KiB chunks) p=2", "cuda.py", 2, "mpi", staged))
    if aware:  # the MPI reads device memory: check the staged path too
        runs.append(("collectives, staged (forced) p=2", "cuda.py", 2, "mpi",
                     {"MINIPAR_CUDA_AWARE": "0"}))  # fmt: skip
    runs.append(("collectives over torch transport p=2", "cuda.py", 2, "torch", {}))
    return runs


@contextlib.contextmanager
def environment(overrides):
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_one(label, name, size, backend, overrides, notes):
    from minipar.testing import harness

    path = suite(name)
    with environment({**overrides, "MINIPAR_GPU_CHECK_NOTES": notes}):
        result = harness.run_suite.__wrapped__(path, size, backend, 600)  # not the cached one
    cases = harness.case_names(path, size)
    failed = {}
    for case in cases:
        try:
            result.check(case)
        except AssertionError as error:
            failed[case] = str(error)[-2000:]
    row = {"check": label, "suite": name, "ranks": size, "backend": backend, "env": overrides,
           "cases": len(cases), "failed": len(failed), "seconds": round(result.seconds, 1),
           "failures": failed}  # fmt: skip
    mark = "PASS" if not failed else f"FAIL ({len(failed)})"
    print(f"{mark:>10}  {label}: {len(cases)} cases, {result.seconds:.1f} s", flush=True)
    for case, text in list(failed.items())[:3]:
        print(f"            {case}: {text.splitlines()[-1][:200]}", flush=True)
    return row


def environment_facts(dry_run: bool) -> dict:
    import torch

    from minipar.cli import doctor

    facts = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "mode": "cpu dry run" if dry_run else "gpu", "python": platform.python_version(),
             "torch": torch.__version__, "cuda": torch.version.cuda}  # fmt: skip
    if torch.cuda.is_available():
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                 "--format=csv,noheader"]  # fmt: skip
        done = subprocess.run(query, capture_output=True, text=True, check=False)
        facts["nvidia-smi"] = done.stdout.strip()
    report = doctor.collect(smoke=True, timeout=120)
    facts["doctor"] = {c["name"]: f"{c['value']} [{c['status']}] {c['note']}".strip()
                       for c in report["checks"]}  # fmt: skip
    facts["doctor_ok"] = report["ok"]
    return facts


def bench(out: str, dry_run: bool) -> dict:
    from minipar import launcher

    path = os.path.join(out, "bench.json")
    script = os.path.join(ROOT, "scripts", "gpu_bench.py")
    iters = ["--iters", "3" if dry_run else "10"]
    done = launcher.run(2, [script, path, *iters], timeout=300, capture=True)
    if done.returncode != 0 or not os.path.exists(path):
        tail = "\n".join((done.stderr or done.stdout or "").splitlines()[-15:])
        print(f"      FAIL  bench (exit {done.returncode})\n{tail}", flush=True)
        return {"ok": False, "error": tail}
    with open(path) as f:
        rows = json.load(f)
    medians = [
        f"{k} {v['minipar']['median'] * 1e3:.2f} ms (torch {v['torch']['median'] * 1e3:.2f} ms)"
        for k, v in rows.items()
    ]
    print("      PASS  bench: " + ", ".join(medians), flush=True)
    return {"ok": True, "rows": rows}


def ms(stat):
    if not stat:
        return "-"
    return f"{stat['min'] * 1e3:.2f} / {stat['median'] * 1e3:.2f} / {stat['max'] * 1e3:.2f}"


def markdown(results) -> str:
    env = results["environment"]
    lines = [f"## {env['mode']}, {env['date']}", ""]
    gpu = env.get("nvidia-smi") or ", ".join(env.get("gpus", [])) or "none"
    doc = env["doctor"]
    lines += [f"- GPU: {gpu}", f"- torch {env['torch']} (CUDA {env['cuda']}), Python "
              f"{env['python']}", f"- MPI: {doc.get('MPI library', '?')}",
              f"- CUDA-aware MPI: {doc.get('CUDA-aware MPI', '?')}",
              f"- rank devices: {doc.get('rank devices', '?')}", ""]  # fmt: skip
    lines += ["| check | ranks | cases | result | seconds |", "| --- | --- | --- | --- | --- |"]
    for r in results["checks"]:
        verdict = "pass" if not r["failed"] else f"**FAIL** ({r['failed']})"
        lines.append(f"| {r['check']} | {r['ranks']} | {r['cases']} | {verdict} | {r['seconds']} |")
    b = results["bench"]
    lines += ["", "All-reduce (ring, float32, 2 ranks), ms min / median / max:", ""]
    if not b.get("ok"):
        lines.append("bench **FAILED**: see results.json")
        return "\n".join(lines) + "\n"
    lines += ["| size | path | minipar | one-shot staging | MPI on host alone | copies alone "
              "| torch.distributed | minipar / torch |", "| --- " * 8 + "|"]  # fmt: skip
    for size, v in b["rows"].items():
        ratio = f"{v['ratio_vs_torch']:.2f}x" if v.get("ratio_vs_torch") else "-"
        lines.append(f"| {size} | {v['path']} | {ms(v['minipar'])} | "
                     f"{ms(v.get('minipar-oneshot'))} | {ms(v['mpi-host'])} | "
                     f"{ms(v.get('copies'))} | {ms(v['torch'])} ({v['torch_backend']}) | "
                     f"{ratio} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--sizes", default="2,4")
    args = parser.parse_args()
    import torch

    if not args.cpu_dry_run and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}); use --cpu-dry-run to "
              "exercise the driver on the CPU", file=sys.stderr)  # fmt: skip
        return 2
    os.makedirs(args.out, exist_ok=True)
    notes = os.path.abspath(args.out)
    start = time.monotonic()
    results = {"environment": environment_facts(args.cpu_dry_run)}
    print(json.dumps(results["environment"], indent=1), flush=True)
    aware = results["environment"]["doctor"].get("CUDA-aware MPI", "").startswith("yes")
    sizes = [int(s) for s in args.sizes.split(",")]
    results["checks"] = [run_one(*r, notes) for r in plan(sizes, aware, args.cpu_dry_run)]
    results["bench"] = bench(args.out, args.cpu_dry_run)
    results["seconds"] = round(time.monotonic() - start, 1)
    ok = all(not r["failed"] for r in results["checks"]) and results["bench"].get("ok", False)
    results["ok"] = ok
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    table = markdown(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(table)
    print(table)
    print(f"gpu_check: {'PASS' if ok else 'FAIL'} in {results['seconds']} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
