"""The ledger, where predictions meet measured use: ``Ledger`` and the probe's never-raising writer.

SQLAlchemy Core over any database URL (see db.py). Only the site writes the ledger:
``horus-admin sync`` (from sacct) and horus-probe run as root. Users read it
(``Ledger(url, readonly=True)``; extracts.open_reader). The probe's writes never raise:
``record_usage_safely`` falls back to the root-only spool (spool.py) that the next write or
``horus-admin sync`` replays. Every write is an upsert keyed by (cluster, job id[, source]) and
rebuilds the job's merged row (jobs.py), so replaying twice, or syncing the same window
again, counts nothing twice. The schema is sql/schema.sql (schema.py, migrate.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from itertools import islice
from typing import Any, Iterable, Iterator

from slurm_horus.errors import HorusError
from slurm_horus.ledger.db import (BUSY_TIMEOUT_S, _within_lengths, default_url, failure_reason,
                                   make_engine, mask_url, sqlite_file, upsert)
from slurm_horus.ledger.jobs import job_filters, refresh_jobs
from slurm_horus.ledger.migrate import check_readable, setup
from slurm_horus.ledger.records import submission_record, usage_record
from slurm_horus.ledger.schema import tables
from slurm_horus.ledger.spool import Spool


class Ledger:
    """The job ledger. ``Ledger()`` opens $HORUS_LEDGER_URL or the site default, creating or
    migrating the schema as needed (the site's writers). ``Ledger(url, readonly=True)`` is for
    readers such as hacct: SQLite opened ``mode=ro``, nothing created, migrated or written."""

    def __init__(self, url: str | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S,
                 spool: Spool | str | None = None, replay: bool = True, readonly: bool = False):
        self.url = url or default_url()
        self.readonly = readonly
        self.spool = spool if isinstance(spool, Spool) else Spool(spool)
        self._replay = replay and not readonly
        path = sqlite_file(self.url)
        try:  # made by this open (or left empty by a failed one): see unproven()
            made = not readonly and path is not None and (not path.exists() or path.stat().st_size == 0)
        except OSError:
            made = False  # what cannot be looked at, make_engine says
        self.engine = make_engine(self.url, busy_timeout, readonly)
        from sqlalchemy.exc import DBAPIError

        try:
            if readonly:
                with self.engine.connect() as conn:
                    check_readable(conn, self.url)
            else:
                with self.engine.begin() as conn:
                    setup(conn, self.url)
        except DBAPIError as e:  # unreachable server, bad credentials, unwritable file, ...
            self.engine.dispose()
            raise HorusError(f"ledger {mask_url(self.url)}: cannot open it ({failure_reason(e)})") \
                from None
        except HorusError:
            self.engine.dispose()
            raise
        if made:
            self.set_state("made", str(int(time.time())))

    def sqlite_path(self) -> Path | None:
        """The database file of a SQLite ledger (None for a server)."""
        return sqlite_file(self.url)

    def writable(self) -> bool:
        """Whether this process may write the ledger: root, or write access to a SQLite file
        (a server's grants are not known: False)."""
        if self.readonly:
            path = self.sqlite_path()
            return os.geteuid() == 0 or (path is not None and os.access(path, os.W_OK))
        return True

    def check_writable(self) -> None:
        """HorusError unless this process may write the ledger: a row inserted and updated, then
        rolled back, needs what an upsert does (a server's INSERT and UPDATE grants; for SQLite
        write access to the file and, for its journal, the folder: a write that changes no page
        needs neither).  retrain asks before it trains and promotes, not after (it promoted,
        then failed to record it)."""
        from sqlalchemy import insert, update
        from sqlalchemy.exc import DBAPIError

        if self.readonly:
            raise HorusError(f"ledger {mask_url(self.url)}: opened read-only")
        t = tables()["predictor_versions"]
        probe = "horus-write-check"
        try:
            with self.engine.connect() as conn:
                trans = conn.begin()
                try:
                    conn.execute(insert(t).values(version=probe, created=0, n_rows=0, promoted=0))
                    conn.execute(update(t).where(t.c.version == probe).values(n_rows=1))
                finally:
                    trans.rollback()
        except DBAPIError as e:
            raise HorusError(f"ledger {mask_url(self.url)}: cannot write ({failure_reason(e)})") from None

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").scalar())

    # --- writing -------------------------------------------------------------------------

    def _apply(self, kind: str, data: dict) -> None:
        """One spooled record, validated again: the file may be old, damaged or edited."""
        if kind != "usage":
            raise HorusError(f"unknown spooled record kind {kind!r}")
        if not isinstance(data, dict):
            raise HorusError("spooled record data is not an object")
        self._write([], [usage_record(**data)])

    def _after_write(self) -> None:
        if self._replay and self.spool.pending():
            try:
                self.spool.replay(self)
            except Exception:
                pass  # stays spooled; horus-admin sync retries

    def record_submission(self, *, job_id: int, cluster: str = "", user: str | None = None,
                          account: str | None = None, submit_time: float | None = None,
                          model_path: str | None = None, model_sha256: str | None = None,
                          model_family: str | None = None, feature_version: int | None = None,
                          features: dict | None = None, workload: dict | None = None,
                          gpu_types: list | None = None, predictions: dict | None = None,
                          hint: str | None = None, policy_decision: Any = None,
                          predictor: str | None = None, uid: int | None = None) -> None:
        """Store (or replace) one submission. Raises on database errors."""
        rec = submission_record(**{k: v for k, v in locals().items() if k != "self"})
        self._write([rec], [])
        self._after_write()

    def record_usage(self, *, job_id: int, source: str, cluster: str = "", **fields) -> None:
        """Store (or replace) one measurement of a job from ``source``."""
        rec = usage_record(job_id=job_id, source=source, cluster=cluster, **fields)
        self._write([], [rec])
        self._after_write()

    def record_runs(self, submissions: list[dict], usages: list[dict]) -> None:
        """Sync's and import's write: the submissions and usage rows of a batch in one
        transaction, so each job's row is rebuilt once (not once per table) and a failed write
        leaves neither half."""
        self._write([submission_record(**r) for r in submissions], [usage_record(**r) for r in usages])

    def _write(self, subs: list[dict], uses: list[dict]) -> None:
        t = tables()
        with self.engine.begin() as conn:
            if subs:
                upsert(conn, t["submissions"], subs, ("cluster", "job_id"))
            if uses:
                upsert(conn, t["usage"], [r for r in uses if r["source"] != "probe"],
                       ("cluster", "job_id", "source"))
                _upsert_probe_runs(conn, [r for r in uses if r["source"] == "probe"])
            refresh_jobs(conn, [(r["cluster"], r["job_id"]) for r in (*subs, *uses)])

    def set_state(self, name: str, value: str) -> None:
        with self.engine.begin() as conn:
            upsert(conn, tables()["ledger_state"], [{"name": name, "value": value}], ("name",))

    def unproven(self, what: str) -> bool:
        """Whether this SQLite ledger was made by a command of this package and has not yet
        written ``what`` (``published``: the claim record; ``history``: history.json): until
        then it must not replace the site's ones, which a mistyped --ledger's new ledger would
        (erasing every under-claim and measured run, at every pass of a scrontab line)."""
        return self.get_state("made") is not None and self.get_state(what) is None

    def get_state(self, name: str) -> str | None:
        from sqlalchemy import select

        t = tables()["ledger_state"]
        with self.engine.connect() as conn:
            return conn.execute(select(t.c.value).where(t.c.name == name)).scalar()

    def record_predictor_version(self, version: str, metrics: dict, n_rows: int,
                                 promoted: bool) -> None:
        with self.engine.begin() as conn:
            upsert(conn, tables()["predictor_versions"],
                   [{"version": version, "created": int(time.time()),
                     "metrics": json.dumps(metrics, default=str), "n_rows": int(n_rows),
                     "promoted": int(bool(promoted))}], ("version",))

    # --- reading -------------------------------------------------------------------------

    def under_claims(self, since: float) -> list[dict]:
        """Per user (name, uid) and account: jobs ending (or submitted) since ``since`` whose
        claim was checked against a trusted measurement, and how many of them under-claimed.
        What ``horus-admin sync`` writes into the hook's record file."""
        from sqlalchemy import and_, case, func, select

        t = tables()
        j, s = t["jobs"], t["submissions"]
        stmt = (select(j.c.user_name, s.c.uid, j.c.account,
                       func.sum(case((j.c.under_claim == 1, 1), else_=0)).label("under_claims"),
                       func.count().label("jobs"))
                .select_from(j.outerjoin(s, and_(s.c.cluster == j.c.cluster,
                                                 s.c.job_id == j.c.job_id)))
                .where(j.c.under_claim.isnot(None),
                       func.coalesce(j.c.end_time, j.c.submit_time) >= int(since))
                .group_by(j.c.user_name, s.c.uid, j.c.account)
                .order_by(j.c.user_name, j.c.account))
        with self.engine.connect() as conn:
            return [{"user_name": r.user_name, "uid": None if r.uid is None else int(r.uid),
                     "account": r.account, "under_claims": int(r.under_claims or 0),
                     "jobs": int(r.jobs)} for r in conn.execute(stmt)]

    def model_shas(self, cluster: str, job_ids: list[int]) -> dict[int, str]:
        """{job id: model sha256} of these submissions that have one."""
        from sqlalchemy import select

        t = tables()["submissions"]
        found: dict[int, str] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(job_ids), 900):
                chunk = job_ids[i:i + 900]
                found |= {int(r[0]): r[1] for r in conn.execute(
                    select(t.c.job_id, t.c.model_sha256).where(
                        t.c.cluster == cluster, t.c.job_id.in_(chunk), t.c.model_sha256.isnot(None)))}
        return found

    def jobs(self, *, job_ids: Iterable[int] | None = None, task_ids: Iterable[int] | None = None,
             users: Iterable[str] | None = None,
             accounts: Iterable[str] | None = None, states: Iterable[str] | None = None,
             start: float | None = None, end: float | None = None, cluster: str | None = None,
             submitted_only: bool = False, under_claims: bool = False,
             limit: int | None = None) -> list[dict]:
        """Jobs (submission joined with the best measurement), oldest first, as dicts."""
        rows = self.iter_jobs(job_ids=job_ids, task_ids=task_ids, users=users, accounts=accounts, states=states,
                              start=start, end=end, cluster=cluster, submitted_only=submitted_only,
                              under_claims=under_claims)
        return list(rows if not limit else islice(rows, limit))

    def iter_jobs(self, *, chunk: int = 5000, **filters) -> Iterator[dict]:
        """Ledger.jobs' rows one by one, read ``chunk`` at a time in short transactions: a
        million jobs take what a chunk takes, and a slow reader (hacct | less) holds no SQLite
        lock writers wait on.  Each chunk starts after the last one's sort key (jobs without a
        submit time first, by cluster and id, then by submit time, cluster and id), through the
        primary key and the submit-time index: no chunk sorts the table."""
        from sqlalchemy import and_, or_, select, tuple_

        j = tables()["jobs"]
        base = job_filters(select(j), **filters)
        unsubmitted = base.where(j.c.submit_time.is_(None)).order_by(j.c.cluster, j.c.job_id).limit(chunk)
        submitted = base.where(j.c.submit_time.isnot(None)).order_by(
            j.c.submit_time, j.c.cluster, j.c.job_id).limit(chunk)
        last = None
        while True:  # no submit time (a probe's row before sync): by (cluster, job id)
            q = unsubmitted if last is None else unsubmitted.where(
                tuple_(j.c.cluster, j.c.job_id) > tuple_(*last))
            rows = self._rows(q)
            yield from rows
            if len(rows) < chunk:
                break
            last = (rows[-1]["cluster"], rows[-1]["job_id"])
        last = None
        while True:
            q = submitted if last is None else submitted.where(
                j.c.submit_time >= last[0],  # the index's range; the rest orders ties
                or_(j.c.submit_time > last[0],
                    and_(j.c.submit_time == last[0], tuple_(j.c.cluster, j.c.job_id) > tuple_(*last[1:]))))
            rows = self._rows(q)
            yield from rows
            if len(rows) < chunk:
                return
            r = rows[-1]
            last = (r["submit_time"], r["cluster"], r["job_id"])

    def _rows(self, stmt) -> list[dict]:
        with self.engine.connect() as conn:
            return [r._asdict() for r in conn.execute(stmt)]

    def submission(self, cluster: str, job_id: int) -> dict | None:
        from sqlalchemy import select

        t = tables()["submissions"]
        with self.engine.connect() as conn:
            r = conn.execute(select(t).where(t.c.cluster == cluster, t.c.job_id == int(job_id))).first()
        return r._asdict() if r else None

    def usage(self, cluster: str, job_id: int) -> dict[str, dict]:
        from sqlalchemy import select

        t = tables()["usage"]
        with self.engine.connect() as conn:
            return {r.source: r._asdict() for r in conn.execute(
                select(t).where(t.c.cluster == cluster, t.c.job_id == int(job_id)))}

    def predictor_versions(self) -> list[dict]:
        from sqlalchemy import select

        t = tables()["predictor_versions"]
        with self.engine.connect() as conn:
            return [r._asdict() for r in conn.execute(select(t).order_by(t.c.version))]

    def clusters(self) -> list[str]:
        """The clusters the ledger holds jobs of."""
        from sqlalchemy import select

        j = tables()["jobs"]
        with self.engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(select(j.c.cluster).distinct()) if r[0] is not None)

    def count(self, table: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql(
                f"SELECT COUNT(*) FROM {'`usage`' if table == 'usage' else table}").scalar())

    def close(self) -> None:
        self.engine.dispose()


