"""Cold-start physics, the learned model's JSON trees, the registry, and `horus predict`."""

from __future__ import annotations

import json
import math
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
from slurm_horus.predict.learned import (LearnedEstimator, LearnedModel, accuracy, fit,
                                        input_row, train_holdout)
from slurm_horus.predict.chain import choose_predictor
from slurm_horus.predict.registry import Registry
from slurm_horus.predict.trees import TreeEnsemble

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
    ({"task": "serve"}, "task"), ({"cpus_per_gpu": 0}, "CPUs per GPU"),
    ({"cpus_per_gpu": -1}, "CPUs per GPU"), ({"cpus_per_gpu": float("nan")}, "CPUs per GPU"),
    ({"cpus_per_gpu": float("inf")}, "CPUs per GPU"), ({"cpus_per_gpu": True}, "CPUs per GPU"),
    ({"cpus_per_gpu": "8"}, "CPUs per GPU")])
def test_workload_validation(kwargs, message):
    with pytest.raises(HorusError, match=message):
        Workload(**{"batch_size": 1, **kwargs})


def test_bf16_on_a_gpu_without_it_is_refused():
    with pytest.raises(HorusError, match="bf16"):
        _predict(gpu=get_gpu("v100-16gb"), precision="bf16")


# --- learned model -------------------------------------------------------------------------

def _site_truth(values: dict, gpu, w) -> tuple[float, float]:
    """What this synthetic site measures: a known function of the graph's features that is not
    the cold start's (a 2 GiB context, weights x 4 for Adam plus 1.6 x the kept activations;
    utilization saturating in FLOPs per step and the GPU's speed)."""
    mem = 2048 + (16 * values["params"] + 1.6 * values["saved_activation_bytes"]) / 2**20
    util = 95 * (1 - math.exp(-values["flops"] / (gpu.fp32_tflops * 4e9)))
    return mem, max(util, 1.0)


def _training_set():
    """Rows from real corpus graphs at many batch sizes and three GPU types, measured by
    _site_truth (with 2 % noise), with the cold start's figures beside them."""
    rows, mem, util, cold, cold_util = [], [], [], [], []
    rng = np.random.default_rng(0)
    for name in ("resnet50", "mobilenet_v2", "small_cnn", "vgg16", "efficientnet_b0", "unet"):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            report = _report(name, batch)
            for gpu in ("a100", "t4", "h100"):
                g, w = get_gpu(gpu), Workload(batch_size=batch)
                c = EST.predict(report, g, w)
                m, u = _site_truth(report.values, g, w)
                rows.append(input_row(report.values, g, w, c))
                cold.append(c.mem_mib)
                cold_util.append(c.util_pct)
                mem.append(m * rng.lognormal(0, 0.02))
                util.append(min(u * rng.lognormal(0, 0.02), 100))
    return rows, mem, util, cold, cold_util


@pytest.fixture(scope="module")
def trained_and_held_out():
    rows, mem, util, cold, cold_util = _training_set()
    model, test = train_holdout(rows, mem, util, cold, test_fraction=0.25, seed=0, max_iter=150)
    held = [np.asarray(a, float)[test] for a in (rows, mem, util, cold, cold_util)]
    return model, held


@pytest.fixture(scope="module")
def trained(trained_and_held_out):
    return trained_and_held_out[0]


