"""horus-admin queue: OOM requeue and queue-pressure reshaping on the live queue."""

from __future__ import annotations

import json
import time

import click

from slurm_horus.cli.common import one_line_errors


def register(admin: click.Group) -> None:
    @admin.command("queue")
    @click.option("--interval", type=click.FloatRange(min=5), default=None,
                  help="Repeat every this many seconds (default: one pass, for scrontab/systemd).")
    @click.option("--pack-shards", type=click.IntRange(1, 99), default=50, show_default=True,
                  help="Shards (of 100 per GPU) a packed job gets under queue pressure.")
    @click.option("--min-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
                  help="Seconds a job must have waited before it is packed.")
    @click.option("-j", "--jobs", "job_list", metavar="ID[,ID...]",
                  help="Act on these jobs only (the rest of the queue still counts as load).")
    @click.option("-n", "--dry-run", is_flag=True, help="Print what would change; change nothing.")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per action.")
    @one_line_errors("horus-admin queue")
    def queue(interval, pack_shards, min_wait, job_list, dry_run, as_json):
        """Requeue shared jobs that died of a GPU out-of-memory error on a whole GPU (once), and
        pack or spread pending jobs by queue pressure. Run as root or SlurmUser."""
        from slurm_horus.errors import HorusError
        from slurm_horus.ledger.requeue import policy_util_limit, tend
        from slurm_horus.slurm.policy import policy_value

        ids = None
        if job_list:
            try:
                ids = {int(x) for x in job_list.split(",") if x.strip()}
            except ValueError:
                ids = {-1}
            if not all(0 < j < 2 ** 32 for j in ids):  # Slurm's ids are 32-bit
                raise HorusError(f"--jobs {job_list!r}: expected job ids like 12,15")
        if dry_run and not as_json:
            click.echo(f"slowdown_bound {policy_value('slowdown_bound', '2')} for the "
                       f"{policy_value('slowdown_tail', 'median')} job: under queue pressure, "
                       f"jobs up to {policy_util_limit(pack_shards):.1f} % predicted utilization pack")
        while True:
            for a in tend(pack_shards=pack_shards, min_wait_s=min_wait, dry_run=dry_run,
                          job_ids=ids):
                if as_json:
                    click.echo(json.dumps({"job_id": a.job_id, "action": a.kind, "tres": a.tres,
                                           "dry_run": dry_run}))
                else:
                    click.echo(f"{'would ' if dry_run else ''}{a.kind} job {a.job_id} -> {a.tres}")
            if interval is None:
                return
            time.sleep(interval)
