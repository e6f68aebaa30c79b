"""hsubmit against the real local Slurm 22.05 cluster (tests/cluster/up; source tests/cluster/env.sh).

Submits light (packable) and heavy predicted jobs through hsubmit and checks what slurmctld did:
shared GPUs, shard sums, memory sums, whole GPUs for heavy jobs, untouched multi-GPU and no-model
jobs, --explain == slurmctld, sacct's shard TRES and AdminComment, Slurm's comment limit, and the
loop through Slurm itself: hsubmit -> the job ends -> horus-admin sync -> hacct.
Each test cancels only the jobs it submitted.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp
from slurm_horus.slurm.hint import parse_hint

pytestmark = pytest.mark.cluster


def tres(s):
    """TresPerNode in 22.05's spelling: 23.11+ writes gres/shard:N where 22.05 wrote gres:shard:N."""
    return s.replace("gres/", "gres:") if s else s

ZOO = Path(__file__).parent / "data" / "zoo"
HSUBMIT = [sys.executable, "-m", "slurm_horus.cli.hsubmit"]
ADMIN = [sys.executable, "-m", "slurm_horus.cli.admin"]
HACCT = [sys.executable, "-m", "slurm_horus.cli.hacct"]
GPU_MEM = {"a100": 40960, "t4": 15360}  # the policy's gpu.<type>.mem_mib (etc/horus_policy.conf)
# The tests that check sharing submit under root's own account: the hook judges a job without -A
# under its default account, horus, which the site's claim record flags once
# tests/test_cluster_trust.py's sync has seen horus-bob's forged jobs in it.
OWN_ACCOUNT = ["-A", "root"]


def _cluster_ok():
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF unset: start the cluster (bash tests/cluster/up; source tests/cluster/env.sh)"
    if not shutil.which("scontrol"):
        return "scontrol not installed"
    try:
        cp = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except Exception as e:  # noqa: BLE001
        return f"scontrol ping failed: {e}"
    if cp.returncode != 0 or "UP" not in cp.stdout:
        return f"scontrol ping: slurmctld not up ({(cp.stdout + cp.stderr).strip()[:100]})"
    return None


_why = _cluster_ok()
if _why:
    pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=_why)]


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw)


MINE: list[str] = []  # job ids the running test submitted: the only ones it may cancel


def track(sbatch_stdout: str) -> str:
    m = re.search(r"(\d+)", sbatch_stdout)
    assert m, sbatch_stdout
    MINE.append(m.group(1))
    return m.group(1)


@pytest.fixture()
def workdir(tmp_path):
    yield tmp_path
    if MINE:
        subprocess.run(["scancel", *MINE], capture_output=True)
        MINE.clear()


def hsubmit(workdir, *args, check=True, env=None):
    cp = subprocess.run([*HSUBMIT, "--parsable", *args], capture_output=True, text=True,
                        cwd=workdir, env=env)
    if cp.returncode == 0:
        track(cp.stdout)
    if check:
        assert cp.returncode == 0, cp.stderr
    return cp


def show(job_id):
    return sp.parse_scontrol_records(sh("scontrol", "-d", "show", "job", str(job_id)).stdout)[0]


