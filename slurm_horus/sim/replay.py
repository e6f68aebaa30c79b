"""Traces of a site's own jobs for the simulator: a ``sacct --json`` dump (:func:`from_sacct_json`)
or measured rows of the prediction ledger (:func:`from_rows`, :func:`rows_from_ledger_jobs`); and
the site's own prediction errors from those rows (:func:`site_residuals`), which generated
traces can draw their truth from instead of the shipped residuals."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.slurm.accounting import RECORD_ERRORS, num, parse_job
from slurm_horus.slurm.parse import json_errors
from slurm_horus.sim.mix import SITE_POOLED, ModelMix
from slurm_horus.sim.traces import SimJob, graph_residuals, time_limit, truth

__all__ = ["from_sacct_json", "from_rows", "rows_from_ledger_jobs", "site_residuals", "ROW_KEYS",
           "MIN_SITE_RUNS"]


def from_sacct_json(text: str, gpu_types: Iterable[str], *, seed: int = 0, trace_mix: str = "philly",
                    sigma_util: float = 0.05, sigma_mem: float = 0.05, mix: ModelMix | None = None,
                    mem_cap_mib: float | None = None, max_gpus_per_job: int = 8,
                    limit_factor: float = 2.0, limit_cap_s: float = 7 * 86400.0) -> list[SimJob]:
    """Jobs of a ``sacct --json`` dump: submit time, elapsed time, GPU count (jobs without GPUs
    are skipped; a shard job counts as one GPU).  Their util/mem are unknown, so each job draws
    a model from the ``trace_mix`` mix, as a graph of its own (no history: which jobs repeated a
    graph is not in sacct).  Times are shifted so that the first submit is 0.  The
    time limit is the job's own (``time.limit``, minutes) when set, else the generator's rule."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise HorusError(f"sacct json: not JSON ({type(e).__name__}: {str(e)[:100]})") from None
    json_errors(data, "sacct json")  # as parse_sacct_json: a failed sacct is no empty trace
    raw = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise HorusError("sacct json: no 'jobs' list (expected `sacct --json` output)")
    types = list(dict.fromkeys(gpu_types))
    mix = mix or ModelMix()
    if mem_cap_mib is None:
        mem_cap_mib = 0.97 * max(get_gpu(t).mem_mib for t in types)
    rng = np.random.default_rng(seed)
    items, p = mix.entries(trace_mix)
    rows = []
    for j in raw:
        if not isinstance(j, dict):
            continue
        try:
            job = parse_job(j)  # the one sacct parser: a shard job counts as one GPU
        except RECORD_ERRORS:  # as parse_sacct_json skips them
            continue
        submit, elapsed = job["submit_time"], job["elapsed_s"]
        gpus = job["gpus"] or (1 if job["shards"] else 0)
        if (submit is None or not elapsed or gpus < 1 or (job.get("state") or "").split()[:1] in UNENDED
                or not (math.isfinite(submit) and math.isfinite(elapsed) and elapsed > 0)):
            continue  # not a finished GPU job (a running one's elapsed time is only so far)
        lim = num((j.get("time") or {}).get("limit"))
        lim = lim * 60.0 if lim and math.isfinite(lim) and lim > 0 else None  # NaN, inf: none given
        # a job larger than the largest node runs on one node of it (documented)
        rows.append((float(submit), float(elapsed), min(gpus, max_gpus_per_job), lim))
    if not rows:
        raise HorusError("sacct json: no finished GPU job with submit and elapsed times")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    jobs = []
    for i, (submit, elapsed, gpus, lim) in enumerate(rows):
        m, b, task = items[int(rng.choice(len(items), p=p))]
        pred = {gt: mix.predict(m, b, task, gt) for gt in types}
        true = truth(rng, pred, graph_residuals(rng, m, mix, types), sigma_util, sigma_mem, mem_cap_mib)
        limit = max(lim, 1.2 * elapsed) if lim else time_limit(elapsed, limit_factor, limit_cap_s)
        jobs.append(SimJob(i, submit - t0, elapsed, gpus, limit, f"{m}/b{b}/{task}", pred, true))
    return jobs


UNENDED = (["PENDING"], ["RUNNING"], ["SUSPENDED"], ["REQUEUED"], ["RESIZING"])
ROW_KEYS = ("submit_time", "elapsed_s", "gpus", "pred_util", "pred_mem", "true_util", "true_mem")
# runs of a model (or, pooled, of all models) the site must have measured before its residuals
# replace the shipped ones: fewer say little about the spread
MIN_SITE_RUNS = 5


def rows_from_ledger_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[dict]:
    """from_rows input from ledger `jobs` rows: the jobs with both a prediction and a
    measurement, on the GPUs Slurm allocated them (shards: one GPU), and whether they shared
    their GPU (Slurm's placement: the ledger's ``colocated``)."""
    rows = []
    for j in jobs:
        vals = (j.get("submit_time"), j.get("elapsed_s"), j.get("pred_util_pct"),
                j.get("pred_mem_mib"), j.get("act_util_pct"), j.get("act_mem_mib"))
        if any(v is None for v in vals) or not j["elapsed_s"]:
            continue
        gpus = j.get("gpus")
        rows.append({"submit_time": j["submit_time"], "elapsed_s": j["elapsed_s"],
                     "gpus": gpus if isinstance(gpus, int) and gpus > 1 else 1,
                     "pred_util": j["pred_util_pct"], "pred_mem": j["pred_mem_mib"],
                     "true_util": j["act_util_pct"], "true_mem": j["act_mem_mib"],
                     "model": j.get("model_family"), "gpu_type": j.get("gpu_type"),
                     "colocated": bool(j.get("colocated"))})
    if not rows:
        raise HorusError("the ledger has no job with both a prediction and a measurement")
    return rows


