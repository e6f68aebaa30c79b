"""Creating, checking and migrating a ledger's schema, and keeping its views current.

Each migration step only adds what its version lacks to tables that exist; missing tables,
indices and the jobs rows come from schema.sql and refresh_jobs once all steps ran
(``_finish_migration``), so that the reflected tables, which describe the newest version, are
only used on a complete schema. Readers never migrate: they need the current version.
"""

from __future__ import annotations

import contextlib
import hashlib
import time

from slurm_horus.errors import HorusError
from slurm_horus.ledger.db import REFRESH_ADVICE, db_timeout, mask_url, upsert
from slurm_horus.ledger.jobs import refresh_jobs
from slurm_horus.ledger.schema import MYSQL_CHARSET, SCHEMA_VERSION, exec_script, schema_text, tables, views_text


def _inspect(conn):
    from sqlalchemy import inspect

    return inspect(conn)


def _add_columns(conn, table: str, cols: dict[str, str]) -> None:
    if table not in _inspect(conn).get_table_names():
        return
    have = {c["name"] for c in _inspect(conn).get_columns(table)}
    for name, typ in cols.items():
        if name not in have:
            conn.exec_driver_sql(f"ALTER TABLE `{table}` ADD COLUMN {name} {typ}")


def _drop_index(conn, table: str, name: str) -> None:
    """Drop an index that schema.sql now defines differently (it is recreated from there)."""
    if conn.dialect.name in ("mysql", "mariadb"):
        if table not in _inspect(conn).get_table_names():
            return  # a v1 ledger has no jobs table yet: schema.sql makes it, index and all
        if name in {i["name"] for i in _inspect(conn).get_indexes(table)}:
            conn.exec_driver_sql(f"DROP INDEX {name} ON {table}")
    else:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")


def _migrate_1_to_2(conn) -> None:
    """v1 had no placement columns in usage and no jobs/ledger_state tables."""
    _add_columns(conn, "usage", {"gpu_index": "INTEGER", "shards": "INTEGER", "colocated": "TEXT",
                                 "start_time": "BIGINT", "end_time": "BIGINT",
                                 "recorded": "BIGINT"})
    _add_columns(conn, "predictor_versions", {"promoted": "INTEGER NOT NULL DEFAULT 0"})


def _migrate_2_to_3(conn) -> None:
    """v3 stores each job's memory-error histogram bin, so hacct --summary reads an index."""
    _add_columns(conn, "jobs", {"mem_err_bucket": "INTEGER"})


def _migrate_3_to_4(conn) -> None:
    """v4: whole GPUs apart from shards, the under-claim audit, the job owner's uid."""
    _add_columns(conn, "usage", {"gpus": "INTEGER"})
    _add_columns(conn, "jobs", {"gpus": "INTEGER", "pred_mem_p90_mib": "DOUBLE PRECISION",
                                "under_claim": "INTEGER", "claim_flags": "VARCHAR(16)"})
    _add_columns(conn, "submissions", {"uid": "BIGINT"})
    _drop_index(conn, "jobs", "ix_jobs_accuracy")  # replaced by ix_jobs_summary


def _migrate_4_to_5(conn) -> None:
    """v5 flags failed measurements; the summary's covering index gains the flag and the p90."""
    _add_columns(conn, "jobs", {"failed_measurement": "INTEGER"})
    _drop_index(conn, "jobs", "ix_jobs_summary")


def _migrate_5_to_6(conn) -> None:
    """v6 stores the per-job terms hacct --summary adds up (jobs.accuracy_terms); the summary's
    covering index holds them instead of the raw predicted and actual values."""
    _add_columns(conn, "jobs", {"predictor_source": "VARCHAR(64)", "measured": "INTEGER",
                                "util_abs_err_pp": "DOUBLE PRECISION",
                                "util_sq_log_err": "DOUBLE PRECISION",
                                "mem_sq_log_err": "DOUBLE PRECISION", "within_p90": "INTEGER",
                                "far": "INTEGER"})
    _drop_index(conn, "jobs", "ix_jobs_summary")


