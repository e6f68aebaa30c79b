"""hacct's data: per-job predicted vs actual use, and the accuracy summary (SQL aggregation).

Errors follow docs/definitions.md: predicted minus actual, so a negative error is a job that used
more than predicted. ``UtilErr`` is in percentage points of GPU utilization, ``MemErr`` in percent
of the actual peak memory: 100 (predicted - actual) / actual. The summary's median relative
error is the median of |predicted - actual| / actual memory, from a histogram counted in SQL
over the bin each job row stores (ledger.jobs.mem_err_bucket: 0.5 % bins below 100 %, 10 % bins
up to 1000 %), so a million rows take one scan of an index. ``p90_coverage_pct`` is the share of
measured jobs whose peak memory stayed at or below the predicted p90 (the bound packing uses).
Failed measurements (ledger.jobs.failed_measurement) count in no accuracy figure; ``excluded`` says
how many there were.

A job has either whole GPUs (``gpus``, gres/gpu) or shards of one (``shards``, gres/shard):
``Alloc`` shows ``2 GPU`` or ``25 shards``. ``UnderClaim`` is the claim audit that the ledger
computes (ledger.jobs.under_claim): ``mem``, ``util`` or ``mem,util`` when trusted measured use
exceeded the job's hint, ``no`` when it did not, empty when there was nothing to compare.
``HookAct`` is the hook's decision at submission (``shared``, ``exclusive:util``, ...) and
``QueueAct`` what ``horus-admin queue`` did afterwards, in order (``oom-requeue``,
``pack,spread``), both from the job's AdminComment (ledger.jobs, schema v7).

Of sacct's own fields, those whose values the ledger holds as Slurm facts are columns under
sacct's names (JobIDRaw, Start, End, ElapsedRaw, NodeList: the nodes Slurm's accounting gave
the job, as Node); ``JobID`` is sacct's: a heterogeneous job's component as
HetJobId+HetJobOffset (``1234+1``), an array task as ArrayJobId_ArrayTaskId (``1234_7``), from
what accounting gave sync (job_id_str), any other job by its own id (JobIDRaw); another of sacct's fields (JobName, Partition, ExitCode, ...) is refused with
a message saying the ledger does not record it.
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Iterator

from slurm_horus.errors import HorusError
from slurm_horus.ledger.jobs import (FAR_MEM_FACTOR, FAR_UTIL_PP, job_filters,
                                     mem_err_bucket_bounds)
from slurm_horus.ledger.jobs import predictor_source  # noqa: F401 - plots.py imports it here
from slurm_horus.ledger.schema import tables
from slurm_horus.errors import CONTROL_CHARS

# name -> (header, json key). Order here is the order of `hacct -o help`.
COLUMNS = {
    "jobid": "JobID", "jobidraw": "JobIDRaw", "arrayjobid": "ArrayJobID", "arraytaskid": "ArrayTaskID", "cluster": "Cluster", "user": "User", "account": "Account",
    "family": "Family", "gputype": "GPUType", "gpuidx": "GPUIdx", "node": "Node", "nodelist": "NodeList",
    "alloc": "Alloc", "gpus": "GPUs", "shards": "Shards", "predutil": "PredUtil", "actutil": "ActUtil", "maxutil": "MaxUtil",
    "utilerr": "UtilErr", "predmem": "PredMem", "actmem": "ActMem", "memerr": "MemErr",
    "colocated": "CoLocated", "state": "State", "elapsed": "Elapsed", "elapsedraw": "ElapsedRaw",
    "submit": "Submit", "start": "Start", "end": "End",
    "predictor": "Predictor", "sources": "Sources", "underclaim": "UnderClaim",
    "hookact": "HookAct", "queueact": "QueueAct",
}
# sacct's (22.05) fields that the ledger does not record: asked for, they are refused as such,
# not as unknown names (a field in COLUMNS is left out of this set below)
SACCT_FIELDS = frozenset(x.lower() for x in """
    Account AdminComment AllocCPUS AllocNodes AllocTRES AssocID AveCPU AveCPUFreq AveDiskRead
    AveDiskWrite AvePages AveRSS AveVMSize BlockID Cluster Comment Constraints Container
    ConsumedEnergy ConsumedEnergyRaw CPUTime CPUTimeRAW DBIndex DerivedExitCode Elapsed ElapsedRaw
    Eligible End ExitCode Flags GID Group JobID JobIDRaw JobName Layout MaxDiskRead MaxDiskReadNode
    MaxDiskReadTask MaxDiskWrite MaxDiskWriteNode MaxDiskWriteTask MaxPages MaxPagesNode
    MaxPagesTask MaxRSS MaxRSSNode MaxRSSTask MaxVMSize MaxVMSizeNode MaxVMSizeTask McsLabel MinCPU
    MinCPUNode MinCPUTask NCPUS NNodes NodeList NTasks Priority Partition QOS QOSRAW Reason
    ReqCPUFreq ReqCPUFreqMin ReqCPUFreqMax ReqCPUFreqGov ReqCPUS ReqMem ReqNodes ReqTRES Reservation
    ReservationId Reserved ResvCPU ResvCPURAW Start State Submit SubmitLine Suspended SystemCPU
    SystemComment Timelimit TimelimitRaw TotalCPU TRESUsageInAve TRESUsageInMax TRESUsageInMaxNode
    TRESUsageInMaxTask TRESUsageInMin TRESUsageInMinNode TRESUsageInMinTask TRESUsageInTot
    TRESUsageOutAve TRESUsageOutMax TRESUsageOutMaxNode TRESUsageOutMaxTask TRESUsageOutMin
    TRESUsageOutMinNode TRESUsageOutMinTask TRESUsageOutTot UID User UserCPU WCKey WCKeyID WorkDir
    """.split()) - frozenset(COLUMNS)
DEFAULT_FORMAT = ("JobID,User,GPUType,GPUIdx,Alloc,PredUtil,ActUtil,UtilErr,PredMem,ActMem,"
                  "MemErr,CoLocated,State,Elapsed,Predictor,QueueAct")


def elapsed_str(s) -> str:
    if s is None:
        return ""
    s = int(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}" if d else f"{h:02d}:{m:02d}:{sec:02d}"


def sacct_time(t) -> str:
    """Epoch seconds as sacct prints a time (local, YYYY-MM-DDTHH:MM:SS); 'Unknown' when unset."""
    return "Unknown" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def help_format() -> str:
    """The columns, as ``sacct -e`` prints its fields: four a line, each padded to 19."""
    names = list(COLUMNS.values())
    return "\n".join(" ".join(f"{n:<19}" for n in names[i:i + 4])
                     for i in range(0, len(names), 4)) + "\n"


def _errs(r: dict) -> tuple[float | None, float | None]:
    """(utilization error in pp, memory error in % of actual): predicted minus actual; none
    for a failed measurement (the GPU was never used: no error to speak of)."""
    ue = me = None
    if r.get("failed_measurement"):
        return ue, me
    if r.get("act_util_pct") is not None and r.get("pred_util_pct") is not None:
        ue = r["pred_util_pct"] - r["act_util_pct"]
    if r.get("act_mem_mib") and r.get("pred_mem_mib") is not None:
        me = 100.0 * (r["pred_mem_mib"] - r["act_mem_mib"]) / r["act_mem_mib"]
    return ue, me


def _shown(x) -> bool:
    """A figure worth printing: finite and within what a GPU figure can be (a ledger row written
    by an import or an old predictor may hold inf or 1e308, which --json already shows as null)."""
    return x is not None and math.isfinite(x) and abs(x) < 1e12


def _f1(x):
    return f"{x:.1f}" if _shown(x) else ""


def _signed(x):
    return f"{x:+.1f}" if _shown(x) else ""


def _mib(x):
    return f"{x:.0f}" if _shown(x) else ""


def alloc_str(r: dict) -> str:
    """'2 GPU' for whole GPUs, '25 shards' for shards of one, '' when unknown."""
    if r.get("gpus"):
        return f"{r['gpus']} GPU"
    if r.get("shards"):
        return f"{r['shards']} shard" + ("s" if r["shards"] != 1 else "")
    return ""


def under_claim_str(r: dict) -> str:
    if r.get("under_claim") is None:
        return ""
    return (r.get("claim_flags") or "yes") if r["under_claim"] else "no"


def hook_act_str(r: dict) -> str:
    """'shared', 'exclusive:util', 'unchanged:bad_hint'; '' when the hook left no decision."""
    if not r.get("hook_action"):
        return ""
    return r["hook_action"] + (f":{r['hook_reason']}" if r.get("hook_reason") else "")


def job_id_str(r: dict) -> str:
    """sacct's JobID of a ledger row: a heterogeneous job's component as HetJobId+HetJobOffset
    (``1234+0``, ``1234+1``: the leader is +0), an array task as ArrayJobId_ArrayTaskId
    (``1234_7``), as accounting gave them; any other job, and a row synced before its schema
    kept them, by its own id (JobIDRaw)."""
    if r.get("het_job_id") is not None and r.get("het_job_offset") is not None:
        return f"{r['het_job_id']}+{r['het_job_offset']}"
    if r.get("array_job_id") is not None and r.get("array_task_id") is not None:
        return f"{r['array_job_id']}_{r['array_task_id']}"
    return str(r["job_id"])


def cell(r: dict, col: str) -> str:
    """One column of one job as sacct would print it (empty when unknown)."""
    ue, me = _errs(r)
    c = col.lower()
    if c == "jobid":
        return job_id_str(r)
    if c == "jobidraw":  # the ledger keys array tasks and het components by their own ids
        return str(r["job_id"])
    if c == "cluster":
        return r.get("cluster") or ""
    if c == "user":
        return r.get("user_name") or ""
    if c == "account":
        return r.get("account") or ""
    if c == "family":
        return r.get("model_family") or ""
    if c == "gputype":
        return r.get("gpu_type") or ""
    if c == "gpuidx":
        return "" if r.get("gpu_index") is None else str(r["gpu_index"])
    if c in ("node", "nodelist"):
        return r.get("node") or ""
    if c == "alloc":
        return alloc_str(r)
    if c == "gpus":
        return "" if r.get("gpus") is None else str(r["gpus"])
    if c == "arrayjobid":
        return "" if r.get("array_job_id") is None else str(r["array_job_id"])
    if c == "arraytaskid":
        return "" if r.get("array_task_id") is None else str(r["array_task_id"])
    if c == "shards":
        return "" if r.get("shards") is None else str(r["shards"])
    if c == "predutil":
        return _f1(r.get("pred_util_pct"))
    if c == "actutil":
        return _f1(r.get("act_util_pct"))
    if c == "maxutil":
        return _f1(r.get("act_util_max"))
    if c == "utilerr":
        return _signed(ue)
    if c == "predmem":
        return _mib(r.get("pred_mem_mib"))
    if c == "actmem":
        return _mib(r.get("act_mem_mib"))
    if c == "memerr":
        return _signed(me)
    if c == "colocated":
        return r.get("colocated") or ""
    if c == "state":
        return r.get("state") or ""
    if c == "elapsed":
        return elapsed_str(r.get("elapsed_s"))
    if c == "elapsedraw":
        return "" if r.get("elapsed_s") is None else str(int(r["elapsed_s"]))
    if c == "submit":
        return sacct_time(r.get("submit_time"))
    if c == "start":
        return sacct_time(r.get("start_time"))
    if c == "end":
        return sacct_time(r.get("end_time"))
    if c == "predictor":
        return r.get("predictor") or ""
    if c == "sources":
        return r.get("sources") or ""
    if c == "underclaim":
        return under_claim_str(r)
    if c == "hookact":
        return hook_act_str(r)
    if c == "queueact":
        return r.get("queue_actions") or ""
    raise KeyError(col)


def _columns_named(name: str) -> list[str]:
    """The columns ``name`` asks for, as sacct reads a field name: case-insensitive, any prefix
    of one, the first in alphabetical order (sacct's table), and ALL (or a, al) for every one."""
    key = name.lower()
    if key in COLUMNS:
        return [key]
    if key and "all".startswith(key):
        return list(COLUMNS)
    hits = sorted(k for k in COLUMNS if k.startswith(key)) if key else []
    if hits:
        return hits[:1]
    valid = ", ".join(COLUMNS.values())
    if key and any(f.startswith(key) for f in SACCT_FIELDS):
        raise HorusError(f"field '{name}': the ledger does not record it (available: {valid})")
    raise HorusError(f"unknown field '{name}' (available: {valid})")


def parse_format(fmt: str | None) -> list[tuple[str, int | None]]:
    """'JobID,User%12' -> [('jobid', None), ('user', 12)]; 'elap' is Elapsed, as in sacct;
    unknown names raise HorusError."""
    out = []
    for part in (fmt or DEFAULT_FORMAT).split(","):
        part = part.strip()
        if not part:
            continue
        name, _, width = part.partition("%")
        keys = _columns_named(name.strip())
        try:  # ASCII digits, as sacct reads them (int() took '١٠' for 10)
            w = int(width) if width and width.lstrip("-").isascii() else (None if not width else 0)
        except ValueError:
            w = 0
        if w is not None and not 1 <= abs(w) <= MAX_WIDTH:  # -W: left-justified, as sacct
            raise HorusError(f"bad width in '{part}' (1..{MAX_WIDTH}, or -{MAX_WIDTH}..-1 left-justified)")
        out.extend((key, w) for key in keys)
    if not out:
        raise HorusError("empty --format")
    return out


def only_own_colocated(rows, own: set):
    """The rows with CoLocated cut to the jobs in ``own`` ((cluster, job id) of the reader's):
    where Slurm hides other users' jobs, their ids, even that they exist, are not the reader's
    to see (hacct and the per-user extracts)."""
    for r in rows:
        co = r.get("colocated")
        if co:
            ids = [x.strip() for x in co.split(",")]
            keep = [x for x in ids if x.isascii() and x.isdigit() and (r.get("cluster"), int(x)) in own]
            r = {**r, "colocated": ",".join(keep) or None}
        yield r


def job_json(r: dict) -> dict:
    ue, me = _errs(r)
    co = [int(x) for x in (r.get("colocated") or "").split(",") if x.strip()]
    return {"job_id": r["job_id"], "array_job_id": r.get("array_job_id"), "array_task_id": r.get("array_task_id"),
            "het_job_id": r.get("het_job_id"), "het_job_offset": r.get("het_job_offset"),
            "cluster": r.get("cluster"), "user": r.get("user_name"),
            "account": r.get("account"), "model_family": r.get("model_family"),
            "gpu_type": r.get("gpu_type"), "gpu_index": r.get("gpu_index"),
            "node": r.get("node"), "gpus": r.get("gpus"), "shards": r.get("shards"),
            "state": r.get("state"),
            "elapsed_s": r.get("elapsed_s"), "submit_time": r.get("submit_time"),
            "pred_util_pct": _round(r.get("pred_util_pct")),
            "pred_mem_mib": _round(r.get("pred_mem_mib")),
            "actual_util_pct": _round(r.get("act_util_pct")),
            "actual_util_max_pct": _round(r.get("act_util_max")),
            "actual_mem_mib": _round(r.get("act_mem_mib")),
            "util_err_pp": _round(ue), "mem_err_pct": _round(me), "colocated": co,
            "predictor": r.get("predictor"), "sources": r.get("sources"),
            "pred_mem_p90_mib": _round(r.get("pred_mem_p90_mib")),
            "under_claim": None if r.get("under_claim") is None else bool(r["under_claim"]),
            "claim_flags": r.get("claim_flags"), "hook_action": r.get("hook_action"),
            "hook_reason": r.get("hook_reason"),
            "queue_actions": r["queue_actions"].split(",") if r.get("queue_actions") else []}


def _round(x, n=2):
    return None if x is None else round(float(x), n)


MAX_WIDTH = 1000  # a column wider than any terminal; each cell is padded to it


def printable(text: str) -> str:
    """A cell without control characters: ledger text that came from users (a model path, an
    account) must not drive the reader's terminal."""
    return CONTROL_CHARS.sub("?", text)


def column_widths(rows: Iterable[dict], cols: list[tuple[str, int | None]]) -> list[int]:
    """The fixed-width table's columns: the ``%W`` asked, else the widest cell or heading
    (one pass over ``rows``, which may be a stream)."""
    widths = [abs(w) if w else len(COLUMNS[c]) for c, w in cols]
    free = [i for i, (_, w) in enumerate(cols) if not w]
    for r in rows:
        for i in free:
            widths[i] = max(widths[i], len(printable(cell(r, cols[i][0]))))
    return widths


def plain_lines(rows: Iterable[dict], cols: list[tuple[str, int | None]], parsable: bool,
                noheader: bool, trailing: bool = False,
                widths: list[int] | None = None, delimiter: str = "|") -> Iterator[str]:
    """sacct's text, line by line: fixed ``widths`` (column_widths), or ``parsable``
    ``delimiter``-separated (``trailing``: with one at the end of each line, as sacct -p)."""
    heads = [COLUMNS[c] for c, _ in cols]
    if parsable:
        end = delimiter if trailing else ""
        if not noheader:
            yield delimiter.join(heads) + end
        for r in rows:
            yield delimiter.join(printable(cell(r, c)) for c, _ in cols) + end
        return
    left = [w is not None and w < 0 for _, w in cols]  # Name%-W

    def fit(v: str, w: int, lj: bool) -> str:
        return v[:w - 1] + "+" if len(v) > w else (v.ljust(w) if lj else v.rjust(w))

    if not noheader:
        yield " ".join(fit(h[:w], w, lj) for h, w, lj in zip(heads, widths, left))
        yield " ".join("-" * w for w in widths)
    for r in rows:
        yield " ".join(fit(v, w, lj) for v, w, lj in
                       zip((printable(cell(r, c)) for c, _ in cols), widths, left))


def rich_table(rows: list[dict], cols, noheader: bool):
    from rich.markup import escape
    from rich.table import Table

    t = Table(show_header=not noheader, header_style="bold", box=None, pad_edge=False)
    for c, w in cols:  # Name%W: at most W characters, as in the plain table
        t.add_column(COLUMNS[c], justify="left" if c in ("user", "state", "predictor", "gputype",
                                                           "node", "nodelist", "family", "colocated",
                                                           "underclaim", "hookact", "queueact")
                     or (w or 0) < 0 else "right", no_wrap=True, max_width=abs(w) if w else None,
                     overflow="ellipsis")
    for r in rows:
        vals = []
        for c, _ in cols:
            v = escape(printable(cell(r, c)))
            if c in ("utilerr", "memerr") and v:
                x = float(v)  # far: actual use far above the prediction (see FAR_*)
                far = x < (-FAR_UTIL_PP if c == "utilerr" else (1 / FAR_MEM_FACTOR - 1) * 100)
                v = f"[red]{v}[/red]" if far else v
            elif c == "underclaim" and r.get("under_claim"):
                v = f"[red]{v}[/red]"
            vals.append(v)
        t.add_row(*vals)
    return t


# --------------------------------------------------------------------------- summary

SUMS = ("measured", "failed", "np90", "inp90", "nu", "su", "squ", "sqm", "far", "audited",
        "under")
FLOAT_SUMS = ("su", "squ", "sqm")  # the others are counts (MariaDB sums integers as Decimal)


def summary(ledger, *, far_limit: int = 20, own: set | None = None, **filters) -> dict:
    """Accuracy and under-claims by model family, GPU type, user and predictor source: one
    aggregating scan of the covering index ix_jobs_summary over the terms each jobs row stores
    (ledger.jobs.accuracy_terms), grouped down to the memory-error bin for the medians, plus a
    top-N query of the jobs far above their prediction.  ``own``: where Slurm hides other
    users' jobs, the reader's (cluster, job id)s, the only ones those rows name as co-located
    (only_own_colocated)."""
    from sqlalchemy import func, select

    j = tables()["jobs"]
    keys = (j.c.model_family, j.c.gpu_type, j.c.user_name, j.c.predictor_source)
    stmt = select(
        *keys, j.c.mem_err_bucket, func.count(),
        func.sum(j.c.measured), func.sum(j.c.failed_measurement), func.count(j.c.within_p90),
        func.sum(j.c.within_p90), func.count(j.c.util_abs_err_pp), func.sum(j.c.util_abs_err_pp),
        func.sum(j.c.util_sq_log_err), func.sum(j.c.mem_sq_log_err), func.sum(j.c.far),
        func.count(j.c.under_claim), func.sum(j.c.under_claim))
    stmt = job_filters(stmt, submitted_only=True, **filters)
    stmt = stmt.group_by(j.c.has_submission, *keys, j.c.mem_err_bucket)
    # One leaf per (family, GPU type, user, source): the SQL groups fold into leaves, and each
    # leaf then counts once in each of the six breakdowns.
    leaves: dict[tuple, dict] = {}
    with ledger.engine.connect() as conn:
        for fam, gt, user, source, b, n, *sums in conn.execute(stmt):
            g = leaves.get((fam, gt, user, source))
            if g is None:
                g = leaves[(fam, gt, user, source)] = _acc()
            g["jobs"] += n
            for k, v in zip(SUMS, sums):
                if v:
                    g[k] += v
            if b is not None and b >= 0:
                g["hist"][b] = g["hist"].get(b, 0) + n
        far_rows = _far_jobs(conn, filters, far_limit, own)
        queue = _queue_counts(conn, filters)
    groups: dict[str, dict] = {"all": {}, "model_family": {}, "gpu_type": {}, "user": {},
                               "predictor": {}, "gpu_type_predictor": {}}
    for (fam, gt, user, source), leaf in leaves.items():
        for k in SUMS:
            leaf[k] = float(leaf[k]) if k in FLOAT_SUMS else int(leaf[k])
        for dim, key in (("all", "all"), ("model_family", fam), ("gpu_type", gt),
                         ("user", user), ("predictor", source),
                         ("gpu_type_predictor", f"{gt or '-'} {source or '-'}")):
            g = groups[dim].setdefault(key if key is not None else "-", _acc())
            g["jobs"] += leaf["jobs"]
            for k in SUMS:
                g[k] += leaf[k]
            for b, n in leaf["hist"].items():
                g["hist"][b] = g["hist"].get(b, 0) + n
    out = {}
    for dim, gs in groups.items():
        out[dim] = {k: _finish(v) for k, v in sorted(gs.items(), key=lambda kv: str(kv[0]))}
    out["all"] = out["all"].get("all", _finish(_acc()))
    out["far_exceeding"] = far_rows
    out["queue_actions"] = queue
    out["thresholds"] = {"util_pp": FAR_UTIL_PP, "mem_factor": FAR_MEM_FACTOR}
    return out


def _acc():
    return {"jobs": 0, **{k: 0 for k in SUMS}, "hist": {}}


def _median_from_hist(hist: dict[int, int]) -> float | None:
    """The median of the binned values: the middle one (the mean of the two middle ones for an
    even count), each placed within its bin as if the bin's values were evenly spread (the
    k-th of c at (k - 1/2) / c of the bin): each lies in the bin of the value it stands for, so
    the median is off by less than a bin (docs/ledger.md)."""
    total = sum(hist.values())
    if not total:
        return None
    ranks = (total // 2 + 1,) if total % 2 else (total // 2, total // 2 + 1)
    bins = sorted(hist)

    def value_at(r: int) -> float:
        cum = 0
        for b in bins:
            c = hist[b]
            if cum + c >= r:
                lo, hi = mem_err_bucket_bounds(b)
                return lo + (hi - lo) * (r - cum - 0.5) / c
            cum += c
        raise AssertionError("rank beyond the histogram")
    return sum(value_at(r) for r in ranks) / len(ranks)


def _finish(g: dict) -> dict:
    nm = sum(g["hist"].values())
    med = _median_from_hist(g["hist"])
    return {"jobs": g["jobs"], "measured": g["measured"],
            "coverage_pct": round(100.0 * g["measured"] / g["jobs"], 2) if g["jobs"] else None,
            "excluded": g["failed"], "p90_jobs": g["np90"],
            "p90_coverage_pct": round(100.0 * g["inp90"] / g["np90"], 2) if g["np90"] else None,
            "util_mae_pp": round(g["su"] / g["nu"], 3) if g["nu"] else None,
            "util_rmsle": round(math.sqrt(g["squ"] / g["nu"]), 4) if g["nu"] else None,
            "mem_rmsle": round(math.sqrt(g["sqm"] / nm), 4) if nm else None,
            "mem_median_rel_err_pct": round(med * 100, 2) if med is not None else None,
            "far_exceeding": g["far"], "claims_audited": g["audited"],
            "under_claims": g["under"]}


def _far_jobs(conn, filters: dict, limit: int, own: set | None = None) -> list[dict]:
    """The jobs counted as far above their prediction, the largest memory ratio first."""
    from sqlalchemy import case, func, select

    j = tables()["jobs"]
    ratio = case((j.c.pred_mem_mib > 0, j.c.act_mem_mib / j.c.pred_mem_mib), else_=0)
    uerr = func.coalesce(j.c.act_util_pct - j.c.pred_util_pct, 0)
    stmt = job_filters(select(j).where(j.c.far == 1), submitted_only=True, **filters)
    stmt = stmt.order_by(ratio.desc(), uerr.desc(), j.c.job_id).limit(limit)
    rows = (r._asdict() for r in conn.execute(stmt))
    return [job_json(r) for r in (rows if own is None else only_own_colocated(rows, own))]


def _queue_counts(conn, filters: dict) -> dict:
    """How often ``horus-admin queue`` acted, per action, and how many OOM-requeued jobs then
    completed: one range of the index ix_jobs_queue (only the jobs the loop touched)."""
    from sqlalchemy import func, select

    j = tables()["jobs"]
    stmt = job_filters(select(j.c.queue_actions, j.c.state, func.count()).where(
        j.c.queue_actions.is_not(None)), submitted_only=True, **filters)
    out = {"oom_requeues": 0, "oom_requeues_completed": 0, "pack": 0, "spread": 0}
    for acts, state, n in conn.execute(stmt.group_by(j.c.queue_actions, j.c.state)):
        acts = acts.split(",")
        for a in ("pack", "spread"):
            out[a] += n * acts.count(a)
        if "oom-requeue" in acts:
            out["oom_requeues"] += n
            out["oom_requeues_completed"] += n if (state or "").startswith("COMPLETED") else 0
    return out


def summary_text(s: dict) -> str:
    def line(name, g):  # a family or predictor from a user's hint: printable, as in the list
        f = lambda x, fmt: fmt.format(x) if _shown(x) else "-"  # noqa: E731  (inf: as --json's null)
        return (f"{printable(str(name))[:24]:<24} {g['jobs']:>9} {f(g['coverage_pct'], '{:.1f}%'):>8} "
                f"{g['excluded']:>8} "
                f"{f(g['util_mae_pp'], '{:.1f}'):>8} {f(g['util_rmsle'], '{:.3f}'):>9} "
                f"{f(g['mem_median_rel_err_pct'], '{:.1f}%'):>9} {f(g['mem_rmsle'], '{:.3f}'):>8} "
                f"{f(g['p90_coverage_pct'], '{:.1f}%'):>7} "
                f"{g['far_exceeding']:>6} {g['under_claims']:>10}")
    head = (f"{'':<24} {'Jobs':>9} {'Measured':>8} {'Excluded':>8} {'UtilMAE':>8} "
            f"{'UtilRMSLE':>9} {'MemMdRE':>9} {'MemRMSLE':>8} {'P90Cov':>7} {'Far':>6} "
            f"{'UnderClaim':>10}")
    out = [head, line("all", s["all"])]
    for dim, title in (("model_family", "by model family"), ("gpu_type", "by GPU type"),
                       ("user", "by user"), ("predictor", "by predictor"),
                       ("gpu_type_predictor", "by GPU type and predictor")):
        out.append(f"-- {title}")
        out += [line(k, g) for k, g in s[dim].items()]
    out.append("-- Measured: jobs with a measurement; Excluded: failed measurements (the GPU was "
               "never used), in no figure; P90Cov: jobs whose memory stayed within the p90 "
               "bound; errors: docs/definitions.md")
    q = s["queue_actions"]
    out.append(f"-- horus-admin queue: {q['oom_requeues']} OOM requeues "
               f"({q['oom_requeues_completed']} then completed), {q['pack']} packed under queue "
               f"pressure, {q['spread']} spread back")
    far = s["far_exceeding"]
    out.append(f"-- jobs whose actual use far exceeds the prediction (util > +"
               f"{FAR_UTIL_PP:.0f} pp or memory > x{FAR_MEM_FACTOR}): {len(far)} shown")
    for r in far:  # a figure not known (a job far above on memory alone): '-', never 'None'
        out.append(f"{job_id_str(r):>10} {printable(r['user'] or ''):<10} "
                   f"{printable(r['gpu_type'] or ''):<10} "
                   f"util {_f1(r['pred_util_pct']) or '-'} -> {_f1(r['actual_util_pct']) or '-'}  "
                   f"mem {_mib(r['pred_mem_mib']) or '-'} -> {_mib(r['actual_mem_mib']) or '-'} MiB")
    return "\n".join(out) + "\n"
