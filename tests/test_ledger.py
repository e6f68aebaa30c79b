"""Ledger: schema, views, upserts, migration, claim audit, spool, concurrency, MariaDB."""

import json
import math
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.ledger import (SCHEMA_VERSION, Ledger, Spool, record_usage_safely, under_claim,
                                write_user_extracts)
from slurm_horus.ledger.extracts import NO_JOBS

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
    (job,) = L.jobs()
    assert job["gpu_type"] is None  # the prediction's one type is a claim, not where it ran
    assert job["pred_util_pct"] == 50  # but what it claimed is compared
    L.record_usage(job_id=7, cluster="c", source="probe", util_mean=41, util_max=95,
                   mem_peak_mib=1500, gpu_type="a100")  # replaces, never adds
    assert L.count("usage") == 2
    (job,) = L.jobs()
    assert job["model_family"] == "resnet50" and job["gpu_type"] == "a100"
    assert job["act_util_pct"] == 41 and job["act_mem_mib"] == 1500  # probe wins
    assert job["node"] == "n1" and job["shards"] == 30 and job["sources"] == "sacct,probe"
    assert job["pred_util_pct"] == 50 and job["pred_mem_mib"] == 1000
    con = sqlite3.connect(tmp_path / "ledger.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # readers need no -shm
    fam = con.execute("SELECT model_family, jobs, util_mae_pp, mem_underpredicted_20pct "
                      "FROM v_accuracy_by_family").fetchall()
    assert fam == [("resnet50", 1, 9.0, 1)]
    for v in ("v_accuracy_by_gpu_type", "v_accuracy_by_user", "v_gpu_util_daily", "v_job_errors",
              "v_under_claims"):
        con.execute(f"SELECT * FROM {v}").fetchall()
    assert L.schema_version() == SCHEMA_VERSION


def test_bad_source_and_url(tmp_path):
    from slurm_horus.errors import HorusError

    L = Ledger(_url(tmp_path))
    with pytest.raises(HorusError):
        L.record_usage(job_id=1, source="guess")
    with pytest.raises(HorusError):
        Ledger("no such url")


def test_ledger_url_from_the_site_conf(tmp_path, monkeypatch):
    """Users need no environment: the ledger URL in horus.conf is used, $HORUS_LEDGER_URL first."""
    from slurm_horus.ledger import default_url

    conf = tmp_path / "horus.conf"
    site, own = f"sqlite:///{tmp_path}/site.db", f"sqlite:///{tmp_path}/own.db"
    conf.write_text(f"# site settings\non_prediction_error = submit\nledger_url = {site}  # read-only\n")
    monkeypatch.setenv("HORUS_CONF", str(conf))
    monkeypatch.delenv("HORUS_LEDGER_URL", raising=False)
    assert default_url() == site
    Ledger().record_usage(job_id=7, source="sacct", elapsed_s=5)
    assert (tmp_path / "site.db").exists() and not (tmp_path / "own.db").exists()
    monkeypatch.setenv("HORUS_LEDGER_URL", own)
    assert default_url() == own
    monkeypatch.delenv("HORUS_LEDGER_URL")
    conf.write_text("on_prediction_error = refuse\n")  # no ledger_url: the SQLite default
    assert default_url() == "sqlite:////var/lib/slurm-horus/ledger.db"
    conf.chmod(0)  # unreadable (root reads it anyway): never an error
    assert default_url().startswith("sqlite:")


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


def test_unusable_ledger_spools_then_replays(tmp_path, monkeypatch):
    spool = tmp_path / "spool"
    monkeypatch.setenv("HORUS_SPOOL", str(spool))
    (tmp_path / "isdir.db").mkdir()  # a directory where the database file should be
    assert record_usage_safely(url=f"sqlite:///{tmp_path}/isdir.db", job_id=11, cluster="c",
                               source="probe", util_mean=5, mem_peak_mib=10, gpus=1) is False
    assert len(Spool(spool).pending()) == 1
    # a ledger file that is not there: spooled, never made here (a GPU node's default path
    # had become a ledger of its own, and the record never reached the site's)
    assert record_usage_safely(url=_url(tmp_path), job_id=12, cluster="c", source="probe",
                               util_mean=6) is False
    assert not (tmp_path / "ledger.db").exists() and len(Spool(spool).pending()) == 2
    Ledger(_url(tmp_path))
    # the next successful write replays everything
    assert record_usage_safely(url=_url(tmp_path), job_id=12, cluster="c", source="probe",
                               util_mean=6)
    assert Spool(spool).pending() == []
    got = {j["job_id"]: j for j in Ledger(_url(tmp_path)).jobs()}
    assert set(got) == {11, 12} and got[11]["act_util_pct"] == 5 and got[11]["gpus"] == 1


def test_locked_ledger_spools(tmp_path, monkeypatch):
    monkeypatch.setenv("HORUS_SPOOL", str(tmp_path / "spool"))
    Ledger(_url(tmp_path))
    con = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    try:
        assert record_usage_safely(url=_url(tmp_path), job_id=5, cluster="c", source="probe",
                                   util_mean=1, timeout=0.3) is False
    finally:
        con.execute("ROLLBACK")
        con.close()
    L = Ledger(_url(tmp_path))
    assert Spool().replay(L) == (1, 0, 0, [])
    assert [j["job_id"] for j in L.jobs()] == [5]


def _spool_file(spool, name, text):
    spool.mkdir(mode=0o700, exist_ok=True)
    (spool / name).write_text(text)
    os.chmod(spool / name, 0o600)


def test_bad_spool_records_quarantined_rest_replayed(tmp_path):
    spool = tmp_path / "spool"
    S = Spool(spool)
    S.put("usage", {"cluster": "c", "job_id": 1, "source": "probe", "util_mean": 10})
    _spool_file(spool, "00000000000000000002-1-a.jsonl",
                json.dumps({"kind": "usage", "data": {"job_id": "12;x", "source": "probe"}}))
    _spool_file(spool, "00000000000000000003-1-b.jsonl", "{not json")
    _spool_file(spool, "00000000000000000004-1-c.jsonl",
                json.dumps({"kind": "submission", "data": {"job_id": 4}}))
    _spool_file(spool, "00000000000000000005-1-d.jsonl",
                json.dumps({"kind": "usage", "data": {"job_id": 5, "source": "probe",
                                                      "bogus": 1}}))
    S.put("usage", {"cluster": "c", "job_id": 6, "source": "probe", "util_mean": 60})
    L = Ledger(_url(tmp_path))
    r = S.replay(L)
    assert (r.applied, r.quarantined, r.skipped) == (2, 4, 0)
    assert len(r.problems) == 4 and all("quarantined" in p for p in r.problems)
    assert sorted(p.name for p in spool.glob("*.bad")) == [
        "00000000000000000002-1-a.bad", "00000000000000000003-1-b.bad",
        "00000000000000000004-1-c.bad", "00000000000000000005-1-d.bad"]
    assert sorted(j["job_id"] for j in L.jobs()) == [1, 6]
    assert S.replay(L) == (0, 0, 0, [])  # quarantined files are not retried


def test_spool_replay_trusts_only_a_private_folder_and_own_files(tmp_path):
    spool = tmp_path / "spool"
    S = Spool(spool)
    S.put("usage", {"cluster": "c", "job_id": 1, "source": "probe", "util_mean": 10})
    L = Ledger(_url(tmp_path))
    os.chmod(spool, 0o777)  # anyone could have dropped a "measurement" here
    r = S.replay(L)
    assert (r.applied, r.skipped) == (0, 1) and "group/other-writable" in r.problems[0]
    os.chmod(spool, 0o700)
    other = spool / "00000000000000000002-1-x.jsonl"
    other.write_text(json.dumps({"kind": "usage", "data": {"job_id": 2, "source": "probe",
                                                           "util_mean": 99}}))
    os.chmod(other, 0o666)
    if os.geteuid() == 0:
        os.chown(other, 65534, 65534)  # another user's file
    r = S.replay(L)
    assert (r.applied, r.quarantined, r.skipped) == (1, 0, 1)
    assert "00000000000000000002-1-x.jsonl: skipped" in r.problems[0]
    assert [j["job_id"] for j in L.jobs()] == [1] and other.exists()


def test_under_claim_rule():
    assert under_claim(None, None, 50, 5000) == (None, None)        # no claim
    assert under_claim(40, 1000, None, None) == (None, None)        # no measurement
    assert under_claim(40, 1000, 60, 1356) == (0, None)             # within 1.25x+10, 1.1x+256
    assert under_claim(40, 1000, 60.1, 1356.1) == (1, "mem,util")
    assert under_claim(40, 1000, None, 1400) == (1, "mem")
    assert under_claim(40, None, 61, 9999) == (1, "util")


def test_merge_gpus_p90_and_under_claim_from_trusted_sources_only(tmp_path):
    L = Ledger(_url(tmp_path))
    hint = {"a100": {"util_pct": 10.0, "mem_mib": 800.0, "mem_mib_p90": 1000.0,
                     "predictor": "hint"}}
    for jid in (1, 2, 3, 4):
        L.record_submission(job_id=jid, cluster="c", user="eve", account="lab", uid=1234,
                            predictions=hint, submit_time=1700000000)
    L.record_usage(job_id=1, cluster="c", source="sacct", gpus=1, state="COMPLETED",
                   end_time=1700000100)
    L.record_usage(job_id=2, cluster="c", source="probe", mem_peak_mib=5000, util_mean=12,
                   shards=2, end_time=1700000100)
    L.record_usage(job_id=3, cluster="c", source="import", mem_peak_mib=5000, util_mean=90)
    L.record_usage(job_id=4, cluster="c", source="sacct", util_mean=20, mem_peak_mib=900,
                   end_time=1700000100)
    j = {r["job_id"]: r for r in L.jobs()}
    assert j[1]["gpus"] == 1 and j[1]["shards"] is None and j[1]["under_claim"] is None
    assert j[2]["pred_mem_p90_mib"] == 1000 and j[2]["shards"] == 2
    assert (j[2]["under_claim"], j[2]["claim_flags"]) == (1, "mem")
    assert j[3]["under_claim"] is None  # imported figures are no trusted measurement
    assert (j[4]["under_claim"], j[4]["claim_flags"]) == (0, None)
    assert L.under_claims(since=1700000000) == [
        {"user_name": "eve", "uid": 1234, "account": "lab", "under_claims": 1, "jobs": 2}]
    assert L.under_claims(since=1700000101) == []
    assert [r["job_id"] for r in L.jobs(under_claims=True)] == [2]


V3_DDL = """
CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY, applied BIGINT NOT NULL);
CREATE TABLE submissions (cluster VARCHAR(64) NOT NULL, job_id BIGINT NOT NULL, user_name VARCHAR(64),
  account VARCHAR(64), submit_time BIGINT, model_path TEXT, model_sha256 VARCHAR(64),
  model_family VARCHAR(64), feature_version INTEGER, features TEXT, workload TEXT, gpu_types TEXT,
  predictions TEXT, hint TEXT, policy_decision TEXT, predictor VARCHAR(64), PRIMARY KEY (cluster, job_id));
CREATE TABLE `usage` (cluster VARCHAR(64) NOT NULL, job_id BIGINT NOT NULL, source VARCHAR(16) NOT NULL,
  util_mean DOUBLE PRECISION, util_max DOUBLE PRECISION, mem_peak_mib DOUBLE PRECISION,
  elapsed_s BIGINT, state VARCHAR(32), node VARCHAR(128), gpu_type VARCHAR(64), gpu_index INTEGER,
  shards INTEGER, colocated TEXT, start_time BIGINT, end_time BIGINT, recorded BIGINT,
  PRIMARY KEY (cluster, job_id, source));
CREATE TABLE predictor_versions (version VARCHAR(32) NOT NULL PRIMARY KEY, created BIGINT NOT NULL,
  metrics TEXT, n_rows INTEGER, promoted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE jobs (cluster VARCHAR(64) NOT NULL, job_id BIGINT NOT NULL,
  has_submission INTEGER NOT NULL DEFAULT 0, user_name VARCHAR(64), account VARCHAR(64),
  submit_time BIGINT, model_family VARCHAR(64), predictor VARCHAR(64), gpu_type VARCHAR(64),
  gpu_index INTEGER, node VARCHAR(128), shards INTEGER, state VARCHAR(32), elapsed_s BIGINT,
  start_time BIGINT, end_time BIGINT, pred_util_pct DOUBLE PRECISION, pred_mem_mib DOUBLE PRECISION,
  act_util_pct DOUBLE PRECISION, act_util_max DOUBLE PRECISION, act_mem_mib DOUBLE PRECISION,
  colocated TEXT, sources VARCHAR(64), mem_err_bucket INTEGER, PRIMARY KEY (cluster, job_id));
CREATE TABLE ledger_state (name VARCHAR(64) NOT NULL PRIMARY KEY, value TEXT);
CREATE INDEX ix_jobs_accuracy ON jobs (has_submission, model_family, gpu_type,
    user_name, mem_err_bucket, pred_util_pct, act_util_pct, pred_mem_mib, act_mem_mib);
INSERT INTO schema_version VALUES (1, 1700000000);
INSERT INTO schema_version VALUES (2, 1700000000);
INSERT INTO schema_version VALUES (3, 1700000000);
"""


def test_migrate_v3_file(tmp_path):
    db = tmp_path / "v3.db"
    con = sqlite3.connect(db)
    con.executescript(V3_DDL)
    con.execute("INSERT INTO submissions (cluster, job_id, user_name, submit_time, predictions) "
                "VALUES ('c', 3, 'ann', 1700000000, ?)", (json.dumps(PRED),))
    con.execute("INSERT INTO usage (cluster, job_id, source, util_mean, mem_peak_mib, end_time) "
                "VALUES ('c', 3, 'sacct', 80, 2000, 1700000100)")
    con.commit()
    con.close()
    with pytest.raises(HorusError, match="older than this slurm-horus.*horus-admin sync"):
        Ledger(f"sqlite:///{db}", readonly=True)  # a reader cannot migrate it
    L = Ledger(f"sqlite:///{db}")
    assert L.schema_version() == SCHEMA_VERSION == 11
    (job,) = L.jobs()
    assert job["pred_mem_p90_mib"] == 1200 and (job["under_claim"], job["claim_flags"]) == \
        (1, "mem,util")  # 2000 > 1200 * 1.1 + 256 and 80 > 50 * 1.25 + 10
    con = sqlite3.connect(db)
    idx = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "ix_jobs_summary" in idx and "ix_jobs_accuracy" not in idx
    L.record_usage(job_id=3, cluster="c", source="sacct", gpus=2)
    assert Ledger(f"sqlite:///{db}", readonly=True).jobs()[0]["gpus"] == 2


def _schema_of(db) -> dict:
    """Every table's (column, declared type) and every index's columns, from SQLite itself."""
    con = sqlite3.connect(db)
    out = {}
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'"):
        out[t] = sorted((r[1], r[2]) for r in con.execute(f"PRAGMA table_info(`{t}`)"))
    for (i, t) in con.execute("SELECT name, tbl_name FROM sqlite_master WHERE type='index' "
                              "AND name LIKE 'ix_%'"):
        out[f"index {i} on {t}"] = [r[2] for r in con.execute(f"PRAGMA index_info({i})")]
    con.close()
    return out


def _varied_jobs(L):
    """Jobs that exercise every summary term: learned and cold-start predictors, a failed
    measurement, no measurement, missing p90, far above the prediction, under-claims."""
    rows = [  # job, user, gpu, predictor, pred util/mem/p90, act util/mem
        (1, "ann", "a100", "cold-start", 40, 1000, 1200, 45, 1100),
        (2, "ann", "a100", "learned:v0002", 40, 1000, 1200, 80, 3000),
        (3, "bob", "t4", "learned:v0003", 60, 2000, None, 55, 1900),
        (4, "bob", "t4", "cold-start", 30, 1000, 1100, 0, 300),
        (5, "cy", "t4", "history", 30, 1000, 1100, None, None),
        (6, "cy", "a100", "cold-start", 10, 500, 600, 50, 400),
    ]
    for jid, user, g, pred, pu, pm, p90, au, am in rows:
        L.record_submission(job_id=jid, cluster="c", user=user, model_path=f"/m/net{jid % 2}.onnx",
                            submit_time=1700000000 + jid,
                            predictions={g: {"util_pct": pu, "mem_mib": pm, "mem_mib_p90": p90,
                                             "predictor": pred}})
        if au is not None:
            L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=au,
                           mem_peak_mib=am, gpu_type=g, end_time=1700001000)


