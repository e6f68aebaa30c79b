"""Stage 3c: history first. A site that has measured a graph predicts it from those measurements.

The second time a site runs a network (its ONNX file's sha256) on a GPU type, the measured runs
answer better than any model: memory is close to affine in batch size, so two measured batch
sizes give a line, and one gives a point from which the cold start's non-context part is scaled
(its batch, precision and optimizer dependence carried over, its level corrected). Evidence, from
strongest to weakest, names the predictor that answered:

    history:exact    same graph, GPU type, task, optimizer, precision and other dimensions,
                     its utilization measured at the job's CPUs per GPU (power-of-two buckets)
    history:graph    same graph and GPU type, other settings (precision, optimizer, dimensions,
                     or CPUs per GPU: the nearest count's utilization moved by the learned
                     model's ratio between the two, else the base predictor's)
    history:family   other graphs of the same model family on the GPU type  } shrunk towards
    history:user     other graphs of the same user on the GPU type          } the base predictor

and otherwise the base predictor (learned model or cold start) answers, corrected by the GPU
type's site offsets: the median residual of every measured graph on that type (CUDA context,
library workspaces, allocator caching, a utilization bias), which a handful of jobs of any model
learn; utilization's, and the pools', from the runs at the job's CPUs per GPU alone (a site's
input-bound jobs at 2 had lowered a job asking for 16). The p90 of each evidence tier is its
measured leave-one-out 90th percentile where the history holds enough such residuals, each
user's weighing one user, else the base predictor's own p90 ratio; from fewer than
MIN_LOWERING_USERS users' residuals it may widen that ratio, never narrow it (raise_margins).

The history is plain JSON (`to_dict` / `from_dict`, format and checks in history_format.py),
built from the ledger by horus-admin (ledger/history_export.py) and read with the standard
library alone at submission time: no database query per job.
"""

from __future__ import annotations

import math
import os
import pwd
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from slurm_horus.predict.coldstart import ColdStartEstimator, Prediction
from slurm_horus.predict.gpus import BARE_CONTEXT_MIB, default_catalog
from slurm_horus.predict.history_format import (FORMAT, FORMAT_VERSION, MAX_LOG_RATIO, check_run,
                                                cpu_bucket, family_key, read_history)
from slurm_horus.graph.names import family_of
from slurm_horus.predict.workload import dims_key

# Weight of one tier's estimate against the base predictor's (weight 1), for n graphs of
# evidence: W * n / (n + 1). Family and user evidence is other graphs: it only pulls.
FAMILY_WEIGHT = 2.0
USER_WEIGHT = 1.0
MIN_OFFSET_JOBS = 3      # site offsets need this many measured jobs on a GPU type ...
MIN_OFFSET_GRAPHS = 2    # ... of at least this many graphs (one graph's error is not the site's)
MIN_MARGIN_ROWS = 10     # leave-one-out residuals a tier needs before its own p90 is trusted
MIN_LOWERING_USERS = 3   # distinct users a correction needs to lower figures (admin imports are none)
# Runs of one graph its leave-one-out margins come from: leaving each out compares it with all
# the others, so one user's sweep of 2000 batch sizes had cost every export 12 s (10,000 ones,
# minutes); a real graph is measured at a few dozen settings and batch sizes at most
MAX_MARGIN_RUNS = 100
NO_OFFSET = {"mem_mib": 0.0, "util_pp": 0.0, "n": 0}
# The most memory a history tier answers (3.8 TiB, past any GPU's): at the widest p90 a tier
# takes (20x, MAX_LOG_RATIO) still within the hint's largest figure, 99,999,999 MiB
MAX_ANSWER_MIB = 4_000_000.0


def _context(gpu: str | None = None) -> float:
    """The part of the cold start's memory no batch, precision or optimizer changes: what a
    CUDA process holds before its first tensor on this GPU type."""
    found = default_catalog().find(gpu) if gpu else None
    est = ColdStartEstimator()
    return est.fixed_overhead_mib(found) if found is not None else est.params.context_mib


def _scaled(y0: float, c0: float | None, cq: float | None, ctx: float,
            cold_ctx: float) -> float | None:
    """A measured peak y0 at a setting the cold start put at c0, moved to a setting it puts at
    cq: the part above the site's fixed cost ctx scaled as the cold start's part above its own
    fixed cost cold_ctx (exact where the site differs from the cold start by a fixed amount), or
    y0 scaled as the cold start's whole figure (exact where it differs in proportion), whichever
    is more: which of the two a site's offset is cannot be told from its runs, and memory short
    of the truth is an OOM.  (The cold start's figures over the site's ctx had mixed the two:
    with an offset of -300 MiB a 10 GB job was predicted at 4 GB; the fixed-amount reading alone
    put a batch 8 of a site at 0.88x the cold start 37 % short.)  A run whose part above the
    fixed cost is over MAX_LOG_RATIO's factor of its cold figure's is read in proportion alone:
    that cold figure is not the graph's (features an older release stored: a quantized graph's
    before its integer weights counted, the context and little else, had put a 1,960 MiB run at
    batch 8 at 70 GB for batch 64, or for the same batch under another optimizer)."""
    if c0 is None or cq is None or c0 <= 0 or cq <= 0:
        return None
    proportional = y0 * cq / c0
    if y0 > ctx and c0 > cold_ctx and cq > cold_ctx \
            and y0 - ctx <= math.exp(MAX_LOG_RATIO) * (c0 - cold_ctx):
        return max(ctx + (y0 - ctx) * (cq - cold_ctx) / (c0 - cold_ctx), proportional)
    return proportional


