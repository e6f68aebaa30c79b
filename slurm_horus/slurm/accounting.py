"""``sacct --json`` parsed into flat job dicts: what Slurm accounting says a job was and used.

Layouts handled: openapi v0.0.38 (22.05: scalar ``state.current``, plain numbers) and the
data_parser layouts v0.0.39 .. v0.0.44 (23.02 .. 25.11: ``state.current`` a list, numbers
possibly ``{"set", "infinite", "number"}``: ``num`` reads both). GPU use comes from the steps'
TRESUsageIn (``steps[].tres.requested.max/average``: ``gres/gpuutil`` in percent, ``gres/gpumem``
in bytes), which Slurm records from 23.02 with AutoDetect=nvml; 22.05 has neither (then util/mem
stay None and horus-probe is the source). Text forms (``gres/gpumem=36266M``, raw bytes) parse
too. Neither 22.05 nor 25.11 prints ``gres_detail`` (the GPU index) in ``sacct --json``. Times of
0 or >= 4294967294 (never started, not ended) are None.

The scheduler layer's marks in a job's AdminComment are read here too (``scheduler_actions``):
the hook's decision token (``hint.parse_decision``) and the tokens ``horus-admin queue`` appends
(``QUEUE_TOKEN``, ``queue_tokens``). Only admins can set AdminComment, so they are Slurm's facts,
unlike the user's Comment.

Pure functions; running sacct is ``commands.run_sacct``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from slurm_horus.errors import HorusError
from slurm_horus.slurm.hint import parse_decision
from slurm_horus.slurm.parse import json_errors, parse_gres

__all__ = ["FINISHED", "QUEUE_TOKEN", "RECORD_ERRORS", "STATE_ABBREV", "num", "size_mib", "parse_tres_string",
           "gres_placement", "parse_job", "parse_sacct_json", "queue_tokens", "scheduler_actions"]

FINISHED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
_UNITS = {"": None, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2, "P": 1024.0 ** 3}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)i?B?\s*$", re.I)
# Slurm's NO_VAL (4294967294) and INFINITE (4294967295) as uint32 in a time field (time.start /
# time.end of a job that never started or has not ended; a limit in minutes): unset, at or above it
UNSET_TIME = 4294967294
QUEUE_TOKEN = "horus-queue:v1"
QUEUE_ACTIONS_MAX = 255  # jobs.queue_actions is VARCHAR(255)
_QUEUE_RE = re.compile(re.escape(QUEUE_TOKEN) + r"((?:;[a-z]+=[A-Za-z0-9:/._-]*)+)")
# the job states sacct -s takes, by their short names (sacct(1), JOB STATE CODES)
STATE_ABBREV = {"CD": "COMPLETED", "F": "FAILED", "TO": "TIMEOUT", "CA": "CANCELLED",
                "OOM": "OUT_OF_MEMORY", "NF": "NODE_FAIL", "PR": "PREEMPTED", "R": "RUNNING",
                "PD": "PENDING", "BF": "BOOT_FAIL", "DL": "DEADLINE", "RQ": "REQUEUED",
                "S": "SUSPENDED", "RS": "RESIZING", "RV": "REVOKED"}


def num(v: Any) -> float | None:
    """A number from a plain value or a data_parser ``{set, infinite, number}`` struct."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, dict):
        if v.get("infinite") or v.get("set") is False:
            return None
        return num(v.get("number"))
    if isinstance(v, str):
        try:
            return float(v) if "." in v else int(v)
        except ValueError:
            return None
    return None


def size_mib(v: Any) -> float | None:
    """Memory as MiB: '36266M' -> 36266, '1.5G' -> 1536, '40777023488' or 40777023488 (bytes)."""
    if v is None:
        return None
    if isinstance(v, dict):
        v = num(v)
        if v is None:
            return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v) / 2 ** 20
    m = _SIZE_RE.match(str(v))
    if not m:
        raise HorusError(f"not a memory size: {v!r}")
    value, unit = float(m.group(1)), m.group(2).upper()
    scale = _UNITS[unit]
    return value / 2 ** 20 if scale is None else value * scale


