"""The link between emulated nodes: its rate, in tc's spellings, and the queue that enforces it.

Each node's cable is shaped in both directions by a token bucket filter (tc's tbf): bytes
leave at the rate, in bursts no larger than the bucket. The bucket holds 1 ms of the rate (at
least 64 KiB, one TSO packet, which tbf would otherwise drop whole), and a queue of 20 ms, so
a sender that outruns the link waits in TCP's window instead of losing packets. A job's
default link is 2 Gbit/s: slow enough beside shared memory (a few GB/s here) that the
hierarchy shows in every measurement, fast enough that tests over it take seconds.
"""

from __future__ import annotations

import re

DEFAULT = "2gbit"
UNITS = {  # tc's rate units (tc(8)): bits per second; "bps" is bytes per second
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
}
UNLIMITED = ("unlimited", "none", "0")


def parse(rate: str) -> float | None:
    """Bits per second from tc's spelling ('2gbit', '500mbit', '1.5gbit', '125mbps'); None for
    'unlimited'. A ValueError names the bad value and the spellings that work."""
    text = str(rate).strip().lower()
    if text in UNLIMITED:
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if not found or found.group(2) not in UNITS or float(found.group(1)) <= 0:
        raise ValueError(
            f"--link {rate!r}: give a rate as tc spells it (2gbit, 500mbit, 100mbps) or 'unlimited'"
        )
    return float(found.group(1)) * UNITS[found.group(2)]


def describe(bits: float | None) -> str:
    """'2 Gbit/s (250 MB/s)', or 'unlimited'."""
    if bits is None:
        return "unlimited (the veth's own speed)"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit} ({bits / 8e6:g} MB/s)"
    return f"{bits:g} bit/s"


def bucket_bytes(bits: float) -> int:
    """The token bucket: 1 ms at the rate, at least 64 KiB."""
    return max(int(bits / 8 / 1000), 64 * 1024)


def tbf(bits: float | None) -> list[str] | None:
    """tc's arguments after `qdisc add dev DEV root` that shape a cable, or None (unlimited)."""
    if bits is None:
        return None
    return ["tbf", "rate", f"{int(bits)}bit", "burst", str(bucket_bytes(bits)), "latency", "20ms"]
