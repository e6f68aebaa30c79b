"""Prediction robustness (issue 10): ops we cannot cost, impossible dimensions, bad learned models.

Real graphs only (the zoo, or built with onnx.helper); registry models are real trained models,
then damaged the way an attacker or a broken disk would.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphs import mlp, save
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.errors import HorusError, ModelError
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.learned import LearnedEstimator, LearnedModel, input_row, train_holdout
from slurm_horus.predict.chain import choose_predictor
from slurm_horus.predict.registry import Registry

ZOO = Path(__file__).parent / "data" / "zoo"
HORUS = [sys.executable, "-m", "slurm_horus.cli.horus"]
A100 = get_gpu("a100")


def _horus(*args, env=None):
    return subprocess.run([*HORUS, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


# --- 1. unknown and custom-domain ops ------------------------------------------------------

def _with_custom_input_op(tmp_path: Path, domain="com.acme", op="Preprocess") -> Path:
    """ResNet-50 from the zoo with one custom-domain op between its input and the first conv."""
    model = onnx.load(ZOO / "resnet50.onnx", load_external_data=False)
    x = model.graph.input[0].name
    for node in model.graph.node:
        node.input[:] = ["x_pre" if n == x else n for n in node.input]
    model.graph.node.insert(0, helper.make_node(op, [x], ["x_pre"], domain=domain, name="pre"))
    model.opset_import.append(helper.make_opsetid(domain, 1))
    path = tmp_path / "resnet50_custom.onnx"
    onnx.save(model, path)
    return path


def test_custom_op_at_resnet50_input_costs_like_resnet50(tmp_path):
    """Before: 0 FLOP and 2,367 MiB p90 (every tensor after the op lost its shape)."""
    plain = extract_features(ZOO / "resnet50.onnx", batch_size=32)
    custom = extract_features(_with_custom_input_op(tmp_path), batch_size=32)
    assert custom.unknown_ops == ["com.acme.Preprocess"]
    assert custom.assumed_shapes == ["x_pre"]
    for name in ("flops", "saved_activation_bytes", "activation_bytes", "peak_live_bytes"):
        assert custom.values[name] == pytest.approx(plain.values[name], rel=0.02), name
    assert custom.values["flops"] >= plain.values["flops"]  # the op itself costs something
    w = Workload(batch_size=32)
    est = ColdStartEstimator()
    p, c = est.predict(plain, A100, w), est.predict(custom, A100, w)
    assert c.mem_mib_p90 == pytest.approx(p.mem_mib_p90, rel=0.03)
    assert c.mem_mib_p90 >= p.mem_mib_p90 and c.util_pct == pytest.approx(p.util_pct, rel=0.03)
    assert any("com.acme.Preprocess" in line for line in custom.warnings())
    assert any("x_pre" in line and "assumed" in line for line in custom.warnings())


def test_cli_names_the_custom_op(tmp_path):
    path = _with_custom_input_op(tmp_path)
    cp = _horus("predict", path, "-b", "32", "--gpu", "a100", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["mem_mib_p90"] > 5000
    assert "warning: no cost rule for com.acme.Preprocess" in cp.stderr
    cp = _horus("features", path, "-b", "32")
    assert cp.returncode == 0 and "com.acme.Preprocess" in cp.stdout and "x_pre" in cp.stdout
    cp = _horus("features", path, "-b", "32", "--json")
    assert json.loads(cp.stdout)["assumed_shapes"] == ["x_pre"]
    assert "com.acme.Preprocess" in cp.stderr


def test_the_models_names_reach_the_terminal_without_control_characters(tmp_path):
    # an op type and a dimension name are the model's text: an escape sequence in them drove
    # the terminal of whoever looked at the model (rich's markup escape leaves them in)
    op = "Ev\x1b[31mil\nFAKE"
    g = helper.make_graph([helper.make_node(op, ["x"], ["c"], domain="com.ev"),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b\x1b]0;t\x07", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.ev", 1)])
    m.ir_version = 8
    path = tmp_path / "evil.onnx"
    path.write_bytes(m.SerializeToString())
    for args in (("features", path, "-b", "2"), ("features", path, "-b", "2", "--json"),
                 ("predict", path, "-b", "2", "--gpu", "a100")):
        cp = _horus(*args)
        assert cp.returncode == 0, cp.stderr
        out = cp.stdout + cp.stderr
        assert "\x1b" not in out and "\x07" not in out, out
        assert args[0] == "predict" or "com.ev.Ev\\x1b[31mil\\nFAKE" in out, out


def _chain(tmp_path, ops):
    """x[batch, 64] -> (op, then a 64x64 MatMul)* -> y: each op given as (domain, op_type)."""
    nodes, inits, prev = [], [], "x"
    opsets = {"": 17}
    for i, (domain, op) in enumerate(ops):
        nodes.append(helper.make_node(op, [prev], [f"u{i}"], domain=domain))
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [64, 64], [0.0] * 4096))
        nodes.append(helper.make_node("MatMul", [f"u{i}", f"w{i}"], [f"m{i}"]))
        prev = f"m{i}"
        opsets.setdefault(domain, 1)
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                    for d, v in opsets.items()])
    model.ir_version = 8
    path = tmp_path / "chain.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_shapes_flow_past_many_interleaved_unknown_ops(tmp_path):
    """Each MatMul after an unknown op keeps its cost, however many there are."""
    ops = [("com.acme", "Mystery"), ("", "NotAnOnnxOp"), ("com.acme", "Relu")] * 4
    r = extract_features(_chain(tmp_path, ops), batch_size=8)
    matmul = 2 * 8 * 64 * 64
    assert r.by_op["MatMul"].flops == len(ops) * matmul
    assert r.unknown_ops == ["NotAnOnnxOp", "com.acme.Mystery", "com.acme.Relu"]
    assert len(r.assumed_shapes) == len(ops)
    # at least one FLOP per output element, and what they read and write kept for backward
    assert r.values["flops"] >= len(ops) * (matmul + 8 * 64)
    assert r.values["saved_activation_bytes"] >= (len(ops) + 1) * 8 * 64 * 4
    assert all(n.flops >= 0 for n in r.nodes)


def test_custom_domain_op_is_never_taken_for_the_standard_op(tmp_path):
    """A com.acme Relu may do anything: no Relu rule, and it is named."""
    r = extract_features(_chain(tmp_path, [("com.acme", "Relu")]), batch_size=2)
    assert "Relu" not in r.by_op and r.unknown_ops == ["com.acme.Relu"]


def test_declared_shape_of_an_unknown_op_is_kept(tmp_path):
    """An exporter's annotation beats the guess: a custom op that halves its input."""
    graph = helper.make_graph(
        [helper.make_node("Half", ["x"], ["h"], domain="com.acme"),
         helper.make_node("Relu", ["h"], ["y"])], "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.acme", 1)])
    model.ir_version = 8
    (tmp_path / "h.onnx").write_bytes(model.SerializeToString())
    r = extract_features(tmp_path / "h.onnx", batch_size=4)
    assert r.assumed_shapes == [] and r.by_op["Relu"].flops == 4 * 32


