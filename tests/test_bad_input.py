"""Hostile and broken input to every command: a one-line error and a non-zero exit, never a
traceback, an internal error, a hang or an endless read (an audit's findings, kept as cases)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slurm_horus.ledger import Ledger

ADMIN = [sys.executable, "-m", "slurm_horus.cli.admin"]
HACCT = [sys.executable, "-m", "slurm_horus.cli.hacct"]
POLICY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "etc", "horus_policy.conf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "binary").write_bytes(bytes(range(256)) * 8)
    (d / "huge_cluster.json").write_text(json.dumps(
        {"nodes": [{"gpu_type": "a100", "gpus": 8, "count": 100_000_000}]}))
    (d / "list.json").write_text("[]")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    Ledger(f"sqlite:///{d}/ledger.db").record_usage(job_id=1, source="sacct", elapsed_s=1)
    return d


CASES = {
    "simulate --load nan": [*ADMIN, "simulate", "--jobs", "10", "--load", "nan"],
    "simulate --gpus huge": [*ADMIN, "simulate", "--jobs", "10", "--gpus", "99999999999"],
    "simulate --jobs huge": [*ADMIN, "simulate", "--jobs", "99999999999"],
    "simulate --seed -1": [*ADMIN, "simulate", "--jobs", "10", "--seed", "-1"],
    "simulate --oom-delay inf": [*ADMIN, "simulate", "--jobs", "10", "--oom-delay", "inf"],
    "simulate --cluster /dev/zero": [*ADMIN, "simulate", "--jobs", "10", "--cluster", "/dev/zero"],
    "simulate --cluster huge": [*ADMIN, "simulate", "--jobs", "10", "--cluster", "{d}/huge_cluster.json"],
    "simulate --policy-file /dev/zero": [*ADMIN, "simulate", "--jobs", "10", "--policy-file", "/dev/zero"],
    "simulate --policy-file binary": [*ADMIN, "simulate", "--jobs", "10", "--policy-file", "{d}/binary"],
    "simulate --residuals-from /dev/zero": [*ADMIN, "simulate", "--jobs", "10", "--residuals-from", "/dev/zero"],
    "simulate --ledger deep": [*ADMIN, "simulate", "--ledger", "{d}/deep.json"],
    "doctor --slurm-conf /dev/zero": [*ADMIN, "doctor", "--slurm-conf", "/dev/zero"],
    "doctor --slurm-conf binary": [*ADMIN, "doctor", "--slurm-conf", "{d}/binary"],
    "import binary": [*ADMIN, "import", "{d}/binary", "--ledger", "sqlite:///{d}/import.db"],
    "sync --from-file []": [*ADMIN, "sync", "--ledger", "sqlite:///{d}/sync.db", "--from-file", "{d}/list.json"],
    "sync --from-file deep": [*ADMIN, "sync", "--ledger", "sqlite:///{d}/sync.db", "--from-file", "{d}/deep.json"],
    "queue --jobs huge": [*ADMIN, "queue", "--dry-run", "--jobs", "99999999999999999999"],
    "hacct -o width huge": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-o", "JobID%300000000"],
    "hacct -o width zero": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-o", "JobID%-0"],
    "hacct -j huge": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-j", "99999999999999999999999"],
    "hacct -j -1": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-j", "-1"],
    "hacct -j array task range": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-j", "224_[1-5]"],
    "hacct -j unicode digits": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-j", "\u0661\u0662"],
    "hacct -S huge": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-S", "99999999999999999999"],
    "hacct -S now-huge": [*HACCT, "--ledger", "sqlite:///{d}/ledger.db", "-S", "now-99999999999999999999days"],
}


@pytest.mark.parametrize("name", CASES)
def test_a_one_line_error_and_a_non_zero_exit(name, files):
    cmd = [a.format(d=files) for a in CASES[name]]
    # the shipped policy: each case must fail on its own input, not on a policy file it lacks
    env = {**os.environ, "HORUS_POLICY": POLICY, "HORUS_SPOOL": str(files / "spool")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0, r.stdout[-500:]
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    # one line, usage errors too (click's own took four: usage, a hint, a blank, the error)
    assert len(lines) == 1 and ": error: " in lines[0], r.stderr
    assert "policy-file" in name or "policy file" not in lines[0], r.stderr
