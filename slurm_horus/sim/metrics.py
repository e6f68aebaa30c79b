"""The metrics of a finished simulation (docs/simulator.md lists them)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["metrics", "pct"]


def pct(xs: list[float], p: float) -> float:
    """The p-quantile of sorted ``xs`` (linear interpolation; 0 when empty)."""
    if not xs:
        return 0.0
    k = (len(xs) - 1) * p
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_slowdown(ran: float, solo: float, timed_out: bool, remaining: float) -> float:
    """A run's slowdown: its run time over its solo runtime, or, killed at its time limit, over
    the solo time of the work it did."""
    if not timed_out:
        return ran / solo
    return ran / max(solo - remaining, 1e-9 * solo)


def metrics(sim, t0: float, rejected: int, unschedulable: int, wall: float) -> dict[str, Any]:
    """Per-policy figures of the Simulator ``sim`` after its run (t0: the first submit).  A
    figure over no job (no job ended) or over no time (an empty window or makespan) is None,
    not 0: a mean JCT of 0 or a slowdown of 1 had read as true."""
    end, start, timed_out, w_end = sim.end, sim.start, sim.timed_out, sim.w_end
    submit = [j.submit for j in sim.jobs]
    done = [i for i, (e, f) in enumerate(zip(end, sim.failed)) if e >= 0 and not f]
    jct = sorted([end[i] - submit[i] for i in done])
    waits = [start[i] - submit[i] for i in done]
    # per-job slowdown: run time over the solo run time on the GPU type it ran on (interference
    # only, not the type).  A job killed at its time limit counts at the slowdown it ran at: its
    # run time over the solo work it did, above its limit over its solo time (counting it at
    # that, the kill time, had put a job killed on a T4 exactly at a bound of 2, never beyond).
    # A job killed once and submitted again counts at the worse of its two runs: the rerun
    # alone must not hide the interference that killed it.
    solo, remaining, killed = sim.solo, sim.remaining, sim.killed_slowdown
    slow = sorted([max(killed[i], run_slowdown(end[i] - start[i], solo[i], timed_out[i], remaining[i]))
                   for i in done])
    win = w_end - t0
    # a job killed at its time limit ended, but did not complete: no throughput
    in_win = sum(1 for i in done if end[i] <= w_end and not timed_out[i])
    t_end = max((e for e in end if e >= 0), default=t0)
    span = max(t_end - t0, 0.0)
    G = sim.G
    return {
        "jobs": len(sim.jobs),
        "completed": sum(1 for i in done if not timed_out[i]),
        "ended": len(done),
        "makespan_s": span,
        "mean_jct_s": sum(jct) / len(jct) if jct else None,
        "median_jct_s": pct(jct, 0.5) if jct else None,
        "p95_jct_s": pct(jct, 0.95) if jct else None,
        "mean_wait_s": sum(waits) / len(waits) if waits else None,
        "gpu_util": sim.acc_util / (G * span) if span > 0 else None,
        "gpus_busy": sim.acc_busy / span if span > 0 else None,
        "gpus_busy_frac": sim.acc_busy / (G * span) if span > 0 else None,
        "mean_slowdown": sum(slow) / len(slow) if slow else None,
        "p50_slowdown": pct(slow, 0.5) if slow else None,
        "p95_slowdown": pct(slow, 0.95) if slow else None,
        "p99_slowdown": pct(slow, 0.99) if slow else None,
        "window_s": win,
        "throughput_per_h": 3600.0 * in_win / win if win > 0 else None,
        "sm_busy": sim.w_util / (G * win) if win > 0 else None,
        "gpus_alloc": sim.w_busy / (G * win) if win > 0 else None,
        "oom_failures": sim.oom_failures,
        "failed_jobs": sum(sim.failed),
        "timeouts": sim.timeouts,
        "resubmitted": sum(sim.resubmitted),
        "rejected": rejected,
        "unschedulable": unschedulable,
        "shared_starts": sim.shared_starts,
        "backfilled": sim.backfilled,
        "bf_interval_s": sim.bf_interval if sim.backfill else None,
        "bf_window": sim.bf_window if sim.backfill else None,
        "history_hits": sim.history_hits,
        "site_hits": sim.site_hits,
        "beyond_bound": sum(1 for x in slow if x > sim.bound),
        "expected_beyond": sim.risk,
        "sim_wall_s": wall,
    }