def _upsert_probe_runs(conn, rows: list[dict]) -> None:
    """Upsert probe rows (one row per job: cluster, job id, "probe"), each new record against
    the stored row by the runs they measured, from their start and end times:

    - a later run (it started after the stored one ended, or in that second: a requeued job's
      rerun), or a record or row without a start time, replaces the row (without end times,
      the later start wins);
    - an earlier run (it ended before the stored one started, or in that second: a spooled
      record of a requeued job's first run, replayed after the rerun's own was written) never
      replaces it;
    - the same run (their times overlap: a multi-node job's probe on another node; the same
      record replayed) is combined into the row: each of utilization mean and peak and memory
      peak the larger per GPU of the two (the row's figures stay sums over its ``gpus``, the
      new record's scaled to them), the run's span (earliest start, latest end, longest
      elapsed), the stored placement.  The job's measured use is its heaviest node's, whatever
      order the nodes' Prologs started in (without PrologFlags=Alloc a node's Prolog runs at its
      first step, and the later-started node's record had replaced the batch node's: a user
      picked which node the audit saw).  A record replayed twice stays the one row.

    The rule is the write's own condition (SQLite: ON CONFLICT DO UPDATE ... WHERE; MariaDB:
    each ON DUPLICATE KEY UPDATE value a CASE on it), so the database decides it on the row it
    holds locked (read first, then written, two writers of one job on InnoDB had both read
    "none" or "older", and the earlier run won).  Where no row exists yet, the second insert
    of the key waits on the first's record lock, then takes the update branch against the
    committed row: no locking read (FOR UPDATE) comes first, whose gap locks on the missing
    row both writers would hold and both inserts then deadlock on.  SQLite's BEGIN IMMEDIATE
    serialises writers anyway.  The wait is bounded as every statement's is: the busy
    timeout, or the server connection's read timeout (db.db_timeout)."""
    if not rows:
        return
    u = tables()["usage"]
    rows = _within_lengths(u, rows)
    keys = ("cluster", "job_id", "source")
    cols = [c for c in rows[0] if c not in keys]
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        stmt = insert(u)
        replace, merge, values = _probe_run_values(u, stmt.excluded, cols)
        stmt = stmt.on_conflict_do_update(index_elements=list(keys), set_=dict(values),
                                          where=replace | merge)
    else:  # MariaDB/MySQL: the only servers make_engine opens
        from sqlalchemy.dialects.mysql import insert

        stmt = insert(u)
        _, _, values = _probe_run_values(u, stmt.inserted, cols)
        stmt = stmt.on_duplicate_key_update(values)
    for i in range(0, len(rows), 5000):
        conn.execute(stmt, rows[i:i + 5000])


