"""Actual GPU use from Slurm accounting: parse ``sacct --json`` and sync it into the ledger.

``sync`` builds every ledger row from what Slurm stores and authenticates (user, account,
cluster, placement, TRES, the comment with the user's claims, AdminComment with the hook's
decision) and recomputes features itself; ``publish`` then writes the hook's claim record.

Layouts handled: openapi v0.0.38 (22.05: scalar ``state.current``, plain numbers) and the
data_parser layouts v0.0.39 .. v0.0.44 (23.02 .. 25.11: ``state.current`` a list, numbers
possibly ``{"set", "infinite", "number"}``). GPU use comes from the steps' TRESUsageIn
(``steps[].tres.requested.max/average``: ``gres/gpuutil`` in percent, ``gres/gpumem`` in bytes),
which Slurm records from 23.02 with AutoDetect=nvml; 22.05 has neither (then util/mem stay NULL
and horus-probe is the source). Text forms (``gres/gpumem=36266M``, raw bytes) parse too.
Neither 22.05 nor 25.11 prints ``gres_detail`` (the GPU index) in ``sacct --json``: sync takes
it from the probe. Times of 0 or >= 4294967294 (never started, not ended) are None.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from typing import Any, Iterable

from slurm_horus.errors import HorusError
from slurm_horus.slurm.parse import gpu_types_of_node, parse_gres

FINISHED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
_UNITS = {"": None, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2, "P": 1024.0 ** 3}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTP]?)i?B?\s*$", re.I)
# time.start / time.end of a job that never started or has not ended (NO_VAL, INFINITE as uint32)
_UNSET_TIME = 4294967294
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
    return None if not v or v >= _UNSET_TIME else int(v)


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
        "job_id": int(num(j.get("job_id"))),
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
    """{(cluster, job id): other job ids on the same node and GPU overlapping in time}.

    Two jobs on one node share a GPU unless both GPU indices are known and differ: by GPU index
    where known, else by node (an unknown index may be any GPU of the node). A job holding
    several GPUs counts as unknown (its one recorded index is only the first of them)."""
    def index(j):
        return None if (j.get("gpus") or 0) > 1 else j.get("gpu_index")

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
                ia, ij = index(a), index(j)
                if ia is not None and ij is not None and ia != ij:
                    continue
                out.setdefault((j["cluster"], j["job_id"]), set()).add(a["job_id"])
                out.setdefault((a["cluster"], a["job_id"]), set()).add(j["job_id"])
            active.append(j)
    return out


def run_sacct(since: float, until: float, extra: Iterable[str] = ()) -> str:
    from slurm_horus.slurm import commands as slurm

    fmt = "%Y-%m-%dT%H:%M:%S"
    args = ["sacct", "--json", "--allusers", "-S", time.strftime(fmt, time.localtime(since)),
            "-E", time.strftime(fmt, time.localtime(until)), *extra]
    return slurm.run(args, timeout=300)


def node_gpu_types() -> dict[str, str]:
    """{node: gpu type} from the nodes' Gres (gpu:a100:4,...), through the chosen backend; a
    node with several types maps to none of them (its jobs' type is not the node's). {} when
    Slurm cannot be asked."""
    from slurm_horus.slurm import commands as slurm

    try:
        nodes = slurm.scontrol_nodes()
    except HorusError:
        return {}
    out = {}
    for n in nodes:
        types = gpu_types_of_node(n)
        if len(types) == 1 and n.get("NodeName"):
            out[n["NodeName"]] = next(iter(types))
    return out


def sync(ledger, *, sacct_json: str | bytes | dict | None = None, since: float | None = None,
         until: float | None = None, all_jobs: bool = False, node_types: dict | None = None,
         cluster: str | None = None) -> dict:
    """Record finished jobs from Slurm accounting into the ledger, keyed by the cluster it
    reports. Idempotent. Returns counts.

    Accounting is read through ``slurm.accounting_jobs`` (the chosen backend: pyslurm or sacct),
    or parsed from ``sacct_json`` (tests, replays). A job is recorded when its comment carries a
    hint or a workload token, when the ledger already knows it (a probe measured it), or, with
    ``all_jobs``, when it used a GPU. Its submission row holds Slurm's facts, the comment's
    claims and the hook's decision (AdminComment); features are recomputed here (see
    ModelFeatures), never taken from the user. A job that never used its GPU
    (ledger.failed_measurement) is recorded, flagged and counted.

    Placement: accounting has no GPU index on 22.05 nor 25.11 (no gres_detail), so the probe's
    (slurmd's Prolog, replayed from the spool first) is used where accounting has none; the GPU
    type is accounting's, else the probe's, else the node's only GPU type (``node_types``).
    The sacct usage row keeps only what accounting said: the jobs row takes the probe's index
    and type where it is null. Co-location (see ``colocations``) uses the index where known.
    """
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm.hint import find_hint_token, parse_hint, parse_workload

    now = time.time()
    replay = ledger.spool.replay(ledger)
    ran_sacct = sacct_json is None
    if ran_sacct:
        if since is None:
            last = ledger.get_state("last_sync")
            since = float(last) - 300 if last else now - 86400
        until = until or now
        accounted = slurm.accounting_jobs(since, until)
        if node_types is None:
            node_types = node_gpu_types()
    else:
        accounted = parse_sacct_json(sacct_json)
    parsed = [j for j in accounted if j["state"] and j["state"].split()[0] in FINISHED]
    if cluster:
        parsed = [j for j in parsed if j["cluster"] == cluster]
    node_types = node_types or {}
    known = _known_jobs(ledger, parsed)
    models = ModelFeatures()
    chosen, subs = [], []
    for j in parsed:
        hint, claim = parse_hint(j["comment"]), parse_workload(j["comment"])
        if not (hint or claim or (j["cluster"], j["job_id"]) in known
                or (all_jobs and (j["shards"] or j["gpus"]))):
            continue
        chosen.append(j)
        subs.append(submission_of(j, hint and find_hint_token(j["comment"]), hint, claim, models))
    ledger.record_submissions(subs)
    _drop_legacy(ledger, chosen)
    probed = _probe_placement(ledger, chosen)
    # co-location: this batch (with the probe's GPU index where accounting has none) plus what
    # the ledger already has on those nodes in that window
    placed = []
    for j in chosen:
        idx, _ptype = probed.get((j["cluster"], j["job_id"]), (None, None))
        placed.append({**j, "gpu_index": idx} if j["gpu_index"] is None else j)
    others = []
    starts = [j["start_time"] for j in chosen if j["start_time"]]
    ends = [j["end_time"] for j in chosen if j["end_time"]]
    if starts and ends:
        others = _ledger_jobs_on(ledger, {j["node"] for j in chosen if j["node"]},
                                 min(starts), max(ends))
    seen = {(j["cluster"], j["job_id"]) for j in chosen}
    pool = placed + [o for o in others if (o["cluster"], o["job_id"]) not in seen]
    co = colocations(pool)
    records = []
    for j in chosen:
        _pidx, ptype = probed.get((j["cluster"], j["job_id"]), (None, None))
        gtype = j["gpu_type"] or (None if ptype else node_types.get(j["node"] or ""))
        records.append({"job_id": j["job_id"], "cluster": j["cluster"], "source": "sacct",
                        "util_mean": j["util_mean"], "util_max": j["util_max"],
                        "mem_peak_mib": j["mem_peak_mib"], "elapsed_s": j["elapsed_s"],
                        "state": j["state"], "node": j["node"], "gpu_type": gtype,
                        "gpu_index": j["gpu_index"], "shards": j["shards"], "gpus": j["gpus"],
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
    from slurm_horus.ledger import failed_measurement

    return {"jobs_seen": len(parsed), "recorded": len(records),
            "failed_measurements": sum(1 for r in records if failed_measurement(
                r["util_mean"], r["mem_peak_mib"])),
            "claims": sum(1 for s in subs if s["hint"] or s["model_sha256"]),
            "features": sum(1 for s in subs if s["features"]), "replayed": replay.applied,
            "quarantined": replay.quarantined, "skipped": replay.skipped,
            "problems": replay.problems, "colocated_updates": len(changed)}


def submission_of(j: dict, hint_token: str | None, hint: dict | None, claim: dict | None,
                  models: "ModelFeatures") -> dict:
    """The submission row of a finished job: Slurm's facts, the comment's claims (predictor
    "hint"), the hook's decision, and features only where ``models`` could recompute them."""
    from slurm_horus.slurm.hint import BOUND_NAMES

    uid, gids = _owner(j["user"])
    preds = {g: {"util_pct": v[0], "mem_mib": v[1], "predictor": "hint",
                 **{f"mem_mib_{b}": x for b, x in zip(BOUND_NAMES, v[2:])}}
             for g, v in (hint or {}).items()}
    rec = {"job_id": j["job_id"], "cluster": j["cluster"], "user": j["user"], "uid": uid,
           "account": j["account"], "submit_time": j["submit_time"], "hint": hint_token,
           "policy_decision": j.get("admin_comment"), "gpu_types": sorted(preds) or None,
           "predictions": preds, "predictor": "hint" if preds else None,
           "model_path": None, "model_sha256": None, "workload": None, "features": None,
           "feature_version": None}
    if not claim:
        return rec
    workload = {"batch_size": claim.get("bs", 1), "task": claim.get("task", "train"),
                "optimizer": claim.get("opt", "adam"), "precision": claim.get("prec", "fp32"),
                "cpus_per_task": j.get("cpus"), "dims": claim.get("dims", {})}
    rec.update(model_path=claim.get("model"), model_sha256=claim["sha"], workload=workload)
    report = models.get(claim, workload, uid, gids)
    if report is not None:
        rec.update(features=report.values, feature_version=report.version)
        for g, d in preds.items():
            cold = models.cold(report, workload, g)
            if cold:
                d["cold"] = cold
    return rec


def _owner(user: str | None) -> tuple[int | None, set[int]]:
    """(uid, group ids) of a user name, from the name service; (None, set()) if unknown."""
    import pwd

    try:
        pw = pwd.getpwnam(user or "")
    except KeyError:
        return None, set()
    try:
        gids = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        gids = {pw.pw_gid}
    return pw.pw_uid, gids


def _may(st: os.stat_result, uid: int, gids: set[int], bit: int) -> bool:
    """Would ``uid`` (in ``gids``) get permission ``bit`` (4 read, 1 search) on this inode?"""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in gids:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def open_as_owner(path: str, uid: int | None, gids: set[int]) -> int | None:
    """An fd on the regular file ``path`` if ``uid`` could read it (mode bits of the file, search
    bits of every folder above it), else None. Checked on the opened inode, so a file swapped
    after the check is not the one read."""
    import stat

    if uid is None or not os.path.isabs(path):
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # never open a FIFO or a device as root
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        real = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") \
            else os.path.realpath(path)
        ok = stat.S_ISREG(st.st_mode) and _may(st, uid, gids, 4)
        parent = os.path.dirname(real)
        while ok:
            ok = _may(os.stat(parent), uid, gids, 1)
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)
    except OSError:
        ok = False
    if not ok:
        os.close(fd)
        return None
    return fd


