"""The merged jobs table: one row per job, its submission joined with the best measurement.

The ledger rebuilds a job's row (``refresh_jobs``) on every write to its submission or usage,
so readers (hacct, the views, retrain) read one table. The rules that decide a row live here:
which source wins (probe > sacct > import for use, sacct first for placement), the failed
measurement flag, the under-claim audit, the memory-error histogram bin, the per-job terms
that hacct --summary adds up (``accuracy_terms``; errors as in docs/definitions.md), and what the
hook and ``horus-admin queue`` did to the job (from its AdminComment, the submission's
``policy_decision``: ``slurm.accounting.scheduler_actions``).
"""

from __future__ import annotations

import json
import math
from typing import Iterable

from slurm_horus.ledger.db import upsert
from slurm_horus.ledger.records import SOURCES
from slurm_horus.ledger.schema import job_fields, tables
from slurm_horus.predict.gpus import BARE_CONTEXT_MIB
from slurm_horus.slurm.accounting import scheduler_actions
from slurm_horus.slurm.hint import parse_decision

# Which measurement wins for utilization/memory, and for placement facts (node, state, ...).
UTIL_ORDER = ("probe", "sacct", "import")
PLACE_ORDER = ("sacct", "probe", "import")
# Measurements users cannot forge: Slurm's accounting and the probe slurmd starts as root.
TRUSTED_ORDER = ("probe", "sacct")
# Under-claim audit: measured use above the claim by more than noise (design: issue 10).
UNDERCLAIM_MEM = (1.10, 256.0)   # act_mem_mib > claimed mem_p90 * 1.10 + 256
UNDERCLAIM_UTIL = (1.25, 10.0)   # act_util_pct > claimed util * 1.25 + 10
# A GPU job that never used its GPU is a failed measurement (docs/definitions.md): utilization
# exactly 0 with memory unknown or at most a bare CUDA context (BARE_CONTEXT_MIB).
# Actual use far above the prediction: hacct --summary counts and lists these jobs.
FAR_UTIL_PP = 25.0     # actual utilization this many points above the prediction
FAR_MEM_FACTOR = 1.25  # actual memory this many times the prediction


def failed_measurement(act_util, act_mem) -> int | None:
    """1 when a measurement shows a job that never used its GPU (utilization exactly 0, memory
    unknown or at most BARE_CONTEXT_MIB; or no utilization and no memory at all), 0 for a
    usable one, None when nothing was measured.
    Flagged rows stay in the ledger but count in no accuracy figure and train nothing."""
    if act_util is None and act_mem is None:
        return None
    if act_util is not None and float(act_util) == 0.0 and \
            (act_mem is None or float(act_mem) <= BARE_CONTEXT_MIB):
        return 1
    if act_util is None and float(act_mem) == 0.0:
        return 1  # no memory at all on the GPU and no utilization seen: nothing of the job's
    return 0


def under_claim(claim_util, claim_mem_p90, act_util, act_mem) -> tuple[int | None, str | None]:
    """(1, flags) when trusted measured use exceeds the claim beyond noise, (0, None) when it
    does not, (None, None) when there is no claim or no measurement to compare."""
    flags, compared = [], False
    if claim_mem_p90 is not None and act_mem is not None:
        compared = True
        if act_mem > claim_mem_p90 * UNDERCLAIM_MEM[0] + UNDERCLAIM_MEM[1]:
            flags.append("mem")
    if claim_util is not None and act_util is not None:
        compared = True
        if act_util > claim_util * UNDERCLAIM_UTIL[0] + UNDERCLAIM_UTIL[1]:
            flags.append("util")
    if not compared:
        return None, None
    return (1, ",".join(flags)) if flags else (0, None)


def mem_err_bucket(pred_mem_mib, act_mem_mib) -> int:
    """Histogram bin of |predicted - actual| / actual memory: 0.5 % bins below 100 %, 10 % bins
    to 1000 %, one bin above; -1 where either value is missing."""
    if not pred_mem_mib or not act_mem_mib or pred_mem_mib <= 0 or act_mem_mib <= 0:
        return -1
    rel = abs(pred_mem_mib - act_mem_mib) / act_mem_mib
    if rel < 1.0:
        return int(rel * 200)
    if rel < 10.0:
        return 200 + int((rel - 1.0) * 10)
    return 290