# --- 2. impossible dimensions --------------------------------------------------------------

def _conv(tmp_path, x_shape, w_shape=(8, 4, 3, 3), y_shape=None, value_info=()):
    w = helper.make_tensor("w", TensorProto.FLOAT, list(w_shape),
                           [0.0] * max(math.prod(w_shape), 0))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], [w],
        value_info=list(value_info))
    return save(graph, tmp_path / "conv.onnx")


@pytest.mark.parametrize("make, message", [
    (lambda p: _conv(p, [-2, 4, 16, 16]), "'x' has a negative dimension"),
    (lambda p: _conv(p, ["batch", -4, 16, 16]), "'x' has a negative dimension"),
    (lambda p: _conv(p, ["batch", 4, 16, 16], y_shape=["batch", 8, -1, 14]),
     "'y' has a negative dimension"),
    (lambda p: _conv(p, ["batch", 4, 2, 2], w_shape=(8, 4, 5, 5)), "negative dimension"),
    (lambda p: _conv(p, ["batch", 4, 0, 16]), "size 0"),
])
def test_impossible_static_dimensions_are_refused(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ModelError, match=message):
        extract_features(path, batch_size=2)
    for command in ("features", "predict"):
        cp = _horus(command, path, "-b", "2")
        assert cp.returncode == 2 and cp.stdout == ""
        assert len(cp.stderr.strip().splitlines()) == 1 and "error:" in cp.stderr


