"""The history file (registry history.json): its format, and the checks that refuse it whole
unless every field is what HistoryPredictor.fit writes.

hsubmit reads it for every job of a site with the standard library alone, so a corrupt or
forged file must fail here, with one line that says why, never deep inside a prediction.
"""

from __future__ import annotations

import hashlib
import math

from slurm_horus.errors import HorusError
from slurm_horus.predict.coldstart import (MAX_BATCH_SIZE, MAX_CPUS_PER_GPU, OPTIMIZERS, PRECISIONS,
                                          TASKS)
from slurm_horus.predict.gpus import BARE_CONTEXT_MIB

FORMAT = "slurm-horus-history"
FORMAT_VERSION = 1
TIERS = ("exact", "graph", "family", "user")
MAX_MIB = 2.0**24        # 16 TiB: anything above is not a measurement
MAX_LOG_RATIO = math.log(20.0)
MAX_COUNT = 10**12        # runs or users: a count past any site's (a huge one overflowed a weight)
MAX_CPU_BUCKETS = 64      # CPUs-per-GPU buckets one entry may hold (a site has a handful)


def family_key(salt: str, family: str) -> str:
    """How a published history names a model family: a salted hash, so that everyone who reads
    history.json can look up a family they name (their own file's) but not list the site's
    (family names are users' model file names: 'acquisition-target-llm')."""
    return "f-" + hashlib.sha256(f"{salt}:{family}".encode()).hexdigest()[:32]


def cpu_bucket(cpus_per_gpu: float) -> str:
    """The CPUs-per-GPU bucket a run's utilization is kept under, its nearest power of two
    ("8"): 6 and 8 CPUs feed a GPU's input pipeline alike, 1 and 8 do not, and a measurement
    at 8 had answered a job that asks for 1 as exactly its own."""
    return f"{2.0 ** round(math.log2(cpus_per_gpu)):.17g}"


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_COUNT


def read_history(d, source: str = "history") -> dict:
    """A history file's content as fit() keeps it: {"created", "graphs", "families", "users",
    "offsets", "margins", "raise_margins", "family_salt"}, each checked; HorusError (naming ``source``)
    otherwise. family_salt: None where families are named (a file from before they were
    hashed, or fit()'s own), else the salt of their family_key()s."""
    try:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise HorusError("not a slurm-horus history file")
        if d.get("format_version") != FORMAT_VERSION:
            raise HorusError(f"history format version {d.get('format_version')!r} is not "
                             f"supported (expected {FORMAT_VERSION})")
        graphs = {_sha(k): [check_run(dict(r, sha=k), "run", stored=True) for r in _list(v)]
                  for k, v in _dict(d["graphs"]).items()}
        for r in (r for v in graphs.values() for r in v):
            r.pop("sha")
        return {"created": str(d.get("created", "")), "graphs": graphs,
                "families": _pools(d["families"]), "users": _pools(d["users"]),
                "offsets": {_name(g): {_name(b): _offset(o) for b, o in _dict(v).items()}
                            for g, v in _dict(d["offsets"]).items()},
                "margins": _margins(d["margins"]),
                # (a file from before it has none: its margins were taken as they came)
                "raise_margins": _margins(d.get("raise_margins", {})),
                "family_salt": _salt(d.get("family_salt"))}
    except HorusError as e:
        raise HorusError(f"{source}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HorusError(f"{source}: corrupt history file ({type(e).__name__}: {e})") from None


def _margins(d) -> dict[str, float]:
    """Per tier, a log p90 margin (margins: the tier's own; raise_margins: from fewer users'
    residuals than may lower the base predictor's, so never below it; an older reader that
    ignores them falls back to the base's)."""
    return {t: _number(v, -MAX_LOG_RATIO, MAX_LOG_RATIO, f"margin {t}")
            for t, v in _dict(d).items() if t in TIERS}


def _dict(v) -> dict:
    if not isinstance(v, dict):
        raise HorusError("malformed history file (object expected)")
    return v


def _list(v) -> list:
    if not isinstance(v, list):
        raise HorusError("malformed history file (list expected)")
    return v


def _name(v) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= 128:
        raise HorusError(f"malformed history file (bad name {str(v)[:40]!r})")
    return v


def _salt(v) -> str | None:
    if v is not None and not (isinstance(v, str) and 0 < len(v) <= 64
                              and all(c in "0123456789abcdef" for c in v)):
        raise HorusError("malformed history file (bad family salt)")
    return v


def _sha(v) -> str:
    if not (isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)):
        raise HorusError(f"malformed history file (bad sha256 {str(v)[:70]!r})")
    return v


def _number(v, lo: float, hi: float, what: str) -> float:
    if type(v) not in (int, float) or not (lo <= v <= hi):  # NaN fails both comparisons
        raise HorusError(f"malformed history file ({what} {v!r} outside {lo:g}..{hi:g})")
    return float(v)


def _optional(v, lo, hi, what):
    return None if v is None else _number(v, lo, hi, what)


