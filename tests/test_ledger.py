"""Ledger: schema, views, upserts, migration, spool, concurrency, MariaDB."""

import json
import multiprocessing as mp
import os
import sqlite3
import subprocess

import pytest

from slurm_horus.ledger import (SCHEMA_VERSION, Ledger, Spool, record_submission_safely,
                                record_usage_safely)

PRED = {"a100": {"util_pct": 50.0, "mem_mib": 1000.0, "mem_mib_p90": 1200.0,
                 "predictor": "cold-start"}}


def _url(tmp_path):
    return f"sqlite:///{tmp_path}/ledger.db"


def test_submission_usage_merge_and_views(tmp_path):
    L = Ledger(_url(tmp_path), spool=str(tmp_path / "spool"))
    L.record_submission(job_id=7, cluster="c", user="u", model_path="/m/resnet50.onnx",
                        predictions=PRED, features={"flops": 1}, workload={"batch_size": 8})
    L.record_usage(job_id=7, cluster="c", source="sacct", state="COMPLETED", node="n1",
                   shards=30, elapsed_s=60, util_mean=20, mem_peak_mib=900)
    L.record_usage(job_id=7, cluster="c", source="probe", util_mean=40, util_max=95,
                   mem_peak_mib=1500)
    L.record_usage(job_id=7, cluster="c", source="probe", util_mean=41, util_max=95,
                   mem_peak_mib=1500)  # replaces, never adds
    assert L.count("usage") == 2
    (job,) = L.jobs()
    assert job["model_family"] == "resnet50" and job["gpu_type"] == "a100"
    assert job["act_util_pct"] == 41 and job["act_mem_mib"] == 1500  # probe wins
    assert job["node"] == "n1" and job["shards"] == 30 and job["sources"] == "sacct,probe"
    assert job["pred_util_pct"] == 50 and job["pred_mem_mib"] == 1000
    con = sqlite3.connect(tmp_path / "ledger.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    fam = con.execute("SELECT model_family, jobs, util_mae_pp, mem_underpredicted_20pct "
                      "FROM v_accuracy_by_family").fetchall()
    assert fam == [("resnet50", 1, 9.0, 1)]
    for v in ("v_accuracy_by_gpu_type", "v_accuracy_by_user", "v_gpu_util_daily", "v_job_errors"):
        con.execute(f"SELECT * FROM {v}").fetchall()
    assert L.schema_version() == SCHEMA_VERSION


def test_bad_source_and_url(tmp_path):
    from slurm_horus.errors import HorusError

    L = Ledger(_url(tmp_path))
    with pytest.raises(HorusError):
        L.record_usage(job_id=1, source="guess")
    with pytest.raises(HorusError):
        Ledger("no such url")


V1_DDL = """
CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY, applied BIGINT NOT NULL);
CREATE TABLE submissions (cluster VARCHAR(64) NOT NULL, job_id BIGINT NOT NULL, user_name VARCHAR(64),
  account VARCHAR(64), submit_time BIGINT, model_path TEXT, model_sha256 VARCHAR(64),
  model_family VARCHAR(64), feature_version INTEGER, features TEXT, workload TEXT, gpu_types TEXT,
  predictions TEXT, hint TEXT, policy_decision TEXT, predictor VARCHAR(64), PRIMARY KEY (cluster, job_id));
CREATE TABLE usage (cluster VARCHAR(64) NOT NULL, job_id BIGINT NOT NULL, source VARCHAR(16) NOT NULL,
  util_mean DOUBLE PRECISION, util_max DOUBLE PRECISION, mem_peak_mib DOUBLE PRECISION,
  elapsed_s BIGINT, state VARCHAR(32), node VARCHAR(128), gpu_type VARCHAR(64),
  PRIMARY KEY (cluster, job_id, source));
CREATE TABLE predictor_versions (version VARCHAR(32) NOT NULL PRIMARY KEY, created BIGINT NOT NULL,
  metrics TEXT, n_rows INTEGER);
INSERT INTO schema_version VALUES (1, 1700000000);
"""


def test_migrate_v1_file(tmp_path):
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.executescript(V1_DDL)
    con.execute("INSERT INTO submissions (cluster, job_id, user_name, submit_time, predictions) "
                "VALUES ('c', 3, 'ann', 1700000000, ?)", (json.dumps(PRED),))
    con.execute("INSERT INTO usage VALUES ('c', 3, 'sacct', 70, 99, 2000, 60, 'COMPLETED', 'n', 'a100')")
    con.commit()
    con.close()
    L = Ledger(f"sqlite:///{db}")
    assert L.schema_version() == SCHEMA_VERSION
    (job,) = L.jobs()
    assert job["user_name"] == "ann" and job["act_util_pct"] == 70 and job["pred_mem_mib"] == 1000
    L.record_usage(job_id=3, cluster="c", source="sacct", gpu_index=2, util_mean=71)
    assert L.jobs()[0]["gpu_index"] == 2
    con = sqlite3.connect(db)
    assert con.execute("SELECT jobs FROM v_accuracy_by_user").fetchall() == [(1,)]