def _nearest_two(points: dict[int, float], b: int) -> tuple[int, int]:
    """The two measured batch sizes nearest to b on a log scale (smaller first on ties)."""
    order = sorted(points, key=lambda x: (abs(math.log(x / b)), x))
    return tuple(sorted(order[:2]))  # type: ignore[return-value]


def _by_batch(runs: list[dict], field: str) -> dict[int, float]:
    values = defaultdict(list)
    for r in runs:
        if r.get(field) is not None:
            values[r["bs"]].append(r[field])
    return {b: statistics.median(v) for b, v in values.items()}


def exact_estimate(runs: list[dict], b: int, cq_mem: float | None, cq_util: float | None,
                   ctx: float, cold_ctx: float) -> tuple[float, float | None] | None:
    """Memory and utilization at batch b from runs of the very same setting: the measurement
    itself, else a line through the two nearest batch sizes (memory; utilization on log batch
    between measured ones), else one point moved by the cold start (_scaled; ctx and cold_ctx:
    the site's and the cold start's fixed cost).  Beyond the measured batch sizes, the nearest
    one moved by the cold start bounds the line from below: two noisy runs (the larger batch
    measured lower) had drawn it flat, and 16x their batch was given their memory."""
    mem, util = _by_batch(runs, "mem"), _by_batch(runs, "util")
    if not mem:
        return None

    def cold_at(b0: int) -> float | None:
        return statistics.median([r["cold_mem"] for r in runs if r["bs"] == b0
                                  and r.get("cold_mem")] or [0]) or None
    if b in mem:
        m = mem[b]
    elif len(mem) >= 2:
        b0, b1 = _nearest_two(mem, b)
        slope = max((mem[b1] - mem[b0]) / (b1 - b0), 0.0)
        nb = min(mem, key=lambda x: abs(math.log(x / b)))
        m = max(mem[b0] + slope * (b - b0), min(mem[nb], ctx))
        if not min(mem) < b < max(mem):
            m = max(m, _scaled(mem[nb], cold_at(nb), cq_mem, ctx, cold_ctx) or 0.0)
    else:
        (b0, y0), = mem.items()
        m = _scaled(y0, cold_at(b0), cq_mem, ctx, cold_ctx)
    if m is None or not m > 0:  # extrapolated below zero (a site offset beyond the context)
        return None
    return m, _util_at(runs, util, b, cq_util)


def _util_at(runs, util: dict[int, float], b: int, cq_util: float | None) -> float | None:
    if not util:
        return None
    if b in util:
        return util[b]
    lo, hi = [x for x in util if x < b], [x for x in util if x > b]
    if lo and hi:  # between two measured batch sizes: linear in log batch
        b0, b1 = max(lo), min(hi)
        t = math.log(b / b0) / math.log(b1 / b0)
        return util[b0] + t * (util[b1] - util[b0])
    near = max(lo) if lo else min(hi)
    cold = [r["cold_util"] for r in runs if r["bs"] == near and r.get("cold_util") is not None]
    shift = (cq_util - statistics.median(cold)) if cold and cq_util is not None else 0.0
    return min(max(util[near] + shift, 0.0), 100.0)


def _graph_summary(runs: list[dict], off: dict) -> tuple[float | None, float | None]:
    """One graph's (median log of measured over offset-corrected cold-start memory, median
    utilization shift from the offset-corrected cold start): its error beyond the site's."""
    ratios = [_log_ratio(r["mem"], c) for r in runs
              if r.get("cold_mem") and (c := _shifted(r["cold_mem"], off)) > 0]
    shifts = [r["util"] - r["cold_util"] - off["util_pp"] for r in runs
              if r.get("util") is not None and r.get("cold_util") is not None]
    return (statistics.median(ratios) if ratios else None,
            statistics.median(shifts) if shifts else None)


def _log_ratio(mem: float, cold_mem: float) -> float:
    """log(measured / cold-start memory), within +-MAX_LOG_RATIO."""
    return max(min(math.log(mem / cold_mem), MAX_LOG_RATIO), -MAX_LOG_RATIO)


def _pool(summaries: list[tuple[float | None, float | None]], users: list) -> dict | None:
    """Per-graph summaries pooled: median of the graphs, each graph counted once and each
    user's graphs weighing one user (_user_weights)."""
    ratios = [(r, u) for (r, _), u in zip(summaries, users) if r is not None]
    shifts = [(s, u) for (_, s), u in zip(summaries, users) if s is not None]
    if not ratios:
        return None
    return {"mem_log_ratio": weighted_median(*_by_user(ratios)),
            "util_shift": weighted_median(*_by_user(shifts)) if shifts else None,
            "n": len(ratios)}


def pooled_correction(graphs: list[list[dict]], owners: list, off: dict) -> dict | None:
    """Other graphs' runs (one list per graph, ``owners`` the user each counts for) pooled into
    one correction of the cold start corrected by the site offsets ``off``: a family's or a
    user's (the simulator's horus pools its families with it too)."""
    return _pool([_graph_summary(rs, off) for rs in graphs], owners)


def pooled_means(graphs: list[tuple[float, float, float | None, float]], off: dict) -> dict | None:
    """:func:`pooled_correction` of graphs known each by one run's figures, (memory, cold-start
    memory, util or None, cold-start util), and no user's: the simulator's horus, which pools
    each graph by its mean figures, without a run dict per graph (a 100k-job run pools often)."""
    off_util = off["util_pp"]
    return _pool([(_log_ratio(mem, c) if cold_mem and (c := _shifted(cold_mem, off)) > 0 else None,
                   None if util is None or cold_util is None else util - cold_util - off_util)
                  for mem, cold_mem, util, cold_util in graphs], [None] * len(graphs))


