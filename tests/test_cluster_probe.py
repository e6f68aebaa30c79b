"""horus-probe from slurmd's Prolog/Epilog on the real local cluster (tests/cluster/up; source
tests/cluster/env.sh): jobs of ordinary users (horus-alice, horus-bob) are measured by a probe
running as root, through the fake sampler the test cluster's Prolog wrapper selects (the job
writes what it "used" to $D/fakegpu/<jobid>.json), and only root writes the measurement.
"""

import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp

pytestmark = pytest.mark.cluster

D = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster"))
LEDGER_DB = D / "ledger" / "ledger.db"
FAKE = D / "fakegpu"
USERS = ("horus-alice", "horus-bob")
TYPE_OF_NODE = {"gpu-a100": "a100", "gpu-t4": "t4"}


def sh(*args, check=False, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=60, **kw)


def _cluster_ok():
    if os.geteuid() != 0:
        return "needs root (runs jobs as the test users with runuser)"
    if not os.environ.get("SLURM_CONF") or not shutil.which("scontrol"):
        return "SLURM_CONF unset: start the cluster (bash tests/cluster/up; source tests/cluster/env.sh)"
    try:
        cp = sh("scontrol", "ping")
    except Exception as e:  # noqa: BLE001
        return f"scontrol ping failed: {e}"
    if cp.returncode != 0 or "UP" not in cp.stdout:
        return "slurmctld not up"
    conf = sh("scontrol", "show", "config").stdout
    if "horus-prolog" not in conf or "horus-epilog" not in conf:
        return "the cluster has no horus Prolog/Epilog: re-run tests/cluster/up"
    for u in USERS:
        if sh("id", "-u", u).returncode:
            return f"no user {u}: re-run tests/cluster/up"
    return None


_why = _cluster_ok()
if _why:
    pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=_why)]


def as_user(user, *cmd, **kw):
    """Run cmd as an ordinary user, with the test cluster's Slurm config and console scripts."""
    env = ["env", "-i", f"HOME=/home/{user}", f"USER={user}", f"LOGNAME={user}",
           f"SLURM_CONF={os.environ['SLURM_CONF']}", f"PATH={D}/bin:/usr/bin:/bin"]
    return sh("runuser", "-u", user, "--", *env, *cmd, cwd=str(D / "jobs"), **kw)


def submit(user, *args, util, mem):
    wrap = (f"printf '{{\"util_pct\": {util}, \"mem_mib\": {mem}}}' > {FAKE}/$SLURM_JOB_ID.json"
            "; sleep 6")
    r = as_user(user, "sbatch", "--parsable", "-t", "2", "-o", "/dev/null", "-J", "horus-probe-test",
                *args, "--wrap", wrap)
    assert r.returncode == 0, r.stderr
    return sp.parse_sbatch_stdout(r.stdout)


def probe_row(job_id):
    if not LEDGER_DB.exists():
        return None
    con = sqlite3.connect(f"file:{LEDGER_DB}?mode=ro", uri=True, timeout=10)
    try:
        con.row_factory = sqlite3.Row
        row = con.execute("SELECT * FROM usage WHERE cluster = 'horus' AND job_id = ? "
                          "AND source = 'probe'", (int(job_id),)).fetchone()
        return dict(row) if row else None
    finally:
        con.close()


@pytest.fixture()
def jobs():
    ids = []
    yield ids
    if ids:
        sh("scancel", *ids)  # only this test's jobs
    for j in ids:
        (FAKE / f"{j}.json").unlink(missing_ok=True)


def test_ordinary_users_jobs_are_measured_by_roots_probe(jobs):
    jobs.append(submit("horus-alice", "--gres=shard:5", util=42.5, mem=3210))
    jobs.append(submit("horus-bob", "--gres=gpu:1", util=88, mem=9000))
    seen = {}  # job id -> (node, placement) as Slurm reports it while the job runs
    deadline = time.time() + 120
    while time.time() < deadline:
        out = "\n\n".join(sh("scontrol", "-d", "show", "job", j).stdout for j in jobs)
        live = 0
        for rec in sp.parse_scontrol_records(out):
            st = sp.job_state(rec)
            if st == "RUNNING" and rec["JobId"] not in seen:
                seen[rec["JobId"]] = (rec["NodeList"], sp.job_gpus_on_node(rec, rec["NodeList"]))
            live += st in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
        if not live:
            break
        time.sleep(0.5)
    assert set(seen) == set(jobs), f"jobs did not run: {out}"
    rows = {}
    deadline = time.time() + 30
    while time.time() < deadline and len(rows) < len(jobs):
        rows = {j: r for j in jobs if (r := probe_row(j))}
        time.sleep(0.5)
    log = (D / "log" / "horus-probe.log")
    assert len(rows) == len(jobs), log.read_text()[-2000:] if log.exists() else "no probe log"
    for j, (util, mem) in zip(jobs, ((42.5, 3210), (88, 9000))):
        node, place = seen[j]
        r = rows[j]
        assert (r["util_mean"], r["util_max"], r["mem_peak_mib"]) == (util, util, mem)
        assert r["node"] == node and r["gpu_type"] == TYPE_OF_NODE[node]
        # what Slurm gave the job (the site's hook may turn a raw shard request into a whole GPU)
        assert [r["gpu_index"]] == place["indices"]
        assert r["shards"] == place["shards"]
        if "gpus" in r:
            assert r["gpus"] == place["gpus"]
        assert r["elapsed_s"] is not None and r["elapsed_s"] >= 3


