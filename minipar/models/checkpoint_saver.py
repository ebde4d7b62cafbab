"""Saving a sharded checkpoint while training goes on: every rank writes its own pieces.

    saver = ShardedSaver("ckpt", mesh, spec, keep=2)            # blocking=True: no thread
    saver.save(step, part, opt, extra)   # every rank, after the step's optimizer update
    saver.finish()                       # the last save on disk (rank 0: its manifest too)

Roughly, a save at step s:
    (a folder of step s a job that died left behind was removed when this run chose where to
    resume: checkpoint_loader.choose)
    every rank: the keys of the pieces it holds, all-gathered at the first save (a few KB of
                control messages; again once AdamW has state), so that a piece held by several
                ranks (dp and cp replicas) is written once, by the lowest of them; rank 0's
                token comes along, and each save's token is it and the step
    every rank: a CPU copy of its pieces (the step waits for this copy only), then a thread
                writes shard-RANK.pt and shard-RANK.json (temporary name, fsync, rename,
                sha256) while the next steps compute
    rank 0's thread: once every rank's .json is there (with the token), manifest.json, last;
                then older checkpoints beyond `keep` are removed

Hybrid sharding (--dp-shard K --dp-replicate R; torch's HSDP): each FSDP shard is held by the R
ranks of its replicate group under the same keys (a key names a piece of a dense tensor, not a
rank: checkpoint_pieces), so the rule above has replicate rank 0 (the first run of K dp ranks,
the lowest) write every shard, and the other R - 1 ranks write an empty shard file and their
record. The tensors on disk are the model's state once, not R times: 3 x 4 bytes a parameter
(fp32 weights, exp_avg, exp_avg_sq), 12 N bytes for N parameters, about 12 N / K from each
writer without tp or pp. Every rank still writes its record and rank 0 still waits for all of
them before the manifest, so a whole checkpoint still means every rank saw its save through.
The pieces are those of any layout: checkpoint_loader reads them into hybrid sharding again or
into any other layout (full FSDP, DDP, tp x pp).

What the step loses: the copy, plus a wait if the previous save has not finished (one save in
flight at a time); `costs` records both, and the write's own seconds. With `blocking` the write
runs on the step itself (what a save without a thread costs, for comparison).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import threading
import time

import torch

from minipar.models import checkpoint_files as files
from minipar.models.checkpoint_pieces import held_pieces

RECORD_WAIT = 600.0  # seconds rank 0's thread waits for the other ranks' records


class ShardedSaver:
    def __init__(self, root: str, mesh, spec, keep: int = 2, blocking: bool = False, log=None):
        self.root, self.mesh, self.spec = root, mesh, spec
        self.keep, self.blocking = keep, blocking
        self.comm = mesh.group
        self.log = log or (lambda text: None)
        self.pending: threading.Thread | None = None
        self.costs: list[dict] = []  # per save: step, copy_s, wait_s, write_s
        self.errors: list[str] = []
        self.plans: dict[bool, tuple[dict, int]] = {}  # _writers' answers
        self.run_token = None  # rank 0's, agreed at the first save; a save's token adds its step

    def save(self, step: int, part, opt, extra: dict) -> None:
        """Collective (every rank of the mesh): checkpoint the state after step `step` - 1,
        i.e. `step` steps done; resumed, the run starts at step `step`."""
        t0 = time.perf_counter()
        self._wait()
        waited = time.perf_counter() - t0
        folder = files.step_dir(self.root, step)
        held = held_pieces(part, opt)
        first, world = self._writers(held, bool(opt.state))
        token = f"{self.run_token}-{step}"
        mine = {}
        for meta, tensor in held:
            if first[_key(meta)] == self.comm.rank:
                key = "/".join(map(str, _key(meta)))
                mine[key] = (meta, tensor.to("cpu", copy=True))
        extra = dict(extra, adam_step=_adam_step(opt))
        record = self._manifest_base(step, extra, token, world) if self.comm.rank == 0 else {}
        cost = {"step": step, "copy_s": time.perf_counter() - t0 - waited, "wait_s": waited}
        self.costs.append(cost)
        args = (folder, mine, token, record, cost)
        if self.blocking:
            self._write(*args)
            cost["copy_s"] = time.perf_counter() - t0 - waited  # the write is on the step too
        else:
            self.pending = threading.Thread(target=self._write, args=args, daemon=True)
            self.pending.start()

    def _writers(self, held, stepped: bool) -> tuple[dict, int]:
        """{piece key: the lowest rank holding it} and the world size, from every rank's keys
        all-gathered once per kind of save (before and after AdamW's first step: the pieces
        change then, on every rank at once), so later saves exchange nothing."""
        if stepped not in self.plans:
            keys = [_key(meta) for meta, _ in held]
            token = secrets.token_hex(4) if self.comm.rank == 0 else None
            seen = self.comm.allgather_object((token, keys))
            self.run_token = self.run_token or seen[0][0]
            first = {}
            for rank, (_, theirs) in enumerate(seen):
                for key in theirs:
                    first.setdefault(key, rank)
            self.plans[stepped] = (first, len(seen))
        return self.plans[stepped]

    def finish(self) -> None:
        """Wait for the save in flight (rank 0: until its manifest is written)."""
        self._wait()

    def _wait(self) -> None:
        if self.pending is not None:
            self.pending.join()
            self.pending = None

    def _manifest_base(self, step, extra, token, world) -> dict:
        s = self.spec
        return {
            "format": files.FORMAT,
            "step": step,
            "token": token,
            "world": world,
            "layout": {
                "dp": s.dp,
                "tp": s.tp,
                "pp": s.pp,
                "cp": s.cp,
                "ep": s.ep,
                "fsdp": s.fsdp,
                "dp_shard": s.dp_shard or s.dp,  # hybrid sharding's shard group (dp: full)
                "schedule": s.schedule,
            },  # fmt: skip
            "config": s.model.to_dict(),
            "run": {k: v for k, v in dataclasses.asdict(s).items() if k != "model"},
            "extra": extra,
        }

    def _write(self, folder, mine, token, record, cost) -> None:
        """This rank's shard and its record; rank 0 then the manifest (thread or step)."""
        t0 = time.perf_counter()
        try:
            os.makedirs(folder, exist_ok=True)
            rank = self.comm.rank
            stem = os.path.join(folder, files.shard_name(rank))
            tensors = {key: tensor for key, (_, tensor) in mine.items()}
            files.write_atomic(stem + ".pt", lambda f: torch.save(tensors, f))
            pieces = [{**meta, "key": key, "file": files.shard_name(rank) + ".pt"}
                      for key, (meta, _) in mine.items()]  # fmt: skip
            mine_record = {"rank": rank, "token": token, "pieces": pieces,
                           "bytes": os.path.getsize(stem + ".pt"),
                           "sha256": files.sha256(stem + ".pt")}  # fmt: skip
            files.write_json(stem + ".json", mine_record)
            if rank == 0:
                self._manifest(folder, record)
        except Exception as error:  # a thread's error must not pass unseen
            self.errors.append(f"checkpoint at step {record.get('step', '?')}: {error}")
            self.log(self.errors[-1])
        cost["write_s"] = time.perf_counter() - t0

    def _manifest(self, folder: str, record: dict) -> None:
        """Every rank's record, then manifest.json last; older checkpoints pruned."""
        records, deadline = {}, time.monotonic() + RECORD_WAIT
        while len(records) < record["world"]:
            for rank in range(record["world"]):
                if rank not in records:
                    found = _read_record(os.path.join(folder, files.shard_name(rank) + ".json"))
                    if found and found["token"] == record["token"]:
                        records[rank] = found
            if len(records) < record["world"]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {sorted(set(range(record['world'])) - set(records))}"
                                       f" wrote no shard within {RECORD_WAIT:.0f} s")  # fmt: skip
                time.sleep(0.01)
        record["files"], record["pieces"] = {}, []
        for rank, r in sorted(records.items()):
            name = files.shard_name(rank)
            record["files"][name + ".pt"] = {"bytes": r["bytes"], "sha256": r["sha256"]}
            record["pieces"] += r["pieces"]
        record["saved_at"] = time.time()
        files.write_json(os.path.join(folder, files.MANIFEST), record)
        for gone in files.prune(self.root, self.keep):
            self.log(f"checkpoint {gone} removed (--keep {self.keep})")


def _adam_step(opt) -> float | None:
    """AdamW's step counter (the same for every parameter: they all step together)."""
    for state in opt.state.values():
        if "step" in state:
            return float(state["step"])
    return None


def _key(meta: dict) -> tuple:
    return (meta["kind"], meta["name"], meta["q"], meta["lo"], meta["hi"])


def _read_record(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
