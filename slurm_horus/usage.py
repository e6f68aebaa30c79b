"""Actual GPU use from Slurm accounting: parse ``sacct --json`` and sync it into the ledger.

Layouts handled: openapi v0.0.38 (22.05: scalar ``state.current``, plain numbers) and the
data_parser layouts v0.0.39 .. v0.0.44 (23.02 .. 25.11: ``state.current`` a list, numbers
possibly ``{"set", "infinite", "number"}``). GPU use comes from the steps' TRESUsageIn
(``steps[].tres.requested.max/average``: ``gres/gpuutil`` in percent, ``gres/gpumem`` in bytes),
which Slurm records from 23.02 with AutoDetect=nvml; 22.05 has neither (then util/mem stay NULL
and horus-probe is the source). Text forms (``gres/gpumem=36266M``, raw bytes) parse too.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Iterable

from .errors import HorusError

FINISHED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
_UNITS = {"": None, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2, "P": 1024.0 ** 3}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)i?B?\s*$", re.I)
_GRES_IDX_RE = re.compile(r"^(?:gres[:/])?(shard|gpu|mps)(?::([A-Za-z0-9_.-]+))?(?::|=)?(\d+)?"
                          r"\(IDX:([0-9,\-]+)\)")
STATE_ABBREV = {"CD": "COMPLETED", "F": "FAILED", "TO": "TIMEOUT", "CA": "CANCELLED",
                "OOM": "OUT_OF_MEMORY", "NF": "NODE_FAIL", "PR": "PREEMPTED", "R": "RUNNING",
                "PD": "PENDING", "BF": "BOOT_FAIL", "DL": "DEADLINE", "RQ": "REQUEUED",
                "S": "SUSPENDED"}


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


def gpu_use_from_tres_strings(max_s: str | None, ave_s: str | None = None) -> dict:
    """util/mem from sacct text TRESUsageInMax / TRESUsageInAve."""
    mx, av = parse_tres_string(max_s), parse_tres_string(ave_s)
    out = {"util_max": None, "util_mean": None, "mem_peak_mib": None}
    if "gres/gpuutil" in mx:
        out["util_max"] = float(mx["gres/gpuutil"])
    if "gres/gpuutil" in av:
        out["util_mean"] = float(av["gres/gpuutil"])
    if "gres/gpumem" in mx:
        out["mem_peak_mib"] = size_mib(mx["gres/gpumem"])
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


def parse_gres_detail(details) -> tuple[str | None, int | None]:
    """(gpu type, first GPU index) from ['shard:30(IDX:0)'] or 'gpu:a100:1(IDX:2)'."""
    if isinstance(details, str):
        details = [details]
    for d in details or []:
        for part in str(d).split(","):
            m = _GRES_IDX_RE.search(part.strip())
            if m:
                kind, typ, _count, idx = m.groups()
                if typ and typ.isdigit():  # shard:30(IDX:0): the number is a count
                    typ = None
                first = re.split(r"[,\-]", idx)[0]
                return typ, int(first) if first.isdigit() else None
    return None, None


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
    shards = num(alloc.get("gres/shard"))
    gpus = num(alloc.get("gres/gpu"))
    gtype, gidx = parse_gres_detail(j.get("gres_detail"))
    if gtype is None:
        for k in alloc:  # typed TRES e.g. gres/gpu:a100 or gres/shard:a100
            m = re.match(r"gres/(?:gpu|shard):([A-Za-z0-9_.-]+)$", k)
            if m:
                gtype = m.group(1)
                break
    comment = j.get("comment")
    if isinstance(comment, dict):
        comment = comment.get("job")
    nodes = j.get("nodes")
    if isinstance(nodes, list):
        nodes = ",".join(nodes)
    if nodes in ("", "None assigned"):
        nodes = None
    use = _gpu_use(j.get("steps") or [])
    assoc = j.get("association") or {}
    return {
        "cluster": j.get("cluster") or assoc.get("cluster") or "",
        "job_id": int(num(j.get("job_id"))),
        "user": j.get("user") or assoc.get("user"),
        "account": j.get("account") or assoc.get("account"),
        "state": _state(j.get("state")),
        "elapsed_s": _int(num(t.get("elapsed"))),
        "submit_time": _int(num(t.get("submission"))),
        "start_time": _int(num(t.get("start"))) or None,
        "end_time": _int(num(t.get("end"))) or None,
        "node": nodes,
        "shards": _int(shards),
        "gpus": _int(gpus),
        "gpu_type": gtype,
        "gpu_index": gidx,
        "comment": comment,
        **use,
    }


def _int(v):
    return None if v is None else int(v)


def parse_sacct_json(data: str | bytes | dict) -> list[dict]:
    if not isinstance(data, dict):
        try:
            data = json.loads(data)
        except ValueError as e:
            raise HorusError(f"sacct --json: not JSON ({e})") from None
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise HorusError("sacct --json: no 'jobs' list")
    out = []
    for j in jobs:
        try:
            out.append(parse_job(j))
        except (TypeError, ValueError, KeyError, HorusError):
            continue  # one odd record must not stop a sync
    return out


def colocations(jobs: list[dict]) -> dict[tuple[str, int], set[int]]:
    """{(cluster, job id): other job ids on the same node and GPU index overlapping in time}.

    When the GPU index is unknown (sacct 22.05), jobs on the same node count as co-located."""
    groups: dict[tuple, list[dict]] = {}
    for j in jobs:
        if j.get("node") and j.get("start_time") is not None and j.get("end_time") is not None:
            groups.setdefault((j["cluster"], j["node"]), []).append(j)
    out: dict[tuple[str, int], set[int]] = {}
    for _g, js in groups.items():
        js.sort(key=lambda x: x["start_time"])
        active: list[dict] = []
        for j in js:
            active = [a for a in active if a["end_time"] > j["start_time"]]
            for a in active:
                ia, ij = a.get("gpu_index"), j.get("gpu_index")
                if ia is not None and ij is not None and ia != ij:
                    continue
                out.setdefault((j["cluster"], j["job_id"]), set()).add(a["job_id"])
                out.setdefault((a["cluster"], a["job_id"]), set()).add(j["job_id"])
            active.append(j)
    return out


def run_sacct(since: float, until: float, extra: Iterable[str] = ()) -> str:
    from . import slurm

    fmt = "%Y-%m-%dT%H:%M:%S"
    args = ["sacct", "--json", "--allusers", "-S", time.strftime(fmt, time.localtime(since)),
            "-E", time.strftime(fmt, time.localtime(until)), *extra]
    return slurm.run(args, timeout=300)


def node_gpu_types() -> dict[str, str]:
    """{node: gpu type} from scontrol (Gres=gpu:a100:4,...); {} when unavailable."""
    try:
        from . import slurm
        out = {}
        for n in slurm.scontrol_nodes():
            m = re.search(r"gpu:([A-Za-z0-9_.-]+):\d", str(n.get("Gres", "")))
            if m and n.get("NodeName"):
                out[n["NodeName"]] = m.group(1)
        return out
    except Exception:
        return {}


def sync(ledger, *, sacct_json: str | bytes | dict | None = None, since: float | None = None,
         until: float | None = None, all_jobs: bool = False, node_types: dict | None = None,
         cluster: str | None = None) -> dict:
    """Record finished jobs from sacct into the ledger. Idempotent. Returns counts."""
    from .hint import parse_hint

    now = time.time()
    replayed = ledger.spool.replay(ledger) if ledger.spool.pending() else 0
    ran_sacct = sacct_json is None
    if ran_sacct:
        if since is None:
            last = ledger.get_state("last_sync")
            since = float(last) - 300 if last else now - 86400
        until = until or now
        sacct_json = run_sacct(since, until)
        if node_types is None:
            node_types = node_gpu_types()
    parsed = [j for j in parse_sacct_json(sacct_json) if j["state"] and
              j["state"].split()[0] in FINISHED]
    if cluster:
        parsed = [j for j in parsed if j["cluster"] == cluster]
    node_types = node_types or {}
    by_cluster: dict[str, list[int]] = {}
    for j in parsed:
        by_cluster.setdefault(j["cluster"], []).append(j["job_id"])
    known = {(c, i) for c, ids in by_cluster.items() for i in ledger.submissions_exist(c, ids)}
    chosen = []
    new_subs = []
    for j in parsed:
        key = (j["cluster"], j["job_id"])
        gpu_job = bool(j["shards"] or j["gpus"])
        if key in known:
            chosen.append(j)
        elif all_jobs and gpu_job:
            chosen.append(j)
            hint = parse_hint(j.get("comment"))
            if hint:  # submitted with a hint but not through hsubmit's ledger write
                new_subs.append({"job_id": j["job_id"], "cluster": j["cluster"], "user": j["user"],
                                 "account": j["account"], "submit_time": j["submit_time"],
                                 "hint": j["comment"], "predictor": "hint",
                                 "predictions": {g: {"util_pct": u, "mem_mib": m,
                                                     "mem_mib_p90": p, "predictor": "hint"}
                                                 for g, (u, m, p) in hint.items()}})
    if new_subs:
        ledger.record_submissions(new_subs)
    # co-location: this batch plus what the ledger already has on those nodes in that window
    others = []
    if chosen:
        starts = [j["start_time"] for j in chosen if j["start_time"]]
        ends = [j["end_time"] for j in chosen if j["end_time"]]
        if starts and ends:
            others = _ledger_jobs_on(ledger, {j["node"] for j in chosen if j["node"]},
                                     min(starts), max(ends))
    seen = {(j["cluster"], j["job_id"]) for j in chosen}
    pool = chosen + [o for o in others if (o["cluster"], o["job_id"]) not in seen]
    co = colocations(pool)
    records = []
    for j in chosen:
        gtype = j["gpu_type"] or node_types.get(j["node"] or "")
        records.append({"job_id": j["job_id"], "cluster": j["cluster"], "source": "sacct",
                        "util_mean": j["util_mean"], "util_max": j["util_max"],
                        "mem_peak_mib": j["mem_peak_mib"], "elapsed_s": j["elapsed_s"],
                        "state": j["state"], "node": j["node"], "gpu_type": gtype,
                        "gpu_index": j["gpu_index"], "shards": j["shards"] or j["gpus"],
                        "colocated": sorted(co.get((j["cluster"], j["job_id"]), ())) or None,
                        "start_time": j["start_time"], "end_time": j["end_time"],
                        "recorded": int(now)})
    # earlier jobs whose co-located set grew: update their sacct rows too
    changed = []
    for o in others:
        key = (o["cluster"], o["job_id"])
        if key in seen:
            continue
        new = set(co.get(key, set()))
        old = {int(x) for x in (o.get("colocated") or "").split(",") if x}
        if new - old:
            changed.append((key, ",".join(str(x) for x in sorted(new | old))))
    ledger.record_usages(records)
    if changed:
        _update_colocated(ledger, changed)
    if ran_sacct:
        ledger.set_state("last_sync", str(int(until or now)))
    return {"jobs_seen": len(parsed), "recorded": len(records), "new_submissions": len(new_subs),
            "replayed": replayed, "colocated_updates": len(changed)}


def _ledger_jobs_on(ledger, nodes: set, start: int, end: int) -> list[dict]:
    from sqlalchemy import select

    from .ledger import tables

    if not nodes:
        return []
    j = tables()["jobs"]
    stmt = select(j.c.cluster, j.c.job_id, j.c.node, j.c.gpu_index, j.c.start_time, j.c.end_time,
                  j.c.colocated).where(j.c.node.in_(sorted(nodes)), j.c.start_time < end,
                                       j.c.end_time > start)
    with ledger.engine.connect() as conn:
        return [dict(r._asdict()) for r in conn.execute(stmt)]


def _update_colocated(ledger, changed: list) -> None:
    from sqlalchemy import update

    from .ledger import refresh_jobs, tables

    u = tables()["usage"]
    with ledger.engine.begin() as conn:
        for (c, jid), value in changed:
            conn.execute(update(u).where(u.c.cluster == c, u.c.job_id == jid, u.c.source == "sacct")
                         .values(colocated=value))
        refresh_jobs(conn, [k for k, _ in changed])