def mem_err_bucket_bounds(b: int) -> tuple[float, float]:
    """The relative-error interval a mem_err_bucket bin stands for (its inverse)."""
    if b < 200:
        return b / 200, (b + 1) / 200
    if b < 290:
        return 1.0 + (b - 200) / 10, 1.0 + (b - 199) / 10
    return 10.0, 10.0


def predictor_source(predictor: str | None) -> str | None:
    """The predictor source a prediction came from: 'learned:v0003' -> 'learned'."""
    return predictor.split(":", 1)[0] if predictor else None


def _sq_log_err(pred, act) -> float | None:
    """(ln(1 + pred) - ln(1 + act))^2, the RMSLE term; None where a logarithm is undefined."""
    if pred <= -1.0 or act <= -1.0:
        return None
    d = math.log(1.0 + pred) - math.log(1.0 + act)
    return d * d


def accuracy_terms(row: dict) -> dict:
    """The per-job terms hacct --summary adds up, computed once when the row is written so that
    the summary of a million jobs is one scan of an index holding them (schema v6). A term is
    None where the job does not count in that figure: nothing to compare, or a failed
    measurement."""
    pu, au = row["pred_util_pct"], row["act_util_pct"]
    pm, am, p90 = row["pred_mem_mib"], row["act_mem_mib"], row["pred_mem_p90_mib"]
    ok = not row["failed_measurement"]
    has_util = ok and pu is not None and au is not None
    has_mem = ok and pm is not None and am is not None and pm > 0 and am > 0
    has_p90 = ok and p90 is not None and am is not None and p90 > 0 and am > 0
    far = (has_util and au - pu > FAR_UTIL_PP) or (has_mem and am > pm * FAR_MEM_FACTOR)
    return {"predictor_source": predictor_source(row["predictor"]),
            "measured": int(au is not None or am is not None),
            "util_abs_err_pp": abs(au - pu) if has_util else None,
            "util_sq_log_err": _sq_log_err(pu, au) if has_util else None,
            "mem_sq_log_err": _sq_log_err(pm, am) if has_mem else None,
            "within_p90": int(am <= p90) if has_p90 else None,
            "far": int(far)}


def _loads(s, default=None):
    if s is None or s == "":
        return default
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return default


def earlier_run(probe: dict | None, acct: dict | None) -> bool:
    """Whether a probe row measured an earlier run of a requeued job than accounting's (it
    ended before that run started; its row is replaced only when the rerun is probed too):
    its use, type and GPU are not the recorded run's."""
    return bool(probe and acct and probe.get("end_time") and acct.get("start_time")
                and probe["end_time"] < acct["start_time"])