V5_SUMMARY_INDEX = """CREATE INDEX ix_jobs_summary ON jobs (has_submission, model_family, gpu_type,
    user_name, predictor, mem_err_bucket, failed_measurement, pred_util_pct, act_util_pct,
    pred_mem_mib, pred_mem_p90_mib, act_mem_mib, under_claim)"""
V6_JOB_COLUMNS = ("predictor_source", "measured", "util_abs_err_pp", "util_sq_log_err",
                  "mem_sq_log_err", "within_p90", "far")
V7_JOB_COLUMNS = ("hook_action", "hook_reason", "queue_actions")


def _older_copy(new, version: int, ddl: str):
    """A copy of the ledger file ``new`` taken back to schema ``version`` by ``ddl`` (what the
    migrations after it add, dropped again), beside it as vVERSION.db."""
    old = new.with_name(f"v{version}.db")
    old.write_bytes(new.read_bytes())
    con = sqlite3.connect(old)
    con.executescript(f"{ddl} UPDATE schema_version SET version = {version};")
    con.close()
    return old


def test_migrate_v5_file_same_summary_and_schema(tmp_path):
    """A v5 ledger (the same jobs, without the stored summary terms) upgrades to the schema a new
    ledger gets from sql/schema.sql, and gives the same summary."""
    from slurm_horus.ledger.report import summary

    new = tmp_path / "new.db"
    L = Ledger(f"sqlite:///{new}")
    _varied_jobs(L)
    want = summary(L)
    L.close()
    old = _older_copy(new, 5, "DROP INDEX ix_jobs_summary; DROP INDEX ix_jobs_far; "
                              "DROP INDEX ix_jobs_queue; "
                              + "".join(f"ALTER TABLE jobs DROP COLUMN {c};"
                                        for c in V6_JOB_COLUMNS + V7_JOB_COLUMNS)
                              + V5_SUMMARY_INDEX + ";")
    assert "far" not in dict(_schema_of(old)["jobs"])
    with pytest.raises(HorusError, match="schema version 5 is older"):
        Ledger(f"sqlite:///{old}", readonly=True)
    M = Ledger(f"sqlite:///{old}")
    assert M.schema_version() == SCHEMA_VERSION == 11
    assert summary(M) == want
    assert want["all"]["far_exceeding"] == 2 and want["all"]["excluded"] == 1
    assert _schema_of(old) == _schema_of(new)


