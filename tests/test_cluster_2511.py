"""The loop on Slurm 25.11 with each backend (tests/run's 25.11 pass): hsubmit packs light jobs
into shards (25.11's gres/shard spelling), they end, `horus-admin sync` reads them through the
chosen backend (HORUS_SLURM_BACKEND), and hacct shows them as shard jobs on the T4 node's type,
with the GPU index that only the root probe knows on 25.11 (sacct has none): the jobs report a
use to the test cluster's fake sampler, and sync writes the cluster's ledger, where the probe
writes."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_horus.slurm import commands as slurm

pytestmark = pytest.mark.cluster
ZOO = Path(__file__).parent / "data" / "zoo"
D = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster"))


def _why_not():
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF unset (HORUS_SLURM=25.11 tests/cluster/up; source tests/cluster/env.sh)"
    try:
        version = slurm.slurm_version()
    except Exception as e:  # noqa: BLE001
        return f"no Slurm: {e}"
    return None if version.startswith("25.11.") else f"Slurm {version}, not 25.11"


_why = _why_not()
if _why:
    pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=_why)]


def run(*args, env, cwd):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def scontrol_job(jid):
    out = subprocess.run(["scontrol", "show", "job", "-o", jid], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


@pytest.mark.parametrize("backend", ["cli", "pyslurm"])
def test_packed_synced_and_shown(backend, tmp_path):
    have = slurm._pyslurm_version() or ""
    if backend == "pyslurm" and not have.startswith("25.11."):
        pytest.skip("pyslurm 25.11 not installed (tests/install --pyslurm /opt/slurm-25.11)")
    policy = tmp_path / "policy.conf"
    policy.write_text(f"record_file = {tmp_path / 'record'}\n")
    env = {**os.environ, "HORUS_SLURM_BACKEND": backend, "HORUS_POLICY": str(policy),
           "HORUS_LEDGER_URL": f"sqlite:///{D / 'ledger' / 'ledger.db'}",
           "HORUS_SPOOL": str(tmp_path / "spool")}
    body = (f"printf '{{\"util_pct\": 5, \"mem_mib\": 600}}' > {D}/fakegpu/$SLURM_JOB_ID.json"
            "; sleep 2")
    ids = []
    try:
        for bs in ("4", "8"):
            cp = run("slurm_horus.cli.hsubmit", "--parsable", "--model", str(ZOO / "small_cnn.onnx"),
                     "--batch-size", bs, "--task", "infer", "-p", "t4", "--gres=gpu:1",
                     "-o", "/dev/null", "--wrap", body, env=env, cwd=tmp_path)
            assert cp.returncode == 0, cp.stderr
            ids.append(cp.stdout.strip().split(";")[0])
        for jid in ids:
            job = scontrol_job(jid)
            assert re.fullmatch(r"gres/shard:\d+", job["TresPerNode"]), job
        deadline = time.time() + 120
        while True:
            got = {j["job_id"]: j for j in slurm.accounting_jobs(time.time() - 3600, time.time() + 60)}
            if all(got.get(int(i), {}).get("state") == "COMPLETED" and got[int(i)]["end_time"]
                   for i in ids):
                break
            assert time.time() < deadline, "jobs never showed up finished in accounting"
            time.sleep(1)
        cp = run("slurm_horus.cli.admin", "sync", "-S", "now-1hours", env=env, cwd=tmp_path)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        for jid in ids:
            cp = run("slurm_horus.cli.hacct", "--json", "-j", jid, env=env, cwd=tmp_path)
            assert cp.returncode == 0, cp.stderr
            (row,) = json.loads(cp.stdout)
            assert row["state"] == "COMPLETED" and row["gpu_type"] == "t4", row
            assert row["shards"] and row["gpus"] is None, row
            assert row["gpu_index"] is not None and row["actual_mem_mib"] == 600, row
            assert row["predictor"] == "hint" and row["pred_util_pct"] is not None
    finally:
        subprocess.run(["scancel", *ids], capture_output=True)
        for jid in ids:
            (D / "fakegpu" / f"{jid}.json").unlink(missing_ok=True)