def check_run(r, what: str, stored: bool = False) -> dict:
    """A run with every field checked (types, ranges, known workload values)."""
    r = dict(_dict(r))
    if not isinstance(r.get("bs"), int) or not 1 <= r["bs"] <= MAX_BATCH_SIZE:
        raise HorusError(f"malformed history file ({what}: batch size {r.get('bs')!r})")
    for k, allowed in (("task", TASKS), ("opt", OPTIMIZERS), ("prec", PRECISIONS)):
        if r.get(k) not in allowed:
            raise HorusError(f"malformed history file ({what}: {k} {r.get(k)!r})")
    r["gpu"] = _name(r.get("gpu"))
    if not isinstance(r.get("dims", ""), str) or len(r.get("dims", "")) > 512:
        raise HorusError(f"malformed history file ({what}: dims)")
    r["dims"] = r.get("dims", "")
    r["mem"] = _number(r.get("mem"), 1e-3, MAX_MIB, "memory")
    r["util"] = _optional(r.get("util"), 0.0, 100.0, "utilization")
    # the cold start never gives less than a bare CUDA context: a cold start of 0.001 MiB had
    # scaled its run's memory to another batch size 10^7-fold
    r["cold_mem"] = _optional(r.get("cold_mem"), BARE_CONTEXT_MIB, MAX_MIB, "cold-start memory")
    r["cold_util"] = _optional(r.get("cold_util"), 0.0, 100.0, "cold-start utilization")
    for k in ("family", "user"):
        if r.get(k) is not None:
            r[k] = _name(r[k])
    if r.get("cpus_per_gpu") is not None:  # 0: unknown, as workload_from reads a job's
        r["cpus_per_gpu"] = _number(r["cpus_per_gpu"], 0.0, MAX_CPUS_PER_GPU, "CPUs per GPU") or None
    if stored:
        for k in ("n", "users"):
            if not _count(r.get(k, 1)):
                raise HorusError(f"malformed history file ({what}: {k})")
        if "util_cpus" in r:  # (a file from before it has none: its runs' CPUs are unknown)
            r["util_cpus"] = _cpu_utils(r["util_cpus"], what)
    elif r.get("sha") is not None:
        r["sha"] = _sha(r["sha"])
    return r


def _cpu_utils(d, what: str) -> dict[str, float]:
    """A stored entry's utilization by CPUs-per-GPU bucket (cpu_bucket's keys, 0..100 %)."""
    return {k: _number(v, 0.0, 100.0, "utilization") for k, v in _buckets(d, what, 1).items()}


def _buckets(d, what: str, least: int) -> dict:
    """A dict keyed by CPUs-per-GPU bucket (cpu_bucket's keys), at least ``least`` of them."""
    d = _dict(d)
    if not least <= len(d) <= MAX_CPU_BUCKETS:
        raise HorusError(f"malformed history file ({what}: util_cpus)")
    for k in d:
        try:
            ok = isinstance(k, str) and 0 < float(k) <= MAX_CPUS_PER_GPU and k == cpu_bucket(float(k))
        except (ValueError, OverflowError):  # nan, inf
            ok = False
        if not ok:
            raise HorusError(f"malformed history file ({what}: CPUs-per-GPU bucket {str(k)[:40]!r})")
    return d


def _pools(d) -> dict[str, dict[str, dict]]:
    out = {}
    for gpu, v in _dict(d).items():
        out[_name(gpu)] = {}
        for name, p in _dict(v).items():
            p = _dict(p)
            out[gpu][_name(name)] = {
                "mem_log_ratio": _number(p["mem_log_ratio"], -MAX_LOG_RATIO, MAX_LOG_RATIO,
                                         "memory ratio"), **_util_pool(p)}
            # per CPUs-per-GPU bucket, the utilization of the pool's runs there (a file from
            # before has none: its pools' utilization pulls every job alike, as it did)
            if "util_cpus" in p:
                out[gpu][name]["util_cpus"] = {k: _util_pool(u) for k, u in
                                               _buckets(p["util_cpus"], "pool", 0).items()}
    return out


def _util_pool(p) -> dict:
    """A pool's utilization shift, its count of graphs and its raise_only flag (a pool from too
    few users' graphs to lower what it corrects; a file from before the flag has none: its
    pools pull either way, as that release's did)."""
    p = _dict(p)
    if not _count(p.get("n")):
        raise HorusError("malformed history file (pool count)")
    if not isinstance(p.get("raise_only", False), bool):
        raise HorusError("malformed history file (pool raise_only)")
    # (a shift is a graph's residual less the site's offset, each within +-100 points: one of
    # 110, a family measured 30 points above a cold start the site ran 80 below, had made fit's
    # own file unreadable, and hsubmit dropped the whole history)
    return {"util_shift": _optional(p.get("util_shift"), -200.0, 200.0, "utilization shift"),
            "n": p["n"], **({"raise_only": True} if p.get("raise_only") else {})}


def _offset(o) -> dict:
    o = _dict(o)
    if not _count(o.get("n")):
        raise HorusError("malformed history file (offset count)")
    # per CPUs-per-GPU bucket, the utilization offset of the runs there (a file from before
    # has none: its offset moves every job's utilization alike, as it did)
    at = {"util_cpus": {k: _number(v, -100.0, 100.0, "utilization offset")
                        for k, v in _buckets(o["util_cpus"], "offset", 0).items()}} \
        if "util_cpus" in o else {}
    return {"mem_mib": _number(o["mem_mib"], -MAX_MIB, MAX_MIB, "memory offset"),
            "util_pp": _number(o["util_pp"], -100.0, 100.0, "utilization offset"), "n": o["n"],
            **at}