@pytest.mark.parametrize("x_shape, w_shape", [([8], [1, 12, 8]), (["batch", 4, 8], [12])])
def test_a_recurrent_layer_of_the_wrong_rank_is_costed_without_its_rule(tmp_path, x_shape, w_shape):
    # an LSTM whose X or W has not the rank of its layout had failed the analysis (IndexError)
    w = helper.make_tensor("w", TensorProto.FLOAT, w_shape, [0.0] * math.prod(w_shape))
    graph = helper.make_graph([helper.make_node("LSTM", ["x", "w"], ["y"], hidden_size=3)], "lstm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    r = extract_features(save(graph, tmp_path / "lstm.onnx"), batch_size=2)
    assert r.unknown_ops == ["LSTM"] and r.nodes[0].extra_saved_bytes == 0


def test_negative_initializer_dimension_is_refused(tmp_path):
    path = _conv(tmp_path, ["batch", 4, 16, 16])
    model = onnx.load(path)
    model.graph.initializer[0].dims[1] = -4
    onnx.save(model, path)
    with pytest.raises(ModelError, match="initializer 'w' has a negative dimension"):
        extract_features(path, batch_size=2)


@pytest.mark.parametrize("args, message", [
    (["-b", "-1"], "batch size"), (["-b", "0"], "batch size"),
    (["-b", "2", "--dim", "batch=-5"], "dimension 'batch'"),
    (["-b", "2", "--dim", "batch=0"], "dimension 'batch'"),
])
def test_negative_or_zero_sizes_from_the_user_are_refused(tmp_path, args, message):
    path = mlp(tmp_path / "m.onnx")
    for command in ("features", "predict"):
        cp = _horus(command, path, *args)
        assert cp.returncode == 2 and cp.stdout == "", cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1 and message in cp.stderr
    with pytest.raises(ModelError):
        extract_features(path, batch_size=-1)
    with pytest.raises(ModelError):
        extract_features(path, dims={"batch": -5})


def test_a_zero_leading_dimension_is_bound_like_a_symbolic_one(tmp_path):
    """Some exporters write 0 for 'unknown': --batch-size binds it; left unbound it is refused."""
    path = _conv(tmp_path, [0, 4, 16, 16])
    r = extract_features(path, batch_size=2)
    assert r.values["flops"] == 2 * 2 * 8 * 14 * 14 * 4 * 9 and all(n.flops >= 0 for n in r.nodes)
    with pytest.raises(ModelError, match="size 0"):
        extract_features(path)


# --- 3. learned models that must never serve -----------------------------------------------

@pytest.fixture(scope="module")
def model_json():
    """A real trained model (zoo graphs, a site that needs 20 % more memory)."""
    rows, mem, util, cold = [], [], [], []
    est = ColdStartEstimator()
    for name in ("small_cnn", "mobilenet_v2", "resnet50"):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            report = extract_features(ZOO / f"{name}.onnx", batch_size=batch)
            for gpu in ("a100", "t4"):
                g, w = get_gpu(gpu), Workload(batch_size=batch)
                c = est.predict(report, g, w)
                rows.append(input_row(report.values, g, w, c))
                cold.append(c.mem_mib)
                mem.append(c.mem_mib * 1.2)
                util.append(min(c.util_pct * 0.9, 100))
    model, _ = train_holdout(rows, mem, util, cold, max_iter=30)
    return model.to_json()


def _registry(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "v0001.json").write_text(text)
    (root / "current.json").write_text(json.dumps({"serving": "v0001", "history": []}))
    return root


def _as_lists(d: dict) -> dict:
    """A model document in format 1 (trees as lists of numbers), which still loads."""
    import base64

    from slurm_horus.predict.trees import PACKED

    for part in ("mem", "util"):
        a = {k: np.frombuffer(base64.b64decode(v), PACKED[k]).tolist()
             for k, v in d[part].pop("packed").items()}
        trees, at = [], 0
        for n in a.pop("sizes"):
            trees.append({k: v[at:at + n] for k, v in a.items()})
            at += n
        d[part]["trees"] = trees
    d["format_version"] = 1
    return d


def _damage(text: str, how) -> str:
    d = _as_lists(json.loads(text))
    how(d)
    return json.dumps(d)  # NaN and Infinity are written as JSON's non-standard literals


def _repack(d: dict, part: str, key: str, change) -> None:
    import base64

    from slurm_horus.predict.trees import PACKED

    a = np.frombuffer(base64.b64decode(d[part]["packed"][key]), PACKED[key]).copy()
    change(a)
    d[part]["packed"][key] = base64.b64encode(a.tobytes()).decode()


PACKED_DAMAGE = {
    "not base64": lambda d: d["mem"]["packed"].__setitem__("value", "@@not base64@@"),
    "short array": lambda d: _repack(d, "mem", "value", lambda a: None) or d["mem"]["packed"]
    .__setitem__("value", d["mem"]["packed"]["value"][:-12]),
    "child cycle": lambda d: _repack(d, "util", "left", lambda a: a.__setitem__(0, 0)),
    "feature out of range": lambda d: _repack(d, "mem", "feature",
                                              lambda a: a.__setitem__(0, 9999)),
    "NaN leaf": lambda d: _repack(d, "mem", "value", lambda a: a.__setitem__(-1, np.nan)),
    "missing array": lambda d: d["util"]["packed"].pop("leaf"),
}


def test_the_undamaged_format_1_model_serves(model_json, tmp_path):
    root = _registry(tmp_path / "models", json.dumps(_as_lists(json.loads(model_json))))
    report = extract_features(ZOO / "resnet50.onnx", batch_size=16)
    w = Workload(batch_size=16)
    old = choose_predictor(root).estimator.predict(report, A100, w)
    new = LearnedModel.from_json(model_json)
    assert old.predictor == "learned:v0001"
    assert old.mem_mib == pytest.approx(LearnedEstimator(new, "v0001").predict(
        report, A100, w).mem_mib, rel=1e-12)


@pytest.mark.parametrize("damage", PACKED_DAMAGE, ids=list(PACKED_DAMAGE))
def test_damaged_packed_trees_are_refused(model_json, tmp_path, damage):
    d = json.loads(model_json)
    PACKED_DAMAGE[damage](d)
    root = _registry(tmp_path / "models", json.dumps(d))
    with pytest.raises(HorusError, match="v0001.json"):
        Registry(root).load("v0001")
    assert isinstance(choose_predictor(root).estimator, ColdStartEstimator)


def _first_split(tree):
    return tree["leaf"].index(0)


DAMAGE = {
    "feature index out of range": lambda d: d["mem"]["trees"][0]["feature"].__setitem__(
        _first_split(d["mem"]["trees"][0]), 9999),
    "negative feature index": lambda d: d["util"]["trees"][0]["feature"].__setitem__(
        _first_split(d["util"]["trees"][0]), -1),
    "string leaves": lambda d: d["util"]["trees"][0].__setitem__(
        "value", ["x"] * len(d["util"]["trees"][0]["value"])),
    "NaN leaf": lambda d: d["mem"]["trees"][1]["value"].__setitem__(-1, float("nan")),
    "child cycle": lambda d: d["mem"]["trees"][0]["left"].__setitem__(
        _first_split(d["mem"]["trees"][0]), 0),
    "baseline +1000": lambda d: d["mem"].__setitem__("baseline", 1000.0),
    "baseline -1000": lambda d: d["mem"].__setitem__("baseline", -1000.0),
    "util baseline +1000": lambda d: d["util"].__setitem__("baseline", 1000.0),
    "string baseline": lambda d: d["util"].__setitem__("baseline", "3.0"),
    "infinite baseline": lambda d: d["util"].__setitem__("baseline", float("inf")),
    "unknown range feature": lambda d: d["ranges"].__setitem__("bogus", [0, 1]),
    "NaN range": lambda d: d["ranges"].__setitem__("log_flops", [float("nan"), 1]),
    "absurd p90 margin": lambda d: d.__setitem__("mem_log_q90", 50.0),
    "trees not a list": lambda d: d["mem"].__setitem__("trees", {"a": 1}),
    "ragged tree": lambda d: d["mem"]["trees"][0]["value"].pop(),
    # structurally fine, out of bounds on the probe set
    "memory 1/150 of the physics": lambda d: d["mem"].__setitem__("baseline", -5.0),
    "utilization above 100 %": lambda d: d["util"].__setitem__("baseline", 10.0),
    "utilization below 0 %": lambda d: d["util"].__setitem__("baseline", -10.0),
}


def test_the_undamaged_model_serves(model_json, tmp_path):
    choice = choose_predictor(_registry(tmp_path / "models", model_json))
    assert isinstance(choice.estimator, LearnedEstimator) and choice.warning is None
    report = extract_features(ZOO / "resnet50.onnx", batch_size=16)
    p = choice.estimator.predict(report, A100, Workload(batch_size=16))
    assert p.predictor == "learned:v0001"


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_model_is_refused_and_cold_start_serves(model_json, tmp_path, damage):
    root = _registry(tmp_path / "models", _damage(model_json, DAMAGE[damage]))
    with pytest.raises(HorusError):
        Registry(root).load("v0001")
    choice = choose_predictor(root)
    assert isinstance(choice.estimator, ColdStartEstimator)
    assert choice.warning and "v0001.json" in choice.warning and "\n" not in choice.warning
    assert Registry(root).list()[0]["valid"] is False
    with pytest.raises(HorusError):  # nor can an admin promote it
        Registry(root).promote("v0001")


@pytest.mark.parametrize("damage", ["feature index out of range", "string leaves",
                                    "baseline +1000", "baseline -1000"])
def test_cli_serves_cold_start_with_a_one_line_warning(model_json, tmp_path, damage):
    root = _registry(tmp_path / "models", _damage(model_json, DAMAGE[damage]))
    cp = _horus("predict", ZOO / "resnet50.onnx", "-b", "32", "--gpu", "a100", "--json",
                "--model-dir", root)
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    assert out["predictor"] == "cold-start" and 4000 < out["mem_mib_p90"] < 8000
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("horus predict: warning: learned model refused")
    cp = _horus("predict", ZOO / "resnet50.onnx", "-b", "32", "--gpu", "a100", "--model-dir", root)
    assert cp.returncode == 0 and "cold-start" in cp.stdout and "refused" in cp.stderr


def test_serving_state_of_the_wrong_type_is_refused(model_json, tmp_path):
    root = _registry(tmp_path / "models", model_json)
    (root / "current.json").write_text(json.dumps({"serving": 5}))
    choice = choose_predictor(root)
    assert isinstance(choice.estimator, ColdStartEstimator) and "registry state" in choice.warning


def _other_uid() -> int:
    return 65534 if os.getuid() != 65534 else 65533


@pytest.mark.parametrize("plant", ["file g+w", "file o+w", "folder g+w", "folder o+w",
                                   "state o+w", "parent o+w", "file owner", "folder owner"])
def test_registry_others_could_write_is_refused(model_json, tmp_path, plant):
    """Nobody but root or the reader may choose the model the reader is served."""
    root = _registry(tmp_path / "site" / "models", model_json)
    os.chmod(tmp_path / "site", 0o755)
    target = {"file": root / "v0001.json", "folder": root, "state": root / "current.json",
              "parent": tmp_path / "site"}[plant.split()[0]]
    if plant.endswith("owner"):
        if os.getuid() != 0:
            pytest.skip("only root can give a file away")
        os.chown(target, _other_uid(), -1)
    else:
        os.chmod(target, target.stat().st_mode | (stat.S_IWGRP if "g+w" in plant else stat.S_IWOTH))
    choice = choose_predictor(root)
    assert isinstance(choice.estimator, ColdStartEstimator)
    assert "not trusted" in choice.warning and str(target) in choice.warning


def test_registry_under_a_sticky_world_writable_parent_serves(model_json, tmp_path):
    """Like /tmp: others may create entries there but not replace ours."""
    os.chmod(tmp_path, 0o1777)
    root = _registry(tmp_path / "models", model_json)
    os.chmod(root, 0o755)
    assert choose_predictor(root).warning is None


def test_hsubmit_submits_the_job_with_a_refused_model(model_json, tmp_path, slurm_bin):
    """Through the real hsubmit, with Slurm's commands stood in for by scripts that record."""
    root = _registry(tmp_path / "models", _damage(model_json, DAMAGE["string leaves"]))
    env, log = slurm_bin
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", "-p", "gpu", "--gres=gpu:1",
                         "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "32",
                         "--horus-model-dir", str(root), "--wrap", "true"],
                        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert "Submitted batch job 42" in cp.stdout
    assert "horus:v1;a100=" in log.read_text()  # with the cold-start hint


def _open_fds() -> list[int]:
    out = []
    for fd in range(1024):
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            pass
    return out


def test_a_confined_analysis_keeps_only_the_fds_it_is_given(tmp_path):
    """The sync's analysis child had every fd of its caller (the ledger's database ...): it
    keeps those it is given, its pipe and the standard ones."""
    from slurm_horus.graph.limits import confined, run_bounded

    kept, other = (os.open(tmp_path / name, os.O_RDWR | os.O_CREAT) for name in "ab")
    try:
        same = lambda x: x  # noqa: E731
        with confined([kept]):
            fds = run_bounded("m.onnx", _open_fds, same, same)
        assert kept in fds and other not in fds and {0, 1, 2} <= set(fds) and len(fds) <= 6
        assert other in run_bounded("m.onnx", _open_fds, same, same)  # unconfined: as it was
    finally:
        os.close(kept)
        os.close(other)