def _owner(users) -> object:
    """The user a graph's runs count for in pooled medians (_user_weights): the one who ran
    it most, the earliest of them on a tie."""
    return Counter(users).most_common(1)[0][0]


def _by_user(pairs: list[tuple[float, object]]) -> tuple[list[float], list[float]]:
    """(values, weights) of (value, user) pairs, weights from _user_weights."""
    return [v for v, _ in pairs], _user_weights([u for _, u in pairs])


def _user_weights(users: list) -> list[float]:
    """Each user's graphs share one unit of weight in a pooled median: a user who runs many
    graphs (or names many files after one family) counts as one user of the site, not as
    many (one user's runs had set every user's site offset)."""
    counts = Counter(users)
    return [1.0 / counts[u] for u in users]


def _raise_only_unless_many(correction: dict, owners: list, keys: tuple[str, ...]) -> dict:
    """A site offset or pooled correction whose graphs come from fewer than
    MIN_LOWERING_USERS users may raise the figures it corrects, never lower them: every user
    weighs one in the medians, so two or three users' runs (a graph run starved, inference
    submitted as training) had set a lower prediction, and tighter packing, for everyone.
    Runs the admin imported (no user: calibration measurements) are trusted to lower alone."""
    if _lowering_users(owners):
        return correction
    return {**correction, **{k: max(correction[k], 0.0) for k in keys if correction.get(k) is not None}}


def _lowering_users(owners: list) -> bool:
    """Whether figures from these owners' runs may lower what they correct: at least
    MIN_LOWERING_USERS distinct users, or the admin's imports (no user) alone."""
    return (len({o for o in owners if o is not None}) >= MIN_LOWERING_USERS
            or all(o is None for o in owners))


def _raise_only_flagged(pool: dict, owners: list, keys: tuple[str, ...]) -> dict:
    """A pooled correction under _raise_only_unless_many, flagged raise_only where its owners
    may not lower: then it may not pull a base above the cold start down either
    (corrected_answer)."""
    pool = _raise_only_unless_many(pool, owners, keys)
    return pool if _lowering_users(owners) else {**pool, "raise_only": True}


def _run_bucket(r: dict) -> str | None:
    """The CPUs-per-GPU bucket a run was measured at, None where unknown."""
    return cpu_bucket(r["cpus_per_gpu"]) if r.get("cpus_per_gpu") else None


def _util_offsets_by_cpus(graphs: dict[str, list[tuple]]) -> dict[str, float]:
    """A site's utilization offset per CPUs-per-GPU bucket, each from the runs measured at it
    alone, as site_offset takes them (_site_median; each graph owned by
    who ran it most there, raise-only unless enough users did): utilization depends on the CPUs
    feeding the GPU, which the cold start does not model, and a site whose jobs ran input-bound
    at 2 CPUs per GPU had lowered a job asking for 16 by as much. ``graphs``: (memory,
    utilization, bucket, user) residuals per graph; runs of unknown CPUs count in the offset
    for jobs of unknown CPUs alone."""
    out = {}
    for k in sorted({k for v in graphs.values() for _, _, k, _ in v if k}, key=float):
        at = {g: rs for g, v in graphs.items() if (rs := [(u, o) for _, u, b, o in v
                                                          if b == k and u is not None])}
        util = [(statistics.median(u for u, _ in rs), _owner(o for _, o in rs)) for rs in at.values()]
        shift = _site_median(util, sum(map(len, at.values())))
        if shift is not None:
            out[k] = _raise_only_unless_many({"util_pp": shift}, [o for _, o in util], ("util_pp",))["util_pp"]
    return out


def _pooled_util_by_cpus(graphs: list[list[dict]], off: dict) -> dict[str, dict]:
    """A pool's utilization shift per CPUs-per-GPU bucket: its graphs' runs at that bucket
    alone against the cold start moved by the site's offset there (_offset_at), with their own
    count of graphs, owners (who ran each most there) and raise-only rule (a family run
    input-bound at 2 CPUs per GPU had pulled a job asking for 16 towards its utilization)."""
    out = {}
    for k in sorted({b for rs in graphs for r in rs if (b := _run_bucket(r))}, key=float):
        at = _offset_at(off, k)
        shifts = [(s, _owner(r.get("user") for r in there)) for rs in graphs
                  if (s := _graph_summary(there := [r for r in rs if _run_bucket(r) == k], at)[1])
                  is not None]
        if shifts:
            out[k] = _raise_only_flagged({"util_shift": weighted_median(*_by_user(shifts)),
                                          "n": len(shifts)}, [o for _, o in shifts], ("util_shift",))
    return out


def _offset_at(off: dict | None, cpus: str | None) -> dict | None:
    """A site offset as it applies at CPUs-per-GPU bucket ``cpus``: its utilization the offset
    measured there; where too few runs were (_util_offsets_by_cpus), the all-runs offset if it
    raises the answer, else none (runs fed by fewer CPUs lower it; a site's positive offset
    from runs of unknown CPUs was dropped for every job at a bucket one run had opened); as it
    is for unknown CPUs, and from a file that keeps no offset per bucket (older)."""
    if not off or cpus is None or "util_cpus" not in off:
        return off
    return {**off, "util_pp": off["util_cpus"].get(cpus, max(0.0, off["util_pp"]))}


def _pool_at(p: dict | None, cpus: str | None) -> dict | None:
    """A pooled correction as it applies at CPUs-per-GPU bucket ``cpus``: its utilization pull
    that bucket's graphs' (util_at_cpus, corrected_answer), none where none ran there; as it is
    for unknown CPUs, and from a file that keeps no pool per bucket."""
    if not p or cpus is None or "util_cpus" not in p:
        return p
    return {**p, "util_at_cpus": p["util_cpus"].get(cpus, {"util_shift": None, "n": 1})}


