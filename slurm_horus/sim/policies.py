"""What each job asks Slurm for under each policy (exclusive, naive, horus, oracle).

horus and oracle go through the real ``etc/job_submit.lua`` (:class:`HorusDecider`, once per
distinct hint and request): horus with the job's PREDICTED util/memory, oracle with the TRUE ones.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from slurm_horus.errors import HorusError
from slurm_horus.slurm.hint import encode_hint
from slurm_horus.slurm.hook_runtime import HookRuntime
from slurm_horus.slurm.policy import POLICY_MAX_BYTES, find_hook, policy_values, policy_with_overrides
from slurm_horus.sim.traces import SimJob
from slurm_horus.textfile import read_text

__all__ = ["POLICIES", "check_policies", "Request", "JobTable", "job_table", "HorusDecider", "build_requests"]

POLICIES = ("exclusive", "naive", "horus", "oracle")


def check_policies(names: Iterable[str]) -> None:
    """HorusError naming the first of ``names`` that is no policy."""
    for p in names:
        if p not in POLICIES:
            raise HorusError(f"unknown policy '{p}'; choose from {', '.join(POLICIES)}")


@dataclass(frozen=True)
class Request:
    """types: indices of the cluster's GPU types the job may run on, in preference order;
    shards: shards per GPU (== S: whole GPUs); gpus: GPUs on one node; share: set for a job the
    horus scheduler may co-locate (it then holds one shard)."""

    types: tuple[int, ...]
    shards: int
    gpus: int
    share: tuple | None = None  # horus/oracle: (util %, p90 MiB, runtime factor per type, limit s)


def _eligible_types(job: SimJob, types: list[str], mem: list[float]) -> tuple[int, ...]:
    """Types a user would submit to: those whose memory holds the job's predicted p90 (else the
    largest), fastest for the job first."""
    ok = [i for i, t in enumerate(types) if job.pred[t][2] <= mem[i]]
    ok.sort(key=lambda i: job.runtime_x.get(types[i], 1.0))
    return tuple(ok) or (max(range(len(types)), key=lambda i: mem[i]),)


@dataclass(frozen=True)
class JobTable:
    """A trace's per-job facts by the cluster's GPU type index: built once per trace and cluster
    and shared by every policy run on them (building it is a tenth of a 100k-job run)."""

    true: list[list[tuple[float, float]]]  # [job][type]: true (util %, memory MiB)
    rx: list[tuple[float, ...]]  # [job][type]: runtime factor
    dur: list[list[float]]  # [job][type]: solo runtime, s
    elig: list[tuple[int, ...]]  # [job]: the types its user submits to (_eligible_types)


def job_table(jobs: Sequence[SimJob], types: list[str], mem: list[float],
              given: JobTable | None = None) -> JobTable:
    """The job table of ``jobs`` on these types: ``given`` once checked to be theirs, else built."""
    if given is not None:
        if len(given.true) != len(jobs):
            raise HorusError("the job table is of another trace")
        return given
    rx = [tuple([j.runtime_x.get(t, 1.0) for t in types]) for j in jobs]
    return JobTable([[j.true[t] for t in types] for j in jobs], rx,
                    [[j.duration * x for x in r] for j, r in zip(jobs, rx)],
                    [_eligible_types(j, types, mem) for j in jobs])


def _policy_text(base: str, types: list[str], mem: list[float]) -> str:
    """The base policy for the simulated cluster: gpu.<type>.mem_mib added for its types the
    policy does not set, type_order restricted to its types (the base order first, the added
    ones after; without a type_order in the base: by memory, as the hook's default), every type a
    node feature, and no claim record."""
    values = policy_values(base)
    overrides = {f"gpu.{t}.mem_mib": str(int(m)) for t, m in zip(types, mem)
                 if f"gpu.{t}.mem_mib" not in values}
    listed = [x for x in re.split(r"[,\s]+", values["type_order"]) if x] if "type_order" in values else \
        [t for _, t in sorted(zip(mem, types))]
    order = ", ".join([t for t in listed if t in types] + [t for t in types if t not in listed])
    overrides["type_order"] = order
    overrides["type_features"] = order  # every simulated node carries its type
    overrides["underclaim_limit"] = "0"  # the site's claim record is not the simulated jobs'
    overrides["pressure_file"] = ""  # nor is the live queue's pressure: the simulator has its own
    return policy_with_overrides(base, overrides)


class HorusDecider:
    """The real job_submit.lua hook, asked once per distinct (hint, request).

    policy_path: the base policy (default: $HORUS_POLICY, else horus_policy.conf next to the
    hook); GPU types of the cluster that it does not know are added with their memory, into
    a temporary copy.  Use as a context manager (the copy is removed on exit).
    """

    def __init__(self, types: list[str], mem: list[float], policy_path: str | os.PathLike | None = None,
                 hook_path: str | os.PathLike | None = None):
        self.types, self.mem = list(types), list(mem)
        self.hook = find_hook(hook_path)
        self._runtime = HookRuntime(self.hook)  # one load for the run: the hook does not change
        if policy_path is None:
            policy_path = os.environ.get("HORUS_POLICY") or (self.hook.parent / "horus_policy.conf")
        base = read_text(policy_path, "policy file", POLICY_MAX_BYTES)
        self._tmp = tempfile.TemporaryDirectory(prefix="horus-sim-")
        self.policy_path = Path(self._tmp.name) / "horus_policy.conf"
        self.policy_path.write_text(_policy_text(base, self.types, self.mem))
        self.cache: dict[tuple[str, str], tuple[str, str | None, int | None, int | None]] = {}
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
        d = self._runtime.submit({"comment": hint, "tres_per_node": tres}, policy_path=self.policy_path)
        self.calls += 1
        out = (d.action, d.gpu_type, d.shards, d.shards_per_gpu)
        self.cache[key] = out
        return out

    def decide(self, preds: Mapping[str, tuple[float, float, float]], gpus: int = 1):
        """(action, gpu_type, shards) for a job with these predictions asking for ``gpus`` GPUs."""
        key = (tuple([preds[t] for t in self.types]), gpus)
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
                   pack: bool = True, table: JobTable | None = None) -> tuple[list[Request | None], dict]:
    """Each job's request under ``policy``; None for a job Slurm would reject.  The oracle's
    hint is the truth rounded UP to ``oracle_util_q`` % and ``oracle_mem_q`` MiB (fewer distinct
    hints, never an understatement).  ``pack``: horus/oracle 1-GPU jobs are co-located by the
    simulator's queue-pressure scheduler (predicted slowdown); else by the hook's shards alone.
    ``table``: :func:`job_table` of these jobs on these types, when the caller has it."""
    S = shards_per_gpu
    tindex = {t: i for i, t in enumerate(types)}
    reqs: list[Request | None] = []
    stats = {"shared": 0, "exclusive": 0, "unchanged": 0, "rejected": 0}
    if policy in ("horus", "oracle") and decider is None:
        raise HorusError(f"policy {policy} needs the job_submit hook")
    table = job_table(jobs, types, mem, table)
    for j, elig, rx in zip(jobs, table.elig, table.rx):
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
            assert decider is not None  # checked above
            action, gtype, shards = decider.decide(preds, j.gpus)
            stats[action] = stats.get(action, 0) + 1
            if action == "rejected":
                reqs.append(None)
            elif pack and j.gpus == 1:
                # the queue-pressure scheduler: the hook admits, co-location is decided at start
                t0 = types[elig[0]]
                reqs.append(Request(elig, 1, 1, (preds[t0][0], preds[t0][2], rx, j.limit)))
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
