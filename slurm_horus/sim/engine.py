"""Discrete-event simulation of a Slurm GPU cluster under several placement policies.

Policies (see docs/simulator.md):

* ``exclusive``: Slurm's default, one job per GPU;
* ``naive``: every 1-GPU job asks for a fixed number of shards (default 50 of 100);
* ``horus``: the job's PREDICTED util/mem go into a hint and the real ``etc/job_submit.lua``
  (through :func:`slurm_horus.slurm.policy.decide`, once per distinct hint and request) decides
  shared (type, shards) / exclusive / unchanged;
* ``oracle``: the same hook fed the TRUE util/mem.

Scheduling as Slurm does it: priority = submit time (FIFO); the main scheduler starts jobs in
priority order and stops at the first that does not fit; EASY backfill then reserves the
resources of that first job at the earliest time running jobs' time limits free them, and
starts later jobs of a bounded window (``bf_window``, like ``bf_max_job_test``) that fit now
and either end (by their time limit) before that reservation or stay off the reserved GPUs.
Multi-GPU jobs take whole GPUs on one node.  Co-located jobs slow each other down
(:mod:`slurm_horus.sim.interference`); a job whose true memory does not fit next to the jobs
already on its GPU fails with OOM ``oom_delay_s`` after its start and is requeued once, on a
whole GPU (as CARMA does).
"""

from __future__ import annotations

import bisect
import heapq
import json
import math
import os
import re
import tempfile
import time
from collections import deque
from itertools import islice
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.sim.interference import Interference
from slurm_horus.sim.traces import SimJob

__all__ = [
    "POLICIES", "NodeSpec", "ClusterSpec", "homogeneous_cluster", "cluster_from_json",
    "cluster_from_slurm_conf", "Request", "HorusDecider", "build_requests",
    "Simulator", "simulate", "run_policies",
]

POLICIES = ("exclusive", "naive", "horus", "oracle")
# co-location needs the predicted p90 memories plus this per job to fit (CARMA: estimate + 2 GiB)
MEM_HEADROOM_MIB = 2048.0
INF = float("inf")


# --------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpu_type: str
    gpus: int
    mem_mib: float | None = None  # GPU memory; default: the GPU catalog's figure for gpu_type


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

    def __post_init__(self):
        if not self.nodes:
            raise HorusError("cluster: no node with GPUs")
        for n in self.nodes:
            if not isinstance(n.gpus, int) or n.gpus < 1:
                raise HorusError(f"cluster: node {n.name}: need a positive GPU count")
            if not re.fullmatch(r"[a-z0-9_-]{1,32}", n.gpu_type or ""):
                raise HorusError(f"cluster: node {n.name}: bad GPU type {n.gpu_type!r}")

    @property
    def gpu_types(self) -> list[str]:
        return list(dict.fromkeys(n.gpu_type for n in self.nodes))

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max(n.gpus for n in self.nodes)

    def mem_mib(self, gpu_type: str) -> float:
        for n in self.nodes:
            if n.gpu_type == gpu_type and n.mem_mib:
                return float(n.mem_mib)
        from slurm_horus.predict.gpus import get_gpu
        return float(get_gpu(gpu_type).mem_mib)

    def describe(self) -> str:
        parts = []
        for t in self.gpu_types:
            g = sum(n.gpus for n in self.nodes if n.gpu_type == t)
            k = sum(1 for n in self.nodes if n.gpu_type == t)
            parts.append(f"{g} {t} on {k} nodes")
        return ", ".join(parts)


def homogeneous_cluster(gpus: int, gpu_type: str = "a100", per_node: int = 8) -> ClusterSpec:
    """``gpus`` GPUs of one type, ``per_node`` per node (the last node takes the rest)."""
    if gpus < 1 or per_node < 1:
        raise HorusError("--gpus and --gpus-per-node must be positive")
    nodes, left, i = [], gpus, 0
    while left > 0:
        k = min(per_node, left)
        nodes.append(NodeSpec(f"n{i:04d}", gpu_type, k))
        left -= k
        i += 1
    return ClusterSpec(tuple(nodes))


