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
