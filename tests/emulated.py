"""Whether emulated nodes (minipar/launcher/cluster/) can be made here: one cluster of one node
made and removed when a test file first imports this, and the skip mark saying why not."""

import pytest

from minipar.launcher.cluster import needs
from minipar.launcher.cluster.nodes import EmulatedCluster, EmulationError


def _can_emulate() -> str:
    """'' when emulated nodes can be made here, else why not (printed with the skip)."""
    lacks = needs.missing()
    if lacks:
        return "; ".join(lacks)
    try:
        with EmulatedCluster(1, "unlimited"):
            pass
    except EmulationError as error:
        return str(error)
    return ""


WHY_NOT = _can_emulate()
emulation = pytest.mark.skipif(bool(WHY_NOT), reason=f"no emulated nodes here: {WHY_NOT}")
