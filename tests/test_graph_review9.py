"""The dynamo exporter's graphs (torch.onnx.export's default): parameters counted as PyTorch
counts them, though its optimizer merged, folded and dropped weights without an Identity."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from slurm_horus.graph.costs import parameter_tensors
from slurm_horus.graph.features import extract_features
from slurm_horus.graph.load import load_graph
from tests import graphs

TINY_LM = Path(__file__).parent / "data" / "zoo" / "dynamo_tiny_lm.onnx"
TINY_LM_PARAMS = 29184  # sum(p.numel() for p in graphs.tiny_lm().parameters())


def test_tiny_lm_counts_as_pytorch_does():
    """Five LayerNorms read one merged weight and bias, a zero attention bias is another
    layer's, two zero out-projection biases are gone, the tied head is a folded W.t() beside
    the embedding: 31,969 before (the head twice, 416 merged or dropped missing)."""
    report = extract_features(TINY_LM, dims={"batch": 2, "seq": 8})
    assert report.values["params"] == TINY_LM_PARAMS
    assert report.warnings() == []


def test_merged_weights_read_under_their_own_names():
    graph = load_graph(TINY_LM, dims={"batch": 2, "seq": 8})
    params = parameter_tensors(graph)
    assert {"layers.1.norm2.weight", "ln.bias", "layers.1.self_attn.in_proj_bias",
            "layers.0.self_attn.out_proj.bias"} <= set(params)
    assert "head.weight" in params and not set(params) & graph.folded_constants  # tied: once


def test_fixture_is_the_model():
    pytest.importorskip("torch")
    assert sum(p.numel() for p in graphs.tiny_lm().parameters()) == TINY_LM_PARAMS


def test_a_weight_folded_with_constants_is_warned_not_guessed(tmp_path):
    """A position table gathered at constant positions (static shapes) folds into a new
    initializer: the table's size is lost, so the count is low, and says so."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    folded = helper.make_tensor("val_3", TensorProto.FLOAT, [2, 4], [0.0] * 8)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [1.0] * 16)
    mm = helper.make_node("MatMul", ["x", "w"], ["m"])
    add = helper.make_node("Add", ["m", "val_3"], ["y"])
    helper.set_metadata_props(mm, {"pkg.torch.onnx.fx_node": "%mm = call_function[target=aten.mm](args = (%x, %p_w))"})
    graph = helper.make_graph([mm, add], "g", [x], [y], [w, folded])
    helper.set_metadata_props(graph, {"pkg.torch.export.ExportedProgram.graph_signature":
                                      "\n# inputs\np_w: PARAMETER target='w'\np_pos_weight: PARAMETER target='pos.weight'\n"})
    info = helper.make_tensor_value_info("val_3", TensorProto.FLOAT, [2, 4])
    helper.set_metadata_props(info, {"pkg.onnxscript.optimizer.folded_from": "['arange', 'pos.weight']"})
    graph.value_info.append(info)
    report = extract_features(graphs.save(graph, tmp_path / "folded.onnx"))
    assert report.values["params"] == 16
    assert any("pos.weight" in w and "dynamo" in w for w in report.warnings())


def test_a_node_of_many_inputs_and_reads_loads_in_linear_time(tmp_path):
    """A crafted node of 150,000 inputs whose fx_node names 150,000 placeholders (7 MB): each
    input was looked up in the list of its reads, 2 * 10**10 steps, minutes of hsubmit (and
    of each sync) before the analysis timer refused the file; a set answers in a second.  The
    guard is the analysis's own timer (60 s), generous by far."""
    from slurm_horus.graph.limits import analysis_limits

    k = 150_000
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [1.0] * 16)
    cat = helper.make_node("Concat", ["w"] * k, ["c"], axis=0)
    helper.set_metadata_props(cat, {"pkg.torch.onnx.fx_node": " ".join(f"%p{i}" for i in range(k))})
    graph = helper.make_graph([cat], "g", [x], [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)], [w])
    helper.set_metadata_props(graph, {"pkg.torch.export.ExportedProgram.graph_signature":
                                      "".join(f"p{i}: PARAMETER target='q{i}'\n" for i in range(k))
                                      + "pw: PARAMETER target='w'\n"})
    path = graphs.save(graph, tmp_path / "wide.onnx")
    with analysis_limits("wide.onnx", timeout_s=60.0):
        g = load_graph(path)
    assert len(g.nodes[0].input) == k