def cluster_from_json(text: str) -> ClusterSpec:
    """``{"nodes": [{"name": "g01", "gpu_type": "a100", "gpus": 8, "count": 1, "mem_mib": ...}]}``
    (``count``: that many identical nodes, named name-0, name-1, ...; default 1)."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise HorusError(f"cluster file: not JSON ({e})") from None
    raw = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(raw, list) or not raw:
        raise HorusError("cluster file: need {\"nodes\": [{\"name\", \"gpu_type\", \"gpus\"}, ...]}")
    nodes = []
    for i, e in enumerate(raw, 1):
        if not isinstance(e, dict):
            raise HorusError(f"cluster file: node #{i} is not an object")
        try:
            gpus, count = e["gpus"], e.get("count", 1)
            gtype = str(e["gpu_type"]).lower()
        except KeyError as k:
            raise HorusError(f"cluster file: node #{i}: missing {k}") from None
        if isinstance(gpus, bool) or not isinstance(gpus, int) or isinstance(count, bool) \
                or not isinstance(count, int) or count < 1:
            raise HorusError(f"cluster file: node #{i}: gpus and count must be positive integers")
        mem = e.get("mem_mib")
        if mem is not None and (not isinstance(mem, (int, float)) or mem <= 0):
            raise HorusError(f"cluster file: node #{i}: bad mem_mib")
        name = str(e.get("name") or f"node{i}")
        for c in range(count):
            nodes.append(NodeSpec(name if count == 1 else f"{name}-{c}", gtype, gpus, mem))
    return ClusterSpec(tuple(nodes))


def cluster_from_slurm_conf(text: str, gres_conf: str | None = None) -> ClusterSpec:
    """Nodes with GPUs of a slurm.conf (``NodeName=... Gres=gpu:a100:4,shard:400``).  Untyped
    ``gpu:N`` takes its type from gres.conf (``Name=gpu Type=a100``) when given."""
    from slurm_horus.slurm.parse import expand_hostlist, parse_conf_lines, parse_gres

    gres_types: dict[str, str] = {}
    default_type = None
    for rec in parse_conf_lines(gres_conf or ""):
        if rec.get("name") == "gpu" and rec.get("type"):
            t = rec["type"].lower()
            if "nodename" in rec:
                for h in expand_hostlist(rec["nodename"]):
                    gres_types[h] = t
            else:
                default_type = t
    defaults: dict[str, str] = {}
    nodes = []
    for rec in parse_conf_lines(text):
        if "nodename" not in rec:
            continue
        if rec["nodename"].upper() == "DEFAULT":
            defaults.update({k: v for k, v in rec.items() if k != "nodename"})
            continue
        full = {**defaults, **rec}
        gres = full.get("gres")
        if not gres:
            continue
        gpus = [g for g in parse_gres(gres) if g["name"] == "gpu"]
        for host in expand_hostlist(rec["nodename"]):
            for g in gpus:
                t = g["type"] or gres_types.get(host) or default_type
                if not t:
                    raise HorusError(f"slurm.conf: node {host}: untyped GPUs and no Type in gres.conf")
                if g["count"] > 0:
                    nodes.append(NodeSpec(host, t.lower(), int(g["count"])))
    if not nodes:
        raise HorusError("slurm.conf: no NodeName line with Gres=gpu:...")
    return ClusterSpec(tuple(nodes))


# --------------------------------------------------------------------------------------------
# Requests: what each job asks Slurm for under each policy
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """types: indices of the cluster's GPU types the job may run on, in preference order;
    shards: shards per GPU (== S: whole GPUs); gpus: GPUs on one node; share: set for a job the
    horus scheduler may co-locate (it then holds one shard)."""

    types: tuple[int, ...]
    shards: int
    gpus: int
    share: tuple | None = None  # horus/oracle: (util %, p90 MiB, runtime factor per type)


def _eligible_types(job: SimJob, types: list[str], mem: list[float]) -> tuple[int, ...]:
    """Types a user would submit to: those whose memory holds the job's predicted p90 (else the
    largest), fastest for the job first."""
    ok = [i for i, t in enumerate(types) if job.pred[t][2] <= mem[i]]
    ok.sort(key=lambda i: job.runtime_x.get(types[i], 1.0))
    return tuple(ok) or (max(range(len(types)), key=lambda i: mem[i]),)


def _policy_text(base: str, types: list[str], mem: list[float]) -> str:
    """The base policy for the simulated cluster: gpu.<type>.mem_mib added for its types the
    policy does not know, and type_order restricted to its types (the base order first, the
    added ones after; without a type_order in the base: by memory, as the hook's default), and no
    claim record."""
    known = set(re.findall(r"^\s*gpu\.([a-z0-9_-]+)\.mem_mib\s*=", base, re.M))
    extra = [f"gpu.{t}.mem_mib = {int(m)}" for t, m in zip(types, mem) if t not in known]
    orders = re.findall(r"^\s*type_order\s*=\s*([^#\n]*)", base, re.M)
    listed = [x for x in re.split(r"[,\s]+", orders[-1]) if x] if orders else \
        [t for _, t in sorted(zip(mem, types))]
    order = [t for t in listed if t in types] + [t for t in types if t not in listed]
    extra.append("type_order = " + ", ".join(order))
    extra.append("type_features = " + ", ".join(order))  # every simulated node carries its type
    extra.append("underclaim_limit = 0")  # the site's claim record is not the simulated jobs'
    return base.rstrip("\n") + "\n# added by horus-admin simulate for the simulated cluster\n" + \
        "\n".join(extra) + "\n"


class HorusDecider:
    """The real job_submit.lua hook, asked once per distinct (hint, request).

    policy_path: the base policy (default: $HORUS_POLICY, else horus_policy.conf next to the
    hook); GPU types of the cluster that it does not know are added with their memory, into
    a temporary copy.  Use as a context manager (the copy is removed on exit).
    """

    def __init__(self, types: list[str], mem: list[float], policy_path: str | os.PathLike | None = None,
                 hook_path: str | os.PathLike | None = None, decide_fn: Callable | None = None):
        from slurm_horus.slurm.policy import decide, find_hook

        self.types, self.mem = list(types), list(mem)
        self.hook = find_hook(hook_path)
        self._decide = decide_fn or decide
        if policy_path is None:
            policy_path = os.environ.get("HORUS_POLICY") or (self.hook.parent / "horus_policy.conf")
        try:
            base = Path(policy_path).read_text()
        except OSError as e:
            raise HorusError(f"policy file {policy_path}: {e.strerror or e}") from None
        self._tmp = tempfile.TemporaryDirectory(prefix="horus-sim-")
        self.policy_path = Path(self._tmp.name) / "horus_policy.conf"
        self.policy_path.write_text(_policy_text(base, self.types, self.mem))
        self.cache: dict[tuple[str, str], tuple[str, str | None, int | None]] = {}
        self._by_pred: dict[tuple, tuple[str, str | None, int | None]] = {}
        self.calls = 0
        self.shards_per_gpu = self._probe_shards()

    def close(self) -> None:
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _probe_shards(self) -> int:
        """S, read from what the hook does with a tiny job (no re-parsing of the policy)."""
        from slurm_horus.slurm.hint import encode_hint

        for t in self.types:
            d = self.decide_raw(encode_hint({t: (0.1, 1, 1)}), "gres:gpu:1")
            if d[0] == "shared" and d[3]:
                return int(d[3])
        raise HorusError("the policy shares no GPU type of the simulated cluster "
                         "(check gpu.<type>.mem_mib in the policy file)")

    def decide_raw(self, hint: str, tres: str) -> tuple[str, str | None, int | None, int | None]:
        key = (hint, tres)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        d = self._decide({"comment": hint, "tres_per_node": tres},
                         policy_path=self.policy_path, hook_path=self.hook)
        self.calls += 1
        out = (d.action, d.gpu_type, d.shards, d.shards_per_gpu)
        self.cache[key] = out
        return out

    def decide(self, preds: Mapping[str, tuple[float, float, float]], gpus: int = 1):
        """(action, gpu_type, shards) for a job with these predictions asking for ``gpus`` GPUs."""
        from slurm_horus.slurm.hint import encode_hint

        key = (tuple(preds[t] for t in self.types), gpus)
        hit = self._by_pred.get(key)
        if hit is None:
            hint = encode_hint({t: preds[t] for t in self.types})
            a, t, s, _ = self.decide_raw(hint, f"gres:gpu:{gpus}")
            hit = self._by_pred[key] = (a, t, s)
        return hit


def _ceil_to(x: float, q: float) -> float:
    return math.ceil(x / q - 1e-9) * q if q > 0 else x


def build_requests(jobs: Sequence[SimJob], policy: str, types: list[str], mem: list[float],
                   shards_per_gpu: int, *, naive_shards: int = 50, decider: HorusDecider | None = None,
                   oracle_util_q: float = 1.0, oracle_mem_q: float = 256.0,
                   pack: bool = True) -> tuple[list[Request | None], dict]:
    """Each job's request under ``policy``; None for a job Slurm would reject.  The oracle's
    hint is the truth rounded UP to ``oracle_util_q`` % and ``oracle_mem_q`` MiB (fewer distinct
    hints, never an understatement).  ``pack``: horus/oracle 1-GPU jobs are co-located by the
    simulator's queue-pressure scheduler (predicted slowdown); else by the hook's shards alone."""
    S = shards_per_gpu
    tindex = {t: i for i, t in enumerate(types)}
    reqs: list[Request | None] = []
    stats = {"shared": 0, "exclusive": 0, "unchanged": 0, "rejected": 0}
    if policy in ("horus", "oracle") and decider is None:
        raise HorusError(f"policy {policy} needs the job_submit hook")
    for j in jobs:
        elig = _eligible_types(j, types, mem)
        if policy == "exclusive" or (policy == "naive" and j.gpus > 1):
            reqs.append(Request(elig, S, j.gpus))
            stats["exclusive"] += 1
        elif policy == "naive":
            reqs.append(Request(elig, min(S, max(1, naive_shards)), 1))
            stats["shared"] += 1
        elif policy in ("horus", "oracle"):
            if policy == "horus":
                preds = j.pred
            else:
                preds = {}
                for t in types:
                    u, m = j.true[t]
                    mq = _ceil_to(m, oracle_mem_q)
                    preds[t] = (min(100.0, _ceil_to(u, oracle_util_q)), mq, mq)
            action, gtype, shards = decider.decide(preds, j.gpus)
            stats[action] = stats.get(action, 0) + 1
            if action == "rejected":
                reqs.append(None)
            elif pack and j.gpus == 1:
                # the queue-pressure scheduler: the hook admits, co-location is decided at start
                t0 = types[elig[0]]
                rx = tuple(j.runtime_x.get(t, 1.0) for t in types)
                reqs.append(Request(elig, 1, 1, (preds[t0][0], preds[t0][2], rx)))
            elif action == "shared" and gtype == "any" and "any" not in tindex:
                # type_choice = any: shards with no type, on whichever type frees up first
                reqs.append(Request(tuple(range(len(types))), int(shards), 1))
            elif action == "shared" and gtype in tindex:
                reqs.append(Request((tindex[gtype],), int(shards), 1))
            elif action == "exclusive" and gtype in tindex:
                reqs.append(Request((tindex[gtype],), S, j.gpus))
            else:
                reqs.append(Request(elig, S, j.gpus))
        else:
            raise HorusError(f"unknown policy '{policy}'; choose from {', '.join(POLICIES)}")
    return reqs, stats


# --------------------------------------------------------------------------------------------
# The simulator
# --------------------------------------------------------------------------------------------

_FINISH, _ARRIVE, _TICK = 0, 1, 2


class Simulator:
    """One policy on one cluster and trace.  ``run()`` returns the metrics (a dict)."""

    def __init__(self, cluster: ClusterSpec, jobs: Sequence[SimJob], requests: Sequence[Request | None],
                 shards_per_gpu: int = 100, *, interference: Interference | None = None,
                 bf_window: int = 100, bf_interval: float = 0.0, oom_delay_s: float = 60.0,
                 backfill: bool = True, slowdown_bound: float = 2.0, max_group: int = 4,
                 window_s: float | None = None):
        if len(jobs) != len(requests):
            raise HorusError("one request per job needed")
        self.cluster, self.jobs, self.reqs = cluster, list(jobs), list(requests)
        self.S = int(shards_per_gpu)
        self.itf = interference or Interference()
        self.bf_window, self.bf_interval = int(bf_window), float(bf_interval)
        self.oom_delay = float(oom_delay_s)
        self.backfill = backfill
        self.types = cluster.gpu_types
        self.tmem = [cluster.mem_mib(t) for t in self.types]
        if slowdown_bound < 1.0 or max_group < 1:
            raise HorusError("--slowdown-bound must be >= 1 and --max-group >= 1")
        self.max_group = int(max_group)
        # umax[n]: the largest summed PREDICTED util at which n co-located jobs keep the median
        # per-job speed >= 1 / slowdown_bound (the curve falls with the sum: bisection)
        self.umax = [INF, INF]
        for n in range(2, self.max_group + 1):
            lo, hi = 0.0, 100.0 * n
            if self.itf.speed(lo, n) < 1.0 / slowdown_bound:
                self.umax.append(-1.0)
                continue
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if self.itf.speed(mid, n) >= 1.0 / slowdown_bound else (lo, mid)
            self.umax.append(lo)
        self.window_s = window_s

    # -- resource bookkeeping ----------------------------------------------------------------

    def _setup(self):
        S, types = self.S, self.types
        tix = {t: i for i, t in enumerate(types)}
        self.gtype, self.gnode, self.gmem_cap = [], [], []
        self.node_gpus, self.node_type, self.gslot = [], [], []
        for n, node in enumerate(self.cluster.nodes):
            ids = []
            for _ in range(node.gpus):
                g = len(self.gtype)
                self.gtype.append(tix[node.gpu_type])
                self.gnode.append(n)
                self.gmem_cap.append(self.tmem[tix[node.gpu_type]])
                self.gslot.append(len(ids))
                ids.append(g)
            self.node_gpus.append(ids)
            self.node_type.append(tix[node.gpu_type])
        G = len(self.gtype)
        self.G = G
        self.maxk = max(len(x) for x in self.node_gpus)
        # ff[node][slot]: when that GPU is entirely free by its jobs' limits (-inf idle, +inf: no
        # GPU); ffs[node]: the same sorted (ffs[node][k - 1]: when k of its GPUs are)
        self.ff = [[-INF] * len(ids) + [INF] * (self.maxk - len(ids)) for ids in self.node_gpus]
        self.ffs = [sorted(row) for row in self.ff]
        self.type_nodes = [[n for n in range(len(self.node_gpus)) if self.node_type[n] == t]
                           for t in range(len(types))]
        # kheaps[type][k]: (ffs[node][k - 1], node) of that type's nodes, made at the first
        # reservation for k GPUs; _set_ff pushes each change, entries no longer equal to ffs are stale
        self.kheaps: list[dict[int, list[tuple[float, int]]]] = [{} for _ in types]
        self.free = [S] * G
        self.n_avail = G  # GPUs with at least one free shard
        self.gjobs: list[list[int]] = [[] for _ in range(G)]
        self.gutil = [0.0] * G
        self.gmemu = [0.0] * G
        self.ghealthy = [0] * G
        self.gspeed = [1.0] * G
        self.gcontrib = [0.0] * G
        self.node_idle = [set(ids) for ids in self.node_gpus]
        self.part = [[set() for _ in range(S)] for _ in types]     # [type][free] partially used
        self.nodeb = [[set() for _ in range(self.maxk + 1)] for _ in types]  # [type][idle count]
        for n, ids in enumerate(self.node_gpus):
            self.nodeb[self.node_type[n]][len(ids)].add(n)
        # the per-type util / mem / runtime of each job, indexed by type index
        self.jtrue = [[j.true[t] for t in types] for j in self.jobs]
        self.jdur = [[j.duration * j.runtime_x.get(t, 1.0) for t in types] for j in self.jobs]
        self.jsens = [j.sens for j in self.jobs]
        # co-location state of the horus scheduler: predicted util / p90 memory summed over each
        # GPU's shareable jobs, and their count
        self.pu = np.zeros(G)
        self.pm = np.zeros(G)
        self.ns = np.zeros(G, dtype=np.int64)
        self.gcap = np.array(self.gmem_cap)
        self.gtype_np = np.array(self.gtype)
        self.umax_np = np.array(self.umax + [-1.0])
        # what _share_place reads of each GPU's count ns, kept by _set_share: room for one more
        # (nsok), the memory headroom of ns + 1 jobs (hm), their util limit (uthr), and the rank
        # pu + 1000 ns (the fewest jobs, then the least util)
        self.nsok = np.zeros(G, dtype=bool)
        self.hm = np.full(G, MEM_HEADROOM_MIB)
        self.uthr = np.full(G, self.umax_np[1])
        self.rank = np.zeros(G)
        self.whole_req = [Request((t,), S, 1) for t in range(len(types))]

    def _set_free(self, g: int, new: int) -> None:
        old = self.free[g]
        if old == new:
            return
        S, t, n = self.S, self.gtype[g], self.gnode[g]
        if old == 0:
            self.n_avail += 1
        elif new == 0:
            self.n_avail -= 1
        if 0 < old < S:
            self.part[t][old].discard(g)
        elif old == S:
            idle = self.node_idle[n]
            k = len(idle)
            self.nodeb[t][k].discard(n)
            idle.discard(g)
            if k > 1:
                self.nodeb[t][k - 1].add(n)
        if new == S:
            idle = self.node_idle[n]
            k = len(idle)
            if k:
                self.nodeb[t][k].discard(n)
            idle.add(g)
            self.nodeb[t][k + 1].add(n)
        elif new > 0:
            self.part[t][new].add(g)
        self.free[g] = new

    def _set_share(self, g: int) -> None:
        """Refresh GPU g's entries of the arrays _share_place reads after its ns/pu changed."""
        n = int(self.ns[g])
        self.nsok[g] = 1 <= n < self.max_group
        self.hm[g] = MEM_HEADROOM_MIB * (n + 1)
        self.uthr[g] = self.umax_np[min(n + 1, self.max_group + 1)]
        self.rank[g] = self.pu[g] + 1000.0 * n

    def _share_place(self, req: Request, exclude: set | None) -> list[int] | None:
        """The horus scheduler: an idle GPU while there is one (spread); else, under queue
        pressure, the GPU whose shareable jobs leave the most room, among those where the group's
        summed predicted util keeps every job's predicted slowdown within the bound and the
        predicted p90 memories fit."""
        u, m, rx = req.share
        best, best_cost = None, INF
        for t in req.types:  # fastest type first: the first idle GPU is the best idle one
            whole = self._place(self.whole_req[t], exclude)
            if whole is not None:
                best, best_cost = whole, rx[t]
                break
        if best_cost <= min(rx[t] for t in req.types):
            return best
        ns = self.ns
        ok = self.nsok & (self.pm + m + self.hm <= self.gcap) & (self.pu + u <= self.uthr)
        if len(self.types) > 1 and len(req.types) < len(self.types):
            ok &= np.isin(self.gtype_np, req.types)
        if exclude:
            ok[list(exclude)] = False
        cand = np.flatnonzero(ok)
        if not len(cand):
            return best
        g = int(cand[np.argmin(self.rank[cand])])
        # co-locate on a faster type rather than run alone on a slower one when the predicted
        # slowdown there costs less than the slower GPU does
        t = self.gtype[g]
        cost = rx[t] / self.itf.speed(self.pu[g] + u, int(ns[g]) + 1)
        return [g] if cost < best_cost else best

    def _place(self, req: Request, exclude: set | None) -> list[int] | None:
        """GPUs for ``req`` now (best fit), avoiding ``exclude``; None if it does not fit."""
        S = self.S
        if req.share is not None:
            return self._share_place(req, exclude)
        for t in req.types:
            if req.gpus == 1 and req.shards < S:
                part = self.part[t]
                for f in range(req.shards, S):
                    for g in part[f]:
                        if exclude is None or g not in exclude:
                            return [g]
            k = req.gpus
            nodeb = self.nodeb[t]
            for c in range(k, self.maxk + 1):
                for n in nodeb[c]:
                    idle = self.node_idle[n]
                    if exclude is not None:
                        idle = idle - exclude
                        if len(idle) < k:
                            continue
                    return sorted(idle)[:k]
        return None

    # -- time accounting ---------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        dt = now - self.t_last
        if dt > 0:
            self.acc_util += self.cur_util * dt
            self.acc_busy += self.cur_busy * dt
            wdt = min(now, self.w_end) - self.t_last
            if wdt > 0:
                self.w_util += self.cur_util * wdt
                self.w_busy += self.cur_busy * wdt
            self.t_last = now

    def _refresh(self, g: int, now: float, new_job: int = -1) -> None:
        """Recompute the speed of GPU g's jobs after its job set changed; re-plan their ends."""
        n, tot, t = self.ghealthy[g], self.gutil[g], self.gtype[g]
        speed, gspeed, jspeed = self.itf.speed, self.gspeed, self.speed
        failing, allocs, jtrue, jsens = self.failing, self.alloc, self.jtrue, self.jsens
        gspeed[g] = speed(tot, n)
        work = 0.0
        for j in self.gjobs[g]:
            if failing[j]:
                continue
            alloc = allocs[j]
            if len(alloc) == 1:
                s = speed(tot, n, jsens[j]) if n > 1 else 1.0
            else:
                s = min(gspeed[x] for x in alloc)
            work += jtrue[j][t][0] * s
            if s == jspeed[j] and j != new_job:
                continue
            self.remaining[j] -= (now - self.last[j]) * jspeed[j]
            self.last[j] = now
            jspeed[j] = s
            self.version[j] += 1
            end = now + max(self.remaining[j], 0.0) / s
            if end > self.limit_end[j]:
                end = self.limit_end[j]
            self._push(end, _FINISH, j, self.version[j])
        c = min(1.0, work / 100.0)
        self.cur_util += c - self.gcontrib[g]
        self.gcontrib[g] = c

    def _push(self, t: float, kind: int, j: int, ver: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, j, ver))

    # -- job life ----------------------------------------------------------------------------

    def _start(self, j: int, alloc: list[int], now: float) -> None:
        req = self.cur_req[j]
        t = self.gtype[alloc[0]]
        u, m = self.jtrue[j][t]
        for g in alloc:
            if not self.gjobs[g]:
                self.cur_busy += 1
            self._set_free(g, self.free[g] - req.shards)
            self.gjobs[g].append(j)
        if req.share is not None:
            g = alloc[0]
            self.pu[g] += req.share[0]
            self.pm[g] += req.share[1]
            self.ns[g] += 1
            self._set_share(g)
        self.alloc[j] = alloc
        self.start[j] = now
        self.solo[j] = self.jdur[j][t]
        if self.first_start[j] < 0:
            self.first_start[j] = now
        self.started += 1
        if req.shards < self.S:
            self.shared_starts += 1
        gmemu, cap = self.gmemu, self.gmem_cap
        oom = False
        for g in alloc:
            if gmemu[g] + m > cap[g]:
                oom = True
                break
        if oom:
            self.failing[j] = True
            self.version[j] += 1
            end = now + self.oom_delay
            self.limit_end[j] = end
            self._push(end, _FINISH, j, self.version[j])
        else:
            self.failing[j] = False
            self.remaining[j] = self.jdur[j][t]
            self.last[j] = now
            self.speed[j] = 0.0  # forces a (re)plan in _refresh
            self.limit_end[j] = now + self.jobs[j].limit
            for g in alloc:
                self.gutil[g] += u
                self.gmemu[g] += m
                self.ghealthy[g] += 1
        bisect.insort(self.ends, (self.limit_end[j], j))
        for g in alloc:
            self._set_ff(g)
            self._refresh(g, now, new_job=j)

    def _release(self, j: int, now: float) -> None:
        alloc, req = self.alloc[j], self.cur_req[j]
        t = self.gtype[alloc[0]]
        u, m = self.jtrue[j][t]
        i = bisect.bisect_left(self.ends, (self.limit_end[j], j))
        if i < len(self.ends) and self.ends[i][1] == j:
            del self.ends[i]
        if req.share is not None:
            g = alloc[0]
            self.ns[g] -= 1
            self.pu[g] = self.pu[g] - req.share[0] if self.ns[g] else 0.0
            self.pm[g] = self.pm[g] - req.share[1] if self.ns[g] else 0.0
            self._set_share(g)
        for g in alloc:
            self.gjobs[g].remove(j)
            if not self.gjobs[g]:
                self.cur_busy -= 1
            self._set_free(g, self.free[g] + req.shards)
            if not self.failing[j]:
                self.gutil[g] -= u
                self.gmemu[g] -= m
                self.ghealthy[g] -= 1
                if self.ghealthy[g] == 0:
                    self.gutil[g] = self.gmemu[g] = 0.0  # no float drift
        for g in alloc:
            self._set_ff(g)
            self._refresh(g, now)
        self.alloc[j] = None
        self.freed = True

    def _finish(self, j: int, now: float) -> None:
        if self.failing[j]:
            self.oom_failures += 1
            t = self.gtype[self.alloc[j][0]]
            self._release(j, now)
            if not self.requeued[j]:
                # requeued once, on a whole GPU of the type it ran on (as CARMA does)
                self.requeued[j] = True
                self._set_req(j, Request((t,), self.S, self.cur_req[j].gpus))
                self._enqueue(j)
            else:
                self.failed[j] = True
                self.end[j] = now
            return
        self.remaining[j] -= (now - self.last[j]) * self.speed[j]
        self.last[j] = now
        if self.remaining[j] > 1e-6 * max(1.0, self.jobs[j].duration):
            self.timeouts += 1
            self.timed_out[j] = True
        self.end[j] = now
        self._release(j, now)

    def _set_req(self, j: int, req: Request) -> None:
        """Job j's current request and what backfill reads of it: (memo key, shards, predicted
        util, p90 memory; None, None for a job that is not shareable).  The key: 2 x the index
        of its (types, GPUs, shareable), +1 (added by _schedule) while it must stay off the
        reserved GPUs."""
        self.cur_req[j] = req
        sh = req.share
        key = 2 * self.kid.setdefault((req.types, req.gpus, sh is None), len(self.kid))
        self.jrec[j] = (key, req.shards, None, None) if sh is None else (key, req.shards, sh[0], sh[1])

    def _enqueue(self, j: int) -> None:
        """Priority order (submit time, then index); arrivals come in that order, so append."""
        q, qkey = self.queue, self.qkey
        if not q or qkey[j] > qkey[q[-1]]:
            q.append(j)
        else:
            q.insert(bisect.bisect_right(q, qkey[j], key=qkey.__getitem__), j)

    # -- scheduling --------------------------------------------------------------------------

    def _set_ff(self, g: int) -> None:
        """Time GPU g is entirely free again by its jobs' time limits (-inf: idle now)."""
        jobs, n = self.gjobs[g], self.gnode[g]
        row, old = self.ff[n], self.ffs[n]
        if len(jobs) == 1:
            row[self.gslot[g]] = self.limit_end[jobs[0]]
        else:
            row[self.gslot[g]] = max(self.limit_end[x] for x in jobs) if jobs else -INF
        new = self.ffs[n] = sorted(row)
        t = self.node_type[n]
        for k, heap in self.kheaps[t].items():
            if new[k - 1] != old[k - 1]:
                heapq.heappush(heap, (new[k - 1], n))
                if len(heap) > 4 * len(self.type_nodes[t]):  # drop the stale entries
                    heap[:] = sorted((self.ffs[x][k - 1], x) for x in self.type_nodes[t])

    def _kth_free(self, t: int, k: int) -> tuple[float, int]:
        """(time, node): the first node of type t whose k-th GPU is entirely free earliest."""
        heap = self.kheaps[t].get(k)
        if heap is None:
            heap = self.kheaps[t][k] = [(self.ffs[n][k - 1], n) for n in self.type_nodes[t]]
            heapq.heapify(heap)
        ffs = self.ffs
        while heap[0][0] != ffs[heap[0][1]][k - 1]:
            heapq.heappop(heap)
        return heap[0]

    def _reservation(self, h: int, now: float) -> tuple[float, set]:
        """EASY: earliest time (by running jobs' time limits) and GPUs at which job h fits."""
        req, S = self.cur_req[h], self.S
        if req.gpus > 1 or req.shards >= S or req.share is not None:
            # whole GPUs on one node: per node, the k-th GPU to become entirely free
            k, best, best_set = req.gpus, INF, set()
            for t in req.types:
                kth, n = self._kth_free(t, k)
                if kth < best:
                    best = kth
                    row, ids = self.ff[n], self.node_gpus[n]
                    best_set = {ids[x] for x in sorted(range(self.maxk), key=row.__getitem__)[:k]}
            return max(best, now), best_set
        # shards on one GPU: release running jobs in order of their limits
        types = set(req.types)
        extra: dict[int, int] = {}
        for end, j in self.ends:
            sh = self.cur_req[j].shards
            for g in self.alloc[j]:
                if self.gtype[g] not in types:
                    continue
                e = extra.get(g, 0) + sh
                extra[g] = e
                if self.free[g] + e >= req.shards:
                    return end, {g}
        return INF, set()

    def _schedule(self, now: float, backfill_now: bool) -> None:
        q = self.queue
        if not self.n_avail:
            return  # nothing free: nothing can start (flags kept for the next pass)
        if q and (self.freed or q[0] != self.last_head):
            while q:
                j = q[0]
                alloc = self._place(self.cur_req[j], None)
                if alloc is None:
                    break
                q.popleft()
                self._start(j, alloc, now)
        if not q or not self.backfill or not backfill_now or len(q) < 2:
            self.n_new = 0 if not q else self.n_new
            if not q:
                self.last_head = -1
            return
        head = q[0]
        if self.freed or head != self.last_head:
            # something may fit now that did not before: the whole window again
            self.bf_passes += 1
            self.res = self._reservation(head, now)
            first = 1
        else:
            # only new arrivals (appended at the end) can fit: resources only shrank since
            first = max(1, len(q) - self.n_new)
        self.freed = False
        self.last_head = head
        self.n_new = 0
        shadow, reserved = self.res
        # per memo key (_set_req): the fewest shards that did not fit, and the (util, memory) of
        # shareable jobs that did not fit.  Resources only shrink during the pass, and what did
        # not fit on any GPU does not fit off the reserved ones (key + 1) either.
        nkeys = 2 * len(self.kid)
        memo = [self.S + 1] * nkeys
        fails: list[list[tuple[float, float]]] = [[] for _ in range(nkeys)]
        limit, jrec, cur_req = self.jlimit, self.jrec, self.cur_req
        horizon = shadow - now
        gone = 0
        # the window: queue positions first..bf_window as they were when the pass began
        window = list(islice(q, first, self.bf_window + 1)) if first <= self.bf_window else []
        for pos, j in enumerate(window, first):
            key, shards, u, m = jrec[j]
            if limit[j] <= horizon:
                excl = None
            else:
                excl, key = reserved, key + 1
            if u is None:
                if memo[key] <= shards:
                    continue
            else:
                # a shareable job cannot fit where one no larger (util and memory) did not
                smaller = False
                for fu, fm in fails[key]:
                    if u >= fu and m >= fm:
                        smaller = True
                        break
                if smaller:
                    continue
            alloc = self._place(cur_req[j], excl)
            if alloc is None:
                if u is None:
                    memo[key] = shards
                    if excl is None and shards < memo[key + 1]:
                        memo[key + 1] = shards
                else:
                    fails[key].append((u, m))
                    if excl is None:
                        fails[key + 1].append((u, m))
                continue
            del q[pos - gone]
            gone += 1
            self.backfilled += 1
            self._start(j, alloc, now)
            if not self.n_avail:
                break

    # -- main loop ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        self._setup()
        N = len(self.jobs)
        self.cur_req: list[Request | None] = [None] * N
        self.jrec: list[tuple | None] = [None] * N
        self.kid: dict[tuple, int] = {}
        self.jlimit = [j.limit for j in self.jobs]
        self.alloc: list[list[int] | None] = [None] * N
        self.start = [-1.0] * N
        self.solo = [0.0] * N
        self.first_start = [-1.0] * N
        self.end = [-1.0] * N
        self.remaining = [0.0] * N
        self.last = [0.0] * N
        self.speed = [0.0] * N
        self.version = [0] * N
        self.limit_end = [0.0] * N
        self.failing = [False] * N
        self.requeued = [False] * N
        self.failed = [False] * N
        self.timed_out = [False] * N
        # the wait queue: a deque, as starts take jobs from its front (and the backfill window)
        self.queue: deque[int] = deque()
        self.qkey = [(j.submit, i) for i, j in enumerate(self.jobs)]
        self.ends: list[tuple[float, int]] = []
        self.events: list[tuple] = []
        self.seq = 0
        self.oom_failures = self.timeouts = self.backfilled = self.bf_passes = 0
        self.started = self.shared_starts = 0
        self.cur_util = 0.0
        self.cur_busy = 0
        self.acc_util = self.acc_busy = self.w_util = self.w_busy = 0.0
        self.freed, self.last_head, self.n_new, self.res = False, -1, 0, (INF, set())
        rejected = 0
        unschedulable = 0
        arrivals: list[tuple] = []
        for i, j in enumerate(self.jobs):
            r = self.reqs[i]
            if r is None:
                rejected += 1
                continue
            fits = any(len(ids) >= r.gpus and self.gtype[ids[0]] in r.types for ids in self.node_gpus)
            if not fits:
                unschedulable += 1
                continue
            self._set_req(i, r)
            arrivals.append((j.submit, _ARRIVE, i, i, 0))
        self.seq = N
        # arrivals stay in their own sorted list, merged with the heap of the other events in
        # the same (time, kind, seq) order: the heap then holds only the running jobs' events
        arrivals.sort()
        n_arr, ai = len(arrivals), 0
        t0 = min((j.submit for j in self.jobs), default=0.0)
        self.t_last = t0
        # the fixed window every policy is measured over: first to last submit (the arrivals)
        last_submit = max((j.submit for j in self.jobs), default=0.0)
        self.w_end = t0 + (self.window_s if self.window_s is not None else last_submit - t0)
        last_bf, tick_pending = -INF, False
        ev = self.events
        while ev or ai < n_arr:
            now = arrivals[ai][0] if ai < n_arr and (not ev or arrivals[ai] < ev[0]) else ev[0][0]
            self._advance(now)
            while True:
                if ai < n_arr and arrivals[ai][0] == now and (not ev or arrivals[ai] < ev[0]):
                    _, kind, _, j, ver = arrivals[ai]
                    ai += 1
                elif ev and ev[0][0] == now:
                    _, kind, _, j, ver = heapq.heappop(ev)
                else:
                    break
                if kind == _FINISH:
                    if ver == self.version[j] and self.alloc[j] is not None:
                        self._finish(j, now)
                elif kind == _ARRIVE:
                    self._enqueue(j)
                    self.n_new += 1
                else:
                    tick_pending = False
            bf = self.bf_interval <= 0 or now - last_bf >= self.bf_interval
            if bf:
                last_bf = now
            self._schedule(now, bf)
            if self.queue and not bf and not tick_pending and self.backfill:
                self._push(last_bf + self.bf_interval, _TICK, -1, 0)
                tick_pending = True
        out = self._metrics(t0, rejected, unschedulable, time.perf_counter() - t_wall)
        out["sim_cpu_s"] = time.process_time() - t_cpu
        return out

    def _metrics(self, t0: float, rejected: int, unschedulable: int, wall: float) -> dict[str, Any]:
        done = [i for i in range(len(self.jobs)) if self.end[i] >= 0 and not self.failed[i]]
        jct = sorted(self.end[i] - self.jobs[i].submit for i in done)
        waits = [self.start[i] - self.jobs[i].submit for i in done]
        slow = sorted((self.end[i] - self.start[i]) / self.solo[i] for i in done
                      if not self.timed_out[i])
        win = self.w_end - t0
        in_win = sum(1 for i in done if self.end[i] <= self.w_end)
        t_end = max((self.end[i] for i in range(len(self.jobs)) if self.end[i] >= 0), default=t0)
        span = max(t_end - t0, 0.0)

        def pct(xs: list[float], p: float) -> float:
            if not xs:
                return 0.0
            k = (len(xs) - 1) * p
            lo, hi = math.floor(k), math.ceil(k)
            return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

        G = self.G
        return {
            "jobs": len(self.jobs),
            "completed": len(done),
            "makespan_s": span,
            "mean_jct_s": sum(jct) / len(jct) if jct else 0.0,
            "median_jct_s": pct(jct, 0.5),
            "p95_jct_s": pct(jct, 0.95),
            "mean_wait_s": sum(waits) / len(waits) if waits else 0.0,
            "gpu_util": self.acc_util / (G * span) if span > 0 else 0.0,
            "gpus_busy": self.acc_busy / span if span > 0 else 0.0,
            "gpus_busy_frac": self.acc_busy / (G * span) if span > 0 else 0.0,
            "mean_slowdown": sum(slow) / len(slow) if slow else 1.0,
            "p50_slowdown": pct(slow, 0.5) if slow else 1.0,
            "p95_slowdown": pct(slow, 0.95) if slow else 1.0,
            "p99_slowdown": pct(slow, 0.99) if slow else 1.0,
            "window_s": win,
            "throughput_per_h": 3600.0 * in_win / win if win > 0 else 0.0,
            "sm_busy": self.w_util / (G * win) if win > 0 else 0.0,
            "gpus_alloc": self.w_busy / (G * win) if win > 0 else 0.0,
            "oom_failures": self.oom_failures,
            "failed_jobs": sum(self.failed),
            "timeouts": self.timeouts,
            "rejected": rejected,
            "unschedulable": unschedulable,
            "shared_starts": self.shared_starts,
            "backfilled": self.backfilled,
            "sim_wall_s": wall,
        }


