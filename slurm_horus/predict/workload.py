"""What a job's stored or requested settings mean to the predictors: its Workload, the
non-batch dimensions as a key (the model family its file name says: graph.names).

Submission (hsubmit's options), the ledger's stored workloads, CSV imports and the history all
describe a job by the same few fields; this is the one place that turns them into a Workload,
so a missing field means the same default everywhere.
"""

from __future__ import annotations

import re

from slurm_horus.errors import HorusError
from slurm_horus.predict.coldstart import Workload

DEFAULTS = {"task": "train", "optimizer": "adam", "precision": "fp32"}


def workload_from(d: dict | None) -> Workload:
    """A Workload from ``batch_size``, ``task``, ``optimizer``, ``precision`` and
    ``cpus_per_task`` (missing, empty or 0: batch 1, train, adam, fp32, CPUs unknown). Text values
    are stripped; a batch size or CPU count that is not an integer is a HorusError naming it."""
    d = d or {}

    def count(key: str) -> int | None:
        v = d.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            return None
        try:
            return int(v)
        except (TypeError, ValueError):
            raise HorusError(f"{key.replace('_', ' ')} '{v}' is not an integer") from None

    def text(key: str) -> str:
        return str(d.get(key) or DEFAULTS[key]).strip()

    return Workload(batch_size=count("batch_size") or 1, task=text("task"),
                    optimizer=text("optimizer"), precision=text("precision"),
                    cpus_per_task=count("cpus_per_task") or None)


def workload_dict(w: Workload) -> dict:
    """The stored form of a Workload (what workload_from reads back)."""
    return {"batch_size": w.batch_size, "task": w.task, "optimizer": w.optimizer,
            "precision": w.precision, "cpus_per_task": w.cpus_per_task}


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