def parse_tres_string(s: str | None) -> dict[str, str]:
    """'cpu=1,gres/gpumem=36266M,gres/gpuutil=100' -> {'cpu': '1', 'gres/gpumem': '36266M', ...}."""
    out = {}
    for part in (s or "").split(","):
        k, sep, v = part.partition("=")
        if sep and k.strip():
            out[k.strip()] = v.strip()
    return out



def _tres_map(entries) -> dict[str, Any]:
    out = {}
    if isinstance(entries, str):
        return parse_tres_string(entries)
    for e in entries or []:
        if not isinstance(e, dict):
            continue
        key = e.get("type") or ""
        if e.get("name"):
            key = f"{key}/{e['name']}"
        out[key] = e.get("count")
    return out


def _state(v) -> str | None:
    if isinstance(v, dict):
        v = v.get("current")
    if isinstance(v, list):
        v = v[0] if v else None
    return str(v).upper() if v else None


def gres_placement(details) -> tuple[str | None, int | None]:
    """(gpu type, first GPU index) of the first gpu/shard/mps item of a gres_detail list
    (``['shard:30(IDX:0)']``, ``'gpu:a100:1(IDX:2)'``, 25.11's ``shard:23(23/100,0/100)``)."""
    if isinstance(details, str):
        details = [details]
    for d in details or []:
        for g in parse_gres(str(d)):
            if g["name"] in ("gpu", "shard", "mps"):
                return g["type"], g["idx"][0] if g["idx"] else None
    return None, None


def _gres_counts(alloc: dict) -> tuple[dict[str, int], str | None]:
    """({"gpu": n, "shard": m}, gpu type) from allocated TRES: a whole-GPU job counts GPUs, a
    shared one shards, never one as the other. The untyped ``gres/gpu`` is the total where
    Slurm lists it; else the typed ones (``gres/gpu:a100``) are summed."""
    per: dict[str, dict[str, float]] = {}
    gtype = None
    for k, v in alloc.items():
        m = re.fullmatch(r"gres/(gpu|shard)(?::([A-Za-z0-9_.-]+))?", k)
        if m and num(v):
            per.setdefault(m.group(1), {})[m.group(2) or ""] = num(v)
            gtype = gtype or m.group(2)
    counts = {name: int(d[""] if "" in d else sum(d.values())) for name, d in per.items()}
    return counts, gtype


def _epoch(v) -> int | None:
    """Epoch seconds of a sacct time; None for 0 and the unset sentinels (>= 4294967294)."""
    v = num(v)
    return None if not v or v >= UNSET_TIME else int(v)


def _gpu_use(steps: list) -> dict:
    """Max util/mem over steps; mean util weighted by step elapsed."""
    util_max = mem = None
    wsum = wtot = 0.0
    for st in steps or []:
        req = (st.get("tres") or {}).get("requested") or {}
        mx, av = _tres_map(req.get("max")), _tres_map(req.get("average"))
        u, a, m = num(mx.get("gres/gpuutil")), num(av.get("gres/gpuutil")), mx.get("gres/gpumem")
        if u is not None:
            util_max = max(util_max or 0.0, float(u))
        if m is not None:
            mib = size_mib(m)
            if mib is not None:
                mem = max(mem or 0.0, mib)
        if a is not None:
            w = max(float(num((st.get("time") or {}).get("elapsed")) or 0), 1.0)
            wsum += float(a) * w
            wtot += w
    return {"util_max": util_max, "util_mean": wsum / wtot if wtot else None,
            "mem_peak_mib": mem}