def _migrate_6_to_7(conn) -> None:
    """v7 records what the scheduler layer did to each job (the hook's decision, horus-admin
    queue's actions); the rows are filled from the stored AdminComment when the jobs are merged
    again (``_finish_migration``)."""
    _add_columns(conn, "jobs", {"hook_action": "VARCHAR(16)", "hook_reason": "VARCHAR(16)",
                                "queue_actions": "VARCHAR(255)"})


def _migrate_7_to_8(conn) -> None:
    """v8 shows a multi-GPU job's measured figures per GPU, as its prediction and claim are
    (the probe and sacct sum its GPUs): no new column, every jobs row merged again
    (``_finish_migration``)."""


def _migrate_8_to_9(conn) -> None:
    """v9 keeps an array task's ArrayJobId, so hacct -j ARRAYID lists its tasks as sacct does
    (rows synced before stay without it: sync them again to fill it), and a MySQL/MariaDB
    ledger's tables hold any text (utf8mb4; schema.exec_script)."""
    _add_columns(conn, "usage", {"array_job_id": "BIGINT"})
    _add_columns(conn, "jobs", {"array_job_id": "BIGINT"})
    if conn.dialect.name in ("mysql", "mariadb"):
        for t in set(_inspect(conn).get_table_names()) & set(tables()):
            conn.exec_driver_sql(f"ALTER TABLE `{t}` CONVERT TO {MYSQL_CHARSET}")


def _migrate_9_to_10(conn) -> None:
    """v10 keeps an array task's ArrayTaskId beside its ArrayJobId: hacct's rows of an array's
    tasks had said which array, never which task (rows synced before stay without it: sync
    them again to fill it)."""
    _add_columns(conn, "usage", {"array_task_id": "BIGINT"})
    _add_columns(conn, "jobs", {"array_task_id": "BIGINT"})


def _migrate_10_to_11(conn) -> None:
    """v11 keeps a heterogeneous job component's HetJobId and HetJobOffset from accounting:
    hacct's JobID shows it as sacct's HETJOB+OFFSET (it had shown the component's own id, and
    nothing said which job it was part of) and -j HETJOB lists its components from the ledger
    (rows synced before stay without them: sync them again to fill them); the index comes from
    schema.sql."""
    _add_columns(conn, "usage", {"het_job_id": "BIGINT", "het_job_offset": "BIGINT"})
    _add_columns(conn, "jobs", {"het_job_id": "BIGINT", "het_job_offset": "BIGINT"})


MIGRATIONS = {2: _migrate_1_to_2, 3: _migrate_2_to_3, 4: _migrate_3_to_4, 5: _migrate_4_to_5,
              6: _migrate_5_to_6, 7: _migrate_6_to_7, 8: _migrate_7_to_8, 9: _migrate_8_to_9,
              10: _migrate_9_to_10, 11: _migrate_10_to_11}


def _finish_migration(conn) -> None:
    """New tables and indices, then every jobs row merged again under the new rules."""
    exec_script(conn, schema_text())
    keys = [(r[0], r[1]) for r in conn.exec_driver_sql(
        "SELECT cluster, job_id FROM submissions UNION SELECT cluster, job_id FROM `usage`")]
    refresh_jobs(conn, keys)


def _version(conn, names) -> int:
    if "schema_version" not in names:
        return 1
    v = conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").scalar()
    return int(v or 1)


def _too_new(url: str, version: int) -> HorusError:
    return HorusError(f"ledger {mask_url(url)}: schema version {version} is newer than this "
                      f"slurm-horus ({SCHEMA_VERSION}); upgrade slurm-horus")


def _views_sha() -> str:
    return hashlib.sha256(views_text().encode()).hexdigest()[:16]


