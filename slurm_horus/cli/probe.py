"""`horus-probe`: record a job's GPU use (per-process NVML samples) in the ledger, as root."""

from __future__ import annotations

import os
import sys

import click
from click.core import ParameterSource

from slurm_horus.cli.common import Command, FiniteFloatRange


def check_job_id(ctx, value) -> None:
    """--job-id as a number. Typed by hand, anything else is a usage error (exit 2, as click
    gives ``--pid abc``): it had been measured, then dropped at the record, with exit 0. From
    $SLURM_JOB_ID (the environment of a job, or of slurmd's Prolog/Epilog) it is never an
    error, for a probe must never fail a job: the probe records nothing (``numeric_job_id``).
    Checked in the command, not an option callback: click 8.4 records where a value came from
    only after its callback ran, so there every value had looked typed by none."""
    if value is None or ctx.get_parameter_source("job_id") is not ParameterSource.COMMANDLINE:
        return
    from slurm_horus.ledger.probe import numeric_job_id  # as main's: never before a job's try

    if not numeric_job_id(value):
        param = next(p for p in ctx.command.params if p.name == "job_id")
        raise click.BadParameter(f"{value!r} is not a job id (a number)", ctx, param)


NOT_ROOT = ("horus-probe: refusing to record as uid {uid}: only root measures jobs "
            "(slurmd's Prolog runs `horus-probe --prolog`, see docs/ledger.md)")


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"],
                                 "ignore_unknown_options": True,
                                 # CMD's own options are CMD's, as --interval of `python train.py
                                 # --interval 5`
                                 "allow_interspersed_args": False})
@click.option("--prolog", "mode", flag_value="prolog",
              help="From slurmd's Prolog (root): probe $SLURM_JOB_ID's GPUs on this node in the "
                   "background until --epilog; returns at once.")
@click.option("--epilog", "mode", flag_value="epilog",
              help="From slurmd's Epilog (root): stop this job's probe, which then records.")
@click.option("--pid", type=int, help="Watch this process tree (default: the parent process).")
@click.option("--interval", type=FiniteFloatRange(0.2, 3600),
              help="Seconds between samples (default $HORUS_PROBE_INTERVAL, kept within "
                   "0.2..3600, else 5).")
@click.option("--job-id", envvar="SLURM_JOB_ID",
              help="Job id (default $SLURM_JOB_ID).")
@click.option("--cluster", envvar="SLURM_CLUSTER_NAME",
              help="Cluster (default $SLURM_CLUSTER_NAME).")
@click.option("--ledger", "url", envvar="HORUS_LEDGER_URL", help="Ledger database URL.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def main(mode, pid, interval, job_id, cluster, url, command):
    """Measure a job's GPU use and write mean/max utilization and peak memory to the ledger.

    Sites install it in slurmd's Prolog/Epilog (etc/horus-prolog, etc/horus-epilog): measured use
    comes only from a probe running as root. Only root records: anyone else gets a one-line error
    and exit code 2 (`horus-probe -- CMD` still runs CMD, unmeasured, in its place).
    Without NVML (or a GPU) it records nothing and prints nothing."""
    check_job_id(click.get_current_context(), job_id)
    uid = os.geteuid()
    if uid != 0:
        click.echo(NOT_ROOT.format(uid=uid), err=True)
        if command and not mode:
            from slurm_horus.ledger.probe import run_unmeasured

            sys.exit(run_unmeasured(list(command)))
        sys.exit(2)
    try:
        from slurm_horus.ledger import probe, prolog

        if mode == "prolog":
            rc = prolog.prolog(interval=interval, url=url)
        elif mode == "epilog":
            rc = prolog.epilog()
        else:
            rc = probe.run_probe(pid=pid, command=list(command) or None,
                                 interval=interval if interval is not None else prolog.probe_interval(os.environ),
                                 job_id=job_id, cluster=cluster, url=url)
    except Exception:  # never a traceback into a job's log or slurmd's
        rc = 0
    sys.exit(rc)


if __name__ == "__main__":
    main()
