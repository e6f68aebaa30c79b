"""``horus-admin sync``: finished jobs from Slurm accounting into the ledger.

``sync`` builds every ledger row from what Slurm stores and authenticates (user, account,
cluster, placement, TRES, the comment with the user's claims, AdminComment with the hook's
decision); ``claims`` turns a job's comment into its submission row and recomputes features
itself; ``publish`` then writes the hook's claim record. Accounting is read (and parsed) in the
Slurm stage: ``slurm.commands.accounting_jobs``, ``slurm.accounting``. Neither 22.05 nor 25.11
gives the GPU index in accounting: sync takes it from the probe.
"""

from __future__ import annotations

import json
import re
import time

from sqlalchemy import delete, or_, select, update

from slurm_horus.errors import HorusError
from slurm_horus.ledger import failed_measurement, refresh_jobs, tables
from slurm_horus.ledger.claims import ModelFeatures, submission_of
from slurm_horus.ledger.jobs import earlier_run
from slurm_horus.ledger.records import MAX_COLOCATED, colocated_text
from slurm_horus.slurm import commands as slurm
from slurm_horus.slurm.accounting import FINISHED, parse_sacct_json
from slurm_horus.slurm.hint import find_hint_token, parse_hint, parse_workload
from slurm_horus.slurm.parse import expand_hostlist

# jobs carried from one sync to the next while unfinished, at most (the newest ids beyond
# it): the state is one TEXT value (64 KiB on MariaDB)
MAX_OPEN_JOBS = 5000
SYNC_CHUNK_S = 3600  # sacct is asked an hour at a time: a long outage's window, whole, held every
#                      job of it in memory at once (3.6x its JSON) and, failing, failed forever;
#                      a day of 30,000 jobs (287 MB of JSON) took 1 GB, over the scrontab's --mem
MIN_CHUNK_S = 60  # the shortest window (see _window)
# sacct timed out or killed by a signal (the OOM killer): maybe the window's size, halved next
_WINDOW_TOO_BIG = re.compile(r"timed out after|: exit -\d+$")
COUNTS = ("jobs_seen", "recorded", "failed_measurements", "claims", "features",
          "colocated_updates")


def node_names(node: str) -> list[str]:
    """The node names of a job's node list (a multi-node job's ``gpu[1-2]``); one that cannot
    be read (cut to its column's length) counts as one name."""
    try:
        return expand_hostlist(node) or [node]
    except HorusError:
        return [node]


def node_list_gpu_type(node: str, node_types: dict[str, str]) -> str | None:
    """The GPU type of a job's node list: its node's, or the one every node of a multi-node
    job has (``gpu[1-2]``, both a100: a100); none when a node has another type or none known
    (a job on two GPU types has no type). Only a list of several nodes is expanded (at most
    expand_hostlist's MAX_HOSTLIST_NAMES names; one it cannot read has no type), and looked up
    no further than its first node of another type."""
    if "[" not in node and "," not in node:
        return node_types.get(node)
    names = node_names(node)
    first = node_types.get(names[0])
    return first if all(node_types.get(n) == first for n in names[1:]) else None


def colocations(jobs: list[dict]) -> dict[tuple[str, int], set[int]]:
    """{(cluster, job id): other job ids on a node and GPU of theirs overlapping in time}.

    Only shard jobs share a GPU: Slurm gives a GPU allocated as ``gpu`` (whole) to that job
    alone, and its shards to no one. Two shard jobs on one node share a GPU unless both GPU
    indices are known and differ (an unknown index may be any GPU of the node). A raw shard
    request (``raw_shards = allow``) may span nodes: such a job meets the jobs of each of its
    nodes, its one index (the first node's, or a probed node's) known on none of them."""
    def whole(j):
        return bool(j.get("gpus")) and not j.get("shards")

    groups: dict[tuple, list[tuple[dict, int | None]]] = {}
    for j in jobs:
        if (j.get("node") and j.get("start_time") is not None and j.get("end_time") is not None
                and not whole(j)):
            names = set(node_names(j["node"]))
            idx = j.get("gpu_index") if len(names) == 1 else None
            for name in names:
                groups.setdefault((j["cluster"], name), []).append((j, idx))
    out: dict[tuple[str, int], set[int]] = {}
    for _g, js in groups.items():
        js.sort(key=lambda x: x[0]["start_time"])
        active: list[tuple[dict, int | None]] = []
        for j, ij in js:
            active = [(a, ia) for a, ia in active if a["end_time"] > j["start_time"]]
            for a, ia in active:
                if ia is not None and ij is not None and ia != ij:
                    continue
                out.setdefault((j["cluster"], j["job_id"]), set()).add(a["job_id"])
                out.setdefault((a["cluster"], a["job_id"]), set()).add(j["job_id"])
            active.append((j, ij))
    return out


