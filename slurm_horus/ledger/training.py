"""The ledger's measured jobs as the learned model's training rows (and the stored cold-start
figures each job was predicted with), for retrain and the history export.

Only what serving saw goes in: the features stored at submission, sync or import and the cold
start stored with them, never one recomputed here (from stored features alone the graph's nodes
are gone, and training must see the inputs serving saw). Failed measurements
(ledger.failed_measurement) are counted and left out. A run that shared its GPU (``colocated``)
gives its memory but not its utilization (NaN in ``util``; counted in ``util_left_out``): NVML
measured its share of the GPU beside the other jobs, not what it needs alone (the history
export and the simulator take the same rule).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from sqlalchemy import and_, or_, select

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION, QUANTIZED_NAMES
from slurm_horus.ledger import tables
from slurm_horus.predict.coldstart import Prediction
from slurm_horus.predict.gpus import default_catalog
from slurm_horus.predict.learned import input_row
from slurm_horus.predict.workload import workload_from


@dataclass
class TrainingSet:
    keys: list = field(default_factory=list)       # "cluster/job_id" of each row
    graphs: list = field(default_factory=list)     # each row's architecture (architecture())
    users: list = field(default_factory=list)      # the user Slurm ran it for (None: an import's)
    X: list = field(default_factory=list)
    mem: list = field(default_factory=list)
    util: list = field(default_factory=list)
    cold_mem: list = field(default_factory=list)
    cold_util: list = field(default_factory=list)
    gpu_types: list = field(default_factory=list)
    skipped: int = 0
    failed: int = 0    # failed measurements, excluded
    util_left_out: int = 0  # co-located runs: their memory in, their utilization NaN


def stored_cold(c: dict | None, gpu) -> Prediction:
    """The cold-start prediction a job was served with, from the figures stored beside its
    prediction for a GPU type ({"mem_mib", "util_pct", "gpu_ms_per_step", "host_ms_per_step"});
    ValueError when they are not there, or not finite figures in range."""
    if not (isinstance(c, dict) and c.get("mem_mib") and c.get("util_pct") is not None):
        raise ValueError("no cold-start figures stored")
    mem, util = float(c["mem_mib"]), float(c["util_pct"])
    times = [float(c.get(k) or 0) for k in ("gpu_ms_per_step", "host_ms_per_step")]
    # (NaN or infinity, which JSON takes, in one stored row had stopped every retrain)
    if not (0 < mem < math.inf and 0 <= util <= 100 and all(0 <= t < math.inf for t in times)):
        raise ValueError("cold-start figures out of range")
    return Prediction(gpu=gpu.name, util_pct=util, mem_mib=mem, mem_mib_p90=mem,
                      predictor="cold-start",
                      breakdown={"gpu_ms_per_step": times[0], "host_ms_per_step": times[1]})


def feature_values(values) -> dict | None:
    """Every feature as a finite float, or None (the row trains nothing; a history run keeps its
    measurement, not its features): the learned model reads them all, and a NaN or infinity
    (JSON takes both) in one row had stopped every retrain; and a quantized graph's
    QUANTIZED_NAMES, which its cold start reads (a row stored before them has none: 0)."""
    if not isinstance(values, dict):
        return None
    try:
        out = {n: float(values[n]) for n in FEATURE_NAMES}
        out.update((n, float(values[n])) for n in QUANTIZED_NAMES if n in values)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return out if all(math.isfinite(v) for v in out.values()) else None


def architecture(values: dict) -> int:
    """What names a row's architecture for cross-validation: its trainable parameter count,
    which a batch size, a renaming, a byte edit of the file or a re-export by the same exporter
    does not change (folds by sha256 had scored a model on copies of graphs it trained on, and
    promoted a worse one).
    Two architectures of one size share a fold, which only makes the scores stricter."""
    return int(values["params"])


def training_units(users: list, X) -> tuple[np.ndarray, np.ndarray]:
    """(each row's unit, each unit's first row): one user's runs at one setting (the same input
    row: graph, batch, GPU type, workload, CPUs and the cold-start figures stored with it) are
    one unit, trained on as one row of their median measurements, so a user's reruns count once
    against the site's other users (one user's 200 runs had set the learned answer against four
    users who ran the same graph). Rows of no user (an admin's import) are a unit each."""
    seen: dict = {}
    unit = np.fromiter((seen.setdefault((u if u is not None else ("row", i), row.tobytes()), len(seen))
                        for i, (u, row) in enumerate(zip(users, np.asarray(X, dtype=float)))),
                       int, len(users))
    first = np.full(len(seen), len(users))
    np.minimum.at(first, unit, np.arange(len(users)))
    return unit, first


def unit_medians(unit, values) -> np.ndarray:
    """The median of ``values`` over each unit's rows (training_units), by unit; NaN values (a
    co-located run's utilization) are not measurements: the median of the others, NaN for a unit
    of none."""
    order = np.argsort(unit, kind="stable")
    v = np.asarray(values, dtype=float)[order]
    bounds = np.flatnonzero(np.r_[True, np.diff(unit[order]) != 0, True])  # unit k: k-th slice
    out = v[bounds[:-1]]  # a unit of one row: its own value
    for k in np.flatnonzero(np.diff(bounds) > 1):
        part = v[bounds[k]:bounds[k + 1]]
        part = part[~np.isnan(part)]
        out[k] = np.median(part) if len(part) else np.nan
    return out


def completed_run(jobs):
    """The SQL condition for a run whose measurement can teach: Slurm says it COMPLETED (a
    cancelled, failed, preempted or timed-out run may have stopped before its peak), or an
    admin's import (no state)."""
    return or_(jobs.c.state.is_(None), jobs.c.state.like("COMPLETED%"))


# what reading a ledger row's JSON can raise, where only a tampered ledger has such a row: the
# wrong kind (a list for an object: AttributeError), numbers past a float (1e400:
# OverflowError), nesting past the parser (RecursionError); the row is skipped and counted
ROW_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError, HorusError)