# A BatchNorm CNN (graphs.bn_cnn) from the dynamo exporter, whose optimizer fused its four
# training-mode norms into the Conv and Gemm before them and dropped a zero Conv bias; and the
# features of the TorchScript export of the same model at batch 8 (test_bn_cnn_figures_are_its_
# torchscript_export's checks them where torch is installed): PyTorch's parameter count, the
# bytes the backward pass keeps, the FLOPs.
BN_CNN = Path(__file__).parent / "data" / "zoo" / "dynamo_bn_cnn.onnx"
BN_CNN_TS = {"params": 5362, "saved_activation_bytes": 289_536, "flops": 5_048_912, "n_norm": 4}
# the tolerance of the dynamo export's saved bytes and FLOPs against the TorchScript export's:
# the two decompose a few ops differently (ReduceMean for the mean, not GlobalAveragePool);
# parameters and norms are exact
BN_CNN_TOLERANCE = 0.001


def _bn_cnn_report(path=BN_CNN):
    return extract_features(path, batch_size=8)


def test_bn_cnn_costs_as_its_torchscript_export():
    """Before: 5,210 parameters (the four norms' 144 unsized, the dropped 1x1 Conv bias's 24
    missing, c2.weight_bias's 16 counted), saved activations x0.54 (the norms' inputs, which
    training keeps, gone), FLOPs x0.973, and a warning of sizes lost."""
    report = _bn_cnn_report()
    v = report.values
    assert v["params"] == BN_CNN_TS["params"] and v["n_norm"] == BN_CNN_TS["n_norm"]
    for key in ("saved_activation_bytes", "flops"):
        assert v[key] == pytest.approx(BN_CNN_TS[key], rel=BN_CNN_TOLERANCE), key
    assert report.warnings() == []


def test_fused_norms_are_put_back_as_training_batch_norms():
    graph = load_graph(BN_CNN, batch_size=8)
    params = parameter_tensors(graph)
    norms = [n for n in graph.nodes if n.op_type == "BatchNormalization"]
    assert len(norms) == 4
    producers = {o: n for n in graph.nodes for o in n.output}
    for bn in norms:
        assert producers[bn.input[0]].op_type in ("Conv", "Gemm")
        assert [a.i for a in bn.attribute if a.name == "training_mode"] == [1]
        assert graph.info(bn.input[0]).shape == graph.info(bn.output[0]).shape
    assert {f"{b}.{w}" for b in ("b1", "b2", "b3", "bf") for w in ("weight", "bias")} <= set(params)
    assert params["b2.bias"].shape == (16,) and params["bf.weight"].shape == (32,)
    assert "c1.bias" in params and params["c4.bias"].shape == (24,)  # own; dropped and restored
    assert "c2.weight_bias" not in params  # the norm's shift, fused: b2.bias stands for it
    assert not any(n.op_type == "Conv" and "c2.weight_bias" in n.input for n in graph.nodes)


def test_bn_cnn_figures_are_its_torchscript_exports(tmp_path):
    pytest.importorskip("torch")
    ts = graphs.export_bn_cnn(tmp_path / "ts.onnx", dynamo=False)
    v = _bn_cnn_report(ts).values
    assert {k: int(v[k]) for k in BN_CNN_TS} == BN_CNN_TS
    assert sum(p.numel() for p in graphs.bn_cnn().parameters()) == BN_CNN_TS["params"]


def _fused_conv(i: int, x: str, fx_node: str, rule: str = "FuseBatchNormIntoConv", out: str | None = None):
    node = helper.make_node("Conv", [x, f"w{i}"], [out or f"y{i}"], name=f"conv{i}")
    helper.set_metadata_props(node, {"pkg.torch.onnx.fx_node": fx_node,
                                     "pkg.onnxscript.rewriter.rule_name": rule})
    return node


def _bn_call(i: int, tail: str = "True, 0.1, 1e-05", target: str = "_native_batch_norm_legit_functional.default") -> str:
    return (f"%bn{i} : [num_users=3] = call_function[target=torch.ops.aten.{target}](args = "
            f"(%conv{i}, %p_bn{i}_weight, %p_bn{i}_bias, %b_bn{i}_running_mean, %b_bn{i}_running_var, {tail}), kwargs = {{}})")


