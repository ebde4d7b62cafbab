# Generated from solutions/ex12_checkpoint_interval.py by `minipar exercises --generate`: write your code where
# it raises NotImplementedError, then check it with `minipar grade 12`.
# The grader admits these imports here (others it refuses, naming the line):
#   math
#   and plain modules (math, itertools, numpy, torch, ...); no open, exec, getattr, _names.
"""Exercise 12, the checkpoint interval (lesson 12: failures at scale).

A job of G GPUs is interrupted every M seconds on average (its MTBI). Saving a checkpoint stops
training for delta seconds; after a failure the job restarts in R seconds and redoes the work
done since the last checkpoint, on average half an interval. Saving every tau seconds wastes

    waste(tau) = delta / tau  +  (R + tau / 2) / M          (of the wall clock, to first order)

Find M from a published failure count, the tau that minimises the waste (Young's interval), and
the goodput (1 - waste). What the grader checks, in this order (relative 1e-9 each):
- mtbi_seconds on Llama 3's count (419 in 54 days on 16,384 GPUs), for 16,384 and 1,024 GPUs;
- waste at tau = 1000 s, and best_interval for three (delta, M) pairs (the feedback says how far
  the waste at your tau is above the least, and how your tau grows when delta or M grows 4x
  beside how the best one grows), and that waste is larger at 0.5, 0.9, 1.1 and 2 times your tau;
- goodput against lesson 12's at each of its save costs, and 0 where more is lost than the
  clock has.

Grade it: minipar grade 12
"""

import math


def mtbi_seconds(interruptions: int, days: float, gpus_seen: int, gpus: int) -> float:
    """The MTBI of a job of `gpus` GPUs, if each GPU fails independently at the rate seen:
    `interruptions` in `days` days on `gpus_seen` GPUs."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def waste(interval_s: float, save_s: float, restart_s: float, mtbi_s: float) -> float:
    """The fraction of the wall clock lost: saves, restarts and work redone."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def best_interval(save_s: float, mtbi_s: float) -> float:
    """The interval tau that minimises waste(tau) (it does not depend on R)."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")


def goodput(save_s: float, restart_s: float, mtbi_s: float) -> float:
    """The share of the wall clock that trains at the best interval (0 when nothing does)."""
    raise NotImplementedError("write this part (`minipar grade --hints` shows a hint)")