def test_learned_model_beats_the_cold_start_on_held_out_rows(trained_and_held_out):
    """Trained on a site whose memory and utilization follow another function of the features
    than the cold start's, the served model (its gate included) is much closer to the
    measurements on rows it never saw; a model that learned nothing would not be."""
    model, (X, mem, util, cold, cold_util) = trained_and_held_out
    pm, pu, why = model.answer(X, cold, cold_util)
    assert (why == "").mean() > 0.9  # it serves on (nearly) every held-out row
    learned, base = accuracy(pm, mem, pu, util), accuracy(cold, mem, cold_util, util)
    assert base["mem_mdape_pct"] > 10 and base["util_mae_pct"] > 5  # the cold start is off
    assert learned["mem_mdape_pct"] < base["mem_mdape_pct"] / 3
    assert learned["util_mae_pct"] < base["util_mae_pct"] / 2
    report = _report("resnet50", 24)  # a batch size never trained on, through the estimator
    p = LearnedEstimator(model, "v0001").predict(report, A100, Workload(batch_size=24))
    truth = _site_truth(report.values, A100, Workload(batch_size=24))[0]
    cold24 = EST.predict(report, A100, Workload(batch_size=24)).mem_mib
    assert p.predictor == "learned:v0001"
    assert abs(p.mem_mib - truth) < abs(cold24 - truth) / 2


def test_json_trees_predict_exactly_like_scikit_learn():
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 5))
    X[rng.random(X.shape) < 0.05] = np.nan
    y = np.nan_to_num(X[:, 0]) * 2 + np.nan_to_num(X[:, 1]) ** 2
    est = HistGradientBoostingRegressor(max_iter=50).fit(X, y)
    stored = json.loads(json.dumps(TreeEnsemble.from_sklearn(est, 5).to_dict()))
    trees = TreeEnsemble.from_dict(stored, 5, 30.0)
    assert np.allclose(trees.predict(X), est.predict(X))
    many = rng.normal(size=(2500, 5))  # walked in blocks of rows: the same figures
    assert np.allclose(trees.predict(many), est.predict(many))
    assert np.array_equal(trees.predict(many)[1500:1510], trees.predict(many[1500:1510]))


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
    reg.promote(v2)  # again: no change (it had pushed v0002 on the history, and a rollback stayed there)
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


def test_retrain_writes_only_quantiles_the_calibration_reader_takes():
    """One job in 121 at 25x the cold start gave a p99 of log 25, past the reader's 3: it
    refused calibration.json whole, and every bound went back to the predictors' own."""
    from slurm_horus.ledger.retrain import calibrate
    from slurm_horus.predict.chain import MEM_LOG_Q_BOUNDS, Calibration

    actual = [1000.0] * 120 + [25_000.0]
    q = calibrate(["t4"] * 121, {"cold-start": (list(range(121)), actual, [1000.0] * 121,
                                                [50.0] * 121, [40.0] * 121)})
    assert q["t4"]["cold-start"]["mem_log_q"]["0.99"] == MEM_LOG_Q_BOUNDS[1]
    p = Calibration({"version": 1, "model": None, "quantiles": q}, None).apply(
        _predict(gpu=get_gpu("t4")))
    assert p.mem_mib_p99 == pytest.approx(p.mem_mib * math.exp(MEM_LOG_Q_BOUNDS[1]))


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


def test_cli_gpu_lists_and_a_registry_folder_named_by_mistake(tmp_path):
    # --gpu a100,t4 had been one unknown type; a --model-dir that is not there had gone unsaid,
    # while the site's folder ($HORUS_MODEL_DIR) not made yet by a first retrain is no typo;
    # the p90 is shown rounded up, as the hook charges it (fit_rule's figure)
    base = ("predict", str(ZOO / "resnet50.onnx"), "-b", "32", "--json")
    proc = _cli(*base, "--gpu", "a100,t4", env={"HORUS_MODEL_DIR": str(tmp_path / "not-yet")})
    assert proc.returncode == 0 and "no such folder" not in proc.stderr, proc.stderr
    rows = json.loads(proc.stdout)["predictions"]
    assert [r["gpu"] for r in rows] == ["a100-40gb", "t4"]
    for r in rows:
        assert f"p90 {r['mem_mib_p90']} MiB" in r["fit_rule"]
    proc = _cli(*base, "--gpu", "a100", "--model-dir", str(tmp_path / "typo"))
    assert proc.returncode == 0 and f"model registry {tmp_path / 'typo'}: no such folder" in proc.stderr
    out = json.loads(_cli(*base, "--gpu", "a100", env={"HORUS_POLICY": str(
        _policy(tmp_path, "memory = expected\ngpu.a100.mem_mib = 40960\n"))}).stdout)
    assert out["fit_rule"].startswith(f"expected {out['mem_mib']} MiB <="), out["fit_rule"]
    for empty in ("", ","):  # an unset variable: an error, not every type in another JSON shape
        proc = _cli(*base, "--gpu", empty)
        assert proc.returncode == 2 and "--gpu: no GPU type given" in proc.stderr


