"""The two ways slurm-horus reads Slurm (slurm.backend(): cli and pyslurm) give the same records,
on the running local cluster. The pyslurm comparisons need pyslurm built for that cluster's Slurm
(tests/run's 25.11 pass installs it); backend choice is checked on either cluster."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_horus.slurm import commands as slurm
from slurm_horus.slurm import parse as sp
from slurm_horus.errors import HorusError

pytestmark = pytest.mark.cluster
ZOO = Path(__file__).parent / "data" / "zoo"
NO_START = 2 ** 32 - 2  # sacct --json's start of a job that never started (see report)


@pytest.fixture(autouse=True)
def _cluster(monkeypatch):
    if not os.environ.get("SLURM_CONF") or not shutil.which("sinfo"):
        pytest.skip("SLURM_CONF unset (tests/cluster/up; source tests/cluster/env.sh)")
    if subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode:
        pytest.skip("the local cluster is down")
    slurm._chosen.clear()
    yield
    slurm._chosen.clear()


def _pyslurm_matches() -> bool:
    have = slurm._pyslurm_version()
    try:
        major = ".".join(slurm.slurm_version().split(".")[:2])
    except HorusError:  # no cluster: the autouse fixture skips
        return False
    return bool(have) and have.startswith(major + ".")


needs_pyslurm = pytest.mark.skipif("not _pyslurm_matches()",
                                   reason="no pyslurm built for this cluster's Slurm")


def with_backend(monkeypatch, name, fn, *args):
    monkeypatch.setenv("HORUS_SLURM_BACKEND", name)
    slurm._chosen.clear()
    assert slurm.backend() == name
    return fn(*args)


def test_choice(monkeypatch):
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "cli")
    assert slurm.backend() == "cli"
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "auto")
    assert slurm.backend() == ("pyslurm" if _pyslurm_matches() else "cli")
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "carrier-pigeon")
    with pytest.raises(HorusError, match="need cli, pyslurm or auto"):
        slurm.backend()
    if not _pyslurm_matches():
        monkeypatch.setenv("HORUS_SLURM_BACKEND", "pyslurm")
        with pytest.raises(HorusError, match=r"install pyslurm==\d+\.\d+\.\*"):
            slurm.backend()


def test_forced_pyslurm_on_a_mismatch_is_one_line_and_hsubmit_goes_on(tmp_path):
    if _pyslurm_matches():
        pytest.skip("pyslurm matches this cluster's Slurm")
    env = {**os.environ, "HORUS_SLURM_BACKEND": "pyslurm"}
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", "--model",
                         str(ZOO / "mobilenet_v2.onnx"), "--batch-size", "8", "--task", "infer",
                         "--gres=gpu:1", "--explain", "--wrap", "true"],
                        capture_output=True, text=True, env=env, cwd=tmp_path)
    # hsubmit never blocks a submission on its own trouble: it says why and submits unchanged
    assert cp.returncode == 0, cp.stderr
    (line,) = [ln for ln in cp.stderr.splitlines() if "HORUS_SLURM_BACKEND=pyslurm" in ln]
    assert "install pyslurm==" in line and "Traceback" not in cp.stderr


@needs_pyslurm
def test_nodes_partitions_and_gpu_types_agree(monkeypatch):
    keys = ("NodeName", "Gres", "Partitions", "AvailableFeatures", "ActiveFeatures")
    got = {}
    for be in ("cli", "pyslurm"):
        nodes = with_backend(monkeypatch, be, slurm.scontrol_nodes)
        parts = with_backend(monkeypatch, be, slurm.scontrol_partitions)
        got[be] = ({n["NodeName"]: {k: n.get(k) for k in keys} for n in nodes},
                   {p["PartitionName"]: (p["Default"], p["Nodes"]) for p in parts},
                   with_backend(monkeypatch, be, slurm.partition_gpu_types, None),
                   with_backend(monkeypatch, be, slurm.partition_gpu_types, "t4"))
    assert got["cli"] == got["pyslurm"]
    assert got["cli"][2] == ("gpu", {"a100": 4, "t4": 2}) and got["cli"][3] == ("t4", {"t4": 2})


def _submit(*args):
    cp = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True,
                        text=True, timeout=30, check=True, cwd="/tmp")
    return int(cp.stdout.strip().split(";")[0])


@needs_pyslurm
def test_running_jobs_agree(monkeypatch):
    """Same jobs, states, comments, nodes and GRES; the GPU index of whole-GPU jobs from both,
    a shard job's only from the CLI (pyslurm drops it, see slurm.pyslurm_backend)."""
    ids = [_submit("-p", "t4", "--gres=gpu:1", "--comment=horus:v1;t4=55/8000/9000", "--wrap", "sleep 60"),
           _submit("-p", "a100", "--gres=gpu:2", "--wrap", "sleep 60")]
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            cli = {j["job_id"]: j for j in with_backend(monkeypatch, "cli", slurm.running_jobs)}
            if all(cli.get(i, {}).get("state") == "RUNNING" and cli[i]["gres"] for i in ids):
                break
            time.sleep(0.5)
        py = {j["job_id"]: j for j in with_backend(monkeypatch, "pyslurm", slurm.running_jobs)}
        cli = {j["job_id"]: j for j in with_backend(monkeypatch, "cli", slurm.running_jobs)}
        assert set(ids) <= set(cli) and set(cli) == set(py)
        for i in cli:
            c, p = dict(cli[i]), dict(py[i])
            cg, pg = c.pop("gres"), p.pop("gres")
            assert c == p, i
            for a, b in zip(cg, pg, strict=True):
                if a["name"] == "shard":
                    assert b == {**a, "idx": None}
                else:
                    assert a == b
        shard, whole = cli[ids[0]]["gres"], cli[ids[1]]["gres"]
        assert shard[0]["name"] == "shard" and len(shard[0]["idx"]) == 1
        assert whole[0]["count"] == 2 and len(whole[0]["idx"]) == 2
    finally:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True)


