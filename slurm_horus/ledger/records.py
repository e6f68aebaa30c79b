"""The rows the ledger is given: a submission (what was claimed and predicted) and a usage
measurement (what a source saw). Validated here, stored as given: the ledger re-derives nothing
from the model or the workload.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass

from slurm_horus.errors import HorusError
from slurm_horus.graph.names import family_of

SOURCES = ("sacct", "probe", "import")


def _json(v):
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, default=_jdefault)


def _jdefault(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dict__"):
        return o.__dict__
    return str(o)


def _pred_dict(p) -> dict:
    if isinstance(p, dict):
        return p
    return p.to_dict() if hasattr(p, "to_dict") else dict(p)


def submission_record(*, job_id, cluster="", user=None, account=None, submit_time=None,
                      model_path=None, model_sha256=None, model_family=None,
                      feature_version=None, features=None, workload=None, gpu_types=None,
                      predictions=None, hint=None, policy_decision=None, predictor=None,
                      uid=None) -> dict:
    """A submissions row; ``predictions`` is {gres type: prediction (dict or to_dict())}."""
    try:
        job_id = int(str(job_id).split(";")[0])
    except ValueError:
        raise HorusError(f"ledger: bad job id {job_id!r}") from None
    preds = {str(k): _pred_dict(v) for k, v in (predictions or {}).items()}
    if predictor is None and preds:
        predictor = next(iter(preds.values())).get("predictor")
    if model_family is None and model_path:
        model_family = family_of(model_path)
    if workload is not None and not isinstance(workload, (dict, str)):
        workload = asdict(workload) if is_dataclass(workload) else dict(workload)
    return {"cluster": cluster or "", "job_id": job_id, "user_name": user, "account": account,
            "submit_time": int(submit_time if submit_time is not None else time.time()),
            "model_path": str(model_path) if model_path else None, "model_sha256": model_sha256,
            "model_family": model_family, "feature_version": feature_version,
            "features": _json(features), "workload": _json(workload),
            "gpu_types": _json(list(gpu_types) if gpu_types is not None else sorted(preds) or None),
            "predictions": _json(preds), "hint": hint, "policy_decision": _json(policy_decision),
            "predictor": predictor, "uid": None if uid is None else int(uid)}


MAX_COLOCATED = 1000  # ids listed per job: 11 kB, within a TEXT column anywhere (MariaDB: 64 kB)


def colocated_text(ids) -> str | None:
    """A job's co-located job ids as stored: sorted, at most MAX_COLOCATED (the first), so that
    a long job beside thousands of short ones on a busy node never outgrows its column (every
    sync after it had failed on MariaDB)."""
    return ",".join(str(x) for x in sorted({int(x) for x in ids})[:MAX_COLOCATED]) or None


MAX_MEM_MIB = float(1 << 24)  # 16 TiB: beyond any GPU's memory, on any number of GPUs of one job


def usage_record(*, job_id, source, cluster="", util_mean=None, util_max=None, mem_peak_mib=None,
                 elapsed_s=None, state=None, node=None, gpu_type=None, gpu_index=None,
                 gpus=None, shards=None, colocated=None, start_time=None, end_time=None,
                 recorded=None, array_job_id=None, array_task_id=None, het_job_id=None,
                 het_job_offset=None) -> dict:
    """A usage row: ``gpus`` whole GPUs allocated (gres/gpu), ``shards`` shards (gres/shard),
    ``array_job_id`` and ``array_task_id`` an array task's ArrayJobId and ArrayTaskId,
    ``het_job_id`` and ``het_job_offset`` a heterogeneous job component's HetJobId and
    HetJobOffset (all from Slurm's accounting)."""
    if source not in SOURCES:
        raise HorusError(f"ledger: usage source must be one of {', '.join(SOURCES)}, not {source!r}")
    if isinstance(colocated, (list, tuple, set)):
        colocated = colocated_text(colocated)

    def f(x):
        return None if x is None else float(x)

    def i(x):
        return None if x is None else int(x)

    def within(x, top):
        """A measurement no GPU can give (below 0, above ``top``, not a number) is not kept:
        one such row would swamp every mean it counts in."""
        x = f(x)
        return x if x is not None and 0.0 <= x <= top else None
    most_util = 100.0 * max(1, i(gpus) or 1)  # the probe and sacct sum a job's GPUs
    return {"cluster": cluster or "", "job_id": int(job_id), "source": source,
            "util_mean": within(util_mean, most_util), "util_max": within(util_max, most_util),
            "mem_peak_mib": within(mem_peak_mib, MAX_MEM_MIB),
            "elapsed_s": i(elapsed_s), "state": state, "node": node, "gpu_type": gpu_type,
            "gpu_index": i(gpu_index), "gpus": i(gpus), "shards": i(shards),
            "colocated": colocated,
            "start_time": i(start_time), "end_time": i(end_time),
            "recorded": int(recorded if recorded is not None else time.time()),
            "array_job_id": i(array_job_id), "array_task_id": i(array_task_id),
            "het_job_id": i(het_job_id), "het_job_offset": i(het_job_offset)}