def merge_job(sub: dict | None, usages: dict[str, dict]) -> dict:
    """One jobs row (without its key) from a submission row (or None) and usage rows by source."""
    def first(field, order):
        for src in order:
            u = usages.get(src)
            if u is not None and u.get(field) is not None:
                return u[field]
        return None

    if earlier_run(usages.get("probe"), usages.get("sacct")):  # accounting's run is recorded
        usages = {src: u for src, u in usages.items() if src != "probe"}
    row = dict.fromkeys(job_fields())
    row["has_submission"] = 1 if sub else 0
    preds = {}
    if sub:
        for f in ("user_name", "account", "submit_time", "model_family", "predictor"):
            row[f] = sub.get(f)
        preds = _loads(sub.get("predictions"), {}) or {}
        row.update(scheduler_actions(sub.get("policy_decision")))
    for f in ("gpu_type", "gpu_index", "node", "gpus", "shards", "state", "elapsed_s",
              "start_time", "end_time", "colocated", "array_job_id", "array_task_id",
              "het_job_id", "het_job_offset"):
        row[f] = first(f, PLACE_ORDER)
    n = row["gpus"] if isinstance(row["gpus"], int) and row["gpus"] > 1 else 1

    # a source whose own measurement failed (it saw no use of the GPU) comes after the
    # others: a probe that missed the job must not hide what sacct measured
    missed = {src for src, u in usages.items()
              if failed_measurement(u.get("util_mean"), u.get("mem_peak_mib"))}

    def per_gpu(field, order):
        """The first source's figure, per GPU: the probe's and sacct's rows are sums over a
        job's GPUs (sacct's: Slurm's per-task figures made per GPU by each step's layout, times
        the job's GPUs: slurm.accounting._gpu_use), while predictions and claims are for one
        (an import is per GPU already)."""
        for src in sorted(order, key=missed.__contains__):
            u = usages.get(src)
            if u is not None and u.get(field) is not None:
                if src == "probe" and isinstance(u.get("gpus"), int) and u["gpus"] >= 1:
                    return u[field] / u["gpus"]  # its node's GPUs (a multi-node job's one node)
                return u[field] / n if src in ("probe", "sacct") else u[field]
        return None
    row["act_util_pct"] = per_gpu("util_mean", UTIL_ORDER)
    row["act_util_max"] = per_gpu("util_max", UTIL_ORDER)
    row["act_mem_mib"] = per_gpu("mem_peak_mib", UTIL_ORDER)
    if row["gpu_type"] is None and sub:
        # the type the hook pinned (AdminComment: only slurmctld writes it), never the hint's
        # types: those are the user's claim, and a job recorded on a type it never ran on
        # taught that type's history
        decision = parse_decision(sub.get("policy_decision"))
        if decision and decision.action != "unchanged" and decision.gpu_type not in (None, "any"):
            row["gpu_type"] = decision.gpu_type
    claimed = row["gpu_type"]
    if claimed is None and isinstance(preds, dict) and len(preds) == 1:
        claimed = next(iter(preds))  # the claim's own figures, compared: not a type it ran on
    p = preds.get(claimed) if isinstance(preds, dict) and claimed else None
    if isinstance(p, dict):
        row["pred_util_pct"] = p.get("util_pct")
        row["pred_mem_mib"] = p.get("mem_mib")
        row["pred_mem_p90_mib"] = p.get("mem_mib_p90")
        if not row["predictor"]:
            row["predictor"] = p.get("predictor")
    row["sources"] = ",".join(s for s in SOURCES if s in usages) or None
    row["failed_measurement"] = failed_measurement(row["act_util_pct"], row["act_mem_mib"])
    row["mem_err_bucket"] = -1 if row["failed_measurement"] else \
        mem_err_bucket(row["pred_mem_mib"], row["act_mem_mib"])
    claim_mem = row["pred_mem_p90_mib"] if row["pred_mem_p90_mib"] is not None \
        else row["pred_mem_mib"]
    row["under_claim"], row["claim_flags"] = (None, None) if row["failed_measurement"] else under_claim(
        row["pred_util_pct"], claim_mem, per_gpu("util_mean", TRUSTED_ORDER),
        per_gpu("mem_peak_mib", TRUSTED_ORDER))  # a failed measurement audits no claim
    row.update(accuracy_terms(row))
    return row


def refresh_jobs(conn, keys: Iterable[tuple[str, int]]) -> None:
    """Recompute the jobs rows of these (cluster, job id) keys from submissions and usage."""
    from sqlalchemy import and_, or_, select

    t = tables()
    keys = sorted(set((str(c), int(j)) for c, j in keys))
    if not keys:
        return
    s, u = t["submissions"], t["usage"]
    sub_cols = [s.c[c] for c in ("cluster", "job_id", "user_name", "account", "submit_time",
                                 "model_family", "predictor", "predictions", "policy_decision")]
    out = []
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        by_cluster: dict[str, list[int]] = {}
        for c, j in chunk:
            by_cluster.setdefault(c, []).append(j)
        cond_s = or_(*(and_(s.c.cluster == c, s.c.job_id.in_(js)) for c, js in by_cluster.items()))
        cond_u = or_(*(and_(u.c.cluster == c, u.c.job_id.in_(js)) for c, js in by_cluster.items()))
        subs = {(r.cluster, int(r.job_id)): r._asdict()
                for r in conn.execute(select(*sub_cols).where(cond_s))}
        usages: dict[tuple, dict] = {}
        for r in conn.execute(select(u).where(cond_u)):
            usages.setdefault((r.cluster, int(r.job_id)), {})[r.source] = r._asdict()
        for key in chunk:
            if key not in subs and key not in usages:
                continue
            row = merge_job(subs.get(key), usages.get(key, {}))
            row["cluster"], row["job_id"] = key
            out.append(row)
    upsert(conn, t["jobs"], out, ("cluster", "job_id"))