@needs_pyslurm
def test_accounting_records_agree(monkeypatch):
    """sync's input: the same flat dicts from sacct --json and from pyslurm.db, for a finished
    shard job and a finished two-GPU job (and every other job in the window)."""
    ids = [_submit("-p", "t4", "--gres=gpu:1", "--comment=mine horus:v1;t4=20/2000/2500", "--wrap", "sleep 1"),
           _submit("-p", "a100", "--gres=gpu:2", "--comment=two", "--wrap", "sleep 1")]
    since = time.time() - 3600
    deadline = time.time() + 90
    while time.time() < deadline:
        cli = {j["job_id"]: j for j in with_backend(monkeypatch, "cli", slurm.accounting_jobs,
                                                    since, time.time() + 60)}
        if all(cli.get(i, {}).get("state") == "COMPLETED" and cli[i]["end_time"] for i in ids):
            break
        time.sleep(1)
    until = time.time() + 60
    cli = {j["job_id"]: j for j in with_backend(monkeypatch, "cli", slurm.accounting_jobs, since, until)}
    py = {j["job_id"]: j for j in with_backend(monkeypatch, "pyslurm", slurm.accounting_jobs, since, until)}
    assert set(cli) == set(py)
    for i, c in cli.items():
        if c["start_time"] == NO_START:  # never started: sacct's placeholder, pyslurm's None
            c = {**c, "start_time": None}
        assert c == py[i], i
    shard, two = py[ids[0]], py[ids[1]]
    assert shard["shards"] and shard["gpus"] is None and shard["comment"].startswith("mine horus:v1;")
    assert shard["admin_comment"].startswith("horus: shared") and shard["node"] == "gpu-t4"
    assert two["gpus"] == 2 and two["shards"] is None and two["node"] == "gpu-a100"
    assert shard["cluster"] == two["cluster"] == sp.parse_scontrol_config(
        slurm.run(["scontrol", "show", "config"]))["ClusterName"]
