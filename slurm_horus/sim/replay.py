"""Traces of a site's own jobs for the simulator: a ``sacct --json`` dump (:func:`from_sacct_json`)
or measured rows of the prediction ledger (:func:`from_rows`, :func:`rows_from_ledger_jobs`)."""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.slurm.accounting import num, parse_job
from slurm_horus.sim.mix import ModelMix
from slurm_horus.sim.traces import SimJob, graph_residuals, time_limit, truth

__all__ = ["from_sacct_json", "from_rows", "rows_from_ledger_jobs", "ROW_KEYS"]


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
    except ValueError as e:
        raise HorusError(f"sacct json: not JSON ({e})") from None
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
        except (TypeError, ValueError, KeyError, HorusError):
            continue
        submit, elapsed = job["submit_time"], job["elapsed_s"]
        gpus = job["gpus"] or (1 if job["shards"] else 0)
        if submit is None or not elapsed or elapsed <= 0 or gpus < 1:
            continue
        lim = num((j.get("time") or {}).get("limit"))
        rows.append((float(submit), float(elapsed), min(gpus, max_gpus_per_job), lim * 60.0 if lim else None))
    if not rows:
        raise HorusError("sacct json: no finished GPU job with submit and elapsed times")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    jobs = []
    for i, (submit, elapsed, gpus, lim) in enumerate(rows):
        m, b, task = items[int(rng.choice(len(items), p=p))]
        pred = {gt: mix.predict(m, b, task, gt) for gt in types}
        true = truth(rng, pred, graph_residuals(rng, m, mix), sigma_util, sigma_mem, mem_cap_mib)
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
