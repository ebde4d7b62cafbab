"""The links the cost model prices a message on: alpha, beta, gamma of real hardware.

    Link(name, alpha, beta, gamma, source)     seconds per message, per byte sent, per byte
                                               reduced; `source` says where the numbers are from

The presets are datasheet figures (HBM3e, NVLink 4 and 5, PCIe 5, InfiniBand NDR) for the
lessons' "what would this cost on a cluster" questions, and SHARED_MEMORY / SHARED_WINDOW the
typical figures of minipar's own transports on a laptop-class CPU. `minipar bench --fit` measures
a machine's own and saves them as JSON (save_link / load_link); MINIPAR_LINK and
MINIPAR_SHM_LINK name such files. The links `auto` prices with are loaded once and kept in
`process.links` (minipar.state), the same on every rank when the environment is.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace

from minipar.cost import calibration
from minipar.cost.link import Link
from minipar.state import process

# What minipar's Python algorithms over the mpich wheel's shared memory cost on a laptop-class
# CPU: ~20 us per step (mostly Python and mpi4py call overhead), ~5 GB/s per message copy,
# ~5 GB/s numpy reduction. `minipar bench --fit` measures the real numbers of a machine.
SHARED_MEMORY = Link(
    "shared-memory", alpha=20e-6, beta=1 / 5e9, gamma=1 / 5e9, source="preset (typical laptop CPU)"
)

# -- presets: real links, for the lessons' "what would this cost on a cluster" questions ----------
# beta is 1 / (bandwidth in ONE direction): a ring step sends and receives at once, each way at
# full rate. gamma is the GPU's reduction cost: adding two bytes into one moves 3 bytes of HBM.
# alpha (one message's latency through NCCL-class software) is on no datasheet: the values are
# round, typical figures, and labelled as assumed.
_HBM3E = 8e12  # B200 HBM3e, 8 TB/s: NVIDIA B200 datasheet; the seed, chapter 3
_GPU_GAMMA = 3 / _HBM3E

HBM3E = Link("hbm3e", 1e-6, 1 / _HBM3E, _GPU_GAMMA, "B200 datasheet: HBM3e 8 TB/s; alpha assumed")
NVLINK5 = Link(  # B200 datasheet / the seed: NVLink 5, 1.8 TB/s per GPU, both directions
    "nvlink5", 3e-6, 1 / 900e9, _GPU_GAMMA, "B200: NVLink 5 1.8 TB/s = 900 GB/s each way"
)
NVLINK4 = Link(  # H100 SXM datasheet: NVLink 4, 900 GB/s per GPU, both directions; HBM3 3.35 TB/s
    "nvlink4", 3e-6, 1 / 450e9, 3 / 3.35e12, "H100: NVLink 4 900 GB/s = 450 GB/s each way"
)
PCIE5 = Link(  # PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b coding = 63 GB/s per direction
    "pcie5", 5e-6, 1 / 64e9, _GPU_GAMMA, "PCIe 5.0 x16: ~64 GB/s each way"
)
IB_NDR = Link(  # InfiniBand NDR (ConnectX-7): 400 Gb/s per port = 50 GB/s per direction
    "ib_ndr", 6e-6, 1 / 50e9, _GPU_GAMMA, "InfiniBand NDR 400 Gb/s = 50 GB/s each way, per NIC"
)
PRESETS = {link.name: link for link in (HBM3E, NVLINK5, NVLINK4, PCIE5, IB_NDR, SHARED_MEMORY)}

LINK_ENV = "MINIPAR_LINK"  # a JSON file written by `minipar bench --fit`


def default_link() -> Link:
    """The link `algorithm="auto"` prices with: set_default_link's, else the JSON file named by
    MINIPAR_LINK (from `minipar bench --fit`), else this machine's stored calibration (`minipar
    calibrate`; cost.calibration.here: only a fresh, physical one made on this host), else
    SHARED_MEMORY. `.source` says which. Set it the same on every rank (an environment variable
    is: mpiexec passes it to every rank; the calibration is the same file on one host)."""
    found = process.links.get("mpi")
    if found is not None:
        return found
    if os.environ.get(LINK_ENV):
        return _load_once("mpi", LINK_ENV, SHARED_MEMORY)
    process.links["mpi"] = calibration.here()[0] or SHARED_MEMORY
    return process.links["mpi"]


def _load_once(transport: str, env: str, fallback: Link) -> Link:
    """Keep in `process.links[transport]` the link in the JSON file the environment variable
    `env` names, else `fallback`; the next asks read it from there."""
    path = os.environ.get(env)
    process.links[transport] = load_link(path) if path else fallback
    return process.links[transport]


def set_default_link(link: Link) -> None:
    process.links["mpi"] = link


def save_link(link: Link, path: str, **measured) -> None:
    """Write a link (and any measurements behind it) as JSON, for load_link / MINIPAR_LINK."""
    record = {**asdict(link), "measured": measured}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


def load_link(path: str) -> Link:
    """The Link stored by save_link (`minipar bench --fit`)."""
    with open(path) as f:
        record = json.load(f)
    try:
        return Link(
            str(record["name"]),
            float(record["alpha"]),
            float(record["beta"]),
            float(record["gamma"]),
            str(record.get("source", path)),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{path} is not a link file (needs name, alpha, beta, gamma): {error}"
        ) from None


# -- a link per transport: MPI messages, or single-copy shared windows (comm/transport/shm.py)
# ----------- alpha: one wait on a peer's counter in shared memory, with the Python around it; beta:
# one byte copied once through a window (numpy's copy to or from memory the peer touches: measured
# ~4.5 GB/s on the 2-core development VM, where MPICH's two copies through its small, cache-hot
# bounce cells cost about as much as one such copy); gamma: one byte reduced. With these numbers
# `auto` keeps MPI (docs/bench.md: the windows did not beat MPICH's ring there); a machine where
# they win says so through MINIPAR_SHM_LINK (a link JSON file, as `minipar bench --fit` writes).
SHARED_WINDOW = Link("shared-window", alpha=6e-6, beta=1 / 4.5e9, gamma=1 / 5e9, source="VM")
SHM_LINK_ENV = "MINIPAR_SHM_LINK"


def shm_link() -> Link:
    """The window link `auto` prices with: set_shm_link's, else the JSON file named by
    MINIPAR_SHM_LINK (`minipar bench --fit` writes one beside the MPI link), else
    SHARED_WINDOW."""
    return process.links.get("shm") or _load_once("shm", SHM_LINK_ENV, SHARED_WINDOW)


def set_shm_link(link: Link) -> None:
    process.links["shm"] = link


# -- the link between nodes: what a message from one node to another costs ---------------------
INTER_LINK_ENV = "MINIPAR_INTER_LINK"  # `minipar bench --fit` on a group that spans nodes
EMULATED_LINK_ENV = "MINIPAR_LINK_BITS"  # the emulated link's rate, bits/s (`--nodes`, `--link`)


# Until `minipar bench --fit` measures it, the link between nodes is assumed a 10 Gb Ethernet
# port: slower than any link inside a node, which is what `auto` must know to keep the heavy
# traffic inside (priced alike, a flat Rabenseifner ties the two-level all-reduce on 2 x 2 and
# measured 2.3x slower across two emulated nodes on a 2 Gbit/s cable).
BETWEEN_NODES = Link(
    "between-nodes", alpha=50e-6, beta=1 / 1.25e9, gamma=1 / 5e9,
    source="assumed: 10 Gb Ethernet, until bench --fit measures the link between nodes",
)  # fmt: skip


def inter_link() -> Link:
    """The link between nodes `auto` prices a group that spans nodes with: set_inter_link's,
    else the JSON file named by MINIPAR_INTER_LINK (`minipar bench --fit` across nodes writes
    it), else the emulated nodes' cable at the rate it is shaped to (MINIPAR_LINK_BITS, with
    BETWEEN_NODES' alpha and gamma), else BETWEEN_NODES (assumed)."""
    found = process.links.get("inter")
    if found is not None:
        return found
    path = os.environ.get(INTER_LINK_ENV)
    if not path:
        return emulated_link() or BETWEEN_NODES
    process.links["inter"] = load_link(path)
    return process.links["inter"]


def cable(bits: float) -> Link:
    """An emulated node's cable shaped to `bits` per second (`minipar run --nodes N --link
    RATE`: tc tbf), with BETWEEN_NODES' alpha and gamma."""
    return replace(BETWEEN_NODES, name=f"a cable of {bits:g} bit/s", beta=8 / bits,
                   source="minipar run --link's emulated cable (tc tbf)")  # fmt: skip


def emulated_link() -> Link | None:
    """The emulated nodes' cable this job runs on (MINIPAR_LINK_BITS, set by the launcher), or
    None."""
    bits = os.environ.get(EMULATED_LINK_ENV)
    return cable(float(bits)) if bits else None


def set_inter_link(link: Link | None) -> None:
    """Price messages between nodes on `link` (None: back to the environment's)."""
    if link is None:
        process.links.pop("inter", None)
    else:
        process.links["inter"] = link


# -- the hierarchy: GPUs in NVLink domains, domains joined by InfiniBand ----------------------


@dataclass(frozen=True)
class Hierarchy:
    """Nodes of `per_node` GPUs joined by `intra`; nodes joined by `inter`, one NIC per GPU."""

    intra: Link
    inter: Link
    per_node: int = 8


DGX_B200 = Hierarchy(NVLINK5, IB_NDR, 8)  # 8 B200 per NVLink domain, 8 NDR NICs per node
DGX_H100 = Hierarchy(NVLINK4, IB_NDR, 8)
