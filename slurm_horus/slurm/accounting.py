"""``sacct --json`` parsed into flat job dicts: what Slurm accounting says a job was and used.

Layouts handled: openapi v0.0.38 (22.05: scalar ``state.current``, plain numbers) and the
data_parser layouts v0.0.39 .. v0.0.44 (23.02 .. 25.11: ``state.current`` a list, numbers
possibly ``{"set", "infinite", "number"}``: ``num`` reads both). GPU use comes from the steps'
TRESUsageIn (``steps[].tres.requested.max/average/total``: ``gres/gpuutil`` in percent,
``gres/gpumem`` in bytes), which Slurm records from 23.02 with AutoDetect=nvml; 22.05 has neither
(then util/mem stay None and horus-probe is the source). Slurm's figures are per task; they are
made per GPU by the step's layout (``_gpu_use``). Text forms (``gres/gpumem=36266M``, raw
bytes) parse too. Neither 22.05 nor 25.11 prints ``gres_detail`` (the GPU index) in
``sacct --json``. Times of 0 or >= 4294967294 (never started, not ended) are None.

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
    Slurm lists it; else the typed ones (``gres/gpu:a100``) are summed. The type is None where
    the job held GPUs of several types (a multi-node job on an A100 node and a T4 node): the
    first one listed had been recorded as the type of all its GPUs."""
    per: dict[str, dict[str, float]] = {}
    types = set()
    for k, v in alloc.items():
        m = re.fullmatch(r"gres/(gpu|shard)(?::([A-Za-z0-9_.-]+))?", k)
        if m and num(v):
            per.setdefault(m.group(1), {})[m.group(2) or ""] = num(v)
            types |= {m.group(2)} if m.group(2) else set()
    counts = {name: int(d[""] if "" in d else sum(d.values())) for name, d in per.items()}
    return counts, types.pop() if len(types) == 1 else None


def _epoch(v) -> int | None:
    """Epoch seconds of a sacct time; None for 0 and the unset sentinels (>= 4294967294)."""
    v = num(v)
    return None if not v or v >= UNSET_TIME else int(v)


def _step_id(st: dict) -> str:
    """A step's own part of its id: 'batch', 'extern', '0' ('198.batch', 22.05's 'batch')."""
    s = st.get("step") or {}
    return str(s.get("id") if isinstance(s, dict) else "").rsplit(".", 1)[-1]


def _step_layout(st: dict, job_gpus: int | None, job_nodes: int | None) -> tuple[int, int | None]:
    """(GPUs the step held, its tasks or None where unknown) from what sacct says of the step.

    The GPUs are the step's own allocated ``gres/gpu`` (a batch step's are those of its node:
    slurmctld's step_set_alloc_tres); a step on shards, or one whose allocation names no GPU,
    counts one GPU per node where the job is on shards, else the job's GPUs per node on the
    step's nodes (rounded down: dividing by fewer GPUs never under-reports; one per node where
    the job's nodes are unknown). Tasks: the step's
    ``tasks.count``; the batch step has one (Slurm's own count for it), another step without
    the field is unknown."""
    tres = st.get("tres") or {}
    counts, _ = _gres_counts(_tres_map(tres.get("allocated")))
    nodes = st.get("nodes")
    nodes = num(nodes.get("count")) if isinstance(nodes, dict) else None
    nodes = int(nodes) if nodes and nodes >= 1 else 1
    if counts.get("gpu"):
        gpus = counts["gpu"]
    elif counts.get("shard") or not job_gpus or not job_nodes:
        gpus = nodes
    else:
        gpus = job_gpus * min(nodes, job_nodes) // job_nodes
    tasks = st.get("tasks")
    tasks = num(tasks.get("count")) if isinstance(tasks, dict) else num(tasks)
    if not tasks or tasks < 1:
        tasks = 1 if _step_id(st) == "batch" else None
    return max(1, int(gpus)), None if tasks is None else int(tasks)


