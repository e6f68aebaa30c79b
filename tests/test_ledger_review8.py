"""Review 8 of the ledger: a password in a URL SQLAlchemy cannot parse stays hidden, an open
under a held lock waits the busy timeout once, a migration killed midway runs again without
losing a job (MariaDB commits at each DDL statement), and doctor says when it could not read
the ledger rather than finding nothing."""

import os
import sqlite3
import time

import pytest
from click.testing import CliRunner

from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger
from slurm_horus.ledger import migrate
from slurm_horus.ledger.schema import SCHEMA_VERSION

from test_ledger import V1_DDL, _mariadb_url

BAD_PORT = "mysql+pymysql://u:s3cret@127.0.0.1:notaport/x"


def test_a_url_that_does_not_parse_never_shows_its_password(tmp_path):
    from slurm_horus.cli.admin import main
    from slurm_horus.doctor import check_ledger

    with pytest.raises(HorusError) as e:
        Ledger(BAD_PORT)
    assert "s3cret" not in str(e.value) and "127.0.0.1:notaport/x" in str(e.value)
    (p,) = check_ledger(BAD_PORT)
    assert "s3cret" not in p.what
    r = CliRunner().invoke(main, ["sync", "--ledger", BAD_PORT, "--from-file", os.devnull])
    assert r.exit_code != 0 and "not a database URL" in r.output and "s3cret" not in r.output


def test_an_open_under_a_held_lock_waits_the_busy_timeout_once(tmp_path):
    """PRAGMA journal_mode waited the busy timeout for a writer's lock, then BEGIN IMMEDIATE
    waited it again: the probe's 10 s were 20."""
    db = tmp_path / "l.db"
    Ledger(f"sqlite:///{db}").close()
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    t0 = time.monotonic()
    with pytest.raises(HorusError, match="locked"):
        Ledger(f"sqlite:///{db}", busy_timeout=1.0)
    assert time.monotonic() - t0 < 1.7
    con.execute("ROLLBACK")
    con.execute("PRAGMA journal_mode = WAL")
    con.close()
    Ledger(f"sqlite:///{db}").close()  # uncontended, a WAL ledger is still made a journal's
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def _v1_ledger(url: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        for stmt in V1_DDL.replace("CREATE TABLE usage", "CREATE TABLE `usage`").split(";"):
            if stmt.strip():
                conn.exec_driver_sql(stmt)
        conn.exec_driver_sql("INSERT INTO `usage` VALUES ('c', 3, 'sacct', 70, 99, 2000, 60, "
                             "'COMPLETED', 'n', 'a100')")
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("mariadb", marks=pytest.mark.cluster)])
@pytest.mark.parametrize("where", ["_migrate_10_to_11", "refresh_jobs", "_create_views"])
def test_a_migration_killed_midway_runs_again_and_loses_no_job(tmp_path, monkeypatch, backend, where):
    """On MariaDB each DDL statement commits: a migration killed while it merged the jobs rows
    again had left a ledger at the new version without them (hacct, the audit and retrain saw
    no job), and the next open did not finish it."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/old.db"
    else:
        pytest.importorskip("pymysql")
        url = _mariadb_url("horus_test_resume", "DROP DATABASE IF EXISTS horus_test_resume; ")
        if url is None:
            pytest.skip("the local cluster's MariaDB is not running (tests/cluster/up)")
    _v1_ledger(url)

    def killed(*args):
        raise KeyboardInterrupt  # what the step had done stays, as after a kill -9

    real = getattr(migrate, where)
    monkeypatch.setattr(migrate, where, killed)
    if where == "_migrate_10_to_11":
        monkeypatch.setitem(migrate.MIGRATIONS, 11, killed)
    with pytest.raises(KeyboardInterrupt):
        Ledger(url)
    monkeypatch.setattr(migrate, where, real)
    monkeypatch.setitem(migrate.MIGRATIONS, 11, migrate._migrate_10_to_11)
    L = Ledger(url)
    try:
        assert L.schema_version() == SCHEMA_VERSION
        assert [(r["job_id"], r["gpu_type"], r["act_util_pct"]) for r in L.jobs()] == [(3, "a100", 70)]
        assert L.get_state("views_sha") is not None
    finally:
        L.close()


def test_doctor_that_cannot_read_the_ledger_says_so(tmp_path, monkeypatch):
    """Run by an admin who is not root, doctor had found nothing wrong with a ledger it could
    not open: no schema, a newer version, a corrupt file all read as 'no problems found'."""
    from slurm_horus.doctor import check_ledger

    db = tmp_path / "l.db"
    db.write_bytes(bytes(range(256)) * 20)  # not a database at all
    os.chmod(db, 0o640)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)
    (p,) = check_ledger(f"sqlite:///{db}")
    assert "was not checked" in p.what and "as root" in p.fix


def test_doctor_that_cannot_look_at_a_trusted_path_says_so(tmp_path, monkeypatch):
    """A file or folder doctor could not stat (a folder on the way this user cannot search) had
    passed as sound: no problem, exit 0."""
    from pathlib import Path

    from slurm_horus import doctor

    target = tmp_path / "models"
    target.mkdir()
    real_stat = Path.stat

    def stat(self, *a, **kw):
        if self == target:
            raise PermissionError(13, "Permission denied")
        return real_stat(self, *a, **kw)

    monkeypatch.setattr(Path, "stat", stat)
    (problem,) = doctor._trusted(target, "the model registry")
    assert "was not checked: Permission denied" in problem.what and "as root" in problem.fix
    assert doctor._trusted(tmp_path / "absent", "the model registry") == []
