"""The calibration loop: export each model once per mode it runs in (eval for inference, training
for training), measure every planned run not yet done, and write its row; a run that runs out of
memory skips the larger batches of its model and task, a failed export or measurement only that
run's row, and a run another process shared the GPU with gives none."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slurm_horus.calibrate.models import trusted_cache
from slurm_horus.calibrate.plan import OutOfMemory, Run, Runner, Sampler, run_id
from slurm_horus.calibrate.rows import (CsvAppender, check_header, complete_rows, drop_cut_row,
                                        import_row, make_row)
from slurm_horus.errors import HorusError
from slurm_horus.progress import Progress
from slurm_horus.textfile import untrusted


def trusted_rows(out: Path) -> None:
    """HorusError unless the CSV resumed is a file of this user's that only they can write (or
    not there yet): another user's rows were imported as measured, and the runs they named
    skipped."""
    try:
        st = out.lstat()
    except FileNotFoundError:
        return
    if untrusted(st, (os.geteuid(),), kind="file"):
        raise HorusError(f"--resume: {out} is not a file of yours that only you can write; "
                         "its rows would be imported as measured")


def check_paths(out: str | os.PathLike, cache_dir: str | os.PathLike | None, resume: bool) -> None:
    """HorusError unless --out and --cache-dir are as the run will need them. ``horus-admin
    calibrate`` asks before the GPU (a FIFO, a full CSV without --resume or a missing folder
    had been reported only on a GPU node, after "no CUDA GPU" elsewhere: the options seemed
    right), ``calibrate`` again before it writes. Only looks: nothing is created."""
    try:
        st = os.stat(out)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise HorusError(f"--out {out}: {e.strerror or e}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise HorusError(f"--out {out}: not a regular file; choose another --out")
    if st is not None and st.st_size > 0 and not resume:
        raise HorusError(f"{out} exists: pass --resume to continue it, or choose another --out")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise HorusError(f"--out {out}: no folder {folder}")
    if cache_dir is not None and os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise HorusError(f"--cache-dir {cache_dir}: not a folder")


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
    check_paths(out, cache_dir, resume)
    trusted_cache(cache)
    if resume:
        trusted_rows(out)  # its rows are taken as measured, and imported
        check_header(out)  # before anything is cut or imported
        drop_cut_row(out)  # a row a crash cut is measured again
    rows = complete_rows(out) if resume else []
    done = {r["calib_id"] for r in rows}
    if ledger is not None:
        for row in rows:  # written before an import that failed or was interrupted
            import_row(ledger, row, str(out))
    res = Result()
    todo = []
    for r in runs:
        rid = run_id(r.model, r.batch_size, r.task, runner.gpu_type)
        (res.skipped if rid in done else todo).append(rid if rid in done else r)
    try:
        sampler = sampler_factory()  # before the CSV: a GPU NVML cannot sample leaves no file
    except HorusError:
        raise
    except Exception as e:
        raise HorusError(f"NVML cannot sample the GPU ({type(e).__name__}: {_first_line(e)})") from None
    try:
        writer = CsvAppender(out)
    except BaseException:
        getattr(sampler, "close", lambda: None)()
        raise
    oom_at: dict = {}  # (model, task) -> smallest batch that ran out of memory
    torch_version = getattr(getattr(runner, "torch", None), "__version__", "")
    try:
        with Progress("calibrate", len(todo), enabled=progress) as bar:
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
                            import_row(ledger, row, str(out))
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
        # first: a model that cannot export is not run; training runs get the training-mode graph
        onnx_path = runner.export(r.model, cache, training=r.task == "train")
    except Exception as e:
        raise _Failed(f"export: {type(e).__name__}: {_first_line(e)}",
                      f"export failed ({type(e).__name__})") from None
    try:
        m = runner.measure(r, sampler, seconds)
    except OutOfMemory as e:
        oom_at[(r.model, r.task)] = r.batch_size
        raise _Failed(f"out of memory ({e})"[:200], "out of memory") from None
    except Exception as e:  # a CUDA or build error: this run only
        raise _Failed(f"measure: {type(e).__name__}: {_first_line(e)}",
                      f"measurement failed ({type(e).__name__})") from None
    if m.util_mean is None:
        raise _Failed("the sampler got no utilization samples",
                      "no utilization samples (NVML); not written")
    if m.util_source == "shared":
        raise _Failed("another process computed on the GPU during the run",
                      "GPU shared with another process; not written")
    try:
        row = make_row(r, runner.gpu_type, m, onnx_path,
                       family=getattr(spec, "family", "") or "",
                       dims=getattr(spec, "dims", None), torch_version=torch_version)
    except Exception as e:  # the graph stage: this model only
        raise _Failed(f"features: {type(e).__name__}: {_first_line(e)}",
                      f"features failed ({type(e).__name__})") from None
    return row, m.steps


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