def _policy(tmp_path, text):
    p = tmp_path / "pol.conf"
    p.write_text(text)
    return p


def test_cli_fits_as_the_hook_decides(tmp_path):
    """`fits` is the hook's judgement: the p90 against pack_limit_pct % of the policy's memory
    for the type. A p90 below the catalog's memory but above 90 % of the policy's (where `fits`
    once said yes) is "no", and the real hook keeps that job on a whole GPU for its memory;
    with room to spare, both say it fits. Without a readable policy, `fit_rule` says it
    compared with the catalog's memory."""
    from slurm_horus.slurm.hint import encode_hint
    from slurm_horus.slurm.policy import decide

    argv = ("predict", str(ZOO / "resnet50.onnx"), "-b", "32", "--gpu", "a100", "--json")
    env = {"HORUS_MODEL_DIR": str(tmp_path / "models")}
    alone = json.loads(_cli(*argv, env={**env, "HORUS_POLICY": str(tmp_path / "no.conf")}).stdout)
    assert alone["fits"] is True and "GPU catalog" in alone["fit_rule"]
    p90 = alone["mem_mib_p90"]
    assert p90 < get_gpu("a100").mem_mib
    policy = tmp_path / "horus_policy.conf"
    for total, fits in ((int(p90 / 0.95), False), (int(p90 / 0.8), True)):
        policy.write_text(f"pack_limit_pct = 90\nmemory = p90\ngpu.a100.mem_mib = {total}\n")
        proc = _cli(*argv, env={**env, "HORUS_POLICY": str(policy)})
        out = json.loads(proc.stdout)
        assert out["fits"] is fits and f"mem_mib {total} MiB" in out["fit_rule"], out
        hint = encode_hint({"a100": (out["util_pct"], out["mem_mib"], out["mem_mib_p90"])})
        d = decide({"comment": hint, "tres_per_node": "gres:gpu:a100:1"}, policy_path=policy)
        assert (d.reason != "memory") is fits, d.note


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


def test_cli_refuses_unbound_dimensions_as_hsubmit_does(tmp_path):
    """A sequence length left unbound would cost BERT as one token: horus predict gives the
    error hsubmit gives (and attaches nothing), not a figure no job would carry."""
    env = {"HORUS_MODEL_DIR": str(tmp_path / "models")}
    model = str(ZOO / "bert_base.onnx")
    proc = _cli("predict", model, "-b", "8", "--gpu", "a100", "--json", env=env)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"horus predict: error: model {model}: dimension(s) seq unbound; add --dim NAME=VALUE "
        "(e.g. --dim seq=512)"]
    bound = _cli("predict", model, "-b", "8", "--dim", "seq=128", "--gpu", "a100", "--json", env=env)
    assert json.loads(bound.stdout)["mem_mib"] > 0


def test_a_gpu_type_never_trained_on_gets_the_cold_start():
    # trained on T4 runs alone, the model had answered every A100 job (util 20 points off)
    rows, mem, util, cold = [], [], [], []
    for name in ("resnet50", "mobilenet_v2", "small_cnn", "vgg16"):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            report, w = _report(name, batch), Workload(batch_size=batch)
            c = EST.predict(report, get_gpu("t4"), w)
            m, u = _site_truth(report.values, get_gpu("t4"), w)
            rows.append(input_row(report.values, get_gpu("t4"), w, c))
            mem.append(m), util.append(u), cold.append(c.mem_mib)
    model = fit(rows, mem, util, cold, max_iter=30)
    report, w = _report("resnet50", 16), Workload(batch_size=16)
    for gpu, served in (("t4", True), ("a100", False)):
        c = EST.predict(report, get_gpu(gpu), w)
        _, _, why = model.answer([input_row(report.values, get_gpu(gpu), w, c)], [c.mem_mib], [c.util_pct])
        assert (why[0] == "") is served, gpu


