"""Review 6 of the ledger: import reads only a CSV no one else can write, sync says when the
policy it reads its record_file from cannot be used, and co-location sees multi-node shard jobs."""

import csv
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_horus import textfile
from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FEATURE_NAMES
from slurm_horus.ledger import Ledger
from slurm_horus.ledger import publish as publish_mod
from slurm_horus.ledger.publish import publish
from slurm_horus.ledger.retrain import import_csv
from slurm_horus.ledger.sync import colocations, sync

FIX = Path(__file__).parent / "fixtures"
F2511 = FIX / "slurm-25.11" / "sacct_json_finished.stdout"
SHARD_JOB = json.loads((FIX / "slurm-25.11" / "index.json").read_text())["job_ids"]["finished_shard_job"]


def _csv(path: Path, model: str = "") -> Path:
    row = {"gpu_type": "a100", "util_pct": "40", "mem_mib": "5000", "features":
           json.dumps({n: 1.0 for n in FEATURE_NAMES}), "cold_util_pct": "30", "cold_mem_mib": "4000",
           "model": model}
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    os.chmod(path, 0o644)
    return path


@pytest.mark.parametrize("how", ["other-writable", "group-writable", "another-owner"])
def test_import_refuses_a_csv_another_user_may_write(tmp_path, how):
    """Import, run as root, takes the CSV's rows as measured and opens the model files it
    names: a file another user may write (or owns) is refused in one line, nothing recorded."""
    if how == "another-owner" and os.geteuid() != 0:
        pytest.skip("giving a file away needs root")
    path = _csv(tmp_path / "rows.csv")
    if how == "another-owner":
        os.chown(path, 65534, -1)
    else:
        os.chmod(path, 0o666 if how == "other-writable" else 0o664)
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    with pytest.raises(HorusError) as e:
        import_csv(L, str(path))
    assert ("not owned" if how == "another-owner" else "writable by group or others") in str(e.value)
    assert "\n" not in str(e.value) and L.count("usage") == 0
    os.chmod(path, 0o644)
    if how == "another-owner":
        os.chown(path, os.geteuid(), -1)
    assert import_csv(L, str(path))["rows"] == 1  # the same file, once only its owner may write it


def test_import_under_sudo_reads_the_csv_of_the_admin_who_ran_it(tmp_path, monkeypatch):
    """calibrate runs as the admin on a GPU node and says "next: horus-admin import CSV"; the
    ledger is root's, so the import runs under sudo: the admin's own CSV (0644) had been refused
    as "not owned by an allowed user".  Another user's still is."""
    if os.geteuid() != 0:
        pytest.skip("giving a file away needs root")
    path = _csv(tmp_path / "rows.csv")
    os.chown(path, 1000, -1)
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    monkeypatch.setenv("SUDO_UID", "1001")
    with pytest.raises(HorusError, match="not owned"):
        import_csv(L, str(path))
    monkeypatch.setenv("SUDO_UID", "1000")
    assert import_csv(L, str(path))["rows"] == 1


def test_horus_admin_import_refuses_it_in_one_line(tmp_path):
    from slurm_horus.cli.admin_ledger import import_

    path = _csv(tmp_path / "rows.csv")
    os.chmod(path, 0o646)
    r = CliRunner().invoke(import_, [str(path), "--ledger", f"sqlite:///{tmp_path}/l.db"])
    assert r.exit_code != 0 and len(r.output.splitlines()) == 1
    assert "writable by group or others" in r.output


