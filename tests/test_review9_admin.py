"""Review 9 of the admin tools: doctor on who may read the ledger, simulate's --max-group before
the trace, bench_simulate on figures over nothing, retrain's margin where no fold answered."""

import csv
import importlib.util
import json
import math
import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_horus.cli import admin_simulate
from slurm_horus.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
OTHER_GID = 4242  # a group of ordinary users (no name needed)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


@as_root
def test_a_ledger_readable_by_a_group_of_users_is_a_problem(tmp_path):
    # root:users 0640 had passed: every member read every user's jobs, which hacct filters
    from slurm_horus.doctor import check_ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(url).close()
    db = tmp_path / "ledger.db"
    os.chown(db, 0, OTHER_GID)
    (p,) = check_ledger(url)
    assert f"readable by group gid {OTHER_GID}" in p.what and p.fix.startswith(f"chgrp root {db}")
    os.chmod(db, 0o600)  # no group read: that group is harmless
    assert check_ledger(url) == []
    os.chown(db, 0, 0)
    os.chmod(db, 0o640)  # the guide's root:root 0640
    assert check_ledger(url) == []


@as_root
def test_a_journal_beside_the_ledger_wider_than_it_is_a_problem(tmp_path):
    # a -journal a killed write left holds pages of the ledger: 0644 beside a 0640 ledger had passed
    from slurm_horus.doctor import check_ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(url).close()
    journal, wal = tmp_path / "ledger.db-journal", tmp_path / "ledger.db-wal"
    journal.write_bytes(b"")
    os.chmod(journal, 0o644)
    (p,) = check_ledger(url)
    assert "-journal" in p.what and "0644" in p.what and p.fix == f"chmod 0640 {journal}"
    os.chmod(journal, 0o640)
    assert check_ledger(url) == []
    os.chmod(tmp_path / "ledger.db", 0o600)  # no wider than the ledger itself
    (p,) = check_ledger(url)
    assert p.fix == f"chmod 0600 {journal}"
    journal.unlink()
    wal.write_bytes(b"")
    os.chmod(wal, 0o600)
    os.chown(wal, 0, OTHER_GID)
    assert check_ledger(url) == []  # the group cannot read it
    os.chmod(tmp_path / "ledger.db", 0o640)
    os.chmod(wal, 0o640)
    (p,) = check_ledger(url)
    assert "-wal" in p.what and p.fix.startswith(f"chgrp root {wal}")
    os.chmod(wal, 0o646)  # one others may write: rolled into the ledger, who may write it first
    (p,) = check_ledger(url)
    assert "-wal" in p.what and "writable by group or others" in p.what


@pytest.mark.parametrize("policy, args, words", [
    ("", ["--max-group", "101"], "--max-group must be in 1..100, the policy's shards per GPU"),
    ("shards_per_gpu = 8\n", ["--max-group", "9"], "--max-group must be in 1..8,"),
    ("shards_per_gpu = 8\n", ["--naive-shards", "9", "--max-group", "2"], "--naive-shards must be in 1..8")])
def test_bounds_past_the_policys_shards_per_gpu_fail_before_the_trace(simulate_cli, monkeypatch, tmp_path,
                                                                      policy, args, words):
    # they had failed only once the (up to 2,000,000-job) trace was built
    def built(*a, **k):
        raise AssertionError("the trace was built")

    pol = tmp_path / "horus_policy.conf"
    pol.write_text((ROOT / "etc" / "horus_policy.conf").read_text() + policy)
    monkeypatch.setattr(admin_simulate, "build_trace", built)
    r = CliRunner().invoke(simulate_cli, ["simulate", "--jobs", "2000000", "--policy-file", str(pol), *args])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and words in lines[0], r.output


def _bench():
    spec = importlib.util.spec_from_file_location("bench_simulate", ROOT / "benchmarks" / "bench_simulate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_tables_show_a_missing_figure_as_dash_and_no_mean_of_the_rest():
    # a run that ended no job has None figures (sim/metrics.py): the sweep had stopped on a TypeError
    bench = _bench()

    def run(jct, p95=1.5):
        m = {k: 1.0 for k in bench.KEYS}
        m.update(mean_jct_s=jct, p95_jct_s=jct, p95_slowdown=None if jct is None else p95,
                 expected_beyond=0.0, beyond_bound=0)
        return m

    pols = (*bench.POLICIES, "horus-cold")
    seeds = [{p: run(2000.0) for p in pols}, {p: run(4000.0) for p in pols}]
    seeds[1]["horus"] = run(None)  # the second seed's horus ended no job
    assert bench._mean(seeds, "horus", "mean_jct_s") is None  # no mean of the rest (the plot's rule), no crash or 0
    assert bench._mean(seeds, "naive", "mean_jct_s") == 3000.0
    assert bench._jct_p95(seeds, "naive") == "3.0 / 1.50"
    only = [{p: run(None) for p in pols}]
    assert bench._jct_p95(only, "horus") == "- / -"
    assert bench._goals(only) == (0, 0, 0, 0)  # a missing figure meets no goal
    text = bench.sweep_tables({("philly", 1.0): only}, ["philly"], [1.0], [1], 10)
    assert bench.NONE_NOTE in text and "| 1 | - | - | - | - | - | - / - / - / - |" in text
    assert "no run where both ended a job" in text
    assert bench.sweep_tables({("philly", 1.0): seeds}, ["philly"], [1.0], [1, 2], 10)


def test_a_forced_model_no_fold_answered_does_not_claim_exact_bounds(tmp_path):
    # two architectures, each out of the other's training range: every fold left its jobs to the
    # cold start, and the model --force promoted had a p90 margin of 0 (its upper bound = its estimate)
    from test_retrain import _features

    from slurm_horus.ledger.retrain import import_csv, retrain
    from slurm_horus.predict.coldstart import ColdStartParams
    from slurm_horus.predict.registry import Registry

    rng = random.Random(0)
    with open(tmp_path / "a.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["features", "gpu_type", "batch_size", "task", "optimizer",
                                          "precision", "util_pct", "mem_mib", "cold_util_pct", "cold_mem_mib"])
        w.writeheader()
        for params in (1e6, 1e8):
            for _ in range(30):
                bs = rng.choice((8, 16, 32, 64, 128))
                v = dict(_features(rng, bs), params=params)
                cold = 1500 + 40 * bs
                w.writerow({"features": json.dumps(v), "gpu_type": "a100-40gb", "batch_size": bs,
                            "task": "train", "optimizer": "adam", "precision": "fp32", "util_pct": 40,
                            "mem_mib": round(cold * 1.3 * math.exp(rng.gauss(0, 0.05)), 1),
                            "cold_util_pct": 50, "cold_mem_mib": cold})
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    reg = Registry(tmp_path / "models")
    import_csv(L, str(tmp_path / "a.csv"))
    said = []
    res = retrain(L, reg, max_iter=40, force=True, log=said.append)
    assert res["promoted"] and reg.serving() == res["version"]
    margin = reg.load(res["version"]).mem_log_q90
    assert margin == pytest.approx(math.log(ColdStartParams().p90_factor))
    assert [m for m in said if "its p90 margin is the cold start's (+15 %)" in m], said