def test_crafted_fusion_metadata_is_read_safely(tmp_path):
    """A file's claims of fused norms move its own figures only: an eval-mode call, a call cut
    short, a rule on a node of another op put nothing back; a norm whose tensor names the graph
    uses already gets fresh ones; a claimed weight whose name another tensor has is left
    unsized (warned), its norm reading a constant; nothing crashes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])
    calls = [
        _bn_call(0),                                               # put back
        _bn_call(1, target="_native_batch_norm_legit_no_training.default", tail="0.1, 1e-05"),  # eval
        "%bn2 = call_function[target=torch.ops.aten.batch_norm.default](args = (%conv2, %p_bn2_weight",
        _bn_call(3),                                               # put back, names taken
        _bn_call(4),                                               # weight's name taken
        "args = (((((" * 1000,
    ]
    nodes, prev = [], "x"
    for i, call in enumerate(calls):
        out = "y0.pre_norm" if i == 0 else ("y3.running_mean" if i == 3 else f"y{i}")
        nodes.append(_fused_conv(i, prev, call, out=out))
        prev = out
    nodes.append(helper.make_node("Relu", [prev], ["bn4.weight"]))
    relu = helper.make_node("Relu", ["bn4.weight"], ["out"])
    helper.set_metadata_props(relu, {"pkg.torch.onnx.fx_node": _bn_call(9),
                                     "pkg.onnxscript.rewriter.rule_name": "FuseBatchNormIntoConv"})
    nodes.append(relu)
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 4, 1, 1], [0.5] * 16) for i in range(len(calls))]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], weights)
    spec = "".join(f"p_w{i}: PARAMETER target='w{i}'\n" for i in range(len(calls)))
    spec += "".join(f"p_bn{i}_weight: PARAMETER target='bn{i}.weight'\np_bn{i}_bias: PARAMETER target='bn{i}.bias'\n"
                    f"b_bn{i}_running_mean: BUFFER target='bn{i}.running_mean' persistent=True\n"
                    f"b_bn{i}_running_var: BUFFER target='bn{i}.running_var' persistent=True\n" for i in range(10))
    helper.set_metadata_props(graph, {"pkg.torch.export.ExportedProgram.graph_signature": spec})
    path = graphs.save(graph, tmp_path / "crafted.onnx")
    g = load_graph(path, batch_size=2)
    norms = [n for n in g.nodes if n.op_type == "BatchNormalization"]
    assert [n.output[0] for n in norms] == ["y0.pre_norm", "y3.running_mean", "y4"]
    names = [o for n in g.nodes for o in n.output]
    assert len(names) == len(set(names))  # every tensor written once
    params = parameter_tensors(g)
    assert {"bn0.weight", "bn0.bias", "bn3.weight", "bn4.bias"} <= set(params)
    assert "bn4.weight" not in params and not {"bn1.weight", "bn2.weight", "bn9.weight"} & set(params)
    report = extract_features(path, batch_size=2)
    assert report.values["n_norm"] == 3 and report.values["params"] == 6 * 16 + 3 * 2 * 4 - 4  # bn4.weight unsized
    assert any("bn4.weight" in w for w in report.warnings())


def test_many_fused_norms_load_in_linear_time(tmp_path):
    """4,000 fused Convs in a chain, each put back: a few seconds, in the analysis's timer."""
    from slurm_horus.graph.limits import analysis_limits

    k = 4000
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 2, 2])
    nodes = [_fused_conv(i, f"y{i - 1}" if i else "x", _bn_call(i)) for i in range(k)]
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [2, 2, 1, 1], [0.5] * 4) for i in range(k)]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info(f"y{k - 1}", TensorProto.FLOAT, None)],
                              weights)
    spec = "".join(f"p_w{i}: PARAMETER target='w{i}'\np_bn{i}_weight: PARAMETER target='bn{i}.weight'\n"
                   f"p_bn{i}_bias: PARAMETER target='bn{i}.bias'\n" for i in range(k))
    helper.set_metadata_props(graph, {"pkg.torch.export.ExportedProgram.graph_signature": spec})
    path = graphs.save(graph, tmp_path / "chain.onnx")
    with analysis_limits("chain.onnx", timeout_s=60.0):
        g = load_graph(path, batch_size=2)
    assert sum(n.op_type == "BatchNormalization" for n in g.nodes) == k
    assert len(parameter_tensors(g)) == 3 * k