def test_unreachable_ledger_spools_then_replays(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    monkeypatch.setenv("HORUS_SPOOL", str(spool))
    bad = "mysql+pymysql://x:y@127.0.0.1:1/nodb"  # nothing listens on port 1
    pytest.importorskip("pymysql")
    assert record_submission_safely(url=bad, job_id=11, cluster="c", predictions=PRED,
                                    timeout=1) is False
    # a directory where the database file should be: unusable SQLite
    (tmp_path / "isdir.db").mkdir()
    assert record_usage_safely(url=f"sqlite:///{tmp_path}/isdir.db", job_id=11, cluster="c",
                               source="probe", util_mean=5, mem_peak_mib=10) is False
    assert len(Spool(spool).pending()) == 2
    # the next successful write replays everything
    assert record_submission_safely(url=_url(tmp_path), job_id=12, cluster="c", predictions=PRED)
    assert Spool(spool).pending() == []
    L = Ledger(_url(tmp_path))
    got = {j["job_id"]: j for j in L.jobs()}
    assert set(got) == {11, 12} and got[11]["act_util_pct"] == 5


def test_locked_ledger_spools(tmp_path, monkeypatch):
    monkeypatch.setenv("HORUS_SPOOL", str(tmp_path / "spool"))
    Ledger(_url(tmp_path))
    con = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        assert record_submission_safely(url=_url(tmp_path), job_id=5, cluster="c",
                                        timeout=0.3) is False
    finally:
        con.execute("ROLLBACK")
        con.close()
    from slurm_horus.usage import sync

    res = sync(Ledger(_url(tmp_path)), sacct_json='{"jobs": []}')
    assert res["replayed"] == 1
    assert [j["job_id"] for j in Ledger(_url(tmp_path)).jobs()] == [5]


def _writer(args):
    url, spool, k, n = args
    os.environ["HORUS_SPOOL"] = spool
    ok = 0
    for i in range(n):
        if k % 2:
            ok += record_submission_safely(url=url, job_id=k * 1000 + i, cluster="c",
                                           predictions=PRED, timeout=20)
        else:
            ok += record_usage_safely(url=url, job_id=k * 1000 + i, cluster="c", source="probe",
                                      util_mean=i, mem_peak_mib=100, timeout=20)
    return ok


@pytest.mark.slow
def test_32_processes_lose_nothing(tmp_path):
    url, spool = _url(tmp_path), str(tmp_path / "spool")
    Ledger(url)
    n_proc, n_each = 32, 10
    ctx = mp.get_context("fork")
    with ctx.Pool(n_proc) as pool:
        pool.map(_writer, [(url, spool, k, n_each) for k in range(n_proc)])
    L = Ledger(url, spool=spool)
    Spool(spool).replay(L)  # anything that had to be spooled
    assert Spool(spool).pending() == []
    assert L.count("jobs") == n_proc * n_each
    assert L.count("submissions") + L.count("usage") == n_proc * n_each


def _mariadb_url():
    d = os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster")
    cnf = os.path.join(d, "etc", "my.cnf")
    if not os.path.exists(cnf):
        return None
    try:
        subprocess.run(["mariadb", f"--defaults-file={cnf}", "-uroot", "-e",
                        "CREATE DATABASE IF NOT EXISTS horus_test; "
                        "GRANT ALL ON horus_test.* TO 'slurm'@'127.0.0.1'; "
                        "GRANT ALL ON horus_test.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"],
                       check=True, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    port = 16800 + 6 if not os.environ.get("HORUS_CLUSTER_PORT_BASE") else \
        int(os.environ["HORUS_CLUSTER_PORT_BASE"]) + 6
    return f"mysql+pymysql://slurm:horus@127.0.0.1:{port}/horus_test"


@pytest.mark.cluster
def test_mariadb_ledger():
    pytest.importorskip("pymysql")
    url = _mariadb_url()
    if url is None:
        pytest.skip("local cluster MariaDB not running (tests/cluster/up)")
    L = Ledger(url)
    with L.engine.begin() as conn:
        for t in ("jobs", "`usage`", "submissions", "predictor_versions"):
            conn.exec_driver_sql(f"DELETE FROM {t}")
    L.record_submission(job_id=1, cluster="m", user="u", predictions=PRED, model_path="bert.onnx")
    L.record_usage(job_id=1, cluster="m", source="sacct", util_mean=60, mem_peak_mib=1300,
                   node="n", end_time=1700000000, elapsed_s=5, gpu_index=0)
    L.record_usage(job_id=1, cluster="m", source="sacct", util_mean=61, mem_peak_mib=1300,
                   node="n", end_time=1700000000, elapsed_s=5, gpu_index=0)
    (job,) = L.jobs()
    assert job["act_util_pct"] == 61 and job["pred_util_pct"] == 50
    with L.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT jobs FROM v_accuracy_by_family").fetchall() == [(1,)]
        assert conn.exec_driver_sql("SELECT jobs FROM v_gpu_util_daily").fetchall() == [(1,)]
    from slurm_horus.report import summary

    s = summary(L)
    assert s["all"]["jobs"] == 1 and s["all"]["util_mae_pp"] == 11.0