def _user_quantile(pairs: list[tuple[float, object]], q: float) -> float:
    """The q-quantile of (value, user) pairs, each user's values sharing one unit of weight
    (_user_weights): :func:`weighted_quantile`."""
    return weighted_quantile(*_by_user(pairs), q)


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """The q-quantile of ``values`` under ``weights``, linear between values placed at their
    weights' midpoints (the first at 0, the last at 1); with equal weights, linear between
    order statistics as numpy's default."""
    pairs = sorted(zip(values, weights))
    if len(pairs) == 1:
        return pairs[0][0]
    span = sum(w for _, w in pairs) - (pairs[0][1] + pairs[-1][1]) / 2.0
    target, cum = q * span, 0.0
    for (v0, w0), (v1, w1) in zip(pairs, pairs[1:]):
        step = (w0 + w1) / 2.0
        if cum + step >= target:
            return v0 + (target - cum) / step * (v1 - v0) if step > 0 else v1
        cum += step
    return pairs[-1][0]


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The median of ``values`` under ``weights`` (with equal weights, statistics.median)."""
    pairs = sorted(zip(values, weights))
    half = sum(weights) / 2.0
    cum = 0.0
    for i, (v, w) in enumerate(pairs):
        cum += w
        if math.isclose(cum, half, rel_tol=1e-9) and i + 1 < len(pairs):
            return (v + pairs[i + 1][0]) / 2.0
        if cum > half:
            return v
    return pairs[-1][0]


@dataclass
class Answer:
    mem_mib: float
    util_pct: float
    tier: str | None  # None: the base predictor answered (with site offsets where known)


class HistoryPredictor:
    """Measured runs first, then the base predictor corrected by site offsets.

    fit(runs) takes run dicts: sha, gpu (catalog name), bs, task, opt, prec, dims (see
    dims_key), mem (MiB), util (% or None), cold_mem / cold_util (the cold start at that
    setting, or None), family, user, cpus_per_gpu (None: unknown; each setting's entry keeps
    its utilization per CPUs-per-GPU bucket too, util_cpus), and optionally base_mem /
    base_util / base (another base predictor's figures, e.g. "learned:v0003", for its own
    offsets). predict() follows the estimator interface (report, gpu, workload) -> Prediction.
    """

    def __init__(self, base=None, user: str | None = None):
        self.base = base
        self.user = user
        self.graphs: dict[str, list[dict]] = {}
        self.families: dict[str, dict[str, dict]] = {}
        self.users: dict[str, dict[str, dict]] = {}
        self.offsets: dict[str, dict[str, dict]] = {}
        self.margins: dict[str, float] = {}
        self.raise_margins: dict[str, float] = {}  # margins that may only raise the base's p90
        self.family_salt: str | None = None  # families named by history_format.family_key
        self.created = ""

    # --- fitting (admin side) ------------------------------------------------------------

    def fit(self, runs: list[dict]) -> "HistoryPredictor":
        runs = [check_run(r, "run") for r in runs]
        self.graphs = self._aggregate(runs)
        self.offsets = self._offsets(runs)
        self.families = self._pooled(runs, "family")
        self.users = self._pooled(runs, "user")
        self.margins, self.raise_margins = self._margins()
        self.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return self

    @staticmethod
    def _aggregate(runs: list[dict]) -> dict[str, list[dict]]:
        """Repeated runs of one setting and batch size become one run (medians, n counted).
        Memory and utilization: the highest of each user's median, so that runs one user claims
        for a graph (its file is anyone's to name) can raise, never lower, another's figures."""
        groups = defaultdict(list)
        for r in runs:
            if r.get("sha"):
                groups[(r["sha"], r["gpu"], r["task"], r["opt"], r["prec"], r["dims"],
                        r["bs"])].append(r)
        graphs = defaultdict(list)
        for (sha, gpu, task, opt, prec, dims, bs), rs in sorted(groups.items()):
            def med(field, rs=rs):
                vals = [r[field] for r in rs if r.get(field) is not None]
                return statistics.median(vals) if vals else None

            def highest_user_median(field, rs=rs):
                by_user = defaultdict(list)
                for r in rs:
                    by_user[r.get("user")].append(r)
                vals = [v for v in (med(field, u) for u in by_user.values()) if v is not None]
                return max(vals) if vals else None

            by_cpus = defaultdict(list)  # utilization depends on the CPUs feeding the GPU
            for r in rs:
                if r.get("cpus_per_gpu"):
                    by_cpus[cpu_bucket(r["cpus_per_gpu"])].append(r)
            util_cpus = {k: u for k in sorted(by_cpus, key=float)
                         if (u := highest_user_median("util", by_cpus[k])) is not None}
            graphs[sha].append({
                "gpu": gpu, "bs": bs, "task": task, "opt": opt, "prec": prec, "dims": dims,
                "mem": highest_user_median("mem"), "util": highest_user_median("util"),
                **({"util_cpus": util_cpus} if util_cpus else {}),
                "cold_mem": med("cold_mem"),
                "cold_util": med("cold_util"), "n": len(rs),
                "family": Counter(r.get("family") for r in rs).most_common(1)[0][0],
                "user": Counter(r.get("user") for r in rs).most_common(1)[0][0],
                "users": len({r.get("user") for r in rs})})
        return dict(graphs)

    def cold_offset(self, gpu: str) -> dict:
        """The GPU type's site offsets against the cold start (zero where unknown)."""
        return self.offsets.get(gpu, {}).get("cold-start", NO_OFFSET)

    def contexts(self, gpu: str) -> tuple[float, float]:
        """The fixed memory cost on a GPU type: the site's (the cold start's context + the
        site's offset) and the cold start's own."""
        cold = _context(gpu)
        site = cold + self.cold_offset(gpu)["mem_mib"]
        # an offset past the whole context: both at zero (the site's clamped, the cold start's
        # kept, had mixed shifted and raw figures again)
        return (site, cold) if site > 0.0 else (0.0, cold - site)

    def _pooled(self, runs: list[dict], key: str) -> dict[str, dict[str, dict]]:
        """Per GPU type and family (or user): the pooled correction of its graphs."""
        by = defaultdict(lambda: defaultdict(list))
        for r in runs:
            if r.get(key) and r.get("sha"):
                by[(r["gpu"], r[key])][r["sha"]].append(r)
        out: dict[str, dict[str, dict]] = defaultdict(dict)
        for (gpu, name), graphs in sorted(by.items()):
            off = self.cold_offset(gpu)
            owners = [_owner(r.get("user") for r in rs) for rs in graphs.values()]
            pooled = pooled_correction(list(graphs.values()), owners, off)
            if pooled:
                out[gpu][name] = _raise_only_flagged(pooled, owners, ("mem_log_ratio", "util_shift"))
                if any(_run_bucket(r) for rs in graphs.values() for r in rs):
                    out[gpu][name]["util_cpus"] = _pooled_util_by_cpus(list(graphs.values()), off)
        return dict(out)

    @staticmethod
    def _offsets(runs: list[dict]) -> dict[str, dict[str, dict]]:
        """Per GPU type and base predictor: median residual (measured - predicted) of memory
        and utilization, each graph's median counted once."""
        by = defaultdict(lambda: defaultdict(list))
        users = defaultdict(list)
        for i, r in enumerate(runs):
            graph = r.get("sha") or f"#{i}"
            users[graph].append(r.get("user"))
            at = (_run_bucket(r), r.get("user"))
            if r.get("cold_mem"):
                by[(r["gpu"], "cold-start")][graph].append(
                    (r["mem"] - r["cold_mem"], None if r.get("util") is None
                     or r.get("cold_util") is None else r["util"] - r["cold_util"], *at))
            if r.get("base") and r.get("base_mem"):
                by[(r["gpu"], r["base"])][graph].append(
                    (r["mem"] - r["base_mem"], None if r.get("util") is None
                     or r.get("base_util") is None else r["util"] - r["base_util"], *at))
        owner = {g: _owner(u) for g, u in users.items()}
        out: dict[str, dict[str, dict]] = defaultdict(dict)
        for (gpu, base), graphs in sorted(by.items()):
            mem = [(statistics.median(m for m, *_ in v), owner[g]) for g, v in graphs.items()]
            util = [(statistics.median(us), owner[g]) for g, v in graphs.items()
                    if (us := [u for _, u, *_ in v if u is not None])]
            off = site_offset(mem, util, sum(len(v) for v in graphs.values()))
            if off:
                out[gpu][base] = _raise_only_unless_many(off, [owner[g] for g in graphs], ("mem_mib", "util_pp"))
                if any(k for v in graphs.values() for _, _, k, _ in v):
                    out[gpu][base]["util_cpus"] = _util_offsets_by_cpus(graphs)
        return dict(out)

    def _margins(self) -> tuple[dict[str, float], dict[str, float]]:
        """Leave-one-out 90th percentile of log(measured / estimated) memory per tier, where
        at least MIN_MARGIN_ROWS runs could be left out (of each graph's MAX_MARGIN_RUNS most
        run settings): (margins, raise_margins).  Each run left out is estimated as estimate()
        answers its user, from that user's own runs of the graph on its GPU type where there
        are any, else from the others'.  Each user's residuals weigh one user in the quantile
        (_user_weights; admin imports, no user, one between them): one user's 30 graphs of
        memory exactly linear in batch size had taken the exact tier's margin from +18 % to
        +2 %, everyone's p90.  A margin from fewer than MIN_LOWERING_USERS users' residuals (or
        admin imports alone) goes to raise_margins: it may raise the base predictor's p90
        ratio, never lower it (see predict).  A residual of one user's run estimated from
        another's (or from a setting several users ran: its figure is the highest of theirs)
        is either's to set: such residuals may raise a margin, never lower it."""
        clean: dict[str, list[tuple[float, object]]] = defaultdict(list)
        mixed: dict[str, list[tuple[float, object]]] = defaultdict(list)
        for runs in self.graphs.values():
            runs = _most_run(runs, MAX_MARGIN_RUNS)
            for r in runs:
                user, ctx = r.get("user"), self.contexts(r["gpu"])
                rest = [o for o in runs if o is not r and o["gpu"] == r["gpu"]]
                rest = [o for o in rest if o.get("user") == user] or rest
                same = [o for o in rest if _same_setting(o, r) and o["bs"] != r["bs"]]
                other = [o for o in rest if not _same_setting(o, r)]
                for tier, used, est in (
                        ("exact", same, same and exact_estimate(
                            same, r["bs"], r.get("cold_mem"), r.get("cold_util"), *ctx)),
                        ("graph", other, _graph_estimate(
                            other, r["task"], r.get("cold_mem"), r.get("cold_util"), *ctx))):
                    if est:
                        own = all(o.get("users", 1) == 1 and o.get("user") in (user, None)
                                  for o in (r, *used))
                        (clean if own else mixed)[tier].append((math.log(r["mem"] / est[0]), user))
        margins, raise_margins = {}, {}
        for tier in sorted(set(clean) | set(mixed)):
            every = clean[tier] + mixed[tier]
            if len(every) < MIN_MARGIN_ROWS:
                continue
            q, trusted = _user_quantile(every, 0.9), False
            if len(clean[tier]) >= MIN_MARGIN_ROWS:
                q = max(q, _user_quantile(clean[tier], 0.9))
                trusted = _lowering_users([u for _, u in clean[tier]])
            (margins if trusted else raise_margins)[tier] = float(q)
        return margins, raise_margins

    # --- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "created": self.created,
                "context_mib": _context(), "graphs": self.graphs, "families": self.families,
                "users": self.users, "offsets": self.offsets, "margins": self.margins,
                "raise_margins": self.raise_margins,
                **({"family_salt": self.family_salt} if self.family_salt is not None else {})}

    @classmethod
    def from_dict(cls, d, base=None, user: str | None = None,
                  source: str = "history") -> "HistoryPredictor":
        """A history file's content, refused whole unless every field is what fit() writes."""
        h = cls(base=base, user=user)
        for key, value in read_history(d, source).items():
            setattr(h, key, value)
        return h

    # --- predicting ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return getattr(self.base, "name", "cold-start")

    def estimate(self, sha: str, gpu: str, workload, dims: str, cold_mem: float | None,
                 cold_util: float | None, family: str | None, user: str | None,
                 base_mem: float, base_util: float, base_name: str, util_at=None) -> Answer:
        """The answer for one job from primitives (the benchmark's entry point too).
        ``util_at``: the base predictor's utilization for this job at a given CPUs per GPU,
        None where it has no answer that depends on them (see _util_elsewhere)."""
        runs = [r for r in self.graphs.get(sha, ()) if r["gpu"] == gpu]
        own = [r for r in runs if user and r.get("user") == user]
        runs = own or runs  # a user's own runs of a graph answer for them: no one else's can
        setting = {"task": workload.task, "opt": workload.optimizer,
                   "prec": workload.precision, "dims": dims}
        same = [r for r in runs if _same_setting(r, setting)]
        ctx = self.contexts(gpu)
        cpus = cpu_bucket(workload.cpus_per_gpu) if workload.cpus_per_gpu else None
        used, tier = same, "exact"
        est = _within_hint(exact_estimate(_at_cpus(same, cpus), workload.batch_size, cold_mem,
                                          cold_util, *ctx) if same else None)
        if est is not None and est[1] is None and _elsewhere(same, cpus):
            # the setting measured alone at other CPUs per GPU only: memory is the same, its
            # utilization is not this job's (the next tier's evidence, named so)
            tier = "graph"
            est = (est[0], _util_elsewhere(same, cpus, workload, cold_util, util_at))
        if est is None:
            used, tier = [r for r in runs if not _same_setting(r, setting)], "graph"
            est = _within_hint(_graph_estimate(_at_cpus(used, cpus), workload.task, cold_mem,
                                               cold_util, *ctx))
        # the site's utilization offsets and pools as measured at the job's CPUs per GPU
        off = _offset_at(self.offsets.get(gpu, {}).get(base_name), cpus)
        cold_off = _offset_at(self.cold_offset(gpu), cpus)
        if family and self.family_salt is not None:
            family = family_key(self.family_salt, family)
        pools = (("family", _pool_at(self.families.get(gpu, {}).get(family), cpus) if family else None,
                  FAMILY_WEIGHT),
                 ("user", _pool_at(self.users.get(gpu, {}).get(user), cpus) if user else None,
                  USER_WEIGHT))
        def corrected(pools) -> Answer:
            return _within_reach(corrected_answer(base_mem, base_util, off, cold_mem, cold_util,
                                                  cold_off, pools), base_mem, base_util)

        if est is None:
            return _floored(corrected(pools))
        mem, util = est
        if util is None:  # no run measured it alone: the base's, corrected as where no run answers
            # (but by no pool where the runs were at other CPUs: the pools hold those very runs)
            util = corrected(() if _elsewhere(used, cpus) else pools).util_pct
        if not own and any(r.get("users", 1) == 1 and r.get("user") is not None for r in used):
            # a setting one other user alone ran (not an admin's import) may raise a newcomer's
            # figures, never lower them below what they would be without its runs: the base
            # predictor's, with the site's offsets, with the pools (the family's may hold those
            # very runs, so it lowers nothing here); a graph file is anyone's to name, and its
            # sole runner could have run it starved to get the next user's job packed tight
            bare, pooled = corrected(()), corrected(pools)
            floor_mem = max(base_mem, bare.mem_mib, pooled.mem_mib)
            floor_util = max(base_util, bare.util_pct, pooled.util_pct)
            if mem <= floor_mem and util <= floor_util:
                # the runs raised nothing: the base predictor answers, and is named (the answer
                # had been labelled history while it carried the cold start's figures)
                return Answer(floor_mem, floor_util, None)
            mem, util = max(mem, floor_mem), max(util, floor_util)
        return _floored(Answer(mem, util, tier))

    def predict(self, report, gpu, workload) -> Prediction:
        base = self.base or ColdStartEstimator()
        if hasattr(base, "predict_with_cold"):
            b, c = base.predict_with_cold(report, gpu, workload)
        else:
            b = c = base.predict(report, gpu, workload)

        def util_at(cpus_per_gpu: float) -> float | None:
            """The learned model's utilization at other CPUs per GPU (None where it does not
            answer there, or never learned that they matter)."""
            if not _learned_cpus(base):
                return None
            o = base.predict_with_cold(report, gpu, replace(workload, cpus_per_gpu=cpus_per_gpu))[0]
            return o.util_pct if o.predictor == base.name else None

        a = self.estimate(report.sha256, gpu.name, workload,
                          dims_key(report.given_dims, workload.batch_size), c.mem_mib,
                          c.util_pct, family_of(report.model) if report.model else None,
                          current_user() if self.user is None else self.user,
                          b.mem_mib, b.util_pct, b.predictor, util_at)
        base_p90 = b.mem_mib_p90 / b.mem_mib if b.mem_mib > 0 else 1.0
        if a.tier is None:
            # (exp(log(x)) need not be x: no offset is no correction)
            corrected = not (math.isclose(a.mem_mib, b.mem_mib, rel_tol=1e-9)
                             and math.isclose(a.util_pct, b.util_pct, rel_tol=1e-9, abs_tol=1e-9))
            # the base's own figures stay beside the corrected ones: its calibration (quantiles
            # of the measured against the base's figure) bounds the measurement, not the offset
            return Prediction(gpu=b.gpu, util_pct=a.util_pct, mem_mib=a.mem_mib,
                              mem_mib_p90=a.mem_mib * base_p90, predictor=b.predictor,
                              confidence=b.confidence + (" + site offsets" if corrected else ""),
                              breakdown={**b.breakdown, "base_mem_mib": b.mem_mib,
                                         "base_util_pct": b.util_pct} if corrected else b.breakdown)
        q, raise_q = self.margins.get(a.tier), self.raise_margins.get(a.tier)
        if q is not None:
            ratio = math.exp(max(q, 0.0))
        else:  # too few users' residuals to lower the base's ratio (or too few at all)
            ratio = max(base_p90, math.exp(raise_q)) if raise_q is not None else base_p90
        p90 = a.mem_mib * ratio
        return Prediction(gpu=b.gpu, util_pct=min(max(a.util_pct, 0.0), 100.0),
                          mem_mib=a.mem_mib, mem_mib_p90=max(p90, a.mem_mib),
                          predictor=f"history:{a.tier}", confidence=f"history ({a.tier})",
                          breakdown=b.breakdown)


