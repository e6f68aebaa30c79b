"""The two ways slurm-horus reads Slurm (slurm.backend(): cli and pyslurm) give the same records,
on the running local cluster. The pyslurm comparisons need pyslurm built for that cluster's Slurm
(tests/run's 25.11 pass installs it); backend choice is checked on either cluster."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.slurm import commands as slurm
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
                         "--gres=gpu:1", "--test-only", "--wrap", "true"],
                        capture_output=True, text=True, env=env, cwd=tmp_path)
    # hsubmit never blocks a submission on its own trouble: it says why and submits unchanged
    # (sbatch --test-only: Slurm checks the job and queues nothing)
    assert cp.returncode == 0 and "to start at" in cp.stderr, cp.stderr
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
