"""``horus-admin queue``: what the hook cannot do at submission, done on the live queue.

1. OOM recovery (as CARMA does): a shared job that died of a GPU out-of-memory error is requeued
   once on a whole GPU. The evidence is the job's own error output, read with its owner's
   permissions and only from a file written since its last run started; it is still the
   user's own text (a job can print the message itself), so a user can fake an OOM to get one
   whole GPU once, which they could have asked for anyway. Once holds because the mark is the
   commit: a job held for its rerun is released only once its mark is written, or after
   GIVE_UP_S unmarked, and then the journal remembers it instead (given_up_keys).
2. Queue pressure: the hook decides at submission; when more jobs wait for a GPU type than
   its GPUs are idle, pending jobs the hook kept whole are reshaped into shards (pack), as many
   as the idle GPUs leave without one; when as many GPUs of the type sit idle as jobs wait, the
   jobs this loop packed get their whole GPU back, and those the hook shared only for the
   pressure what its decision token says they would have had without it (spread).

Every change is marked in the job's AdminComment with a ``horus-queue:v1;...`` token
(``slurm.accounting.queue_tokens`` reads them; a pack or spread writes an intent first, which
the next pass settles: _settled), which is how the loop knows what it did (at
most one OOM requeue per job) and how ``horus-admin sync`` records it in the ledger
(``jobs.queue_actions``). Run it as root (scontrol update of other users' jobs, which the hook
takes from no other uid), from scrontab or a systemd timer (etc/horus-queue.*). Jobs are read from ``squeue --json``
(``parse.squeue_json_records``), never from scontrol's text, in which a user's job name or
comment can forge fields and whole records."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable

from slurm_horus.errors import HorusError
from slurm_horus.ledger.claims import open_as_owner, owner_ids
from slurm_horus.proc_child import run_in_child
from slurm_horus.slurm.accounting import QUEUE_TOKEN, queue_tokens
from slurm_horus.slurm.commands import run, slurm_version
from slurm_horus.slurm.hint import HookDecision, parse_decision, parse_hint
from slurm_horus.slurm.parse import (array_task_count, expand_batch_stdio, expand_hostlist, gpu_types_of_node,
                                     held_by_requeue, job_moved_on, node_takes_jobs, parse_gres,
                                     parse_scontrol_records, partition_nodes, requeue_refused,
                                     squeue_json_records, tres_requests)
from slurm_horus.slurm.policy import SLOWDOWN_TAILS, charged_mem_mib, declared_type_features, policy_value
from slurm_horus.sim.interference import Interference, sensitivity_at
from slurm_horus.textfile import open_for_reading

# PyTorch, TensorFlow/XLA/JAX, CUDA runtime and cuBLAS/cuDNN wording of a device allocation failure
OOM_RE = re.compile(r"CUDA out of memory|(?<!java\.lang\.)OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|"
                    r"cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
                    r"CUDNN_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED: Out of memory|"
                    r"CUDA error: out of memory|"
                    # TensorFlow's, but not its host allocator's (device:CPU, allocator cpu)
                    r"OOM when allocating tensor(?![^\n]*(?:device:CPU|allocator cpu))")
TAIL_BYTES = 256 * 1024  # the end of the error file: where a crash's last words are
RESTART_DELAY_S = 5  # an OOM rerun starts this long after its requeue (see apply)
# a job's error file that has not answered by then is on a hung mount (NFS): the pass goes on
# without it; unbounded, the pass waited until systemd's TimeoutStartSec killed it, every pass
ERROR_READ_TIMEOUT_S = 5.0


class JobMovedOn(HorusError):
    """The job to reshape is no longer pending (parse.job_moved_on): nothing was changed."""


class JobChanged(HorusError):
    """The job's request or comment changed since the pass read it: nothing was changed."""


class RequeueRefused(HorusError):
    """Slurm will not requeue the job at all: nothing was changed, nothing is left to finish."""


class ErrorFileHung(HorusError):
    """A job's error file did not answer within ERROR_READ_TIMEOUT_S: no evidence of its OOM."""

    def __init__(self, path: str):
        super().__init__(f"{path} did not answer in {ERROR_READ_TIMEOUT_S:g} s (a hung mount?): "
                         "no evidence of an OOM")
        self.path = path


@dataclass(frozen=True)
class Action:
    """One change to one job: ``kind`` is oom-requeue, pack or spread; ``tres`` its new
    TresPerNode; ``token`` what is appended to its AdminComment. ``fallback``: for a whole GPU,
    every shard of one GPU, used where Slurm will not turn a pending job's shards into a gpu
    (22.05 refuses any update between gres names; Slurm takes a job's shards from one GPU)."""

    job_id: int
    kind: str
    tres: str
    token: str
    fallback: str | None = None
    ref: str | None = None  # how scontrol names the job (an array task: A_T); default job_id
    features: str | None = None  # Features set with the reshape (and fallback): untyped shards keep the type


def _shards(tres: str | None) -> int | None:
    return next((g["count"] for g in parse_gres(tres) if g["name"] == "shard"), None)


def _whole(tres: str | None) -> bool:
    return any(g["name"] == "gpu" and g["count"] == 1 for g in parse_gres(tres))


def _gres(name: str, gtype: str | None, count: int, like: str | None = None) -> str:
    """A TresPerNode value that keeps the job's GPU type (a typeless one could land elsewhere),
    written as Slurm writes the job's own (22.05 ``gres:``, 23.02+ ``gres/``): 22.05 takes
    ``gres/gpu:...`` from scontrol update without a word and never applies it."""
    prefix = "gres:" if (like or "").startswith("gres:") else "gres/"
    item = f"{prefix}{name}:{gtype}:{count}" if gtype else f"{prefix}{name}:{count}"
    # the job's other GRES (gres:nvme:1) stay where they were: only its GPU request changes
    out: list[str] = []
    for old in (like or "").split(","):
        gres = parse_gres(old)
        if gres and gres[0]["name"] in ("gpu", "shard"):
            if item not in out:
                out.append(item)
        elif old.strip():
            out.append(old)
    return ",".join(out if item in out else [item, *out])


