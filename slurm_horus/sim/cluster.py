"""The simulated cluster: nodes and their GPUs, from a size, a JSON file or a slurm.conf."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

from slurm_horus.errors import HorusError
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.slurm.parse import expand_hostlist, node_lines, parse_conf_lines, parse_gres

MAX_CLUSTER_GPUS = 1_000_000  # the simulator keeps per-GPU arrays: a bound on what it is asked
# nodes x the largest node's GPUs: the placement keeps a row per node that wide (two lists of
# them: 20 million slots are about 320 MB)
MAX_NODE_SLOTS = 20_000_000
MAX_GPU_MEM_MIB = 16 * 1024 * 1024  # 16 TiB: no GPU has more (a bound on what the file says)
# no GPU a job is packed on has less than 1 GiB: "mem_mib": 40 is 40 GB written in the wrong
# unit, and had run every job in a 40 MiB GPU (true memory capped to fit, no OOM)
MIN_GPU_MEM_MIB = 1024

# sched/backfill's defaults and limits (Slurm 25.11, src/plugins/sched/backfill/backfill.c)
SLURM_BF_INTERVAL_S, SLURM_BF_MAX_JOB_TEST = 30, 500
_MAX_BF_INTERVAL_S, MAX_BF_MAX_JOB_TEST = 10800, 1_000_000

__all__ = ["NodeSpec", "ClusterSpec", "Backfill", "homogeneous_cluster", "cluster_from_json",
           "cluster_from_slurm_conf", "backfill_from_slurm_conf"]


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
        # every way in (a size, JSON, slurm.conf): a node line of 10^11 GPUs filled 22 GB
        total = sum(n.gpus for n in self.nodes)
        if total > MAX_CLUSTER_GPUS:
            raise HorusError(f"cluster: more than {MAX_CLUSTER_GPUS:,} GPUs")
        if len(self.nodes) * max(n.gpus for n in self.nodes) > MAX_NODE_SLOTS:
            # the placement keeps a row per node as wide as the largest node
            raise HorusError("cluster: nodes of very different sizes (one node has "
                             f"{max(n.gpus for n in self.nodes):,} GPUs beside {len(self.nodes):,} "
                             "nodes); simulate them as separate clusters")

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
    if gpus > MAX_CLUSTER_GPUS:
        raise HorusError(f"--gpus: at most {MAX_CLUSTER_GPUS:,}")
    nodes, left, i = [], gpus, 0
    while left > 0:
        k = min(per_node, left)
        nodes.append(NodeSpec(f"n{i:04d}", gpu_type, k))
        left -= k
        i += 1
    return ClusterSpec(tuple(nodes))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def cluster_from_json(text: str) -> ClusterSpec:
    """``{"nodes": [{"name": "g01", "gpu_type": "a100", "gpus": 8, "count": 1, "mem_mib": ...}]}``
    (``count``: that many identical nodes, named name-0, name-1, ...; default 1)."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise HorusError(f"cluster file: not JSON ({str(e).splitlines()[0][:200]})") from None
    raw = data.get("nodes") if isinstance(data, dict) else data
    if not isinstance(raw, list) or not raw:
        raise HorusError("cluster file: need {\"nodes\": [{\"name\", \"gpu_type\", \"gpus\"}, ...]}")
    nodes, total, mems = [], 0, {}
    for i, e in enumerate(raw, 1):
        if not isinstance(e, dict):
            raise HorusError(f"cluster file: node #{i} is not an object")
        try:
            gpus, count, gtype = e["gpus"], e.get("count", 1), e["gpu_type"]
        except KeyError as k:
            raise HorusError(f"cluster file: node #{i}: missing {k}") from None
        if not isinstance(gtype, str):
            raise HorusError(f"cluster file: node #{i}: gpu_type must be a name")
        gtype = gtype.lower()
        if isinstance(gpus, bool) or not isinstance(gpus, int) or isinstance(count, bool) \
                or not isinstance(count, int) or count < 1:
            raise HorusError(f"cluster file: node #{i}: gpus and count must be positive integers")
        mem = e.get("mem_mib")
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, (int, float))
                                or not MIN_GPU_MEM_MIB <= mem <= MAX_GPU_MEM_MIB):
            raise HorusError(f"cluster file: node #{i}: mem_mib must be a number of MiB in "
                             f"[{MIN_GPU_MEM_MIB:,}, {MAX_GPU_MEM_MIB:,}] (MiB, not GB)")
        if mem is not None and mems.setdefault(gtype, mem) != mem:
            raise HorusError(f"cluster file: node #{i}: {gtype} GPUs with mem_mib {mem} and "
                             f"{mems[gtype]}: one size per type (name the other type apart)")
        name = str(e.get("name") or f"node{i}")
        total += gpus * count
        if total > MAX_CLUSTER_GPUS:
            raise HorusError(f"cluster file: more than {MAX_CLUSTER_GPUS:,} GPUs")
        for c in range(count):
            nodes.append(NodeSpec(name if count == 1 else f"{name}-{c}", gtype, gpus, mem))
    twice = [x for x, k in Counter(n.name for n in nodes).items() if k > 1]
    if twice:
        raise HorusError(f"cluster file: node {twice[0]} named twice")
    return ClusterSpec(tuple(nodes))


