"""Interference model of the cluster simulator: how fast co-located jobs run.

Each job on a shared GPU runs at ``speed = f(sum of the TRUE solo utilizations of all jobs on
that GPU)``, relative to its speed alone.  ``f`` is piecewise linear through the medians of the
Lucid pair measurements (1,388 pairs of training jobs on an RTX 3090, grouped by the sum of their
solo utilizations; see docs/simulator.md and shared/notes/colocation.md), extended to very high
sums so that the worst case is Horus' reported 3.2x slowdown:

    sum of utils (%)   0     75    87.5   112.5  137.5  162.5  187.5  400
    per-job speed      1.00  1.00  0.97   0.935  0.846  0.73   0.65   1/3.2

Each Lucid bin's median is placed at the bin's middle (the ">175 %" bin at 187.5 %); beyond the
last point the speed stays constant.  A job alone on its GPU always runs at speed 1.0.

The spread: the curve gives the MEDIAN loss of a pair with that summed utilization; each job
carries a sensitivity k (lognormal, median 1, drawn per job by the trace generator), and its loss
is k x the median loss, floored at the worst case (1/3.2), so the median job of a bin runs at the
bin's median speed.  Two jobs with the same summed util thus slow each other differently, and a
pair's outcome depends on who is in it.  Over Lucid's mix of sums the pair speeds have p10 0.78
(Lucid: 0.78) and reach the 1/3.2 floor (Lucid's minimum: 0.44).

Beyond pairs (a stated assumption, no group measurement exists): k >= 3 jobs use the same curve
at their summed utilization, and each job beyond the second multiplies every job's speed by
(1 - beyond_pairs) (default 5 %: context switching between more processes).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import numpy as np

from slurm_horus.errors import HorusError

__all__ = ["Interference", "LUCID_POINTS", "SENSITIVITY_SIGMA", "known_above", "parse_points", "sensitivity_at",
           "share_above"]

# The spread: each job's sensitivity k is lognormal with median 1 (Lucid's pairs: k_obs median
# 1.04, BENCHMARKS.md; a mean of 1 had put the median job's loss 17 % below the measured median)
# and this sigma, at which the pair speeds over Lucid's mix of sums have Lucid's p10 (0.78).
# Traces draw each job's k from it; the horus scheduler knows only the distribution
# (Interference.exceed_share), never a job's k.
SENSITIVITY_SIGMA = 0.6

LUCID_POINTS: tuple[tuple[float, float], ...] = (
    (0.0, 1.0),
    (75.0, 1.0),
    (87.5, 0.97),
    (112.5, 0.935),
    (137.5, 0.846),
    (162.5, 0.73),
    (187.5, 0.65),
    (400.0, 1.0 / 3.2),
)


@dataclass(frozen=True)
class Interference:
    """Per-job speed of co-located jobs as a piecewise-linear function of their summed util.

    points: (sum_util_pct, speed) pairs, sums strictly increasing, speeds in (0, 1].
    mem_bw_penalty: optional extra slowdown per additional co-located job (0 = off): the speed
    is multiplied by (1 - mem_bw_penalty) ** (jobs_on_gpu - 1), a crude memory-bandwidth term.
    """

    points: tuple[tuple[float, float], ...] = LUCID_POINTS
    mem_bw_penalty: float = 0.0
    beyond_pairs: float = 0.05
    # derived in __post_init__ and speed_table (declared fields: the compiled build has no __dict__)
    _xs: list[float] = field(init=False, repr=False, compare=False)
    _tables: tuple | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        pts = tuple((float(x), float(y)) for x, y in self.points)
        if len(pts) < 1:
            raise HorusError("interference: need at least one point")
        for i, (x, y) in enumerate(pts):
            if not (math.isfinite(x) and math.isfinite(y)):
                raise HorusError(f"interference: {x}:{y} is not a pair of finite numbers")
            if not (0.0 < y <= 1.0):
                raise HorusError(f"interference: speed {y} at {x} % is not in (0, 1]")
            if x < 0 or (i and x <= pts[i - 1][0]):
                raise HorusError("interference: utilization sums must be >= 0 and increasing")
            if i and y > pts[i - 1][1]:
                # the bound's limits bisect a falling curve, and its last speed is the floor
                raise HorusError(f"interference: speed {y} at {x} % is above {pts[i - 1][1]} before it: "
                                 "the speed must not rise with the summed utilization")
        if not (0.0 <= self.mem_bw_penalty < 1.0) or not (0.0 <= self.beyond_pairs < 1.0):
            raise HorusError("interference: mem_bw_penalty and beyond_pairs must be in [0, 1)")
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "_xs", [p[0] for p in pts])
        object.__setattr__(self, "_tables", None)

    def speed(self, sum_util_pct: float, n_jobs: int = 2, sens: float = 1.0) -> float:
        """Per-job speed (0..1] of a job of sensitivity ``sens`` among ``n_jobs`` co-located jobs
        whose solo utils sum to ``sum_util_pct``.  One job alone runs at 1.0."""
        return self.speeds(sum_util_pct, n_jobs, (sens,))[0]

    def speeds(self, sum_util_pct: float, n_jobs: int, sens: Sequence[float]) -> list[float]:
        """:meth:`speed` of a job of each of these sensitivities in one group (the curve read once)."""
        if n_jobs <= 1:
            return [1.0 for _ in sens]
        s, worst = self._pair(sum_util_pct), self.points[-1][1]
        out = [s if k == 1.0 else max(worst, 1.0 - (1.0 - s) * k) for k in sens]
        if n_jobs > 2 or self.mem_bw_penalty:
            crowd = self._crowd(n_jobs)
            return [x * crowd for x in out]
        return out

    def _pair(self, sum_util_pct: float) -> float:
        """The pair curve's median speed at ``sum_util_pct``, before any crowding factor."""
        pts, xs = self.points, self._xs
        if sum_util_pct <= xs[0]:
            return pts[0][1]
        if sum_util_pct >= xs[-1]:
            return pts[-1][1]
        i = bisect.bisect_right(xs, sum_util_pct)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (sum_util_pct - x0) / (x1 - x0)

    def speed_table(self, max_jobs: int) -> tuple["np.ndarray", "np.ndarray", "np.ndarray"]:
        """The curve as numpy arrays (sums, speeds, crowding factor by group size up to at least
        ``max_jobs``): ``np.interp(s, sums, speeds) * crowd[n]`` is :meth:`speed` of the median
        job in groups of n >= 2 (the horus scheduler prices every candidate group at once).
        numpy is imported here: the queue loop reads this module too and needs none of it."""
        import numpy as np

        tables = self._tables
        if tables is None or max_jobs >= len(tables[2]):
            size = max(1025, max_jobs + 1)  # _crowd by group size
            tables = (np.array(self._xs), np.array([p[1] for p in self.points]),
                      np.array([1.0, 1.0] + [self._crowd(n) for n in range(2, size)]))
            object.__setattr__(self, "_tables", tables)
        return tables

    def _crowd(self, n_jobs: int) -> float:
        """The factor on every speed in a group of ``n_jobs`` >= 2 beyond the pair curve:
        ``beyond_pairs`` per job past the second, ``mem_bw_penalty`` per partner."""
        c = (1.0 - self.beyond_pairs) ** (n_jobs - 2) if n_jobs > 2 and self.beyond_pairs else 1.0
        if self.mem_bw_penalty:
            c *= (1.0 - self.mem_bw_penalty) ** (n_jobs - 1)
        return c

    def sum_limit(self, bound: float, n_jobs: int, sens: float = 1.0) -> float:
        """The largest summed utilization (%) at which ``n_jobs`` co-located jobs keep the speed
        of a job of sensitivity ``sens`` >= 1 / ``bound`` (the curve falls with the sum:
        bisection); -1: never."""
        floor = 1.0 / bound
        lo, hi = 0.0, 100.0 * n_jobs
        if self.speed(lo, n_jobs, sens) < floor:
            return -1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.speed(mid, n_jobs, sens) >= floor else (lo, mid)
        return lo

    def exceed_share(self, sum_util_pct: float, n_jobs: int, bound: float,
                     sigma: float = SENSITIVITY_SIGMA, sens: float | None = None) -> float:
        """The share of jobs (over the sensitivity spread) that run slower than 1 / ``bound``
        among ``n_jobs`` co-located jobs whose solo utils sum to ``sum_util_pct``: P(k > k*),
        k* the sensitivity at which speed() reaches 1 / bound.  ``sens``: the job's own
        sensitivity, known (a what-if): 1.0 if it is beyond k*, else 0.0."""
        return self.exceed_shares(sum_util_pct, n_jobs, (bound,), sigma,
                                  None if sens is None else (sens,))[0]

    def exceed_shares(self, sum_util_pct: float, n_jobs: int, bounds: Sequence[float],
                      sigma: float = SENSITIVITY_SIGMA, sens: Sequence[float] | None = None,
                      known_sigma: float = 0.0) -> list[float]:
        """:meth:`exceed_share` for each of ``bounds`` in one group (the curve read once);
        ``sens``: each one's known sensitivity, or None (the spread); ``known_sigma``: the spread
        left around a known one (its configuration's median: lognormal; 0: the job's own)."""
        return self.mean_exceed_shares(((1.0, sum_util_pct),), n_jobs, bounds, sigma, sens, known_sigma)

    def mean_exceed_shares(self, weighted_sums: Sequence[tuple[float, float]], n_jobs: int,
                           bounds: Sequence[float], sigma: float = SENSITIVITY_SIGMA,
                           sens: Sequence[float] | None = None, known_sigma: float = 0.0) -> list[float]:
        """:meth:`exceed_shares` averaged over (weight, summed util) points: the shares read over
        the error of a predicted sum (the tail budget prices every candidate join this way)."""
        if n_jobs <= 1:
            return [0.0 for _ in bounds]
        crowd, worst = self._crowd(n_jobs), self.points[-1][1]
        # the median loss at each point; crowd below has the rest
        losses = [(w, 1.0 - self._pair(s)) for w, s in weighted_sums]
        out = []
        for i, bound in enumerate(bounds):
            need = 1.0 / bound / crowd
            total = 0.0
            for w, loss in losses:
                if need >= 1.0:
                    r = 1.0
                elif loss <= 0.0 or worst >= need:
                    r = 0.0  # no loss, or even the worst case stays within the bound
                elif sens is None:
                    r = share_above((1.0 - need) / loss, sigma)
                else:
                    r = known_above((1.0 - need) / loss, sens[i], known_sigma)
                total += w * r
            out.append(total)
        return out

    def loss_rates(self, sum_util_pct: float, n_jobs: int) -> tuple[float, float]:
        """(c, c x L) of a job among ``n_jobs`` whose utils sum to ``sum_util_pct``: its speed is
        c x (1 - k L) for sensitivity k (L the median loss, c the factor beyond pairs; the
        curve's floor left out), so its time-averaged speed over a run is linear in k."""
        c, (loss,) = self.loss_rates_at((sum_util_pct,), n_jobs)
        return c, loss

    def loss_rates_at(self, sums: Sequence[float], n_jobs: int) -> tuple[float, tuple[float, ...]]:
        """:meth:`loss_rates` at each of ``sums`` in a group of ``n_jobs``: (c, (c x L, ...)),
        c the same at every sum."""
        if n_jobs <= 1:
            return 1.0, tuple([0.0 for _ in sums])
        c = self._crowd(n_jobs)
        return c, tuple([c * (1.0 - self._pair(s)) for s in sums])