class ModelFeatures:
    """Features and cold-start figures of the model a job claims, computed as the admin from
    the file only when the job's owner can read it and its sha256 is the claimed one; cached
    by (sha, workload) for one sync."""

    def __init__(self):
        self._sha: dict[tuple, str] = {}
        self._found: dict[tuple, object] = {}
        self._cold: dict[tuple, dict | None] = {}

    def get(self, claim: dict, workload: dict, uid: int | None, gids: set[int]):
        """The FeatureReport, or None."""
        fd = open_as_owner(claim.get("model") or "", uid, gids)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if ident not in self._sha:
                self._sha[ident] = _sha256(fd)
            if self._sha[ident] != claim["sha"]:
                return None
            key = (claim["sha"], json.dumps(workload, sort_keys=True))
            if key not in self._found:
                self._found[key] = _features(f"/proc/self/fd/{fd}", claim["sha"], workload)
            return self._found[key]
        finally:
            os.close(fd)

    def cold(self, report, workload: dict, gtype: str) -> dict | None:
        """The cold-start figures retraining takes as inputs, for a GPU type the catalog knows."""
        from slurm_horus.predict.coldstart import ColdStartEstimator
        from slurm_horus.predict.gpus import default_catalog

        key = (report.sha256, json.dumps(workload, sort_keys=True), gtype)
        if key not in self._cold:
            gpu = default_catalog().find(gtype)
            c = ColdStartEstimator().predict(report, gpu, _workload(workload)) if gpu else None
            self._cold[key] = c and {
                "util_pct": c.util_pct, "mem_mib": c.mem_mib,
                "gpu_ms_per_step": c.breakdown.get("gpu_ms_per_step", 0.0),
                "host_ms_per_step": c.breakdown.get("host_ms_per_step", 0.0)}
        return self._cold[key]