def _within_hint(est: tuple[float, float | None] | None) -> tuple[float, float | None] | None:
    """A tier's estimate, None (the next predictor answers) where its memory is past what the
    hint can carry with the widest p90 margin a tier takes: one run's forged or mistyped
    figures had put a 8.5e13 MiB answer in the hint, which hsubmit then dropped whole, with
    every other GPU type's sane figures."""
    return None if est is not None and est[0] > MAX_ANSWER_MIB else est


def _within_reach(a: Answer, base_mem: float, base_util: float) -> Answer:
    """A corrected answer, or the base predictor's own where the site's offsets and pools took
    its memory past MAX_ANSWER_MIB (as a tier past it does not answer, _within_hint): an offset
    of 16 TiB and a family pool at 20x, both within the history format, had put 124 million MiB
    in one GPU type's prediction, and hsubmit, which no hint can carry that in, dropped the
    hint of every type."""
    if a.mem_mib <= MAX_ANSWER_MIB or a.mem_mib <= base_mem:  # NaN is neither
        return a
    return Answer(base_mem, base_util, None)


def _floored(a: Answer) -> Answer:
    """A history tier's answer at least a bare CUDA context, below which no real job peaks (a
    run of 0.001 MiB, which the history format takes, gave a 0 MiB history:exact hint); the
    base predictor's (tier None) as is."""
    return Answer(max(a.mem_mib, BARE_CONTEXT_MIB), a.util_pct, a.tier) if a.tier else a


