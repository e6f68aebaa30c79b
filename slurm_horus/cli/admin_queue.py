"""horus-admin queue: OOM requeue and queue-pressure reshaping on the live queue."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time

import click

from slurm_horus.cli.common import FiniteFloatRange, one_line_errors


# a pass at least once a day: time.sleep() overflowed on a huge --interval (1e308) after the
# first pass, an internal error
MAX_INTERVAL_S = 86400


def register(admin: click.Group) -> None:
    @admin.command("queue")
    @click.option("--interval", type=FiniteFloatRange(min=5, max=MAX_INTERVAL_S), default=None,
                  help="Repeat every this many seconds, 5 to 86,400 (default: one pass, for "
                       "scrontab/systemd).")
    @click.option("--pack-shards", type=click.IntRange(min=1), default=None,
                  help="Shards a packed job gets under queue pressure, fewer than the policy's "
                       "shards_per_gpu [default: the policy's pressure_shards, 50].")
    @click.option("--min-wait", type=FiniteFloatRange(min=0), default=60.0, show_default=True,
                  help="Seconds a job must have waited before it is packed.")
    @click.option("-j", "--jobs", "job_list", metavar="ID[,ID...]",
                  help="Act on these jobs only (the rest of the queue still counts as load).")
    @click.option("-n", "--dry-run", is_flag=True, help="Print what would change; change nothing.")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per action.")
    @one_line_errors("horus-admin queue")
    def queue(interval, pack_shards, min_wait, job_list, dry_run, as_json):
        """Requeue shared jobs that died of a GPU out-of-memory error on a whole GPU (once), and
        pack or spread pending jobs by queue pressure. Run as root (--dry-run: as anyone)."""
        from slurm_horus.errors import HorusError
        from slurm_horus.ledger.requeue import policy_util_limit, tend
        from slurm_horus.slurm.policy import policy_value

        per_gpu = int(policy_value("shards_per_gpu", "100"))
        if pack_shards is None:  # as the hook reads it: more than a GPU's shards is its shards
            pack_shards = min(int(policy_value("pressure_shards", "50")), per_gpu)
        elif pack_shards >= per_gpu:
            raise HorusError(f"--pack-shards {pack_shards}: must be 1..{per_gpu - 1} (the policy's "
                             f"shards_per_gpu is {per_gpu}: a pack is less than a whole GPU)")
        ids = None
        if job_list is not None:  # given empty (an unset variable) is no list: not every job
            parts = [x.strip() for x in job_list.split(",") if x.strip()]
            if not parts or not all(x.isascii() and x.isdigit() and 0 < int(x) < 2 ** 32 for x in parts):
                raise HorusError(f"--jobs {job_list!r}: expected job ids like 12,15")
            ids = {int(x) for x in parts}
        if not dry_run and os.geteuid() != 0:
            # the hook's job_modify takes a shard update by any uid but root's (and policy
            # admin_uids') for a user's (raw_shards): a pack undone, an OOM rerun kept on shards
            raise HorusError("changing jobs needs root (the hook may treat another uid's updates "
                             "as a user's); --dry-run shows what a pass would do")
        if dry_run and not as_json:
            click.echo(f"slowdown_bound {policy_value('slowdown_bound', '2')} for the "
                       f"{policy_value('slowdown_tail', 'median')} job: under queue pressure, "
                       f"jobs up to {policy_util_limit(pack_shards):.1f} % predicted utilization pack")
        with _term_exits():
            failed = []

            def warn(msg: str) -> None:
                failed.append(msg)
                click.echo(f"horus-admin queue: warning: {msg}", err=True)

            def note(msg: str) -> None:  # nothing failed: Slurm's final word on a job
                click.echo(f"horus-admin queue: {msg}", err=True)

            def show(a) -> None:  # as each is done: a pass stopped later still says it
                if as_json:
                    click.echo(json.dumps({"job_id": a.job_id, "action": a.kind, "tres": a.tres,
                                           "dry_run": dry_run}))
                else:
                    click.echo(f"{'would ' if dry_run else ''}{a.kind} job {a.job_id} -> {a.tres}")
            while True:
                try:
                    with pass_lock(dry_run):
                        journal = _journal_path()  # a dry run only reads it: the jobs given up on
                        if not dry_run:
                            _adopt_legacy_journal(journal, warn)
                        tend(pack_shards=pack_shards, min_wait_s=min_wait, dry_run=dry_run, job_ids=ids,
                             on_error=warn, journal=journal, on_note=note, on_action=show)
                except HorusError as e:
                    if interval is None:
                        raise
                    warn(str(e))  # a loop outlives a pass that failed (slurmctld away, a full disk)
                except Exception as e:  # noqa: BLE001 - and one that met what it did not expect
                    if interval is None:
                        raise
                    warn(f"internal error: {type(e).__name__}: {str(e)[:200]}")
                if interval is None:
                    sys.exit(1 if failed else 0)
                failed.clear()
                time.sleep(interval)


@contextlib.contextmanager
def _term_exits():
    """SIGTERM (systemd's stop or timeout) ends the pass through its cleanups: a job held for
    its OOM rerun is released, not left held by a stopped pass.  The caller's handler is put
    back after: one left in a test process made a later multiprocessing pool hang at exit."""
    old = signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def pass_lock(dry_run: bool):
    """One changing pass at a time ($HORUS_QUEUE_LOCK, default /run/slurm-horus/queue.lock, in
    the probe's root-only run folder: a lock in a folder users can write, they could hold):
    two passes reading the queue before either acted requeued one job twice.  A dry run
    changes nothing and takes no lock."""
    from slurm_horus.errors import HorusError

    if dry_run:
        yield
        return
    path = _lock_path()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise HorusError(f"lock {path}: {e.strerror or e}") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise HorusError(f"lock {path} is not this user's: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HorusError(f"another horus-admin queue pass holds {path}: this pass skipped") from None
        yield
    finally:
        os.close(fd)


def _state_path(var: str, default: str) -> str:
    """$var, else ``default``: an absolute path (a relative one had named a file in whatever
    folder the pass ran from, and a lock there failed with 'No such file or directory')."""
    from slurm_horus.errors import HorusError

    path = os.environ.get(var) or default
    if not os.path.isabs(path):
        raise HorusError(f"{var}={path!r}: give an absolute path")
    return path


def _lock_path() -> str:
    return _state_path("HORUS_QUEUE_LOCK", "/run/slurm-horus/queue.lock")


def _adopt_legacy_journal(journal: str, warn) -> None:
    """Move the requeues a version before 2026-12-03 journaled beside the lock (in /run) into
    ``journal``, so that the first pass after an upgrade finishes them too; one that cannot be
    moved is set aside with a warning (as heal() sets aside a journal it cannot read), never
    stopping the passes."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger.requeue import journal_read, journal_set

    legacy = os.path.join(os.path.dirname(_lock_path()), "oom-requeues.json")
    if os.path.abspath(legacy) == os.path.abspath(journal) or not os.path.lexists(legacy):
        return
    try:
        entries = journal_read(legacy)
    except HorusError as e:
        aside = f"{legacy}.unreadable-{int(time.time())}"
        try:
            os.replace(legacy, aside)
        except OSError:
            aside = legacy
        warn(f"the journal an older version left cannot be read ({e}); check the jobs it "
             f"names ({aside}): release any still held")
        return
    try:
        have = journal_read(journal)
        for ref, entry in entries.items():
            if ref not in have:  # the newer entry of a job both name stays
                journal_set(journal, ref, entry)
        os.unlink(legacy)
    except (HorusError, OSError) as e:  # the new journal's trouble: heal() sets it aside
        warn(f"the journal an older version left ({legacy}) is not taken over yet: {e}")


def _journal_path() -> str:
    """The OOM requeues begun and not finished: on disk, not in /run beside the lock (a reboot
    mid-requeue had lost it, and its job waited held for an admin)."""
    return _state_path("HORUS_QUEUE_JOURNAL", "/var/lib/slurm-horus/oom-requeues.json")