def wait_running(ids, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        jobs = {i: show(i) for i in ids}
        if all(j["JobState"] in ("RUNNING", "COMPLETED") for j in jobs.values()):
            return jobs
        time.sleep(0.5)
    return jobs


# shards (the largest per-type need, t4's): 13, 74, 13, 76, 13 -> fit the two T4s (first fit)
LIGHT = [("small_cnn.onnx", "8"), ("mobilenet_v2.onnx", "8"), ("small_cnn.onnx", "16"),
         ("mobilenet_v2.onnx", "16"), ("small_cnn.onnx", "4")]


def test_packing_on_real_slurm(workdir):
    # Whole-GPU jobs first: they take the four A100s (first fit), so the light jobs, which the
    # shipped policy lets run on any type (type_choice = any), must share the two T4s.
    multi = hsubmit(workdir, "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8",
                    "-p", "a100", "--gres=gpu:2", "-J", "multi", "--wrap", "sleep 60").stdout.strip()
    plain = hsubmit(workdir, "--gres=gpu:1", "--comment", "plain job", "-p", "a100",
                    "--wrap", "sleep 60").stdout.strip()
    heavy = hsubmit(workdir, "--model", str(ZOO / "vgg16.onnx"), "--batch-size", "128",
                    "--gres=gpu:1", "-J", "heavy", "--wrap", "sleep 60").stdout.strip()
    wait_running([multi, plain, heavy])
    light = [hsubmit(workdir, *OWN_ACCOUNT, "--model", str(ZOO / m), "--batch-size", b, "--task", "infer",
                     "--gres=gpu:1", "-J", f"light{i}", "--wrap", "sleep 60").stdout.strip()
             for i, (m, b) in enumerate(LIGHT)]
    ids = light + [heavy, multi, plain]
    assert all(i.isdigit() for i in ids), ids
    jobs = wait_running(ids)

    # per (node, GPU index): shards and predicted memory of the jobs on it
    shards = defaultdict(int)
    mem = defaultdict(float)
    whole = defaultdict(list)
    for i in light:
        j = jobs[i]
        assert j["JobState"] == "RUNNING", (i, j["JobState"], j.get("Reason"))
        assert tres(j["TresPerNode"]).startswith("gres:shard:"), tres(j["TresPerNode"])
        hint = parse_hint(j["Comment"])
        (d,) = sp.job_gres_detail(j)
        (g,) = d["gres"]
        gtype = "a100" if d["node"] == "gpu-a100" else "t4"
        assert g["name"] == "shard" and len(g["idx"]) == 1
        shards[(d["node"], g["idx"][0])] += g["count"]
        mem[(d["node"], g["idx"][0])] += hint[gtype][2]  # p90 memory, the policy's `memory = p90`
    for i in (heavy, multi, plain):
        for d in sp.job_gres_detail(jobs[i]):
            for g in d["gres"]:
                assert g["name"] == "gpu"
                for idx in g["idx"]:
                    whole[(d["node"], idx)].append(i)
    assert any(n > 1 for n in
               defaultdict(int, {k: sum(1 for i in light if _gpu_of(jobs[i]) == k) for k in shards}).values()), \
        "no two light jobs share a GPU"
    for key, total in shards.items():
        assert total <= 100, (key, total)
        node_type = "a100" if key[0] == "gpu-a100" else "t4"
        assert mem[key] <= GPU_MEM[node_type], (key, mem[key])
        assert key not in whole, f"GPU {key} both shared and whole"
    # heavy: a whole GPU
    h = jobs[heavy]
    assert h["JobState"] == "RUNNING" and "gpu" in tres(h["TresPerNode"]) and "shard" not in tres(h["TresPerNode"])
    assert "horus: exclusive" in h.get("AdminComment", ""), h.get("AdminComment")
    # gpu:2 job: untouched, two whole GPUs
    m = jobs[multi]
    assert tres(m["TresPerNode"]) == "gres:gpu:2" and "unchanged" in m.get("AdminComment", "")
    assert sum(len(g["idx"]) for d in sp.job_gres_detail(m) for g in d["gres"]) == 2
    # no model: exactly as given, no hint, no decision
    p = jobs[plain]
    assert tres(p["TresPerNode"]) == "gres:gpu:1" and p["Comment"] == "plain job"
    assert "AdminComment" not in p or not p["AdminComment"]

    # sacct: shard TRES and the decision (22.05 stores the hook's AdminComment in the job's
    # accounting record when the job ends: end the two jobs first)
    sh("scancel", light[0], heavy)
    deadline = time.time() + 20
    while True:
        rows = sp.parse_pipe_table(sh("sacct", "-P", "-X", "-j", ",".join([light[0], heavy]),
                                      "-o", "JobID,AllocTRES,AdminComment,Comment").stdout)
        by = {r["JobID"]: r for r in rows}
        if (light[0] in by and "gres/shard=" in by[light[0]]["AllocTRES"]
                and "horus:" in by[light[0]]["AdminComment"]
                and "horus:" in by.get(heavy, {}).get("AdminComment", "")) or time.time() > deadline:
            break
        time.sleep(1)
    assert "gres/shard=" in by[light[0]]["AllocTRES"]
    assert "horus: shared" in by[light[0]]["AdminComment"]
    assert "horus:v1;" in by[light[0]]["Comment"]
    assert "gres/gpu=1" in by[heavy]["AllocTRES"] and "horus: exclusive" in by[heavy]["AdminComment"]


def _gpu_of(job):
    (d,) = sp.job_gres_detail(job)
    return (d["node"], d["gres"][0]["idx"][0])


def test_explain_agrees_with_slurmctld(workdir):
    cases = [
        [*OWN_ACCOUNT, "--model", str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer",
         "--gres=gpu:1", "--comment", "mine"],
        ["--model", str(ZOO / "vgg16.onnx"), "--batch-size", "128", "--gres=gpu:1"],
        ["--model", str(ZOO / "resnet50.onnx"), "--batch-size", "32", "--gpus=1", "-p", "a100"],
        # whole in slurmctld's hook (srun steps would ask for GPUs; Slurm refuses the frequency)
        [*OWN_ACCOUNT, "--model", str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer",
         "--gpus-per-node=1"],
        [*OWN_ACCOUNT, "--model", str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer",
         "--gres=gpu:1", "--gpu-freq=high"],
    ]
    for args in cases:
        name = f"explain-{os.getpid()}-{time.time_ns()}"
        exp = subprocess.run([*HSUBMIT, *args, "-J", name, "--explain", "--wrap", "sleep 30"],
                             capture_output=True, text=True, cwd=workdir)
        assert exp.returncode == 0, exp.stderr
        assert not sh("squeue", "-h", "-n", name).stdout.strip(), "--explain submitted a job"
        decision = next(ln for ln in exp.stdout.splitlines() if ln.startswith("decision: "))
        conf_dir = os.path.dirname(os.environ["SLURM_CONF"])  # it says which hook it ran
        assert f"hook: {conf_dir}/job_submit.lua with " in exp.stdout, exp.stdout
        jid = hsubmit(workdir, *args, "--wrap", "sleep 30").stdout.strip()
        job = show(jid)
        assert decision[len("decision: "):] == job["AdminComment"], (decision, job["AdminComment"])
        hint_line = next(ln for ln in exp.stdout.splitlines() if ln.startswith("hint: "))
        assert hint_line[len("hint: "):] in job["Comment"].split()  # the workload token follows
        if "--comment" in args:
            assert job["Comment"].startswith("mine horus:v1;")
        if "shared" in decision:
            assert tres(job["TresPerNode"]).startswith("gres:shard:")
            assert f"shards={job['TresPerNode'].rsplit(':', 1)[1]}/" in decision


def test_passthrough_and_errors(workdir):
    # sbatch's own errors come back exactly, with its exit code
    a = subprocess.run(["sbatch", "-p", "nosuch", "--wrap", "true"], capture_output=True, text=True, cwd=workdir)
    b = subprocess.run([*HSUBMIT, "-p", "nosuch", "--wrap", "true"], capture_output=True, text=True, cwd=workdir)
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr) and b.returncode == 1
    # non-parsable output as sbatch prints it
    c = subprocess.run([*HSUBMIT, "--model", str(ZOO / "small_cnn.onnx"), "--gres=gpu:1",
                        "--wrap", "true"], capture_output=True, text=True, cwd=workdir)
    assert c.returncode == 0 and c.stdout.startswith("Submitted batch job ")
    track(c.stdout)
    # a bad model: warning, job submitted unchanged
    bad = workdir / "bad.onnx"
    bad.write_text("garbage")
    d = hsubmit(workdir, "--model", str(bad), "--gres=gpu:1", "--wrap", "true")
    assert "hsubmit: warning:" in d.stderr and len(ours(d.stderr)) == 1
    assert tres(show(d.stdout.strip())["TresPerNode"]) == "gres:gpu:1"
    # ... or refused
    e = subprocess.run([*HSUBMIT, "--model", str(bad), "--gres=gpu:1", "--wrap", "true"], capture_output=True,
                       text=True, cwd=workdir, env={**os.environ, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert e.returncode == 1 and e.stdout == "" and "refused" in e.stderr
    # an empty --model (an unset variable) is a model that cannot be read, not no model: it had
    # gone unchanged past on_prediction_error = refuse, with no word
    e = subprocess.run([*HSUBMIT, "--model", "", "--gres=gpu:1", "--wrap", "true"], capture_output=True,
                       text=True, cwd=workdir, env={**os.environ, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert e.returncode == 1 and e.stdout == "" and "--model is empty" in e.stderr
    d = hsubmit(workdir, "--model", "", "--gres=gpu:1", "--wrap", "true")
    assert "--model is empty" in d.stderr and tres(show(d.stdout.strip())["TresPerNode"]) == "gres:gpu:1"
    # a script file with #SBATCH/#HORUS lines and its own arguments
    script = workdir / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1 -J fromscript\n#SBATCH --comment=scripted\n"
                      f"#HORUS --model={ZOO / 'small_cnn.onnx'} --batch-size=4 --task=infer\n"
                      "echo \"$@\"\n")
    f = hsubmit(workdir, str(script), "--model", "x", "--batch-size", "3")
    job = show(f.stdout.strip())
    assert job["JobName"] == "fromscript" and job["Comment"].startswith("scripted horus:v1;")
    # the script's arguments: in Command on 22.05, only in SubmitLine from 23.02
    assert job.get("SubmitLine", job["Command"]).endswith("job.sh --model x --batch-size 3")


def test_long_comment_never_refused(workdir):
    """Slurm refuses a comment over 1,024 characters: hsubmit keeps within it."""
    model = ["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", "--gres=gpu:1"]
    cp = hsubmit(workdir, *model, "--comment", "c" * 1000, "--wrap", "true")
    (warning,) = ours(cp.stderr)
    assert warning.startswith("hsubmit: warning: ") and "no room for the hint" in warning
    assert show(cp.stdout.strip())["Comment"] == "c" * 1000
    cp = hsubmit(workdir, *model, "--comment", "c" * 900, "--wrap", "true")
    comment = show(cp.stdout.strip())["Comment"]
    assert len(comment) <= 1024 and parse_hint(comment)
    # the hint fits, the workload token does not: said, as that run teaches the site nothing
    (warning,) = ours(cp.stderr)
    assert "no room for the job's workload" in warning and "horus-job:" not in comment


def ours(stderr: str) -> list[str]:
    """hsubmit's own lines (sbatch passes on what the hook tells the user too)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("hsubmit:")]


def test_hsubmit_writes_nothing_and_ignores_horus_probe(workdir, tmp_path):
    """The prediction travels in the comment only: no ledger, no spool, as any user."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HORUS_LEDGER_URL": f"sqlite:///{home / 'ledger.db'}",
           "HORUS_SPOOL": str(home / "spool"), "HOME": str(home)}
    cp = hsubmit(workdir, "--horus-probe", "--model", str(ZOO / "small_cnn.onnx"),
                 "--gres=gpu:1", "-o", "out.txt", "--wrap", "echo job-ran", env=env)
    probe, batch = ours(cp.stderr)
    assert "--horus-probe is ignored" in probe and "no --batch-size: predicted for batch 1" in batch
    job_id = cp.stdout.strip().split(";")[0]
    assert "horus-probe" not in sh("scontrol", "write", "batch_script", job_id, "-").stdout
    assert wait_finished(job_id) == "COMPLETED"
    assert (workdir / "out.txt").read_text().strip() == "job-ran"
    assert not list(home.iterdir())


def wait_finished(job_id, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = show(job_id).get("JobState")
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(0.5)
    return state


def test_the_loop_through_slurm(workdir, tmp_path):
    """hsubmit -> the job ends -> one horus-admin sync (as root) -> hacct shows the job with its
    prediction, placement and state, and the ledger holds features sync recomputed itself."""
    from slurm_horus.graph.features import extract_features
    from slurm_horus.ledger import Ledger
    from slurm_horus.slurm.accounting import parse_sacct_json
    from slurm_horus.slurm.commands import run_sacct

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    policy = tmp_path / "policy.conf"
    policy.write_text(f"record_file = {tmp_path / 'record'}\n")
    env = {**os.environ, "HORUS_LEDGER_URL": url, "HORUS_SPOOL": str(tmp_path / "spool"),
           "HORUS_POLICY": str(policy)}
    model = ZOO / "small_cnn.onnx"
    jid = hsubmit(workdir, "--model", str(model), "--batch-size", "8", "--gres=gpu:1",
                  "--wrap", "sleep 1", env=env).stdout.strip().split(";")[0]
    assert wait_finished(jid) == "COMPLETED"
    # slurmdbd fills in a short job's times a moment after scontrol says COMPLETED: wait until
    # the job shows up finished in the time-window query sync runs
    deadline = time.time() + 90
    while not [j for j in parse_sacct_json(run_sacct(time.time() - 3600, time.time()))
               if str(j["job_id"]) == jid and j["state"] == "COMPLETED" and j["end_time"]]:
        assert time.time() < deadline, f"job {jid} never showed up finished in sacct"
        time.sleep(1)
    cp = subprocess.run([*ADMIN, "sync", "-S", "now-1hours"], capture_output=True, text=True,
                        env=env)
    assert cp.returncode == 0 and cp.stdout.startswith("sync: "), cp.stdout + cp.stderr
    cp = subprocess.run([*HACCT, "--json", "-j", jid], capture_output=True, text=True, env=env)
    assert cp.returncode == 0, cp.stderr
    (job,) = json.loads(cp.stdout)
    for key in ("pred_util_pct", "pred_mem_mib", "gpu_type", "state", "elapsed_s"):
        assert job[key] is not None, (key, job)
    assert job["state"] == "COMPLETED" and job["predictor"] == "hint"
    cluster = sh("scontrol", "show", "config").stdout
    assert job["cluster"] == re.search(r"^ClusterName\s*=\s*(\S+)", cluster, re.M).group(1)
    assert (job["shards"] is None) != (job["gpus"] is None)
    sub = Ledger(url).submission(job["cluster"], int(jid))
    assert json.loads(sub["features"]) == extract_features(model, batch_size=8).values
    assert sub["uid"] == 0 and sub["user_name"] == "root" and sub["policy_decision"]
    assert (tmp_path / "record").read_text().startswith("# slurm-horus claim record")
    # a second sync (and one with --all) records nothing twice
    for extra in ([], ["--all"]):
        subprocess.run([*ADMIN, "sync", "-S", "now-1hours", *extra], capture_output=True, env=env,
                       check=True)
    assert len([s for s in Ledger(url).jobs(job_ids=[int(jid)])]) == 1


def test_a_step_asking_for_a_gpu_by_name_still_runs(workdir):
    """srun --gres=gpu:1 (or --gpus=1) inside a job moved onto shards failed: "Invalid generic
    resource (gres) specification".  The hook leaves such a job as submitted, and --explain
    says so too; a plain srun step is still shared."""
    model = [*OWN_ACCOUNT, "--model", str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer",
             "--gres=gpu:1"]
    # a GPU binding too: 25.11 gave such a step of a job on shards no GPU (CUDA_VISIBLE_DEVICES empty)
    seen = 'srun --gpu-bind=none sh -c "test -n \\"\\$CUDA_VISIBLE_DEVICES\\""'
    for step, shared in (("srun --gres=gpu:1 true", False), ("srun --gpus=1 true", False), (seen, False),
                         ("srun true", True)):
        exp = subprocess.run([*HSUBMIT, *model, "--explain", "--wrap", step], capture_output=True, text=True,
                             cwd=workdir)
        decision = next(ln for ln in exp.stdout.splitlines() if ln.startswith("decision: "))
        jid = hsubmit(workdir, *model, "-t", "1", "-o", str(workdir / "out-%j"), "--wrap", step).stdout.strip()
        job = show(jid)
        assert decision[len("decision: "):] == job["AdminComment"], (decision, job["AdminComment"])
        assert tres(job["TresPerNode"]).startswith("gres:shard:") == shared, job["TresPerNode"]
        assert ("srun steps ask for GPUs" in job["AdminComment"]) == (not shared)
        assert wait_finished(jid) == "COMPLETED", (step, (workdir / f"out-{jid}").read_text())


@pytest.mark.parametrize("args,why", [(["--gpus=1"], "--gres=gpu:1"), (["--gpus-per-node=1"], "--gres=gpu:1"),
                                      (["--gres=gpu:1", "--gpu-freq=high"], "--gpu-freq"),
                                      (["--gres=gpu:1", "--gpu-bind=closest"], "--gpu-bind")],
                         ids=["gpus", "gpus-per-node", "gpu-freq", "gpu-bind"])
def test_gpus_options_and_gpu_freq_keep_the_job_whole(workdir, args, why):
    """A review: --gpus=1 and --gpus-per-node=1 jobs were put on shards, and sbatch puts
    SLURM_GPUS / SLURM_GPUS_PER_NODE in the job's environment, which every srun step reads as its
    own GPU request ("Step requested GRES (gpu:(null)) not found"); a --gpu-freq job on shards was
    refused by slurmctld ("Invalid generic resource (gres) specification"); a --gpu-bind job on
    shards ran its steps without a GPU on 25.11 (CUDA_VISIBLE_DEVICES empty).  Each now runs as
    submitted, on a whole GPU its steps see, and is told why."""
    model = ["--model", str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer"]
    cp = hsubmit(workdir, *model, *args, "-t", "1", "-o", str(workdir / "out-%j"), "--wrap",
                 'srun sh -c "test -n \\"\\$CUDA_VISIBLE_DEVICES\\""', check=False)
    assert cp.returncode == 0, cp.stderr
    jid = cp.stdout.strip()
    job = show(jid)
    assert tres(job.get("TresPerJob") or job.get("TresPerNode")) == "gres:gpu:1", job
    assert "horus: unchanged" in job["AdminComment"] and why in job["AdminComment"], job["AdminComment"]
    assert any(ln.startswith("sbatch: horus: unchanged") for ln in cp.stderr.splitlines()), cp.stderr
    assert wait_finished(jid) == "COMPLETED", (workdir / f"out-{jid}").read_text()


def test_an_srun_allocation_keeps_its_gpu(workdir):
    """A review: `srun --gres=gpu:1 --comment=<hint> cmd` (an allocation of its own, no batch
    script) was put on shards, and its step, asking for the gpu:1 again, failed.  srun and salloc
    allocations stay as submitted."""
    hint = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"
    name = f"horus-srun-{os.getpid()}-{time.time_ns()}"
    try:
        cp = subprocess.run(["srun", "-J", name, "-t", "1", "--gres=gpu:1", f"--comment={hint}", "true"],
                            capture_output=True, text=True, cwd=workdir, timeout=90)
    finally:  # its job, by its unique name: the fixture cancels it should srun have hung
        MINE.extend(sh("squeue", "-h", "-t", "all", "-n", name, "-o", "%i").stdout.split())
    assert cp.returncode == 0, cp.stderr
    (jid,) = MINE
    job = show(jid)
    assert tres(job["TresPerNode"]) == "gres:gpu:1" and "no batch script" in job["AdminComment"], job
    assert "srun: horus: unchanged" in cp.stderr