def test_models_list_shows_a_bad_figure_as_unknown(trained, tmp_path):
    # one version whose metrics hold a string had stopped the whole list with a traceback
    import subprocess
    import sys

    reg = Registry(tmp_path / "models")
    good = reg.add(LearnedModel.from_json(trained.to_json()))
    bad = LearnedModel.from_json(trained.to_json())
    bad.metrics = {"mem_mdape_pct": "x"}
    bad = reg.add(bad)
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.admin", "models", "list",
                         "--model-dir", str(tmp_path / "models")], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    lines = {ln.split()[0]: ln for ln in cp.stdout.splitlines()}
    assert "mem_mdape=?%" in lines[bad] and "mem_mdape=?%" not in lines[good]


def test_models_list_prints_the_registrys_text_in_one_line(trained, tmp_path):
    # metadata with a newline printed as two lines, and an escape sequence reached the terminal
    import subprocess
    import sys

    reg = Registry(tmp_path / "models")
    odd = LearnedModel.from_json(trained.to_json())
    odd.meta.update(rows="12\nv9999 rows=1", created="\x1b]0;owned\x07today")
    odd = reg.add(odd)
    (tmp_path / "models" / "v0002.json").write_text('{"kind": "x\\n\\u001b[31m"}')
    (tmp_path / "models" / "v0003\n.json").write_text("{}")  # not a version's name
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.admin", "models", "list",
                         "--model-dir", str(tmp_path / "models")], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert len(lines) == 2 and not any("\x1b" in ln or "\x07" in ln for ln in lines), lines
    assert lines[0].split()[0] == odd and "rows=12\\nv9999 rows=1" in lines[0]
    assert lines[1].split()[0] == "v0002" and "INVALID" in lines[1]


def _chain(n: int) -> dict:
    """One tree of n nodes in a chain: each split's left child a leaf, its right the next split."""
    feature, threshold, left, right, leaf, value = [], [], [], [], [], []
    for i in range(n):
        last = i == n - 1 or i % 2 == 1
        feature.append(0)
        threshold.append(0.0)
        left.append(0 if last else i + 1)
        right.append(0 if last else i + 2)
        leaf.append(1 if last else 0)
        value.append(0.0)
    return {"feature": feature, "threshold": threshold, "missing_left": [0] * n, "left": left,
            "right": right, "leaf": leaf, "value": value}


def test_model_files_beyond_what_retrain_writes_are_refused():
    """A model file of one deep chain had made every prediction walk a million levels (hsubmit
    20 s); depth, tree size and tree count are bounded when the file is read."""
    from slurm_horus.predict.trees import MAX_DEPTH, MAX_TREE_NODES, MAX_TREES

    ok = TreeEnsemble.from_dict({"baseline": 0.0, "trees": [_chain(2 * MAX_DEPTH + 1)]}, 1, 1.0)
    assert ok.flat.depth == MAX_DEPTH and ok.predict(np.ones((2, 1))).tolist() == [0.0, 0.0]
    with pytest.raises(HorusError, match=f"deeper than {MAX_DEPTH} levels"):
        TreeEnsemble.from_dict({"baseline": 0.0, "trees": [_chain(2 * MAX_DEPTH + 3)]}, 1, 1.0)
    with pytest.raises(HorusError, match="nodes"):
        TreeEnsemble.from_dict({"baseline": 0.0, "trees": [_chain(MAX_TREE_NODES + 2)]}, 1, 1.0)
    with pytest.raises(HorusError, match="trees"):
        TreeEnsemble.from_dict({"baseline": 0.0, "trees": [_chain(1)] * (MAX_TREES + 1)}, 1, 1.0)
    # children shared by two parents are walked once per level, not once per path
    shared = _chain(2 * MAX_DEPTH + 1)
    shared["left"] = [0 if lf else i + 2 for i, lf in enumerate(shared["leaf"])]
    assert TreeEnsemble.from_dict({"baseline": 0.0, "trees": [shared]}, 1, 1.0).flat.depth == MAX_DEPTH


