"""Stage 3c: history first. A site that has measured a graph predicts it from those measurements.

The second time a site runs a network (its ONNX file's sha256) on a GPU type, the measured runs
answer better than any model: memory is close to affine in batch size, so two measured batch
sizes give a line, and one gives a point from which the cold start's non-context part is scaled
(its batch, precision and optimizer dependence carried over, its level corrected). Evidence, from
strongest to weakest, names the predictor that answered:

    history:exact    same graph, GPU type, task, optimizer, precision and other dimensions
    history:graph    same graph and GPU type, other settings (precision, optimizer, dimensions)
    history:family   other graphs of the same model family on the GPU type  } shrunk towards
    history:user     other graphs of the same user on the GPU type          } the base predictor

and otherwise the base predictor (learned model or cold start) answers, corrected by the GPU
type's site offsets: the median residual of every measured graph on that type (CUDA context,
library workspaces, allocator caching, a utilization bias), which a handful of jobs of any model
learn. The p90 of each evidence tier is its measured leave-one-out 90th percentile where the
history holds enough such residuals, else the base predictor's own p90 ratio.

The history is plain JSON (`to_dict` / `from_dict`, written by `Registry.save_history`), read
with the standard library alone at submission time: no database query per job.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from slurm_horus.predict.coldstart import ColdStartEstimator, OPTIMIZERS, PRECISIONS, TASKS, Prediction
from slurm_horus.errors import HorusError

FORMAT = "slurm-horus-history"
FORMAT_VERSION = 1
TIERS = ("exact", "graph", "family", "user")
# Weight of one tier's estimate against the base predictor's (weight 1), for n graphs of
# evidence: W * n / (n + 1). Family and user evidence is other graphs: it only pulls.
FAMILY_WEIGHT = 2.0
USER_WEIGHT = 1.0
MIN_OFFSET_JOBS = 3      # site offsets need this many measured jobs on a GPU type ...
MIN_OFFSET_GRAPHS = 2    # ... of at least this many graphs (one graph's error is not the site's)
MIN_MARGIN_ROWS = 10     # leave-one-out residuals a tier needs before its own p90 is trusted
MAX_MIB = 2.0**24        # 16 TiB: anything above is not a measurement
MAX_LOG_RATIO = math.log(20.0)
NO_OFFSET = {"mem_mib": 0.0, "util_pp": 0.0, "n": 0}


def dims_key(dims: dict | None, batch: int) -> str:
    """The non-batch dimensions a run was bound with, as a stable key (sequence length...).
    A dimension equal to the batch size is taken for the batch dimension."""
    items = sorted((str(k), int(v)) for k, v in (dims or {}).items() if int(v) != batch)
    return ",".join(f"{k}={v}" for k, v in items)


def _context(gpu: str | None = None) -> float:
    """The part of the cold start's memory no batch, precision or optimizer changes: what a
    CUDA process holds before its first tensor on this GPU type."""
    from slurm_horus.predict.gpus import default_catalog

    found = default_catalog().find(gpu) if gpu else None
    est = ColdStartEstimator()
    return est.fixed_overhead_mib(found) if found is not None else est.params.context_mib


def _scaled(y0: float, c0: float | None, cq: float | None, ctx: float) -> float | None:
    """A measured peak y0 at a setting the cold start put at c0, moved to a setting it puts at
    cq: the part above the site's fixed cost ctx scaled by the cold start's ratio."""
    if c0 is None or cq is None or c0 <= 0 or cq <= 0:
        return None
    if y0 > ctx and c0 > ctx and cq > ctx:
        return ctx + (y0 - ctx) * (cq - ctx) / (c0 - ctx)
    return y0 * cq / c0


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
                   ctx: float) -> tuple[float, float | None] | None:
    """Memory and utilization at batch b from runs of the very same setting: the measurement
    itself, else a line through the two nearest batch sizes (memory; utilization on log batch
    between measured ones), else one point moved by the cold start."""
    mem, util = _by_batch(runs, "mem"), _by_batch(runs, "util")
    if not mem:
        return None
    if b in mem:
        m = mem[b]
    elif len(mem) >= 2:
        b0, b1 = _nearest_two(mem, b)
        slope = max((mem[b1] - mem[b0]) / (b1 - b0), 0.0)
        near = mem[min(mem, key=lambda x: abs(math.log(x / b)))]
        m = max(mem[b0] + slope * (b - b0), min(near, ctx))
    else:
        (b0, y0), = mem.items()
        c0 = statistics.median([r["cold_mem"] for r in runs if r["bs"] == b0
                                and r.get("cold_mem")] or [0]) or None
        m = _scaled(y0, c0, cq_mem, ctx)
        if m is None:
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
    ratios = [max(min(math.log(r["mem"] / c), MAX_LOG_RATIO), -MAX_LOG_RATIO) for r in runs
              if r.get("cold_mem") and (c := _shifted(r["cold_mem"], off)) > 0]
    shifts = [r["util"] - r["cold_util"] - off["util_pp"] for r in runs
              if r.get("util") is not None and r.get("cold_util") is not None]
    return (statistics.median(ratios) if ratios else None,
            statistics.median(shifts) if shifts else None)


def _pool(summaries: list[tuple[float | None, float | None]]) -> dict | None:
    """Per-graph summaries pooled: median of the graphs, each graph counted once."""
    ratios = [r for r, _ in summaries if r is not None]
    shifts = [s for _, s in summaries if s is not None]
    if not ratios:
        return None
    return {"mem_log_ratio": statistics.median(ratios),
            "util_shift": statistics.median(shifts) if shifts else None, "n": len(ratios)}


@dataclass
class Answer:
    mem_mib: float
    util_pct: float
    tier: str | None  # None: the base predictor answered (with site offsets where known)


class HistoryPredictor:
    """Measured runs first, then the base predictor corrected by site offsets.

    fit(runs) takes run dicts: sha, gpu (catalog name), bs, task, opt, prec, dims (see
    dims_key), mem (MiB), util (% or None), cold_mem / cold_util (the cold start at that
    setting, or None), family, user, and optionally base_mem / base_util / base (another base
    predictor's figures, e.g. "learned:v0003", for its own offsets). predict() follows the
    estimator interface (report, gpu, workload) -> Prediction.
    """

    def __init__(self, base=None, user: str | None = None):
        self.base = base
        self.user = user
        self.graphs: dict[str, list[dict]] = {}
        self.families: dict[str, dict[str, dict]] = {}
        self.users: dict[str, dict[str, dict]] = {}
        self.offsets: dict[str, dict[str, dict]] = {}
        self.margins: dict[str, float] = {}
        self.created = ""

    # --- fitting (admin side) ------------------------------------------------------------

    def fit(self, runs: list[dict]) -> "HistoryPredictor":
        runs = [_check_run(r, "run") for r in runs]
        self.graphs = self._aggregate(runs)
        self.offsets = self._offsets(runs)
        self.families = self._pooled(runs, "family")
        self.users = self._pooled(runs, "user")
        self.margins = self._margins()
        self.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return self

    @staticmethod
    def _aggregate(runs: list[dict]) -> dict[str, list[dict]]:
        """Repeated runs of one setting and batch size become one run (medians, n counted)."""
        groups = defaultdict(list)
        for r in runs:
            if r.get("sha"):
                groups[(r["sha"], r["gpu"], r["task"], r["opt"], r["prec"], r["dims"],
                        r["bs"])].append(r)
        graphs = defaultdict(list)
        for (sha, gpu, task, opt, prec, dims, bs), rs in sorted(groups.items()):
            def med(field):
                vals = [r[field] for r in rs if r.get(field) is not None]
                return statistics.median(vals) if vals else None

            graphs[sha].append({
                "gpu": gpu, "bs": bs, "task": task, "opt": opt, "prec": prec, "dims": dims,
                "mem": med("mem"), "util": med("util"), "cold_mem": med("cold_mem"),
                "cold_util": med("cold_util"), "n": len(rs),
                "family": Counter(r.get("family") for r in rs).most_common(1)[0][0],
                "user": Counter(r.get("user") for r in rs).most_common(1)[0][0]})
        return dict(graphs)

    def cold_offset(self, gpu: str) -> dict:
        """The GPU type's site offsets against the cold start (zero where unknown)."""
        return self.offsets.get(gpu, {}).get("cold-start", NO_OFFSET)

    def context(self, gpu: str) -> float:
        """The site's fixed memory cost on a GPU type: the cold start's context + offset."""
        return max(_context(gpu) + self.cold_offset(gpu)["mem_mib"], 0.0)

    def _pooled(self, runs: list[dict], key: str) -> dict[str, dict[str, dict]]:
        """Per GPU type and family (or user): the pooled correction of its graphs."""
        by = defaultdict(lambda: defaultdict(list))
        for r in runs:
            if r.get(key) and r.get("sha"):
                by[(r["gpu"], r[key])][r["sha"]].append(r)
        out: dict[str, dict[str, dict]] = defaultdict(dict)
        for (gpu, name), graphs in sorted(by.items()):
            off = self.cold_offset(gpu)
            pooled = _pool([_graph_summary(rs, off) for rs in graphs.values()])
            if pooled:
                out[gpu][name] = pooled
        return dict(out)

    @staticmethod
    def _offsets(runs: list[dict]) -> dict[str, dict[str, dict]]:
        """Per GPU type and base predictor: median residual (measured - predicted) of memory
        and utilization, each graph's median counted once."""
        by = defaultdict(lambda: defaultdict(list))
        for i, r in enumerate(runs):
            graph = r.get("sha") or f"#{i}"
            if r.get("cold_mem"):
                by[(r["gpu"], "cold-start")][graph].append(
                    (r["mem"] - r["cold_mem"], None if r.get("util") is None
                     or r.get("cold_util") is None else r["util"] - r["cold_util"]))
            if r.get("base") and r.get("base_mem"):
                by[(r["gpu"], r["base"])][graph].append(
                    (r["mem"] - r["base_mem"], None if r.get("util") is None
                     or r.get("base_util") is None else r["util"] - r["base_util"]))
        out: dict[str, dict[str, dict]] = defaultdict(dict)
        for (gpu, base), graphs in sorted(by.items()):
            jobs = sum(len(v) for v in graphs.values())
            if jobs < MIN_OFFSET_JOBS or len(graphs) < MIN_OFFSET_GRAPHS:
                continue
            mem = [statistics.median(m for m, _ in v) for v in graphs.values()]
            util = [statistics.median(us) for v in graphs.values()
                    if (us := [u for _, u in v if u is not None])]
            out[gpu][base] = {"mem_mib": _shrunk_median(mem), "util_pp": _shrunk_median(util),
                              "n": len(graphs)}
        return dict(out)

    def _margins(self) -> dict[str, float]:
        """Leave-one-out 90th percentile of log(measured / estimated) memory per tier, where
        at least MIN_MARGIN_ROWS runs could be left out."""
        resid: dict[str, list[float]] = defaultdict(list)
        for sha, runs in self.graphs.items():
            for r in runs:
                rest = [o for o in runs if o is not r]
                same = [o for o in rest if _same_setting(o, r) and o["bs"] != r["bs"]]
                if same:
                    est = exact_estimate(same, r["bs"], r.get("cold_mem"), r.get("cold_util"),
                                         self.context(r["gpu"]))
                    if est:
                        resid["exact"].append(math.log(r["mem"] / est[0]))
                other = [o for o in rest if o["gpu"] == r["gpu"] and not _same_setting(o, r)]
                est = _graph_estimate(other, r["task"], r.get("cold_mem"), r.get("cold_util"),
                                      self.context(r["gpu"]))
                if est:
                    resid["graph"].append(math.log(r["mem"] / est[0]))
        return {t: float(_quantile(v, 0.9)) for t, v in resid.items()
                if len(v) >= MIN_MARGIN_ROWS}

    # --- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "created": self.created,
                "context_mib": _context(), "graphs": self.graphs, "families": self.families,
                "users": self.users, "offsets": self.offsets, "margins": self.margins}

    @classmethod
    def from_dict(cls, d, base=None, user: str | None = None,
                  source: str = "history") -> "HistoryPredictor":
        """A history file's content, refused whole unless every field is what fit() writes."""
        try:
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise HorusError("not a slurm-horus history file")
            if d.get("format_version") != FORMAT_VERSION:
                raise HorusError(f"history format version {d.get('format_version')!r} is not "
                                 f"supported (expected {FORMAT_VERSION})")
            h = cls(base=base, user=user)
            h.created = str(d.get("created", ""))
            h.graphs = {_sha(k): [_check_run(dict(r, sha=k), "run", stored=True)
                                  for r in _list(v)] for k, v in _dict(d["graphs"]).items()}
            for r in (r for v in h.graphs.values() for r in v):
                r.pop("sha")
            h.families = _pools(d["families"])
            h.users = _pools(d["users"])
            h.offsets = {_name(g): {_name(b): _offset(o) for b, o in _dict(v).items()}
                         for g, v in _dict(d["offsets"]).items()}
            h.margins = {t: _number(v, -MAX_LOG_RATIO, MAX_LOG_RATIO, f"margin {t}")
                         for t, v in _dict(d["margins"]).items() if t in TIERS}
        except HorusError as e:
            raise HorusError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise HorusError(f"{source}: corrupt history file ({type(e).__name__}: {e})") from None
        return h

    # --- predicting ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return getattr(self.base, "name", "cold-start")

    def estimate(self, sha: str, gpu: str, workload, dims: str, cold_mem: float | None,
                 cold_util: float | None, family: str | None, user: str | None,
                 base_mem: float, base_util: float, base_name: str) -> Answer:
        """The answer for one job from primitives (the benchmark's entry point too)."""
        runs = [r for r in self.graphs.get(sha, ()) if r["gpu"] == gpu]
        setting = {"task": workload.task, "opt": workload.optimizer,
                   "prec": workload.precision, "dims": dims}
        same = [r for r in runs if _same_setting(r, setting)]
        ctx = self.context(gpu)
        est = (exact_estimate(same, workload.batch_size, cold_mem, cold_util, ctx)
               if same else None)
        tier = "exact"
        if est is None:
            est = _graph_estimate([r for r in runs if not _same_setting(r, setting)],
                                  workload.task, cold_mem, cold_util, ctx)
            tier = "graph"
        if est is not None:
            mem, util = est
            return Answer(mem, base_util if util is None else util, tier)
        off = self.offsets.get(gpu, {}).get(base_name)
        if off:
            base_mem = _shifted(base_mem, off)
            base_util = min(max(base_util + off["util_pp"], 0.0), 100.0)
        cold_off = self.cold_offset(gpu)
        log_mem, util, weight, tier = math.log(base_mem), base_util, 1.0, None
        w_util = 1.0
        for kind, pools, key, strength in (("family", self.families, family, FAMILY_WEIGHT),
                                           ("user", self.users, user, USER_WEIGHT)):
            p = pools.get(gpu, {}).get(key) if key else None
            if not p or not cold_mem:
                continue
            w = strength * p["n"] / (p["n"] + 1)
            log_mem += w * (math.log(_shifted(cold_mem, cold_off)) + p["mem_log_ratio"])
            weight += w
            if p["util_shift"] is not None and cold_util is not None:
                util += w * min(max(cold_util + cold_off["util_pp"] + p["util_shift"], 0.0),
                                100.0)
                w_util += w
            tier = tier or kind
        return Answer(math.exp(log_mem / weight), util / w_util, tier)

    def predict(self, report, gpu, workload) -> Prediction:
        from slurm_horus.predict.coldstart import ColdStartEstimator

        base = self.base or ColdStartEstimator()
        if hasattr(base, "predict_with_cold"):
            b, c = base.predict_with_cold(report, gpu, workload)
        else:
            b = c = base.predict(report, gpu, workload)
        a = self.estimate(report.sha256, gpu.name, workload,
                          dims_key(report.bound_dims, workload.batch_size), c.mem_mib,
                          c.util_pct, _family(report.model), self.user or _current_user(),
                          b.mem_mib, b.util_pct, b.predictor)
        base_p90 = b.mem_mib_p90 / b.mem_mib if b.mem_mib > 0 else 1.0
        if a.tier is None:
            corrected = a.mem_mib != b.mem_mib or a.util_pct != b.util_pct
            return Prediction(gpu=b.gpu, util_pct=a.util_pct, mem_mib=a.mem_mib,
                              mem_mib_p90=a.mem_mib * base_p90, predictor=b.predictor,
                              confidence=b.confidence + (" + site offsets" if corrected else ""),
                              breakdown=b.breakdown)
        q = self.margins.get(a.tier)
        p90 = a.mem_mib * (math.exp(max(q, 0.0)) if q is not None else base_p90)
        return Prediction(gpu=b.gpu, util_pct=min(max(a.util_pct, 0.0), 100.0),
                          mem_mib=a.mem_mib, mem_mib_p90=max(p90, a.mem_mib),
                          predictor=f"history:{a.tier}", confidence=f"history ({a.tier})",
                          breakdown=b.breakdown)