def _create_views(conn) -> None:
    exec_script(conn, views_text())
    upsert(conn, tables()["ledger_state"], [{"name": "views_sha", "value": _views_sha()}],
           ("name",))


# the MariaDB/MySQL lock one creator or migrator of a database holds (a name is server-wide)
SETUP_LOCK = "LEFT(CONCAT('slurm-horus setup ', DATABASE()), 64)"


def setup(conn, url: str) -> None:
    """Create the schema in an empty database, or migrate an older one to SCHEMA_VERSION; and
    recreate the views when views.sql changed."""
    with _setup_lock(conn, url):
        _setup(conn, url)


@contextlib.contextmanager
def _setup_lock(conn, url: str):
    """One creator or migrator at a time on MariaDB/MySQL, where each DDL statement commits:
    the first writers after an upgrade (every GPU node's probe at its job's end) all read the
    old version, and all but one failed on a duplicate column or version row.  SQLite's BEGIN
    IMMEDIATE already queues them.  The wait stays half a second or more within the
    connection's read timeout (whole seconds: MySQL rounds a fraction), else a short timeout
    (HORUS_DB_TIMEOUT=1) lost the connection instead of saying why."""
    if conn.dialect.name not in ("mysql", "mariadb"):
        yield
        return
    wait = max(int(db_timeout() - 0.5), 0)
    database, got = conn.exec_driver_sql(f"SELECT DATABASE(), GET_LOCK({SETUP_LOCK}, {wait})").one()
    if database is None:  # no lock name (NULL), and no schema to set up: not another's doing
        raise HorusError(f"ledger {mask_url(url)}: the URL names no database (.../DBNAME)")
    if got != 1:
        raise HorusError(f"ledger {mask_url(url)}: another process is creating or migrating it "
                         f"(waited {wait} s); try again")
    try:
        yield
    finally:
        try:
            conn.exec_driver_sql(f"SELECT RELEASE_LOCK({SETUP_LOCK})")
        except Exception:  # the session is gone, and its lock with it, or it must go
            conn.invalidate()


def _setup(conn, url: str) -> None:
    t = tables()
    names = set(_inspect(conn).get_table_names())
    if "schema_version" not in names and "submissions" not in names:
        exec_script(conn, schema_text())
        conn.execute(t["schema_version"].insert(),
                     [{"version": SCHEMA_VERSION, "applied": int(time.time())}])
        _create_views(conn)
        return
    version = _version(conn, names)
    if version > SCHEMA_VERSION:
        raise _too_new(url, version)
    if version < SCHEMA_VERSION:
        for v in range(version + 1, SCHEMA_VERSION + 1):
            MIGRATIONS[v](conn)
        _finish_migration(conn)
        _create_views(conn)
        # the new versions last: on MariaDB/MySQL each DDL statement commits what came before,
        # and a migration killed in refresh_jobs had left a ledger at the new version without
        # its jobs rows; killed anywhere, it now runs again (each step adds only what is missing)
        conn.execute(t["schema_version"].insert(),
                     [{"version": v, "applied": int(time.time())}
                      for v in range(version + 1, SCHEMA_VERSION + 1)])
    elif conn.exec_driver_sql(
            "SELECT value FROM ledger_state WHERE name = 'views_sha'").scalar() != _views_sha():
        _create_views(conn)


def check_readable(conn, url: str) -> None:
    """A reader needs a ledger at this schema version: it cannot create or migrate one."""
    names = set(_inspect(conn).get_table_names())
    if "jobs" not in names:
        raise HorusError(f"ledger {mask_url(url)}: no ledger tables yet; {REFRESH_ADVICE}")
    version = _version(conn, names)
    if version < SCHEMA_VERSION:
        raise HorusError(f"ledger {mask_url(url)}: schema version {version} is older than this "
                         f"slurm-horus ({SCHEMA_VERSION}); {REFRESH_ADVICE}")
    if version > SCHEMA_VERSION:
        raise _too_new(url, version)
