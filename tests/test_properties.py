"""Property-based tests: hypothesis draws collective calls, real ranks run them.

Launching ranks costs seconds, so hypothesis does not drive the ranks one example at a time.
Here, in the pytest process, it draws every spec up front (world size, collective, algorithm,
buffer kind, dtype, count, op, root, exact or not, seed), deterministically (derandomize), and
writes them to one JSON file; tests/ranks/properties.py reads that file on every rank, and each
world size's batch runs in one launch. Each spec is one pytest test.

Profiles: CI draws PROFILE_CI specs over world sizes 1-6 with numpy buffers; the extended run
(MINIPAR_EXTENDED=1) draws PROFILE_EXTENDED over sizes 1-8 with numpy and torch buffers.
"""

import atexit
import json
import os
import shutil
import tempfile

import pytest
from conftest import ranks_suite
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from minipar.collectives import registry
from minipar.testing import harness

SUITE = ranks_suite("properties.py")
EXTENDED = os.environ.get("MINIPAR_EXTENDED") == "1"
PROFILE_CI, PROFILE_EXTENDED = 160, 1200
# the first size is drawn most often (hypothesis favours the start of a list): put 1 last
SIZES = [4, 3, 2, 5, 6, 7, 8, 1] if EXTENDED else [4, 3, 2, 5, 6, 1]

REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
ROOTED = {"reduce", "broadcast", "scatter", "gather"}
COLLECTIVES = sorted(REDUCING | ROOTED | {"all_gather", "all_gather_list", "all_to_all"}) + [
    "barrier"
]
FLOATS = ["float64", "float32", "float16", "complex64"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"]
DTYPES = {
    "numpy": FLOATS + INTS + ["bool"],
    "torch": [
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "int8",
        "int32",
        "int64",
        "uint8",
        "bool",
    ],
}


def ops_for(dtype: str) -> list[str]:
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    if dtype.startswith("complex"):
        ops = ["SUM", "PRODUCT"]  # complex numbers have no order
    if dtype.startswith(("float", "bfloat", "complex")):
        ops.append("AVG")
    return ops


@st.composite
def specs(draw, sizes, kinds):
    size = draw(st.sampled_from(sizes))
    collective = draw(st.sampled_from(COLLECTIVES))
    table = "all_gather" if collective == "all_gather_list" else collective
    algorithm = draw(st.sampled_from(registry.algorithms(table)))
    kind = draw(st.sampled_from(kinds))
    dtype = draw(st.sampled_from(DTYPES[kind]))
    floating = dtype.startswith(("float", "bfloat", "complex"))
    return {
        "size": size,
        "collective": collective,
        "algorithm": algorithm,
        "kind": kind,
        "dtype": dtype,
        "count": draw(st.one_of(st.integers(0, 9), st.integers(10, 3000))),
        "op": draw(st.sampled_from(ops_for(dtype))) if collective in REDUCING else None,
        "root": draw(st.integers(0, size - 1)) if collective in ROOTED else None,
        "exact": draw(st.booleans()) if floating else True,
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def draw_specs(n: int, sizes, kinds) -> list[dict]:
    """n specs, the same ones on every run (derandomize), in the pytest process."""
    drawn = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(specs(sizes, kinds))
    def collect(spec):
        drawn.append(spec)

    collect()
    return drawn


def write_specs() -> str:
    """Draw the profile's specs and point the rank-side suite at them (before collection)."""
    kinds = ["numpy", "torch"] if EXTENDED else ["numpy"]
    drawn = draw_specs(PROFILE_EXTENDED if EXTENDED else PROFILE_CI, SIZES, kinds)
    folder = tempfile.mkdtemp(prefix="minipar-properties-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "specs.json")
    with open(path, "w") as f:
        json.dump(drawn, f)
    os.environ["MINIPAR_PROPERTY_SPECS"] = path
    return path


SPECS_FILE = write_specs()


@pytest.mark.parametrize("size,name", harness.params(SUITE, SIZES))
def test_property(size, name):
    harness.run_suite(SUITE, size, "mpi").check(name)


def test_profile_size_and_coverage():
    """The profile has the promised number of cases and covers every collective and size."""
    with open(SPECS_FILE) as f:
        drawn = json.load(f)
    assert len(drawn) >= (PROFILE_EXTENDED if EXTENDED else PROFILE_CI) * 0.9, len(drawn)
    assert {s["collective"] for s in drawn} == set(COLLECTIVES)
    assert {s["size"] for s in drawn} == set(SIZES)
    assert draw_specs(20, SIZES, ["numpy"]) == draw_specs(20, SIZES, ["numpy"])  # deterministic
