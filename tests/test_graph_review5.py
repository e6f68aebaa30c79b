"""Graph stage review against real architectures (transformers 5 / torch 2.13 exports): the
shapes written here are those the exporters wrote; the graphs are built with onnx's helper so
that the tests need neither torch nor transformers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs import save
from slurm_horus.graph.features import features_of
from slurm_horus.graph.load import load_graph


def _split_scan(path, repeats_shape):
    """What the legacy exporter writes for a torch.split of a symbolic length into pieces of
    one (HF Mamba's slow scan, traced with a symbolic sequence): the sizes as
    Tile([1], Reshape(seq, repeats_shape)), then SplitToSequence and SequenceAt; the element
    then goes through a (4, 8) weight."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Reshape", ["seq", "rshape"], ["repeats"]),
        helper.make_node("Tile", ["piece", "repeats"], ["sizes"]),
        helper.make_node("SplitToSequence", ["x", "sizes"], ["pieces"], axis=1),
        helper.make_node("SequenceAt", ["pieces", "zero"], ["first"]),
        helper.make_node("MatMul", ["first", "w"], ["y"]),
    ]
    inits = [ints("one", 1), ints("zero", 0), ints("rshape", list(repeats_shape)), ints("piece", [1]),
             helper.make_tensor("w", TensorProto.FLOAT, [4, 8], [0.5] * 32)]
    graph = helper.make_graph(
        nodes, "split_scan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return save(graph, path)


@pytest.mark.parametrize("repeats_shape", [(1, 1), (1,)])
def test_split_sizes_written_as_a_tile_fold_so_the_scan_has_sizes(tmp_path, repeats_shape):
    """A Tile in shape arithmetic was never evaluated: HF Mamba's legacy export left 14 sizes
    unknown (unk__N) after its splits, and `horus predict` refused it ("depends on the data").
    The split's sequence has its elements' shape, so it is no 'shapeless' tensor either (its
    warning said the figures were low)."""
    r = features_of(load_graph(_split_scan(tmp_path / "s.onnx", repeats_shape), batch_size=8,
                               dims={"seq": 16}), 8)
    assert r.unknown_dims == [] and r.shapeless == [] and r.warnings() == []
    assert r.by_op["MatMul"].flops == 2 * 8 * 1 * 4 * 8
    r.require_bound()  # what horus predict and hsubmit ask before predicting


def test_a_tile_of_a_small_weight_stays_a_parameter(tmp_path):
    """Folding evaluates Tile now; a learnable vector it repeats (of at most 8 elements, which
    folding otherwise reads as shape arithmetic's) is the weight, never a Constant."""
    nodes = [helper.make_node("Tile", ["w", "reps"], ["wt"]),
             helper.make_node("Add", ["x", "wt"], ["y"])]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [1, 4], [0.1, 0.2, 0.3, 0.4]),
             numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "reps")]
    graph = helper.make_graph(
        nodes, "tile_w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    r = features_of(load_graph(save(graph, tmp_path / "t.onnx"), batch_size=2, dims={}), 2)
    assert r.values["params"] == 4 and r.unknown_dims == []


def test_a_sequence_whose_elements_have_no_shape_is_still_shapeless(tmp_path):
    """Only a sequence whose elements' sizes are known is left out of the shapeless list."""
    nodes = [helper.make_node("SplitToSequence", ["x", "sizes"], ["pieces"], axis=1),
             helper.make_node("SequenceAt", ["pieces", "zero"], ["first"]),
             helper.make_node("Relu", ["first"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")]
    graph = helper.make_graph(
        nodes, "uneven", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6]),
                          helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    r = features_of(load_graph(save(graph, tmp_path / "u.onnx"), batch_size=2), 2)
    assert r.shapeless == ["pieces"] and r.unknown_dims == ["unk__0"]


def test_a_sequence_of_shaped_elements_is_no_shapeless_tensor(tmp_path):
    """A SplitToSequence's output is a sequence, no tensor: it was listed as a tensor without a
    shape, with a warning that the figures were low, though what reads it had its shape."""
    nodes = [helper.make_node("SplitToSequence", ["x", "size"], ["pieces"], axis=1),
             helper.make_node("SequenceAt", ["pieces", "zero"], ["first"]),
             helper.make_node("Relu", ["first"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array(2, dtype=np.int64), "size")]
    graph = helper.make_graph(
        nodes, "even", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    r = features_of(load_graph(save(graph, tmp_path / "e.onnx"), batch_size=2), 2)
    assert r.shapeless == [] and r.warnings() == [] and r.by_op["Relu"].flops == 2 * 2


def test_folding_a_tile_refuses_a_bomb_before_allocating_it():
    """Tile folds now: one of 65,536 values repeated 65,536 times (4.3e9 elements, a file of
    kilobytes) is left to shape inference, as a broadcast bomb is; a small one folds."""
    import onnx

    from slurm_horus.graph.shapefold import fold_shapes

    big = numpy_helper.from_array(np.zeros(65536, np.int64), "big")
    many = numpy_helper.from_array(np.array([65536], np.int64), "many")
    small = numpy_helper.from_array(np.array([3], np.int64), "small")
    nodes = [helper.make_node("Tile", ["big", "many"], ["bomb"]),
             helper.make_node("Tile", ["small", "small"], ["ok"])]
    out = [helper.make_tensor_value_info(n, onnx.TensorProto.INT64, None) for n in ("bomb", "ok")]
    model = helper.make_model(helper.make_graph(nodes, "tile_bomb", [], out, [big, many, small]))
    assert fold_shapes(model, lambda name: None) == 1
    assert [n.op_type for n in model.graph.node] == ["Tile", "Constant"]
    assert list(numpy_helper.to_array(model.graph.node[1].attribute[0].t)) == [3, 3, 3]
