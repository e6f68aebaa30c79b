"""horus-admin retrain / import: train the learned predictor on the ledger's measured jobs.

Honest promotion: the candidate and the serving model are scored on the same rows, and neither
was trained on them. Those rows are the measured jobs the serving model never saw (its training
rows are listed in the registry's ``rows-<version>.json``); the candidate's predictions on them
are out-of-fold (5-fold cross-validation over every row). With no serving model, the cold-start
estimator (never trained on site data) is the baseline on every row. The candidate is promoted
only when its score (memory median |relative error| as a fraction + utilization RMSLE, each
user's jobs weighing one user: user_weights; memory alone where no scored job's utilization is
known: beats) is lower, unless forced. Every trained model is kept in the Registry and in
predictor_versions.  A fold whose training jobs include none that had its GPU alone (every such
job is of the fold's own architectures) answers utilization with the cold start's; its memory
model is learned.

Bounds: held-out residuals of each predictor source (cold-start, learned) per GPU type give
split-conformal quantiles, written to the registry's ``calibration.json`` and each learned
version's own to ``calibration-<version>.json`` (docs/definitions.md).
Failed measurements (ledger.failed_measurement) train and score nothing.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from collections import Counter

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.textfile import read_text
from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION, extract_features
from slurm_horus.ledger import failed_measurement
from slurm_horus.ledger.history_export import file_sha256
from slurm_horus.ledger.training import training_set, training_units, unit_medians
from slurm_horus.predict.coldstart import ColdStartEstimator, ColdStartParams
from slurm_horus.predict.gpus import BARE_CONTEXT_MIB, default_catalog
from slurm_horus.predict.chain import MEM_LOG_Q_BOUNDS
from slurm_horus.predict.learned import MAX_MEM_RATIO, MIN_TRAIN_ROWS, accuracy, fit, mem_in_bounds
from slurm_horus.predict.registry import CALIBRATION_FILE, calibration_file
from slurm_horus.predict.workload import workload_dict, workload_from
from slurm_horus.progress import Progress

IMPORT_COLUMNS = ("model", "features", "gpu_type", "batch_size", "task", "optimizer", "precision",
                  "cpus_per_gpu", "util_pct", "mem_mib", "util_max_pct", "user", "model_family",
                  "cold_util_pct", "cold_mem_mib", "cold_gpu_ms", "cold_host_ms")
QUANTILES = (0.9, 0.95, 0.99)
MIN_EVAL_ROWS = 10      # rows unseen by both needed to judge a candidate against the serving model
CALIBRATION_VERSION = 1
# how a kept model's held-out jobs were chosen: by architecture (earlier files: by job, reruns of
# its own settings among them, whose narrow bounds must not outlive the change)
HELD_OUT_RULE = "architecture"


def score(m: dict, util: bool = True) -> float:
    """The promotion score of accuracy() figures (lower is better): memory median |relative
    error| as a fraction, plus the utilization RMSLE where ``util`` and it was measured (None:
    no scored job's utilization is known, each shared its GPU), else memory alone."""
    rmsle = m.get("util_rmsle")
    return m["mem_mdape_pct"] / 100.0 + (rmsle if util and rmsle is not None else 0.0)


def util_scored(new: dict, old: dict) -> bool:
    """Whether a candidate's and a baseline's scores include utilization: only where both
    measured it."""
    return new.get("util_rmsle") is not None and old.get("util_rmsle") is not None


def beats(new: dict, old: dict) -> bool:
    """Whether the candidate's figures ``new`` score lower than the baseline's ``old`` (both
    from the same jobs).  The rule: memory median |relative error| (a fraction) + utilization
    RMSLE where both have a utilization figure; where either lacks one (no scored job's
    utilization is known: every one shared its GPU), on memory alone: a missing figure counts
    as neither 0 (a perfect score) nor a loss."""
    util = util_scored(new, old)
    return score(new, util) < score(old, util)


def conformal_quantile(residuals, q: float) -> float | None:
    """Split-conformal quantile: the ceil((n+1) q)-th smallest residual, so that a new residual
    from the same distribution is at most it with probability >= q; None when n is too small
    for that rank to exist (n < ceil((n+1) q))."""
    r = sorted(float(x) for x in residuals)
    k = math.ceil((len(r) + 1) * q)
    return r[k - 1] if 1 <= k <= len(r) else None


def calibration_entry(actual_mem, pred_mem, actual_util, pred_util) -> dict:
    """{"mem_log_q": {q: ..}, "util_q": {q: ..}, "n": N} of one group's held-out residuals:
    log(actual / predicted) memory and actual - predicted utilization (pp), the latter of the
    jobs whose utilization is known (NaN: a run that shared its GPU)."""
    mem_r = [math.log(a / p) for a, p in zip(actual_mem, pred_mem)]
    util_r = [a - p for a, p in zip(actual_util, pred_util) if not math.isnan(a)]
    out: dict = {"mem_log_q": {}, "util_q": {}, "n": len(mem_r)}
    lo, hi = MEM_LOG_Q_BOUNDS
    for q in QUANTILES:
        m, u = conformal_quantile(mem_r, q), conformal_quantile(util_r, q)
        if m is not None:
            # clamped to what Calibration reads, which refuses the whole file past it: a dozen
            # jobs at 25x the cold start had taken every calibrated bound away; clamped, not
            # dropped, the bound stays the widest the reader takes (dropped: the predictor's own)
            out["mem_log_q"][str(q)] = round(min(max(m, lo), hi), 6)
            if u is not None:
                out["util_q"][str(q)] = round(u, 4)
    return out


def calibrate(gpu_types, sources: dict) -> dict:
    """calibration.json's "quantiles": per GPU type (and "*" for all) and predictor source,
    from held-out predictions ``sources`` = {source: (rows, actual_mem, pred_mem, actual_util,
    pred_util)} (rows: indices into gpu_types). Groups whose rows give no p90 are left out."""
    out: dict = {}
    for source, (rows, am, pm, au, pu) in sources.items():
        by_type: dict = {"*": list(range(len(rows)))}
        for k, i in enumerate(rows):
            by_type.setdefault(gpu_types[i], []).append(k)
        for gtype, ks in by_type.items():
            e = calibration_entry([am[k] for k in ks], [pm[k] for k in ks],
                                  [au[k] for k in ks], [pu[k] for k in ks])
            if e["mem_log_q"]:
                out.setdefault(gtype, {})[source] = e
    return out


def user_weights(users: list) -> np.ndarray:
    """Each user's jobs share one unit of weight in the promotion score (an import's rows, the
    admin's, one each): the models are compared for the site's users, and one user's 200 reruns
    of a setting had decided which model served everyone (training, too, counts a user's runs at
    one setting once: training_units)."""
    counts = Counter(u for u in users if u is not None)
    return np.array([1.0 / counts[u] if u is not None else 1.0 for u in users])


def trained_rows(registry, version: str) -> tuple[set, set | None] | None:
    """(the row keys, the architectures) ``version`` was trained on (rows-<version>.json; the
    architectures None in a file of before they were recorded), None when unrecorded."""
    try:
        rec = registry.load_json(f"rows-{version}.json")
        graphs = rec.get("graphs")
        if graphs is not None and not (isinstance(graphs, list) and all(
                isinstance(g, int) and not isinstance(g, bool) for g in graphs)):
            graphs = None  # not what retrain writes: as if unrecorded
        return set(rec["keys"]), None if graphs is None else set(graphs)
    except (HorusError, KeyError, TypeError, ValueError, AttributeError):
        return None


def graph_folds(graphs: list, folds: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(every row, the rows of each fold) with each architecture's runs in one fold
    (training.architecture): a model scored on reruns of graphs it trained on looked better
    than the cold start and was promoted while worse on new graphs (its p90 covered 62 % of
    them, not 90 %)."""
    ids = {g: i for i, g in enumerate(dict.fromkeys(graphs))}
    if len(ids) < 2:
        raise HorusError(f"need runs of at least 2 architectures (graphs of different sizes) to cross-validate, the ledger has {len(ids)}")
    folds = min(folds, len(ids))
    of_graph = np.empty(len(ids), int)
    of_graph[np.random.default_rng(seed).permutation(len(ids))] = np.arange(len(ids)) % folds
    fold = of_graph[[ids[g] for g in graphs]]
    parts = [np.flatnonzero(fold == k) for k in range(folds)]
    smallest = len(graphs) - max(len(p) for p in parts)
    if smallest < MIN_TRAIN_ROWS:
        raise HorusError(f"need more measured jobs: a cross-validation fold would train on "
                         f"{smallest} settings (a user's runs of one setting count once; at "
                         f"least {MIN_TRAIN_ROWS})")
    return np.arange(len(graphs)), parts


def retrain(ledger, registry, *, folds: int = 5, force: bool = False, seed: int = 0,
            max_iter: int = 200, progress: bool = False, log=print) -> dict:
    """Train, cross-validate, compare with the serving model on rows neither was trained on,
    store, maybe promote, and write the calibration of the predictor that now serves; under
    the registry's lock, so that what serves cannot change meanwhile."""
    registry.check_writable()
    with registry.lock():
        return _retrain(ledger, registry, folds=folds, force=force, seed=seed, max_iter=max_iter,
                        progress=progress, log=log)


def _retrain(ledger, registry, *, folds, force, seed, max_iter, progress, log) -> dict:
    ledger.check_writable()
    ts = training_set(ledger)
    n = len(ts.X)
    if n < max(20, folds * 4):
        unusable = ", ".join(f"{c} {w}" for c, w in ((ts.skipped, "unusable"),
                                                      (ts.failed, "failed measurements")) if c)
        raise HorusError(f"need at least {max(20, folds * 4)} measured jobs with features to "
                         f"train, the ledger has {n}" + (f" ({unusable})" if unusable else ""))
    X = np.asarray(ts.X, float)
    mem, util = np.asarray(ts.mem, float), np.asarray(ts.util, float)
    cmem, cutil = np.asarray(ts.cold_mem, float), np.asarray(ts.cold_util, float)
    # trained on units (a user's runs at one setting, their medians), scored on every job
    unit, first = training_units(ts.users, X)
    Xu, umem, uutil, ucmem = X[first], unit_medians(unit, mem), unit_medians(unit, util), cmem[first]
    left_out = int((~mem_in_bounds(umem, ucmem))[unit].sum())  # by fit(): its jobs, counted
    if ts.util_left_out:
        log(f"{ts.util_left_out} of {n} jobs shared their GPU: their memory trains, their "
            "utilization (their share of the GPU, not their need) does not")
    if left_out:
        log(f"{left_out} of {n} jobs left out of the memory model's training: measured beyond "
            f"{MAX_MEM_RATIO:g}x of the cold-start estimate, further than a learned answer may "
            "go (a framework preallocating GPU memory, as JAX and TensorFlow do?)")
    serving_version = registry.serving()
    serving = seen = None
    if serving_version:
        try:
            serving = registry.load(serving_version)
        except HorusError as e:
            log(f"serving model {serving_version} unusable ({e}); comparing with cold-start")
            serving_version = None
    if serving is not None:
        seen = trained_rows(registry, serving_version)
        if seen is None:
            log(f"serving model {serving_version} has no record of its training rows "
                f"(rows-{serving_version}.json): no row is known to be unseen by it")
        elif seen[1] is None:
            log(f"serving model {serving_version} has no record of its training architectures "
                f"(rows-{serving_version}.json of before they were kept): it is judged on rows it "
                "did not train on, reruns of its graphs among them")
    order, parts = graph_folds([ts.graphs[i] for i in first], folds, seed)
    folds = len(parts)  # fewer than asked where there are fewer graphs
    oof_mem, oof_util = np.zeros(n), np.zeros(n)
    oof_learned = np.zeros(n, bool)  # the fold's learned model answered (not the cold start)
    oof_util_learned = np.zeros(n, bool)  # and its utilization too (its fold had a util model)
    cold_util_folds = []
    with Progress("retrain", folds + 1, enabled=progress) as bar:
        for k, test_units in enumerate(parts):
            train = np.setdiff1d(order, test_units, assume_unique=True)
            # where every run that had its GPU alone is of this fold's architectures, its
            # training rows teach no utilization (the whole retrain had failed): its answers are
            # what serves without a learned one, the cold start's, its memory model learned
            m = fit(Xu[train], umem[train], uutil[train], ucmem[train], seed=seed,
                    max_iter=max_iter, need_util=False)
            if m.util is None:
                cold_util_folds.append(k + 1)
                log(f"fold {k + 1}/{folds}: none of its {len(train)} training settings had its "
                    "GPU alone (every such run is of its own held-out architectures): its "
                    "utilization answers are the cold start's, its memory model is learned")
            # every job of the held-out units, through the gate that serves
            # (LearnedModel.answer): scored as it would answer
            test = np.flatnonzero(np.isin(unit, test_units))
            oof_mem[test], oof_util[test], why = m.answer(X[test], cmem[test], cutil[test])
            oof_learned[test] = why == ""
            oof_util_learned[test] = (why == "") & (m.util is not None)
            bar.advance(f"fold {k + 1}/{folds}")
        model = fit(Xu, umem, uutil, ucmem, seed=seed, max_iter=max_iter)
        bar.advance("final fit")
    if serving is None:
        held = np.arange(n)
        base_mem, base_util = cmem, cutil
    else:
        # held out from it as the candidate's folds are: a job of an architecture it trained
        # on is no test of it (a user's rerun at the same setting scored it in-sample, and its
        # calibration then covered 70 % of new jobs at its p90)
        keys, graphs = seen if seen is not None else (None, None)
        held = np.array([i for i, key in enumerate(ts.keys) if keys is not None and key not in keys
                         and (graphs is None or ts.graphs[i] not in graphs)], int)
        base_mem, base_util, base_why = serving.answer(X[held], cmem[held], cutil[held])
    w = user_weights([ts.users[i] for i in held])
    new = accuracy(oof_mem[held], mem[held], oof_util[held], util[held], w) if len(held) else None
    old = accuracy(base_mem, mem[held], base_util, util[held], w) if len(held) else None
    judged = len(held) >= MIN_EVAL_ROWS
    better = bool(judged and beats(new, old))
    with_util = bool(new and old and util_scored(new, old))
    baseline = serving_version or "cold-start"
    if not judged:
        log(f"only {len(held)} measured jobs of graphs unseen by {baseline} (need {MIN_EVAL_ROWS}): "
            "the candidate cannot be judged against it")
    elif not with_util:
        log(f"none of the {len(held)} measured jobs of graphs unseen by {baseline} had its GPU "
            "alone (their utilization is no measure of their need): the candidate is judged "
            "against it on memory alone")
    cv = accuracy(oof_mem, mem, oof_util, util)
    # the margin of the learned model's own answers, on jobs a learned model may answer (within
    # MAX_MEM_RATIO of the cold start): with the cold start's fallbacks and one user's reruns at
    # 20x it in, the margin was past the loader's bound, and every later retrain stored a model
    # nothing could load
    bound = math.log(MAX_MEM_RATIO)
    scored = oof_learned & mem_in_bounds(mem, cmem)
    resid = np.log(mem[scored] / oof_mem[scored])
    model.metrics = {**cv, "cv_folds": folds}
    if len(resid):
        q90 = conformal_quantile(resid, 0.9)
        q90 = float(q90 if q90 is not None else np.max(resid))
    else:
        # no fold's learned model answered a job: its errors are unknown, and a margin of 0 had
        # made its upper bounds claim to be exact (a forced promotion served them); it carries
        # the cold start's, what the site's bounds were before any learned model
        cold_p90 = ColdStartParams().p90_factor
        q90 = math.log(cold_p90)
        log(f"no cross-validation fold's learned model answered a held-out job within "
            f"{MAX_MEM_RATIO:g}x of the cold start: its memory errors are unknown, and its p90 "
            f"margin is the cold start's (+{(cold_p90 - 1) * 100:.0f} %)")
    if abs(q90) > bound:
        # a learned answer within 10x of the cold start and a job within 10x of it can be 100x
        # apart: a margin past the loader's bound had stopped every retrain while such jobs
        # stayed in the ledger; kept at the bound (a candidate that far off is scored as such)
        log(f"p90 memory margin {math.exp(q90):.3g}x kept at {MAX_MEM_RATIO:g}x")
        q90 = math.copysign(bound, q90)
    model.mem_log_q90 = q90
    model.meta.update({"rows": n, "units": int(len(first)), "mem_rows_left_out": left_out,
                       "cv_folds": folds,
                       "baseline": baseline,
                       "baseline_metrics": old, "held_out_rows": int(len(held)),
                       "source": "horus-admin retrain"})
    model.check()  # before anything is stored: a model the loader refuses is never written
    version = registry.add(model)
    try:
        registry.save_json(f"rows-{version}.json", {"version": 1, "keys": ts.keys,
                                                    "graphs": sorted(set(ts.graphs))}, mode=0o600)
    except HorusError as e:  # past its cap: the version stands, judged later as unrecorded
        log(f"{version}'s training rows not recorded ({e}): a later retrain judges it on every job")
    promoted = better or force
    # calibration: the cold start on every row; each learned model on rows it did not train on
    # (out-of-fold for the new one, jobs of architectures it never trained on for the serving
    # one) and answered itself: the rows it left to the cold start carry the cold start's
    # errors. Each version's are its own file, which serves with it whenever it serves (a
    # rollback had served the older model with no p95/p99, and no word of it)
    quantiles = calibrate(ts.gpu_types, {"cold-start": (list(range(n)), mem, cmem, util, cutil)})
    own = np.flatnonzero(oof_learned)
    # utilization residuals only where the learned model answered it (not a fold's cold start)
    own_util = np.where(oof_util_learned[own], util[own], np.nan)
    bounds = {version: calibrate(ts.gpu_types, {"learned": (own.tolist(), mem[own], oof_mem[own],
                                                            own_util, oof_util[own])})}
    if serving is not None:
        ok = base_why == ""
        bounds[serving_version] = calibrate(ts.gpu_types, {"learned": (
            held[ok].tolist(), mem[held][ok], base_mem[ok], util[held][ok], base_util[ok])})
        _keep_learned_bounds(registry, serving_version, bounds[serving_version])
    now_serving = version if promoted else serving_version
    for gtype, entry in bounds.get(now_serving, {}).items():
        quantiles.setdefault(gtype, {}).update(entry)
    # the ledger first, as not promoted: a retrain that fails there (a sync holding the lock past
    # the timeout) has changed nothing that serves, where promoting first served a model the
    # ledger never knew; promoted there once the registry serves it (recorded promoted first, a
    # promote that failed on a full disk left the ledger naming a model that never served), and
    # the promote undone where that record fails: whatever fails, both say the same model serves
    metrics = {"cv": cv, "held_out": new, "baseline": old, "baseline_version": baseline,
               "held_out_rows": int(len(held)), "score": new and score(new, with_util),
               "baseline_score": old and score(old, with_util), "util_scored": with_util,
               "cold_util_folds": cold_util_folds, "forced": bool(force and not better)}
    ledger.record_predictor_version(version, metrics, n, False)
    for v, q in bounds.items():  # the new version's before it serves: it serves with them
        registry.save_json(calibration_file(v), {"version": CALIBRATION_VERSION, "model": v,
                                                 "quantiles": q, "held_out": HELD_OUT_RULE})
    if promoted:
        before = registry.state()
        registry.promote(version)
        try:
            ledger.record_predictor_version(version, metrics, n, True)
        except BaseException:
            registry.restore(before)
            raise
    registry.save_json(CALIBRATION_FILE, {"version": CALIBRATION_VERSION, "model": now_serving,
                                          "quantiles": quantiles, "held_out": HELD_OUT_RULE})
    return {"version": version, "rows": n, "skipped": ts.skipped, "failed": ts.failed,
            "mem_rows_left_out": left_out, "util_rows_left_out": ts.util_left_out,
            "cv": cv, "cv_folds": folds, "cold_util_folds": cold_util_folds, "held_out": new,
            "baseline": old, "held_out_rows": int(len(held)), "baseline_version": baseline,
            "util_scored": with_util, "better": better, "promoted": promoted}


def _keep_learned_bounds(registry, serving_version: str, quantiles: dict) -> None:
    """The serving model's calibrated bounds where too few jobs are unseen by it to calibrate
    them anew: a routine retrain with no new jobs had dropped them, and sites with memory = p95
    went back to the p90 without a word.  An entry calibrated anew on fewer jobs than the one
    before gives way to it (a dozen new jobs had replaced a p90, p95 and p99 of 120 by a p90
    alone)."""
    before = _stored_bounds(registry, serving_version)
    if before is None or before.get("held_out") != HELD_OUT_RULE:
        return
    for gtype, entry in (before.get("quantiles") or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("learned"), dict):
            continue
        now = quantiles.get(gtype, {}).get("learned")
        if now is None or _rows_of(now) < _rows_of(entry["learned"]):
            quantiles.setdefault(gtype, {})["learned"] = entry["learned"]


def _stored_bounds(registry, version: str) -> dict | None:
    """The calibration last written for ``version``: its own file, else (a registry of before
    those) calibration.json where written while it served; None where neither is."""
    for name in (calibration_file(version), CALIBRATION_FILE):
        try:
            before = registry.load_json(name)
        except HorusError:
            continue
        if isinstance(before, dict) and before.get("model") == version:
            return before
    return None


def _rows_of(entry: dict) -> int:
    """How many jobs a calibration entry rests on (0 where it does not say)."""
    n = entry.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


# --------------------------------------------------------------------------- import

def _row_id(row: dict) -> int:
    """A row's stable id: the hash of its columns.  The CPU column is hashed under its earlier
    name (cpus_per_task), so a file imported before and again with that column renamed
    replaces its rows rather than adding them a second time."""
    key = {("cpus_per_task" if k == "cpus_per_gpu" and "cpus_per_task" not in row else k): v
           for k, v in row.items()}
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return int(h[:12], 16)


MAX_IMPORT_BYTES = 1 << 30
MAX_MEM_MIB = 10_000_000  # 10 TB: no GPU's memory, a typo or a forgery


def _plain_number(v) -> bool:
    """A finite, non-negative int or float (not a bool, not a string): a feature or a time."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)


def _csv_rows(reader, path: str):
    """The reader's rows; a line csv cannot read is a one-line error."""
    try:
        yield from reader
    except csv.Error as e:
        raise HorusError(f"{path}:{reader.line_num}: not CSV ({e})") from None


def _lines(text: str):
    """The text's lines, newlines kept (as csv wants them), without a copy of the whole: an
    io.StringIO of it held four bytes a character (a 900 MB file peaked at 4.4 GB)."""
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start)
        end = n if end < 0 else end + 1
        yield text[start:end]
        start = end


# what an imported row may name as its user: hacct and the history print and key it
_USER_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,128}")


