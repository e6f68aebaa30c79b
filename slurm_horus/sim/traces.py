"""Job traces for the cluster simulator: generated (Philly-, Helios-, PAI-like) or imported.

A trace is a list of :class:`SimJob`.  Each job carries, per GPU type of the simulated cluster,
the PREDICTED utilization/memory (what ``hsubmit`` would write in the hint) and the TRUE ones
(what the job really uses; the simulator's interference and OOM model run on these).

Generated traces draw the model of each job from a mix of real architectures (the ONNX test
corpus, ``tests/data/zoo``); the prediction is the cold-start estimator applied to the real graph
(computed once per (model, batch, task, GPU type), cached in the :class:`ModelMix`), and the
truth is the prediction times multiplicative lognormal noise.

Imports: ``from_sacct_json`` (a site's ``sacct --json`` output) and ``from_rows`` (a list of
dicts, the interface of the prediction ledger).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from slurm_horus.errors import HorusError

__all__ = [
    "SimJob", "TraceSpec", "TRACES", "MIX", "ModelMix", "generate_trace",
    "from_sacct_json", "from_rows", "lognormal_params",
]

MAX_DURATION_S = 2 * 86400.0   # generated runtimes are truncated here (a usual partition MaxTime)
MIN_DURATION_S = 30.0


@dataclass
class SimJob:
    """One job of a trace.  Times in seconds; util in percent; memory in MiB.

    duration: run time alone on a GPU (the solo work).  limit: the Slurm time limit (the job is
    killed when it runs longer, e.g. because interference slowed it down).
    pred: {gpu_type: (util_pct, mem_mib, mem_p90_mib)} as the hint would carry it.
    true: {gpu_type: (util_pct, mem_mib)} what the job really uses (per GPU it holds).
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

# The model mix: (zoo model, batch size, task, {trace: weight}).  Philly/Helios: research
# training jobs over all families; PAI: many small and inference jobs (its median util is 1.5 %);
# llm: transformer training, memory-heavy (a 16 GB T4 cannot hold the largest, two of them do not
# fit beside each other on a 40 GB A100).  benchmarks/make_sim_mix.py turns this list into the
# shipped table (slurm_horus/data/sim_mix.json): predictions per GPU type and measured residuals.
MIX: tuple[tuple[str, int, str, dict[str, float]], ...] = (
    ("small_cnn", 64, "train", {"philly": 2, "helios": 4, "pai": 6}),
    ("small_cnn", 32, "infer", {"philly": 0, "helios": 1, "pai": 8}),
    ("lstm_lm", 16, "train", {"philly": 2, "helios": 2, "pai": 2}),
    ("lstm_lm", 64, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("mobilenet_v2", 32, "train", {"philly": 2, "helios": 3, "pai": 2}),
    ("mobilenet_v2", 32, "infer", {"philly": 0, "helios": 1, "pai": 6}),
    ("efficientnet_b0", 16, "train", {"philly": 2, "helios": 2, "pai": 1}),
    ("efficientnet_b0", 16, "infer", {"philly": 0, "helios": 1, "pai": 3}),
    ("inception_v3", 32, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("resnet50", 32, "train", {"philly": 3, "helios": 2, "pai": 1}),
    ("resnet50", 128, "train", {"philly": 1, "helios": 0, "pai": 0, "llm": 1}),
    ("resnet50", 32, "infer", {"philly": 0, "helios": 1, "pai": 3}),
    ("vgg16", 32, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("xception", 16, "train", {"philly": 1, "helios": 0, "pai": 0}),
    ("unet", 8, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("bert_base", 16, "train", {"philly": 2, "helios": 2, "pai": 1, "llm": 3}),
    ("bert_base", 16, "infer", {"philly": 0, "helios": 0, "pai": 2}),
    ("bert_base", 32, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 2}),
    ("bert_large", 16, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 2}),
    ("gpt2", 8, "train", {"philly": 1, "helios": 1, "pai": 0, "llm": 3}),
    ("gpt2_large", 8, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 1}),
    ("xlnet_base", 8, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 2}),
    ("t5_small", 16, "train", {"philly": 1, "helios": 1, "pai": 0, "llm": 2}),
    ("vit_b_16", 32, "train", {"philly": 1, "helios": 1, "pai": 0, "llm": 2}),
)