def _most_run(runs: list[dict], k: int) -> list[dict]:
    """The ``k`` runs of the most jobs (the earlier on a tie), in their order: the settings a
    site runs most, which its predictions meet most; all of them where there are no more."""
    if len(runs) <= k:
        return runs
    keep = set(sorted(range(len(runs)), key=lambda i: -runs[i].get("n", 1))[:k])
    return [r for i, r in enumerate(runs) if i in keep]


def _at_cpus(runs: list[dict], cpus: str | None) -> list[dict]:
    """The runs with the utilization each measured at CPUs-per-GPU bucket ``cpus`` (None where
    only others were measured); runs of unknown CPUs (a file from before they were kept), and
    every run for a job of unknown CPUs, keep the one they have."""
    if cpus is None:
        return runs
    return [{**r, "util": r["util_cpus"].get(cpus)} if r.get("util_cpus") else r for r in runs]


def _elsewhere(runs: list[dict], cpus: str | None) -> bool:
    """Whether ``runs`` hold utilization measured at CPUs per GPU (so, where none answers at
    the job's bucket ``cpus``, they were measured at other counts)."""
    return cpus is not None and any(r.get("util_cpus") for r in runs)


def _util_elsewhere(runs: list[dict], cpus: str, workload, cold_util: float | None,
                    util_at) -> float | None:
    """A setting's utilization at CPUs-per-GPU bucket ``cpus`` from its runs at other CPU
    counts: the nearest count's (log scale), times the learned model's ratio between the
    job's CPUs and those; None (the base predictor answers) without such a ratio: the cold
    start, and a learned model that never learned CPUs, answer alike at every count."""
    measured = {k for r in runs for k in r.get("util_cpus", ())}
    # (logs apart, not of the quotient: 2**-1074 / 8 is 0, and log(0) had raised in hsubmit)
    near = min(measured, key=lambda k: (abs(math.log2(float(k)) - math.log2(float(cpus))), float(k)))
    there = _at_cpus(runs, near)
    util = _util_at(there, _by_batch(there, "util"), workload.batch_size, cold_util)
    here, then = (util_at(workload.cpus_per_gpu), util_at(float(near))) if util_at else (None, None)
    if util is None or here is None or not then:
        return None
    return min(max(util * here / then, 0.0), 100.0)


