"""`horus-probe`: record a job's own GPU use (per-process NVML samples) in the ledger."""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "ignore_unknown_options": True})
@click.option("--pid", type=int, help="Watch this process tree (default: the parent process).")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=5.0, show_default=True,
              help="Seconds between samples.")
@click.option("--job-id", envvar="SLURM_JOB_ID", help="Job id (default $SLURM_JOB_ID).")
@click.option("--cluster", envvar="SLURM_CLUSTER_NAME", help="Cluster (default $SLURM_CLUSTER_NAME).")
@click.option("--ledger", "url", envvar="HORUS_LEDGER_URL", help="Ledger database URL.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def main(pid, interval, job_id, cluster, url, command):
    """Sample the GPU use of a process tree until it ends, then write mean/max utilization and
    peak memory to the ledger. `horus-probe -- CMD ...` runs CMD and exits with its code.
    Without NVML it does nothing and exits 0 (never harms the job)."""
    try:
        from ..probe import run_probe

        rc = run_probe(pid=pid, command=list(command) or None, interval=interval, job_id=job_id,
                       cluster=cluster, url=url)
    except Exception:  # never a traceback into a job's log
        rc = 0
    sys.exit(rc)


if __name__ == "__main__":
    main()