def _sha256(fd: int) -> str:
    import hashlib

    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _workload(d: dict):
    from slurm_horus.predict.coldstart import Workload

    return Workload(batch_size=d["batch_size"], task=d["task"], optimizer=d["optimizer"],
                    precision=d["precision"])


def _features(path: str, sha: str, workload: dict):
    """The model's FeatureReport; None if it does not load, has unbound dimensions, or
    changed under us."""
    from slurm_horus.graph.features import extract_features

    try:
        report = extract_features(path, batch_size=_workload(workload).batch_size,
                                  dims=workload["dims"])
    except Exception:  # any file the user names: a bad one gives no features, never a failure
        return None
    return report if report.sha256 == sha and not report.unknown_dims else None


def _known_jobs(ledger, jobs: list[dict]) -> set[tuple[str, int]]:
    """(cluster, job id) of these jobs that the ledger already has (e.g. a probe measured)."""
    from sqlalchemy import select

    from slurm_horus.ledger import tables

    t = tables()["jobs"]
    by_cluster: dict[str, list[int]] = {}
    for j in jobs:
        by_cluster.setdefault(j["cluster"], []).append(j["job_id"])
    found = set()
    with ledger.engine.connect() as conn:
        for c, ids in by_cluster.items():
            for i in range(0, len(ids), 900):
                found |= {(c, int(r[0])) for r in conn.execute(
                    select(t.c.job_id).where(t.c.cluster == c, t.c.job_id.in_(ids[i:i + 900])))}
    return found