def test_ordinary_user_cannot_write_measurements():
    if not LEDGER_DB.exists():
        pytest.skip("no test ledger yet (run the measurement test first)")
    for path in (LEDGER_DB, D / "ledger" / "new.db", D / "horus-spool" / "forged.jsonl",
                 D / "run" / "horus-probe" / "1.gpu-t4.pid"):
        r = as_user("horus-alice", "sh", "-c", f"echo x >> '{path}'")
        assert r.returncode != 0, path
    r = as_user("horus-alice", "python3", "-c",
                "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
                "c.execute('UPDATE usage SET util_mean = 1'); c.commit()", str(LEDGER_DB))
    assert r.returncode != 0 and ("readonly" in r.stderr or "unable to open" in r.stderr)
    assert as_user("horus-alice", "ls", str(D / "horus-spool")).returncode != 0
    assert oct(os.stat(D / "horus-spool").st_mode & 0o777) == "0o700"
    st = os.stat(LEDGER_DB)
    assert st.st_uid == 0 and not st.st_mode & 0o022


@pytest.mark.parametrize("args", [["--prolog"], ["--epilog"], ["--pid", "1"]])
def test_non_root_probe_refuses(args):
    r = as_user("horus-alice", "env", "SLURM_JOB_ID=1", "SLURMD_NODENAME=gpu-t4",
                f"HORUS_LEDGER_URL=sqlite:///{LEDGER_DB}", "horus-probe", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "refusing to record" in r.stderr


def test_a_rerun_is_predicted_from_its_run_after_one_sync(jobs):
    """Right the second time: once `horus-admin sync` recorded a finished job (measured by the
    root probe), its user's rerun of the same graph is predicted from that measurement
    (history:exact). The history had been refreshed by the weekly retrain only."""
    zoo = Path(__file__).resolve().parent / "data" / "zoo" / "mobilenet_v2.onnx"
    model = D / "jobs" / f"rerun-{os.getpid()}.onnx"
    reg = D / f"models-rerun-{os.getpid()}"
    shutil.copyfile(zoo, model)
    model.chmod(0o644)
    reg.mkdir(mode=0o755)
    try:
        hsubmit = ["env", f"HORUS_MODEL_DIR={reg}", "hsubmit", "--model", str(model), "--batch-size", "32",
                   "--task", "train", "--gres=gpu:1", "-t", "2", "-o", "/dev/null"]
        wrap = (f"printf '{{\"util_pct\": 33, \"mem_mib\": 2500}}' > {FAKE}/$SLURM_JOB_ID.json; sleep 6")
        r = as_user("horus-alice", *hsubmit, "--parsable", "-J", "horus-rerun-test", "--wrap", wrap)
        assert r.returncode == 0, r.stderr
        jobs.append(sp.parse_sbatch_stdout(r.stdout))
        deadline = time.time() + 120
        while time.time() < deadline and not probe_row(jobs[0]):
            time.sleep(1)
        measured = probe_row(jobs[0])
        assert measured, "the probe recorded nothing"
        ran_on = measured["gpu_type"]  # the hook may give the job any type's whole GPU
        assert ran_on, measured
        deadline, line = time.time() + 60, ""
        while time.time() < deadline and "history:exact" not in line:  # until accounting has it
            s = sh("horus-admin", "sync", "--ledger", f"sqlite:///{LEDGER_DB}", "--model-dir", str(reg),
                   "-S", "now-30minutes")
            assert s.returncode == 0, s.stderr
            r = as_user("horus-alice", *hsubmit, "--explain", "--wrap", "sleep 1")
            assert r.returncode == 0, r.stderr
            line = next(x for x in r.stdout.splitlines() if x.strip().startswith(f"{ran_on}:"))
            time.sleep(1)
        assert "(history:exact)" in line and "33.0 %" in line and "2500 MiB" in line, r.stdout
    finally:
        model.unlink(missing_ok=True)
        shutil.rmtree(reg, ignore_errors=True)


def test_a_users_probe_in_a_step_leaves_slurms_signal_to_cmd(jobs):
    """`srun horus-probe -- CMD` as a user, and the job's signal (scancel --signal=USR1, as
    --signal=USR1@60 sends it to every process of the step): the waiting probe died of it and
    srun reported "task 0: User defined signal 1" though CMD had trapped it and exited 7 (seen
    on this cluster). The unmeasured probe now execs CMD: the step ends with CMD's 7."""
    ready = D / "jobs" / "usr1-$SLURM_JOB_ID.ready"
    cmd = f"trap 'exit 7' USR1; touch {ready}; sleep 60 & wait"
    r = as_user("horus-alice", "sbatch", "--parsable", "-t", "2", "-o", "/dev/null", "-J", "horus-probe-usr1",
                "--wrap", f"srun horus-probe -- sh -c \"{cmd}\"")
    assert r.returncode == 0, r.stderr
    job = sp.parse_sbatch_stdout(r.stdout)
    jobs.append(job)
    marker = D / "jobs" / f"usr1-{job}.ready"
    deadline = time.time() + 90
    while time.time() < deadline and not marker.exists():
        time.sleep(0.5)
    assert marker.exists(), sh("scontrol", "show", "job", job).stdout
    marker.unlink()
    assert as_user("horus-alice", "scancel", "--signal=USR1", job).returncode == 0
    rec = {}
    deadline = time.time() + 60
    while time.time() < deadline:
        recs = sp.parse_scontrol_records(sh("scontrol", "show", "job", job).stdout)
        rec = recs[0] if recs else {}
        if sp.job_state(rec) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
    assert rec.get("ExitCode") == "7:0", rec