def simulate(cluster: ClusterSpec, jobs: Sequence[SimJob], policy: str, *,
             decider: HorusDecider | None = None, shards_per_gpu: int = 100, naive_shards: int = 50,
             **kw) -> dict[str, Any]:
    """Run one policy; returns its metrics plus the request statistics (``decisions``)."""
    types = cluster.gpu_types
    mem = [cluster.mem_mib(t) for t in types]
    if decider is not None:
        shards_per_gpu = decider.shards_per_gpu
    t = time.process_time()
    reqs, stats = build_requests(jobs, policy, types, mem, shards_per_gpu,
                                 naive_shards=naive_shards, decider=decider)
    t_req = time.process_time() - t
    out = Simulator(cluster, jobs, reqs, shards_per_gpu, **kw).run()
    out["decisions"] = stats
    out["request_cpu_s"] = t_req
    return out


def run_policies(cluster: ClusterSpec, jobs: Sequence[SimJob], policies: Iterable[str] = POLICIES, *,
                 policy_path: str | os.PathLike | None = None, hook_path: str | os.PathLike | None = None,
                 naive_shards: int = 50, **kw) -> dict[str, dict[str, Any]]:
    """Every policy on the same trace: {policy: metrics}.  One hook runtime serves all."""
    policies = list(policies)
    for p in policies:
        if p not in POLICIES:
            raise HorusError(f"unknown policy '{p}'; choose from {', '.join(POLICIES)}")
    types = cluster.gpu_types
    mem = [cluster.mem_mib(t) for t in types]
    with HorusDecider(types, mem, policy_path, hook_path) as decider:
        S = decider.shards_per_gpu
        if not 1 <= naive_shards <= S:
            raise HorusError(f"--naive-shards must be in 1..{S}")
        results = {}
        for p in policies:
            results[p] = simulate(cluster, jobs, p, decider=decider if p in ("horus", "oracle") else None,
                                  shards_per_gpu=S, naive_shards=naive_shards, **kw)
        return results