def parse_job(j: dict) -> dict:
    """One sacct --json job as a flat dict (the fields sync records)."""
    t = j.get("time") or {}
    alloc = _tres_map((j.get("tres") or {}).get("allocated"))
    counts, gtype = _gres_counts(alloc)
    dtype, gidx = gres_placement(j.get("gres_detail"))
    gtype = dtype or gtype
    comment = admin = j.get("comment")
    if isinstance(comment, dict):
        comment, admin = comment.get("job"), comment.get("administrator")
    else:
        admin = None
    nodes = j.get("nodes")
    if isinstance(nodes, list):
        nodes = ",".join(nodes)
    if nodes in ("", "None assigned"):
        nodes = None
    use = _gpu_use(j.get("steps") or [])
    assoc = j.get("association") or {}
    return {
        "cluster": j.get("cluster") or assoc.get("cluster") or "",
        "job_id": _job_id(num(j.get("job_id"))),
        "user": j.get("user") or assoc.get("user"),
        "account": j.get("account") or assoc.get("account"),
        "state": _state(j.get("state")),
        "elapsed_s": _int(num(t.get("elapsed"))),
        "submit_time": _int(num(t.get("submission"))),
        "start_time": _epoch(t.get("start")),
        "end_time": _epoch(t.get("end")),
        "node": nodes,
        "shards": counts.get("shard"),
        "gpus": counts.get("gpu"),
        "cpus": _int(num(alloc.get("cpu"))),
        "gpu_type": gtype,
        "gpu_index": gidx,
        "comment": comment,
        "admin_comment": admin or None,
        "array": _member(j.get("array"), "task_id"),
        "het": _member(j.get("het"), "job_offset"),
        **use,
    }


def _member(a, place: str) -> tuple[int, int] | None:
    """(the parent's job id, the job's ``place`` in it) of an array task (ArrayJobId, ArrayTaskId:
    "task_id") or a heterogeneous job's component (HetJobId, HetJobOffset: "job_offset"); None
    for other jobs (22.05 gives job_id 0 and no place)."""
    if not isinstance(a, dict):
        return None
    job, task = num(a.get("job_id")), num(a.get(place))
    if not job or task is None or not 0 <= task < 2 ** 32:
        return None
    return _job_id(job), int(task)


def _int(v):
    """A count or a time as Slurm gives it: none is negative or above 2^63 (the ledger's
    integers); another value makes the record one that does not parse."""
    if v is None:
        return None
    v = int(v)
    if not 0 <= v < 1 << 63:
        raise ValueError(f"{v} out of range")
    return v


def _job_id(v) -> int:
    v = int(v)
    if not 0 < v < 1 << 32:  # Slurm's job ids are 32-bit
        raise ValueError(f"job id {v} out of range")
    return v


# what parse_job raises on a record it cannot read: skipped wherever sacct's jobs are read
RECORD_ERRORS = (TypeError, ValueError, KeyError, AttributeError, OverflowError, HorusError)


def parse_sacct_json(data: str | bytes | dict) -> list[dict]:
    """Every job of a ``sacct --json`` reply as ``parse_job`` gives it; a record that does not
    parse is skipped (one odd job must not stop a sync), a reply that is not sacct's is an error."""
    if not isinstance(data, dict):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise HorusError(f"sacct --json: not JSON ({type(e).__name__})") from None
    json_errors(data, "sacct --json")
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        raise HorusError("sacct --json: no 'jobs' list")
    out = []
    for j in jobs:
        if not isinstance(j, dict):
            continue
        try:
            out.append(parse_job(j))
        except RECORD_ERRORS:
            continue  # one odd record must not stop a sync
    return out


def queue_tokens(admin_comment: str | None) -> list[dict[str, str]]:
    """What ``horus-admin queue`` did to a job, oldest first: its ``horus-queue:v1;k=v;...``
    tokens in AdminComment as dicts (``{"action": "oom-requeue", "from": "shard:30"}``)."""
    return [dict(kv.split("=", 1) for kv in m.group(1).strip(";").split(";"))
            for m in _QUEUE_RE.finditer(admin_comment or "")]


def scheduler_actions(admin_comment: str | None) -> dict:
    """What the scheduler layer did to a job, from its AdminComment: the hook's decision
    (``hook_action`` shared/exclusive/unchanged, ``hook_reason`` its code) and the queue loop's
    actions in order (``queue_actions``, comma-separated: ``pack,spread``, ``oom-requeue``);
    None where there is none."""
    decision = parse_decision(admin_comment)
    acts = [t["action"] for t in queue_tokens(admin_comment) if t.get("action")]
    while len(",".join(acts)) > QUEUE_ACTIONS_MAX:  # the column's width: the latest ones count
        acts.pop(0)
    return {"hook_action": decision.action if decision else None,
            "hook_reason": decision.reason if decision else None,
            "queue_actions": ",".join(acts) or None}