# what _probe_run_values decides by: assigned last, in this order (below)
_RUN_COLUMNS = ("gpus", "start_time", "end_time")
_PEAKS = ("util_mean", "util_max", "mem_peak_mib")  # per GPU, the larger of the same run's


def _probe_run_values(u, new, cols: list[str]):
    """(replace, merge, [(column, value)]) of _upsert_probe_runs: the conditions on the stored
    row ``u`` and the new record ``new``, and each column's value: the new one where it
    replaces, the combination where the same run is merged, the stored one otherwise.

    Ordered for MariaDB, which assigns ON DUPLICATE KEY UPDATE's values left to right, each
    later one reading the row as the earlier ones left it (SQLite reads the stored row for
    all): the figures first (they read gpus, start_time, end_time), then gpus, start_time and
    end_time last, whose own conditions give the same answer on the row as start_time's value
    left it (replace: start_time the new one; merge: the earlier of the two, still within the
    new record's span; only a stored row with an end and no start, which no probe writes, may
    keep its later end).  Checked on MariaDB 10.11 (tests/test_ledger.py's probe race)."""
    from sqlalchemy import and_, case, func, literal_column, or_

    s0, s1, n0, n1 = u.c.start_time, u.c.end_time, new.start_time, new.end_time
    ends = and_(s1.isnot(None), n1.isnot(None))
    # a run that starts in the second the stored one ended is a later run (a requeue's rerun),
    # one that ended in the second the stored one started an earlier: the runs of one job on
    # several nodes overlap
    replace = or_(n0.is_(None), s0.is_(None),
                  and_(ends, s1 <= n0),                   # a later run
                  and_(~ends, s0 <= n0))                  # no end to tell by: the later start
    merge = and_(n0.isnot(None), s0.isnot(None), ends, s1 > n0, n1 > s0)  # the same run
    one = literal_column("1")  # no bound parameter: pymysql's many-row insert fills none in the UPDATE

    def per(g):  # the GPUs a figure is a sum over (none given: one, as merge_job divides)
        return case((g >= one, g), else_=one)
    ug, ng = per(u.c.gpus), per(new.gpus)

    def combined(c: str):
        if c in _PEAKS:  # the new figure where it is the larger per GPU, scaled to the row's GPUs
            heavier = and_(new[c].isnot(None), or_(u.c[c].is_(None), new[c] * ug > u.c[c] * ng))
            scaled = case((ug == ng, new[c]), else_=new[c] * ug / ng)
            return case((heavier, scaled), else_=u.c[c])
        if c == "elapsed_s":
            return case((and_(new[c].isnot(None), or_(u.c[c].is_(None), new[c] > u.c[c])), new[c]),
                        else_=u.c[c])
        if c == "start_time":
            return case((n0 < s0, n0), else_=s0)
        if c == "end_time":
            return case((n1 > s1, n1), else_=s1)
        if c == "recorded":
            return new[c]
        if c == "gpus":  # the row's figures are sums over its GPUs: its count stays
            return u.c[c]
        return func.coalesce(u.c[c], new[c])  # placement: the stored row's, else the new one's

    order = [c for c in cols if c not in _RUN_COLUMNS] + [c for c in _RUN_COLUMNS if c in cols]
    values = [(c, case((replace, new[c]), (merge, combined(c)), else_=u.c[c])) for c in order]
    return replace, merge, values


def record_usage_safely(*, url: str | None = None, spool: str | None = None,
                        timeout: float = 10.0, spool_ok: bool = True, **kwargs) -> bool:
    """record_usage for horus-probe: never raises. True if written, False if spooled (or, where
    ``spool_ok`` is False because the folder failed its check, lost)."""
    try:
        data = usage_record(**kwargs)
    except Exception:
        return False
    try:
        path = sqlite_file(url or default_url())
        if path is not None and not path.exists():
            # a GPU node without the site's ledger (the default path, or a mount that is not
            # there): making an empty one here would keep the record from ever reaching it
            raise HorusError(f"ledger {path}: not found")
        ledger = Ledger(url, busy_timeout=timeout, spool=spool)
        try:
            ledger._apply("usage", data)
            ledger._after_write()
        finally:
            ledger.close()
        return True
    except BaseException as e:  # noqa: BLE001 - the job's epilog must never fail here
        if isinstance(e, KeyboardInterrupt):
            raise
        try:
            if not spool_ok:
                raise HorusError(f"spool {spool} failed its check")
            Spool(spool).put("usage", data)
        except Exception as e2:
            try:
                sys.stderr.write(f"slurm-horus: warning: ledger record lost ({e2})\n")
            except Exception:
                pass
        return False
