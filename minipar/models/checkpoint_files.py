"""A sharded checkpoint on disk: whole or absent, found, checked and pruned.

    DIR/step-00000040/shard-00003.pt     rank 3's pieces (torch.save of {key: tensor})
    DIR/step-00000040/shard-00003.json   what it holds, its bytes and sha256 (after the .pt)
    DIR/step-00000040/manifest.json      written last, by rank 0, once every rank's .json is
                                         there: every file's size and checksum, every piece

Every file is written to a temporary name, flushed to disk, then renamed (a rename is atomic),
so a name holds a whole file or nothing; the manifest is the last file and names every other
one, so a checkpoint without it never finished. A checkpoint is *whole* when its manifest reads
and every file it lists has the size and sha256 it says: a truncated shard, a missing manifest or
one flipped byte makes it not whole, and `newest_whole` passes over it to the one before, saying
what was wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

FORMAT = "minipar-sharded/1"
STEP_DIR = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def shard_name(rank: int) -> str:
    return f"shard-{rank:05d}"


def write_atomic(path: str, write) -> None:
    """write(file) into a temporary name beside `path`, flushed to disk, then renamed."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str, record: dict) -> None:
    write_atomic(path, lambda f: f.write(json.dumps(record, indent=1).encode()))


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def steps(root: str) -> list[int]:
    """The steps of every checkpoint folder under root, whole or not, oldest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(STEP_DIR.match, names) if m)


def problem(folder: str) -> tuple[str | None, dict | None]:
    """(None, manifest) for a whole checkpoint, else (what is wrong, None)."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return "no manifest.json (the save did not finish)", None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as error:
        return f"manifest.json unreadable ({error})", None
    if manifest.get("format") != FORMAT:
        return f"manifest.json is not {FORMAT}", None
    for name, want in sorted(manifest["files"].items()):
        file = os.path.join(folder, name)
        if not os.path.exists(file):
            return f"{name} is missing", None
        size = os.path.getsize(file)
        if size != want["bytes"]:
            return f"{name} has {size} bytes, the manifest says {want['bytes']} (truncated)", None
        if sha256(file) != want["sha256"]:
            return f"{name}: sha256 differs from the manifest's (corrupt)", None
    return None, manifest


def newest_whole(root: str) -> tuple[str | None, dict | None, list[str]]:
    """(folder, manifest) of the newest whole checkpoint under root (None, None: there is none),
    and a line for every newer one passed over, naming what was wrong with it."""
    passed = []
    for step in reversed(steps(root)):
        folder = step_dir(root, step)
        wrong, manifest = problem(folder)
        if wrong is None:
            return folder, manifest, passed
        passed.append(f"checkpoint {folder} not loaded: {wrong}")
    return None, None, passed


def prune(root: str, keep: int) -> list[str]:
    """Remove every checkpoint older than the newest `keep` finished ones (those with a
    manifest; partial ones older than them too); returns the folders removed. Cheap: the
    checksums are read on resume, not here."""
    whole = [s for s in steps(root) if os.path.exists(os.path.join(step_dir(root, s), MANIFEST))]
    if len(whole) <= keep:
        return []
    oldest_kept = whole[-keep]
    removed = []
    for step in steps(root):
        if step < oldest_kept:
            shutil.rmtree(step_dir(root, step), ignore_errors=True)
            removed.append(step_dir(root, step))
    return removed