def sync(ledger, *, sacct_json: str | bytes | dict | None = None, since: float | None = None,
         until: float | None = None, all_jobs: bool = False, node_types: dict | None = None,
         cluster: str | None = None) -> dict:
    """Record finished jobs from Slurm accounting into the ledger, keyed by the cluster it
    reports. Idempotent. Returns counts.

    Accounting is read through ``commands.accounting_jobs`` (the chosen backend: pyslurm or sacct),
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
    local = None
    if sacct_json is None:
        local = slurm.local_cluster()  # sacct's cluster: whose progress this sync keeps
        if local is None:  # slurmctld away: its nodes' GPU types too; the next run syncs
            raise HorusError("Slurm does not name this cluster (scontrol show config failed or "
                             "gave no ClusterName): nothing synced")
    replay = ledger.spool.replay(ledger)  # the probe's rows first: placement below reads them
    replayed = {"replayed": replay.applied, "quarantined": replay.quarantined,
                "skipped": replay.skipped, "problems": replay.problems}
    # one budget of reading and analysis for the whole sync, its windows all sharing it: a
    # window each had its own (a 24-window catch-up let one user's graphs take 2 h), and a
    # finished job listed in several windows was analysed again in each
    models = ModelFeatures()
    if sacct_json is not None:
        res, _ = _record(ledger, parse_sacct_json(sacct_json), all_jobs=all_jobs,
                         node_types=node_types, cluster=cluster, models=models)
        return {**res, **replayed}
    now = time.time()
    if since is None:
        last = last_sync(ledger, local)
        since = last - 300 if last is not None else now - 86400
    until = min(until or now, now)  # nothing has ended in the future
    since = min(since, until)
    if node_types is None:
        node_types = slurm.node_gpu_types()
    # jobs a sync saw unfinished, by id wherever their end falls (slurmdbd may record it late,
    # outside every later window: such a job was never recorded); asked once, with the first window
    carried = _open_jobs(ledger, local)
    extra = [j for j in slurm.accounting_jobs_by_id(sorted({i for _, i in carried}))
             if (j["cluster"], j["job_id"]) in carried] if carried else []
    total = {k: 0 for k in COUNTS} | replayed
    still_open: dict[int, bool] = {}  # job id -> running, over this sync's windows
    # a job that ran across windows is in each one's answer: recorded and counted once (a
    # 10-hour job of a catch-up sync was "10 of 10 finished jobs recorded")
    done: set[tuple] = set()  # (cluster, job id, _run) of the finished runs recorded so far
    start, span = since, _window(ledger, local)
    while True:  # a window at a time, each recorded (and its progress kept) before the next
        end = min(start + span, until)
        ledger.set_state(f"sync_window:{local}", str(int(end - start)))  # until it is recorded
        try:
            accounted = slurm.accounting_jobs(start, end)
        except HorusError as e:
            if not _WINDOW_TOO_BIG.search(str(e)):  # Slurm did not answer: no fault of the window's
                ledger.set_state(f"sync_window:{local}", "")
            raise
        have = {(j["cluster"], j["job_id"]) for j in accounted}
        accounted += [j for j in extra if (j["cluster"], j["job_id"]) not in have]
        extra = []
        fresh = [j for j in accounted if (j["cluster"], j["job_id"], _run(j)) not in done]
        res, unfinished = _record(ledger, fresh, all_jobs=all_jobs, node_types=node_types,
                                  cluster=cluster, models=models)
        total.update({k: total[k] + res[k] for k in res})
        done |= {(j["cluster"], j["job_id"], _run(j)) for j in fresh if _finished(j)}
        for j in accounted:  # a later window's answer is the newer: a job ended meanwhile is not open
            if j["cluster"] == local and _finished(j):
                still_open.pop(j["job_id"], None)
        for running, c, i in unfinished:
            if c == local:
                still_open[i] = still_open.get(i, False) or running
        _keep_progress(ledger, local, start, end, still_open)
        if end >= until:
            return total
        start = end


def _window(ledger, local: str) -> float:
    """How many seconds of accounting this sync asks sacct for at once: SYNC_CHUNK_S, or half
    the window a sync of ``local`` was reading when it died (killed out of memory or time before
    recording it: the same window again would die again, for ever), at least MIN_CHUNK_S."""
    try:
        died = float(ledger.get_state(f"sync_window:{local}") or 0)
    except ValueError:
        died = 0
    return max(MIN_CHUNK_S, min(SYNC_CHUNK_S, died / 2)) if died > 0 else SYNC_CHUNK_S


def _keep_progress(ledger, local: str, start: float, end: float, still_open: dict[int, bool]) -> None:
    """Save ``local``'s open jobs and how far its sync has read (the window [start, end] just
    recorded), each cluster its own (one ledger, several clusters), within one state value's
    column (MariaDB's TEXT): running jobs first (one user's thousands of pending jobs had pushed
    them out)."""
    ledger.set_state(f"sync_window:{local}", "")  # recorded
    mine = sorted(still_open, key=lambda i: (still_open[i], i))[-MAX_OPEN_JOBS:]
    ledger.set_state(f"open_jobs:{local}", json.dumps(sorted(mine), separators=(",", ":")))
    # never past now: a sync -E in the future had set every later default window's start after
    # its end, and sacct refused them all; never back: a backfill (-S/-E of last year) had set
    # the next default window to a year; never over a gap: a sync -S/-E of a later hour had
    # moved the next default window past the jobs that ended before that hour
    end = min(end, time.time())
    before = last_sync(ledger, local)
    if before is None or int(start) <= before:  # kept in whole seconds
        ledger.set_state(f"last_sync:{local}", str(int(end if before is None else max(before, end))))


def last_sync(ledger, cluster: str) -> float | None:
    """When ``cluster``'s last sync ended (else the ledger-wide entry of a ledger from before
    each cluster kept its own)."""
    value = ledger.get_state(f"last_sync:{cluster}") or ledger.get_state("last_sync")
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _record(ledger, accounted: list[dict], *, all_jobs, node_types, cluster,
            models: ModelFeatures | None = None) -> tuple[dict, list]:
    """Record these accounting rows' finished jobs; returns the counts and (running, cluster,
    job id) of the unfinished GPU jobs.  ``models``: the sync's ModelFeatures (its budget and
    cache, shared by all its windows)."""
    now = time.time()
    if cluster:
        accounted = [j for j in accounted if j["cluster"] == cluster]
    newest: dict[tuple[str, int], dict] = {}
    for j in accounted:  # one record per job: its newest run (sacct -D lists every one, oldest last)
        k = (j["cluster"], j["job_id"])
        if k not in newest or _run(j) >= _run(newest[k]):
            newest[k] = j
    known = _known_jobs(ledger, list(newest.values()))
    # a window that holds only an earlier run of a requeued job (a sync -E inside that run,
    # a replayed file) had replaced the rerun the ledger already holds
    accounted = [j for k, j in newest.items() if k not in known or _run(j) >= known[k]]
    parsed = [j for j in accounted if _finished(j)]
    unfinished = [j for j in accounted if j["state"] and not _finished(j)]
    node_types = node_types or {}

    def wanted(j, hint, claim) -> bool:
        return bool(hint or claim or (j["cluster"], j["job_id"]) in known
                    or (all_jobs and (j["shards"] or j["gpus"])))

    models = models if models is not None else ModelFeatures()
    chosen, subs = [], []
    for j in parsed:
        hint, claim = parse_hint(j["comment"]), parse_workload(j["comment"])
        if not wanted(j, hint, claim):
            continue
        chosen.append(j)
        subs.append(submission_of(j, hint and find_hint_token(j["comment"]), hint, claim, models))
    # every GPU job not finished, pending ones too (accounting may show a job that runs as
    # pending for a moment, and a running job's comment only from its end)
    still_open = [(j["state"].split()[0] != "PENDING", j["cluster"], j["job_id"]) for j in unfinished
                  if j["shards"] or j["gpus"] or wanted(j, parse_hint(j["comment"]),
                                                         parse_workload(j["comment"]))]
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
    list_types: dict[str, str | None] = {}  # each node list looked up once per batch

    def node_type(node: str) -> str | None:
        if node not in list_types:
            list_types[node] = node_list_gpu_type(node, node_types)
        return list_types[node]
    records = []
    for j in chosen:
        _pidx, ptype = probed.get((j["cluster"], j["job_id"]), (None, None))
        # the nodes' type only for a job that held a GPU or shards there (a CPU job is no GPU job)
        gtype = j["gpu_type"] or (None if ptype or not (j["gpus"] or j["shards"]) or not j["node"]
                                  else node_type(j["node"]))
        array_job_id, array_task_id = j.get("array") or (None, None)
        het_job_id, het_job_offset = j.get("het") or (None, None)
        records.append({"job_id": j["job_id"], "cluster": j["cluster"], "source": "sacct",
                        "util_mean": j["util_mean"], "util_max": j["util_max"],
                        "mem_peak_mib": j["mem_peak_mib"], "elapsed_s": j["elapsed_s"],
                        "state": j["state"], "node": j["node"], "gpu_type": gtype,
                        "gpu_index": j["gpu_index"], "shards": j["shards"], "gpus": j["gpus"],
                        "colocated": sorted(co.get((j["cluster"], j["job_id"]), ())) or None,
                        "start_time": j["start_time"], "end_time": j["end_time"],
                        "recorded": int(now), "array_job_id": array_job_id, "array_task_id": array_task_id,
                        "het_job_id": het_job_id, "het_job_offset": het_job_offset})
    # earlier jobs whose co-located set grew: update their sacct rows too
    changed = []
    for o in others:
        key = (o["cluster"], o["job_id"])
        if key in seen:
            continue
        new = set(co.get(key, set()))
        old = {int(x) for x in (o.get("colocated") or "").split(",") if x}
        if new - old and len(old) < MAX_COLOCATED:
            changed.append((key, colocated_text(new | old)))
    ledger.record_runs(subs, records)
    if changed:
        _update_colocated(ledger, changed)
    return {"jobs_seen": len(parsed), "recorded": len(records),
            "failed_measurements": sum(1 for r in records if _failed_per_gpu(r)),
            "claims": sum(1 for s in subs if s["hint"] or s["model_sha256"]),
            "features": sum(1 for s in subs if s["features"]),
            "colocated_updates": len(changed)}, still_open


def _failed_per_gpu(r: dict) -> bool:
    """Whether a sacct usage row is a failed measurement as its jobs row is flagged: per GPU
    (its figures are sums over the job's GPUs; two bare CUDA contexts had read as use)."""
    n = r["gpus"] if r["gpus"] and r["gpus"] > 1 else 1
    return bool(failed_measurement(*(None if x is None else x / n
                                     for x in (r["util_mean"], r["mem_peak_mib"]))))


def _open_jobs(ledger, cluster: str) -> set[tuple[str, int]]:
    """(cluster, job id) of ``cluster``'s jobs its last sync saw unfinished (state
    ``open_jobs:CLUSTER``; else its part of a ledger-wide ``open_jobs`` from before); none
    where the state is damaged (the windows alone, as before there was one)."""
    try:
        own = ledger.get_state(f"open_jobs:{cluster}")
        if own is not None:
            ids = json.loads(own)
        else:
            ids = json.loads(ledger.get_state("open_jobs") or "{}").get(cluster, [])
        return {(cluster, int(i)) for i in ids}
    except (ValueError, TypeError, AttributeError):
        return set()


def _finished(j: dict) -> bool:
    """Whether an accounting row is of a run that ended (its state one of FINISHED)."""
    return bool(j["state"]) and j["state"].split()[0] in FINISHED


def _run(j: dict) -> tuple[int, int]:
    """Which run of a job an accounting row or a jobs row is, to order them: a requeued job's
    rerun is submitted (and starts) after its earlier run."""
    return j.get("submit_time") or 0, j.get("start_time") or 0


def _known_jobs(ledger, jobs: list[dict]) -> dict[tuple[str, int], tuple[int, int]]:
    """{(cluster, job id): the run recorded (_run)} of these jobs that the ledger already has
    (e.g. a probe measured; a row without a submission, a probe's alone, is no run of Slurm's
    to compare: (0, 0))."""
    t = tables()["jobs"]
    by_cluster: dict[str, list[int]] = {}
    for j in jobs:
        by_cluster.setdefault(j["cluster"], []).append(j["job_id"])
    found = {}
    with ledger.engine.connect() as conn:
        for c, ids in by_cluster.items():
            for i in range(0, len(ids), 900):
                for r in conn.execute(select(t.c.job_id, t.c.submit_time, t.c.start_time).where(
                        t.c.cluster == c, t.c.job_id.in_(ids[i:i + 900]))):
                    found[(c, int(r.job_id))] = (0, 0) if r.submit_time is None else _run(r._asdict())
    return found


def _probe_placement(ledger, jobs: list[dict]) -> dict[tuple[str, int], tuple]:
    """{(cluster, job id): (GPU index, GPU type)} from the probe's usage rows of these jobs'
    runs (a requeued job's earlier run, probed elsewhere, had kept the node's type away)."""
    u = tables()["usage"]
    by_key = {(j["cluster"], j["job_id"]): j for j in jobs}
    by_cluster: dict[str, list[int]] = {}
    for j in jobs:
        by_cluster.setdefault(j["cluster"], []).append(j["job_id"])
    out = {}
    with ledger.engine.connect() as conn:
        for c, ids in by_cluster.items():
            for i in range(0, len(ids), 900):
                for r in conn.execute(select(u.c.job_id, u.c.gpu_index, u.c.gpu_type, u.c.end_time).where(
                        u.c.cluster == c, u.c.source == "probe", u.c.job_id.in_(ids[i:i + 900]))):
                    if not earlier_run(r._asdict(), by_key[(c, int(r.job_id))]):
                        out[(c, int(r.job_id))] = (r.gpu_index, r.gpu_type)
    return out


def _drop_legacy(ledger, jobs: list[dict]) -> None:
    """Drop the rows that hsubmit and user-run probes wrote before 0.2 under cluster "" (what
    ``sbatch --parsable`` says on a single-cluster site) for jobs now recorded under the name
    sacct reports: they were the user's own writes, and would make a second row per job."""
    if len({j["cluster"] for j in jobs}) != 1 or not jobs[0]["cluster"]:
        return
    ids = [j["job_id"] for j in jobs]
    with ledger.engine.begin() as conn:
        for name in ("submissions", "usage", "jobs"):
            t = tables()[name]
            for i in range(0, len(ids), 900):
                conn.execute(delete(t).where(t.c.cluster == "", t.c.job_id.in_(ids[i:i + 900])))


def _ledger_jobs_on(ledger, nodes: set, start: int, end: int) -> list[dict]:
    """Jobs rows already in the ledger on any of these node lists' nodes overlapping [start,
    end] (co-location): a row of one of those names, or one of several nodes (``n[1-2]``,
    ``a1,b1``) that names one of them."""
    names = sorted({n for node in nodes for n in node_names(node)})
    if not names:
        return []
    j = tables()["jobs"]
    cols = (j.c.cluster, j.c.job_id, j.c.node, j.c.gpu_index, j.c.gpus, j.c.shards, j.c.start_time,
            j.c.end_time, j.c.colocated)
    when = (j.c.start_time < end, j.c.end_time > start)
    found: dict[tuple[str, int], dict] = {}
    with ledger.engine.connect() as conn:
        for i in range(0, len(names), 900):  # SQLite's bound parameters, before 3.32: 999
            for r in conn.execute(select(*cols).where(j.c.node.in_(names[i:i + 900]), *when)):
                found[(r.cluster, r.job_id)] = r._asdict()
        wanted = set(names)
        # a whole-GPU job shares no GPU (colocations): its node list, a multi-node job's hundreds
        # of names, is not expanded (20,000 such rows had taken a sync 15 s)
        shares = or_(j.c.gpus.is_(None), j.c.gpus == 0, j.c.shards > 0)
        for r in conn.execute(select(*cols).where(or_(j.c.node.contains("["), j.c.node.contains(",")),
                                                  shares, *when)):
            if wanted.intersection(node_names(r.node)):
                found[(r.cluster, r.job_id)] = r._asdict()
    return list(found.values())


def _update_colocated(ledger, changed: list) -> None:
    """Set the sacct rows' co-located lists of earlier jobs, and refresh their jobs rows."""
    u = tables()["usage"]
    with ledger.engine.begin() as conn:
        for (c, jid), value in changed:
            conn.execute(update(u).where(u.c.cluster == c, u.c.job_id == jid, u.c.source == "sacct")
                         .values(colocated=value))
        refresh_jobs(conn, [k for k, _ in changed])
