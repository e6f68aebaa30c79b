"""The pyslurm backend (``commands.backend() == "pyslurm"``): Slurm's C API instead of the tools.

Gives the records the CLI backend gives (see ``commands``): nodes and partitions in scontrol's
record shape, running jobs as ``parse.squeue_json_jobs`` records, accounting as
``accounting.parse_job`` flat dicts. Checked on pyslurm 25.11.2 with Slurm 25.11.7. What
pyslurm cannot give, and so is None here where the CLI may have it:

* the GPU index of a running *shard* job: pyslurm's GRES parser drops Slurm's per-GPU counts
  (``shard:66(0/100,66/100)`` becomes ``{"shard": 66}``); whole-GPU indices come through;
* GPU usage from accounting (TRESUsageIn ``gres/gpuutil``, ``gres/gpumem``, Slurm 23.02+ with
  AutoDetect=nvml): pyslurm's step statistics carry only CPU, memory and disk TRES.

pyslurm itself is imported (``_ps``) only once ``commands.backend()`` has checked that it
matches the running Slurm: an import initialises libslurm.
"""

from __future__ import annotations

import functools
import re

from slurm_horus.errors import HorusError
from slurm_horus.slurm import parse as sp


def _ps():
    try:
        import pyslurm
    except Exception as e:  # a broken build or a missing libslurm: say so in one line
        raise HorusError(f"pyslurm does not import ({e}); HORUS_SLURM_BACKEND=cli avoids it") from None
    return pyslurm


def _one_line_errors(fn):
    """pyslurm's RPC errors as HorusError (callers print one line, never a traceback)."""
    @functools.wraps(fn)
    def inner(*args):
        ps = _ps()
        try:
            return fn(*args)
        except ps.PyslurmError as e:
            raise HorusError(f"pyslurm {fn.__name__}: {e}") from None
    return inner


def _gres_text(gres: dict) -> str:
    """pyslurm's ``{"gpu:a100": 4, "shard:a100": 400}`` back to ``gpu:a100:4,shard:a100:400``."""
    return ",".join(f"{k}:{v['count'] if isinstance(v, dict) else v}" for k, v in gres.items())


@_one_line_errors
def nodes() -> list[dict]:
    out = []
    for n in _ps().Nodes.load().values():
        out.append({"NodeName": n.name, "Gres": _gres_text(n.configured_gres or {}),
                    "Partitions": ",".join(n.partitions or []),
                    "AvailableFeatures": ",".join(n.available_features or []),
                    "ActiveFeatures": ",".join(n.active_features or []), "_details": []})
    return out


@_one_line_errors
def partitions() -> list[dict]:
    return [{"PartitionName": p.name, "Default": "YES" if p.is_default else "NO",
             "Nodes": p.nodes or "", "_details": []}
            for p in _ps().Partitions.load().values()]


def _job_gres(layout: dict) -> list[dict]:
    """``get_resource_layout_per_node()``'s gres as parse_gres items (idx from "indexes")."""
    out = []
    for node in layout.values():
        for key, v in (node.get("gres") or {}).items():
            name, _, gtype = key.partition(":")
            if isinstance(v, dict):
                (item,) = sp.parse_gres(f"{key}:{v['count']}(IDX:{v['indexes']})")
            else:
                item = {"name": name, "type": gtype or None, "count": int(v), "idx": None}
            out.append(item)
    return out


@_one_line_errors
def running_jobs() -> list[dict]:
    out = []
    for j in _ps().Jobs.load().values():
        tpn = j.gres_per_node or {}
        out.append({
            "job_id": j.id, "state": j.state, "partition": j.partition,
            "nodes": j.allocated_nodes or "",
            "tres_per_node": ",".join(f"{k}:{v}" for k, v in tpn.items()) or "",
            "comment": j.comment or "", "features": "&".join(j.constraints or []),
            "gres": _job_gres(j.get_resource_layout_per_node()) if j.state == "RUNNING" else [],
        })
    return out


@_one_line_errors
def accounting_jobs(since: float, until: float) -> list[dict]:
    ps = _ps()
    flt = ps.db.JobFilter(start_time=int(since), end_time=int(until))
    return [_flat(j) for j in ps.db.Jobs.load(flt).values()]


def _flat(j) -> dict:
    """One db.Job as ``accounting.parse_job`` builds it from sacct --json."""
    tres = j.allocated_tres
    counts: dict[str, int] = {}
    gtype = None
    for key, t in ((tres.gres or {}) if tres else {}).items():
        name, _, typ = key.partition(":")
        counts[name] = counts.get(name, 0) + int(t.count)
        if typ and name in ("gpu", "shard") and gtype is None and re.fullmatch(r"[A-Za-z0-9_.-]+", typ):
            gtype = typ
    cpu = tres.cpu.count if tres and tres.cpu else None
    node = j.nodelist
    return {
        "cluster": j.cluster or "", "job_id": int(j.id), "user": j.user_name,
        "account": j.account, "state": (j.state or "").split()[0].upper() or None,
        "elapsed_s": j.elapsed_time or 0, "submit_time": j.submit_time,
        "start_time": j.start_time or None, "end_time": j.end_time or None,
        "node": None if node in (None, "", "None assigned") else node,
        "shards": counts.get("shard"), "gpus": counts.get("gpu"),
        "cpus": int(cpu) if cpu is not None else None, "gpu_type": gtype, "gpu_index": None,
        "comment": j.comment or "", "admin_comment": j.admin_comment or None,
        "util_max": None, "util_mean": None, "mem_peak_mib": None,
    }