def sensitivity_at(q: float, sigma: float = SENSITIVITY_SIGMA) -> float:
    """The q-quantile of the sensitivity k (lognormal with median 1 and ``sigma``): the job that
    a share q of jobs are less sensitive than."""
    return math.exp(sigma * NormalDist().inv_cdf(q))


def share_above(k_star: float, sigma: float = SENSITIVITY_SIGMA) -> float:
    """P(k > k_star) for the sensitivity k, lognormal with median 1 and ``sigma``."""
    if k_star <= 0.0:
        return 1.0
    return 0.5 * math.erfc(math.log(k_star) / (sigma * math.sqrt(2.0)))


def known_above(k_star: float, sens: float, known_sigma: float) -> float:
    """P(k > k_star) for a job whose k is known as ``sens``: exactly (``known_sigma`` 0: 1 or 0),
    or as a median with that lognormal spread left around it (its configuration's)."""
    if known_sigma > 0.0:
        return share_above(k_star / sens, known_sigma)
    return 1.0 if sens > k_star else 0.0


def parse_points(text: str) -> tuple[tuple[float, float], ...]:
    """``"0:1,75:1,100:0.9,200:0.5"`` -> ((0, 1), (75, 1), (100, 0.9), (200, 0.5))."""
    pts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        x, sep, y = item.partition(":")
        try:
            if not sep:
                raise ValueError
            pts.append((float(x), float(y)))
        except ValueError:
            raise HorusError(f"interference: expected sum:speed pairs like 100:0.9, got '{item}'") from None
    if not pts:
        raise HorusError("interference: no points given")
    Interference(tuple(pts))  # validate
    return tuple(pts)
