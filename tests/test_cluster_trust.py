"""The whole loop on the real local cluster, as a site runs it, with ordinary users.

root and horus-alice submit through hsubmit, horus-bob forges hints with plain sbatch; the jobs
run, the root probe started by slurmd's Prolog measures them (the test cluster's fake sampler:
each job writes what it "used"), one `horus-admin sync` as root builds the ledger from sacct, and
then: hacct shows every job with its claim and its measurement, each user can read their own
jobs and write nothing, bob's forged claims are flagged, and the hook sends his next job to a
whole GPU because of the record sync wrote.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "data" / "zoo"
D = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster"))
LEDGER_DB = D / "ledger" / "ledger.db"
URL = f"sqlite:///{LEDGER_DB}"
POLICY = D / "etc" / "horus_policy.conf"
RECORD = D / "record"
FAKE = D / "fakegpu"


def sh(*args, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, **kw)


def _cluster_ok():
    if os.geteuid() != 0:
        return "needs root (runs jobs as the test users with runuser)"
    if not os.environ.get("SLURM_CONF") or not shutil.which("scontrol"):
        return "SLURM_CONF unset: start the cluster (bash tests/cluster/up; source tests/cluster/env.sh)"
    if "UP" not in sh("scontrol", "ping").stdout:
        return "slurmctld not up"
    if "horus-prolog" not in sh("scontrol", "show", "config").stdout:
        return "the cluster has no horus Prolog: re-run tests/cluster/up"
    for u in ("horus-alice", "horus-bob"):
        if sh("id", "-u", u).returncode:
            return f"no user {u}: re-run tests/cluster/up"
    if f"record_file = {RECORD}" not in POLICY.read_text():
        return "the cluster's policy has no test record_file: re-run tests/cluster/up"
    return None


_why = _cluster_ok()
if _why:
    pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=_why)]


def as_user(user, *cmd):
    """cmd as an ordinary user, with a clean environment: the cluster's config and scripts only."""
    env = ["env", "-i", f"HOME=/home/{user}", f"USER={user}", f"LOGNAME={user}",
           f"SLURM_CONF={os.environ['SLURM_CONF']}", f"PATH={D}/bin:/usr/bin:/bin"]
    return sh("runuser", "-u", user, "--", *env, *cmd, cwd=str(D / "jobs"))


def as_root(*cmd):
    env = dict(os.environ, HORUS_LEDGER_URL=URL, HORUS_POLICY=str(POLICY))
    return sh(*cmd, env=env)


def uses(util, mem, seconds=4):
    """A job body that reports what it "used" to the fake sampler, then runs a while."""
    return (f"printf '{{\"util_pct\": {util}, \"mem_mib\": {mem}}}' > {FAKE}/$SLURM_JOB_ID.json"
            f"; sleep {seconds}")


def job_id(r):
    assert r.returncode == 0, r.stderr
    jid = sp.parse_sbatch_stdout(r.stdout)
    assert jid, r.stdout
    return jid


@pytest.fixture()
def jobs():
    ids = []
    yield ids
    if ids:
        sh("scancel", *ids)  # only this test's jobs
    for j in ids:
        (FAKE / f"{j}.json").unlink(missing_ok=True)


