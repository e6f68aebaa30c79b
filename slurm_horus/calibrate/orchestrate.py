"""The calibration loop: measure every planned run not yet done, export its model once, and
write its row; a run that runs out of memory skips the larger batches of its model and task, a
failed export only that model's rows."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slurm_horus.calibrate.plan import OutOfMemory, Run, Runner, Sampler, run_id
from slurm_horus.calibrate.rows import CsvAppender, done_ids, import_row, make_row
from slurm_horus.errors import HorusError
from slurm_horus.progress import Progress


@dataclass
class Result:
    """What one calibrate call did."""

    done: list = field(default_factory=list)  # calib_ids written now
    skipped: list = field(default_factory=list)  # already in the CSV (--resume)
    failed: list = field(default_factory=list)  # (Run, reason)


def calibrate(runner: Runner, runs: list[Run], out: str | os.PathLike, *,
              sampler_factory: Callable[[], Sampler], seconds: float = 20.0,
              cache_dir: str | os.PathLike | None = None, resume: bool = False, ledger=None,
              specs: dict | None = None, progress: bool = False,
              log: Callable[[str], None] = lambda m: None) -> Result:
    """Measure every run not yet done, append a row each to `out` (and the ledger)."""
    out = Path(out)
    cache = Path(cache_dir) if cache_dir else out.parent / "horus-calibrate-onnx"
    specs = specs if specs is not None else getattr(runner, "specs", {})
    done = done_ids(out) if resume else set()
    if not resume and out.exists() and out.stat().st_size > 0:
        raise HorusError(f"{out} exists: pass --resume to continue it, or choose another --out")
    res = Result()
    todo = []
    for r in runs:
        rid = run_id(r.model, r.batch_size, r.task, runner.gpu_type)
        (res.skipped if rid in done else todo).append(rid if rid in done else r)
    writer = CsvAppender(out)
    oom_at: dict = {}  # (model, task) -> smallest batch that ran out of memory
    torch_version = getattr(getattr(runner, "torch", None), "__version__", "")
    try:
        with Progress("calibrate", len(todo), enabled=progress) as bar:
            sampler = sampler_factory()
            try:
                for r in todo:
                    label = f"{r.model} b{r.batch_size} {r.task}"
                    bar.describe(label)
                    try:
                        row, steps = _one(runner, r, sampler, seconds, cache, specs.get(r.model),
                                          oom_at, torch_version)
                    except _Failed as e:
                        res.failed.append((r, e.reason))
                        log(f"{label}: {e.note}")
                    else:
                        writer.append(row)
                        if ledger is not None:
                            import_row(ledger, row)
                        res.done.append(row["calib_id"])
                        log(f"{label}: util {row['util_pct']}%  mem {row['mem_mib']} MiB  "
                            f"(torch alloc {row['torch_max_alloc_mib']} MiB, {steps} steps)")
                    bar.advance()
            finally:
                close = getattr(sampler, "close", None)
                if close:
                    close()
    finally:
        writer.close()
    return res


class _Failed(Exception):
    """One run gave no row: `reason` goes in Result.failed, `note` in the log."""

    def __init__(self, reason: str, note: str):
        super().__init__(reason)
        self.reason, self.note = reason, note


def _one(runner: Runner, r: Run, sampler: Sampler, seconds: float, cache: Path, spec,
         oom_at: dict, torch_version: str) -> tuple[dict, int]:
    """Measure, export and describe one run -> (its row, steps run); _Failed when it cannot."""
    limit = oom_at.get((r.model, r.task))
    if limit is not None and r.batch_size >= limit:
        raise _Failed(f"skipped: batch {limit} ran out of memory", "skipped (out of memory)")
    try:
        m = runner.measure(r, sampler, seconds)
    except OutOfMemory as e:
        oom_at[(r.model, r.task)] = r.batch_size
        raise _Failed(f"out of memory ({e})"[:200], "out of memory") from None
    if m.util_mean is None:
        raise _Failed("the sampler got no utilization samples",
                      "no utilization samples (NVML); not written")
    try:
        onnx_path = runner.export(r.model, cache)
        row = make_row(r, runner.gpu_type, m, onnx_path,
                       family=getattr(spec, "family", "") or "",
                       dims=getattr(spec, "dims", None), torch_version=torch_version)
    except Exception as e:  # export / graph stage: this model only
        msg = (str(e).strip().splitlines() or [""])[0][:200]
        raise _Failed(f"export/features: {type(e).__name__}: {msg}",
                      f"export/features failed ({type(e).__name__})") from None
    return row, m.steps