def _step_per_gpu(task_fig, total, gpus: int, tasks: int | None) -> float | None:
    """One step's figure per GPU from Slurm's per-task one (TRESUsageInMax or Ave: one task's
    processes summed over every GPU they used) and TRESUsageInTot (all tasks' last samples
    summed). A task held gpus / tasks GPUs (rounded down, at least one: where tasks share GPUs
    or the split is uneven the figure is never divided by more GPUs than a task surely held);
    where several tasks share a GPU it holds at least their sum, so the total over the step's
    GPUs bounds it from below too. Both are lower bounds of the busiest GPU: the larger wins."""
    per_task = max(1, gpus // tasks) if tasks else 1
    out = [float(task_fig) / per_task] if task_fig is not None else []
    if total is not None:
        out.append(float(total) / gpus)
    return max(out) if out else None


def _gpu_use(steps: list, job_gpus: int | None = None, job_nodes: int | None = None) -> dict:
    """The job's GPU use from its steps' TRESUsageIn, summed over its GPUs (each figure per GPU
    times the job's GPUs), which is what a usage row holds for a job on n GPUs (jobs.merge_job
    divides by n): max util/mem over steps; mean util weighted by step elapsed.

    What Slurm's figures are (25.11 source): gpu/nvml's gpu_p_usage_read gives a process's own
    memory (usedGpuMemory) and SM utilization summed over every GPU it runs on, never a
    device's total; jobacct_gather sums a task's process tree, keeps its latest sample (Tot)
    and its maximum over time (Max); across tasks Max is the largest task's, Tot the sum, and
    slurmdbd stores Ave = Tot / the step's tasks (1 for the batch step). So a step's per-GPU
    figure depends on its layout (``_step_layout``, ``_step_per_gpu``). A step whose processes
    never held GPU memory nor used a GPU (all its GPU TRES 0: a batch script that only runs
    srun, the extern step once pam_slurm_adopt or an orphan adds a process to it) says nothing
    of the job's GPU work and does not dilute its mean; alone, its zeros are the job's."""
    util_max = mem = None
    means: list[tuple[float, float, bool]] = []
    for st in steps or []:
        req = (st.get("tres") or {}).get("requested") or {}
        mx, av = _tres_map(req.get("max")), _tres_map(req.get("average"))
        tot = _tres_map(req.get("total"))
        gpus, tasks = _step_layout(st, job_gpus, job_nodes)
        u, a, ut = (num(m.get("gres/gpuutil")) for m in (mx, av, tot))
        m, ma, mt = (size_mib(x.get("gres/gpumem")) for x in (mx, av, tot))
        if ut is None and a is not None and tasks:
            ut = a * tasks  # Ave = Tot / tasks
        if mt is None and ma is not None and tasks:
            mt = ma * tasks
        if u is None and m is None and a is None:
            continue
        idle = not u and not m and not a
        pu = _step_per_gpu(u, ut, gpus, tasks)
        if pu is not None:
            util_max = max(util_max or 0.0, min(pu, 100.0))
        pm = _step_per_gpu(m, mt, gpus, tasks)
        if pm is not None:
            mem = max(mem or 0.0, pm)
        pa = _step_per_gpu(a, ut, gpus, tasks)
        if pa is not None:
            w = max(float(num((st.get("time") or {}).get("elapsed")) or 0), 1.0)
            means.append((min(pa, 100.0), w, idle))
    busy = [x for x in means if not x[2]] or means
    wtot = sum(w for _, w, _ in busy)
    n = job_gpus if job_gpus and job_gpus > 1 else 1
    return {"util_max": None if util_max is None else util_max * n,
            "util_mean": sum(v * w for v, w, _ in busy) / wtot * n if wtot else None,
            "mem_peak_mib": None if mem is None else mem * n}


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
    job_nodes = num(j.get("allocation_nodes"))
    use = _gpu_use(j.get("steps") or [], counts.get("gpu"),
                   int(job_nodes) if job_nodes and job_nodes >= 1 else None)
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