def wait_done(ids, timeout=150):
    """Until sacct (slurmdbd) has every job finished."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = sh("sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State").stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        if len(states) == len(ids) and all(
                s.split()[0] in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY")
                for s in states.values()):
            return states
        time.sleep(1)
    raise AssertionError(f"jobs not finished in sacct: {out}")


def wait_probe_rows(ids, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        con = sqlite3.connect(f"file:{LEDGER_DB}?mode=ro", uri=True, timeout=10)
        try:
            have = {str(r[0]) for r in con.execute(
                "SELECT job_id FROM usage WHERE source = 'probe' AND job_id IN (%s)"
                % ",".join("?" * len(ids)), [int(i) for i in ids])}
        except sqlite3.OperationalError:
            have = set()
        finally:
            con.close()
        if have >= set(ids):
            return
        time.sleep(0.5)
    raise AssertionError(f"no probe rows for {set(ids) - have}")


def hacct_json(run, *args):
    r = run("hacct", "--json", *args)
    assert r.returncode == 0, r.stderr
    return {str(j["job_id"]): j for j in json.loads(r.stdout)}


def test_the_loop_is_closed_and_trusted(jobs, tmp_path):
    tag = uuid.uuid4().hex[:8]
    t0 = int(time.time())
    # alice's own copy of her model, in her home: sync will recompute its features as admin
    model = Path("/home/horus-alice") / f"small_cnn-{tag}.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    shutil.chown(model, "horus-alice", "horus-alice")
    try:
        common = ["-t", "2", "-o", "/dev/null", "-p", "gpu", "--gres=gpu:1"]
        root_job = job_id(as_root(
            "hsubmit", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "16",
            "--precision", "amp", *common, "-J", f"trust-root-{tag}", "--wrap", uses(20, 900)))
        jobs.append(root_job)
        alice_job = job_id(as_user(
            "horus-alice", "hsubmit", "--model", str(model), "--batch-size", "8", *common,
            "-J", f"trust-alice-{tag}", "--wrap", uses(10, 700)))
        jobs.append(alice_job)
        # bob claims next to nothing (the hook costs it at its memory floor) and uses a lot
        forged = [job_id(as_user("horus-bob", "sbatch", "--parsable", *common,
                                 "--comment", "horus:v1;a100=1/1/1;t4=1/1/1",
                                 "-J", f"trust-bob-{tag}", "--wrap", uses(90, 9000)))
                  for _ in range(3)]
        jobs.extend(forged)
        wait_done(jobs)
        wait_probe_rows(jobs)

        r = as_root("horus-admin", "sync", "--since", str(t0 - 60))
        assert r.returncode == 0, r.stderr
        rows = hacct_json(as_root, "-j", ",".join(jobs))
        assert set(rows) == set(jobs)
        for j in jobs:
            row = rows[j]
            # gpu_index: sacct has none on 22.05 or 25.11; the root probe read it from scontrol
            for field in ("pred_util_pct", "pred_mem_mib", "gpu_type", "gpu_index", "state",
                          "elapsed_s", "actual_util_pct", "actual_mem_mib"):
                assert row[field] is not None, (j, field, row)
            assert row["cluster"] == sp.parse_scontrol_config(
                sh("scontrol", "show", "config").stdout)["ClusterName"]
        assert rows[root_job]["user"] == "root"
        assert rows[alice_job]["user"] == "horus-alice"
        assert rows[alice_job]["actual_mem_mib"] == 700 and rows[alice_job]["under_claim"] is False
        assert rows[root_job]["under_claim"] is False
        whole = [j for j in jobs if rows[j]["gpus"]]
        assert all(rows[j]["shards"] is None and rows[j]["gpus"] == 1 for j in whole)
        for j in forged:
            assert rows[j]["user"] == "horus-bob"
            assert rows[j]["under_claim"] is True and "mem" in rows[j]["claim_flags"]
        # the features of alice's model were recomputed by sync (she can read her own file)
        con = sqlite3.connect(f"file:{LEDGER_DB}?mode=ro", uri=True)
        feats = con.execute("SELECT features FROM submissions WHERE job_id = ?",
                            (int(alice_job),)).fetchone()[0]
        con.close()
        assert feats and json.loads(feats)["flops"] > 0

        # one row per job: a second sync (and --all) changes nothing
        before = as_root("hacct", "--json", "-j", ",".join(jobs)).stdout
        assert as_root("horus-admin", "sync", "--all", "--since", str(t0 - 60)).returncode == 0
        assert as_root("hacct", "--json", "-j", ",".join(jobs)).stdout == before

        # ordinary users read their own jobs and can change nothing
        mine = hacct_json(lambda *c: as_user("horus-alice", *c), "--ledger", URL, "-S", "now-2days")
        assert alice_job in mine and mine[alice_job]["pred_util_pct"] is not None
        assert bob_cannot_change(alice_job)
        assert oct(LEDGER_DB.stat().st_mode & 0o777) == "0o640" and LEDGER_DB.stat().st_uid == 0
        again = hacct_json(as_root, "-j", alice_job)[alice_job]
        assert again["actual_mem_mib"] == 700 and again["user"] == "horus-alice"

        # the record: bob's under-claims, by uid; the hook now gives his jobs a whole GPU
        uid = int(sh("id", "-u", "horus-bob").stdout)
        line = next(ln.split() for ln in RECORD.read_text().splitlines()
                    if ln.startswith("user ") and ln.split()[1] == str(uid))
        assert int(line[3]) >= 3
        # (alice in her other account: bob's jobs ran in horus, which the record now flags too)
        held = [job_id(as_user(u, "sbatch", "--parsable", "--hold", *common, *acct,
                               "--comment", "horus:v1;a100=10/2000/2500;t4=10/2000/2500",
                               "-J", f"trust-next-{tag}", "--wrap", "true"))
                for u, acct in (("horus-bob", ()), ("horus-alice", ("-A", "horus-lab")))]
        jobs.extend(held)
        bob_next, alice_next = (sp.parse_scontrol_records(sh("scontrol", "show", "job", j).stdout)[0]
                                for j in held)
        assert "shard" not in bob_next.get("TresPerNode", "") and "gpu" in bob_next["TresPerNode"]
        assert "claim record" in bob_next.get("AdminComment", "")
        assert "shard" in alice_next.get("TresPerNode", "")
    finally:
        model.unlink(missing_ok=True)


def bob_cannot_change(alice_job) -> bool:
    """horus-bob, through sqlite directly, can neither update alice's row nor delete it: not in
    the live ledger (which he cannot even open) nor in the copy users read."""
    for db in (LEDGER_DB, LEDGER_DB.with_name(LEDGER_DB.name + ".readers")):
        for stmt in (f"UPDATE jobs SET act_mem_mib = 1 WHERE job_id = {int(alice_job)}",
                     f"DELETE FROM usage WHERE job_id = {int(alice_job)}"):
            r = as_user("horus-bob", "python3", "-c",
                        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]);"
                        " c.commit()", str(db), stmt)
            if r.returncode == 0 or not ("readonly" in r.stderr or "unable to open" in r.stderr):
                return False
    return True