def _importers() -> set[int]:
    """The uids whose CSV an import reads: root, this user and, under sudo, the user who ran it
    (calibrate runs as the admin on a GPU node, and `sudo horus-admin import` of its CSV had
    been refused; sudo sets SUDO_UID itself, whatever the caller's environment)."""
    uids = {0, os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isascii() and sudo.isdigit() and len(sudo) <= 10:
        uids.add(int(sudo))
    return uids


def import_csv(ledger, path: str, *, cluster: str = "import") -> dict:
    """Load measurements (see IMPORT_COLUMNS / docs/ledger.md) as submissions + usage 'import'.
    Failed measurements (ledger.failed_measurement) are kept, flagged, and counted.  Only a file
    of root's or the importer's (_importers) that no one else can write is read: its rows are
    taken as measured, and the model files it names are opened with this process's rights."""
    text = read_text(path, "import file", MAX_IMPORT_BYTES, owners=_importers())
    catalog = default_catalog()
    subs, usages = [], []
    reports: dict = {}
    shas: dict = {}  # model path -> sha256 (file_sha256's cache)
    reader = csv.DictReader(_lines(text))
    if not reader.fieldnames:
        raise HorusError(f"{path}: empty CSV")
    missing = {"gpu_type", "util_pct", "mem_mib"} - set(reader.fieldnames)
    if missing or not ({"model", "features"} & set(reader.fieldnames)):
        raise HorusError(f"{path}: needs columns gpu_type, util_pct, mem_mib and model or "
                         f"features (missing: {', '.join(sorted(missing)) or 'model/features'})")
    for line, row in enumerate(_csv_rows(reader, path), 2):
        where = f"{path}:{line}"
        try:
            if None in row:  # csv puts fields past the header under None
                raise HorusError(f"{len(reader.fieldnames) + len(row[None])} fields, the header has "
                                 f"{len(reader.fieldnames)}")
            gpu = catalog.find((row.get("gpu_type") or "").strip())
            if gpu is None:
                raise HorusError(f"unknown GPU type {row.get('gpu_type')!r}")
            if (row.get("batch_size") or "").strip() == "0":  # workload_from's "not given"
                raise HorusError("batch_size 0: a step holds at least one sample (leave it empty for 1)")
            if row.get("user") and not _USER_NAME.fullmatch(row["user"]):
                raise HorusError(f"user {row['user']!r}: not a user name (no blanks or control characters)")
            w = workload_from(row)  # Workload refuses a batch size past 2**31-1
            util, mem = float(row["util_pct"]), float(row["mem_mib"])
            if not (0 <= util <= 100) or not (0 < mem <= MAX_MEM_MIB):
                raise HorusError(f"util_pct must be 0..100 and mem_mib 0..{MAX_MEM_MIB:,}")
            util_max = float(row["util_max_pct"]) if row.get("util_max_pct") else None
            if util_max is not None and not 0 <= util_max <= 100:
                raise HorusError("util_max_pct must be 0..100")
            model = (row.get("model") or "").strip()
            report = None
            if row.get("features"):
                values = json.loads(row["features"])
                if not isinstance(values, dict) or any(n not in values for n in FEATURE_NAMES):
                    raise HorusError("features JSON lacks some of the feature names")
                bad = [n for n in FEATURE_NAMES if not _plain_number(values[n])]
                if bad:  # one such row would stop every later retrain
                    raise HorusError(f"feature {bad[0]} is not a finite number >= 0")
                if model and os.path.exists(model) and not os.path.isfile(model):  # export hashes it
                    raise HorusError(f"model {model}: not a regular file")
            elif model:
                key = (model, w.batch_size)
                if key not in reports:
                    reports[key] = extract_features(model, batch_size=w.batch_size)
                report = reports[key]
                if report.unknown_dims:
                    # sizes taken as 1 (a text model's sequence) would teach figures far too
                    # small: refused, as hsubmit and sync refuse them
                    raise HorusError(f"model {model}: size(s) {', '.join(report.unknown_dims[:5])} not "
                                     "set by its batch size: give the row's features instead "
                                     "(horus features MODEL --dim NAME=VALUE --json)")
                values = report.values
            else:
                raise HorusError("needs model or features")
            if row.get("cold_util_pct") and row.get("cold_mem_mib"):
                cold = {"util_pct": float(row["cold_util_pct"]),
                        "mem_mib": float(row["cold_mem_mib"]),
                        "gpu_ms_per_step": float(row.get("cold_gpu_ms") or 0),
                        "host_ms_per_step": float(row.get("cold_host_ms") or 0)}
                # memory from a bare CUDA context up: what the history takes (below it, the
                # row's measured memory had been dropped from history.json without a word)
                if not (0 <= cold["util_pct"] <= 100 and BARE_CONTEXT_MIB <= cold["mem_mib"] <= MAX_MEM_MIB
                        and all(_plain_number(cold[k]) for k in ("gpu_ms_per_step",
                                                                 "host_ms_per_step"))):
                    raise HorusError(f"cold_* columns must be finite: util 0..100, memory >= "
                                     f"{BARE_CONTEXT_MIB:g} MiB (a bare CUDA context), times >= 0")
            elif report is None:
                raise HorusError("features without cold_util_pct and cold_mem_mib: the cold "
                                 "start needs the model's graph (give model, or those columns)")
            else:
                c = ColdStartEstimator().predict(report, gpu, w)
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
                     # now: a calibration's cached ONNX may be gone by the next export
                     "model_sha256": report.sha256 if report else file_sha256(model, shas),
                     "model_family": row.get("model_family") or None,
                     "feature_version": FEATURE_VERSION, "features": values,
                     "workload": workload_dict(w),
                     "gpu_types": [gname], "predictor": "cold-start",
                     "predictions": {gname: {"util_pct": cold["util_pct"],
                                             "mem_mib": cold["mem_mib"],
                                             "predictor": "cold-start", "cold": cold}}})
        usages.append({"job_id": jid, "cluster": cluster, "source": "import",
                       "util_mean": util, "mem_peak_mib": mem, "gpu_type": gname,
                       "util_max": util_max})
    # a row imported again once its model file is gone keeps the sha its first import read
    unread = [s["job_id"] for s in subs if s["model_path"] and s["model_sha256"] is None]
    if unread:
        known = ledger.model_shas(cluster, unread)
        for s in subs:
            s["model_sha256"] = s["model_sha256"] or known.get(s["job_id"])
    ledger.record_runs(subs, usages)
    once = {u["job_id"]: u for u in usages}  # a row repeated is one measurement (its id is its content)
    failed = sum(1 for u in once.values() if failed_measurement(u["util_mean"], u["mem_peak_mib"]))
    return {"rows": len(once), "repeated": len(usages) - len(once), "failed": failed}
