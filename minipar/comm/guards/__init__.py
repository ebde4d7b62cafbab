"""Mismatches and departures caught off the path: the watchdog, a stalled wait asking its peers,
the notices between ranks, the calls compared at the end, a rank leaving. See ../__init__.py."""