def shards_per_gpu(nodes: list[dict]) -> dict[str, int]:
    """{gpu type: shards of one GPU} from ``scontrol show node`` Gres (gpu:a100:4,shard:a100:400)."""
    out: dict[str, int] = {}
    for n in nodes:
        gres = parse_gres(n.get("Gres"))
        gpus = [g for g in gres if g["name"] == "gpu" and g["type"] and g["count"]]
        count = sum(g["count"] or 0 for g in gres if g["name"] == "shard")
        if len(gpus) == 1 and count:
            out.setdefault(gpus[0]["type"], count // gpus[0]["count"])
    return out


def _shard_gres(count: int | None, like: str | None) -> str | None:
    """``count`` shards as TresPerNode, untyped: scontrol shows a node's shards typed by their GPU
    (shard:a100:400) but refuses (22.05) or ignores (25.11) a request for shard:a100:N; the job's
    Features keep it on its GPU type (the hook's for a shared job, _type_features' for a pack)."""
    return _gres("shard", None, count, like) if count else None


def _whole_gpu(gtype: str | None, like: str | None,
               per_gpu: dict[str, int]) -> tuple[str, str | None]:
    """A whole GPU of the type as TresPerNode, and all of one GPU's shards as its fallback (a
    job of no type, as type_choice = any leaves one: as many as the type with the most per GPU
    has, so it holds a whole GPU of whichever type it lands on)."""
    count = per_gpu.get(gtype) if gtype else max(per_gpu.values(), default=None)
    return _gres("gpu", gtype, 1, like), _shard_gres(count, like)


def node_gpu_types(nodes: list[dict]) -> set[str]:
    """The GPU types the nodes' Gres name."""
    return {g["type"] for n in nodes for g in parse_gres(n.get("Gres")) if g["name"] == "gpu" and g["type"]}


def _gpu_type(rec: dict, types: set[str]) -> str | None:
    """The type the job is bound to: its TresPerNode's, else the hook's decision, else its
    Features when that is one of the nodes' GPU ``types`` (a user's --constraint=ib was taken
    for a type: its OOM rerun asked for gpu:ib, was refused, and ran on its old shards)."""
    typed = next((g["type"] for g in parse_gres(rec.get("TresPerNode"))
                  if g["name"] in ("gpu", "shard") and g["type"]), None)
    if typed:
        return typed
    decision = parse_decision(rec.get("AdminComment"))
    if decision and decision.gpu_type not in (None, "any"):
        return decision.gpu_type
    feat = rec.get("Features") or ""
    if feat in types:
        return feat
    # on nodes of one GPU type every GPU job is of that type (type_choice = any types none)
    return next(iter(types)) if len(types) == 1 and _asks_for_gpus(rec) else None


def _asks_for_gpus(rec: dict) -> bool:
    """The job's TresPerNode asks for GPUs or shards (a CPU job waits for no GPU)."""
    return any(g["name"] in ("gpu", "shard") and g["count"] for g in parse_gres(rec.get("TresPerNode")))


def job_ref(rec: dict) -> str:
    """How scontrol names the job: an array task as ArrayJobId_ArrayTaskId (its own id, when
    it is the array's, names the whole array to scontrol)."""
    a, t = rec.get("ArrayJobId"), rec.get("ArrayTaskId")
    return f"{a}_{t}" if a and t is not None else str(rec.get("JobId"))


def _job_id(rec: dict) -> int | None:
    try:
        return int(rec.get("JobId", ""))
    except ValueError:
        return None


# why a pending job waits for GPUs (squeue's state_reason): only these jobs are load; a held,
# dependent, future or limit-bound job waits on something no GPU frees (a user holding jobs
# had made a type look pressed, and other users' jobs packed, while its GPUs sat idle)
WAITING_FOR_RESOURCES = {"Resources", "Priority", "None", ""}


def _acts_on(rec: dict) -> bool:
    """A job the loop may change: one job (not a hetjob component, nor an array record that
    stands for tasks not split yet: an update would reach them all) in a plain state (23.02+'s
    flags: COMPLETING, REQUEUE_HOLD, SPECIAL_EXIT, ... wait for the next pass)."""
    return not (rec.get("_het") or rec.get("_tasks") or rec.get("_flags"))


def _waits_for_gpus(rec: dict) -> bool:
    return (rec.get("JobState") == "PENDING" and rec.get("Reason", "") in WAITING_FOR_RESOURCES
            and rec.get("Priority") != "0" and not rec.get("_flags"))


def _packed_by_horus(rec: dict) -> bool:
    """The hook gave the job shards from its hint, or this loop packed it: its OOM is horus's
    to recover (a raw shard request, or another partition's job, is not)."""
    decision = parse_decision(rec.get("AdminComment"))
    return bool((decision and decision.action == "shared")
                or any(t.get("action") == "pack" for t in _marks(rec)))


def oom_actions(jobs: list[dict], read_tail: Callable[[dict], str | None],
                per_gpu: dict[str, int] | None = None, types: set[str] | None = None,
                nodes: list[dict] | None = None, type_features: set[str] | None = None,
                given_up: set[int] = frozenset()) -> list[Action]:
    """OOM requeues for ``scontrol show job`` records: FAILED, held shards, fewer than a whole
    GPU's (a whole GPU is what the rerun would get), never requeued by this loop (no mark, not
    in ``given_up``: given_up_keys of the journal), one Slurm may requeue (not ``Requeue=0``,
    ``--no-requeue``, nor ``BatchFlag=0``, an salloc or srun job: scontrol refuses both), and
    the job's error output names a GPU out-of-memory error.
    ``per_gpu``: shards_per_gpu of the nodes, for the fallback; ``types``: the nodes' GPU types
    (node_gpu_types; default per_gpu's); ``nodes``: their records, for the type of a job the
    hook left untyped (_ran_on_type); ``type_features``: declared_type_features, to keep the
    fallback's untyped shards on that type (_type_features; where nothing can, they are left
    unpinned: a whole GPU of whichever type)."""
    out = []
    known = set(per_gpu or ()) if types is None else types
    for rec in jobs:
        jid = _job_id(rec)
        shards = _shards(rec.get("TresPerNode"))
        if jid is None or shards is None or rec.get("JobState") != "FAILED" \
                or not _acts_on(rec) or not _packed_by_horus(rec) \
                or rec.get("Requeue") == "0" or rec.get("BatchFlag") == "0":
            continue
        if any(t.get("action") == "oom-requeue" for t in _marks(rec)) or jid in given_up:
            continue
        gtype = _gpu_type(rec, known) or _ran_on_type(rec, nodes or [])
        whole, fallback = _whole_gpu(gtype, rec.get("TresPerNode"), per_gpu or {})
        one_gpu = _shards(fallback)
        if one_gpu is not None and shards >= one_gpu:
            continue  # a whole GPU's shards already: its rerun would get nothing more
        text = read_tail(rec)
        # anywhere in the tail: the last exception alone missed torchrun's ChildFailedError
        # after the worker's OOM, chained exceptions, [rankN]: prefixes and shutdown noise; an
        # OOM a batch-size finder caught before the job failed otherwise costs one rerun
        if text and OOM_RE.search(text):
            pin = _type_features(rec, gtype, type_features, known) if gtype else None
            out.append(Action(jid, "oom-requeue", whole,
                              f"{QUEUE_TOKEN};action=oom-requeue;from=shard:{shards}", fallback,
                              features=pin or None))
    return out


def _ran_on_type(rec: dict, nodes: list[dict]) -> str | None:
    """The one GPU type of the nodes the job last ran on (NodeList): where the OOM of a job the
    hook left untyped happened, and what its rerun is kept on (a whole T4's shards after an
    A100's had run out again, marked, never to be recovered)."""
    try:
        names = set(expand_hostlist(rec.get("NodeList") or ""))
    except HorusError:
        return None
    found = {t for n in nodes if n.get("NodeName") in names for t in gpu_types_of_node(n)}
    return found.pop() if len(found) == 1 else None


def _node_type_free(nodes: list[dict]) -> dict[str, int]:
    """{gpu type: GPUs with nothing allocated on them} over nodes that can run jobs."""
    free: dict[str, int] = {}
    for n in nodes:
        if not node_takes_jobs(n.get("State")):
            continue
        total = {g["type"]: g["count"] for g in parse_gres(n.get("Gres")) if g["name"] == "gpu"}
        used = parse_gres(n.get("GresUsed"))
        one_type = len([t for t in total if t]) == 1
        # on a node of several types, what is untyped (shard:400 in gres.conf) may be any
        # type's: busy for each
        untyped = [g for g in used if g["type"] is None and not one_type and g["name"] in ("gpu", "shard")]
        anyone = max(sum(g["count"] or 0 for g in untyped if g["name"] == "gpu"),
                     len({i for g in untyped for i in (g["idx"] or ())}))
        for t, c in total.items():
            if not (t and c):
                continue
            # per type: a node's busy T4s made its idle A100s count as busy
            mine = [g for g in used if g["type"] == t or (g["type"] is None and one_type)]
            gpu_idx = {i for g in mine if g["name"] == "gpu" for i in (g["idx"] or ())}
            shard_idx = {i for g in mine if g["name"] == "shard" for i in (g["idx"] or ())}
            whole = max(sum(g["count"] or 0 for g in mine if g["name"] == "gpu"), len(gpu_idx))
            # shards' positions count the type's GPUs, whole GPUs' IDX the node's: one numbering
            # on a node of one type; on one of several, a GPU is either whole or in shards
            busy = (max(whole, len(gpu_idx | shard_idx)) if one_type
                    else min(c, whole + len(shard_idx) + anyone))
            free[t] = free.get(t, 0) + max(0, c - busy)
    return free


def _waiting(recs: list[dict]) -> int:
    """How many jobs ``recs`` stand for: an array record not split yet, for its tasks."""
    return sum(array_task_count(r["_tasks"]) if r.get("_tasks") else 1 for r in recs)


def _pending_by_type(jobs: list[dict], nodes: list[dict], by_partition: bool = True
                     ) -> tuple[dict[tuple, list[dict]], dict[tuple, int], dict[tuple, int]]:
    """Pending jobs that wait for GPUs (_waits_for_gpus), per pool of GPUs they compete for,
    (node names, GPU type), in submission order (an array's tasks not split yet in one record:
    _waiting counts them); per pool how many jobs the hook left without a type (``type=any``)
    wait there: each takes whichever type its partition has frees first, so it is load on each
    (the loop leaves it as is); and per pool its idle GPUs (_node_type_free).  A plain
    --gres=gpu:1 on nodes of several types is typed by no one: no load, as before.  A pool is
    the nodes of the waiting jobs' partitions that share a node (a scavenger partition over a
    lab's nodes joins them): idle GPUs of a partition no job of the pool can use are none of
    its (summed over the cluster, they had kept a full partition's jobs whole and spread packed
    ones back), and overlapping partitions counted apart had each taken the shared idle GPUs
    as their own.  ``by_partition`` False: one pool per type over every node (the hook's view)."""
    types = node_gpu_types(nodes)  # of every node: a drained type is still a type
    waiting = [rec for rec in jobs if _waits_for_gpus(rec)]
    of_partition: dict[str, list[dict]] = {}
    types_of: dict[str, set[str]] = {}

    def nodes_of(partition: str) -> list[dict]:
        """The nodes of a job's partitions (a comma list: their union; every node where the
        records name none)."""
        if partition not in of_partition:
            of_partition[partition] = (partition_nodes(nodes, partition) if partition.strip(",") else []) or nodes
        return of_partition[partition]

    def pool_partition(rec: dict) -> str:
        return (rec.get("Partition") or "") if by_partition else ""

    named = {pool_partition(rec): frozenset(n.get("NodeName") or "" for n in nodes_of(pool_partition(rec)))
             for rec in waiting}
    # pools: the unions of those sets that share a node
    pools: list[frozenset[str]] = []
    for names in set(named.values()):
        joined = [p for p in pools if p & names]
        pools = [p for p in pools if not p & names] + [frozenset().union(names, *joined)]
    pool_of = {partition: tuple(sorted(next(p for p in pools if names <= p)))
               for partition, names in named.items()}
    free: dict[tuple, int] = {}
    for key in set(pool_of.values()) | {tuple(sorted(n.get("NodeName") or "" for n in nodes))}:
        members = set(key)
        free.update({(key, t): c for t, c in
                     _node_type_free([n for n in nodes if (n.get("NodeName") or "") in members]).items()})
    pending: dict[tuple, list[dict]] = {}
    untyped: dict[tuple, int] = {}
    for rec in waiting:
        key = pool_of[pool_partition(rec)]
        gtype = _gpu_type(rec, types)
        if (key, gtype) in free:
            pending.setdefault((key, gtype), []).append(rec)
        elif gtype is None and _left_untyped(rec) and _asks_for_gpus(rec):
            own = rec.get("Partition") or ""  # its types, in the hook's view too
            if own not in types_of:
                types_of[own] = node_gpu_types(nodes_of(own))
            for t in types_of[own]:
                if (key, t) in free:
                    untyped[key, t] = untyped.get((key, t), 0) + _waiting([rec])
    for recs in pending.values():
        recs.sort(key=_submitted)
    return pending, untyped, free


def _left_untyped(rec: dict) -> bool:
    """The hook's decision left the job free to take any type (type_choice = any)."""
    decision = parse_decision(rec.get("AdminComment"))
    return bool(decision and decision.gpu_type == "any" and decision.action in ("shared", "exclusive"))


def pressure_types(jobs: list[dict], nodes: list[dict]) -> list[str]:
    """GPU types where a job submitted now would find no idle GPU the pending jobs leave: as
    many jobs pending for them as their GPUs idle, or more (the hook's view of pressure: the
    new job counts itself, as a pending job does in pressure_actions)."""
    pending, untyped, free = _pending_by_type(jobs, nodes, by_partition=False)
    return sorted(k[1] for k in free if _waiting(pending.get(k, [])) + untyped.get(k, 0) + 1 > free[k])


def pack_util_limit(bound: float, group: int, itf: Interference | None = None,
                    tail: str = "median") -> float:
    """The highest predicted utilization (%) at which a job may take shards under queue
    pressure and the admin's slowdown ``bound`` still holds for the ``tail`` job of the worst
    group Slurm may then put it in (the median, or a quantile of the sensitivity spread:
    p95 keeps 95 % of that group's jobs within it): ``group`` jobs packed alike, its partners
    at 100 % each (Slurm places by shards, so the partners are unknown at submission), on the
    measured co-location curve (the simulator's).  100: any job; 0: none."""
    itf = itf or Interference()
    q = SLOWDOWN_TAILS[tail]
    sens = 1.0 if q is None else sensitivity_at(q)
    if group <= 1:
        return 100.0
    base = 100.0 * (group - 1)
    if itf.speed(base + 100.0, group, sens) >= 1.0 / bound:
        return 100.0
    return max(0.0, itf.sum_limit(bound, group, sens) - base)


def policy_util_limit(pack_shards: int | None = None, policy_path: str | None = None) -> float:
    """pack_util_limit for the policy's ``slowdown_bound`` (default 2.0) and ``slowdown_tail``
    (default median), its groups being as many jobs as ``pack_shards`` (default: the policy's
    ``pressure_shards``, 50) fit in its ``shards_per_gpu``: how far the hook and this loop pack
    under pressure."""
    shards = int(policy_value("shards_per_gpu", "100", path=policy_path))
    ps = int(policy_value("pressure_shards", "50", path=policy_path))
    if pack_shards is not None:
        ps = min(ps, pack_shards)
    bound = float(policy_value("slowdown_bound", "2", path=policy_path))
    tail = policy_value("slowdown_tail", "median", path=policy_path)
    return pack_util_limit(bound, shards // ps, tail=tail)


def write_pressure(path: str | os.PathLike, types, now: float | None = None,
                   util_limit_pct: float = 100.0) -> None:
    """The pressure file the hook reads (policy ``pressure_file``): ``written <unix time>``,
    ``util_limit_milli <n>`` (policy_util_limit, in 1/1000 %), then ``pressure <type>`` per
    type; whole or not at all (written beside, then renamed), readable by slurmctld, writable
    only by its owner (root)."""
    from slurm_horus.ledger.publish import write_atomically

    text = f"written {int(time.time() if now is None else now)}\n" + \
        f"util_limit_milli {int(util_limit_pct * 1000)}\n" + \
        "".join(f"pressure {t}\n" for t in types)
    write_atomically(path, text)


def signal_pressure(jobs: list[dict], nodes: list[dict], policy_path: str | None = None,
                    util_limit_pct: float | None = None) -> None:
    """Tell the hook which GPU types are under pressure now, and how far it may pack there, in
    the policy's ``pressure_file`` (nothing when the policy sets none)."""
    where = policy_value("pressure_file", path=policy_path)
    if where:
        if util_limit_pct is None:
            util_limit_pct = policy_util_limit(policy_path=policy_path)
        try:
            write_pressure(where, pressure_types(jobs, nodes), util_limit_pct=util_limit_pct)
        except OSError as e:
            raise HorusError(f"pressure file {where}: {e.strerror or e}") from None


def _type_features(rec: dict, gtype: str, declared: set[str] | None, types: set[str]) -> str | None | bool:
    """The Features that keep a job packed into untyped shards on its GPU type: its own where
    they name it, else them and the type's node feature (policy ``type_features``, as the hook
    pins shared jobs); None where the nodes have one GPU type (nothing to pin); False where
    nothing can pin it (the type's feature not declared, a constraint too complex to extend).
    A pack had dropped the type of ``gpu:a100:1``: the job could start on a T4's shards, costed
    for an A100's memory."""
    feats = rec.get("Features") or ""
    feats = "" if feats == "null" else feats
    if gtype in re.split(r"[&,]", feats):
        return feats
    if types <= {gtype}:
        return None
    if declared is None or gtype not in declared or not re.fullmatch(r"[\w.&-]*", feats):
        return False
    feats = feats.rstrip("&")  # Slurm takes a trailing "&" ("ib&" is ib) but refuses "&&"
    return f"{feats}&{gtype}" if feats else gtype


def pressure_actions(jobs: list[dict], nodes: list[dict], pack_shards: int,
                     mem_shards: Callable[[dict, str], int | None], min_wait_s: float,
                     now: float, util_limit_pct: float = 100.0,
                     type_features: set[str] | None = None, pack: bool = True) -> list[Action]:
    """Pack or spread pending jobs by queue pressure, per GPU type (the job's Features, which
    the hook sets to the chosen type): with more jobs pending than GPUs idle, as many as the idle
    GPUs leave without one are packed, the longest-waiting first, each only after waiting
    ``min_wait_s``, into ``pack_shards`` shards or its memory's share of the GPU when that is
    more (``mem_shards(job, type)``: hint_mem_shards; _pack_size), when its hinted utilization
    is within ``util_limit_pct`` (the slowdown bound's:
    policy_util_limit); with as many idle GPUs as pending jobs, the jobs packed are spread back,
    as is a job packed that no longer waits for GPUs (held, say).  ``pack``: False where Slurm
    refuses every pack (reshapes_gpu_to_shards): spreads only."""
    per_gpu = shards_per_gpu(nodes)
    types = node_gpu_types(nodes)
    out = []
    for rec in jobs:  # held (or waiting on something else) after this loop packed it
        toks = _marks(rec)
        tres, gtype = rec.get("TresPerNode"), _gpu_type(rec, types)
        if (rec.get("JobState") == "PENDING" and not _waits_for_gpus(rec) and _acts_on(rec)
                and _still_packed(toks, tres) and _job_id(rec) is not None and gtype):
            # the pressure that packed it is no reason to keep a job that waits for no GPU on
            # shards: its own request back
            out.append(_spread(_job_id(rec), gtype, tres, per_gpu))
    pending, untyped, free = _pending_by_type(jobs, nodes)
    for (pool, gtype), recs in pending.items():
        # pending jobs the idle GPUs of their partitions leave without one
        short = _waiting(recs) + untyped.get((pool, gtype), 0) - free[pool, gtype]
        to_pack = short
        for rec in recs:
            jid = _job_id(rec)
            toks = _marks(rec)
            last = toks[-1].get("action") if toks else None
            tres = rec.get("TresPerNode")
            if jid is None or any(t.get("action") == "oom-requeue" for t in toks) or not _acts_on(rec):
                continue  # an OOM survivor keeps its whole GPU
            size = None
            if (pack and to_pack > 0 and _whole(tres) and last != "pack" and _hinted_exclusive(rec)
                    and now - _submitted(rec) >= min_wait_s
                    and (util_limit_pct >= 100.0 or _hint_util(rec, gtype) <= util_limit_pct)):
                size = _pack_size(mem_shards(rec, gtype), pack_shards, per_gpu.get(gtype, 100))
            pin = _type_features(rec, gtype, type_features, types) if size is not None else False
            if size is not None and pin is not False:
                to_pack -= 1
                out.append(Action(jid, "pack", _shard_gres(size, tres),
                                  f"{QUEUE_TOKEN};action=pack;from=gpu:1", features=pin))
            elif short <= 0 and _still_packed(toks, tres):
                out.append(_spread(jid, gtype, tres, per_gpu))
            elif short <= 0 and last is None:
                hook = _hook_pressed(rec)
                if hook and hook.unpressed_whole:
                    out.append(_spread(jid, gtype, tres, per_gpu))
                elif hook:  # its own count back, kept on its type as the hook kept it
                    pin = _type_features(rec, gtype, type_features, types)
                    if pin is not False:
                        out.append(_spread(jid, gtype, tres, per_gpu, hook.unpressed_shards, pin))
    return out


def _still_packed(toks: list[dict[str, str]], tres: str | None) -> bool:
    """The job's last queue mark is this loop's pack and it still asks for the shards that pack
    gave it (``to=shard:N``; a mark that names none says nothing): shards another admin set
    since are theirs, and a spread had given the job a whole GPU over them."""
    shards = _shards(tres)
    if shards is None or not toks or toks[-1].get("action") != "pack":
        return False
    to = re.search(r"\bshard:(\d+)", toks[-1].get("to") or "")
    return to is None or int(to.group(1)) == shards


def reshapes_gpu_to_shards(version: str) -> bool:
    """Whether Slurm ``version`` turns a pending job's gpu request into shards: 23.02+ does;
    22.05 refuses every such update ("Invalid generic resource"), so a pack there only failed
    the pass, every pass under pressure (its shards-to-shards spreads work, and a whole GPU
    falls back to one GPU's shards)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (23, 2)


def _spread(jid: int, gtype: str, tres: str | None, per_gpu: dict[str, int],
            shards: int | None = None, features: str | None = None) -> Action:
    """Give a job its whole GPU (of its type) back, or the ``shards`` the hook would have given
    it without queue pressure (with the ``features`` that keep it on its type)."""
    token = f"{QUEUE_TOKEN};action=spread;from=shard:{_shards(tres)}"
    if shards is not None:
        return Action(jid, "spread", _shard_gres(shards, tres), token, features=features)
    whole, fallback = _whole_gpu(gtype, tres, per_gpu)
    return Action(jid, "spread", whole, token, fallback)


def _pack_size(mem_shards: int | None, pack_shards: int, per_gpu: int) -> int | None:
    """The shards a job packed under pressure asks for: ``pack_shards``, or its memory's share
    when that is more (a partner that fits beside it is small: better than waiting for a whole
    GPU), as the hook does at submission; None when only a whole GPU holds its memory (or its
    memory is unknown)."""
    if mem_shards is None or mem_shards >= per_gpu:
        return None
    return max(min(pack_shards, per_gpu), mem_shards)


def _hint_util(rec: dict, gtype: str) -> float:
    """The job's hinted utilization (%) on ``gtype``; +inf without one (never packed)."""
    fields = (parse_hint(rec.get("Comment")) or {}).get(gtype)
    return float(fields[0]) if fields else float("inf")


def _hook_pressed(rec: dict) -> HookDecision | None:
    """The hook's decision where it shared the job at submission only because this loop saw its
    type under pressure, and the job still asks for those shards: its token says what it would
    have had without (unpressed), a whole GPU or more shards.  None for an older hook's token,
    which does not say: a shared job it capped had been spread to a whole GPU it was never
    given, and a job left as it is stays valid."""
    decision = parse_decision(rec.get("AdminComment"))
    if (decision and decision.action == "shared" and decision.reason == "pressure"
            and (decision.unpressed_whole or decision.unpressed_shards)
            and decision.shards == _shards(rec.get("TresPerNode"))):
        return decision
    return None


def _hinted_exclusive(rec: dict) -> bool:
    """The hook kept a whole GPU for the job's predicted utilization (not a raw request, not a
    memory refusal, not a user on the under-claim record): its decision token says so."""
    decision = parse_decision(rec.get("AdminComment"))
    return bool(decision and decision.action == "exclusive" and decision.reason == "util")


def stdio_paths(job_id: str, version: str | None) -> dict[str, str]:
    """The job's StdErr and StdOut as Slurm (``version``; None: unknown) expands them
    (``scontrol show job``: squeue's JSON has them unexpanded). A user can forge these lines,
    but only for a file they can read: read_error_tail opens it with the rights of the owner
    squeue names."""
    try:
        recs = parse_scontrol_records(run(["scontrol", "show", "job", str(job_id)]))
    except HorusError:
        return {}  # gone meanwhile: nothing to read
    rec = recs[0] if recs and recs[0].get("JobId") == str(job_id) else {}
    out = {k: rec[k] for k in ("StdErr", "StdOut") if rec.get(k)}
    if version is None or not version.startswith("22."):
        return out  # later scontrols expand every pattern themselves (25.11: checked)
    host = None
    if any(re.search(r"%\d*N", v) for v in out.values()) and rec.get("BatchHost"):
        try:  # %N is the batch host's hostname, which 22.05's scontrol leaves unexpanded
            nodes = parse_scontrol_records(run(["scontrol", "show", "node", rec["BatchHost"]]))
            host = nodes[0].get("NodeHostName") if nodes else None
        except HorusError:
            host = None
    fields = {"N": host, "j": rec.get("JobId"), "A": rec.get("ArrayJobId"), "a": rec.get("ArrayTaskId"),
              "u": (rec.get("UserId") or "").split("(")[0] or None, "x": rec.get("JobName")}
    expanded = {k: expand_batch_stdio(v, fields) for k, v in out.items()}
    return {k: v for k, v in expanded.items() if v}


def read_error_tail(rec: dict) -> str | None:
    """The last TAIL_BYTES of the job's StdErr (else StdOut), opened only if its owner could
    (``UserId`` from squeue_json_records: the owner Slurm knows), and only if written since the
    job's last run started (``_start``, squeue's StartTime): an earlier run's text (before a
    requeue, --open-mode=append, a file another job shares) is no evidence of this run's OOM.
    What the file says is still the user's to write (the mtime assumes clocks in step).
    Raises ErrorFileHung where a file does not answer in ERROR_READ_TIMEOUT_S."""
    uid, gids = owner_ids((rec.get("UserId") or "").split("(")[0])
    start = rec.get("_start")
    if uid is None or not isinstance(start, (int, float)):
        return None
    for key in ("StdErr", "StdOut"):
        path = rec.get(key) or ""
        if not path:
            continue  # nothing to open: no child to fork
        try:
            found = _in_child(lambda: _tail_since(path, uid, gids, start), ERROR_READ_TIMEOUT_S)
        except TimeoutError:
            raise ErrorFileHung(path) from None
        if found is not None:
            return found.decode("utf-8", "replace")
    return None


def _tail_since(path: str, uid: int, gids: set[int], start: float) -> bytes | None:
    """The file's last TAIL_BYTES, if its owner ``uid`` may open it and it was written since
    ``start``; else None."""
    fd = open_as_owner(path, uid, gids)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if st.st_mtime < start:
            return None
        os.lseek(fd, max(0, st.st_size - TAIL_BYTES), os.SEEK_SET)
        return os.read(fd, TAIL_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def _in_child(read: Callable[[], bytes | None], timeout_s: float) -> bytes | None:
    """``read()`` in a forked child (proc_child.run_in_child), None where it found nothing;
    TimeoutError, the child killed, where it has not finished in ``timeout_s``.  A child, not a
    thread: as root, open_as_owner sets the effective uid, which glibc sets for every thread of
    the process, so a thread stuck in the kernel on a hung mount had left the whole pass acting
    as the job's owner (and, stuck unkillable, kept the process from exiting).  The child keeps
    none of the pass's files: the lock's flock had outlived the pass in a child stuck on the
    mount, and every later pass skipped."""
    def produce() -> bytes | None:
        data = read()
        return None if data is None else b"+" + data  # "+": found, even when empty
    data, _ = run_in_child(produce, timeout_s, keep_fds={0, 1, 2})
    return data[1:] if data else None


def _submitted(rec: dict) -> float:
    """When the job was submitted (epoch seconds): squeue's number, else scontrol's local ISO
    time; +inf (never old enough) when unreadable."""
    if isinstance(rec.get("_submit"), (int, float)):
        return float(rec["_submit"])
    try:
        return time.mktime(time.strptime(rec.get("SubmitTime") or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return float("inf")


# pack and spread marks kept in a job's AdminComment, the newest (its OOM requeue mark always):
# a queue that swings every pass grew it by ~50 characters a pass, past what one scontrol
# argument holds within two days
MAX_QUEUE_MARKS = 8
_SWING_RE = re.compile(rf"{re.escape(QUEUE_TOKEN)};action=(?:pack|spread)\S*")


def marked(admin_comment: str | None, token: str) -> str:
    """AdminComment with ``token`` appended after a space: the hook's decision token must stay a
    word of its own for ``parse_decision`` (Slurm keeps the whole text: 5,000 characters
    were kept on 22.05 and 25.11; a cut would lose that token first).  The oldest pack and
    spread marks go beyond MAX_QUEUE_MARKS."""
    words = (admin_comment or "").split(" ")
    swings = [i for i, w in enumerate(words) if _SWING_RE.fullmatch(w)]
    drop = set(swings[:max(0, len(swings) - (MAX_QUEUE_MARKS - 1))])
    text = " ".join(w for i, w in enumerate(words) if i not in drop)
    return f"{text} {token}" if text else token


def _gpu_request(tres: str | None) -> str:
    """The job's GPU request as the marks name it (``gpu:1``, ``shard:50``); its other GRES,
    whose commas no mark may hold, left out."""
    return next((f"{g['name']}:{g['count']}" for g in parse_gres(tres) if g["name"] in ("gpu", "shard")), "")


def _intent(action: Action) -> str:
    """The mark a pack or spread writes before its reshape: the action's as ``intent=``, with
    what the reshape may give (``to``, else the fallback's ``or``); _settled reads it."""
    token = action.token.replace(";action=", ";intent=", 1) + f";to={_gpu_request(action.tres)}"
    return token + (f";or={_gpu_request(action.fallback)}" if action.fallback else "")


_INTENT_RE = re.compile(rf"{re.escape(QUEUE_TOKEN)};intent=\S*")


def _settled(admin_comment: str | None, tres: str | None) -> str:
    """AdminComment with each intent mark (_intent) settled by what the job asks for now: the
    action's mark where it holds what the reshape gives (a pass stopped between the reshape and
    the mark), else dropped (the reshape never took, or someone changed the job since: nothing
    of this loop's to undo).  hacct and sync read no intent: it is no action (yet)."""
    words = []
    for word in (admin_comment or "").split(" "):
        if not _INTENT_RE.fullmatch(word):
            words.append(word)
            continue
        intent = queue_tokens(word)[0]
        if _gpu_request(tres) in (intent.get("to"), intent.get("or")):
            words.append(f"{QUEUE_TOKEN};action={intent['intent']};from={intent.get('from', '')};"
                         f"to={_short(tres or '')}")
    return " ".join(words)


def _marks(rec: dict) -> list[dict[str, str]]:
    """The job's queue marks, its intent marks settled (_settled)."""
    return queue_tokens(_settled(rec.get("AdminComment"), rec.get("TresPerNode")))


def settle_intents(jobs: list[dict], on_error: Callable[[str], None] | None = None) -> bool:
    """Write the settled AdminComment (_settled) of each job with an intent mark that Slurm
    still takes an update of (pending or running), so that sync and hacct see the action a
    stopped pass took; -> whether any job changed."""
    changed = False
    for rec in jobs:
        text = rec.get("AdminComment") or ""
        settled = _settled(text, rec.get("TresPerNode"))
        if settled == text or rec.get("JobState") not in ("PENDING", "RUNNING"):
            continue
        try:
            run(["scontrol", "update", f"JobId={job_ref(rec)}", f"AdminComment={settled}"])
            changed = True
        except HorusError as e:
            if on_error:
                on_error(f"job {rec.get('JobId')}: its intent mark not settled: {e}")
    return changed


def _job_now(job_id: int) -> dict | None:
    """The job's squeue record as it is now (``job_id``: its own id; an array task's record in
    squeue's JSON has its own, not ArrayJobId_TaskId); None once Slurm has forgotten it."""
    try:
        text = run(["squeue", "--json", "--all", "--states=all", "--jobs", str(job_id)])
    except HorusError as e:
        # 23.02+ applies --jobs and fails on a purged job ("slurm_load_jobs error: Invalid
        # job id specified", 25.11): a job gone, not a failed pass
        if job_moved_on(str(e)):
            return None
        raise
    recs = squeue_json_records(text, job_id)
    return recs[0] if recs else None


def _requests(job_id: int, name: str, count: int) -> bool:
    """Whether Slurm now holds the job to ``count`` of gres ``name`` (its TRES, not the
    TresPerNode text, which 22.05 changes without applying; the count too: a job given more
    shards asked for gres/shard before as well)."""
    rec = _job_now(job_id) or {}
    return tres_requests(rec.get("ReqTRES") or rec.get("TRES"), name, count)


def reshape(jid: str, tres: str, fallback: str | None, job_id: int | None = None,
            features: str | None = None) -> str:
    """Set the job's TresPerNode to ``tres`` (and its Features to ``features`` in the same
    update), else to ``fallback`` (with them too: its untyped shards stay on the type) where
    Slurm refuses or ignores the change; -> what it holds now. Raises HorusError when neither
    takes.  ``jid``: how scontrol names it; ``job_id``: its own id (default ``jid``)."""
    gres = next(g for g in parse_gres(tres) if g["name"] in ("gpu", "shard"))
    pin = [f"Features={features}"] if features else []
    try:
        run(["scontrol", "update", f"JobId={jid}", f"TresPerNode={tres}", *pin])
        if _requests(job_id if job_id is not None else int(jid), gres["name"], gres["count"]):
            return tres
    except HorusError:
        if fallback is None:
            raise
    if fallback is None:
        raise HorusError(f"job {jid}: Slurm did not apply TresPerNode={tres}")
    run(["scontrol", "update", f"JobId={jid}", f"TresPerNode={fallback}", *pin])
    return fallback


@contextmanager
def _signals_held():
    """SIGTERM, SIGINT and SIGHUP wait until the body is done (systemd's stop, a timeout): a
    loop stopped between requeuehold and release left the job held for good, one stopped
    between a reshape and its mark left it reshaped and unmarked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    # Python's handlers, not the thread's mask: the kernel gives a process's signal to any
    # thread that does not block it, and Python then runs the handler on the main thread
    old = {s: signal.signal(s, lambda n, _f: got.append(n))
           for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for n in dict.fromkeys(got):
            signal.raise_signal(n)  # now, to the handler the loop had


# what a pack or spread is computed from: a user's update since the pass read them is kept (not
# the node count squeue shows a pending job: Slurm's own estimate, which changes untouched)
_SEEN_FIELDS = ("TresPerNode", "Features", "AdminComment")


def _unchanged(job_id: int, seen: dict) -> None:
    """Raise JobMovedOn or JobChanged unless the job still pends as the pass ``seen`` it: an
    update computed from a stale read had overwritten a user's change of its GRES or its
    constraint (and an admin's comment)."""
    now = _job_now(job_id)
    if now is None or now.get("JobState") != "PENDING":
        raise JobMovedOn(f"job {job_id}: no longer pending")
    changed = [k for k in _SEEN_FIELDS if (now.get(k) or "") != (seen.get(k) or "")]
    if changed:
        raise JobChanged(f"job {job_id}: {', '.join(changed)} changed since this pass read it: left as it is")


def apply(action: Action, admin_comment: str | None, old_tres: str | None = None,
          old_features: str | None = None, journal: str | None = None, seen: dict | None = None) -> str:
    """Carry one action out with scontrol; -> the TresPerNode the job got. An OOM requeue
    holds the job while it is reshaped, so it never starts again on its old shards unless
    Slurm refuses every reshape and every mark for GIVE_UP_S (finish_requeue); it is requeued
    at most once.
    A pack or spread whose mark cannot be written is undone (``old_tres``): unmarked, no later
    pass would undo it; one of a job no longer as the pass read it (``seen``: its record then)
    is not done.  Signals that stop the loop wait until the action is whole."""
    with _signals_held():
        return _apply(action, admin_comment, old_tres, old_features, journal, seen)


def _apply(action: Action, admin_comment: str | None, old_tres: str | None,
           old_features: str | None, journal: str | None, seen: dict | None) -> str:
    jid = action.ref or str(action.job_id)
    if action.kind != "oom-requeue":

        def put_back() -> None:  # the old request, then the old comment (no-ops where none changed)
            if old_tres:
                run(["scontrol", "update", f"JobId={jid}", f"TresPerNode={old_tres}",
                     *([f"Features={old_features or ''}"] if action.features else [])])
            run(["scontrol", "update", f"JobId={jid}", f"AdminComment={admin_comment or ''}"])

        if seen is not None:
            _unchanged(action.job_id, seen)
        try:
            # the intent first: a pass killed between the reshape and its mark (SIGKILL, power
            # loss) had left the job reshaped and unmarked, never spread back; the next pass
            # settles an intent by what the job then asks for (settle_intents)
            run(["scontrol", "update", f"JobId={jid}",
                 f"AdminComment={marked(admin_comment, _intent(action))}"])
            got = reshape(jid, action.tres, action.fallback, action.job_id, action.features)
        except HorusError as e:
            # an update or its check failed, maybe after Slurm applied it: the old request is
            # put back (where that fails too, the intent stays for the next pass to settle)
            try:
                put_back()
            except HorusError:
                pass
            if job_moved_on(str(e)):
                raise JobMovedOn(str(e)) from None
            raise
        try:
            run(["scontrol", "update", f"JobId={jid}",
                 f"AdminComment={marked(admin_comment, action.token + ';to=' + _short(got))}"])
        except HorusError:
            put_back()
            raise
        return got
    # journaled first: a requeuehold that times out after Slurm acted, or a release that
    # fails, left the job held for good; the next pass finishes what is journaled (finish_requeue)
    journal_set(journal, jid, {"job_id": action.job_id, "tres": action.tres, "token": action.token,
                               "fallback": action.fallback, "features": action.features,
                               "admin": admin_comment or "", "at": time.time()})
    try:
        run(["scontrol", "requeuehold", jid])
    except HorusError as e:
        if not requeue_refused(str(e)):
            raise  # maybe after Slurm acted: the journal lets the next pass finish it
        journal_set(journal, jid, None)  # final: nothing for heal to finish, nor to retry
        raise RequeueRefused(f"job {jid}: Slurm refuses to requeue it ({e}): left as it is") from None
    return finish_requeue(jid, action, admin_comment, journal)


def finish_requeue(jid: str, action: Action, admin_comment: str | None, journal: str | None,
                   give_up: bool = False) -> str:
    """The rest of an OOM requeue, on a job held by requeuehold: marked (Slurm takes no update of
    a finished job, so not before the requeue), reshaped to a whole GPU, restarted a moment
    later, released, and dropped from the journal.  The mark is the commit: a job whose mark
    Slurm does not take stays held and journaled for the next pass (released unmarked, on a
    whole GPU or not, its next OOM was requeued again) unless ``give_up`` (journaled GIVE_UP_S
    ago); then it is released anyway and its journal entry kept as given up (given_up_keys)
    until it leaves the queue."""
    try:
        run(["scontrol", "update", f"JobId={jid}", f"AdminComment={marked(admin_comment, action.token)}"])
        is_marked = True
    except HorusError as e:
        if not give_up:
            raise HorusError(f"job {jid}: held for its OOM rerun, but Slurm did not take its mark "
                             f"({e}); the next pass tries again") from None
        is_marked = False
    try:
        got = reshape(jid, action.tres, action.fallback, action.job_id, action.features)
    except HorusError:
        got = None
    try:
        if is_marked:
            to = _short(got) if got else "unchanged"
            run(["scontrol", "update", f"JobId={jid}",
                 f"AdminComment={marked(admin_comment, action.token + ';to=' + to)}"])
        # no requeue back-off (the job waited once already), but not at once either: a rerun
        # whose credential is made in the second slurmd revoked the last run's is killed
        # ("Job credential revoked")
        run(["scontrol", "update", f"JobId={jid}", f"StartTime=now+{RESTART_DELAY_S}"])
    except HorusError:
        pass  # the mark already says it was requeued; a start at once only risks that kill
    run(["scontrol", "release", jid])  # a failure keeps it journaled: the next pass releases it
    journal_set(journal, jid, None if is_marked else {
        "job_id": action.job_id, "tres": got or "", "token": action.token,
        "given_up": True, "at": time.time()})
    if not is_marked:
        raise HorusError(f"job {jid}: released unmarked after {GIVE_UP_S} s held for its OOM rerun "
                         f"({'on ' + _short(got) if got else 'on its old shards'}); the journal keeps "
                         "it from a second requeue")
    if got is None:
        raise HorusError(f"job {jid}: requeued, but Slurm kept its shards")
    return got


GIVE_UP_S = 600  # a journaled requeue Slurm will not finish is released after this long anyway


def journal_read(path: str | None) -> dict:
    """The OOM requeues begun and not finished, those given up on (``given_up``), and the jobs
    whose error file hung a pass (``hung``: its path; ``start``: the run it was of), as
    {job ref: entry}; {} without one.  Root's own regular file, read without following a link."""
    if not path:
        return {}
    try:
        with open_for_reading(path, follow_symlinks=False, regular_only=True) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_size > 16 << 20:
                raise HorusError(f"requeue journal {path}: not this user's regular file: remove it")
            data = json.loads(f.read(st.st_size + 1) or b"{}")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise HorusError(f"requeue journal {path}: {e.strerror or e}") from None
    except ValueError:
        raise HorusError(f"requeue journal {path}: corrupt: check the jobs it names, then remove it") from None
    ok = isinstance(data, dict) and all(
        isinstance(e, dict) and isinstance(e.get("job_id"), int) and isinstance(e.get("at"), (int, float))
        and (isinstance(e.get("hung"), str) or isinstance(e.get("tres"), str) and isinstance(e.get("token"), str))
        for e in data.values())
    if not ok:
        raise HorusError(f"requeue journal {path}: corrupt: check the jobs it names, then remove it")
    return data


def journal_set(path: str | None, ref: str, entry: dict | None) -> None:
    """Add (or, with None, drop) a job's entry, replacing the file atomically (0600)."""
    from slurm_horus.ledger.publish import write_atomically

    if not path:
        return
    data = journal_read(path)
    if entry is None and ref not in data:
        return
    if entry is None:
        data.pop(ref)
    else:
        data[ref] = entry
    try:
        write_atomically(path, json.dumps(data), mode=0o600)
    except OSError as e:  # a full disk: the requeue is not begun (or stays journaled)
        raise HorusError(f"requeue journal {path}: {e.strerror or e}") from None


def given_up_keys(journal: str | None) -> set[int]:
    """The ids of the jobs released unmarked (finish_requeue's give_up, or by someone else while
    held: heal): never to be requeued again (oom_actions) while they are in the queue (heal
    drops them after, so a later job of a reused id is not one); none where the journal cannot
    be read (heal has said so; a dry run by another user).  By id alone: Slurm gives a requeued
    job a new SubmitTime, and a node failure's requeue had made it another job."""
    try:
        entries = journal_read(journal)
    except HorusError:
        return set()
    return {e["job_id"] for e in entries.values() if e.get("given_up")}


def _hung_reads(journal: str | None) -> dict[int, float]:
    """{job id: the run start} of the jobs whose error file hung a pass (_tail_reader); none where
    the journal cannot be read (as given_up_keys)."""
    try:
        entries = journal_read(journal)
    except HorusError:
        return {}
    return {e["job_id"]: e.get("start") for e in entries.values() if "hung" in e}


def _tail_reader(journal: str | None, version: str | None, dry_run: bool,
                 on_error: Callable[[str], None] | None) -> Callable[[dict], str | None]:
    """oom_actions' ``read_tail``: read_error_tail, except of a run whose file hung a pass
    already (no evidence; a second wait on the same mount had cost every pass its timeout);
    a file that hangs now is said and journaled (not on a dry run) until the job leaves the
    queue (heal)."""
    hung = _hung_reads(journal)

    def read_tail(rec: dict) -> str | None:
        jid = _job_id(rec)
        if jid in hung and hung[jid] == rec.get("_start"):
            return None
        try:
            return read_error_tail({**rec, **stdio_paths(rec["JobId"], version)})
        except ErrorFileHung as e:
            said = f"oom-requeue job {jid}: {e}"
            if not dry_run and journal:
                try:
                    journal_set(journal, job_ref(rec), {"job_id": jid, "hung": e.path,
                                                        "start": rec.get("_start"), "at": time.time()})
                    said += "; not read again while the job is in the queue"
                except HorusError as err:
                    said += f"; {err}"
            if on_error:
                on_error(said)
            return None
    return read_tail


def heal(journal: str | None, jobs: list[dict], on_error: Callable[[str], None] | None = None,
         on_action: Callable[[Action], None] | None = None) -> list[Action]:
    """Finish the journaled OOM requeues a pass could not (a requeuehold, mark or release that
    failed, maybe after Slurm acted): a job still held is marked, reshaped and released; one
    gone from the queue, or marked, or FAILED (never requeued: requeued anew) leaves the journal;
    one requeued but released unmarked by someone else (its owner may release a user hold) is
    kept as given up, as is a job given up on or whose error file hung, until it leaves the
    queue.  ``on_action`` hears of each requeue finished as tend's does."""
    done = []
    by_id = {_job_id(r): r for r in jobs}
    try:
        entries = journal_read(journal)
    except HorusError as err:  # moved aside: a journal no pass can read had stopped every pass
        aside = f"{journal}.unreadable-{int(time.time())}"
        try:
            os.replace(journal, aside)
        except OSError:
            aside = journal
        if on_error:
            on_error(f"{err}; moved to {aside}: a job it names may still be held")
        return done
    for ref, e in entries.items():
        rec = by_id.get(e["job_id"])
        if e.get("given_up") or "hung" in e:
            if rec is None:
                journal_set(journal, ref, None)
            continue
        if rec is None or not held_by_requeue(rec):  # (a hold placed after it is not the loop's)
            marked_done = any(t.get("action") == "oom-requeue" for t in queue_tokens(rec.get("AdminComment"))) \
                if rec is not None else True
            # FAILED still from before the requeue, it was never requeued (requeued anew); a run
            # started since was a release of ours unmarked, however it ended
            ran_since = isinstance(rec.get("_start"), (int, float)) and rec["_start"] > e["at"]
            released = not marked_done and (rec.get("JobState") != "FAILED" or ran_since)
            journal_set(journal, ref, {**e, "given_up": True} if released else None)
            continue
        a = Action(e["job_id"], "oom-requeue", e["tres"], e["token"], fallback=e.get("fallback"), ref=ref,
                   features=e.get("features"))
        try:
            with _signals_held():
                got = finish_requeue(ref, a, e.get("admin"), journal, give_up=time.time() - e["at"] > GIVE_UP_S)
                done.append(replace(a, tres=got))
                if on_action:
                    on_action(done[-1])
        except HorusError as err:
            if on_error:
                on_error(f"oom-requeue job {e['job_id']}: {err}")
    return done


def _short(tres: str) -> str:
    """``gres:shard:a100:100`` -> ``shard:100`` (the form the marks use)."""
    return re.sub(r"^gres[:/]|:[a-z][a-z0-9_-]*(?=:\d+$)", "", tres)


def hint_mem_shards(rec: dict, gtype: str) -> int | None:
    """The shards the memory the hook charges the job's hint (its Comment) takes of a
    ``gtype`` GPU, as the hook counts them: ceil(S x memory / (pack_limit_pct % of the
    policy's gpu.<gtype>.mem_mib)); None without a hint for the type or a memory for it."""
    fields = (parse_hint(rec.get("Comment")) or {}).get(gtype)
    total = policy_value(f"gpu.{gtype}.mem_mib")
    if not fields or total is None:
        return None
    S = int(policy_value("shards_per_gpu", "100"))
    P = int(policy_value("pack_limit_pct", "90"))
    mem = charged_mem_mib(*fields[1:5])[1]
    return -(-S * mem * 100 // (int(total) * P))


def tend(mem_shards: Callable[[dict, str], int | None] = hint_mem_shards, pack_shards: int = 50,
         min_wait_s: float = 60.0, dry_run: bool = False, job_ids: set[int] | None = None,
         on_error: Callable[[str], None] | None = None, journal: str | None = None,
         on_note: Callable[[str], None] | None = None,
         on_action: Callable[[Action], None] | None = None) -> list[Action]:
    """One pass over the live queue (``squeue --json``; ``scontrol -d`` for the nodes' GresUsed,
    which no user can write): the pressure file for
    the hook (policy ``pressure_file``; not on a dry run or a pass limited to ``job_ids``), OOM
    requeues, then queue pressure on pending jobs; only on ``job_ids`` when given (every job
    still counts as load).  ``on_error`` hears of what could not be done (the pass goes on),
    ``on_note`` of an OOM requeue Slurm refuses for good (RequeueRefused: no failure, nothing
    to retry), ``on_action`` of each action once it is done (on a dry run, found), before a stop
    it held off: a pass stopped (SIGTERM) or failed later had said nothing of what it changed.
    ``journal``: the file of OOM requeues begun (heal finishes them first; not on a
    dry run) and given up, and of error files that hung (_tail_reader).  A pack or spread's
    intent mark a stopped pass left is settled first (settle_intents; not on a dry run).  No
    pack where Slurm refuses them (reshapes_gpu_to_shards), dry run or not."""
    jobs = squeue_json_records(run(["squeue", "--json", "--all", "--states=all"]))
    nodes = parse_scontrol_records(run(["scontrol", "-d", "show", "node"]))
    limit = policy_util_limit(pack_shards)
    if job_ids is None and not dry_run:  # the whole queue's view, for the hook
        try:
            signal_pressure(jobs, nodes, util_limit_pct=limit)
        except HorusError as e:  # the hook ignores a stale file: the actions still run
            if on_error:
                on_error(str(e))
    mine = jobs if job_ids is None else [r for r in jobs if _job_id(r) in job_ids]
    # before heal: settled from this read after heal had marked a job, it had written the
    # job's comment as read, its OOM requeue's mark lost (and a second requeue let through)
    settled = not dry_run and settle_intents(mine, on_error)
    healed = [] if dry_run else heal(journal, jobs, on_error, on_action)
    if healed or settled:  # the queue changed: the actions are read from it as it is now
        jobs = squeue_json_records(run(["squeue", "--json", "--all", "--states=all"]))
        mine = jobs if job_ids is None else [r for r in jobs if _job_id(r) in job_ids]
    declared = declared_type_features() if policy_value("type_via", "features") == "features" else set()
    try:  # read at every pass: a --interval loop outlives an upgrade of Slurm
        version = slurm_version(fresh=True)
    except HorusError as e:  # the OOM requeues need no version: only packing waits for one
        version = None
        if on_error:
            on_error(f"no pack this pass: {e}")
    actions = oom_actions(mine, _tail_reader(journal, version, dry_run, on_error),
                          shards_per_gpu(nodes), node_gpu_types(nodes), nodes, declared, given_up_keys(journal))
    can_pack = version is not None and reshapes_gpu_to_shards(version)
    actions += [a for a in pressure_actions(jobs, nodes, pack_shards, mem_shards, min_wait_s, time.time(),
                                            limit, type_features=declared, pack=can_pack)
                if job_ids is None or a.job_id in job_ids]  # every pending job counts in the pressure
    done = healed
    by_id = {_job_id(r): r for r in jobs}

    def did(a: Action) -> None:
        done.append(a)
        if on_action:
            on_action(a)
    for a in actions:
        if dry_run:
            did(a)
            continue
        rec = by_id[a.job_id]
        try:
            with _signals_held():  # the stop apply holds off waits until the action is said too
                admin_comment = _settled(rec.get("AdminComment"), rec.get("TresPerNode"))
                got = apply(replace(a, ref=job_ref(rec)), admin_comment, rec.get("TresPerNode"),
                            rec.get("Features"), journal, seen=rec)
                did(replace(a, tres=got))
        except RequeueRefused as e:
            if on_note:
                on_note(f"{a.kind} {e}")
        except JobMovedOn:
            # it started or ended between the read and the reshape: nothing changed, no failure
            # (a cron pass had exited 1 for it)
            if on_note:
                on_note(f"{a.kind} job {a.job_id}: no longer pending, left as it is")
        except JobChanged as e:  # its owner changed it meanwhile: theirs is kept, no failure
            if on_note:
                on_note(f"{a.kind} {e}")
        except HorusError as e:
            if on_error:
                on_error(f"{a.kind} job {a.job_id}: {e}")
    return done