def job_filters(stmt, *, job_ids=None, task_ids=None, users=None, accounts=None, states=None,
                start=None, end=None, cluster=None, submitted_only=False, under_claims=False):
    """sacct-like filters on the jobs table: -j, -u, -A, -s, -S/-E (submit or end in window;
    with -s, each state's own time test instead: _state_in_window), and hacct's
    --under-claims. job_ids: as sacct -j N, an array's id names its tasks too, and a
    heterogeneous job's (its leader's) its components; task_ids: the own ids of tasks named ArrayJobId_TaskId, each that task alone (one task of
    every array has the array's id; an empty list: tasks were named and none exists, so
    those name no job)."""
    from sqlalchemy import false, func, or_

    j = tables()["jobs"]
    named = []
    if job_ids:
        ids = [int(x) for x in job_ids]
        named += [j.c.job_id.in_(ids), j.c.array_job_id.in_(ids), j.c.het_job_id.in_(ids)]
    if task_ids is not None:
        named.append(j.c.job_id.in_([int(x) for x in task_ids]) if task_ids else false())
    if named:
        stmt = stmt.where(or_(*named))
    if users:
        stmt = stmt.where(j.c.user_name.in_(list(users)))
    if accounts:
        stmt = stmt.where(j.c.account.in_(list(accounts)))
    windowed = start is not None or end is not None
    if states:
        stmt = stmt.where(or_(*(_state_in_window(j, s, start, end) if windowed
                                else func.upper(j.c.state).like(s.upper() + "%") for s in states)))
    if cluster:  # a name, or a list of them
        stmt = stmt.where(j.c.cluster.in_([cluster] if isinstance(cluster, str) else list(cluster)))
    if start is not None and not states:
        stmt = stmt.where(func.coalesce(j.c.end_time, j.c.submit_time) >= int(start))
    if end is not None and not states:
        stmt = stmt.where(func.coalesce(j.c.submit_time, j.c.start_time, j.c.end_time) <= int(end))
    if submitted_only:
        stmt = stmt.where(j.c.has_submission == 1)
    if under_claims:
        stmt = stmt.where(j.c.under_claim == 1)
    return stmt


def _state_in_window(j, state: str, start, end):
    """sacct's test of a job in ``state`` during the window (slurmdbd's _state_time_string):
    PENDING, waiting at some time in it (submitted before its end, started or ended unstarted
    after its start, or still pending); RUNNING, running at some time in it; SUSPENDED, the
    state (the ledger keeps no suspend times); an end state, ending in it with that state."""
    from sqlalchemy import and_, func, or_, true

    lo = int(start) if start is not None else None
    hi = int(end) if end is not None else None
    name = state.upper()
    last = func.upper(j.c.state).like(name + "%")  # the state the ledger last recorded
    after = (lambda c: c > lo) if lo is not None else (lambda c: c.isnot(None))
    before = (lambda c: c < hi) if hi is not None else (lambda c: true())
    if name == "PENDING":  # submitted (slurmdbd: eligible) before the window ends
        return and_(j.c.submit_time.isnot(None), before(j.c.submit_time), or_(
            and_(j.c.start_time.isnot(None), after(j.c.start_time)),
            and_(j.c.start_time.is_(None), j.c.end_time.isnot(None), after(j.c.end_time)),
            and_(j.c.start_time.is_(None), j.c.end_time.is_(None), last)))
    if name == "RUNNING":
        return and_(j.c.start_time.isnot(None), before(j.c.start_time),
                    or_(after(j.c.end_time), and_(j.c.end_time.is_(None), last)))
    if name == "SUSPENDED":
        return last
    # coalesce keeps the planner off ix_jobs_end: iter_jobs pages by submit time, and through
    # that index each page rescanned and sorted the range (a million jobs: 100 s, against 17)
    ended = func.coalesce(j.c.end_time, -1)
    return and_(last, j.c.end_time.isnot(None), ended >= lo if lo is not None else true(),
                ended <= hi if hi is not None else true())
