"""Small hand-built ONNX graphs for tests that need exact, known structure."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def external_tensor(name: str, dims: list[int], location: str, dtype: int = TensorProto.FLOAT,
                    nbytes: int | None = None) -> onnx.TensorProto:
    """An initializer whose data lives in `location` (which need not exist): its shape alone,
    as costing reads a big weight; ``nbytes`` its stored size (default: 4 bytes a value)."""
    t = onnx.TensorProto()
    t.name = name
    t.data_type = dtype
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"),
                       ("length", str(4 * _prod(dims) if nbytes is None else nbytes))):
        e = t.external_data.add()
        e.key, e.value = key, value
    return t


def _prod(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def mlp(path: Path, widths=(16, 32, 8), batch="batch", location: str | None = None) -> Path:
    """x[batch, w0] -> (MatMul + Add + Relu)* -> y; weights optionally external."""
    nodes, inits = [], []
    prev = "x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        w = (external_tensor(f"w{i}", [a, b], location) if location
             else helper.make_tensor(f"w{i}", TensorProto.FLOAT, [a, b], [0.0] * (a * b)))
        inits += [w, helper.make_tensor(f"b{i}", TensorProto.FLOAT, [b], [0.0] * b)]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"h{i}"])]
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [batch, widths[-1]])], inits)
    return save(graph, path)


def save(graph, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path