def _parse_rows(rows: Iterable[Mapping[str, Any]]) -> list[tuple[dict, float, float | None, str | None, bool, str | None]]:
    """Ledger-like rows checked at the boundary: (the ROW_KEYS as floats, p90 memory, time limit
    or None, model or None, shared its GPU, GPU type or None), in the given order."""
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
        if not all(math.isfinite(v) for v in (*vals.values(), p90, 1.0 if lim is None else lim)):
            raise HorusError(f"row {n}: non-finite value")
        if lim is not None and lim <= 0:
            raise HorusError(f"row {n}: limit_s must be positive")
        if vals["elapsed_s"] <= 0 or vals["gpus"] < 1 or min(vals.values()) < 0:
            raise HorusError(f"row {n}: need elapsed_s > 0, gpus >= 1 and no negative value")
        colocated = r.get("colocated", False)
        if not isinstance(colocated, bool):
            raise HorusError(f"row {n}: colocated must be true or false")
        gtype = r.get("gpu_type")
        if gtype is not None and not isinstance(gtype, str):
            raise HorusError(f"row {n}: gpu_type must be a string")
        parsed.append((vals, p90, lim, str(r["model"]) if r.get("model") else None, colocated, gtype or None))
    if not parsed:
        raise HorusError("no rows")
    return parsed


def site_residuals(rows: Iterable[Mapping[str, Any]], min_runs: int = MIN_SITE_RUNS) -> dict:
    """The site's own prediction errors, log(measured / predicted), from ledger-like rows (as
    :func:`from_rows` takes them): {"util": {model: [...], SITE_POOLED: [...]}, "mem": {model:
    [...]}, "by_type": {gpu type: {"util": {model: [...]}, "mem": {...}}}}, each model (or the
    pool, where rows without a model count too) with at least ``min_runs`` runs, overall and
    per GPU type.  Utilization only from runs that had their GPU alone: a shared run's NVML
    utilization is its share, not its need.  For :class:`~slurm_horus.sim.mix.ModelMix` ``site``."""
    return _residuals(_parse_rows(rows), min_runs)


def _residuals(parsed: list[tuple], min_runs: int) -> dict:
    """site_residuals of rows _parse_rows has checked."""
    util: dict[str, list[float]] = {}
    mem: dict[str, list[float]] = {}
    typed: dict[str, tuple[dict, dict]] = {}
    for v, _, _, model, colocated, gtype in parsed:
        tutil, tmem = typed.setdefault(gtype, ({}, {})) if gtype else ({}, {})
        pu, tu = min(100.0, v["pred_util"]), min(100.0, v["true_util"])
        if not colocated and pu > 0 and tu > 0:
            r = round(math.log(tu / pu), 4)
            util.setdefault(SITE_POOLED, []).append(r)
            if model:
                util.setdefault(model, []).append(r)
                tutil.setdefault(model, []).append(r)
        if model and v["pred_mem"] > 0 and v["true_mem"] > 0:
            r = round(math.log(v["true_mem"] / v["pred_mem"]), 4)
            mem.setdefault(model, []).append(r)
            tmem.setdefault(model, []).append(r)
    keep = lambda d: {m: sorted(x) for m, x in d.items() if len(x) >= min_runs}  # noqa: E731
    by_type = {t: {"util": keep(u), "mem": keep(m)} for t, (u, m) in sorted(typed.items())}
    return {"util": keep(util), "mem": keep(mem),
            "by_type": {t: d for t, d in by_type.items() if d["util"] or d["mem"]}}


def from_rows(rows: Iterable[Mapping[str, Any]], gpu_types: Iterable[str], *, seed: int = 0,
              limit_factor: float = 2.0, limit_cap_s: float = 7 * 86400.0) -> list[SimJob]:
    """Jobs from ledger-like rows: dicts with ``submit_time`` (s, any origin), ``elapsed_s``,
    ``gpus``, ``pred_util`` (%), ``pred_mem`` (MiB), ``true_util``, ``true_mem``; optional
    ``pred_mem_p90`` (default: pred_mem), ``limit_s``, ``model``, ``colocated`` (it shared
    its GPU) and ``gpu_type`` (where it ran: site_residuals).  The same figures are used for
    every GPU type of the cluster (a ledger row is one job on one type).  A co-located run's measured utilization is its share, not its need: its
    true utilization is its prediction times a residual (seeded by ``seed``) of the rows' runs
    of the same model that had their GPU alone (else of all such runs; else the prediction)."""
    types = list(dict.fromkeys(gpu_types))
    parsed = _parse_rows(rows)
    solo = _residuals(parsed, min_runs=1)["util"] if any(x[4] for x in parsed) else {}
    rng = np.random.default_rng(seed)
    order = sorted(range(len(parsed)), key=lambda i: parsed[i][0]["submit_time"])
    t0 = parsed[order[0]][0]["submit_time"]
    jobs = []
    for i, k in enumerate(order):
        v, p90, lim, model, colocated, _ = parsed[k]
        pu = min(100.0, v["pred_util"])
        tu = min(100.0, v["true_util"])
        if colocated:
            res = solo.get(model) if model else None
            res = res if res is not None else solo.get(SITE_POOLED)
            tu = min(100.0, pu * math.exp(res[int(rng.integers(len(res)))])) if res else pu
        pred = {t: (pu, v["pred_mem"], max(p90, v["pred_mem"])) for t in types}
        true = {t: (tu, v["true_mem"]) for t in types}
        d = v["elapsed_s"]
        limit = max(lim, 1.2 * d) if lim else time_limit(d, limit_factor, limit_cap_s)
        jobs.append(SimJob(i, v["submit_time"] - t0, d, int(v["gpus"]), limit, model or "ledger", pred, true))
    return jobs
