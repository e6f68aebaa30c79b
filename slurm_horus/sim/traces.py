"""Generated job traces for the cluster simulator (Philly-, Helios-, PAI- and LLM-like).

A trace is a list of :class:`SimJob`.  Each job carries, per GPU type of the simulated cluster,
the PREDICTED utilization/memory (what ``hsubmit`` would write in the hint) and the TRUE ones
(what the job really uses; the simulator's interference and OOM model run on these).

Each generated job runs a model of the trace's mix (:mod:`slurm_horus.sim.mix`): its prediction
is the cold start's for that model, its true memory the prediction times a residual the cold start
showed on that model (biased where the predictor is), its true utilization the prediction times a
residual the cold start showed on held-out MLP runs.  Those residuals belong to the GRAPH (the
cold start is wrong the same way every time it sees one graph): each graph of the trace draws its
own, and each job adds only a small jitter (input pipeline, data).  A share of jobs run a graph
the site ran before (``repeat_share``: a user's next run, a sweep), which the site's history can
then predict from measurements.  Traces of a site's own jobs: :mod:`slurm_horus.sim.replay`.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.sim.interference import SENSITIVITY_SIGMA
from slurm_horus.sim.mix import ModelMix, runtime_factor

__all__ = ["SimJob", "TraceSpec", "TRACES", "REPEAT_SHARE", "generate_trace", "graph_residuals",
           "lognormal_params", "time_limit", "truth"]

MAX_DURATION_S = 2 * 86400.0   # generated runtimes are truncated here (a usual partition MaxTime)
MIN_DURATION_S = 30.0
# The share of jobs that run a graph the site ran before (same model file, batch and task): an
# ASSUMPTION (no trace in shared/notes counts repeated graphs); 0 makes every job a new graph.
REPEAT_SHARE = 0.5
# jobs live in memory while simulated (a million took 2.5 GB with one policy; ten million ran
# out of memory): a bound on what is asked
MAX_TRACE_JOBS = 2_000_000
# loads beyond these say nothing (1e-300 gave a makespan of 1e305 s)
MIN_LOAD, MAX_LOAD = 0.001, 1000.0


@dataclass
class SimJob:
    """One job of a trace.  Times in seconds; util in percent; memory in MiB.

    duration: run time alone on a GPU (the solo work).  limit: the Slurm time limit (the job is
    killed when it runs longer, e.g. because interference slowed it down).
    pred: {gpu_type: (util_pct, mem_mib, mem_p90_mib)} as the hint would carry it.
    true: {gpu_type: (util_pct, mem_mib)} what the job really uses (per GPU it holds).
    graph: the model file the job runs (its history key); "" for a job the history cannot know.
    """

    id: int
    submit: float
    duration: float
    gpus: int
    limit: float
    model: str
    pred: dict[str, tuple[float, float, float]]
    true: dict[str, tuple[float, float]]
    runtime_x: dict[str, float] = field(default_factory=dict)  # runtime factor per type (default 1)
    sens: float = 1.0  # interference sensitivity (1 = the pair curve's median)
    graph: str = ""
    sens_config: float = 1.0  # its configuration's median sensitivity: what a history could know

    def __post_init__(self) -> None:
        """Plain Python numbers: a trace built with numpy's had run in float32 where its values
        were (k, a utilization), and the compiled simulator (setup.py) refuses an np.int64."""
        self.gpus = operator.index(self.gpus)
        self.submit, self.duration, self.limit = float(self.submit), float(self.duration), float(self.limit)
        self.sens, self.sens_config = float(self.sens), float(self.sens_config)
        self.pred = {t: (float(u), float(m), float(p)) for t, (u, m, p) in self.pred.items()}
        self.true = {t: (float(u), float(m)) for t, (u, m) in self.true.items()}
        self.runtime_x = {t: float(x) for t, x in self.runtime_x.items()}


@dataclass(frozen=True)
class TraceSpec:
    """Workload statistics of one production trace (shared/notes/colocation.md)."""

    name: str
    single_gpu_share: float
    runtime_p50_s: float
    runtime_p95_s: float
    source: str
    multi_gpu_mix: tuple[tuple[int, float], ...] = ((2, 0.5), (4, 0.3), (8, 0.2))


TRACES: dict[str, TraceSpec] = {
    # Philly (completed jobs): 93.0 % 1-GPU, runtime p50 1,124 s, p95 39,630 s.
    "philly": TraceSpec("philly", 0.930, 1124.0, 39630.0, "Philly trace (colocation.md)"),
    # Helios: the Saturn cluster (the largest): 68.8 % 1-GPU, p50 190 s, p95 12,652 s.
    "helios": TraceSpec("helios", 0.688, 190.0, 12652.0, "Helios Saturn (colocation.md)"),
    # Alibaba PAI 2020: colocation.md gives only its utilization (mean 10.5 %, median 1.5 %);
    # the GPU-count share and runtimes below are ASSUMPTIONS (Philly-like), not published figures.
    "pai": TraceSpec("pai", 0.90, 900.0, 30000.0, "PAI 2020 utilization; runtimes assumed"),
    # Transformer training with Philly's job shape (an assumption: no published LLM-lab trace
    # in colocation.md); its model mix is the memory-heavy one.
    "llm": TraceSpec("llm", 0.930, 1124.0, 39630.0, "Philly job shape, transformer training mix"),
}


def lognormal_params(p50: float, p95: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with median p50 and 95th percentile p95."""
    if p50 <= 0 or p95 <= p50:
        raise HorusError("runtime quantiles: need 0 < p50 < p95")
    return math.log(p50), math.log(p95 / p50) / 1.6448536269514722