def stored_workload(d: dict | None, gpus: int | None, shards: int | None) -> dict | None:
    """A submissions row's workload as workload_from reads it.  One synced before the CPU input
    was CPUs per GPU holds the job's allocated CPUs as ``cpus_per_task``: with the GPUs its jobs
    row says Slurm allocated (one for a job on shards) it gives the same CPUs per GPU."""
    if not isinstance(d, dict) or "cpus_per_task" not in d or "cpus" in d or "cpus_per_gpu" in d:
        return d
    return {**d, "cpus": d["cpus_per_task"], "gpus": gpus or (1 if shards else None)}


def training_set(ledger) -> TrainingSet:
    """Rows of measured jobs (memory known, and utilization unless the run shared its GPU; not a
    failed measurement) with features and the cold-start figures they were predicted with.  A
    co-located run's utilization is NaN: its memory teaches, its utilization does not."""
    t = tables()
    s, j = t["submissions"], t["jobs"]
    stmt = (select(j.c.cluster, j.c.job_id, s.c.features, s.c.workload, s.c.predictions,
                   s.c.feature_version, j.c.gpu_type, j.c.act_util_pct, j.c.act_mem_mib,
                   j.c.failed_measurement, j.c.user_name, j.c.gpus, j.c.shards, j.c.colocated)
            .join(j, and_(j.c.cluster == s.c.cluster, j.c.job_id == s.c.job_id))
            .where(or_(j.c.act_util_pct.isnot(None), j.c.colocated.isnot(None)),
                   j.c.act_mem_mib > 0, s.c.features.isnot(None),
                   j.c.gpu_type.isnot(None), completed_run(j))
            .order_by(j.c.cluster, j.c.job_id))
    catalog = default_catalog()
    gpus: dict = {}
    ts = TrainingSet()
    with ledger.engine.connect() as conn:
        for cluster, job_id, feats, wl, preds, fv, gtype, util, mem, failed, user, n_gpus, n_shards, \
                coloc in conn.execute(stmt):
            if failed:
                ts.failed += 1
                continue
            try:
                if fv is not None and int(fv) != FEATURE_VERSION:
                    raise ValueError("feature version")
                values = feature_values(json.loads(feats))
                if values is None:
                    raise ValueError("features")
                if gtype not in gpus:
                    gpus[gtype] = catalog.find(gtype)
                gpu = gpus[gtype]
                if gpu is None:
                    raise ValueError("gpu")
                w = workload_from(stored_workload(json.loads(wl) if wl else None, n_gpus, n_shards))
                pred = (json.loads(preds) if preds else {}).get(gtype)
                cold = stored_cold(pred.get("cold") if isinstance(pred, dict) else None, gpu)
                arch = architecture(values)
                ts.X.append(input_row(values, gpu, w, cold))
            except ROW_ERRORS:
                ts.skipped += 1
                continue
            ts.keys.append(f"{cluster}/{int(job_id)}")
            ts.graphs.append(arch)
            ts.users.append(user)
            ts.mem.append(float(mem))
            if coloc or util is None:  # shared its GPU: NVML measured its share, not its need
                ts.util.append(float("nan"))
                ts.util_left_out += 1
            else:
                ts.util.append(min(max(float(util), 0.0), 100.0))
            ts.cold_mem.append(cold.mem_mib)
            ts.cold_util.append(cold.util_pct)
            ts.gpu_types.append(gpu.name)
    return ts
