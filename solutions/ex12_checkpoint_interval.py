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
    # BEGIN SOLUTION hint: one GPU's MTBF is the GPU-seconds observed per interruption;
    # hint: G independent GPUs fail G times as often
    per_gpu = days * 86400 * gpus_seen / interruptions
    return per_gpu / gpus
    # END SOLUTION


def waste(interval_s: float, save_s: float, restart_s: float, mtbi_s: float) -> float:
    """The fraction of the wall clock lost: saves, restarts and work redone."""
    # BEGIN SOLUTION hint: the formula in the docstring above, term by term
    return save_s / interval_s + (restart_s + interval_s / 2) / mtbi_s
    # END SOLUTION


def best_interval(save_s: float, mtbi_s: float) -> float:
    """The interval tau that minimises waste(tau) (it does not depend on R)."""
    # BEGIN SOLUTION hint: set the derivative of waste(tau) to zero: -delta / tau^2 + 1 / (2 M)
    return math.sqrt(2 * save_s * mtbi_s)
    # END SOLUTION


def goodput(save_s: float, restart_s: float, mtbi_s: float) -> float:
    """The share of the wall clock that trains at the best interval (0 when nothing does)."""
    # BEGIN SOLUTION hint: 1 - waste at best_interval, never below 0
    return max(0.0, 1 - waste(best_interval(save_s, mtbi_s), save_s, restart_s, mtbi_s))
    # END SOLUTION
