"""retrain: import CSV, cross-validate, promote only if better, rollback; bad model files refused."""

import csv
import json
import math
import pickle
import random

import pytest
from click.testing import CliRunner

from slurm_horus.errors import HorusError
from slurm_horus.features import FEATURE_NAMES
from slurm_horus.ledger import Ledger
from slurm_horus.registry import Registry


def _features(rng, scale):
    v = {n: 0.0 for n in FEATURE_NAMES}
    v.update(batch_size=scale, flops=1e9 * scale * rng.uniform(0.5, 2), params=2.5e7,
             param_bytes=1e8, activation_bytes=5e7 * scale, saved_activation_bytes=4e7 * scale,
             peak_live_bytes=6e7 * scale, max_activation_bytes=1e7 * scale,
             input_bytes=6e5 * scale, read_bytes=2e8 * scale, write_bytes=1e8 * scale,
             kernels=300, depth=50, n_nodes=300, arithmetic_intensity=20.0,
             flops_per_kernel=3e6 * scale, frac_flops_conv=0.9, n_conv=50)
    return v


def write_csv(path, n=120, seed=0):
    rng = random.Random(seed)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["features", "gpu_type", "batch_size", "task",
                                          "optimizer", "precision", "util_pct", "mem_mib",
                                          "model_family", "cold_util_pct", "cold_mem_mib"])
        w.writeheader()
        for i in range(n):
            bs = rng.choice([8, 16, 32, 64, 128])
            cold_mem = 1500 + 40 * bs
            w.writerow({"features": json.dumps(_features(rng, bs)), "gpu_type": rng.choice(["a100-40gb", "t4"]),
                        "batch_size": bs, "task": "train", "optimizer": "adam", "precision": "fp32",
                        "util_pct": round(min(95, 10 + 12 * math.log2(bs) + rng.gauss(0, 2)), 2),
                        "mem_mib": round(cold_mem * 1.3 * rng.uniform(0.95, 1.05), 1),
                        "model_family": "synthetic", "cold_util_pct": 50, "cold_mem_mib": cold_mem})