def _learned_cpus(base) -> bool:
    """Whether ``base`` is a learned model whose utilization trees split on CPUs per GPU (one
    trained where every job had the same CPUs, like the cold start, gives no ratio)."""
    trees = getattr(getattr(base, "model", None), "util", None)
    if trees is None or not hasattr(base, "predict_with_cold"):
        return False
    from slurm_horus.predict.learned import input_names  # (it imports this module)

    return input_names().index("cpus_per_gpu") in trees.flat.feature[~trees.flat.leaf]


def _same_setting(r: dict, s: dict) -> bool:
    return all(r[k] == s[k] for k in ("task", "opt", "prec", "dims"))


def _graph_estimate(runs: list[dict], task: str, cq_mem: float | None, cq_util: float | None,
                    ctx: float, cold_ctx: float) -> tuple[float, float | None] | None:
    """The same graph at other settings: each run moved by the cold start, the median taken;
    runs of the same task first (training and inference keep very different memory)."""
    if not runs or not cq_mem:
        return None
    runs = [r for r in runs if r["task"] == task] or runs
    mems = [m for r in runs
            if (m := _scaled(r["mem"], r.get("cold_mem"), cq_mem, ctx, cold_ctx)) is not None]
    if not mems:
        return None
    utils = [r["util"] + cq_util - r["cold_util"] for r in runs
             if cq_util is not None and r.get("util") is not None
             and r.get("cold_util") is not None]
    util = min(max(statistics.median(utils), 0.0), 100.0) if utils else None
    mem = statistics.median(mems)
    return (mem, util) if mem > 0 else None


