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
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}  # tc's, bits per second
# tc's bytes per second, refused: "2gbps" reads as 2 gigabits a second and is 16 (tc(8)), so a
# job would run at 8 times the rate meant with nothing said; the bit spelling is unambiguous
BYTE_UNITS = {  # tc's byte spelling -> (the bit spelling, the bytes it means)
    "bps": ("bit", "B/s"),
    "kbps": ("kbit", "kB/s"),
    "mbps": ("mbit", "MB/s"),
    "gbps": ("gbit", "GB/s"),
    "tbps": ("tbit", "TB/s"),
}
UNLIMITED = ("unlimited", "none", "0")


def parse(rate: str) -> float | None:
    """Bits per second from tc's bit spelling ('2gbit', '500mbit', '1.5gbit'); None for
    'unlimited'. A ValueError names the bad value and the spellings that work; tc's byte
    spellings ('2gbps': bytes per second) are refused with the bit spelling of both readings."""
    text = str(rate).strip().lower()
    if text in UNLIMITED:
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if found and found.group(2) in BYTE_UNITS:
        raise ValueError(_bytes_refused(rate, float(found.group(1)), found.group(2)))
    if not found or found.group(2) not in UNITS or float(found.group(1)) <= 0:
        raise ValueError(
            f"--link {rate!r}: give a rate in bits per second as tc spells it (2gbit, 500mbit, "
            "1.5gbit) or 'unlimited'"
        )
    return float(found.group(1)) * UNITS[found.group(2)]


def _bytes_refused(rate, number: float, unit: str) -> str:
    bits, per_second = BYTE_UNITS[unit]
    meant = describe(number * UNITS[bits]).split(" (")[0]
    return (
        f"--link {rate!r}: tc reads {unit!r} as bytes per second, {number:g} {per_second} = "
        f"{describe(number * 8 * UNITS[bits]).split(' (')[0]}; write bits: {number:g}{bits} for "
        f"{meant}, or {number * 8:g}{bits} for {number:g} {per_second}"
    )


def describe(bits: float | None) -> str:
    """'2 Gbit/s (250 MB/s)', or 'unlimited'."""
    if bits is None:
        return "unlimited (the veth's own speed)"
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit} ({bits / 8e6:g} MB/s)"
    return f"{bits:g} bit/s ({bits / 8:g} B/s)"


def line(rate: str | None) -> str:
    """'link: 2 Gbit/s (250 MB/s)': the line every --nodes command prints (rate: as given to
    --link, None for the default), in bits and in bytes."""
    return f"link: {describe(parse(rate or DEFAULT))}"


def bucket_bytes(bits: float) -> int:
    """The token bucket: 1 ms at the rate, at least 64 KiB."""
    return max(int(bits / 8 / 1000), 64 * 1024)


def tbf(bits: float | None) -> list[str] | None:
    """tc's arguments after `qdisc add dev DEV root` that shape a cable, or None (unlimited)."""
    if bits is None:
        return None
    return ["tbf", "rate", f"{int(bits)}bit", "burst", str(bucket_bytes(bits)), "latency", "20ms"]
