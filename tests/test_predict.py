"""Cold-start physics, the learned model's JSON trees, the registry, and `horus predict`."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.learned import (LearnedEstimator, LearnedModel, TreeEnsemble, fit, input_row,
                                 train_holdout)
from slurm_horus.predict.registry import Registry

ZOO = Path(__file__).parent / "data" / "zoo"
A100 = get_gpu("a100")
EST = ColdStartEstimator()


def _report(name, batch, **dims):
    return extract_features(ZOO / f"{name}.onnx", batch_size=batch, dims=dims)


def _predict(name="resnet50", batch=32, gpu=A100, **workload):
    return EST.predict(_report(name, batch), gpu, Workload(batch_size=batch, **workload))


def test_memory_grows_with_batch_size():
    mems = [_predict(batch=b).mem_mib for b in (8, 32, 128)]
    assert mems[0] < mems[1] < mems[2]


def test_optimizer_state_orders_memory():
    sgd, momentum, adam = (_predict("vgg16", 8, optimizer=o).mem_mib
                           for o in ("sgd", "momentum", "adam"))
    assert sgd < momentum < adam
    params = _report("vgg16", 8).values["params"]
    # momentum keeps one fp32 buffer per parameter (x reserve factor), Adam two
    assert momentum - sgd == pytest.approx(params * 4 * EST.params.reserve_factor / 2**20, rel=0.01)


def test_inference_and_half_precision_need_less():
    train = _predict(batch=64).mem_mib
    assert _predict(batch=64, task="infer").mem_mib < train
    assert _predict(batch=64, precision="amp").mem_mib < train


def test_p90_is_above_expected():
    p = _predict()
    assert p.mem_mib < p.mem_mib_p90


def test_small_models_are_launch_bound_and_big_ones_busy():
    tiny = _predict("small_cnn", 1).util_pct
    big = _predict("vgg16", 128).util_pct
    assert 0 < tiny < 30 < big <= 99


def test_faster_gpu_is_less_utilized_by_the_same_job():
    t4, h100 = (_predict("resnet50", 16, gpu=get_gpu(g)).util_pct for g in ("t4", "h100"))
    assert h100 < t4


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch size"), ({"batch_size": -4}, "batch size"),
    ({"optimizer": "lbfgs"}, "optimizer"), ({"precision": "fp8"}, "precision"),
    ({"task": "serve"}, "task")])
def test_workload_validation(kwargs, message):
    with pytest.raises(HorusError, match=message):
        Workload(**{"batch_size": 1, **kwargs})


def test_bf16_on_a_gpu_without_it_is_refused():
    with pytest.raises(HorusError, match="bf16"):
        _predict(gpu=get_gpu("v100-16gb"), precision="bf16")


# --- learned model -------------------------------------------------------------------------

def _training_set():
    """Rows from real corpus graphs at many batch sizes, with a site effect to learn."""
    rows, mem, util, cold = [], [], [], []
    rng = np.random.default_rng(0)
    for name in ("resnet50", "mobilenet_v2", "small_cnn", "vgg16", "efficientnet_b0", "unet"):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            report = _report(name, batch)
            for gpu in ("a100", "t4", "h100"):
                g, w = get_gpu(gpu), Workload(batch_size=batch)
                c = EST.predict(report, g, w)
                rows.append(input_row(report.values, g, w, c))
                cold.append(c.mem_mib)
                mem.append(c.mem_mib * 1.3 * rng.lognormal(0, 0.01))   # this site needs 30 % more
                util.append(min(c.util_pct * 0.8, 100))
    return rows, mem, util, cold


@pytest.fixture(scope="module")
def trained():
    rows, mem, util, cold = _training_set()
    model, _ = train_holdout(rows, mem, util, cold, test_fraction=0.2, seed=0, max_iter=100)
    return model


def test_learned_model_learns_the_site_correction(trained):
    assert trained.metrics["mem_mdape_pct"] < 3.0
    report = _report("resnet50", 24)
    learned = LearnedEstimator(trained, "v0001").predict(report, A100, Workload(batch_size=24))
    cold = EST.predict(report, A100, Workload(batch_size=24))
    assert learned.predictor == "learned:v0001"
    assert learned.mem_mib == pytest.approx(cold.mem_mib * 1.3, rel=0.05)
    assert learned.util_pct == pytest.approx(cold.util_pct * 0.8, rel=0.15)


def test_json_trees_predict_exactly_like_scikit_learn():
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 5))
    X[rng.random(X.shape) < 0.05] = np.nan
    y = np.nan_to_num(X[:, 0]) * 2 + np.nan_to_num(X[:, 1]) ** 2
    est = HistGradientBoostingRegressor(max_iter=50).fit(X, y)
    trees = TreeEnsemble.from_dict(json.loads(json.dumps(TreeEnsemble.from_sklearn(est).to_dict())))
    assert np.allclose(trees.predict(X), est.predict(X))


def test_unfamiliar_model_falls_back_to_cold_start(trained):
    report = _report("vgg16", 2048)  # far beyond the batch sizes and sizes trained on
    p = LearnedEstimator(trained, "v0001").predict(report, A100, Workload(batch_size=2048))
    assert p.predictor == "cold-start" and p.confidence.startswith("low")


def test_model_file_round_trip_and_refusals(trained, tmp_path):
    again = LearnedModel.from_json(trained.to_json())
    assert again.metrics == trained.metrics
    with pytest.raises(HorusError, match="pickles are never loaded"):
        LearnedModel.from_json(pickle.dumps({"format": "slurm-horus-learned"}))
    with pytest.raises(HorusError, match="corrupt"):
        LearnedModel.from_json(trained.to_json()[:100].encode())
    with pytest.raises(HorusError, match="not a slurm-horus model"):
        LearnedModel.from_json(b'{"format": "something-else"}')
    doc = json.loads(trained.to_json())
    doc["mem"]["packed"]["sizes"] = doc["util"]["packed"]["value"]  # sizes that are not
    with pytest.raises(HorusError, match="malformed"):
        LearnedModel.from_json(json.dumps(doc).encode())


def test_registry_add_promote_rollback(trained, tmp_path):
    reg = Registry(tmp_path / "models")
    assert reg.serving() is None and reg.list() == []
    v1, v2 = reg.add(trained), reg.add(trained)
    assert (v1, v2) == ("v0001", "v0002")
    reg.promote(v1)
    reg.promote(v2)
    assert reg.serving() == "v0002"
    assert [e["serving"] for e in reg.list()] == [False, True]
    assert reg.rollback() == "v0001" and reg.serving() == "v0001"
    with pytest.raises(HorusError, match="nothing to roll back"):
        reg.rollback()
    (tmp_path / "models" / "v0003.json").write_bytes(pickle.dumps(object))
    with pytest.raises(HorusError, match="pickles"):
        reg.promote("v0003")
    assert reg.serving() == "v0001"  # a refused promotion changes nothing
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "models").iterdir())


def test_fit_needs_enough_rows():
    with pytest.raises(HorusError, match="at least 20"):
        fit([[0.0] * 3] * 5, [1] * 5, [1] * 5, [1] * 5)


# --- CLI -------------------------------------------------------------------------------------

def _cli(*args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "slurm_horus.cli.horus", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_cli_json_for_one_gpu(tmp_path):
    proc = _cli("predict", str(ZOO / "resnet50.onnx"), "-b", "32", "--gpu", "a100", "--json",
                env={"HORUS_MODEL_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"util_pct", "mem_mib", "mem_mib_p90"} <= set(out)
    assert out["predictor"] == "cold-start" and "cold-start estimator serves alone" in out["note"]


def test_cli_uses_the_serving_learned_model(trained, tmp_path):
    reg = Registry(tmp_path)
    reg.promote(reg.add(trained))
    proc = _cli("predict", str(ZOO / "resnet50.onnx"), "-b", "16", "--gpu", "t4", "--json",
                env={"HORUS_MODEL_DIR": str(tmp_path)})
    assert json.loads(proc.stdout)["predictor"] == "learned:v0001"


def test_cli_cold_start_never_imports_scikit_learn(tmp_path):
    code = ("import sys, runpy; sys.argv=['horus','predict',%r,'-b','8','--gpu','a100','--json'];"
            "\ntry:\n  runpy.run_module('slurm_horus.cli.horus', run_name='__main__')\n"
            "except SystemExit: pass\nprint('SKLEARN' if 'sklearn' in sys.modules else 'CLEAN')"
            % str(ZOO / "resnet50.onnx"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"HORUS_MODEL_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.strip().endswith("CLEAN"), proc.stdout + proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--gpu", "nosuchgpu"], "unknown GPU type 'nosuchgpu'; known: a10, a100-40gb"),
    (["-b", "0"], "batch size"), (["-b", "-2"], "batch size")])
def test_cli_bad_input(args, message):
    argv = ["predict", str(ZOO / "resnet50.onnx"), *(["-b", "8"] if "-b" not in args else []),
            *args]
    proc = _cli(*argv)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