def graph_residuals(rng: np.random.Generator, model: str, mix: ModelMix,
                    types: Iterable[str] = ()) -> dict[str | None, tuple[float, float]]:
    """log(true / predicted) (util, memory) of one graph: the cold start's error on it, {None:
    the graph's, gpu type: where the site measured the model on that type}.  Memory: a
    residual measured on this model (else on any measured model), so the truth is biased where
    the predictor is.  Utilization: a residual of the cold start on held-out GPUMemNet MLP runs
    (pooled; no real-model utilization was shipped).  Where the mix carries the site's own
    residuals, those of its runs of the model first (ModelMix ``site``), and of its runs on a
    type for that type (drawn on their own: the site's runs say nothing of how a graph's error
    on one type goes with its error on another)."""
    def draw(res: np.ndarray) -> float:
        return float(res[int(rng.integers(len(res)))])

    ur, mr = mix.util_residuals(model), mix.mem_residuals(model)
    out: dict[str | None, tuple[float, float]] = {None: (draw(ur), draw(mr))}
    for t in types:
        tu, tm = mix.type_residuals(model, t)
        if tu is not None or tm is not None:
            out[t] = (draw(tu) if tu is not None else out[None][0],
                      draw(tm) if tm is not None else out[None][1])
    return out


def truth(rng: np.random.Generator, pred: Mapping[str, tuple[float, float, float]],
          residuals: Mapping[str | None, tuple[float, float]], sigma_util: float, sigma_mem: float,
          mem_cap: float) -> dict[str, tuple[float, float]]:
    """True (util, mem) per type of one job: the prediction times exp(its graph's residual on
    that type (graph_residuals; else its residual) + normal(0, sigma) jitter of this run, the
    same on every type)."""
    def jitter(sigma: float) -> float:
        return float(rng.normal(0.0, sigma)) if sigma > 0 else 0.0

    ju, jm = jitter(sigma_util), jitter(sigma_mem)
    base = residuals[None]
    out = {}
    for t, (u, m, _) in pred.items():
        ru, rm = residuals.get(t, base)
        out[t] = (min(100.0, u * math.exp(ru + ju)), min(mem_cap, m * math.exp(rm + jm)))
    return out


