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
    """A file's claims of fused norms move its own figures only: a call cut short, a rule on a
    node of another op put nothing back; an eval-mode call is put back as an eval-mode norm (one
    output, training_mode 0: review 9's stress pass); a norm whose tensor names the graph
    uses already gets fresh ones; a claimed weight whose name another tensor has is left
    unsized (warned), its norm reading a constant; nothing crashes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])
    calls = [
        _bn_call(0),                                               # put back
        _bn_call(1, target="_native_batch_norm_legit_no_training.default", tail="0.1, 1e-05"),  # eval: put back
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
    assert [n.output[0] for n in norms] == ["y0.pre_norm", "y1", "y3.running_mean", "y4"]
    assert [len(n.output) for n in norms] == [3, 1, 3, 3]
    assert [n.attribute[-1].i for n in norms] == [1, 0, 1, 1]  # training_mode
    names = [o for n in g.nodes for o in n.output]
    assert len(names) == len(set(names))  # every tensor written once
    params = parameter_tensors(g)
    assert {"bn0.weight", "bn0.bias", "bn1.weight", "bn1.bias", "bn3.weight", "bn4.bias"} <= set(params)
    assert "bn4.weight" not in params and not {"bn2.weight", "bn9.weight"} & set(params)
    report = extract_features(path, batch_size=2)
    assert report.values["n_norm"] == 4 and report.values["params"] == 6 * 16 + 4 * 2 * 4 - 4  # bn4.weight unsized
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


# Review 9's stress pass (MobileNetV2, EfficientNet with transformers' TF padding; a BatchNorm
# kept in eval mode by its module's train()): graphs.pad_cnn from the dynamo exporter, whose
# optimizer fused three F.pad calls into the Conv after them (FuseConvPad) and an eval-mode
# BatchNorm into its Conv; the features of its TorchScript export at batch 8, which
# test_pad_cnn_figures_are_its_torchscript_exports checks where torch is installed.
PAD_CNN = Path(__file__).parent / "data" / "zoo" / "dynamo_pad_cnn.onnx"
PAD_CNN_TS = {"params": 5218, "saved_activation_bytes": 292_448, "flops": 5_200_464, "n_norm": 3,
              "activation_bytes": 407_648}


def test_pad_cnn_costs_as_its_torchscript_export():
    """Before: 5,186 parameters (the frozen norm's 32 lost, warned), saved activations x0.646
    (the padded copies each Conv keeps, and the frozen norm's input, gone), 2 norms."""
    report = extract_features(PAD_CNN, batch_size=8)
    assert {k: int(report.values[k]) for k in PAD_CNN_TS} == PAD_CNN_TS
    assert report.warnings() == []


def test_pad_cnn_figures_are_its_torchscript_exports(tmp_path):
    pytest.importorskip("torch")
    ts = graphs.export_pad_cnn(tmp_path / "ts.onnx", dynamo=False)
    v = extract_features(ts, batch_size=8).values
    assert {k: int(v[k]) for k in PAD_CNN_TS} == PAD_CNN_TS
    assert sum(p.numel() for p in graphs.pad_cnn().parameters()) == PAD_CNN_TS["params"]


def test_fused_pads_and_eval_norms_are_put_back():
    graph = load_graph(PAD_CNN, batch_size=8)
    producers = {o: n for n in graph.nodes for o in n.output}
    pads = [n for n in graph.nodes if n.op_type == "Pad"]
    assert len(pads) == 3
    for pad in pads:
        (conv,) = [n for n in graph.nodes if pad.output[0] in n.input]
        assert conv.op_type == "Conv"
        assert [list(a.ints) for a in conv.attribute if a.name == "pads"] in ([], [[0, 0, 0, 0]])
        assert graph.info(pad.input[0]).shape[:2] == graph.info(pad.output[0]).shape[:2]
    shapes = sorted(graph.info(p.output[0]).shape[2:] for p in pads)
    assert shapes == [(8, 8), (10, 10), (17, 17)]  # 8x8 padded by 0, by 1 all round; 16x16 by (0, 1)
    norms = [n for n in graph.nodes if n.op_type == "BatchNormalization"]
    modes = sorted([a.i for a in n.attribute if a.name == "training_mode"][0] for n in norms)
    assert modes == [0, 1, 1]
    (frozen,) = [n for n in norms if len(n.output) == 1]
    assert frozen.input[1:3] == ["b4.weight", "b4.bias"]
    assert producers[frozen.input[0]].op_type == "Conv"
    assert graph.info(frozen.input[0]).shape == graph.info(frozen.output[0]).shape
    assert {"b4.weight", "b4.bias"} <= set(parameter_tensors(graph))


def test_crafted_fused_pads_are_read_safely(tmp_path):
    """A FuseConvPad claim on a Conv whose shapes do not tell the pad (a symbolic spatial
    dimension, auto_pad, pads of the wrong length) puts nothing back; one that does gets a Pad
    with fresh names; nothing crashes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 4, "h", "w"])
    convs = [
        helper.make_node("Conv", ["x", "w0"], ["y0"], name="c0", pads=[1, 1, 1, 1]),  # put back
        helper.make_node("Conv", ["s", "w1"], ["y1"], name="c1", pads=[1, 1, 1, 1]),  # symbolic
        helper.make_node("Conv", ["x", "w2"], ["y2"], name="c2", auto_pad="SAME_UPPER"),
        helper.make_node("Conv", ["x", "w3"], ["y3"], name="c3", pads=[1, 1]),  # malformed
        helper.make_node("Conv", ["x", "w4"], ["x.padded"], name="c4"),  # our name taken
    ]
    for c in convs:
        helper.set_metadata_props(c, {"pkg.onnxscript.rewriter.rule_name": "FuseConvPad"})
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 4, 3, 3], [0.5] * 144) for i in range(5)]
    graph = helper.make_graph(convs, "g", [x, s], [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
                                                   for i in range(4)], weights)
    helper.set_metadata_props(graph, {"pkg.torch.export.ExportedProgram.graph_signature":
                                      "".join(f"p_w{i}: PARAMETER target='w{i}'\n" for i in range(5))})
    path = graphs.save(graph, tmp_path / "pads.onnx")
    try:
        g = load_graph(path, batch_size=2)
    except Exception as e:  # a malformed Conv the shape inference refuses is the loader's to report
        pytest.skip(f"refused before the dynamo pass: {e}")
    pads = [n for n in g.nodes if n.op_type == "Pad"]
    names = [o for n in g.nodes for o in n.output]
    assert len(names) == len(set(names))
    convs = {n.name: n for n in g.nodes if n.op_type == "Conv"}
    assert [c for c in convs if convs[c].input[0] in {p.output[0] for p in pads}] == ["c0", "c4"]
    assert [g.info(p.output[0]).shape for p in pads] == [(2, 4, 10, 10), (2, 4, 8, 8)]
    assert pads[1].output[0] != "x.padded" and convs["c1"].input[0] == "s"


# nn.Dropout(p=0.0) (ViT's, DeiT's configs) exported in training mode: a Dropout whose ratio is
# a constant 0, which PyTorch runs as its input (at::dropout returns it): no mask, no kernel
MASK = 2 * 64  # a kept Dropout's byte mask over x[2, 64]


def _dropouts(tmp_path, forms, opset=17):
    path = graphs.dropouts(tmp_path / f"dropouts{opset}.onnx", forms, opset)
    return load_graph(path), extract_features(path)


@pytest.mark.parametrize("via", ["constant", "initializer"])
def test_a_dropout_of_ratio_zero_keeps_no_mask(tmp_path, via):
    graph, report = _dropouts(tmp_path, [{"ratio": 0.0, "mode": True, "via": via},
                                         {"ratio": 0.1, "mode": True, "via": via}])
    assert report.values["saved_activation_bytes"] == MASK  # 2 masks before
    assert graph.noop_dropouts == {"d0"}
    assert report.values["kernels"] == 1 and report.values["activation_bytes"] == 2 * 64 * 4 + MASK


def test_a_dropout_not_training_keeps_no_mask_and_unknown_ones_keep_theirs(tmp_path):
    graph, report = _dropouts(tmp_path, [
        {"ratio": 0.1, "mode": False},  # training_mode false: its input
        {"ratio": 0.1},  # no training_mode: false by ONNX's rules, but no word on the job's
        {"ratio": None, "mode": True},  # no ratio: 0.5
        {"ratio": "input", "mode": True},  # not a constant: unknown
        {"ratio": 0.0, "mode": "input"},  # p = 0, whatever the mode
    ])
    assert report.values["saved_activation_bytes"] == 3 * MASK
    assert graph.noop_dropouts == {"d0", "d4"}


def test_an_attribute_ratio_of_zero_keeps_no_mask(tmp_path):
    """Before opset 12 the ratio is an attribute, 0.5 where absent."""
    graph, report = _dropouts(tmp_path, [{"ratio": 0.0}, {"ratio": 0.25}, {}], opset=11)
    assert report.values["saved_activation_bytes"] == 2 * MASK
    assert graph.noop_dropouts == {"d0"}


def test_a_tensor_kept_past_a_dropout_of_ratio_zero_counts_once(tmp_path):
    """x read by a MatMul and, through Dropout(p=0), by another: one tensor kept, x."""
    zero = helper.make_tensor("p", TensorProto.FLOAT, [], [0.0])
    train = helper.make_tensor("t", TensorProto.BOOL, [], [True])
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], [0.0] * 64 * 64)
    nodes = [helper.make_node("Constant", [], ["p"], value=zero),
             helper.make_node("Constant", [], ["t"], value=train),
             helper.make_node("Dropout", ["x", "p", "t"], ["d", "mask"]),
             helper.make_node("MatMul", ["x", "w"], ["a"]),
             helper.make_node("MatMul", ["d", "w"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], [w])
    report = extract_features(graphs.save(graph, tmp_path / "alias.onnx"))
    assert report.values["saved_activation_bytes"] == 2 * 64 * 4  # x, not x, d and a mask


def _pad_claim(conv, tmp_path, name):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    helper.set_metadata_props(conv, {"pkg.onnxscript.rewriter.rule_name": "FuseConvPad"})
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 3, 3], [0.5] * 144)
    graph = helper.make_graph([conv, helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    helper.set_metadata_props(graph, {"pkg.torch.export.ExportedProgram.graph_signature":
                                      "p_w: PARAMETER target='w'\n"})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return load_graph(path)


def test_a_fused_pad_claim_on_a_conv_of_no_output_is_ignored(tmp_path):
    """A custom-domain Conv of no output and no name (no shape inference refuses it) had
    raised IndexError in restore_pad."""
    g = _pad_claim(helper.make_node("Conv", ["x", "w"], [], domain="custom", pads=[1, 1, 1, 1]), tmp_path, "noout")
    assert not [n for n in g.nodes if n.op_type == "Pad"]


def test_a_fused_pad_past_the_loaders_bound_is_not_put_back(tmp_path):
    """Pads of 10**9 under a stride of as much: a small output, but the restored copy had been
    10**18 elements, past the loader's plausibility bound it had never met (6.4e19 bytes)."""
    conv = helper.make_node("Conv", ["x", "w"], ["z"], name="c", pads=[10**9] * 4, strides=[10**9] * 2)
    g = _pad_claim(conv, tmp_path, "huge")
    assert not [n for n in g.nodes if n.op_type == "Pad"]
    assert max(t.numel for t in g.tensors.values() if t.shape is not None) < 10**6


def test_a_dropout_ratio_is_read_in_its_own_scope(tmp_path):
    """The top Dropout's ratio is the graph input 'r'; an If body's Constant of the same name
    is 0 and its Dropout, writing 'd' too, is a no-op there: the top one keeps its mask (it had
    been taken for a no-op through the body's names)."""
    zero = helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])
    body = helper.make_graph([helper.make_node("Constant", [], ["r"], value=zero),
                              helper.make_node("Dropout", ["r", "r"], ["d"]),
                              helper.make_node("Identity", ["d"], ["o"])], "b", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [])])
    nodes = [helper.make_node("Constant", [], ["t"], value=helper.make_tensor("tv", TensorProto.BOOL, [], [True])),
             helper.make_node("If", ["c"], ["io"], then_branch=body, else_branch=body),
             helper.make_node("Dropout", ["x", "r", "t"], ["d", "m"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
                                           helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 64]),
                               helper.make_tensor_value_info("io", TensorProto.FLOAT, [])])
    path = graphs.save(graph, tmp_path / "scoped.onnx")
    assert load_graph(path).noop_dropouts == set()
    # and the body's, whose name the top one writes too, keeps its own (1 byte): the safe side
    assert extract_features(path).values["saved_activation_bytes"] == MASK + 1