def cluster_from_slurm_conf(text: str, gres_conf: str | None = None) -> ClusterSpec:
    """Nodes with GPUs of a slurm.conf (``NodeName=... Gres=gpu:a100:4,shard:400``).  Untyped
    ``gpu:N`` takes its type from gres.conf (``Name=gpu Type=a100``) when given."""
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
    nodes, seen = [], set()
    for full in node_lines(parse_conf_lines(text)):
        gres = full.get("gres")
        if not gres:
            continue
        gpus = [g for g in parse_gres(gres) if g["name"] == "gpu"]
        for host in expand_hostlist(full["nodename"]):
            if host in seen:  # as slurmctld, which refuses a node defined twice
                raise HorusError(f"slurm.conf: node {host} defined twice")
            seen.add(host)
            for g in gpus:
                t = g["type"] or gres_types.get(host) or default_type
                if not t:
                    raise HorusError(f"slurm.conf: node {host}: untyped GPUs and no Type in gres.conf")
                if g["count"] > 0:
                    nodes.append(NodeSpec(host, t.lower(), int(g["count"])))
    if not nodes:
        raise HorusError("slurm.conf: no NodeName line with Gres=gpu:...")
    return ClusterSpec(tuple(nodes))


@dataclass(frozen=True)
class Backfill:
    """How a slurm.conf backfills: at all, every how many seconds, over how many waiting jobs."""
    enabled: bool
    interval_s: float
    max_job_test: int


def _atoi(text: str) -> int:
    """glibc's atoi, as slurmctld reads a number: (int) strtol, so ASCII digits after blanks,
    0 when there are none, saturated at 64 bits and then cut to 32 (C's conversion to int)."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", text, re.ASCII)
    n = max(min(int(m.group(1)), 2 ** 63 - 1), -2 ** 63) if m else 0
    return (n + 2 ** 31) % 2 ** 32 - 2 ** 31


def _sched_param(params: str, key: str) -> int | None:
    """A SchedulerParameters number as slurmctld finds it: the first case-insensitive
    occurrence of ``key=`` anywhere in the value (xstrcasestr), the number after it."""
    i = params.lower().find(key + "=")
    return None if i < 0 else _atoi(params[i + len(key) + 1:])


def backfill_from_slurm_conf(text: str) -> Backfill:
    """SchedulerType and SchedulerParameters' bf_interval and bf_max_job_test, as slurmctld 25.11
    reads them (backfill.c _load_config): the latest line of each wins, a key is found as a
    substring in any case, a number is C's atoi; a value out of range is the default (slurmctld
    logs an error); bf_interval=-1 or SchedulerType=sched/builtin: no backfill."""
    sched_type, params = "sched/backfill", ""
    for rec in parse_conf_lines(text):
        sched_type = rec.get("schedulertype", sched_type).strip()
        params = rec.get("schedulerparameters", params)
    interval, enabled = SLURM_BF_INTERVAL_S, sched_type != "sched/builtin"
    n = _sched_param(params, "bf_interval")
    if n == -1:
        enabled = False
    elif n is not None and 1 <= n <= _MAX_BF_INTERVAL_S:
        interval = n
    n = _sched_param(params, "bf_max_job_test")
    return Backfill(enabled, float(interval),
                    n if n is not None and 1 <= n <= MAX_BF_MAX_JOB_TEST else SLURM_BF_MAX_JOB_TEST)
