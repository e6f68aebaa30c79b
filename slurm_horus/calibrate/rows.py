"""calibrate's output: one row per measured run in the `horus-admin import` format, appended to
a CSV that survives interruptions (and --resume continues), and optionally to the ledger."""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import stat
import tempfile
import time
from pathlib import Path

from slurm_horus.calibrate.plan import Measurement, Run, run_id
from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.ledger.retrain import IMPORT_COLUMNS, import_csv
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.textfile import untrusted

# The import format's columns first (unchanged), then calibration's own, which
# `horus-admin import` ignores.
EXTRA_COLUMNS = ("calib_id", "seconds", "steps", "samples", "torch_max_alloc_mib",
                 "torch_max_reserved_mib", "util_source", "torch_version", "created")
CSV_COLUMNS = (*IMPORT_COLUMNS, *EXTRA_COLUMNS)


def _regular(path: Path) -> bool:
    """Whether ``path`` exists; HorusError when it is there but no regular file (a FIFO would
    hang the read, /dev/zero never end it)."""
    if not path.exists():
        return False
    if not path.is_file():
        raise HorusError(f"{path}: not a regular file; choose another --out")
    return True


def complete_rows(path: Path) -> list[dict]:
    """Every complete row already in the CSV (a calib_id and a measured memory)."""
    if not _regular(path):
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                return []
            if "calib_id" not in reader.fieldnames:
                raise HorusError(f"{path}: not a calibrate CSV (no calib_id column); "
                                 "choose another --out")
            rows = [r for r in reader if r.get("calib_id") and r.get("mem_mib")]
    except (csv.Error, UnicodeDecodeError) as e:
        raise HorusError(f"{path}: not a calibrate CSV ({type(e).__name__}: {str(e)[:100]})") from None
    for r in rows:  # rows calibrate did not write: counted done, their runs were never measured
        if None in r:
            raise HorusError(f"{path}: row {r['calib_id']!r} has more fields than the header; "
                             "move the file away or fix it")
        try:
            ok = math.isfinite(float(r["mem_mib"]))
        except ValueError:
            ok = False
        if not ok:
            raise HorusError(f"{path}: row {r['calib_id']!r}: mem_mib {r['mem_mib'][:40]!r} is not a "
                             "number; move the file away or fix it")
    return rows


def check_header(path: Path) -> None:
    """HorusError unless the file (there and not empty) starts with calibrate's header: what
    --resume may read, cut or import."""
    if not _regular(path) or path.stat().st_size == 0:
        return
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
    except (csv.Error, UnicodeDecodeError):
        header = None
    if header != list(CSV_COLUMNS):
        raise HorusError(f"{path}: exists with other columns; use another --out or move it away")


def drop_cut_row(path: Path) -> None:
    """Drop a last row a crash cut (no newline at its end): its run is measured again. Ending
    it with a newline instead left an open quote that swallowed the next row."""
    if not _regular(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


class CsvAppender:
    """Appends rows in CSV_COLUMNS; writes the header for a new file; each row is flushed and
    fsync'ed, so an interrupt loses at most the run in progress."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # never through a link, nor into a file another user may write: root had created (or
        # appended to) whatever a link planted at --out named, and rows in a file its owner may
        # change are forged once imported
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENXIO):  # ENXIO: a FIFO nobody reads
                raise
            raise HorusError(f"{path}: a symbolic link or not a regular file; choose another "
                             "--out") from None
        try:
            st = os.fstat(fd)
            new = st.st_size == 0
            if new and st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode):
                # 0644 whatever the umask: --resume takes only a file no one else can write
                os.fchmod(fd, 0o644)
                st = os.fstat(fd)
            if untrusted(st, (os.geteuid(),), kind="file"):
                raise HorusError(f"{path}: not a file of yours that only you can write; choose "
                                 "another --out")
            if not new:
                check_header(self.path)
            self.f = os.fdopen(fd, "a", newline="", encoding="utf-8")  # what import reads
        except BaseException:
            os.close(fd)
            raise
        self.w = csv.DictWriter(self.f, fieldnames=CSV_COLUMNS)
        if new:
            self.w.writeheader()
            self.f.flush()

    def append(self, row: dict) -> None:
        self.w.writerow(row)
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self):
        self.f.close()


def _fmt(x, nd=2):
    return "" if x is None else f"{float(x):.{nd}f}"


def make_row(run: Run, gpu_type: str, m: Measurement, onnx_path: Path, family: str,
             dims: dict | None = None, torch_version: str = "") -> dict:
    """One import-format row: features and the cold-start estimate from the graph stage."""
    report = extract_features(onnx_path, batch_size=run.batch_size, dims=dims or None)
    w = Workload(batch_size=run.batch_size, task=run.task, optimizer="adam", precision="fp32")
    cold = ColdStartEstimator().predict(report, get_gpu(gpu_type), w)
    mem = m.mem_peak_mib if m.mem_peak_mib else None
    if not mem:  # NVML saw nothing: the allocator's reserve is the closest lower bound
        mem = m.torch_max_reserved_mib or m.torch_max_alloc_mib
    util = min(max(m.util_mean or 0.0, 0.0), 100.0)
    return {
        "model": str(Path(onnx_path).resolve()),  # read from anywhere when imported
        "features": json.dumps(report.values, sort_keys=True),
        "gpu_type": gpu_type, "batch_size": run.batch_size, "task": run.task,
        "optimizer": "adam" if run.task == "train" else "", "precision": "fp32",
        # the CPUs the measurement had, all for its one GPU
        "cpus_per_gpu": len(os.sched_getaffinity(0)),
        "util_pct": _fmt(util), "mem_mib": _fmt(mem, 1),
        "util_max_pct": _fmt(m.util_max), "user": "", "model_family": family,
        "cold_util_pct": _fmt(cold.util_pct), "cold_mem_mib": _fmt(cold.mem_mib, 1),
        "cold_gpu_ms": _fmt(cold.breakdown.get("gpu_ms_per_step", 0.0), 4),
        "cold_host_ms": _fmt(cold.breakdown.get("host_ms_per_step", 0.0), 4),
        "calib_id": run_id(run.model, run.batch_size, run.task, gpu_type),
        "seconds": _fmt(m.seconds), "steps": m.steps, "samples": m.samples,
        "torch_max_alloc_mib": _fmt(m.torch_max_alloc_mib, 1),
        "torch_max_reserved_mib": _fmt(m.torch_max_reserved_mib, 1),
        "util_source": m.util_source, "torch_version": torch_version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def import_row(ledger, row: dict, where: str = "calibrate") -> None:
    """Record one row in the ledger exactly as `horus-admin import` of the CSV would (same
    stable id, so importing the CSV later changes nothing); its errors name ``where`` and the
    row, not the temporary file."""
    fd, tmp = tempfile.mkstemp(suffix=".csv", prefix="horus-calibrate-")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            w.writerow(row)
        import_csv(ledger, tmp)
    except HorusError as e:
        msg = str(e).removeprefix(f"{tmp}:2: ").replace(tmp, where)
        raise HorusError(f"{where}: row {row.get('calib_id')!r}: {msg}") from None
    finally:
        os.unlink(tmp)