def test_import_judges_the_file_it_reads_not_the_name_checked_before(tmp_path, monkeypatch):
    """The check is on the descriptor read: a file swapped in between a look at the name and
    the open (an os.stat first) is the one judged."""
    path = _csv(tmp_path / "rows.csv")
    forged = _csv(tmp_path / "forged.csv")
    os.chmod(forged, 0o666)
    real_open = textfile.open_for_reading

    def swapped_then_opened(p, *a, **k):
        os.replace(forged, path)
        return real_open(p, *a, **k)
    monkeypatch.setattr(textfile, "open_for_reading", swapped_then_opened)
    with pytest.raises(HorusError, match="writable by group or others"):
        import_csv(Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp")), str(path))


def test_a_refused_csv_opens_no_model_it_names(tmp_path, monkeypatch):
    from slurm_horus.ledger import retrain

    opened = []
    monkeypatch.setattr(retrain, "extract_features", lambda *a, **k: opened.append(a))
    monkeypatch.setattr(retrain, "file_sha256", lambda *a, **k: opened.append(a))
    path = _csv(tmp_path / "rows.csv", model="/root/secret.onnx")
    os.chmod(path, 0o666)
    with pytest.raises(HorusError):
        import_csv(Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp")), str(path))
    assert opened == []


# --------------------------------------------------------------------------- sync's policy


def _publish(tmp_path, policy: bytes, monkeypatch, capsys, mode=0o644):
    from slurm_horus.slurm import commands as slurm

    monkeypatch.setattr(slurm, "private_jobs", lambda unknown=None: False)
    pol = tmp_path / "policy.conf"
    pol.write_bytes(policy)
    os.chmod(pol, mode)
    out = publish(Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp")), policy=str(pol))
    return out, capsys.readouterr().err


def _writes(monkeypatch) -> list:
    """The paths publish writes the claim record to, none written (the default is the site's)."""
    written = []
    monkeypatch.setattr(publish_mod, "write_atomically", lambda path, *a, **k: written.append(path))
    return written


@pytest.mark.parametrize("policy", [
    "record_file = {record}\n".encode("utf-16"),  # a Windows editor's "Unicode"
    b"\x00\x01\xff\xfe binary \x89PNG\r\n\x1a\n",
])
def test_sync_warns_of_a_policy_the_hook_cannot_read(tmp_path, monkeypatch, capsys, policy):
    """A binary or UTF-16 policy: the hook ignores its lines, and sync wrote the record to the
    built-in default without a word. Now one line on stderr says so, and the sync goes on."""
    written = _writes(monkeypatch)
    out, err = _publish(tmp_path, policy.replace(b"{record}", str(tmp_path / "elsewhere").encode()),
                        monkeypatch, capsys)
    assert written == ["/var/lib/slurm-horus/record"]  # the hook's default too
    assert err.startswith("horus-admin sync: warning: the hook ignores") and err.count("\n") == 1
    assert "the claim record is written to /var/lib/slurm-horus/record" in err
    assert out["policy_warning"] in err


def test_sync_takes_nothing_from_a_policy_another_user_may_write(tmp_path, monkeypatch, capsys):
    """root writes the record where the policy's record_file says: a policy others may write
    would have root replace any file; its settings are not taken, and sync says so."""
    written = _writes(monkeypatch)
    out, err = _publish(tmp_path, f"record_file = {tmp_path / 'victim'}\n".encode(), monkeypatch,
                        capsys, mode=0o666)
    assert written == ["/var/lib/slurm-horus/record"]
    assert "writable by group or others" in err and err.count("\n") == 1


def test_sync_is_quiet_with_a_policy_it_reads(tmp_path, monkeypatch, capsys):
    out, err = _publish(tmp_path, f"record_file = {tmp_path / 'rec'}\nunderclaim_window_days = 7\n".encode(),
                        monkeypatch, capsys)
    assert out["record_file"] == str(tmp_path / "rec") and out["policy_warning"] is None and err == ""


def test_a_fifo_in_the_records_place_does_not_hold_the_sync(tmp_path, monkeypatch, capsys):
    """Whether the old record names anyone was read with a blocking open: a FIFO there had
    held the sync for good."""
    os.mkfifo(tmp_path / "rec")
    out, _ = _publish(tmp_path, f"record_file = {tmp_path / 'rec'}\n".encode(), monkeypatch, capsys)
    assert (tmp_path / "rec").is_file()


# --------------------------------------------------------------------------- co-location


def test_colocations_see_a_multi_node_shard_job_on_each_of_its_nodes():
    """A raw shard request across nodes passes the hook under raw_shards = allow (the shipped
    default): sacct names its nodes ``n[1-2]``, which matched no single-node job's ``n1``."""
    js = [{"cluster": "c", "job_id": 1, "node": "n[1-2]", "shards": 10, "gpu_index": 0,
           "start_time": 0, "end_time": 10},
          {"cluster": "c", "job_id": 2, "node": "n2", "shards": 10, "gpu_index": 1, "start_time": 5,
           "end_time": 20},
          {"cluster": "c", "job_id": 3, "node": "n3", "shards": 10, "start_time": 5, "end_time": 20},
          {"cluster": "c", "job_id": 4, "node": "n1,n3", "shards": 10, "start_time": 6, "end_time": 9}]
    # job 1's index is one node's: on n2 it may be any GPU, so it meets job 2 there
    assert colocations(js) == {("c", 1): {2, 4}, ("c", 2): {1}, ("c", 3): {4}, ("c", 4): {1, 3}}


def test_sync_finds_a_multi_node_shard_job_already_in_the_ledger(tmp_path):
    """A later sync's single-node job meets the multi-node shard job an earlier sync recorded
    (the ledger was asked for node IN ('gpu-t4') only)."""
    base = json.loads(F2511.read_text())
    (shard,) = [j for j in base["jobs"] if j["job_id"] == SHARD_JOB]

    def job(jid, nodes, start):
        j = json.loads(json.dumps(shard))
        j["job_id"], j["nodes"], j["time"]["start"], j["time"]["end"] = jid, nodes, start, start + 100
        return j
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    sync(L, sacct_json={"jobs": [job(601, "gpu-t4,gpu-t5", 1000)]}, all_jobs=True)
    res = sync(L, sacct_json={"jobs": [job(602, "gpu-t4", 1050)]}, all_jobs=True)
    rows = {r["job_id"]: r for r in L.jobs()}
    assert rows[602]["colocated"] == "601" and rows[601]["colocated"] == "602"
    assert res["colocated_updates"] == 1


def test_the_ledgers_whole_gpu_multi_node_jobs_are_not_expanded(tmp_path, monkeypatch):
    """Each sync asked for every multi-node row in its window and expanded its node list, whole-
    GPU jobs' too, which share no GPU: 20,000 jobs of 256 nodes had taken 15 s (0.14 s before
    multi-node co-location).  A multi-node shard job is still found."""
    from sqlalchemy import insert

    from slurm_horus.ledger import sync as sync_mod, tables

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    row = {"cluster": "c", "start_time": 1000, "end_time": 5000, "shards": None}
    with L.engine.begin() as conn:
        conn.execute(insert(tables()["jobs"]), [
            {**row, "job_id": 1, "node": "gpu[0001-0256]", "gpus": 2048},
            {**row, "job_id": 2, "node": "gpu[0001-0002]", "gpus": None, "shards": 10},
            {**row, "job_id": 3, "node": "gpu[0001-0002]", "gpus": 0}])
    expanded = []
    real = sync_mod.node_names
    monkeypatch.setattr(sync_mod, "node_names", lambda n: expanded.append(n) or real(n))
    found = sync_mod._ledger_jobs_on(L, {"gpu0001"}, 0, 10000)
    assert sorted(r["job_id"] for r in found) == [2, 3]
    assert "gpu[0001-0256]" not in expanded


def test_a_record_whose_mode_is_kept_is_never_left_writable_by_others(tmp_path, monkeypatch, capsys):
    """Where Slurm cannot say whether jobs are private the record keeps its mode: one made
    0666 stayed so at every sync, and a user could strike their own under-claims from it."""
    from slurm_horus.slurm import commands as slurm

    record = tmp_path / "rec"
    record.write_text("old\n")
    os.chmod(record, 0o666)
    monkeypatch.setattr(slurm, "private_jobs", lambda unknown=None: None)
    monkeypatch.setattr(publish_mod, "write_user_extracts", lambda *a: {"written": 0, "skipped": []})
    pol = tmp_path / "policy.conf"
    pol.write_text(f"record_file = {record}\n")
    publish(Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp")), policy=str(pol))
    assert os.stat(record).st_mode & 0o777 == 0o644