# GPU types the shipped table predicts on (catalog names); other types need --zoo.
SHIPPED_TYPES = ("a100-40gb", "a100-80gb", "t4", "v100-16gb", "v100-32gb", "h100-sxm", "l4",
                 "a10", "a30", "rtx3090", "l40s")
SHIPPED_MIX = Path(__file__).resolve().parents[1] / "data" / "sim_mix.json"


class ModelMix:
    """Predictions of the model mix per (model, batch, task, GPU type), and the predictor's
    measured memory residuals.

    Default: the shipped table (slurm_horus/data/sim_mix.json, made by
    benchmarks/make_sim_mix.py), so no ONNX graph is read at run time.  ``zoo_dir``: a folder of
    ``<model>.onnx`` files to predict from instead (any GPU type of the catalog; dims from
    ``zoo.json`` next to it, else batch/seq=128).
    """

    def __init__(self, zoo_dir: str | os.PathLike | None = None, estimator=None):
        self.zoo_dir = Path(zoo_dir) if zoo_dir is not None else None
        self._estimator = estimator
        try:
            self._table = json.loads(SHIPPED_MIX.read_text())
        except (OSError, ValueError) as e:
            raise HorusError(f"model mix {SHIPPED_MIX}: {e} (run benchmarks/make_sim_mix.py)") from None
        self._shipped = {(e["model"], e["batch"], e["task"]): e["pred"] for e in self._table["entries"]}
        res = self._table["mem_residuals"]
        self._res_model = {m: np.array(v, dtype=float) for m, v in res["by_model"].items()}
        self._res_pooled = np.array(res["pooled"], dtype=float)
        self._reports: dict[tuple[str, int], Any] = {}
        self._preds: dict[tuple[str, int, str, str], tuple[float, float, float]] = {}
        self._dims: dict[str, dict[str, int]] | None = None

    def mem_residuals(self, model: str) -> np.ndarray:
        """log(measured / predicted) memory of ``model`` (pooled over all measured models when
        it was not measured itself)."""
        return self._res_model.get(model, self._res_pooled)

    def _zoo_dims(self) -> dict[str, dict[str, int]]:
        if self._dims is None:
            self._dims = {}
            try:
                for e in json.loads((self.zoo_dir.parent / "zoo.json").read_text()):
                    self._dims[e["name"]] = dict(e.get("dims") or {})
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return self._dims

    def predict(self, model: str, batch: int, task: str, gpu_type: str) -> tuple[float, float, float]:
        """(util_pct, mem_mib, mem_p90_mib) of ``model`` at ``batch``/``task`` on ``gpu_type``."""
        key = (model, batch, task, gpu_type)
        hit = self._preds.get(key)
        if hit is not None:
            return hit
        from slurm_horus.predict.gpus import get_gpu

        gpu = get_gpu(gpu_type)
        if self.zoo_dir is None:
            pred = self._shipped.get((model, batch, task), {}).get(gpu.name)
            if pred is None:
                raise HorusError(f"the shipped model mix has no prediction for {model}/b{batch}/{task} "
                                 f"on {gpu.name} (types: {', '.join(self._table['types'])}); "
                                 "pass --zoo DIR with the ONNX graphs to predict on it")
            out = (float(pred[0]), float(pred[1]), float(pred[2]))
        else:
            out = self._predict_graph(model, batch, task, gpu)
        self._preds[key] = out
        return out

    def _predict_graph(self, model: str, batch: int, task: str, gpu) -> tuple[float, float, float]:
        from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
        from slurm_horus.graph.features import extract_features

        rkey = (model, batch)
        report = self._reports.get(rkey)
        if report is None:
            path = self.zoo_dir / f"{model}.onnx"
            if not path.is_file():
                raise HorusError(f"model corpus: {path} not found")
            dims = {"seq": 128, "dec_seq": 128, **self._zoo_dims().get(model, {}), "batch": batch}
            report = extract_features(path, dims=dims)
            self._reports[rkey] = report
        if self._estimator is None:
            self._estimator = ColdStartEstimator()
        p = self._estimator.predict(report, gpu, Workload(batch_size=batch, task=task))
        return float(p.util_pct), float(p.mem_mib), float(p.mem_mib_p90)

    def entries(self, trace: str) -> tuple[list[tuple[str, int, str]], np.ndarray]:
        """The mix of ``trace``: its (model, batch, task) entries and their probabilities."""
        items = [(m, b, t) for m, b, t, w in MIX if w.get(trace, 0) > 0]
        weights = np.array([w[trace] for m, b, t, w in MIX if w.get(trace, 0) > 0], dtype=float)
        if not items:
            raise HorusError(f"no model mix for trace '{trace}'")
        if self.zoo_dir is not None:
            available = [i for i, (m, _, _) in enumerate(items) if (self.zoo_dir / f"{m}.onnx").is_file()]
            if not available:
                raise HorusError(f"model corpus: no model of the mix found in {self.zoo_dir}")
            items = [items[i] for i in available]
            weights = weights[available]
        return items, weights / weights.sum()