def _same_setting(r: dict, s: dict) -> bool:
    return all(r[k] == s[k] for k in ("task", "opt", "prec", "dims"))


def _graph_estimate(runs: list[dict], task: str, cq_mem: float | None,
                    cq_util: float | None, ctx: float) -> tuple[float, float | None] | None:
    """The same graph at other settings: each run moved by the cold start, the median taken;
    runs of the same task first (training and inference keep very different memory)."""
    if not runs or not cq_mem:
        return None
    runs = [r for r in runs if r["task"] == task] or runs
    mems = [m for r in runs
            if (m := _scaled(r["mem"], r.get("cold_mem"), cq_mem, ctx)) is not None]
    if not mems:
        return None
    utils = [r["util"] + cq_util - r["cold_util"] for r in runs
             if cq_util is not None and r.get("util") is not None
             and r.get("cold_util") is not None]
    util = min(max(statistics.median(utils), 0.0), 100.0) if utils else None
    return statistics.median(mems), util


def _shifted(mem: float, off: dict) -> float:
    """A predicted peak moved by a site's memory offset (never below half of itself)."""
    return max(mem + off["mem_mib"], 0.5 * mem)


def _shrunk_median(values: list[float]) -> float:
    """The median of per-graph residuals, shrunk towards 0 by its own uncertainty: a fixed
    site cost shows in every graph alike and is kept whole; scattered residuals (the
    predictor's own errors, differing per model) mostly cancel (James-Stein on the median,
    its standard error from the MAD)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    mad = 1.4826 * statistics.median(abs(v - med) for v in values)
    se = 1.2533 * mad / math.sqrt(len(values))
    return med * max(0.0, 1.0 - (se / med) ** 2) if med else 0.0


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def _family(model_path: str) -> str | None:
    from slurm_horus.ledger import family_of

    return family_of(model_path) if model_path else None


def _current_user() -> str | None:
    import os
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


# --- validation of a stored history ------------------------------------------------------

def _dict(v) -> dict:
    if not isinstance(v, dict):
        raise HorusError("malformed history file (object expected)")
    return v


def _list(v) -> list:
    if not isinstance(v, list):
        raise HorusError("malformed history file (list expected)")
    return v


def _name(v) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= 128:
        raise HorusError(f"malformed history file (bad name {str(v)[:40]!r})")
    return v


def _sha(v) -> str:
    if not (isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)):
        raise HorusError(f"malformed history file (bad sha256 {str(v)[:70]!r})")
    return v


def _number(v, lo: float, hi: float, what: str) -> float:
    if type(v) not in (int, float) or not (lo <= v <= hi):  # NaN fails both comparisons
        raise HorusError(f"malformed history file ({what} {v!r} outside {lo:g}..{hi:g})")
    return float(v)


def _optional(v, lo, hi, what):
    return None if v is None else _number(v, lo, hi, what)


def _check_run(r, what: str, stored: bool = False) -> dict:
    """A run with every field checked (types, ranges, known workload values)."""
    r = dict(_dict(r))
    if not isinstance(r.get("bs"), int) or not 1 <= r["bs"] <= 2**31:
        raise HorusError(f"malformed history file ({what}: batch size {r.get('bs')!r})")
    for k, allowed in (("task", TASKS), ("opt", OPTIMIZERS), ("prec", PRECISIONS)):
        if r.get(k) not in allowed:
            raise HorusError(f"malformed history file ({what}: {k} {r.get(k)!r})")
    r["gpu"] = _name(r.get("gpu"))
    if not isinstance(r.get("dims", ""), str) or len(r.get("dims", "")) > 512:
        raise HorusError(f"malformed history file ({what}: dims)")
    r["dims"] = r.get("dims", "")
    r["mem"] = _number(r.get("mem"), 1e-3, MAX_MIB, "memory")
    r["util"] = _optional(r.get("util"), 0.0, 100.0, "utilization")
    r["cold_mem"] = _optional(r.get("cold_mem"), 1e-3, MAX_MIB, "cold-start memory")
    r["cold_util"] = _optional(r.get("cold_util"), 0.0, 100.0, "cold-start utilization")
    for k in ("family", "user"):
        if r.get(k) is not None:
            r[k] = _name(r[k])
    if stored:
        if not isinstance(r.get("n", 1), int) or r.get("n", 1) < 1:
            raise HorusError(f"malformed history file ({what}: n)")
    elif r.get("sha") is not None:
        r["sha"] = _sha(r["sha"])
    return r


def _pools(d) -> dict[str, dict[str, dict]]:
    out = {}
    for gpu, v in _dict(d).items():
        out[_name(gpu)] = {}
        for name, p in _dict(v).items():
            p = _dict(p)
            if not isinstance(p.get("n"), int) or p["n"] < 1:
                raise HorusError("malformed history file (pool count)")
            out[gpu][_name(name)] = {
                "mem_log_ratio": _number(p["mem_log_ratio"], -MAX_LOG_RATIO, MAX_LOG_RATIO,
                                         "memory ratio"),
                "util_shift": _optional(p.get("util_shift"), -100.0, 100.0, "utilization shift"),
                "n": p["n"]}
    return out


def _offset(o) -> dict:
    o = _dict(o)
    if not isinstance(o.get("n"), int) or o["n"] < 1:
        raise HorusError("malformed history file (offset count)")
    return {"mem_mib": _number(o["mem_mib"], -MAX_MIB, MAX_MIB, "memory offset"),
            "util_pp": _number(o["util_pp"], -100.0, 100.0, "utilization offset"), "n": o["n"]}


# --- from the ledger ----------------------------------------------------------------------

def ledger_runs(ledger, learned=None) -> list[dict]:
    """The ledger's measured jobs as history runs (see HistoryPredictor.fit). With a learned
    estimator, each run with features also carries its prediction (for that model's offsets)."""
    from sqlalchemy import and_, func, select

    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION
    from slurm_horus.predict.gpus import default_catalog
    from slurm_horus.ledger import tables

    t = tables()
    s, j = t["submissions"], t["jobs"]
    stmt = (select(s.c.model_sha256, s.c.model_path, s.c.model_family, s.c.user_name,
                   s.c.features, s.c.feature_version, s.c.workload, s.c.predictions,
                   j.c.gpu_type, j.c.act_util_pct, j.c.act_mem_mib)
            .join(j, and_(j.c.cluster == s.c.cluster, j.c.job_id == s.c.job_id))
            .where(j.c.act_mem_mib > 0, j.c.gpu_type.isnot(None),
                   func.coalesce(j.c.failed_measurement, 0) == 0))
    catalog = default_catalog()
    gpus: dict = {}
    shas: dict = {}
    runs, inputs = [], []
    with ledger.engine.connect() as conn:
        for sha, path, family, user, feats, fv, wl, preds, gtype, util, mem in conn.execute(stmt):
            try:
                if gtype not in gpus:
                    gpus[gtype] = catalog.find(gtype)
                gpu = gpus[gtype]
                w = json.loads(wl) if wl else {}
                if gpu is None or mem is None or not 0 < float(mem) <= MAX_MIB:
                    continue
                run = {"sha": sha or _file_sha(path, shas), "gpu": gpu.name,
                       "bs": int(w.get("batch_size") or 1), "task": w.get("task") or "train",
                       "opt": w.get("optimizer") or "adam", "prec": w.get("precision") or "fp32",
                       "mem": float(mem),
                       "util": None if util is None else min(max(float(util), 0.0), 100.0),
                       "family": family or None, "user": user or None}
                run["dims"] = dims_key(w.get("dims"), run["bs"])
                p = (json.loads(preds) if preds else {}) or {}
                c = (p.get(gtype) or p.get(gpu.name) or {}).get("cold") or {}
                values = json.loads(feats) if feats and (fv is None or int(fv) == FEATURE_VERSION) \
                    else None
                if values is not None and any(n not in values for n in FEATURE_NAMES):
                    values = None
                run["cold_mem"] = float(c["mem_mib"]) if c.get("mem_mib") else None
                run["cold_util"] = float(c["util_pct"]) if c.get("util_pct") is not None else None
                if run["cold_mem"] is None and values is not None:
                    run["cold_mem"] = _cold_memory(values, gpu, w)
                runs.append(_check_run(run, "ledger row"))
                if learned is not None and values is not None:
                    inputs.append((len(runs) - 1, values, gpu, w, c))
            except (ValueError, TypeError, KeyError, HorusError):
                continue  # an unusable row teaches nothing; retrain counts them
    if learned is not None and inputs:
        _add_learned(runs, inputs, learned)
    return runs


def _file_sha(path: str | None, cache: dict) -> str | None:
    """sha256 of a model file the admin can read (rows imported before shas were recorded)."""
    import hashlib

    if not path:
        return None
    if path not in cache:
        try:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            cache[path] = h.hexdigest()
        except OSError:
            cache[path] = None
    return cache[path]


def _workload(w: dict):
    from slurm_horus.predict.coldstart import Workload

    return Workload(batch_size=int(w.get("batch_size") or 1), task=w.get("task") or "train",
                    optimizer=w.get("optimizer") or "adam",
                    precision=w.get("precision") or "fp32")


def _values_report(values: dict):
    from slurm_horus.graph.features import FeatureReport

    return FeatureReport(model="", sha256="", values=values, nodes=[], by_op={},
                         unknown_ops=[], unknown_dims=[], bound_dims={})


def _cold_memory(values: dict, gpu, w: dict) -> float:
    from slurm_horus.predict.coldstart import ColdStartEstimator

    return ColdStartEstimator().memory_mib(_values_report(values), gpu, _workload(w))[0]


def _add_learned(runs: list[dict], inputs: list, learned) -> None:
    """The learned model's predictions for the runs it is familiar with, in one batch."""
    import numpy as np

    from slurm_horus.predict.coldstart import ColdStartEstimator
    from slurm_horus.predict.learned import input_row, out_of_bounds

    cold_est = ColdStartEstimator()
    rows, idx, cold = [], [], []
    for i, values, gpu, w, c in inputs:
        wl = _workload(w)
        if c.get("mem_mib") and c.get("util_pct") is not None:
            cp = Prediction(gpu=gpu.name, util_pct=float(c["util_pct"]),
                            mem_mib=float(c["mem_mib"]), mem_mib_p90=float(c["mem_mib"]),
                            predictor="cold-start",
                            breakdown={"gpu_ms_per_step": float(c.get("gpu_ms_per_step") or 0),
                                       "host_ms_per_step": float(c.get("host_ms_per_step") or 0)})
        else:
            cp = cold_est.predict(_values_report(values), gpu, wl)
        row = input_row(values, gpu, wl, cp)
        if learned.model.familiar(row):
            rows.append(row)
            idx.append(i)
            cold.append(cp.mem_mib)
    if not rows:
        return
    X = np.asarray(rows, float)
    mem_log, util_log = learned.model.mem.predict(X), learned.model.util.predict(X)
    for k, i in enumerate(idx):
        if out_of_bounds([util_log[k]], [mem_log[k]]):
            continue
        runs[i].update(base=learned.name, base_mem=cold[k] * math.exp(mem_log[k]),
                       base_util=min(max(math.expm1(util_log[k]), 0.0), 100.0))


def build_history(ledger, learned=None) -> dict:
    """The ledger's measurements as a history (plain JSON-able dict, see HistoryPredictor)."""
    return HistoryPredictor().fit(ledger_runs(ledger, learned)).to_dict()


def export_history(ledger, registry) -> dict:
    """Build the history from the ledger and store it in the registry (history.json), with
    offsets for the serving learned model when one loads. Returns a short summary."""
    from slurm_horus.predict.learned import LearnedEstimator

    learned = None
    version = registry.serving()
    if version:
        try:
            learned = LearnedEstimator(registry.load(version), version)
        except HorusError:
            learned = None  # offsets against the cold start still serve
    history = build_history(ledger, learned)
    registry.save_history(history)
    return {"graphs": len(history["graphs"]),
            "runs": sum(len(v) for v in history["graphs"].values()),
            "gpu_types_with_offsets": sorted(history["offsets"]),
            "path": str(registry.root / "history.json")}
