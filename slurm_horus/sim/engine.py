"""Discrete-event simulation of a Slurm GPU cluster under several placement policies.

Policies (:mod:`slurm_horus.sim.policies`, docs/simulator.md):

* ``exclusive``: Slurm's default, one job per GPU;
* ``naive``: every 1-GPU job asks for a fixed number of shards (default 50 of 100);
* ``horus``: the job's PREDICTED util/mem go into a hint and the real ``etc/job_submit.lua``
  (through :func:`slurm_horus.slurm.policy.decide`, once per distinct hint and request) decides
  shared (type, shards) / exclusive / unchanged;
* ``oracle``: the same hook fed the TRUE util/mem.

Scheduling as Slurm does it: priority = submit time (FIFO); the main scheduler, at every event,
starts jobs in priority order and stops at the first that does not fit; EASY backfill, every
``bf_interval`` seconds (Slurm's default 30; 0: at every event), reserves the resources of that
first job at the earliest time running jobs' time limits free them, and starts later jobs of a
bounded window (``bf_window``, Slurm's ``bf_max_job_test``) that fit now and either end (by
their time limit) before that reservation or stay off the reserved GPUs.
Multi-GPU jobs take whole GPUs on one node.  Co-located jobs slow each other down
(:mod:`slurm_horus.sim.interference`); a job whose true memory does not fit next to the jobs
already on its GPU fails with OOM ``oom_delay_s`` after its start and is requeued once, on a
whole GPU (as CARMA does).  A job killed at its time limit is submitted again, once, by its
user (its lost run and the rerun count in its JCT).  Where jobs fit: :mod:`slurm_horus.sim.placement`.

The site's history (horus only, ``history_lag_s``): a job of a graph that an earlier job of the
trace ran and finished at least ``history_lag_s`` before (the sync period that refreshes
history.json) on its first-choice GPU type is predicted from those runs, as hsubmit's
history:exact does: utilization from the runs that had their GPU alone (a shared run's NVML
utilization is its share, not its need), memory from every run times the cold start's p90/mean
ratio; a job of a graph not measured there gets hsubmit's answer from the site's other graphs
(its type's site offsets and its family's pooled correction: predict.history.corrected_answer).
horus reads its tail shares over the prediction's error (``util_sigma``, placement.UTIL_SIGMA;
for a measured rerun the spread of reruns of one graph the site has measured: _rerun_sigma).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import os
import time
from collections import deque
from itertools import islice
from typing import Any, Iterable, Sequence

from slurm_horus.errors import HorusError
from slurm_horus.graph.names import family_of
from slurm_horus.predict.history import FAMILY_WEIGHT, NO_OFFSET, corrected_answer, pooled_means, site_offset
from slurm_horus.sim.cluster import SLURM_BF_INTERVAL_S, ClusterSpec
from slurm_horus.sim.interference import Interference
from slurm_horus.sim.metrics import metrics, run_slowdown
from slurm_horus.sim.placement import INF, UTIL_SIGMA, Placement, pair_limits
from slurm_horus.sim.policies import (POLICIES, HorusDecider, JobTable, Request, build_requests, check_policies,
                                      job_table)
from slurm_horus.sim.traces import SimJob

__all__ = ["HISTORY_LAG_S", "Simulator", "simulate", "run_policies"]

_FINISH, _ARRIVE, _TICK = 0, 1, 2
# seconds from a job's end to its measurement in hsubmit's history.json: horus-admin sync's period
# in etc/horus-retrain.scrontab (every 15 minutes), at its longest
HISTORY_LAG_S = 900.0
# a GPU type's site offsets and family corrections are pooled again once its measured jobs grew
# by this factor: a median over many graphs barely moves with one more, and pooling at every
# sync would cost a 100k-job run more than the rest of it
POOL_GROWTH = 1.1


class Simulator(Placement):
    """One policy on one cluster and trace.  ``run()`` returns the metrics (a dict).
    ``known_sensitivity``: a what-if, the tail budget knows each job's interference sensitivity
    (no real scheduler does; it shows what that knowledge is worth); with ``known_config_share``
    it knows only its configuration's median k (SimJob.sens_config: the most a history of the
    configuration could learn), that share of log k's variance, and the rest stays a spread.  ``util_sigma``: the
    relative error of a predicted utilization (the tail budget reads its shares over it;
    placement.UTIL_SIGMA for horus, 0 for true figures, which makes every share a point read); a
    measured rerun's is the measured spread of reruns (_rerun_sigma), or 0 with util_sigma 0."""

    # set by run() and read before it in this file (declared for the compiled build)
    jrec: list[Any]
    t_last: float
    w_end: float
    freed: bool
    last_head: int
    n_new: int
    res: tuple[float, set[int]]

    def __init__(self, cluster: ClusterSpec, jobs: Sequence[SimJob], requests: Sequence[Request | None],
                 shards_per_gpu: int = 100, *, interference: Interference | None = None,
                 bf_window: int = 100, bf_interval: float = SLURM_BF_INTERVAL_S, oom_delay_s: float = 60.0,
                 backfill: bool = True, slowdown_bound: float = 2.0, max_group: int = 4,
                 slowdown_quantile: float = 0.95, window_s: float | None = None,
                 history_lag_s: float | None = None, table: JobTable | None = None,
                 known_sensitivity: bool = False, known_config_share: float | None = None,
                 util_sigma: float = 0.0):
        if len(jobs) != len(requests):
            raise HorusError("one request per job needed")
        self.cluster, self.jobs, self.reqs = cluster, list(jobs), list(requests)
        self.S = int(shards_per_gpu)
        self.itf = interference or Interference()
        self.bf_window, self.bf_interval = int(bf_window), float(bf_interval)
        self.oom_delay = float(oom_delay_s)
        self.backfill = backfill
        self.types = cluster.gpu_types
        self.tmem = [cluster.mem_mib(t) for t in self.types]
        self.table = job_table(self.jobs, self.types, self.tmem, table)
        if slowdown_bound < 1.0 or not 1 <= max_group <= self.S:
            raise HorusError(f"--slowdown-bound must be >= 1 and --max-group in 1..{self.S} "
                             "(each job holds at least one shard)")
        self.max_group = int(max_group)
        self.umax = pair_limits(self.itf, slowdown_bound, self.max_group)
        if not 0.0 < slowdown_quantile < 1.0:
            raise HorusError("the slowdown quantile must be in (0, 1)")
        self.bound = float(slowdown_bound)
        self.risk_share = 1.0 - slowdown_quantile
        self.window_s = window_s
        if history_lag_s is not None and history_lag_s < 0:
            raise HorusError("--history-lag must be >= 0")
        self.history_lag = history_lag_s
        self.known_sensitivity = bool(known_sensitivity)
        if known_config_share is not None and not 0.0 <= known_config_share < 1.0:
            raise HorusError("the known configuration share of the sensitivity must be in [0, 1)")
        if known_config_share is not None and not self.known_sensitivity:
            # without it the tail budget reads no job's k: the share had been silently ignored
            raise HorusError("known_config_share is a what-if of known_sensitivity: give both")
        self.known_config_share = known_config_share
        if not 0.0 <= util_sigma <= 3.0:
            raise HorusError("the utilization error sigma must be in [0, 3]")
        self.util_sigma = float(util_sigma)

    # -- time accounting ---------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            self.acc_util += self.cur_util * dt
            self.acc_busy += self.cur_busy * dt
            wdt = min(now, self.w_end) - self.t_last
            if wdt > 0:
                self.w_util += self.cur_util * wdt
                self.w_busy += self.cur_busy * wdt
            self.t_last = now

    def _refresh(self, g: int, now: float, new_job: int = -1) -> None:
        """Recompute the speed of GPU g's jobs after its job set changed; re-plan their ends."""
        n, tot, t, jobs = self.ghealthy[g], self.gutil[g], self.gtype[g], self.gjobs[g]
        gspeed, jspeed = self.gspeed, self.speed
        failing, allocs, jtrue = self.failing, self.alloc, self.jtrue
        if n > 1:  # the GPU's speed (the median job's), then each job's by its sensitivity
            gspeed[g], *own = self.itf.speeds(tot, n, [1.0] + [self.jsens[j] for j in jobs])
        else:
            gspeed[g], own = 1.0, [1.0] * len(jobs)  # alone: full speed, as speed() says
        remaining, last, version, limit_end = self.remaining, self.last, self.version, self.limit_end
        events = self.events
        work = 0.0
        for j, s in zip(jobs, own):
            if failing[j]:
                continue
            alloc = allocs[j]
            if len(alloc) > 1:
                s = min(gspeed[x] for x in alloc)
            work += jtrue[j][t][0] * s
            if s == jspeed[j] and j != new_job:
                continue
            remaining[j] -= (now - last[j]) * jspeed[j]
            last[j] = now
            jspeed[j] = s
            version[j] += 1
            end = now + max(remaining[j], 0.0) / s
            if end > limit_end[j]:
                end = limit_end[j]
            self.seq += 1
            heapq.heappush(events, (end, _FINISH, self.seq, j, version[j]))
        c = min(1.0, work / 100.0)
        self.cur_util += c - self.gcontrib[g]
        self.gcontrib[g] = c

    def _push(self, t: float, kind: int, j: int, ver: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, j, ver))

    # -- job life ----------------------------------------------------------------------------

    def _start(self, j: int, alloc: list[int], now: float) -> None:
        req = self.cur_req[j]
        t = self.gtype[alloc[0]]
        u, m = self.jtrue[j][t]
        if req.share is not None and self.ns[alloc[0]]:
            self._charge_risk(j, alloc[0], req.share)
        for g in alloc:
            if not self.gjobs[g]:
                self.cur_busy += 1
            elif self.history_lag is not None:  # what a measurement of their utilization needs
                self.shared[j] = True
                for x in self.gjobs[g]:
                    self.shared[x] = True
            self._set_free(g, self.free[g] - req.shards)
            self.gjobs[g].append(j)
            self.groups[g] = None
        if req.share is not None:
            g = alloc[0]
            self.pu[g] += req.share[0]
            self.pm[g] += req.share[1]
            self.ns[g] += 1
            self._set_share(g)
            self._track_loss(g, now, joined=j)
        self.alloc[j] = alloc
        self.start[j] = now
        self.solo[j] = self.jdur[j][t]
        if self.first_start[j] < 0:
            self.first_start[j] = now
            self.n_first += 1
        self.started += 1
        if req.shards < self.S:
            self.shared_starts += 1
        gmemu, cap = self.gmemu, self.gmem_cap
        oom = False
        for g in alloc:
            if gmemu[g] + m > cap[g]:
                oom = True
                break
        if oom:
            self.failing[j] = True
            self.version[j] += 1
            # it dies oom_delay in, but Slurm (reservations, drains) knows only its time limit
            self.limit_end[j] = now + self.jobs[j].limit
            # (Slurm kills it at its limit first, when that is sooner)
            self._push(now + min(self.oom_delay, self.jobs[j].limit), _FINISH, j, self.version[j])
        else:
            self.failing[j] = False
            self.remaining[j] = self.jdur[j][t]
            self.last[j] = now
            self.speed[j] = 0.0  # forces a (re)plan in _refresh
            self.limit_end[j] = now + self.jobs[j].limit
            for g in alloc:
                self.gutil[g] += u
                self.gmemu[g] += m
                self.ghealthy[g] += 1
        bisect.insort(self.ends, (self.limit_end[j], j))
        for g in alloc:
            self._set_ff(g)
            self._refresh(g, now, new_job=j)

    def _release(self, j: int, now: float) -> None:
        alloc, req = self.alloc[j], self.cur_req[j]
        t = self.gtype[alloc[0]]
        u, m = self.jtrue[j][t]
        i = bisect.bisect_left(self.ends, (self.limit_end[j], j))
        if i < len(self.ends) and self.ends[i][1] == j:
            del self.ends[i]
        if req.share is not None:
            g = alloc[0]
            self.ns[g] -= 1
            self.pu[g] = self.pu[g] - req.share[0] if self.ns[g] else 0.0
            self.pm[g] = self.pm[g] - req.share[1] if self.ns[g] else 0.0
            self._set_share(g)
        for g in alloc:
            self.gjobs[g].remove(j)
            self.groups[g] = None
            if not self.gjobs[g]:
                self.cur_busy -= 1
            self._set_free(g, self.free[g] + req.shards)
            if not self.failing[j]:
                self.gutil[g] -= u
                self.gmemu[g] -= m
                self.ghealthy[g] -= 1
                if self.ghealthy[g] == 0:
                    self.gutil[g] = self.gmemu[g] = 0.0  # no float drift
        if req.share is not None:
            self._settle_risk(j, now, now - self.start[j])
            self._track_loss(alloc[0], now)
        for g in alloc:
            self._set_ff(g)
            self._refresh(g, now)
        self.alloc[j] = None
        self.freed = True

    def _finish(self, j: int, now: float) -> None:
        if self.failing[j] and self.oom_delay > self.jobs[j].limit:
            # Slurm killed it at its limit before it ran out of memory: a TIMEOUT, no OOM text
            # for the queue loop, no requeue (its work counted as done at speed 1 so far)
            t = self.gtype[self.alloc[j][0]]
            self.remaining[j] = max(self.jdur[j][t] - (now - self.start[j]), 0.0)
            self._killed(j, now)
            return
        if self.failing[j]:
            self.oom_failures += 1
            self._release(j, now)
            if not self.requeued[j]:
                # requeued once, on a whole GPU (as CARMA does) of any type its request allows:
                # horus-admin queue reshapes the GRES and Slurm keeps the job's type choices
                # (pinned to the type it failed on, naive's T4 OOMs had waited for a 3.4x slower T4)
                self.requeued[j] = True
                req = self.cur_req[j]
                self._set_req(j, Request(req.types, self.S, req.gpus))
                self._enqueue(j)
            else:
                self.failed[j] = True
                self.end[j] = now
            return
        self.remaining[j] -= (now - self.last[j]) * self.speed[j]
        self.last[j] = now
        killed = self.remaining[j] > 1e-6 * max(1.0, self.jobs[j].duration)
        if self.history_lag is not None and self.jobs[j].graph:
            t = self.gtype[self.alloc[j][0]]
            u, m = self.jtrue[j][t]
            self.measured.append((now + self.history_lag, j, t, None if self.shared[j] else u, m))
        if killed:
            self._killed(j, now)
            return
        self.end[j] = now
        self._release(j, now)

    def _killed(self, j: int, now: float) -> None:
        """Slurm killed job j at its time limit (TIMEOUT): its run is lost.  Its user submits it
        again, once, as it was, at the time of the kill (behind the jobs already waiting);
        killed again, it ends there, counted at the slowdown it ran at.  A kill that ended a
        job's life at the kill had made killing look cheap: the lost run and the rerun never
        showed in its JCT."""
        self.timeouts += 1
        self.timed_out[j] = True
        self.end[j] = now
        self._release(j, now)
        if not self.resubmitted[j]:
            self.resubmitted[j] = True
            self.killed_slowdown[j] = run_slowdown(now - self.start[j], self.solo[j], True, self.remaining[j])
            self.timed_out[j] = False
            self.end[j] = -1.0
            self.qkey[j] = (now, j)
            self._enqueue(j)

    def _use_history(self, j: int, now: float) -> None:
        """Job j, arriving: its prediction from the measured runs synced by now, as hsubmit's
        history predictor gives it: its graph's runs on its first-choice type (history:exact),
        else the cold start corrected by that type's site offsets and pulled towards its
        family's pooled correction (predict.history.corrected_answer)."""
        measured, hist, types = self.measured, self.hist, self.types
        while measured and measured[0][0] <= now:
            _, x, t, u, m = measured.popleft()
            job = self.jobs[x]
            rec = hist.get((job.graph, t))
            if rec is None:
                cu, cm, _ = job.pred[types[t]]
                rec = hist[job.graph, t] = [0.0, 0, 0.0, 0, cu, cm, 0.0, 0]
                self.type_graphs[t].append(rec)
                self.type_families[t].setdefault(self._family(job.model), []).append(rec)
            if u is not None:
                if u > 0.0:  # Welford on log u (mean, count): the rerun spread pooled over graphs
                    log_u, mean_before = math.log(u), rec[6]
                    rec[7] += 1
                    rec[6] += (log_u - mean_before) / rec[7]
                    if rec[7] > 1:
                        self.rerun_m2 += (log_u - mean_before) * (log_u - rec[6])
                        self.rerun_df += 1
                rec[0] += u
                rec[1] += 1
            rec[2] += m
            rec[3] += 1
            self.type_runs[t] += 1
        req = self.cur_req[j]
        job = self.jobs[j]
        if req.share is None or not job.graph:
            return
        t = req.types[0]
        u, p90, rx, lim = req.share
        cold_u, mean, cold_p90 = job.pred[types[t]]
        rec = hist.get((job.graph, t))
        if rec is not None:
            if rec[1]:
                u = rec[0] / rec[1]
                self.jsig[j] = self._rerun_sigma(rec[1])
            p90 = rec[2] / rec[3] * (cold_p90 / mean if mean > 0 else 1.0)
            self.history_hits += 1
        else:
            if self.type_runs[t] >= self.pooled_at[t] * POOL_GROWTH and self.type_runs[t] > self.pooled_at[t]:
                self._pool_site(t)
            off, families = self.pools[t]
            fam = families.get(self._family(job.model))
            if (off is None and fam is None) or mean <= 0:
                return
            a = corrected_answer(mean, cold_u, off, mean, cold_u, off or NO_OFFSET,
                                 (("family", fam, FAMILY_WEIGHT),))
            u, p90 = a.util_pct, a.mem_mib * cold_p90 / mean
            self.site_hits += 1
        self._set_req(j, Request(req.types, req.shards, req.gpus, (u, p90, rx, lim)))

    def _rerun_sigma(self, n: int) -> float:
        """The relative error of a rerun's util predicted as the mean of its graph's n measured
        runs: the spread of runs of one graph, pooled over every graph measured twice or more
        by now (what a site reads in its ledger), widened by the mean's own error; the cold
        start's until some graph has run twice.  Taken as exact (0), a rerun's tail had been
        priced as certain while runs of a graph differ (the traces' jitter)."""
        if not self.rerun_df or not self.util_sigma:
            return self.util_sigma
        return (self.rerun_m2 / self.rerun_df * (1.0 + 1.0 / n)) ** 0.5

    def _family(self, model: str) -> str:
        """A trace model's family, as hsubmit names it from the model file (graph.names)."""
        fam = self.families.get(model)
        if fam is None:
            fam = self.families[model] = family_of(model.split("/")[0])
        return fam

    def _pool_site(self, t: int) -> None:
        """GPU type t's site offsets and per-family corrections from its measured graphs, as
        horus-admin pools them into history.json (each graph counted once, by its mean
        figures; the simulated site has no users to weigh)."""
        graphs = self.type_graphs[t]
        mem: list[tuple[float, object]] = [(r[2] / r[3] - r[5], None) for r in graphs]
        util: list[tuple[float, object]] = [(r[0] / r[1] - r[4], None) for r in graphs if r[1]]
        off = site_offset(mem, util, self.type_runs[t])
        families = {}
        for fam, recs in self.type_families[t].items():
            p = pooled_means([(r[2] / r[3], r[5], r[0] / r[1] if r[1] else None, r[4]) for r in recs],
                             off or NO_OFFSET)
            if p:
                families[fam] = p
        self.pools[t] = (off, families)
        self.pooled_at[t] = self.type_runs[t]

    def _set_req(self, j: int, req: Request) -> None:
        """Job j's current request and what backfill reads of it: (memo key, shards, predicted
        util, p90 memory (None, None for a job that is not shareable), time limit).  The key: 2 x the index
        of its (types, GPUs, shareable), +1 (added by _schedule) while it must stay off the
        reserved GPUs."""
        self.cur_req[j] = req
        sh = req.share
        key = 2 * self.kid.setdefault((req.types, req.gpus, sh is None), len(self.kid))
        lim = self.jobs[j].limit
        self.jrec[j] = (key, req.shards, None, None, lim) if sh is None else (key, req.shards, sh[0], sh[1], lim)

    def _enqueue(self, j: int) -> None:
        """Priority order (submit time, then index); arrivals come in that order, so append."""
        q, qkey = self.queue, self.qkey
        if not q or qkey[j] > qkey[q[-1]]:
            q.append(j)
        else:
            q.insert(bisect.bisect_right(q, qkey[j], key=qkey.__getitem__), j)

    # -- scheduling --------------------------------------------------------------------------

    def _schedule(self, now: float, backfill_now: bool) -> None:
        self.now = now
        q = self.queue
        if not self.n_avail:
            return  # nothing free: nothing can start (flags kept for the next pass)
        if q and (self.freed or q[0] != self.last_head):
            while q:
                j = q[0]
                alloc = self._place(j, None)
                if alloc is None:
                    break
                q.popleft()
                self._start(j, alloc, now)
        if not q or not self.backfill or not backfill_now or len(q) < 2:
            self.n_new = 0 if not q else self.n_new
            if not q:
                self.last_head = -1
            return
        head = q[0]
        if self.freed or head != self.last_head:
            # something may fit now that did not before: the whole window again
            self.res = self._reservation(head, now)
            first = 1
        else:
            # only new arrivals (appended at the end) can fit: resources only shrank since
            first = max(1, len(q) - self.n_new)
        self.freed = False
        self.last_head = head
        self.n_new = 0
        if first > self.bf_window:
            return  # the window holds no job that was not looked at
        shadow, reserved = self.res
        # per memo key (_set_req): the fewest shards of a whole-GPU request that did not fit, and
        # the (util, memory) of shareable jobs that found no idle GPU and either no group with
        # room or the tail budget spent (Placement.no_room) since the last start.  Free shards
        # only shrink during the pass, and what did not fit on any GPU does not fit off the
        # reserved ones (key + 1) either.  A start can give a group more room (a larger group's
        # util limit may grow by more than the newcomer adds) and changes the budget, so it
        # clears the shareable failures.  A shareable job refused for its own tail or its cost
        # stands for no other: that depends on its time limit and its runtimes, not on its util
        # and memory alone
        nkeys = 2 * len(self.kid)
        memo = [self.S + 1] * nkeys
        fails: list[list[tuple[float, float]]] = [[] for _ in range(nkeys)]
        jrec = self.jrec
        horizon = shadow - now
        gone = 0
        # the window: queue positions first..bf_window as they were when the pass began
        window = list(islice(q, first, self.bf_window + 1))
        for pos, j in enumerate(window, first):
            key, shards, u, m, lim = jrec[j]
            if u is None and memo[key] <= shards:
                continue  # did not fit on any GPU: nor off the reserved ones
            if lim <= horizon:
                excl = None
            else:
                excl, key = reserved, key + 1
            if u is None:
                if memo[key] <= shards:
                    continue
            else:
                # a shareable job finds no room where one no larger (util and memory) found none
                smaller = False
                for fu, fm in fails[key]:
                    if u >= fu and m >= fm:
                        smaller = True
                        break
                if smaller:
                    continue
            alloc = self._place(j, excl)
            if alloc is None:
                if u is None:
                    memo[key] = shards
                    if excl is None and shards < memo[key + 1]:
                        memo[key + 1] = shards
                elif self.no_room:
                    _add_failure(fails[key], u, m)
                    if excl is None:
                        _add_failure(fails[key + 1], u, m)
                continue
            del q[pos - gone]
            gone += 1
            self.backfilled += 1
            self._start(j, alloc, now)
            if any(fails):
                fails = [[] for _ in range(nkeys)]
            if not self.n_avail:
                break

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """The simulation, with the cyclic garbage collector paused: the loop makes no reference
        cycles (each object is freed by its count), and the collector's passes over every job's
        objects, again at every few hundred events, took a tenth of a 100k-job run."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> dict[str, Any]:
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        self._setup()
        N = len(self.jobs)
        self.jsig = [self.util_sigma if r is not None and r.share is not None else 0.0 for r in self.reqs]
        self.cur_req = [None] * N
        self.jrec = [None] * N
        self.kid: dict[tuple, int] = {}
        self.alloc = [None] * N
        self.start = [-1.0] * N
        self.solo = [0.0] * N
        self.first_start = [-1.0] * N
        self.end = [-1.0] * N
        self.remaining = [0.0] * N
        self.last = [0.0] * N
        self.speed = [0.0] * N
        self.version = [0] * N
        self.limit_end = [0.0] * N
        self.failing = [False] * N
        self.requeued = [False] * N
        self.resubmitted = [False] * N  # killed at its limit once and submitted again
        self.killed_slowdown = [0.0] * N  # the slowdown of the run that was killed, if any
        self.failed = [False] * N
        self.timed_out = [False] * N
        self.shared = [False] * N  # ever on a GPU with another job
        self.measured: deque[tuple] = deque()  # (synced at, job, type, util or None, memory)
        # (graph, type): [util sum, n, memory sum, n, cold util, cold memory, mean log util, n]
        self.hist: dict[tuple[str, int], list] = {}
        T = len(self.types)
        self.type_graphs: list[list[list]] = [[] for _ in range(T)]  # the hist records per type
        self.type_families: list[dict[str, list[list]]] = [{} for _ in range(T)]  # and by family
        self.type_runs = [0] * T  # measured jobs per type
        self.pools: list[tuple] = [(None, {})] * T  # (site offsets or None, {family: pool})
        self.pooled_at = [0] * T  # type_runs when pooled last
        self.families: dict[str, str] = {}
        self.history_hits = self.site_hits = 0
        self.rerun_m2, self.rerun_df = 0.0, 0  # log-util deviations of reruns from their graph's mean
        # the wait queue: a deque, as starts take jobs from its front (and the backfill window)
        self.queue: deque[int] = deque()
        self.qkey = [(j.submit, i) for i, j in enumerate(self.jobs)]
        self.ends: list[tuple[float, int]] = []
        self.events: list[tuple] = []
        self.seq = 0
        self.oom_failures = self.timeouts = self.backfilled = 0
        self.started = self.shared_starts = 0
        self.cur_util = 0.0
        self.cur_busy = 0
        self.acc_util = self.acc_busy = self.w_util = self.w_busy = 0.0
        self.freed, self.last_head, self.n_new, self.res = False, -1, 0, (INF, set())
        rejected = 0
        unschedulable = 0
        arrivals: list[tuple] = []
        for i, job in enumerate(self.jobs):
            r = self.reqs[i]
            if r is None:
                rejected += 1
                continue
            fits = any(len(ids) >= r.gpus and self.gtype[ids[0]] in r.types for ids in self.node_gpus)
            if not fits:
                unschedulable += 1
                continue
            self._set_req(i, r)
            arrivals.append((job.submit, _ARRIVE, i, i, 0))
        self.seq = N
        # arrivals stay in their own sorted list, merged with the heap of the other events in
        # the same (time, kind, seq) order: the heap then holds only the running jobs' events
        arrivals.sort()
        n_arr, ai = len(arrivals), 0
        t0 = min((j.submit for j in self.jobs), default=0.0)
        self.t_last = t0
        # the fixed window every policy is measured over: first to last submit (the arrivals)
        last_submit = max((j.submit for j in self.jobs), default=0.0)
        self.w_end = t0 + (self.window_s if self.window_s is not None else last_submit - t0)
        next_bf, tick_pending = -INF, False  # next_bf: the earliest time of the next backfill pass
        ev, version, alloc = self.events, self.version, self.alloc
        every_event = self.bf_interval <= 0
        while ev or ai < n_arr:
            now = arrivals[ai][0] if ai < n_arr and (not ev or arrivals[ai] < ev[0]) else ev[0][0]
            self._advance(now)
            stale = True  # only superseded finish events at this time
            while True:
                if ai < n_arr and arrivals[ai][0] == now and (not ev or arrivals[ai] < ev[0]):
                    _, kind, _, j, ver = arrivals[ai]
                    ai += 1
                elif ev and ev[0][0] == now:
                    _, kind, _, j, ver = heapq.heappop(ev)
                else:
                    break
                if kind == _FINISH:
                    if ver == version[j] and alloc[j] is not None:
                        self._finish(j, now)
                        stale = False
                    continue
                stale = False
                if kind == _ARRIVE:
                    if self.history_lag is not None:
                        self._use_history(j, now)
                    self._enqueue(j)
                    self.n_new += 1
                else:
                    tick_pending = False
            if stale and every_event:
                continue  # nothing changed since the last pass: it would start nothing
            # compared with the tick's own time: now - last >= interval can round below it
            bf = every_event or now >= next_bf
            if bf:
                next_bf = now + self.bf_interval
            self._schedule(now, bf)
            if self.queue and not bf and not tick_pending and self.backfill:
                self._push(next_bf, _TICK, -1, 0)
                tick_pending = True
        out = metrics(self, t0, rejected, unschedulable, time.perf_counter() - t_wall)
        out["sim_cpu_s"] = time.process_time() - t_cpu
        return out


def _add_failure(fails: list[tuple[float, float]], u: float, m: float) -> None:
    """Record that a shareable job of (util u, memory m) found no room.  Only the minimal
    failures matter (a job no smaller than one of them finds none either), so those the new one
    is no larger than are dropped: the list stays short where a pass tries many jobs."""
    fails[:] = [f for f in fails if f[0] < u or f[1] < m]
    fails.append((u, m))


def simulate(cluster: ClusterSpec, jobs: Sequence[SimJob], policy: str, *,
             decider: HorusDecider | None = None, shards_per_gpu: int = 100, naive_shards: int = 50,
             table: JobTable | None = None, **kw) -> dict[str, Any]:
    """Run one policy; returns its metrics plus the request statistics (``decisions``).  horus
    predicts from the site's history (``history_lag_s``, default HISTORY_LAG_S; None: never);
    the oracle needs none, and the other policies read no prediction.  ``table``: the trace's
    :func:`~slurm_horus.sim.policies.job_table` on this cluster, when the caller has it."""
    types = cluster.gpu_types
    mem = [cluster.mem_mib(t) for t in types]
    if decider is not None:
        shards_per_gpu = decider.shards_per_gpu
    table = job_table(jobs, types, mem, table)
    t = time.process_time()
    reqs, stats = build_requests(jobs, policy, types, mem, shards_per_gpu,
                                 naive_shards=naive_shards, decider=decider, table=table)
    t_req = time.process_time() - t
    lag = kw.pop("history_lag_s", HISTORY_LAG_S)
    sigma = kw.pop("util_sigma", UTIL_SIGMA)
    out = Simulator(cluster, jobs, reqs, shards_per_gpu, history_lag_s=lag if policy == "horus" else None,
                    table=table, util_sigma=sigma if policy == "horus" else 0.0, **kw).run()
    out["decisions"] = stats
    out["request_cpu_s"] = t_req
    return out


def run_policies(cluster: ClusterSpec, jobs: Sequence[SimJob], policies: Iterable[str] = POLICIES, *,
                 policy_path: str | os.PathLike | None = None, hook_path: str | os.PathLike | None = None,
                 naive_shards: int = 50, table: JobTable | None = None, **kw) -> dict[str, dict[str, Any]]:
    """Every policy on the same trace: {policy: metrics}.  One hook runtime and one
    :func:`~slurm_horus.sim.policies.job_table` (``table``, built here when not given) serve all."""
    policies = list(policies)
    check_policies(policies)
    types = cluster.gpu_types
    mem = [cluster.mem_mib(t) for t in types]
    table = job_table(jobs, types, mem, table)
    with HorusDecider(types, mem, policy_path, hook_path) as decider:
        S = decider.shards_per_gpu
        if "naive" in policies and not 1 <= naive_shards <= S:
            raise HorusError(f"--naive-shards must be in 1..{S}")
        results = {}
        for p in policies:
            results[p] = simulate(cluster, jobs, p, decider=decider if p in ("horus", "oracle") else None,
                                  shards_per_gpu=S, naive_shards=naive_shards, table=table, **kw)
        return results