def _job_extras(rng: np.random.Generator, types: list[str], duration: float,
                limit_factor: float, limit_cap_s: float,
                sens_sigma: float, log_k_config: float = 0.0
                ) -> tuple[dict[str, float], float, float]:
    """(runtime factor per type, interference sensitivity, time limit on the slowest type).
    ``log_k_config``: the part of log k the job's configuration sets; ``sens_sigma``: the
    spread of the job's own part."""
    rx = {t: runtime_factor(t) for t in types}
    # lognormal, median 1 (the median job loses the curve's median); one draw whatever the
    # spread, so the rest of the trace stays the same
    sens = float(np.exp(log_k_config + sens_sigma * rng.standard_normal()))
    return rx, sens, time_limit(duration * max(rx.values()), limit_factor, limit_cap_s)


def generate_trace(trace: str, n_jobs: int, gpu_types: Iterable[str], total_gpus: int, *,
                   seed: int = 0, load: float = 1.0, sigma_util: float = 0.05,
                   sigma_mem: float = 0.05, mix: ModelMix | None = None,
                   max_gpus_per_job: int = 8, limit_factor: float = 2.0,
                   limit_cap_s: float = 7 * 86400.0, mem_cap_mib: float | None = None,
                   max_duration_s: float = MAX_DURATION_S,
                   repeat_share: float = REPEAT_SHARE,
                   sensitivity_sigma: float = SENSITIVITY_SIGMA, limit_noise: float = 0.0,
                   sensitivity_config_share: float = 0.0) -> list[SimJob]:
    """A synthetic trace of ``n_jobs`` jobs like ``trace`` (philly, helios, pai).

    Arrivals are Poisson with the rate that offers ``load`` times the cluster's GPU capacity
    (in exclusive GPU-seconds); runtimes lognormal through the trace's p50/p95 (truncated to
    [30 s, max_duration_s]); GPU counts: the trace's 1-GPU share, the rest 2/4/8 (capped at
    ``max_gpus_per_job``, the largest node).  True memory is capped at ``mem_cap_mib`` (default:
    97 % of the largest GPU type) so that every job can run somewhere.  A job runs a graph
    already in the trace with probability ``repeat_share`` (one of its entry's graphs so far,
    uniformly), else a new graph with residuals of its own.  ``sensitivity_sigma``: the spread
    of the jobs' interference sensitivity; the horus scheduler assumes SENSITIVITY_SIGMA
    whatever it is, so another value shows a tail budget misled by its assumption.
    ``sensitivity_config_share``: the share of log k's variance that belongs to the job's
    configuration (its mix entry: model, batch, task; Lucid's pairs: 0.13-0.39, BENCHMARKS.md),
    the rest the job's own; each job's ``sens_config`` is its configuration's median k.
    ``limit_noise``: time limits as users give them, :func:`loose_limit` (0: the exact multiple).
    """
    if trace not in TRACES:
        raise HorusError(f"unknown trace '{trace}'; choose one of {', '.join(TRACES)}")
    if not 1 <= n_jobs <= MAX_TRACE_JOBS:
        raise HorusError(f"--jobs must be 1..{MAX_TRACE_JOBS:,}")
    if total_gpus < 1:
        raise HorusError("the cluster has no GPU")
    if not (MIN_LOAD <= load <= MAX_LOAD):
        raise HorusError(f"--load must be {MIN_LOAD:g}..{MAX_LOAD:g} (the GPU time asked over what the cluster has)")
    if not 0.0 <= repeat_share < 1.0:
        raise HorusError("--repeat-share must be in [0, 1)")
    if not 0.0 <= sensitivity_sigma <= 3.0:
        raise HorusError("--sensitivity-sigma must be in [0, 3]")
    if not 0.0 <= limit_noise <= 3.0:
        raise HorusError("--limit-noise must be in [0, 3]")
    if not 0.0 <= sensitivity_config_share <= 1.0:
        raise HorusError("the sensitivity's configuration share must be in [0, 1]")
    spec = TRACES[trace]
    types = list(dict.fromkeys(gpu_types))
    if not types:
        raise HorusError("the cluster has no GPU type")
    mix = mix or ModelMix()
    if mem_cap_mib is None:
        mem_cap_mib = 0.97 * max(get_gpu(t).mem_mib for t in types)
    rng = np.random.default_rng(seed)
    # the limits' noise has its own stream: the rest of the trace is the same with or without it
    limit_rng = np.random.default_rng([seed, 1]) if limit_noise > 0 else None
    mu, sigma = lognormal_params(spec.runtime_p50_s, spec.runtime_p95_s)
    durations = np.clip(rng.lognormal(mu, sigma, n_jobs), MIN_DURATION_S, max_duration_s)
    sizes = [g for g, _ in spec.multi_gpu_mix]
    probs = np.array([p for _, p in spec.multi_gpu_mix]) * (1 - spec.single_gpu_share)
    gpus = rng.choice([1] + sizes, size=n_jobs, p=np.concatenate([[spec.single_gpu_share], probs]))
    gpus = np.minimum(gpus, max(1, min(max_gpus_per_job, total_gpus)))
    demand = float(np.mean(durations * gpus))
    rate = load * total_gpus / demand
    gaps = rng.exponential(1.0 / rate, n_jobs)
    gaps[0] = 0.0
    submits = np.cumsum(gaps)
    items, p = mix.entries(trace)
    picks = rng.choice(len(items), size=n_jobs, p=p)
    # each configuration's term of log k, from a stream of its own (the rest of the trace stays
    # the same); a job's own term keeps its draw, scaled so that log k keeps its variance
    c_share = sensitivity_config_share
    log_k_configs = (np.random.default_rng([seed, 2]).standard_normal(len(items))
                     * sensitivity_sigma * c_share ** 0.5 if c_share > 0 else np.zeros(len(items)))
    own_sigma = sensitivity_sigma * (1.0 - c_share) ** 0.5
    graphs: dict[int, list[tuple[str, dict]]] = {}  # per mix entry: (name, residuals)
    jobs = []
    for i in range(n_jobs):
        m, b, task = items[picks[i]]
        seen = graphs.setdefault(int(picks[i]), [])
        if seen and rng.random() < repeat_share:
            graph, res = seen[int(rng.integers(len(seen)))]
        else:
            graph, res = f"{m}/b{b}/{task}#{len(seen)}", graph_residuals(rng, m, mix, types)
            seen.append((graph, res))
        pred = {t: mix.predict(m, b, task, t) for t in types}
        true = truth(rng, pred, res, sigma_util, sigma_mem, mem_cap_mib)
        d = float(durations[i])
        log_kc = float(log_k_configs[picks[i]])
        rx, sens, limit = _job_extras(rng, types, d, limit_factor, limit_cap_s, own_sigma, log_kc)
        if limit_rng is not None:
            limit = loose_limit(limit, float(limit_rng.standard_normal()), limit_noise, limit_cap_s)
        jobs.append(SimJob(id=i, submit=float(submits[i]), duration=d, gpus=int(gpus[i]), limit=limit,
                           model=f"{m}/b{b}/{task}", pred=pred, true=true, runtime_x=rx, sens=sens,
                           sens_config=math.exp(log_kc), graph=graph))
    return jobs


def time_limit(duration: float, factor: float = 2.0, cap_s: float = 7 * 86400.0) -> float:
    """The job's time limit: factor x its solo runtime, capped at cap_s (but never below
    1.2 x the runtime, so a job alone always finishes)."""
    return max(min(factor * duration, cap_s), 1.2 * duration)


def loose_limit(limit: float, z: float, noise: float, cap_s: float) -> float:
    """A time limit as a user gives it: the exact one over-requested by exp(noise x |z|) and
    rounded up to a whole hour (--time=4:00:00), at most cap_s, never below the exact one:
    real limits are loose, and a limit that is an exact multiple of the run time is a proxy of
    the true length no scheduler has."""
    loose = math.ceil(limit * math.exp(noise * abs(z)) / 3600.0 - 1e-9) * 3600.0
    return max(limit, min(loose, cap_s))