def test_migrate_v6_file_fills_scheduler_actions_from_stored_admin_comments(tmp_path):
    """A v6 ledger keeps each job's AdminComment in submissions.policy_decision but has no
    columns for it: the migration adds them and fills them from what is stored."""
    new = tmp_path / "new.db"
    L = Ledger(f"sqlite:///{new}")
    admin = {1: "horus: shared horus-decision:v1;action=shared;type=a100;shards=30/100 "
                "horus-queue:v1;action=oom-requeue;from=shard:30",
             2: "horus-decision:v1;action=exclusive;type=a100;reason=util "
                "horus-queue:v1;action=pack;from=gpu:1 horus-queue:v1;action=spread;from=shard:50",
             3: "horus: a note from an older hook, no token", 4: None}
    for jid, note in admin.items():
        L.record_submission(job_id=jid, cluster="c", user="ann", policy_decision=note,
                            predictions=PRED)
        L.record_usage(job_id=jid, cluster="c", source="sacct", state="COMPLETED", shards=30)
    want = {r["job_id"]: (r["hook_action"], r["hook_reason"], r["queue_actions"])
            for r in L.jobs()}
    assert want == {1: ("shared", None, "oom-requeue"), 2: ("exclusive", "util", "pack,spread"),
                    3: (None, None, None), 4: (None, None, None)}
    L.close()
    old = _older_copy(new, 6, "DROP INDEX ix_jobs_queue; "
                              + "".join(f"ALTER TABLE jobs DROP COLUMN {c};" for c in V7_JOB_COLUMNS))
    with pytest.raises(HorusError, match="schema version 6 is older"):
        Ledger(f"sqlite:///{old}", readonly=True)
    M = Ledger(f"sqlite:///{old}")
    assert M.schema_version() == SCHEMA_VERSION
    assert {r["job_id"]: (r["hook_action"], r["hook_reason"], r["queue_actions"])
            for r in M.jobs()} == want
    assert _schema_of(old) == _schema_of(new)


def test_migrate_v8_file_gains_array_ids(tmp_path):
    """v9 keeps an array task's ArrayJobId beside its own id: a v8 file gains the columns and
    the index, keeps its rows, and a later sync fills them (hacct -j ARRAYID)."""
    new = tmp_path / "new.db"
    L = Ledger(f"sqlite:///{new}")
    L.record_usage(job_id=7, cluster="c", source="sacct", state="COMPLETED", shards=30)
    L.close()
    old = _older_copy(new, 8, "DROP INDEX ix_jobs_array; ALTER TABLE jobs DROP COLUMN array_job_id; "
                              "ALTER TABLE usage DROP COLUMN array_job_id; ALTER TABLE jobs DROP COLUMN array_task_id; "
                              "ALTER TABLE usage DROP COLUMN array_task_id;")
    with pytest.raises(HorusError, match="schema version 8 is older"):
        Ledger(f"sqlite:///{old}", readonly=True)
    M = Ledger(f"sqlite:///{old}")
    assert M.schema_version() == SCHEMA_VERSION and _schema_of(old) == _schema_of(new)
    assert [(r["job_id"], r["array_job_id"]) for r in M.jobs()] == [(7, None)]
    M.record_usage(job_id=7, cluster="c", source="sacct", state="COMPLETED", shards=30, array_job_id=5)
    assert [r["job_id"] for r in M.jobs(job_ids=[5])] == [7]


def test_migrate_v9_file_gains_array_task_ids(tmp_path):
    """v10 keeps an array task's ArrayTaskId too (hacct's rows had said which array, never
    which task): a v9 file gains the columns and keeps its rows."""
    new = tmp_path / "new.db"
    L = Ledger(f"sqlite:///{new}")
    L.record_usage(job_id=7, cluster="c", source="sacct", state="COMPLETED", shards=30, array_job_id=5)
    L.close()
    old = _older_copy(new, 9, "ALTER TABLE jobs DROP COLUMN array_task_id; ALTER TABLE usage DROP COLUMN array_task_id;")
    M = Ledger(f"sqlite:///{old}")
    assert M.schema_version() == SCHEMA_VERSION == 11 and _schema_of(old) == _schema_of(new)
    assert [(r["job_id"], r["array_job_id"], r["array_task_id"]) for r in M.jobs()] == [(7, 5, None)]
    M.record_usage(job_id=7, cluster="c", source="sacct", state="COMPLETED", shards=30, array_job_id=5,
                   array_task_id=2)
    assert [(r["job_id"], r["array_task_id"]) for r in M.jobs(job_ids=[5])] == [(7, 2)]


def test_sync_records_what_the_scheduler_did_from_admin_comment_only(tmp_path):
    """Recorded sacct output (22.05, 25.11) with the AdminComment the hook and the queue loop
    write: sync fills hook_action/queue_actions from it, never from the user's Comment."""
    from slurm_horus.ledger.requeue import marked
    from slurm_horus.ledger.sync import sync

    fix = os.path.join(os.path.dirname(__file__), "fixtures")
    d2205 = json.loads(open(os.path.join(fix, "slurm", "sacct_json_finished_shard.stdout")).read())
    d2511 = json.loads(open(os.path.join(fix, "slurm-25.11", "sacct_json_finished.stdout")).read())
    (shard,) = d2205["jobs"]
    shard["comment"]["administrator"] = marked(
        "horus: shared a100 shards=20/100 horus-decision:v1;action=shared;type=a100;shards=20/100",
        "horus-queue:v1;action=oom-requeue;from=shard:20")
    t4, gpu2 = d2511["jobs"]  # t4: the recorded note of a hook without a decision token
    gpu2["comment"]["job"] += " horus-queue:v1;action=oom-requeue;from=shard:1"  # the user's
    L = Ledger(_url(tmp_path))
    for data in (d2205, d2511):
        sync(L, sacct_json=data, all_jobs=True, node_types={})
    got = {r["job_id"]: (r["hook_action"], r["hook_reason"], r["queue_actions"], r["state"])
           for r in L.jobs()}
    assert got == {shard["job_id"]: ("shared", None, "oom-requeue", "COMPLETED"),
                   t4["job_id"]: (None, None, None, "COMPLETED"),
                   gpu2["job_id"]: (None, None, None, "COMPLETED")}


