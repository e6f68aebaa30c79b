"""What a job's stored or requested settings mean to the predictors: its Workload, the
non-batch dimensions as a key (the model family its file name says: graph.names).

Submission (hsubmit's options), the ledger's stored workloads, CSV imports and the history all
describe a job by the same few fields; this is the one place that turns them into a Workload,
so a missing field means the same default everywhere.
"""

from __future__ import annotations

import re

from slurm_horus.errors import HorusError
from slurm_horus.predict.coldstart import MAX_CPUS_PER_GPU, Workload

DEFAULTS = {"task": "train", "optimizer": "adam", "precision": "fp32"}


def workload_from(d: dict | None) -> Workload:
    """A Workload from ``batch_size``, ``task``, ``optimizer``, ``precision`` and
    ``cpus_per_gpu`` (missing, empty or 0: batch 1, train, adam, fp32, CPUs unknown). Without
    ``cpus_per_gpu``, a job's ``cpus`` and ``gpus`` (what Slurm allocated it, as sync stores
    them) give it: cpus_per_gpu(). Text values are stripped; a batch size or CPU/GPU count that
    is not a number is a HorusError naming it. A stored ``cpus_per_task`` (before the feature
    was CPUs per GPU) is not read here: it was another quantity (ledger.training reads a synced
    row's with its GPUs)."""
    d = d or {}

    def given(key: str):
        v = d.get(key)
        return None if v is None or (isinstance(v, str) and not v.strip()) else v

    def count(key: str) -> int | None:
        v = given(key)
        if v is None:
            return None
        try:
            return int(v)
        except (TypeError, ValueError):
            raise HorusError(f"{key.replace('_', ' ')} '{v}' is not an integer") from None

    def text(key: str) -> str:
        v = given(key)  # whitespace alone is missing, as for the counts
        return str(v).strip() if v else DEFAULTS[key]

    cpg = given("cpus_per_gpu")
    if cpg is not None:
        try:
            cpg = float(cpg) if not isinstance(cpg, bool) else None
        except (TypeError, ValueError, OverflowError):
            cpg = None
        if cpg is None:
            raise HorusError(f"cpus per gpu '{d['cpus_per_gpu']}' is not a number")
    else:
        cpg = cpus_per_gpu(count("cpus"), count("gpus"))
    return Workload(batch_size=count("batch_size") or 1, task=text("task"),
                    optimizer=text("optimizer"), precision=text("precision"),
                    cpus_per_gpu=cpg or None)


def cpus_per_gpu(cpus: int | float | None, gpus: int | float | None) -> float | None:
    """The CPUs-per-GPU feature of a job with ``cpus`` CPUs and ``gpus`` GPUs in all (what
    Slurm allocated, or what the job asks for): None where either is unknown or not positive,
    or past any node (MAX_CPUS_PER_GPU)."""
    if cpus is None or gpus is None or isinstance(cpus, bool) or isinstance(gpus, bool):
        return None
    try:
        cpus, gpus = float(cpus), float(gpus)
    except (TypeError, ValueError, OverflowError):
        return None
    if not (0 < cpus < float("inf") and 0 < gpus < float("inf")):
        return None
    ratio = cpus / gpus
    return ratio if 0 < ratio <= MAX_CPUS_PER_GPU else None


def workload_dict(w: Workload) -> dict:
    """The stored form of a Workload (what workload_from reads back)."""
    return {"batch_size": w.batch_size, "task": w.task, "optimizer": w.optimizer,
            "precision": w.precision, "cpus_per_gpu": w.cpus_per_gpu}


def dims_key(dims: dict | None, batch: int) -> str:
    """The non-batch dimensions a run was bound with, as a stable key (sequence length...).
    The batch dimension is known by its name (graph.load.BATCH_DIM_NAMES), or, unnamed (an
    input's position, ``x[0]``), by holding the batch size.  By value alone, a sequence as
    long as the batch was dropped too: runs at (64, 64) and (128, 128) shared one key, and a
    job at (512, 512) was given their memory as an exact answer, a third of its need."""
    from slurm_horus.graph.load import BATCH_DIM_NAMES

    items = sorted((str(k), int(v)) for k, v in (dims or {}).items()
                   if not (BATCH_DIM_NAMES.match(str(k)) or (_GENERATED.match(str(k)) and int(v) == batch)))
    return ",".join(f"{k}={v}" for k, v in items)


# names exporters make up for a dimension (torch dynamo's s0, ONNX inference's unk__12,
# torch.onnx's input_dynamic_axes_1, an input's position x[0]): one holding the batch size is
# the batch dimension load_graph bound by position; a name someone chose (seq) is never taken
# for it by its value
_GENERATED = re.compile(r"^(s\d+|unk__\d+|.*dynamic_axes_\d+|.*\[\d+\])$")


