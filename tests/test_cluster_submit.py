"""hsubmit against the real local Slurm 22.05 cluster (tests/cluster/up; source tests/cluster/env.sh).

Submits light (packable) and heavy predicted jobs through hsubmit and checks what slurmctld did:
shared GPUs, shard sums, memory sums, whole GPUs for heavy jobs, untouched multi-GPU and no-model
jobs, --explain == slurmctld, and sacct's shard TRES and AdminComment.
"""

import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from slurm_horus import slurm_parse as sp
from slurm_horus.hint import parse_hint

pytestmark = pytest.mark.cluster

ZOO = Path(__file__).parent / "data" / "zoo"
HSUBMIT = [sys.executable, "-m", "slurm_horus.cli.hsubmit"]
GPU_MEM = {"a100": 40960, "t4": 15360}  # the policy's gpu.<type>.mem_mib (etc/horus_policy.conf)


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


def scancel_all():
    subprocess.run(["scancel", "-u", str(os.getuid())], capture_output=True)
    for _ in range(40):
        if not sh("squeue", "-h", "-t", "PD,R,CG", "-u", str(os.getuid())).stdout.strip():
            return
        time.sleep(0.25)


@pytest.fixture()
def workdir(tmp_path):
    scancel_all()
    yield tmp_path
    scancel_all()


def hsubmit(workdir, *args, check=True):
    cp = subprocess.run([*HSUBMIT, "--parsable", *args], capture_output=True, text=True, cwd=workdir)
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
    light = [hsubmit(workdir, "--model", str(ZOO / m), "--batch-size", b, "--task", "infer",
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
        assert j["TresPerNode"].startswith("gres:shard:"), j["TresPerNode"]
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
    assert h["JobState"] == "RUNNING" and "gpu" in h["TresPerNode"] and "shard" not in h["TresPerNode"]
    assert "horus: exclusive" in h.get("AdminComment", ""), h.get("AdminComment")
    # gpu:2 job: untouched, two whole GPUs
    m = jobs[multi]
    assert m["TresPerNode"] == "gres:gpu:2" and "unchanged" in m.get("AdminComment", "")
    assert sum(len(g["idx"]) for d in sp.job_gres_detail(m) for g in d["gres"]) == 2
    # no model: exactly as given, no hint, no decision
    p = jobs[plain]
    assert p["TresPerNode"] == "gres:gpu:1" and p["Comment"] == "plain job"
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
        ["--model", str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer",
         "--gres=gpu:1", "--comment", "mine"],
        ["--model", str(ZOO / "vgg16.onnx"), "--batch-size", "128", "--gres=gpu:1"],
        ["--model", str(ZOO / "resnet50.onnx"), "--batch-size", "32", "--gpus=1", "-p", "a100"],
    ]
    for args in cases:
        exp = subprocess.run([*HSUBMIT, *args, "--explain", "--wrap", "sleep 30"],
                             capture_output=True, text=True, cwd=workdir)
        assert exp.returncode == 0, exp.stderr
        decision = next(ln for ln in exp.stdout.splitlines() if ln.startswith("decision: "))
        assert not sh("squeue", "-h", "-u", str(os.getuid())).stdout.strip() or True
        jid = hsubmit(workdir, *args, "--wrap", "sleep 30").stdout.strip()
        job = show(jid)
        assert decision[len("decision: "):] == job["AdminComment"], (decision, job["AdminComment"])
        hint_line = next(ln for ln in exp.stdout.splitlines() if ln.startswith("hint: "))
        assert job["Comment"].endswith(hint_line[len("hint: "):])
        if "--comment" in args:
            assert job["Comment"].startswith("mine horus:v1;")
        if "shared" in decision:
            assert job["TresPerNode"].startswith("gres:shard:")
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
    # a bad model: warning, job submitted unchanged
    bad = workdir / "bad.onnx"
    bad.write_text("garbage")
    d = hsubmit(workdir, "--model", str(bad), "--gres=gpu:1", "--wrap", "true")
    assert "hsubmit: warning:" in d.stderr and len(d.stderr.strip().splitlines()) == 1
    assert show(d.stdout.strip())["TresPerNode"] == "gres:gpu:1"
    # ... or refused
    e = subprocess.run([*HSUBMIT, "--model", str(bad), "--wrap", "true"], capture_output=True,
                       text=True, cwd=workdir, env={**os.environ, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert e.returncode == 1 and e.stdout == "" and "refused" in e.stderr
    # a script file with #SBATCH/#HORUS lines and its own arguments
    script = workdir / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1 -J fromscript\n#SBATCH --comment=scripted\n"
                      f"#HORUS --model={ZOO / 'small_cnn.onnx'} --batch-size=4 --task=infer\n"
                      "echo \"$@\"\n")
    f = hsubmit(workdir, str(script), "--model", "x", "--batch-size", "3")
    job = show(f.stdout.strip())
    assert job["JobName"] == "fromscript" and job["Comment"].startswith("scripted horus:v1;")
    assert job["Command"].endswith("job.sh --model x --batch-size 3")


def test_submission_reaches_the_ledger_in_the_background(workdir, tmp_path):
    """hsubmit returns once sbatch has answered; a detached child records the submission."""
    import os

    from slurm_horus.ledger import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    env = {**os.environ, "HORUS_LEDGER_URL": url, "HORUS_SPOOL": str(tmp_path / "spool")}
    cp = subprocess.run([*HSUBMIT, "--parsable", "--model", str(ZOO / "small_cnn.onnx"),
                         "--batch-size", "8", "--gres=gpu:1", "--wrap", "sleep 30"],
                        capture_output=True, text=True, cwd=workdir, env=env)
    assert cp.returncode == 0, cp.stderr
    job_id = int(cp.stdout.strip().split(";")[0])
    deadline, sub = time.time() + 30, None
    while time.time() < deadline and sub is None:
        time.sleep(0.5)
        if (tmp_path / "ledger.db").exists():
            sub = Ledger(url).submission("", job_id) or Ledger(url).submission("horus", job_id)
    assert sub is not None, "submission never recorded"
    assert "horus:v1" in (sub.get("hint") or "")


def test_horus_probe_starts_with_the_job_and_never_harms_it(workdir):
    """No NVML on this machine: the probe must exit quietly and the job finish with code 0."""
    cp = hsubmit(workdir, "--horus-probe", "--gres=gpu:1", "-o", "out.txt",
                 "--wrap", "echo job-ran; sleep 1")
    job_id = cp.stdout.strip().split(";")[0]
    script = sh("scontrol", "write", "batch_script", job_id, "-").stdout
    assert "horus-probe --pid $$" in script and "echo job-ran" in script
    deadline = time.time() + 30
    while time.time() < deadline:
        state = show(job_id).get("JobState")
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
    assert state == "COMPLETED" and show(job_id)["ExitCode"] == "0:0"
    assert (workdir / "out.txt").read_text().strip() == "job-ran"