def test_migrated_v1_ledger_has_the_schema_of_schema_sql(tmp_path):
    """Migrations add columns by hand: they must end at what sql/schema.sql creates."""
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.executescript(V1_DDL)
    con.close()
    Ledger(f"sqlite:///{db}").close()
    Ledger(_url(tmp_path)).close()
    got, want = _schema_of(db), _schema_of(tmp_path / "ledger.db")
    # columns added by ALTER TABLE come last; their declared types must still agree
    assert got == want


def test_stored_summary_terms_agree_with_the_views(tmp_path):
    """The terms stored per job (jobs.accuracy_terms) against v_job_errors, which computes the
    errors from the raw columns in SQL."""
    L = Ledger(_url(tmp_path))
    _varied_jobs(L)
    con = sqlite3.connect(tmp_path / "ledger.db")
    rows = con.execute("SELECT e.job_id, e.util_err_pp, e.mem_err_pct, e.within_p90, "
                       "j.util_abs_err_pp, j.within_p90, j.mem_sq_log_err, j.far, "
                       "j.predictor_source, j.measured, e.pred_mem_mib, e.act_mem_mib "
                       "FROM v_job_errors e JOIN jobs j USING (cluster, job_id)").fetchall()
    assert len(rows) == 6
    for (jid, uerr, merr, wp90, abs_u, st_wp90, sqm, far, source, measured, pm, am) in rows:
        assert (abs_u is None) == (uerr is None) and (abs_u is None or abs_u == abs(uerr)), jid
        assert st_wp90 == wp90, jid
        assert (sqm is None) == (merr is None), jid
        if sqm is not None:
            assert sqm == pytest.approx((math.log1p(pm) - math.log1p(am)) ** 2)
        assert far == int((uerr is not None and -uerr > 25)
                          or (merr is not None and am > 1.25 * pm))
        assert measured == int(jid != 5)
    sources = dict(con.execute("SELECT job_id, predictor_source FROM jobs"))
    assert sources == {1: "cold-start", 2: "learned", 3: "learned", 4: "cold-start",
                       5: "history", 6: "cold-start"}


def test_readonly_reader_writes_nothing(tmp_path):
    with pytest.raises(HorusError, match="not found; ask an admin to run horus-admin sync"):
        Ledger(_url(tmp_path), readonly=True)
    assert not (tmp_path / "ledger.db").exists()  # and nothing was created
    W = Ledger(_url(tmp_path))
    W.record_usage(job_id=1, cluster="c", source="sacct", shards=3)
    W.close()
    R = Ledger(_url(tmp_path), readonly=True)
    assert R.jobs()[0]["shards"] == 3
    with pytest.raises(Exception, match="readonly"):
        R.record_usage(job_id=2, cluster="c", source="sacct")
    assert not list(tmp_path.glob("ledger.db-*"))  # no WAL, no journal left behind


def test_new_ledger_folders_are_world_readable_and_its_file_root_s(tmp_path):
    """Users read the copy each sync publishes, never the live file (a reader's lock on it
    blocked every write)."""
    old = os.umask(0o077)
    try:
        Ledger(f"sqlite:///{tmp_path}/a/b/ledger.db").close()
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "b" / "ledger.db").stat().st_mode & 0o777 == 0o640


def test_user_extracts(tmp_path):
    import pwd

    me = pwd.getpwuid(os.getuid())
    L = Ledger(_url(tmp_path))
    L.record_submission(job_id=1, cluster="c", user=me.pw_name, predictions=PRED)
    L.record_submission(job_id=2, cluster="c", user="no-such-user-xyz", predictions=PRED)
    L.record_usage(job_id=3, cluster="c", source="sacct")  # no user known
    res = write_user_extracts(L, tmp_path / "users")
    assert res == {"written": 1, "skipped": ["no-such-user-xyz"]}
    ext = tmp_path / "users" / f"{me.pw_name}.db"
    st = ext.stat()
    # the user's alone: a shared primary group must not read it
    assert st.st_mode & 0o777 == 0o400 and st.st_uid == me.pw_uid
    assert [j["job_id"] for j in Ledger(f"sqlite:///{ext}", readonly=True).jobs()] == [1]
    # no temp file left; the extract of no jobs, for a user with none, readable by all
    assert [p.name for p in (tmp_path / "users").iterdir() if p.name.startswith(".")] == [NO_JOBS]
    none = tmp_path / "users" / NO_JOBS
    assert none.stat().st_mode & 0o777 == 0o444 and Ledger(f"sqlite:///{none}", readonly=True).jobs() == []
    # where jobs are private, the folder lists no one's: 0711 (each opens their own by name)
    assert (tmp_path / "users").stat().st_mode & 0o777 == 0o711
    # a user no longer known here: their extract goes (the uid may be someone else's next)
    gone = tmp_path / "users" / "no-such-user-xyz.db"
    gone.write_bytes(b"old")
    write_user_extracts(L, tmp_path / "users")
    assert not gone.exists() and ext.exists()
    # a folder that is a symbolic link (to where root would re-mode and write) is refused
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HorusError, match="not a plain folder"):
        write_user_extracts(L, tmp_path / "linked")
    assert (tmp_path / "elsewhere").stat().st_mode & 0o777 == 0o755 and not list((tmp_path / "elsewhere").iterdir())
    # so is one inside a folder other users may write, where they could swap it for their own;
    # a sticky one (as /tmp) lets only an entry's owner move it
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(HorusError, match="which other users may change"):
        write_user_extracts(L, tmp_path / "open" / "users")
    (tmp_path / "open").chmod(0o1777)
    assert write_user_extracts(L, tmp_path / "open" / "users")["written"] == 1
    # a symbolic link on the way that another user owns: they may point it elsewhere
    if os.geteuid() == 0:  # (only root gives a link to another user)
        other = pwd.getpwnam("nobody")
        (tmp_path / "open" / "theirs").symlink_to(tmp_path / "elsewhere")
        os.lchown(tmp_path / "open" / "theirs", other.pw_uid, other.pw_gid)
        with pytest.raises(HorusError, match="which other users may change"):
            write_user_extracts(L, tmp_path / "open" / "theirs" / "users")
    # the jobs that shared a GPU with yours: named only where they are yours (2 is another's)
    L.record_submission(job_id=4, cluster="c", user=me.pw_name, predictions=PRED)
    L.record_usage(job_id=1, cluster="c", source="sacct", colocated=[2, 4])
    write_user_extracts(L, tmp_path / "users")
    jobs = {j["job_id"]: j for j in Ledger(f"sqlite:///{ext}", readonly=True).jobs()}
    assert jobs[1]["colocated"] == "4" and L.jobs(job_ids=[1])[0]["colocated"] == "2,4"


def _writer(args):
    url, spool, k, n = args
    os.environ["HORUS_SPOOL"] = spool
    ok = 0
    for i in range(n):
        if k % 2:
            Ledger(url, replay=False).record_submission(job_id=k * 1000 + i, cluster="c",
                                                        predictions=PRED)
            ok += 1
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


