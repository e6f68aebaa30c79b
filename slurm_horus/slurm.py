"""The Slurm backend: run sbatch / scontrol / sinfo (command-line tools, submitit-style).

All parsing of what these commands print lives in ``slurm_parse``.  pyslurm is optional and only
used if ``import pyslurm`` works AND ``HORUS_SLURM_BACKEND=pyslurm`` asks for it; the command
line tools are the default backend (they are what submitit, dask-jobqueue and parsl use).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from . import slurm_parse as sp
from .errors import HorusError

__all__ = ["run", "scontrol_nodes", "scontrol_partitions", "partition_gpu_types",
           "default_partition", "sbatch", "exec_sbatch", "show_job", "private_jobs",
           "pyslurm_available"]

TIMEOUT_S = 30


def _cmd(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise HorusError(f"{name} not found on PATH (is Slurm installed?)")
    return exe


def run(args: list[str], timeout: float = TIMEOUT_S) -> str:
    """Run a Slurm query command; its stdout, or HorusError with its stderr's first line."""
    try:
        cp = subprocess.run([_cmd(args[0]), *args[1:]], capture_output=True, text=True,
                            timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HorusError(f"{' '.join(args[:3])} timed out after {timeout:.0f} s") from None
    if cp.returncode != 0:
        msg = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
        raise HorusError(f"{' '.join(args[:3])}: {msg}")
    return cp.stdout


def scontrol_nodes() -> list[dict]:
    return sp.parse_scontrol_records(run(["scontrol", "show", "node", "-o"]))


def scontrol_partitions() -> list[dict]:
    return sp.parse_scontrol_records(run(["scontrol", "show", "partition", "-o"]))


def default_partition() -> str:
    name = sp.default_partition(scontrol_partitions())
    if not name:
        raise HorusError("no default partition (pass -p/--partition)")
    return name


def partition_gpu_types(partition: str | None) -> tuple[str, dict[str, int]]:
    """(partition, {gres type: GPU count}) of ``partition`` (None: the default partition)."""
    if not partition:
        partition = default_partition()
    return partition, sp.partition_gpu_types(scontrol_nodes(), partition)


def private_jobs(unknown: bool) -> bool:
    """Whether Slurm's PrivateData hides other users' jobs; ``unknown`` when Slurm cannot say
    (hacct assumes private: never a leak; sync assumes not: never a file-mode change on a guess)."""
    try:
        conf = sp.parse_scontrol_config(run(["scontrol", "show", "config"]))
    except HorusError:
        return unknown
    return "jobs" in conf.get("PrivateData", "").lower().split(",")


def show_job(job_id: str | int) -> dict | None:
    recs = sp.parse_scontrol_records(run(["scontrol", "-d", "show", "job", str(job_id)]))
    return recs[0] if recs else None


def sbatch(argv: list[str], stdin: bytes | None = None, capture: bool = False
           ) -> subprocess.CompletedProcess:
    """Run sbatch with ``argv``; output goes straight through unless ``capture``."""
    kw = {"input": stdin} if stdin is not None else {}
    if capture:
        kw.update(capture_output=True)
    return subprocess.run([_cmd("sbatch"), *argv], **kw)


def exec_sbatch(argv: list[str]) -> None:
    """Replace this process with sbatch (same stdin/stdout/stderr, sbatch's exit code)."""
    exe = shutil.which("sbatch")
    if exe is None:
        raise HorusError("sbatch not found on PATH (is Slurm installed?)")
    os.execv(exe, ["sbatch", *argv])


def pyslurm_available() -> bool:
    """True when pyslurm imports (needs a matching Slurm and a reachable slurm.conf)."""
    try:
        import pyslurm  # noqa: F401
    except Exception:
        return False
    return True