def runtime_factor(gpu_type: str, reference: str = "a100-40gb") -> float:
    """How much longer a job runs on ``gpu_type`` than on the reference (trace runtimes are
    A100 runtimes): the geometric mean of the FP32-throughput and memory-bandwidth ratios (an
    assumption: training steps are partly compute-, partly bandwidth-bound)."""
    from slurm_horus.predict.gpus import get_gpu

    g, r = get_gpu(gpu_type), get_gpu(reference)
    return math.sqrt((r.fp32_tflops * r.mem_bw_gbs) / (g.fp32_tflops * g.mem_bw_gbs))


# Spread of the interference between co-located jobs: each job's sensitivity (its share of the
# pair curve's loss) is lognormal with this sigma, mean 1 (see sim_interference).
SENSITIVITY_SIGMA = 0.6


def lognormal_params(p50: float, p95: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with median p50 and 95th percentile p95."""
    if p50 <= 0 or p95 <= p50:
        raise HorusError("runtime quantiles: need 0 < p50 < p95")
    return math.log(p50), math.log(p95 / p50) / 1.6448536269514722


def _truth(rng: np.random.Generator, pred: Mapping[str, tuple[float, float, float]], model: str,
           mix: ModelMix, sigma_util: float, sigma_mem: float, mem_cap: float) -> dict[str, tuple[float, float]]:
    """True (util, mem) per type.  Memory: the prediction times exp(a residual of the cold start
    measured on this model, else on any measured model) times lognormal(sigma_mem) jitter, so the
    truth is biased where the predictor is.  Utilization: the prediction times lognormal(sigma_util)
    (no real-model utilization residuals are measured).  One draw per job, the same ratio on every
    GPU type (the residuals were measured on one A100)."""
    fu = float(np.exp(rng.normal(0.0, sigma_util))) if sigma_util > 0 else 1.0
    res = mix.mem_residuals(model)
    fm = float(np.exp(res[int(rng.integers(len(res)))] + (rng.normal(0.0, sigma_mem) if sigma_mem > 0 else 0.0)))
    return {t: (min(100.0, u * fu), min(mem_cap, m * fm)) for t, (u, m, _) in pred.items()}


def _job_extras(rng: np.random.Generator, types: list[str], duration: float,
                limit_factor: float, limit_cap_s: float) -> tuple[dict[str, float], float, float]:
    """(runtime factor per type, interference sensitivity, time limit on the slowest type)."""
    rx = {t: runtime_factor(t) for t in types}
    sens = float(np.exp(rng.normal(-SENSITIVITY_SIGMA ** 2 / 2, SENSITIVITY_SIGMA)))
    return rx, sens, time_limit(duration * max(rx.values()), limit_factor, limit_cap_s)


def generate_trace(trace: str, n_jobs: int, gpu_types: Iterable[str], total_gpus: int, *,
                   seed: int = 0, load: float = 1.0, sigma_util: float = 0.25,
                   sigma_mem: float = 0.05, mix: ModelMix | None = None,
                   max_gpus_per_job: int = 8, limit_factor: float = 2.0,
                   limit_cap_s: float = 7 * 86400.0, mem_cap_mib: float | None = None,
                   max_duration_s: float = MAX_DURATION_S) -> list[SimJob]:
    """A synthetic trace of ``n_jobs`` jobs like ``trace`` (philly, helios, pai).

    Arrivals are Poisson with the rate that offers ``load`` times the cluster's GPU capacity
    (in exclusive GPU-seconds); runtimes lognormal through the trace's p50/p95 (truncated to
    [30 s, max_duration_s]); GPU counts: the trace's 1-GPU share, the rest 2/4/8 (capped at
    ``max_gpus_per_job``, the largest node).  True memory is capped at ``mem_cap_mib`` (default:
    97 % of the largest GPU type) so that every job can run somewhere.
    """
    if trace not in TRACES:
        raise HorusError(f"unknown trace '{trace}'; choose one of {', '.join(TRACES)}")
    if n_jobs < 1:
        raise HorusError("--jobs must be at least 1")
    if total_gpus < 1:
        raise HorusError("the cluster has no GPU")
    if load <= 0:
        raise HorusError("--load must be positive")
    spec = TRACES[trace]
    types = list(dict.fromkeys(gpu_types))
    if not types:
        raise HorusError("the cluster has no GPU type")
    mix = mix or ModelMix()
    if mem_cap_mib is None:
        from slurm_horus.predict.gpus import get_gpu
        mem_cap_mib = 0.97 * max(get_gpu(t).mem_mib for t in types)
    rng = np.random.default_rng(seed)
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
    jobs = []
    for i in range(n_jobs):
        m, b, task = items[picks[i]]
        pred = {t: mix.predict(m, b, task, t) for t in types}
        true = _truth(rng, pred, m, mix, sigma_util, sigma_mem, mem_cap_mib)
        d = float(durations[i])
        rx, sens, limit = _job_extras(rng, types, d, limit_factor, limit_cap_s)
        jobs.append(SimJob(id=i, submit=float(submits[i]), duration=d, gpus=int(gpus[i]), limit=limit,
                           model=f"{m}/b{b}/{task}", pred=pred, true=true, runtime_x=rx, sens=sens))
    return jobs


def time_limit(duration: float, factor: float = 2.0, cap_s: float = 7 * 86400.0) -> float:
    """The job's time limit: factor x its solo runtime, capped at cap_s (but never below
    1.2 x the runtime, so a job alone always finishes)."""
    return max(min(factor * duration, cap_s), 1.2 * duration)


# --------------------------------------------------------------------------------------------
# Imports
# --------------------------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    """sacct --json numbers: plain, or {"set": true, "infinite": false, "number": N} (23.02+)."""
    if isinstance(v, dict):
        if v.get("infinite") or v.get("set") is False:
            return None
        v = v.get("number")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _gpu_count(job: Mapping[str, Any]) -> int:
    tres = job.get("tres") or {}
    for kind in ("allocated", "requested"):
        n, shard = 0, 0
        for t in tres.get(kind) or []:
            if not isinstance(t, dict) or t.get("type") != "gres":
                continue
            c = _num(t.get("count")) or 0
            name = str(t.get("name") or "")
            if name == "gpu" or name.startswith("gpu:"):
                n += int(c)
            elif name == "shard" or name.startswith("shard:"):
                shard += int(c)
        if n:
            return n
        if shard:
            return 1
    return 0


def from_sacct_json(text: str, gpu_types: Iterable[str], *, seed: int = 0, trace_mix: str = "philly",
                    sigma_util: float = 0.25, sigma_mem: float = 0.05, mix: ModelMix | None = None,
                    mem_cap_mib: float | None = None, max_gpus_per_job: int = 8,
                    limit_factor: float = 2.0, limit_cap_s: float = 7 * 86400.0) -> list[SimJob]:
    """Jobs of a ``sacct --json`` dump: submit time, elapsed time, GPU count (jobs without GPUs
    are skipped; a shard job counts as one GPU).  Their util/mem are unknown, so each job draws
    a model from the ``trace_mix`` mix.  Times are shifted so that the first submit is 0.  The
    time limit is the job's own (``time.limit``, minutes) when set, else the generator's rule."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise HorusError(f"sacct json: not JSON ({e})") from None
    raw = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise HorusError("sacct json: no 'jobs' list (expected `sacct --json` output)")
    types = list(dict.fromkeys(gpu_types))
    mix = mix or ModelMix()
    if mem_cap_mib is None:
        from slurm_horus.predict.gpus import get_gpu
        mem_cap_mib = 0.97 * max(get_gpu(t).mem_mib for t in types)
    rng = np.random.default_rng(seed)
    items, p = mix.entries(trace_mix)
    rows = []
    for j in raw:
        if not isinstance(j, dict):
            continue
        t = j.get("time") or {}
        submit, elapsed = _num(t.get("submission")), _num(t.get("elapsed"))
        gpus = _gpu_count(j)
        if submit is None or elapsed is None or gpus < 1 or elapsed <= 0:
            continue
        lim = _num(t.get("limit"))
        rows.append((submit, elapsed, min(gpus, max_gpus_per_job), lim * 60 if lim else None))
    if not rows:
        raise HorusError("sacct json: no finished GPU job with submit and elapsed times")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    jobs = []
    for i, (submit, elapsed, gpus, lim) in enumerate(rows):
        m, b, task = items[int(rng.choice(len(items), p=p))]
        pred = {gt: mix.predict(m, b, task, gt) for gt in types}
        true = _truth(rng, pred, m, mix, sigma_util, sigma_mem, mem_cap_mib)
        limit = max(lim, 1.2 * elapsed) if lim else time_limit(elapsed, limit_factor, limit_cap_s)
        jobs.append(SimJob(i, submit - t0, elapsed, gpus, limit, f"{m}/b{b}/{task}", pred, true))
    return jobs