def _mariadb_url(db: str = "horus_test", create: str = ""):
    d = os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster")
    cnf = os.path.join(d, "etc", "my.cnf")
    if not os.path.exists(cnf):
        return None
    try:  # a cluster set up and since stopped: nothing to test against
        subprocess.run(["mariadb", f"--defaults-file={cnf}", "-uroot", "-e", "SELECT 1"],
                       check=True, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    # the cluster's MariaDB answers: a grant that fails is a failure, not a reason to skip
    subprocess.run(["mariadb", f"--defaults-file={cnf}", "-uroot", "-e",
                    f"{create}CREATE DATABASE IF NOT EXISTS {db}; "
                    f"GRANT ALL ON {db}.* TO 'slurm'@'127.0.0.1'; "
                    f"GRANT ALL ON {db}.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"],
                   check=True, capture_output=True, timeout=20)
    port = 16800 + 6 if not os.environ.get("HORUS_CLUSTER_PORT_BASE") else \
        int(os.environ["HORUS_CLUSTER_PORT_BASE"]) + 6
    return f"mysql+pymysql://slurm:horus@127.0.0.1:{port}/{db}"


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
    from slurm_horus.ledger.report import summary

    s = summary(L)
    assert s["all"]["jobs"] == 1 and s["all"]["util_mae_pp"] == 11.0
    # a spooled record the server refuses for good (a GPU index out of INT's range) is set
    # aside: put back, it stopped every later sync
    import tempfile

    spool = os.path.join(tempfile.mkdtemp(), "spool")
    S = Spool(spool)
    S.put("usage", {"cluster": "m", "job_id": 3, "source": "probe", "gpu_index": 10 ** 12})
    S.put("usage", {"cluster": "m", "job_id": 4, "source": "probe", "util_mean": 40})
    r = S.replay(L)
    assert (r.applied, r.quarantined) == (1, 1) and "DataError" in r.problems[0], r
    assert {j["job_id"] for j in L.jobs()} >= {4} and 3 not in {j["job_id"] for j in L.jobs()}
    # a multi-node job's node list longer than the column: MariaDB refused the whole batch,
    # and every later sync failed on the same job
    nodes = "gpu-a100-[" + ",".join(f"{i:03d}" for i in range(1, 80, 2)) + "]"
    L.record_usage(job_id=2, cluster="m", source="sacct", util_mean=60, mem_peak_mib=1300,
                   node=nodes, end_time=1700000000, elapsed_s=5)
    assert [r["node"] for r in L.jobs() if r["job_id"] == 2] == [nodes[:128]]


@pytest.mark.cluster
def test_mariadb_ledger_is_created_or_migrated_by_one_process_at_a_time(monkeypatch):
    """Each DDL statement commits on MariaDB: the first writers after an upgrade (every node's
    probe at its job's end) all read the old version and all but one failed on a duplicate
    column or version row.  An open waits while another process holds the setup lock, and
    says so in one line when it waits too long."""
    import threading

    from sqlalchemy import create_engine

    from slurm_horus.ledger.migrate import SETUP_LOCK

    pytest.importorskip("pymysql")
    url = _mariadb_url("horus_test_lock", "DROP DATABASE IF EXISTS horus_test_lock; ")
    if url is None:
        pytest.skip("local cluster MariaDB not running (tests/cluster/up)")
    holder = create_engine(url).connect()
    assert holder.exec_driver_sql(f"SELECT GET_LOCK({SETUP_LOCK}, 0)").scalar() == 1
    opened = []
    t = threading.Thread(target=lambda: opened.append(Ledger(url)))
    t.start()
    t.join(1.5)
    assert t.is_alive() and not opened  # waiting for the lock, not creating beside its holder
    holder.exec_driver_sql(f"SELECT RELEASE_LOCK({SETUP_LOCK})")
    t.join(30)
    assert opened and opened[0].count("jobs") == 0
    opened[0].engine.dispose()
    holder.exec_driver_sql(f"SELECT GET_LOCK({SETUP_LOCK}, 0)")
    for timeout in ("3", "1", "0.5"):  # a wait of 1 s had outlasted these reads (connection lost)
        monkeypatch.setenv("HORUS_DB_TIMEOUT", timeout)
        with pytest.raises(HorusError, match="another process is creating or migrating it"):
            Ledger(url)
    holder.close()
    # no database, no lock name (NULL): that is the URL's fault, not another process's
    with pytest.raises(HorusError, match="the URL names no database"):
        Ledger(url.rsplit("/", 1)[0] + "/")


@pytest.mark.cluster
def test_mariadb_ledger_in_a_latin1_database_keeps_any_model_path():
    """A database in latin1 (MariaDB's default before 11.6): a job whose model path is in CJK
    was refused (Incorrect string value), and every later sync failed on it. New tables are
    utf8mb4, and a v8 ledger's are converted when it migrates."""
    pytest.importorskip("pymysql")
    url = _mariadb_url("horus_test_latin1", "DROP DATABASE IF EXISTS horus_test_latin1; "
                                            "CREATE DATABASE horus_test_latin1 CHARACTER SET latin1; ")
    if url is None:
        pytest.skip("local cluster MariaDB not running (tests/cluster/up)")
    path = "/home/mallory/模型-😀.onnx"
    L = Ledger(url)
    L.record_submission(job_id=1, cluster="m", user="u", predictions=PRED, model_path=path)
    with L.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT model_path FROM submissions").scalar() == path
        # a v8 ledger made in latin1: its tables are converted by the migration
        conn.exec_driver_sql("DELETE FROM submissions")
        conn.exec_driver_sql("ALTER TABLE submissions CONVERT TO CHARACTER SET latin1")
        conn.exec_driver_sql("UPDATE schema_version SET version = 8")
        conn.exec_driver_sql("DELETE FROM schema_version WHERE version = 9")
        conn.commit()
    L.engine.dispose()
    M = Ledger(url)
    M.record_submission(job_id=2, cluster="m", user="u", predictions=PRED, model_path=path)
    with M.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT model_path FROM submissions").scalar() == path
    M.engine.dispose()


def test_text_longer_than_its_column_is_cut_to_it(tmp_path):
    # SQLite keeps any length, MariaDB refuses the batch (test_mariadb_ledger)
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    nodes = "gpu-a100-[" + ",".join(f"{i:03d}" for i in range(1, 80, 2)) + "]"
    L.record_usage(job_id=2, cluster="m", source="sacct", util_mean=60, node=nodes, state="COMPLETED")
    (job,) = L.jobs()
    assert job["node"] == nodes[:128] and len(nodes) > 128 and job["state"] == "COMPLETED"


def test_a_multi_gpu_jobs_measured_use_is_per_gpu_like_its_prediction(tmp_path):
    """The probe and sacct sum a job's GPUs; its prediction and its claim are per GPU: 75 % on
    each of two GPUs is no under-claim of a 75 % hint.  A v7 ledger is merged again (v8)."""
    db = tmp_path / "l.db"
    L = Ledger(f"sqlite:///{db}")
    pred = {"a100": {"util_pct": 75.0, "mem_mib": 8000.0, "mem_mib_p90": 9000.0}}
    for jid, gpus in ((1, 2), (2, 1)):
        L.record_submission(job_id=jid, cluster="c", user="ann", predictions=pred, gpu_types=["a100"])
        L.record_usage(job_id=jid, cluster="c", source="probe", util_mean=150.0 / (3 - gpus),
                       mem_peak_mib=16000.0 / (3 - gpus), gpus=gpus, gpu_type="a100")
    rows = {r["job_id"]: r for r in L.jobs()}
    assert (rows[1]["act_util_pct"], rows[1]["act_mem_mib"], rows[1]["under_claim"]) == (75.0, 8000.0, 0)
    assert (rows[2]["act_util_pct"], rows[2]["act_mem_mib"], rows[2]["under_claim"]) == (75.0, 8000.0, 0)
    L.close()
    con = sqlite3.connect(db)  # as v7 stored it: the sums
    con.execute("UPDATE jobs SET act_util_pct = 150, act_mem_mib = 16000, under_claim = 1 WHERE job_id = 1")
    con.execute("UPDATE schema_version SET version = 7")
    con.commit()
    con.close()
    (job,) = [r for r in Ledger(f"sqlite:///{db}").jobs() if r["job_id"] == 1]
    assert (job["act_util_pct"], job["act_mem_mib"], job["under_claim"]) == (75.0, 8000.0, 0)


def test_a_source_that_saw_no_use_does_not_hide_another_that_measured():
    """probe > sacct, but a probe whose own figures are a failed measurement (utilization 0, no
    memory) comes after sacct's real ones; alone, it flags the job as a failed measurement."""
    import tempfile

    L = Ledger(f"sqlite:///{tempfile.mkdtemp()}/l.db")
    for jid in (19, 20):
        L.record_submission(job_id=jid, cluster="c", user="u", gpu_types=["a100"],
                            predictions={"a100": {"util_pct": 40, "mem_mib": 5000}})
        L.record_usage(job_id=jid, cluster="c", source="probe", util_mean=0.0, gpu_type="a100")
    L.record_usage(job_id=19, cluster="c", source="sacct", util_mean=50.0, mem_peak_mib=10000,
                   gpu_type="a100")
    rows = {r["job_id"]: r for r in L.jobs()}
    assert (rows[19]["act_util_pct"], rows[19]["act_mem_mib"], rows[19]["failed_measurement"]) == \
        (50.0, 10000.0, 0)
    assert (rows[20]["act_util_pct"], rows[20]["act_mem_mib"], rows[20]["failed_measurement"]) == \
        (0.0, None, 1)


def test_a_measurement_no_gpu_can_give_is_not_kept(tmp_path):
    """One row with utilization 1e6 % and a petabyte of memory made the summary's MAE 62,520
    points: such figures are not stored as facts (utilization 0..100 per GPU, memory <= 16 TiB)."""
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    L.record_usage(job_id=1, cluster="c", source="sacct", util_mean=1e6, util_max=float("nan"),
                   mem_peak_mib=1e12, gpu_type="a100")
    L.record_usage(job_id=2, cluster="c", source="probe", util_mean=150.0, mem_peak_mib=80000.0,
                   gpus=2, gpu_type="a100")
    L.record_usage(job_id=3, cluster="c", source="probe", util_mean=150.0, gpu_type="a100")
    u1, u2, u3 = (L.usage("c", j)[s] for j, s in ((1, "sacct"), (2, "probe"), (3, "probe")))
    assert (u1["util_mean"], u1["util_max"], u1["mem_peak_mib"]) == (None, None, None)
    assert (u2["util_mean"], u2["mem_peak_mib"]) == (150.0, 80000.0)  # two GPUs: up to 200 %
    assert u3["util_mean"] is None  # one GPU: 150 % is no measurement


def test_a_probe_of_an_earlier_run_does_not_speak_for_the_rerun(tmp_path):
    """A requeued job (an OOM rerun on a whole GPU) keeps its first run's probe row until the
    rerun is probed: that run's use, type and GPU must not pass for the rerun's."""
    L = Ledger(_url(tmp_path), spool=str(tmp_path / "spool"))
    L.record_submission(job_id=9, cluster="c", user="u", predictions=PRED)
    L.record_usage(job_id=9, cluster="c", source="probe", util_mean=30, mem_peak_mib=39000,
                   gpu_type="a100", gpu_index=1, shards=40, start_time=1000, end_time=1100)
    L.record_usage(job_id=9, cluster="c", source="sacct", state="COMPLETED", gpus=1, node="n1",
                   util_mean=80, mem_peak_mib=20000, start_time=1200, end_time=1900)
    (job,) = L.jobs()
    assert (job["act_util_pct"], job["gpu_index"], job["sources"]) == (80, None, "sacct")
    L.record_usage(job_id=9, cluster="c", source="probe", util_mean=85, mem_peak_mib=21000,
                   gpu_type="a100", gpu_index=0, gpus=1, start_time=1201, end_time=1899)
    (job,) = L.jobs()
    assert (job["act_util_pct"], job["gpu_index"], job["gpu_type"]) == (85, 0, "a100")


def test_a_spooled_probe_record_of_an_earlier_run_never_replaces_the_reruns(tmp_path):
    """A requeued job's first-run record, spooled while the ledger was locked, was replayed
    after the rerun's probe wrote its own: it replaced the rerun's row, merge_job dropped it as
    an earlier run's, and the job was left with no measured use."""
    spool = tmp_path / "spool"
    L = Ledger(_url(tmp_path), spool=str(spool))
    L.record_runs([dict(job_id=500, cluster="c", user="u", submit_time=1000)],
                  [dict(job_id=500, cluster="c", source="sacct", state="COMPLETED", node="n2",
                        start_time=2000, end_time=3000, gpus=1)])
    Spool(spool).put("usage", dict(job_id=500, cluster="c", source="probe", util_mean=5.0,
                                   mem_peak_mib=1000.0, node="n1", gpus=1, start_time=1100, end_time=1500))
    rerun = dict(job_id=500, cluster="c", source="probe", util_mean=80.0, mem_peak_mib=30000.0,
                 node="n2", gpus=1, start_time=2000, end_time=3000)
    L.record_usage(**rerun)  # its write replays the spool
    assert Spool(spool).pending() == []
    (job,) = L.jobs()
    assert (job["act_util_pct"], job["act_mem_mib"], job["sources"]) == (80.0, 30000.0, "sacct,probe")
    # the same run's record, replayed twice, is the one row it was
    before = L.usage("c", 500)
    Spool(spool).put("usage", rerun)
    Spool(spool).put("usage", rerun)
    assert Spool(spool).replay(L).applied == 2
    after = L.usage("c", 500)
    assert {k: v for k, v in after["probe"].items() if k != "recorded"} == \
        {k: v for k, v in before["probe"].items() if k != "recorded"} and set(after) == {"sacct", "probe"}


def test_a_replay_killed_mid_file_leaves_it_to_the_next(tmp_path):
    """A replayer claims a file by renaming it .claim-...: one killed while it waited on the
    ledger's lock (a sync stopped by its time limit) left its file out of every later replay,
    and the job's measurement was lost. A live replayer's claim is left alone; one whose pid a
    later process has is not."""
    spool = tmp_path / "spool"
    Spool(spool).put("usage", {"cluster": "c", "job_id": 77, "source": "probe", "util_mean": 60.0})
    L = Ledger(_url(tmp_path), spool=str(spool))
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom slurm_horus.ledger import Ledger\n"
         f"L = Ledger({_url(tmp_path)!r}, spool={str(spool)!r}, busy_timeout=60)\n"
         "print('ready', flush=True)\nsys.stdin.readline()\nL.spool.replay(L)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        con = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        child.stdin.write("go\n")
        child.stdin.flush()
        for _ in range(300):
            if any(".claim-" in n for n in os.listdir(spool)):
                break
            time.sleep(0.1)
        child.kill()
        child.wait()
        assert any(".claim-" in n for n in os.listdir(spool))  # killed with the file claimed
        con.execute("ROLLBACK")
        con.close()
    finally:
        child.kill()
    assert Spool(spool).replay(L).applied == 1
    assert L.jobs()[0]["act_util_pct"] == 60.0 and os.listdir(spool) == []
    from slurm_horus.proc import started as _started

    me = os.getpid()
    _spool_file(spool, f"00000000000000000002-1-a.claim-{me}-{_started(me)}",  # replaying now
                json.dumps({"kind": "usage", "data": {"cluster": "c", "job_id": 78, "source": "probe"}}))
    _spool_file(spool, f"00000000000000000003-1-b.claim-{me}-1",  # its pid, since reused
                json.dumps({"kind": "usage", "data": {"cluster": "c", "job_id": 79, "source": "probe",
                                                      "util_mean": 9.0}}))
    assert Spool(spool).replay(L) == (1, 0, 0, [])
    assert sorted(j["job_id"] for j in L.jobs()) == [77, 79]
    assert os.listdir(spool) == [f"00000000000000000002-1-a.claim-{me}-{_started(me)}"]


def test_a_multi_node_jobs_probe_is_per_gpu_of_its_own_node(tmp_path):
    # each node's probe measures that node's GPUs; the figure was divided by the job's GPUs on
    # every node (sacct's count), a half of the truth on two nodes
    L = Ledger(_url(tmp_path), spool=str(tmp_path / "spool"))
    L.record_submission(job_id=5, cluster="c", user="u", predictions=PRED)
    L.record_usage(job_id=5, cluster="c", source="sacct", state="COMPLETED", gpus=8, node="n[1-2]")
    L.record_usage(job_id=5, cluster="c", source="probe", util_mean=320, mem_peak_mib=40000,
                   gpus=4, node="n2")
    (job,) = L.jobs()
    assert (job["act_util_pct"], job["act_mem_mib"]) == (80, 10000)
    # one GPU a node: the node's one GPU, not half of it
    L.record_usage(job_id=5, cluster="c", source="probe", util_mean=80, mem_peak_mib=10000,
                   gpus=1, node="n2")
    (job,) = L.jobs()
    assert (job["act_util_pct"], job["act_mem_mib"]) == (80, 10000)


def _multi_node_probes(L, job, order):
    """A 2-node job's probe records, written in ``order``: the batch node's Prolog ran at the
    job's start (4 GPUs, each at 90 % and 30000 MiB), the other's at a light step the user
    started late (1 GPU, 5 %, 900 MiB); both end with the job."""
    recs = {"batch": dict(util_mean=360.0, util_max=380.0, mem_peak_mib=120000.0, gpus=4,
                          node="n1", gpu_type="a100", elapsed_s=1000, start_time=1000, end_time=2000),
            "late": dict(util_mean=5.0, util_max=99.0, mem_peak_mib=900.0, gpus=1, node="n2",
                         gpu_type="a100", elapsed_s=100, start_time=1900, end_time=2001)}
    for name in order:
        L.record_usage(job_id=job, cluster="c", source="probe", **recs[name])


@pytest.mark.parametrize("order", [("batch", "late"), ("late", "batch")])
def test_a_multi_node_jobs_probe_rows_keep_its_heaviest_gpu(tmp_path, order):
    """Without PrologFlags=Alloc a node's Prolog starts at its first step: the node whose probe
    started last replaced the others' row (a requeue's rule), and a user who ran heavy on the
    batch node and a light step late on another chose the light figures, which beat sacct's in
    the measured use and the under-claim audit.  The same run's rows combine: the largest use
    per GPU, whichever node wrote first."""
    L = Ledger(_url(tmp_path), spool=str(tmp_path / "spool"))
    L.record_submission(job_id=6, cluster="c", user="u", predictions=PRED)
    L.record_usage(job_id=6, cluster="c", source="sacct", state="COMPLETED", gpus=5,
                   node="n[1-2]", util_mean=365.0, mem_peak_mib=120900.0, start_time=1000,
                   end_time=2001)
    _multi_node_probes(L, 6, order)
    (job,) = L.jobs()
    assert (job["act_util_pct"], job["act_util_max"], job["act_mem_mib"]) == (90.0, 99.0, 30000.0)
    assert (job["under_claim"], job["claim_flags"]) == (1, "mem,util")
    probe = L.usage("c", 6)["probe"]
    assert (probe["start_time"], probe["end_time"], probe["elapsed_s"]) == (1000, 2001, 1000)
    assert probe["node"] == ("n1" if order[0] == "batch" else "n2")  # the first row's placement
    # a requeued job's rerun still replaces the run before it, and that run's late record is
    # still kept out
    L.record_usage(job_id=6, cluster="c", source="probe", util_mean=10.0, mem_peak_mib=800.0,
                   gpus=1, node="n3", start_time=3000, end_time=4000)
    _multi_node_probes(L, 6, order[:1])
    probe = L.usage("c", 6)["probe"]
    assert (probe["util_mean"], probe["mem_peak_mib"], probe["node"], probe["start_time"]) == \
        (10.0, 800.0, "n3", 3000)
    # a rerun that starts in the second the last run ended replaces it too (a regression
    # review: the two had been merged, the lighter rerun given the first run's figures)
    L.record_usage(job_id=6, cluster="c", source="probe", util_mean=5.0, mem_peak_mib=500.0,
                   gpus=1, node="n4", start_time=4000, end_time=4500)
    probe = L.usage("c", 6)["probe"]
    assert (probe["util_mean"], probe["mem_peak_mib"], probe["node"], probe["start_time"]) == \
        (5.0, 500.0, "n4", 4000)
    # and the run before it, replayed late, ending in the second this one started: kept out
    L.record_usage(job_id=6, cluster="c", source="probe", util_mean=90.0, mem_peak_mib=9000.0,
                   gpus=1, node="n3", start_time=3000, end_time=4000)
    probe = L.usage("c", 6)["probe"]
    assert (probe["util_mean"], probe["mem_peak_mib"], probe["start_time"]) == (5.0, 500.0, 4000)


def test_no_memory_and_no_utilization_is_a_failed_measurement():
    # a probe that saw none of the job's processes recorded 0 MiB and no utilization: taken
    # for a measurement, it won over accounting's real figures
    from slurm_horus.ledger import failed_measurement

    assert failed_measurement(None, 0.0) == 1 and failed_measurement(0.0, 300.0) == 1
    assert failed_measurement(None, 300.0) == 0 and failed_measurement(None, None) is None
    assert failed_measurement(5.0, 0.0) == 0


@pytest.mark.parametrize("url", ["postgresql://u@localhost/horus", "oracle://u@localhost/horus"])
def test_a_server_the_schema_is_not_written_for_is_refused_in_one_line(url):
    # sql/schema.sql quotes `usage` as SQLite and MariaDB do: PostgreSQL failed at the first CREATE
    with pytest.raises(HorusError, match="is not supported"):
        Ledger(url)


@pytest.mark.cluster
def test_mariadb_migrates_a_v1_ledger(tmp_path):
    # v4's migration dropped an index of the jobs table, which a v1 ledger does not have yet:
    # NoSuchTableError on every try (SQLite's DROP INDEX IF EXISTS had hidden it)
    pytest.importorskip("pymysql")
    url = _mariadb_url("horus_test_v1", "DROP DATABASE IF EXISTS horus_test_v1; ")
    if url is None:
        pytest.skip("the local cluster's MariaDB is not running (tests/cluster/up)")
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        for stmt in V1_DDL.replace("CREATE TABLE usage", "CREATE TABLE `usage`").split(";"):
            if stmt.strip():
                conn.exec_driver_sql(stmt)
        conn.exec_driver_sql("INSERT INTO `usage` VALUES ('c', 3, 'sacct', 70, 99, 2000, 60, 'COMPLETED', 'n', 'a100')")
    engine.dispose()
    L = Ledger(url)
    assert L.schema_version() == SCHEMA_VERSION
    assert [(r["job_id"], r["gpu_type"]) for r in L.jobs()] == [(3, "a100")]
    L.close()


def _probe_race(url: str, tmp_path, rounds: int) -> list:
    """Two writers, each with its own connection, record a requeued job's earlier run (start
    1000) and its rerun (start 2000) at the same instant, ``rounds`` times: half the rounds
    over no row yet (two inserts of one key), half over a row older than both (two updates).
    Returns what went wrong: the rounds whose earlier run's row won, and any write that failed."""
    import threading

    L = Ledger(url, replay=False, spool=str(tmp_path / "spool"))
    with L.engine.begin() as conn:
        for t in ("jobs", "`usage`", "submissions"):
            conn.exec_driver_sql(f"DELETE FROM {t} WHERE cluster = 'race'")
    writers = [Ledger(url, replay=False, spool=str(tmp_path / f"spool{k}")) for k in (0, 1)]
    runs = [dict(start_time=1000, end_time=1500, util_mean=10.0, node="n1"),
            dict(start_time=2000, end_time=2500, util_mean=90.0, node="n2")]
    wrong: list = []

    def write(k: int, job: int, run: dict, barrier) -> None:
        barrier.wait()
        try:
            writers[k].record_usage(job_id=job, cluster="race", source="probe", gpus=1,
                                    mem_peak_mib=1000.0, **run)
        except Exception as e:  # noqa: BLE001 - reported by the test
            wrong.append(f"round {job}: {type(e).__name__}: {e}")

    try:
        for r in range(rounds):
            if r % 2:
                L.record_usage(job_id=r, cluster="race", source="probe", util_mean=1.0,
                               start_time=500, end_time=900)
            barrier = threading.Barrier(2)
            threads = [threading.Thread(target=write, args=(k, r, runs[(k + r // 2) % 2], barrier))
                       for k in (0, 1)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(120)
            u = L.usage("race", r)["probe"]
            (job,) = L.jobs(job_ids=[r], cluster="race")
            if (u["start_time"], u["util_mean"], job["act_util_pct"]) != (2000, 90.0, 90.0):
                wrong.append(f"round {r}: row of the run started {u['start_time']}, "
                             f"job row {job['act_util_pct']}")
    finally:
        for w in (*writers, L):
            w.close()
    return wrong


def test_two_writers_of_one_jobs_probe_rows_leave_the_reruns_sqlite(tmp_path):
    """The earlier-run rule (a requeued job's first-run probe record never replaces the
    rerun's) was read, then written: two writers at the same instant could both read nothing
    stored, or an older row, and the earlier run's row win. SQLite serialises its writers."""
    assert _probe_race(_url(tmp_path), tmp_path, 60) == []


@pytest.mark.cluster
def test_two_writers_of_one_jobs_probe_rows_leave_the_reruns_mariadb(tmp_path):
    """The same on MariaDB (InnoDB, REPEATABLE READ), where both writers' reads of the stored
    row came before either's write: the earlier run's row won about half the rounds, of both
    kinds (no row yet, an older row)."""
    pytest.importorskip("pymysql")
    url = _mariadb_url("horus_test_race", "DROP DATABASE IF EXISTS horus_test_race; ")
    if url is None:
        pytest.skip("the local cluster's MariaDB is not running (tests/cluster/up)")
    assert _probe_race(url, tmp_path, 200) == []


def _analysis_child() -> dict:
    """What a run_bounded child is: its ids, parent-death signal and open fds (their targets)."""
    import ctypes

    sig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    fds = {}
    for fd in range(1024):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return {"uid": [os.getuid(), os.geteuid()], "gid": [os.getgid(), os.getegid()],
            "groups": sorted(os.getgroups()), "pdeathsig": sig.value, "fds": fds}


@pytest.mark.skipif(os.geteuid() != 0, reason="analyses as another user: needs root")
def test_sync_analyses_a_users_graph_as_that_user_with_none_of_the_syncs_fds(tmp_path, monkeypatch):
    """sync (root) had analysed a user's ONNX file in a child that stayed root and held every fd
    of the sync (the ledger's database among them): the child now keeps the model's fd alone
    (and its pipe, the standard ones), takes the job user's ids before it parses, still dies with
    the sync, and still reads the file (a 0600 file of the user's, through /proc/self/fd)."""
    import hashlib
    import pwd
    import shutil
    import signal
    import tempfile
    from pathlib import Path

    from slurm_horus.graph.limits import run_bounded
    from slurm_horus.ledger import claims

    try:
        alice = pwd.getpwnam("horus-alice")
    except KeyError:
        pytest.skip("no user horus-alice here")
    secret = tmp_path / "ledger.db"  # a fd the sync holds
    secret.write_bytes(b"root's")
    held = os.open(secret, os.O_RDONLY)
    folder = Path(tempfile.mkdtemp(prefix="horus-test-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        model = folder / "m.onnx"
        shutil.copy(Path(__file__).parent / "data" / "zoo" / "small_cnn.onnx", model)
        os.chown(model, alice.pw_uid, alice.pw_gid)
        os.chmod(model, 0o600)
        seen = []
        real = claims.extract_features

        def probed(path, **kw):
            seen.append(run_bounded("probe", _analysis_child, dict, dict))
            return real(path, **kw)
        monkeypatch.setattr(claims, "extract_features", probed)
        uid, gids = claims.owner_ids("horus-alice")
        wl = {"batch_size": 8, "task": "train", "optimizer": "adam", "precision": "fp32", "dims": {}}
        claim = {"model": str(model), "sha": hashlib.sha256(model.read_bytes()).hexdigest()}
        assert claims.ModelFeatures().get(claim, wl, uid, gids) is not None
        (child,) = seen
        assert child["uid"] == [alice.pw_uid] * 2 and child["gid"][0] == child["gid"][1] in gids
        assert child["groups"] == sorted(gids) and child["pdeathsig"] == signal.SIGKILL
        assert str(model) in child["fds"].values() and str(secret) not in child["fds"].values()
        assert len(child["fds"]) <= 6  # std, the pipe, the model (and /dev/null for stderr)
        # hsubmit's analyses (no confinement: it runs as the user) are as they were
        mine = run_bounded("probe", _analysis_child, dict, dict)
        assert mine["uid"] == [0, 0] and str(secret) in mine["fds"].values()
    finally:
        os.close(held)
        shutil.rmtree(folder)


def test_a_cpu_job_on_a_gpu_node_is_no_gpu_job(tmp_path):
    """A CPU job with a hint, run on a T4 node, was recorded as a T4 job (its node's type) and
    hacct scored its prediction against a GPU it never had (recorded 22.05 output, its GPU
    taken away)."""
    from slurm_horus.ledger.sync import sync

    fix = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "sacct_json_finished_gpu.stdout")
    data = json.loads(open(fix).read())
    (job,) = data["jobs"]
    job["comment"]["job"] = "horus:v1;t4=60/3000/3500"
    L = Ledger(_url(tmp_path))
    sync(L, sacct_json=json.dumps(data), all_jobs=True, node_types={job["nodes"]: "t4"})
    (gpu_row,) = L.jobs()
    assert gpu_row["gpu_type"] == "t4"  # it held a GPU on its T4 node
    for tres in (job["tres"]["allocated"], job["tres"]["requested"]):
        tres[:] = [t for t in tres if t["type"] != "gres"]
    job["job_id"] += 1
    sync(L, sacct_json=json.dumps(data), all_jobs=True, node_types={job["nodes"]: "t4"})
    cpu_row = next(r for r in L.jobs() if r["job_id"] == job["job_id"])
    assert cpu_row["gpu_type"] is None and cpu_row["gpus"] is None


def test_migrate_v10_file_gains_het_job_ids(tmp_path):
    """v11 keeps a heterogeneous job component's HetJobId and HetJobOffset (hacct's JobID
    N+K, -j N from the ledger): a v10 file gains the columns and the index and keeps its rows,
    which a later sync fills; a reader cannot migrate it."""
    new = tmp_path / "new.db"
    L = Ledger(f"sqlite:///{new}")
    L.record_usage(job_id=92, cluster="c", source="sacct", state="COMPLETED", shards=30)
    L.close()
    old = _older_copy(new, 10, "DROP INDEX ix_jobs_het; ALTER TABLE jobs DROP COLUMN het_job_id; "
                               "ALTER TABLE jobs DROP COLUMN het_job_offset; ALTER TABLE usage DROP COLUMN het_job_id; "
                               "ALTER TABLE usage DROP COLUMN het_job_offset;")
    assert "het_job_id" not in str(_schema_of(old))
    with pytest.raises(HorusError, match="schema version 10 is older"):
        Ledger(f"sqlite:///{old}", readonly=True)
    M = Ledger(f"sqlite:///{old}")
    assert M.schema_version() == SCHEMA_VERSION == 11 and _schema_of(old) == _schema_of(new)
    assert [(r["job_id"], r["het_job_id"], r["het_job_offset"]) for r in M.jobs()] == [(92, None, None)]
    M.record_usage(job_id=92, cluster="c", source="sacct", state="COMPLETED", shards=30,
                   het_job_id=91, het_job_offset=1)
    assert [(r["job_id"], r["het_job_id"], r["het_job_offset"]) for r in M.jobs(job_ids=[91])] == [(92, 91, 1)]


def test_a_window_holding_only_a_requeued_jobs_earlier_run_keeps_the_rerun(tmp_path):
    """A sync over a window that lists only a requeued job's earlier run (sync -E inside that
    run, or a replayed file) replaced the rerun the ledger held with the earlier run: its state,
    times and measured use (recorded 22.05 output, the earlier run made from it)."""
    from slurm_horus.ledger.sync import sync

    fix = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "sacct_json_finished_gpu.stdout")
    (rerun,) = json.loads(open(fix).read())["jobs"]
    rerun["comment"]["job"] = "horus:v1;t4=60/3000/3500"
    earlier = json.loads(json.dumps(rerun))
    earlier["time"]["submission"] -= 5000
    earlier["time"]["start"], earlier["time"]["end"] = rerun["time"]["start"] - 4000, rerun["time"]["start"] - 3000
    earlier["state"]["current"] = "NODE_FAIL"
    L = Ledger(_url(tmp_path), spool=str(tmp_path / "sp"))
    sync(L, sacct_json={"jobs": [rerun, earlier]})
    recorded = [(j["state"], j["submit_time"], j["start_time"]) for j in L.jobs()]
    assert recorded == [("COMPLETED", rerun["time"]["submission"], rerun["time"]["start"])]
    res = sync(L, sacct_json={"jobs": [earlier]})
    assert [(j["state"], j["submit_time"], j["start_time"]) for j in L.jobs()] == recorded
    assert res["recorded"] == 0
    sync(L, sacct_json={"jobs": [rerun]})  # the same run again: recorded again, idempotent
    assert [(j["state"], j["submit_time"], j["start_time"]) for j in L.jobs()] == recorded


def test_a_job_running_across_a_syncs_windows_is_recorded_and_counted_once(tmp_path, monkeypatch):
    """sacct lists a job in every window it ran in: a catch-up sync of three hourly windows
    counted one finished job three times ("3 of 3 finished jobs recorded, 3 with claims")
    and wrote it three times (recorded 22.05 output, each window's answer)."""
    from slurm_horus.ledger.sync import sync
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm.accounting import parse_sacct_json

    fix = os.path.join(os.path.dirname(__file__), "fixtures", "slurm", "sacct_json_finished_gpu.stdout")
    data = json.loads(open(fix).read())
    data["jobs"][0]["comment"]["job"] = "horus:v1;t4=60/3000/3500"
    windows = []

    def accounting_jobs(since, until):
        windows.append((since, until))
        return parse_sacct_json(json.dumps(data))
    monkeypatch.setattr(slurm, "accounting_jobs", accounting_jobs)
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: data["jobs"][0]["cluster"])
    L = Ledger(_url(tmp_path), spool=str(tmp_path / "sp"))
    now = time.time()
    res = sync(L, since=now - 3 * 3600, until=now)
    assert len(windows) == 3 and L.count("jobs") == 1
    assert (res["jobs_seen"], res["recorded"], res["claims"]) == (1, 1, 1)
