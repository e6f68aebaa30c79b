"""The ledger's measured runs as the history hsubmit reads (predict/history.py), written to the
registry by horus-admin retrain / import.

Each run keeps the cold-start figures it was predicted with at submission; and where the serving
learned model would have answered it (LearnedModel.answer's gate), that model's figures too, so
the history learns the site's offsets against whichever predictor serves.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import time

from sqlalchemy import and_, func, select, tuple_

from slurm_horus.errors import HorusError
from slurm_horus.textfile import open_for_reading
from slurm_horus.graph.features import FEATURE_VERSION, FeatureReport
from slurm_horus.ledger import tables
from slurm_horus.ledger.training import (ROW_ERRORS, stored_workload, completed_run,
                                         feature_values, stored_cold)
from slurm_horus.predict.coldstart import ColdStartEstimator
from slurm_horus.predict.gpus import default_catalog
from slurm_horus.predict.history import HistoryPredictor
from slurm_horus.predict.history_format import MAX_MIB, check_run, family_key
from slurm_horus.predict.learned import LearnedEstimator, input_row
from slurm_horus.predict.registry import HISTORY_FILE, size_cap
from slurm_horus.predict.workload import dims_key, workload_from

CHUNK_ROWS = 5000
TRIM_TRIES = 3  # fits past the first on fewer runs, at most, to come within the size cap
TRIM_MARGIN = 0.9  # aim under the cap: bytes per run are measured, not known


def ledger_runs(ledger, learned=None, times: list | None = None) -> list[dict]:
    """The ledger's measured jobs as history runs (see HistoryPredictor.fit). With a learned
    estimator, each run with features also carries its prediction (for that model's offsets).
    A run that shared its GPU (``colocated``) gives its memory but not its utilization: NVML
    measured its share of the GPU beside the other jobs, not what it needs alone. With
    ``times`` (a list), each run's time is appended to it, in the runs' order: the job's end
    (else its start, its submission, or when its measurement was recorded: imports carry no
    job times), 0 where none is known; an export over the size cap keeps each user's newest."""
    t = tables()
    s, j, u = t["submissions"], t["jobs"], t["usage"]
    recorded = (select(func.max(u.c.recorded))
                .where(u.c.cluster == j.c.cluster, u.c.job_id == j.c.job_id).scalar_subquery())
    when = func.coalesce(j.c.end_time, j.c.start_time, j.c.submit_time, s.c.submit_time, recorded)
    stmt = (select(j.c.cluster, j.c.job_id, s.c.model_sha256, s.c.model_path, s.c.model_family,
                   s.c.user_name, s.c.features, s.c.feature_version, s.c.workload, s.c.predictions,
                   j.c.gpu_type, j.c.act_util_pct, j.c.act_mem_mib, j.c.colocated, j.c.gpus,
                   j.c.shards, when)
            .join(j, and_(j.c.cluster == s.c.cluster, j.c.job_id == s.c.job_id))
            .where(j.c.act_mem_mib > 0, j.c.gpu_type.isnot(None), completed_run(j),
                   # the graph is the one sync hashed and costed (features), not the sha the
                   # user's comment claims: a claimed sha alone poisoned that graph's history
                   s.c.features.isnot(None),
                   func.coalesce(j.c.failed_measurement, 0) == 0))
    catalog = default_catalog()
    gpus: dict = {}
    shas: dict = {}
    runs, inputs = [], []
    for _, _, sha, path, family, user, feats, fv, wl, preds, gtype, util, mem, coloc, n_gpus, \
            n_shards, at in _in_chunks(ledger, stmt, j):
        try:
            if gtype not in gpus:
                gpus[gtype] = catalog.find(gtype)
            gpu = gpus[gtype]
            w = json.loads(wl) if wl else {}
            if gpu is None or mem is None or not 0 < float(mem) <= MAX_MIB:
                continue
            # the CPUs per GPU Slurm allocated, as the learned model trains on them
            wk = workload_from(stored_workload(w, n_gpus, n_shards))
            run = {"sha": sha or file_sha256(path, shas), "gpu": gpu.name,
                   "bs": wk.batch_size, "task": wk.task, "opt": wk.optimizer,
                   "prec": wk.precision, "cpus_per_gpu": wk.cpus_per_gpu, "mem": float(mem),
                   "util": None if util is None or coloc else min(max(float(util), 0.0), 100.0),
                   "family": family or None, "user": user or None}
            run["dims"] = dims_key(w.get("dims"), run["bs"])
            p = (json.loads(preds) if preds else {}) or {}
            c = (p.get(gtype) or p.get(gpu.name) or {}).get("cold") or {}
            values = json.loads(feats) if feats and (fv is None or int(fv) == FEATURE_VERSION) \
                else None
            if values is not None:
                values = feature_values(values)
            run["cold_mem"] = float(c["mem_mib"]) if c.get("mem_mib") else None
            run["cold_util"] = float(c["util_pct"]) if c.get("util_pct") is not None else None
            if run["cold_mem"] is None and values is not None:
                run["cold_mem"] = _cold_memory(values, gpu, wk)
            runs.append(check_run(run, "ledger row"))
            if times is not None:
                times.append(_epoch(at))
            if learned is not None and values is not None:
                inputs.append((len(runs) - 1, values, gpu, wk, c))
        except ROW_ERRORS:
            continue  # an unusable row teaches nothing (retrain counts them)
    if learned is not None and inputs:
        _add_learned(runs, inputs, learned)
    return runs


def _epoch(at) -> float:
    try:
        v = float(at)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def _in_chunks(ledger, stmt, jobs, size: int = CHUNK_ROWS):
    """``stmt``'s rows (its first two columns the job's cluster and id) in order, read in short
    transactions of ``size`` rows: a SQLite reader keeps writers (the probe, the queue loop)
    waiting while its cursor is open, and sync now reads the whole history every period."""
    last = None
    while True:
        q = stmt.order_by(jobs.c.cluster, jobs.c.job_id).limit(size)
        if last is not None:
            q = q.where(tuple_(jobs.c.cluster, jobs.c.job_id) > tuple_(*last))
        with ledger.engine.connect() as conn:
            rows = conn.execute(q).fetchall()
        yield from rows
        if len(rows) < size:
            return
        last = (rows[-1][0], rows[-1][1])


def file_sha256(path: str | None, cache: dict) -> str | None:
    """sha256 of a model file the admin can read (imports record it; rows imported before
    they did are hashed at export); None for anything but a regular file (a FIFO or
    /dev/zero had hung every export)."""
    if not path:
        return None
    if path not in cache:
        try:
            h = hashlib.sha256()
            with open_for_reading(path, regular_only=True) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            cache[path] = h.hexdigest()
        except OSError:
            cache[path] = None
    return cache[path]


def _values_report(values: dict) -> FeatureReport:
    return FeatureReport(model="", sha256="", values=values, nodes=[], by_op={},
                         unknown_ops=[], unknown_dims=[], bound_dims={})


def _cold_memory(values: dict, gpu, w) -> float:
    return ColdStartEstimator().memory_mib(_values_report(values), gpu, w)[0]


def _add_learned(runs: list[dict], inputs: list, learned: LearnedEstimator) -> None:
    """The learned model's figures for the runs it answers (its familiar, in-bounds rows),
    in one batch."""
    cold_est = ColdStartEstimator()
    rows, colds, kept = [], [], []
    for i, values, gpu, wl, c in inputs:
        try:
            try:
                cp = stored_cold(c, gpu)
            except ValueError:
                cp = cold_est.predict(_values_report(values), gpu, wl)
            rows.append(input_row(values, gpu, wl, cp))
        except (ValueError, TypeError, OverflowError, HorusError):
            continue  # the run keeps its measurement; the learned model has no answer for it
        colds.append(cp)
        kept.append(i)
    if not rows:
        return
    mem, util, why = learned.model.answer(rows, [c.mem_mib for c in colds],
                                          [c.util_pct for c in colds])
    for k, i in enumerate(kept):
        if not why[k]:
            runs[i].update(base=learned.name, base_mem=float(mem[k]), base_util=float(util[k]))


def build_history(ledger, learned=None, pseudonyms=None, max_bytes: int | None = None,
                  summary: dict | None = None) -> dict:
    """The ledger's measurements as a history (plain JSON-able dict, see HistoryPredictor);
    with ``pseudonyms`` (a callable: user names -> {name: pseudonym}) its users are named by
    them, as history.json, which everyone reads, must. With ``max_bytes``, a history whose
    JSON would be bigger is fitted again on fewer runs (offsets and pools too from what is
    kept), so that it fits: each user's newest, the oldest of the users with the most settings
    left out first, the admin's imports last (_fair_order); ``summary`` (a dict) gets
    "measured_runs" (all the ledger's) and "runs_dropped"."""
    times: list = []
    runs = ledger_runs(ledger, learned, times)
    if pseudonyms is not None:
        alias = pseudonyms(sorted({r["user"] for r in runs if r["user"]}))
        for r in runs:
            r["user"] = alias.get(r["user"])
    history = _fitted(runs, pseudonyms)
    dropped = 0
    if max_bytes is not None:
        size = _json_size(history)
        order = None
        keep = len(runs)
        for t in range(TRIM_TRIES):  # bounded: each fit is measured, not trusted
            if size <= max_bytes or keep <= 1:
                break
            if order is None:
                order = _fair_order(runs, times)
            # its bytes are its settings' (a setting's reruns are one entry): as many settings
            # as the bytes each measured allow, with a margin that widens at each try
            entries = sum(len(v) for v in history["graphs"].values())
            room = max_bytes * (TRIM_MARGIN - 0.1 * t) * entries / size
            keep = min(keep - 1, _within(runs, order, room))
            history = _fitted([runs[i] for i in sorted(order[:keep])], pseudonyms)
            size = _json_size(history)
        dropped = len(runs) - keep
    if summary is not None:
        summary.update(measured_runs=len(runs), runs_dropped=dropped)
    return history


def _setting(r: dict) -> tuple | None:
    """The history entry a run adds to (HistoryPredictor._aggregate's), None for none."""
    return (r["sha"], r["gpu"], r["task"], r["opt"], r["prec"], r["dims"], r["bs"]) \
        if r.get("sha") else None


def _fair_order(runs: list[dict], times: list) -> list[int]:
    """The runs in the order a trimmed history keeps them: the admin's imports (no user)
    first, newest first; then the users' runs, each user's newest first, taken in turns by how
    many settings (history entries) of their own each user's newer runs hold, the fewest first
    (on a tie, the newest run first): a history trimmed to a prefix of it keeps every user's
    newest runs, and leaves out the oldest of the users with the most settings first. (Keeping
    the newest runs of the site alone had let one user's array jobs of new batch sizes push
    every other user's runs out.) Two sorts: seconds for a million runs."""
    newest = sorted(range(len(runs)), key=times.__getitem__)[::-1]  # a tie: later in ledger order first
    admin, rest, level = [], [], [0] * len(runs)
    seen: dict = {}
    for pos, i in enumerate(newest):
        user = runs[i].get("user")
        if user is None:
            admin.append(i)
            continue
        own = seen.setdefault(user, set())
        level[i] = len(own) * len(runs) + pos
        if (key := _setting(runs[i])) is not None:
            own.add(key)
        rest.append(i)
    rest.sort(key=level.__getitem__)
    return admin + rest


def _within(runs: list[dict], order: list[int], entries: float) -> int:
    """How many of the runs first in ``order`` hold at most ``entries`` settings
    (HistoryPredictor._aggregate's entries), at least one."""
    seen: set = set()
    keep = 0
    for i in order:
        key = _setting(runs[i])
        if key is not None and key not in seen:
            if len(seen) + 1 > entries:
                break
            seen.add(key)
        keep += 1
    return max(keep, 1)


def _json_size(history: dict) -> int:
    """Its size as the registry writes it (Registry.save_json)."""
    return len(json.dumps(history, separators=(",", ":")))


def _fitted(runs: list[dict], pseudonyms) -> dict:
    history = HistoryPredictor().fit(runs).to_dict()
    if pseudonyms is not None:
        history["pseudonymous"] = True
        salt = secrets.token_hex(8)  # families too: their names are users' model file names
        history["family_salt"] = salt
        history["families"] = {gpu: {family_key(salt, f): p for f, p in pools.items()}
                               for gpu, pools in history["families"].items()}
        for r in (r for rs in history["graphs"].values() for r in rs):
            r.pop("family", None)  # a run's family is for the pools alone
    return history


def export_history(ledger, registry) -> dict:
    """Build the history from the ledger and store it in the registry (history.json, users
    named by the registry's pseudonyms), with offsets for the serving learned model when one
    loads. Returns a short summary."""
    learned = None
    version = registry.serving()
    if version:
        try:
            learned = LearnedEstimator(registry.load(version), version)
        except HorusError:
            learned = None  # offsets against the cold start still serve
    trim: dict = {}
    history = build_history(ledger, learned, registry.pseudonyms,
                            max_bytes=size_cap(HISTORY_FILE), summary=trim)
    runs = sum(len(v) for v in history["graphs"].values())
    if ledger.unproven("history"):
        # a ledger a mistyped --ledger made: its history would erase the site's
        try:
            old = registry.load_history()
            kept = sum(len(v) for v in old["graphs"].values()) if old else 0
        except (HorusError, AttributeError, KeyError, TypeError):
            kept = 0  # none readable: nothing to keep
        if kept > runs and not trim["runs_dropped"]:
            raise HorusError(f"{registry.root / 'history.json'} kept: it holds {kept} measured runs, "
                             f"this ledger, made here and never exported, {runs} (a new or wrong "
                             "ledger? if it is the site's, remove history.json)")
    registry.save_history(history)
    ledger.set_state("history", str(int(time.time())))
    return {"graphs": len(history["graphs"]), "runs": runs,
            "gpu_types_with_offsets": sorted(history["offsets"]),
            "path": str(registry.root / "history.json"), "runs_dropped": trim["runs_dropped"],
            "measured_runs": trim["measured_runs"]}