def _probe_placement(ledger, jobs: list[dict]) -> dict[tuple[str, int], tuple]:
    """{(cluster, job id): (GPU index, GPU type)} from the probe's usage rows of these jobs."""
    from sqlalchemy import select

    from slurm_horus.ledger import tables

    u = tables()["usage"]
    by_cluster: dict[str, list[int]] = {}
    for j in jobs:
        by_cluster.setdefault(j["cluster"], []).append(j["job_id"])
    out = {}
    with ledger.engine.connect() as conn:
        for c, ids in by_cluster.items():
            for i in range(0, len(ids), 900):
                for r in conn.execute(select(u.c.job_id, u.c.gpu_index, u.c.gpu_type).where(
                        u.c.cluster == c, u.c.source == "probe", u.c.job_id.in_(ids[i:i + 900]))):
                    out[(c, int(r.job_id))] = (r.gpu_index, r.gpu_type)
    return out


def _drop_legacy(ledger, jobs: list[dict]) -> None:
    """Drop the rows that hsubmit and user-run probes wrote before 0.2 under cluster "" (what
    ``sbatch --parsable`` says on a single-cluster site) for jobs now recorded under the name
    sacct reports: they were the user's own writes, and would make a second row per job."""
    from sqlalchemy import delete

    from slurm_horus.ledger import tables

    if len({j["cluster"] for j in jobs}) != 1 or not jobs[0]["cluster"]:
        return
    ids = [j["job_id"] for j in jobs]
    with ledger.engine.begin() as conn:
        for name in ("submissions", "usage", "jobs"):
            t = tables()[name]
            for i in range(0, len(ids), 900):
                conn.execute(delete(t).where(t.c.cluster == "", t.c.job_id.in_(ids[i:i + 900])))


