"""Numbers as a student reads them: sizes in powers of two, times in the unit that reads best,
rates in decimal units as datasheets quote them. The lessons' pages and the claim records print
through these three."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (powers of two, as message sizes are)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_time(seconds: float) -> str:
    """Seconds in the unit that reads best: 12.3 us, 4.56 ms, 1.23 s (a negative time keeps its
    sign, so an impossible value is shown as it was measured)."""
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_rate(bytes_per_second: float) -> str:
    """Bytes per second in decimal units, as datasheets quote bandwidth: 900 GB/s, 1.8 TB/s."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bytes_per_second) >= scale:
            return f"{bytes_per_second / scale:.3g} {unit}"
    return f"{bytes_per_second:.3g} B/s"


def fmt_value(value, unit: str) -> str:
    """A claim's value in its unit: s, B/s, B, steps, x (a ratio), fraction (shown as a
    percentage), or any other unit written after the number."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "s":
        return fmt_time(value)
    if unit == "B/s":
        return fmt_rate(value)
    if unit == "B":
        return fmt_bytes(value)
    if unit == "x":
        return f"{value:.3g}x"
    if unit in ("fraction", "%"):  # a fraction shown as a percentage ("%": older records)
        return f"{value:.1%}"
    if isinstance(value, int):
        return f"{value} {unit}".strip()
    return f"{value:.4g} {unit}".strip()
