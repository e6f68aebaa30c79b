"""Traces of a site's own jobs for the simulator: a ``sacct --json`` dump (:func:`from_sacct_json`)
or measured rows of the prediction ledger (:func:`from_rows`, :func:`rows_from_ledger_jobs`); and
the site's own prediction errors from those rows (:func:`site_residuals`), which generated
traces can draw their truth from instead of the shipped residuals."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping

import numpy as np

from slurm_horus.errors import HorusError, one_line
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.slurm.accounting import RECORD_ERRORS, UNSET_TIME, num, parse_job
from slurm_horus.slurm.parse import json_errors
from slurm_horus.sim.cluster import MAX_GPU_MEM_MIB
from slurm_horus.sim.mix import SITE_POOLED, ModelMix
from slurm_horus.sim.traces import MAX_TRACE_JOBS, SimJob, graph_residuals, time_limit, truth

__all__ = ["from_sacct_json", "from_rows", "rows_from_ledger_jobs", "site_residuals", "skip_summary",
           "ROW_KEYS", "MIN_SITE_RUNS", "SKIP_REASONS"]


def from_sacct_json(text: str, gpu_types: Iterable[str], *, seed: int = 0, trace_mix: str = "philly",
                    sigma_util: float = 0.05, sigma_mem: float = 0.05, mix: ModelMix | None = None,
                    mem_cap_mib: float | None = None, max_gpus_per_job: int = 8,
                    limit_factor: float = 2.0, limit_cap_s: float = 7 * 86400.0,
                    report: dict | None = None) -> list[SimJob]:
    """Jobs of a ``sacct --json`` dump: submit time, elapsed time, GPU count (jobs without GPUs
    are skipped; a shard job counts as one GPU).  Their util/mem are unknown, so each job draws
    a model from the ``trace_mix`` mix, as a graph of its own (no history: which jobs repeated a
    graph is not in sacct).  Times are shifted so that the first submit is 0.  The
    time limit is the job's own (``time.limit``, minutes) when set, else the generator's rule;
    Slurm's unset values (0, NO_VAL, INFINITE, as numbers or ``{set, infinite, number}``) are
    none given, in every time field.  ``report``, when given, is filled in: ``rows`` (entries
    of the dump), ``jobs`` (replayed), ``skipped`` ({reason: rows}, SKIP_REASONS' order),
    ``examples`` ({reason: a job id}) and ``clipped`` (jobs asking more GPUs than
    ``max_gpus_per_job``, replayed on one whole node of the largest)."""
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
    skipped: dict[str, int] = {}
    examples: dict[str, str] = {}
    clipped = 0
    for j in raw:
        row = _sacct_row(j) if isinstance(j, dict) else "not job records"
        if isinstance(row, str):  # why the row is unusable
            skipped[row] = skipped.get(row, 0) + 1
            if isinstance(j, dict) and row not in examples and j.get("job_id") is not None:
                examples[row] = one_line(str(j["job_id"]))[:40]
            continue
        submit, elapsed, gpus, lim = row
        # a job larger than the largest node runs on one node of it (documented)
        clipped += gpus > max_gpus_per_job
        rows.append((submit, elapsed, min(gpus, max_gpus_per_job), lim))
    said = {"rows": len(raw), "jobs": len(rows), "skipped": {k: skipped[k] for k in SKIP_REASONS if k in skipped},
            "examples": examples, "clipped": clipped}
    if report is not None:
        report.update(said)
    if not rows:
        raise HorusError("sacct json: no finished GPU job with submit and elapsed times"
                         + (f" (of {len(raw):,} rows: {skip_summary(said)})" if raw else ""))
    _cap(len(rows), "sacct json")
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


# why a sacct row is not replayed, in the order they are tested (the report's order)
SKIP_REASONS = ("not job records", "steps", "unreadable", "without GPUs", "not ended",
                "without times", "impossible times")
# Bounds of a usable row: submitted from 1970 to 2100 (epoch seconds), and ran less than a year
# (366 days: a site's longest partition limit is a year, MaxTime=525600 on the clusters the tests
# record, and the generator's jobs run at most 2 days): beyond them a time is a broken record
# (9e18, 1e308), and replaying it gave a makespan of 9e18 s and a p95 slowdown below 1
MAX_EPOCH_S = 4102444800.0  # 2100-01-01T00:00:00Z
MAX_ELAPSED_S = 366 * 86400.0
_STEP_ID = re.compile(r"[0-9]+(?:_[0-9]+)?\.\S+")  # 123.batch, 123_4.0: a step, not a job


def _time(v: Any) -> float | None:
    """A sacct time field (or a parsed one) as a float: None when unset (missing, 0, NO_VAL,
    INFINITE, a ``{set: false}`` or ``{infinite: true}`` struct, no number), NaN when it is
    no finite number."""
    v = num(v)
    if v is None or v == 0 or v in (UNSET_TIME, UNSET_TIME + 1):
        return None
    try:
        v = float(v)
    except OverflowError:  # an integer beyond a float
        return math.nan
    return v if math.isfinite(v) else math.nan


def _impossible(submit: float | None, elapsed: float | None) -> bool:
    """A submit time outside 1970..2100 or an elapsed time below 0 or over MAX_ELAPSED_S (NaN:
    no finite number)."""
    return ((submit is not None and not 0 <= submit <= MAX_EPOCH_S)
            or (elapsed is not None and not 0 <= elapsed <= MAX_ELAPSED_S))


def _sacct_row(j: dict) -> tuple[float, float, int, float | None] | str:
    """(submit, elapsed, GPUs, limit in seconds or None) of one sacct job, else why it is not
    replayed (one of SKIP_REASONS)."""
    if isinstance(j.get("job_id"), str) and _STEP_ID.fullmatch(j["job_id"].strip()):
        return "steps"  # a step's row (123.batch): its job has a row of its own
    t = j.get("time") if isinstance(j.get("time"), dict) else {}
    try:
        job = parse_job(j)  # the one sacct parser: a shard job counts as one GPU
    except RECORD_ERRORS:  # as parse_sacct_json skips them
        return ("impossible times" if _impossible(_time(t.get("submission")), _time(t.get("elapsed")))
                else "unreadable")
    gpus = job["gpus"] or (1 if job["shards"] else 0)
    if gpus < 1:
        return "without GPUs"
    if (job.get("state") or "").split()[:1] in UNENDED:
        return "not ended"  # a running job's elapsed time is only so far
    submit, elapsed = _time(job["submit_time"]), _time(job["elapsed_s"])
    if submit is None or elapsed is None:
        return "without times"
    if _impossible(submit, elapsed):
        return "impossible times"
    lim = num(t.get("limit"))  # minutes; NO_VAL, INFINITE (or above: no uint32) are none given
    lim = _time(lim) if lim is None or lim < UNSET_TIME else None
    # a limit that is no finite positive number counts as none given (documented)
    lim = lim * 60.0 if lim is not None and math.isfinite(lim) and lim > 0 else None
    return submit, elapsed, int(gpus), lim


def _cap(n: int, what: str) -> None:
    """A replay is simulated in memory as a generated trace is: at most MAX_TRACE_JOBS jobs."""
    if n > MAX_TRACE_JOBS:
        raise HorusError(f"{what}: {n:,} jobs to replay, at most {MAX_TRACE_JOBS:,} (replay a "
                         "shorter period)")


def skip_summary(report: Mapping[str, Any]) -> str:
    """'5 steps (123.batch), 4 without times (5), ...': the rows a from_sacct_json report says
    were skipped, per reason, with a job id of each."""
    return ", ".join(f"{n:,} {why}" + (f" ({report['examples'][why]})" if why in report.get("examples", {}) else "")
                     for why, n in report.get("skipped", {}).items())


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
        if (any(v is None for v in vals) or not j["elapsed_s"]
                or not _sane_times(vals[0], vals[1])):
            continue  # no measurement, or times no job had (as from_sacct_json skips them)
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


def _sane_times(submit: Any, elapsed: Any) -> bool:
    """A ledger row's submit time within 1970..2100 and its elapsed time within 0..a year
    (MAX_ELAPSED_S); a value that is no number is for _parse_rows to name."""
    try:
        return 0 <= float(submit) <= MAX_EPOCH_S and 0 < float(elapsed) <= MAX_ELAPSED_S
    except (TypeError, ValueError, OverflowError):
        return True


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
        if lim is not None and lim >= UNSET_TIME * 60.0:
            lim = None  # Slurm's NO_VAL and INFINITE minutes (or above): none given, as in sacct's
        if vals["submit_time"] > MAX_EPOCH_S or vals["elapsed_s"] > MAX_ELAPSED_S:
            raise HorusError(f"row {n}: need submit_time up to 4102444800 (2100) and elapsed_s up to "
                             f"{MAX_ELAPSED_S:,.0f} (366 days)")
        if vals["elapsed_s"] <= 0 or vals["gpus"] < 1 or min(vals.values()) < 0:
            raise HorusError(f"row {n}: need elapsed_s > 0, gpus >= 1 and no negative value")
        if isinstance(r["gpus"], bool) or not vals["gpus"].is_integer():
            raise HorusError(f"row {n}: gpus must be a whole number")  # 2.5 had run as 2, true as 1
        if max(vals["pred_mem"], vals["true_mem"], p90) > MAX_GPU_MEM_MIB:
            # no GPU holds more; beyond the hint's bound it had failed in the hook, naming no row
            raise HorusError(f"row {n}: pred_mem, pred_mem_p90 and true_mem must be at most "
                             f"{MAX_GPU_MEM_MIB:,} MiB")
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
    _cap(len(parsed), "ledger rows")
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