ROW_KEYS = ("submit_time", "elapsed_s", "gpus", "pred_util", "pred_mem", "true_util", "true_mem")


def rows_from_ledger_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[dict]:
    """from_rows input from ledger `jobs` rows: the jobs with both a prediction and a
    measurement (hsubmit jobs ask for one GPU, shared or whole)."""
    rows = []
    for j in jobs:
        vals = (j.get("submit_time"), j.get("elapsed_s"), j.get("pred_util_pct"),
                j.get("pred_mem_mib"), j.get("act_util_pct"), j.get("act_mem_mib"))
        if any(v is None for v in vals) or not j["elapsed_s"]:
            continue
        rows.append({"submit_time": j["submit_time"], "elapsed_s": j["elapsed_s"], "gpus": 1,
                     "pred_util": j["pred_util_pct"], "pred_mem": j["pred_mem_mib"],
                     "true_util": j["act_util_pct"], "true_mem": j["act_mem_mib"],
                     "model": j.get("model_family") or "ledger"})
    if not rows:
        raise HorusError("the ledger has no job with both a prediction and a measurement")
    return rows


def from_rows(rows: Iterable[Mapping[str, Any]], gpu_types: Iterable[str], *,
              limit_factor: float = 2.0, limit_cap_s: float = 7 * 86400.0) -> list[SimJob]:
    """Jobs from ledger-like rows: dicts with ``submit_time`` (s, any origin), ``elapsed_s``,
    ``gpus``, ``pred_util`` (%), ``pred_mem`` (MiB), ``true_util``, ``true_mem``; optional
    ``pred_mem_p90`` (default: pred_mem), ``limit_s`` and ``model``.  The same figures are used
    for every GPU type of the cluster (a ledger row is one job on one type)."""
    types = list(dict.fromkeys(gpu_types))
    parsed = []
    for n, r in enumerate(rows, 1):
        if not isinstance(r, Mapping):
            raise HorusError(f"row {n}: not a mapping")
        missing = [k for k in ROW_KEYS if r.get(k) is None]
        if missing:
            raise HorusError(f"row {n}: missing {', '.join(missing)}")
        try:
            vals = {k: float(r[k]) for k in ROW_KEYS}
            p90 = float(r["pred_mem_p90"]) if r.get("pred_mem_p90") is not None else vals["pred_mem"]
            lim = float(r["limit_s"]) if r.get("limit_s") is not None else None
        except (TypeError, ValueError):
            raise HorusError(f"row {n}: non-numeric value") from None
        if not all(math.isfinite(v) for v in vals.values()):
            raise HorusError(f"row {n}: non-finite value")
        if vals["elapsed_s"] <= 0 or vals["gpus"] < 1 or min(vals.values()) < 0:
            raise HorusError(f"row {n}: need elapsed_s > 0, gpus >= 1 and no negative value")
        parsed.append((vals, p90, lim, str(r.get("model") or "ledger")))
    if not parsed:
        raise HorusError("no rows")
    parsed.sort(key=lambda x: x[0]["submit_time"])
    t0 = parsed[0][0]["submit_time"]
    jobs = []
    for i, (v, p90, lim, model) in enumerate(parsed):
        pu = min(100.0, v["pred_util"])
        pred = {t: (pu, v["pred_mem"], max(p90, v["pred_mem"])) for t in types}
        true = {t: (min(100.0, v["true_util"]), v["true_mem"]) for t in types}
        d = v["elapsed_s"]
        limit = max(lim, 1.2 * d) if lim else time_limit(d, limit_factor, limit_cap_s)
        jobs.append(SimJob(i, v["submit_time"] - t0, d, int(v["gpus"]), limit, model, pred, true))
    return jobs