def _ledger_jobs_on(ledger, nodes: set, start: int, end: int) -> list[dict]:
    from sqlalchemy import select

    from slurm_horus.ledger import tables

    if not nodes:
        return []
    j = tables()["jobs"]
    stmt = select(j.c.cluster, j.c.job_id, j.c.node, j.c.gpu_index, j.c.gpus, j.c.start_time,
                  j.c.end_time, j.c.colocated).where(
        j.c.node.in_(sorted(nodes)), j.c.start_time < end, j.c.end_time > start)
    with ledger.engine.connect() as conn:
        return [dict(r._asdict()) for r in conn.execute(stmt)]


def _update_colocated(ledger, changed: list) -> None:
    from sqlalchemy import update

    from slurm_horus.ledger import refresh_jobs, tables

    u = tables()["usage"]
    with ledger.engine.begin() as conn:
        for (c, jid), value in changed:
            conn.execute(update(u).where(u.c.cluster == c, u.c.job_id == jid, u.c.source == "sacct")
                         .values(colocated=value))
        refresh_jobs(conn, [k for k, _ in changed])


RECORD_HEADER = "# slurm-horus claim record: written by horus-admin sync, read by job_submit.lua\n"
_NAME_OK = re.compile(r"[^\s#]{1,128}")


def claim_record(rows: list[dict]) -> tuple[str, int, int]:
    """(text, users, accounts) of the hook's record file from Ledger.under_claims rows, most
    under-claims first, since the hook reads only the first 64 KiB."""
    users: dict[str, list] = {}
    accounts: dict[str, list] = {}
    for r in rows:
        for into, name in ((users, r["user_name"]), (accounts, r["account"])):
            if name and _NAME_OK.fullmatch(name):
                e = into.setdefault(name, [None, 0, 0])
                e[0] = e[0] if r["uid"] is None else r["uid"]
                e[1] += r["under_claims"]
                e[2] += r["jobs"]

    def order(kv):
        return (-kv[1][1], kv[0])
    lines = [f"user {'-' if uid is None else uid} {name} {n} {m}\n"
             for name, (uid, n, m) in sorted(users.items(), key=order)]
    lines += [f"account - {name} {n} {m}\n" for name, (_, n, m) in sorted(accounts.items(), key=order)]
    return RECORD_HEADER + "".join(lines), len(users), len(accounts)


def write_atomically(path: str | os.PathLike, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename (readers see the old or the new file)."""
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def publish(ledger, *, policy: str | None = None, now: float | None = None) -> dict:
    """After a sync: the hook's record file (policy ``record_file``, counting under-claims over
    ``underclaim_window_days``) and, where Slurm keeps jobs private, each user's extract of a
    SQLite ledger, with the main file closed to users (0640 root:root)."""
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.ledger import write_user_extracts
    from slurm_horus.slurm.policy import policy_value

    path = policy_value("record_file", "/var/lib/slurm-horus/record", policy)
    try:
        days = float(policy_value("underclaim_window_days", "30", policy))
    except (TypeError, ValueError):
        days = 30.0
    text, users, accounts = claim_record(
        ledger.under_claims((now or time.time()) - days * 86400))
    write_atomically(path, text)
    out = {"record_file": path, "record_users": users, "record_accounts": accounts,
           "extracts": None}
    db = ledger.sqlite_path()
    if db is not None and slurm.private_jobs(unknown=False):
        out["extracts"] = write_user_extracts(ledger, db.parent / "users")["written"]
        if os.geteuid() == 0:
            os.chown(db, 0, 0)
        os.chmod(db, 0o640)
    return out
