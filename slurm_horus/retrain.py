"""horus-admin retrain / import: train the learned predictor on the ledger's measured jobs.

5-fold cross-validation gives out-of-fold predictions for every row; the serving model (or the
cold-start estimator when none serves) is scored on the very same rows, and the new model is
promoted only when its score (memory median |relative error| as a fraction + utilization RMSLE)
is lower, unless forced. Every trained model is kept in the Registry and in predictor_versions.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass

from .errors import HorusError

IMPORT_COLUMNS = ("model", "features", "gpu_type", "batch_size", "task", "optimizer", "precision",
                  "cpus_per_task", "util_pct", "mem_mib", "util_max_pct", "user", "model_family",
                  "cold_util_pct", "cold_mem_mib", "cold_gpu_ms", "cold_host_ms")


def score(m: dict) -> float:
    return m["mem_mdape_pct"] / 100.0 + m["util_rmsle"]


@dataclass
class TrainingSet:
    X: list
    mem: list
    util: list
    cold_mem: list
    cold_util: list
    skipped: int = 0


def _report(values: dict):
    from .features import FeatureReport

    return FeatureReport(model="", sha256="", values=values, nodes=[], by_op={}, unknown_ops=[],
                         unknown_dims=[], bound_dims={})


def _cold(pred: dict | None, values: dict, gpu, w):
    """The cold-start prediction a row was (or would have been) made with."""
    from .coldstart import ColdStartEstimator, Prediction

    c = (pred or {}).get("cold") if isinstance(pred, dict) else None
    if isinstance(c, dict) and c.get("mem_mib") and c.get("util_pct") is not None:
        return Prediction(gpu=gpu.name, util_pct=float(c["util_pct"]), mem_mib=float(c["mem_mib"]),
                          mem_mib_p90=float(c["mem_mib"]), predictor="cold-start",
                          breakdown={"gpu_ms_per_step": float(c.get("gpu_ms_per_step") or 0),
                                     "host_ms_per_step": float(c.get("host_ms_per_step") or 0)})
    return ColdStartEstimator().predict(_report(values), gpu, w)


def _workload(d: dict | None):
    from .coldstart import Workload

    d = d or {}
    return Workload(batch_size=int(d.get("batch_size") or 1), task=d.get("task") or "train",
                    optimizer=d.get("optimizer") or "adam",
                    precision=d.get("precision") or "fp32",
                    cpus_per_task=int(d["cpus_per_task"]) if d.get("cpus_per_task") else None)


def training_set(ledger) -> TrainingSet:
    """Rows of measured jobs (utilization and memory both known) with features."""
    from sqlalchemy import and_, select

    from .features import FEATURE_NAMES, FEATURE_VERSION
    from .gpus import default_catalog
    from .learned import input_row
    from .ledger import tables

    t = tables()
    s, j = t["submissions"], t["jobs"]
    stmt = (select(s.c.features, s.c.workload, s.c.predictions, s.c.feature_version, j.c.gpu_type,
                   j.c.act_util_pct, j.c.act_mem_mib)
            .join(j, and_(j.c.cluster == s.c.cluster, j.c.job_id == s.c.job_id))
            .where(j.c.act_util_pct.isnot(None), j.c.act_mem_mib > 0, s.c.features.isnot(None),
                   j.c.gpu_type.isnot(None)))
    catalog = default_catalog()
    gpus: dict = {}
    ts = TrainingSet([], [], [], [], [])
    with ledger.engine.connect() as conn:
        result = conn.execute(stmt)
        for feats, wl, preds, fv, gtype, util, mem in result:
            try:
                if fv is not None and int(fv) != FEATURE_VERSION:
                    raise ValueError("feature version")
                values = json.loads(feats)
                if any(n not in values for n in FEATURE_NAMES):
                    raise ValueError("features")
                if gtype not in gpus:
                    gpus[gtype] = catalog.find(gtype)
                gpu = gpus[gtype]
                if gpu is None:
                    raise ValueError("gpu")
                w = _workload(json.loads(wl) if wl else None)
                p = (json.loads(preds) if preds else {}).get(gtype)
                cold = _cold(p, values, gpu, w)
                ts.X.append(input_row(values, gpu, w, cold))
                ts.mem.append(float(mem))
                ts.util.append(min(max(float(util), 0.0), 100.0))
                ts.cold_mem.append(cold.mem_mib)
                ts.cold_util.append(cold.util_pct)
            except (ValueError, TypeError, KeyError, HorusError):
                ts.skipped += 1
    return ts


def _baseline_predict(model, X, cold_mem, cold_util):
    """What the serving predictor says for rows X: learned where familiar, else cold-start."""
    import numpy as np

    X = np.asarray(X, float)
    pm, pu = np.asarray(cold_mem, float).copy(), np.asarray(cold_util, float).copy()
    if model is None:
        return pm, pu
    from .learned import input_names

    names = input_names()
    ok = np.ones(len(X), bool)
    from .learned import RANGE_MARGIN

    for name, (lo, hi) in model.ranges.items():
        col = X[:, names.index(name)]
        ok &= (col >= lo - RANGE_MARGIN) & (col <= hi + RANGE_MARGIN)
    if ok.any():
        pm[ok] = pm[ok] * np.exp(model.mem.predict(X[ok]))
        pu[ok] = np.clip(np.expm1(model.util.predict(X[ok])), 0, 100)
    return pm, pu


def retrain(ledger, registry, *, folds: int = 5, force: bool = False, seed: int = 0,
            max_iter: int = 200, progress: bool = False, log=print) -> dict:
    """Train, cross-validate, compare with the serving model, store, maybe promote."""
    import numpy as np

    from .learned import accuracy, fit

    ts = training_set(ledger)
    n = len(ts.X)
    if n < max(20, folds * 4):
        raise HorusError(f"need at least {max(20, folds * 4)} measured jobs with features to "
                         f"train, the ledger has {n}" + (f" ({ts.skipped} unusable)" if ts.skipped else ""))
    X = np.asarray(ts.X, float)
    mem, util = np.asarray(ts.mem, float), np.asarray(ts.util, float)
    cmem, cutil = np.asarray(ts.cold_mem, float), np.asarray(ts.cold_util, float)
    serving_version = registry.serving()
    serving = None
    if serving_version:
        try:
            serving = registry.load(serving_version)
        except HorusError as e:
            log(f"serving model {serving_version} unusable ({e}); comparing with cold-start")
            serving_version = None
    order = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(order, folds)
    oof_mem, oof_util = np.zeros(n), np.zeros(n)
    base_mem, base_util = _baseline_predict(serving, X, cmem, cutil)

    steps = folds + 1
    bar = _Progress(progress, steps, "retrain")
    with bar:
        for k, test in enumerate(parts):
            train = np.setdiff1d(order, test, assume_unique=True)
            m = fit(X[train], mem[train], util[train], cmem[train], seed=seed, max_iter=max_iter)
            oof_mem[test] = cmem[test] * np.exp(m.mem.predict(X[test]))
            oof_util[test] = np.clip(np.expm1(m.util.predict(X[test])), 0, 100)
            bar.advance(f"fold {k + 1}/{folds}")
        new = accuracy(oof_mem, mem, oof_util, util)
        old = accuracy(base_mem, mem, base_util, util)
        model = fit(X, mem, util, cmem, seed=seed, max_iter=max_iter)
        bar.advance("final fit")
    model.metrics = {**new, "cv_folds": folds}
    model.mem_log_q90 = float(np.quantile(np.log(mem / oof_mem), 0.9))
    model.meta.update({"rows": n, "cv_folds": folds, "baseline": serving_version or "cold-start",
                       "baseline_metrics": old, "source": "horus-admin retrain"})
    better = score(new) < score(old)
    version = registry.add(model)
    promoted = better or force
    if promoted:
        registry.promote(version)
    ledger.record_predictor_version(version, {"cv": new, "baseline": old,
                                              "baseline_version": serving_version or "cold-start",
                                              "score": score(new), "baseline_score": score(old),
                                              "forced": bool(force and not better)}, n, promoted)
    return {"version": version, "rows": n, "skipped": ts.skipped, "cv": new, "baseline": old,
            "baseline_version": serving_version or "cold-start", "better": better,
            "promoted": promoted}


class _Progress:
    """A rich progress bar on a terminal; silent otherwise."""

    def __init__(self, enabled: bool, total: int, title: str):
        self.enabled, self.total, self.title = enabled, total, title
        self.p = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.p = Progress(TextColumn("{task.description}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
            self.p.__enter__()
            self.task = self.p.add_task(self.title, total=self.total)
        return self

    def advance(self, what: str):
        if self.p:
            self.p.update(self.task, advance=1, description=f"{self.title}: {what}")

    def __exit__(self, *exc):
        if self.p:
            self.p.__exit__(*exc)


# --------------------------------------------------------------------------- import

def _row_id(row: dict) -> int:
    h = hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()
    return int(h[:12], 16)


def import_csv(ledger, path: str, *, cluster: str = "import") -> dict:
    """Load measurements (see IMPORT_COLUMNS / docs/ledger.md) as submissions + usage 'import'."""
    from .coldstart import Workload
    from .features import FEATURE_NAMES, FEATURE_VERSION
    from .gpus import default_catalog

    try:
        f = open(path, newline="")
    except OSError as e:
        raise HorusError(f"{path}: {e.strerror}") from None
    catalog = default_catalog()
    subs, usages = [], []
    reports: dict = {}
    with f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise HorusError(f"{path}: empty CSV")
        missing = {"gpu_type", "util_pct", "mem_mib"} - set(reader.fieldnames)
        if missing or not ({"model", "features"} & set(reader.fieldnames)):
            raise HorusError(f"{path}: needs columns gpu_type, util_pct, mem_mib and model or "
                             f"features (missing: {', '.join(sorted(missing)) or 'model/features'})")
        for line, row in enumerate(reader, 2):
            where = f"{path}:{line}"
            try:
                gpu = catalog.find((row.get("gpu_type") or "").strip())
                if gpu is None:
                    raise HorusError(f"unknown GPU type {row.get('gpu_type')!r}")
                w = Workload(batch_size=int(row.get("batch_size") or 1),
                             task=(row.get("task") or "train").strip(),
                             optimizer=(row.get("optimizer") or "adam").strip(),
                             precision=(row.get("precision") or "fp32").strip(),
                             cpus_per_task=int(row["cpus_per_task"]) if row.get("cpus_per_task") else None)
                util, mem = float(row["util_pct"]), float(row["mem_mib"])
                if not (0 <= util <= 100) or not (mem > 0) or math.isnan(mem):
                    raise HorusError("util_pct must be 0..100 and mem_mib > 0")
                model = (row.get("model") or "").strip()
                report = None
                if row.get("features"):
                    values = json.loads(row["features"])
                    if not isinstance(values, dict) or any(n not in values for n in FEATURE_NAMES):
                        raise HorusError("features JSON lacks some of the feature names")
                elif model:
                    key = (model, w.batch_size)
                    if key not in reports:
                        from .features import extract_features

                        reports[key] = extract_features(model, batch_size=w.batch_size)
                    report = reports[key]
                    values = report.values
                else:
                    raise HorusError("needs model or features")
                from .coldstart import ColdStartEstimator

                if row.get("cold_util_pct") and row.get("cold_mem_mib"):
                    cold = {"util_pct": float(row["cold_util_pct"]),
                            "mem_mib": float(row["cold_mem_mib"]),
                            "gpu_ms_per_step": float(row.get("cold_gpu_ms") or 0),
                            "host_ms_per_step": float(row.get("cold_host_ms") or 0)}
                else:
                    c = ColdStartEstimator().predict(report or _report(values), gpu, w)
                    cold = {"util_pct": c.util_pct, "mem_mib": c.mem_mib,
                            "gpu_ms_per_step": c.breakdown.get("gpu_ms_per_step", 0.0),
                            "host_ms_per_step": c.breakdown.get("host_ms_per_step", 0.0)}
            except HorusError as e:
                raise HorusError(f"{where}: {e}") from None
            except (ValueError, TypeError, KeyError) as e:
                raise HorusError(f"{where}: bad value ({e})") from None
            except Exception as e:
                raise HorusError(f"{where}: {type(e).__name__}: {e}") from None
            jid = _row_id(row)
            gname = gpu.name
            subs.append({"job_id": jid, "cluster": cluster, "user": row.get("user") or None,
                         "model_path": model or None,
                         "model_family": row.get("model_family") or None,
                         "feature_version": FEATURE_VERSION, "features": values,
                         "workload": {"batch_size": w.batch_size, "task": w.task,
                                      "optimizer": w.optimizer, "precision": w.precision,
                                      "cpus_per_task": w.cpus_per_task},
                         "gpu_types": [gname], "predictor": "cold-start",
                         "predictions": {gname: {"util_pct": cold["util_pct"],
                                                 "mem_mib": cold["mem_mib"],
                                                 "predictor": "cold-start", "cold": cold}}})
            usages.append({"job_id": jid, "cluster": cluster, "source": "import",
                           "util_mean": util, "mem_peak_mib": mem, "gpu_type": gname,
                           "util_max": float(row["util_max_pct"]) if row.get("util_max_pct") else None})
    ledger.record_submissions(subs)
    ledger.record_usages(usages)
    return {"rows": len(subs)}