def site_offset(mem: list[tuple[float, object]], util: list[tuple[float, object]],
                jobs: int) -> dict | None:
    """A GPU type's site offsets against one base predictor from its measured graphs' median
    residuals, (value, owner) pairs of memory and of utilization, over ``jobs`` jobs; None
    while too few jobs or graphs (one graph's error is not the site's)."""
    mem_mib = _site_median(mem, jobs)
    if mem_mib is None:
        return None
    return {"mem_mib": mem_mib, "util_pp": _shrunk_median(*_by_user(util)), "n": len(mem)}


def _site_median(pairs: list[tuple[float, object]], jobs: int) -> float | None:
    """The site's figure from its graphs' median residuals ((value, owner) pairs, one per
    graph, over ``jobs`` jobs): their shrunk median, each user weighing one; None while too few
    jobs or graphs (one graph's error is not the site's)."""
    if jobs < MIN_OFFSET_JOBS or len(pairs) < MIN_OFFSET_GRAPHS:
        return None
    return _shrunk_median(*_by_user(pairs))


def corrected_answer(base_mem: float, base_util: float, off: dict | None, cold_mem: float | None,
                     cold_util: float | None, cold_off: dict, pools) -> Answer:
    """The answer where no run of the graph itself answers: the base predictor's figures moved
    by the GPU type's site offsets against it (``off``), then pulled, in log memory and in
    utilization, towards each pooled correction of other graphs (``pools``: (tier, pool or
    None, strength), e.g. the family's) applied to the offset-corrected cold start, its
    utilization by its graphs at the job's CPUs per GPU where _pool_at gave them; tier: the
    first pool that pulled, None for the base alone (the simulator's horus uses it too)."""
    if off:
        base_mem = _shifted(base_mem, off)
        base_util = min(max(base_util + off["util_pp"], 0.0), 100.0)
    log_mem, util, weight, tier = math.log(base_mem), base_util, 1.0, None
    w_util = 1.0
    for kind, p, strength in pools:
        if not p or not cold_mem:
            continue
        w = strength * p["n"] / (p["n"] + 1)
        mem_to = math.log(_shifted(cold_mem, cold_off)) + p["mem_log_ratio"]
        if p.get("raise_only"):
            # from few users' graphs (_pooled): it may raise what it pulls, never lower it (its
            # figures, clamped at the cold start's, had pulled a learned model above them down)
            mem_to = max(mem_to, log_mem / weight)
        log_mem += w * mem_to
        weight += w
        u = p.get("util_at_cpus", p)  # (its graphs' at the job's CPUs per GPU: _pool_at)
        if u["util_shift"] is not None and cold_util is not None:
            w = strength * u["n"] / (u["n"] + 1)
            util_to = min(max(cold_util + cold_off["util_pp"] + u["util_shift"], 0.0), 100.0)
            util += w * (max(util_to, util / w_util) if u.get("raise_only") else util_to)
            w_util += w
        tier = tier or kind
    return Answer(math.exp(log_mem / weight), util / w_util, tier)


def _shifted(mem: float, off: dict) -> float:
    """A predicted peak moved by a site's memory offset (never below half of itself)."""
    return max(mem + off["mem_mib"], 0.5 * mem)


def _shrunk_median(values: list[float], weights: list[float]) -> float:
    """The (weighted) median of per-graph residuals, shrunk towards 0 by its own uncertainty:
    a fixed site cost shows in every graph alike and is kept whole; scattered residuals (the
    predictor's own errors, differing per model) mostly cancel (James-Stein on the median,
    its standard error from the MAD and the weights' effective count)."""
    if len(values) < 2:
        return 0.0
    med = weighted_median(values, weights)
    mad = 1.4826 * weighted_median([abs(v - med) for v in values], weights)
    n_eff = sum(weights) ** 2 / sum(w * w for w in weights)
    se = 1.2533 * mad / math.sqrt(n_eff)
    return med * max(0.0, 1.0 - (se / med) ** 2) if med else 0.0


def current_user() -> str | None:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None
