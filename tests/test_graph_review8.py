"""Graph stage review 8: hostile files that cost minutes or a traceback, and a weight a node
reads twice."""

from __future__ import annotations

import time

import pytest
from onnx import TensorProto, helper

from graphs import external_tensor, save
from slurm_horus.errors import ModelError
from slurm_horus.graph.features import features_of
from slurm_horus.graph.load import load_graph


def _io(name="x", dtype=TensorProto.FLOAT):
    return ([helper.make_tensor_value_info(name, dtype, ["batch", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def test_external_data_location_not_utf8_is_refused(tmp_path):
    """A location protobuf cannot decode comes as bytes: the check raised a TypeError (the
    analysis 'failed'), not the refusal every other bad location gets."""
    inputs, outputs = _io()
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", inputs, outputs,
                              [external_tensor("w", [4, 4], "WLOC")])
    path = save(graph, tmp_path / "m.onnx")
    path.write_bytes(path.read_bytes().replace(b"WLOC", b"\xff\xfeAB"))
    with pytest.raises(ModelError, match="not UTF-8 text; refusing it"):
        load_graph(path, batch_size=2)


def test_weight_a_node_reads_twice_counts_once(tmp_path):
    """W * W (a weight's square, a penalty written in the graph) is one parameter; a node that
    listed a (4, 4) weight 1,000 times had counted 16,000."""
    inputs, outputs = _io()
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.5] * 16)
    nodes = [helper.make_node("Mul", ["w", "w"], ["sq"]),
             helper.make_node("Sum", ["sq", *["w"] * 1000], ["s"]),
             helper.make_node("MatMul", ["x", "s"], ["y"])]
    r = features_of(load_graph(save(helper.make_graph(nodes, "g", inputs, outputs, [w]), tmp_path / "m.onnx"),
                               batch_size=2), 2)
    assert r.values["params"] == 16 and r.values["param_bytes"] == 64


def test_softmax_walks_meeting_one_tensor_of_many_readers_are_quick(tmp_path):
    """Each Softmax's walk towards a MatMul looked at every reader of every tensor it met: 4,000
    Softmaxes joined by one Where, whose output 4,000 nodes read, took 20 s (60 kB of file), and
    the time grows with the square of the count (a hang guard: 8,000 now take about 1.5 s)."""
    n = 8000
    inputs, outputs = _io()
    nodes = [helper.make_node("Softmax", ["x"], [f"p{i}"]) for i in range(n)]
    nodes += [helper.make_node("Where", [f"p{i}" for i in range(n)], ["q"])]
    nodes += [helper.make_node("Relu", ["q"], [f"r{i}"]) for i in range(n)]
    nodes += [helper.make_node("MatMul", ["r0", "x"], ["y"])]
    graph = load_graph(save(helper.make_graph(nodes, "g", inputs, outputs), tmp_path / "m.onnx"), batch_size=2)
    t0 = time.monotonic()
    r = features_of(graph, 2)
    assert time.monotonic() - t0 < 20
    assert r.by_op["Softmax"].count == n


def test_head_listing_its_weight_many_times_is_quick(tmp_path):
    """A tied-head candidate (D, V) without values, read by a MatMul listing it 10,000 times
    whose product a Softmax lists as often: its bias was looked for once per listing, over
    every reader of the product (100 million steps, 15 s; 400 million at the 20,000 here)."""
    n = 20_000
    inputs, outputs = _io("ids", TensorProto.INT64)
    emb, head = TensorProto(), TensorProto()
    for t, name, dims in ((emb, "emb", [50, 8]), (head, "onnx::MatMul_1", [8, 50])):
        t.name, t.data_type = name, TensorProto.FLOAT
        t.dims.extend(dims)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]),
             helper.make_node("MatMul", ["h", *["onnx::MatMul_1"] * n], ["m"]),
             helper.make_node("Softmax", ["m"] * n, ["y"])]
    graph = load_graph(save(helper.make_graph(nodes, "g", inputs, outputs, [emb, head]), tmp_path / "m.onnx"),
                       batch_size=2)
    t0 = time.monotonic()
    r = features_of(graph, 2)
    assert time.monotonic() - t0 < 20
    assert r.values["params"] == 400  # the head is the table, counted once