def test_a_format_1_tree_is_measured_before_its_lists_are_built():
    """A format-1 file of one 2-million-node tree was refused only once every list had been
    copied and converted (5 s, 1 GB): a tree or a tree count past the bounds is refused first."""
    from slurm_horus.predict.trees import MAX_TREE_NODES, MAX_TREES

    junk = {k: [[1, 2], [3]] * ((MAX_TREE_NODES + 1) // 2) for k in _chain(1)}  # ragged: never built
    with pytest.raises(HorusError, match=f"a tree of {MAX_TREE_NODES + 1:,} nodes"):
        TreeEnsemble.from_dict({"baseline": 0.0, "trees": [junk]}, 1, 1.0)
    with pytest.raises(HorusError, match=f"{MAX_TREES + 1:,} trees"):
        TreeEnsemble.from_dict({"baseline": 0.0, "trees": [_chain(1)] * MAX_TREES + [{}]}, 1, 1.0)


def test_registry_files_past_what_retrain_and_the_export_write_are_refused(trained, tmp_path):
    """A 63 MiB history.json had cost every hsubmit 9.5 s and 1 GB: each registry file has a cap
    sized to what retrain or the export writes; past it the next predictor serves, with one
    warning, and nothing is written that readers would refuse."""
    root = tmp_path / "models"
    reg = Registry(root)
    big = LearnedModel.from_json(trained.to_json())
    big.meta["pad"] = "x" * (20 << 20)  # a 20 MiB model: retrain's largest is 9.3 MiB
    with pytest.raises(HorusError, match="not stored"):
        reg.add(big)
    reg.promote(reg.add(trained))
    (root / "v0002.json").write_text(big.to_json())
    history = {"format": "slurm-horus-history", "format_version": 1, "graphs": {}, "families": {},
               "users": {}, "offsets": {}, "margins": {}, "pad": "x" * (40 << 20)}
    (root / "history.json").write_text(json.dumps(history))
    choice = choose_predictor(str(root))
    assert "site history refused" in choice.warning and "too large" in choice.warning
    assert choice.estimator.name == "learned:v0001"
    with pytest.raises(HorusError, match="too large"):
        reg.promote("v0002")
    with pytest.raises(HorusError, match="readers take; not replaced"):
        reg.save_history(history)


def test_registry_refuses_a_symlinked_file(trained, tmp_path):
    """promote/hsubmit had served a symlink planted in the registry to a file in a folder no
    trust check covered."""
    reg = Registry(tmp_path / "models")
    v1 = reg.add(trained)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes((tmp_path / "models" / f"{v1}.json").read_bytes())
    (tmp_path / "models" / "v0002.json").symlink_to(elsewhere)
    with pytest.raises(HorusError, match="a symlink"):
        reg.promote("v0002")
    with pytest.raises(HorusError, match="a symlink"):
        reg.load("v0002")
    assert reg.serving() is None
    reg.promote(v1)
    assert reg.serving() == v1


def test_the_fits_column_says_no_where_not_even_a_whole_gpu_holds_the_job(tmp_path):
    # a 92 GB prediction showed "-" on an A100 80 GB (the policy costs no such type), and the
    # footnote of a "no" read "<=" all the same
    policy = tmp_path / "policy.conf"
    policy.write_text("gpu.t4.mem_mib = 15360\npack_limit_pct = 90\n")
    env = {"HORUS_MODEL_DIR": str(tmp_path / "models"), "HORUS_POLICY": str(policy)}
    proc = _cli("predict", str(ZOO / "gpt2_xl.onnx"), "-b", "16", "--dim", "seq=512", "--gpu", "t4",
                "--gpu", "a100-80gb", "--json", env=env)
    rows = {r["gpu"]: r for r in json.loads(proc.stdout)["predictions"]}
    assert rows["t4"]["fits"] is False and rows["a100-80gb"]["fits"] is False, rows
    assert "p90 > a100-80gb's 81920 MiB" in rows["a100-80gb"]["fit_rule"]
    assert "> 90% of gpu.t4.mem_mib 15360 MiB" in rows["t4"]["fit_rule"]
    small = json.loads(_cli("predict", str(ZOO / "small_cnn.onnx"), "-b", "8", "--gpu", "t4",
                            "--gpu", "a100-80gb", "--json", env=env).stdout)
    assert [r["fits"] for r in small["predictions"]] == [True, None]  # costed; not the policy's question


def test_a_policy_that_is_a_fifo_is_no_policy_not_a_hang(tmp_path):
    import os

    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)
    proc = _cli("predict", str(ZOO / "small_cnn.onnx"), "-b", "4", "--gpu", "t4",
                env={"HORUS_MODEL_DIR": str(tmp_path), "HORUS_POLICY": str(fifo)})
    assert proc.returncode == 0 and "no readable policy" in proc.stdout, proc.stderr


@pytest.mark.parametrize("stored, want", [
    ({"cpus": 32, "gpus": 4}, 8.0),  # what sync stores: Slurm's allocation, CPUs per GPU read from it
    ({"cpus": 8, "gpus": 3}, 8 / 3),
    ({"cpus": 8, "gpus": None}, None),  # a job on shards: no whole GPU
    ({"cpus": 8, "gpus": 0}, None), ({"cpus": None, "gpus": 2}, None),
    ({"cpus_per_gpu": "2.5"}, 2.5), ({"cpus_per_gpu": 4, "cpus": 1, "gpus": 1}, 4.0),
    ({"cpus_per_gpu": ""}, None), ({"cpus_per_gpu": 0}, None),
    ({"cpus_per_task": 32}, None),  # the old, other figure: unknown, never taken for this one
    ({"cpus": 2 ** 62, "gpus": 1}, None),  # past any node
])
def test_the_stored_workloads_cpus_per_gpu(stored, want):
    from slurm_horus.predict.workload import workload_dict, workload_from

    w = workload_from(stored)
    assert w.cpus_per_gpu == (pytest.approx(want) if want else want)
    assert workload_from(workload_dict(w)) == w


@pytest.mark.parametrize("stored", [{"cpus_per_gpu": "eight"}, {"cpus_per_gpu": [1]},
                                    {"cpus": "x", "gpus": 1}, {"cpus_per_gpu": -2}])
def test_a_stored_cpu_figure_that_is_none_is_a_one_line_error(stored):
    from slurm_horus.predict.workload import workload_from

    with pytest.raises(HorusError, match="(?i)cpus") as e:
        workload_from(stored)
    assert "\n" not in str(e.value)


def test_the_learned_models_cpu_input_is_cpus_per_gpu():
    from slurm_horus.predict.learned import input_names

    names = input_names()
    assert "cpus_per_gpu" in names and "cpus_per_task" not in names
    report = _report("resnet50", 8)
    for cpg, seen in ((8.0, 8.0), (2.5, 2.5), (None, 0.0)):  # 0: unknown
        w = Workload(batch_size=8, cpus_per_gpu=cpg)
        row = input_row(report.values, A100, w, EST.predict(report, A100, w))
        assert row[names.index("cpus_per_gpu")] == seen


def _old_cpu_input(trained, root: Path) -> Registry:
    """A registry serving ``trained`` as a model file written before the CPU input was CPUs per
    GPU: the same file with the input named cpus_per_task."""
    reg = Registry(root)
    version = reg.add(trained)
    reg.promote(version)
    doc = json.loads((root / f"{version}.json").read_text())
    doc["inputs"] = ["cpus_per_task" if n == "cpus_per_gpu" else n for n in doc["inputs"]]
    (root / f"{version}.json").write_text(json.dumps(doc))
    return reg


def test_a_model_file_with_the_old_cpu_input_is_refused_and_the_next_predictor_serves(trained, tmp_path):
    """A model trained on cpus_per_task (CPUs in all) must never be fed CPUs per GPU under the
    new name: refused in one line, and the cold start serves."""
    from slurm_horus.predict.chain import choose_predictor

    reg = _old_cpu_input(trained, tmp_path / "models")
    with pytest.raises(HorusError, match="cpus_per_task.*retrain") as e:
        reg.load("v0001")
    assert "\n" not in str(e.value)
    assert [m["valid"] for m in reg.list()] == [False]
    choice = choose_predictor(reg.root)
    assert isinstance(choice.estimator, ColdStartEstimator)
    assert "cpus_per_task" in choice.warning and "cold-start estimator serves" in choice.warning
    proc = _cli("predict", str(ZOO / "resnet50.onnx"), "-b", "16", "--gpu", "t4", "--json",
                env={"HORUS_MODEL_DIR": str(reg.root)})
    assert proc.returncode == 0 and json.loads(proc.stdout)["predictor"] == "cold-start", proc.stderr


def test_hsubmit_submits_past_a_model_file_with_the_old_cpu_input(trained, tmp_path, slurm_bin):
    env, log = slurm_bin
    reg = _old_cpu_input(trained, tmp_path / "models")
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", "-p", "gpu", "--gres=gpu:1",
                         "-c", "8", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8",
                         "--horus-model-dir", str(reg.root), "--wrap", "true"],
                        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    warning = [line for line in cp.stderr.splitlines() if "cpus_per_task" in line]
    assert len(warning) == 1 and "cold-start estimator serves" in warning[0], cp.stderr
    assert "Traceback" not in cp.stderr
    assert any(a.startswith("--comment=horus:v1;a100=") for a in log.read_text().splitlines())