def test_import_retrain_promote_rollback(tmp_path):
    from slurm_horus.cli.admin_ledger import import_, retrain

    url = f"sqlite:///{tmp_path}/l.db"
    src = tmp_path / "m.csv"
    write_csv(src)
    r = CliRunner().invoke(import_, [str(src), "--ledger", url])
    assert r.exit_code == 0 and "imported 120 rows" in r.output, r.output
    CliRunner().invoke(import_, [str(src), "--ledger", url])  # idempotent
    L = Ledger(url)
    assert L.count("usage") == 120
    reg = tmp_path / "models"
    r = CliRunner().invoke(retrain, ["--ledger", url, "--model-dir", str(reg), "--max-iter", "40",
                                     "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["version"] == "v0001" and res["promoted"] and res["better"]
    assert res["cv"]["mem_mdape_pct"] < res["baseline"]["mem_mdape_pct"]  # beats cold-start
    assert Registry(reg).serving() == "v0001"
    # same data again: not better than the serving model -> stored, not promoted (seed changes)
    r = CliRunner().invoke(retrain, ["--ledger", url, "--model-dir", str(reg), "--max-iter", "10",
                                     "--json"])
    res2 = json.loads(r.output)
    assert res2["version"] == "v0002" and res2["baseline_version"] == "v0001"
    assert res2["promoted"] == res2["better"]
    r = CliRunner().invoke(retrain, ["--ledger", url, "--model-dir", str(reg), "--max-iter", "10",
                                     "--force", "--json"])
    assert json.loads(r.output)["promoted"] and Registry(reg).serving() == "v0003"
    assert Registry(reg).rollback() in ("v0001", "v0002")
    pv = L.predictor_versions()
    assert [p["version"] for p in pv] == ["v0001", "v0002", "v0003"]
    assert pv[0]["promoted"] == 1 and pv[0]["n_rows"] == 120


def test_retrain_needs_rows(tmp_path):
    from slurm_horus.retrain import retrain

    with pytest.raises(HorusError, match="measured jobs"):
        retrain(Ledger(f"sqlite:///{tmp_path}/l.db"), Registry(tmp_path / "m"))


def test_import_bad_csv_one_line(tmp_path):
    from slurm_horus.cli.admin_ledger import import_

    bad = tmp_path / "b.csv"
    bad.write_text("gpu_type,util_pct,mem_mib,features\nnot-a-gpu,5,100,{}\n")
    r = CliRunner().invoke(import_, [str(bad), "--ledger", f"sqlite:///{tmp_path}/l.db"])
    assert r.exit_code != 0 and "b.csv:2" in r.output and len(r.output.splitlines()) == 1


def test_foreign_model_file_refused(tmp_path):
    from slurm_horus.retrain import retrain

    url = f"sqlite:///{tmp_path}/l.db"
    src = tmp_path / "m.csv"
    write_csv(src, n=60)
    from slurm_horus.retrain import import_csv

    L = Ledger(url)
    import_csv(L, str(src))
    reg = Registry(tmp_path / "models")
    reg.root.mkdir()
    (reg.root / "v0001.json").write_bytes(pickle.dumps({"evil": 1}))
    (reg.root / "v0002.json").write_text("{corrupt")
    (reg.root / "current.json").write_text(json.dumps({"serving": "v0001", "history": []}))
    for v in ("v0001", "v0002"):
        with pytest.raises(HorusError):
            reg.load(v)
        with pytest.raises(HorusError):
            reg.promote(v)
    logs = []
    res = retrain(L, reg, max_iter=10, log=logs.append)
    assert res["baseline_version"] == "cold-start" and "unusable" in logs[0]
    assert res["version"] == "v0003"


def test_retrain_learns_from_sync_built_rows(tmp_path):
    """Jobs recorded by horus-admin sync alone (claims from the comment, features recomputed
    from the model file, use from sacct's TRES) are rows retrain can train on."""
    import hashlib
    from pathlib import Path

    from slurm_horus.hint import encode_workload
    from slurm_horus.retrain import retrain, training_set
    from slurm_horus.usage import sync

    zoo = Path(__file__).parent / "data" / "zoo"
    jobs, rng = [], random.Random(1)
    for i in range(28):
        model = zoo / ("small_cnn.onnx", "mobilenet_v2.onnx", "resnet50.onnx")[i % 3]
        bs = (4, 8, 16, 32, 64, 128, 256, 2)[i % 8]
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        comment = ("horus:v1;a100=20/3000/3500;t4=40/3000/3500 "
                   + encode_workload({"sha": sha, "bs": bs, "task": "train", "model": str(model)}))
        util, mem = min(95, 5 + 10 * math.log2(bs) + rng.gauss(0, 2)), 900 + 30 * bs
        jobs.append({"job_id": 500 + i, "user": "root", "account": "ml", "cluster": "c",
                     "comment": {"job": comment, "administrator": "horus: shared"},
                     "time": {"elapsed": 60, "submission": 1, "start": 2 + i * 100,
                              "end": 62 + i * 100},
                     "tres": {"allocated": [{"type": "gres", "name": "shard", "count": 20}]},
                     "nodes": ("gpu-a100", "gpu-t4")[i % 2], "state": {"current": "COMPLETED"},
                     "steps": [{"time": {"elapsed": 60}, "tres": {"requested": {
                         "max": [{"type": "gres", "name": "gpuutil", "count": util},
                                 {"type": "gres", "name": "gpumem", "count": int(mem * 2 ** 20)}],
                         "average": [{"type": "gres", "name": "gpuutil", "count": util}]}}}]})
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    res = sync(L, sacct_json={"jobs": jobs}, node_types={"gpu-a100": "a100", "gpu-t4": "t4"})
    assert res["recorded"] == res["features"] == 28
    ts = training_set(L)
    assert len(ts.X) == 28 and ts.skipped == 0
    out = retrain(L, Registry(tmp_path / "models"), folds=4, max_iter=10, log=lambda m: None)
    assert out["rows"] == 28 and out["version"] == "v0001"