def test_a_registry_write_on_a_full_disk_is_one_line_and_leaves_no_temp_file(trained, tmp_path, monkeypatch):
    """A review: a write that ran out of space left a 0-byte .tmp-*.json behind each time, and
    the OSError reached the admin as an internal error."""
    import errno
    import os

    reg = Registry(tmp_path / "models")
    reg.save_json("calibration.json", {"kept": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HorusError, match=r"calibration\.json: not written \(No space left on device\)"):
        reg.save_json("calibration.json", {"kept": 0})
    with pytest.raises(HorusError, match=r"v0001\.json: not written"):
        reg.add(trained)
    monkeypatch.undo()
    assert reg.load_json("calibration.json") == {"kept": 1} and reg.versions() == []
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "models").iterdir())


def test_temp_files_of_a_killed_registry_writer_are_removed_never_a_live_ones(tmp_path):
    """A writer killed mid-write leaves its temp file, which nothing removed; the next write
    removes those an hour old, never one a concurrent writer is still filling."""
    import os
    import time

    from slurm_horus.textfile import STALE_TEMP_S

    root = tmp_path / "models"
    (root / "users").mkdir(parents=True)
    stale = [root / ".tmp-killed.json", root / "users" / ".tmp-killed.json"]
    live, other = root / ".tmp-live.json", root / ".tmp-other"
    for p in (*stale, live, other):
        p.write_text("")
    old = time.time() - STALE_TEMP_S - 60
    for p in (*stale, other):
        os.utime(p, (old, old))
    reg = Registry(root)
    reg.save_json("calibration.json", {})
    reg.pseudonyms([])
    assert not any(p.exists() for p in stale) and live.exists() and other.exists()
