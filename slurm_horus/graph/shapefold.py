"""Resolve the shapes ONNX shape inference leaves symbolic, by evaluating shape arithmetic.

Exporters compute many shapes at run time (Shape -> Gather -> Unsqueeze -> Concat -> Reshape,
Slice ends from a sequence length, Range over positions). Once the user's dimensions are bound
these are plain integer computations on tiny tensors: we evaluate them with numpy, turn the
results into Constant nodes and run inference again. Nothing large is ever materialised.
"""

from __future__ import annotations

MAX_FOLD_ELEMENTS = 1 << 16
_EXTERNAL = 1  # TensorProto.EXTERNAL
# TensorProto's floating-point types of 8 bits and fewer (the FLOAT8 family, FLOAT4E2M1,
# FLOAT6E2M3, FLOAT6E3M2): a low-precision model's stored weights, which no framework trains (no
# optimizer steps them; PyTorch's float4 is packed bytes), as frozen as its integers.  FLOAT8E8M0,
# exponents alone, is MX's block scales, never a weight
SMALL_FLOAT_TYPES = frozenset({17, 18, 19, 20, 23, 27, 28})
# its floating-point types (FLOAT, FLOAT16, DOUBLE, BFLOAT16 and those; load reads them from
# here): an initializer of one, of rank 1 or more, is a weight (costs.parameter_tensors), never
# shape arithmetic's input, and its values nothing here reads
FLOAT_TYPES = frozenset({1, 10, 11, 16}) | SMALL_FLOAT_TYPES
_MAX_SHAPE_VECTOR = 8  # ONNX shapes in practice have at most 8 dimensions
# ops that hand on their first input's values rearranged (or repeated): of a weight, the weight itself
WEIGHT_VIEWS = frozenset({"Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Expand",
                          "Tile"})


def _inline_array(t):
    """A small tensor's values (at most MAX_FOLD_ELEMENTS), never read from an external file
    (numpy_helper would open its location relative to the working directory, outside the
    model's folder); None for those, and for a tensor without data (stripped weights)."""
    from onnx import numpy_helper

    if t.data_location == _EXTERNAL or _numel(t.dims) > MAX_FOLD_ELEMENTS:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None


def fold_shapes(model, shape_of) -> int:
    """Replace foldable nodes of `model.graph` by Constants, in place; returns how many.

    `shape_of(name)` gives a tensor's fully known shape (tuple of ints) or None.

    Weights are never evaluated: a node reading a floating-point initializer of rank 1 or more
    and more than 8 elements (smaller ones are shape arithmetic's vectors) (Linear's W.t() in a training-mode export, a Gather from a position table, the Identity
    copy of a deduplicated norm weight), or reading what such a node makes, stays as it is;
    nor is a view (WEIGHT_VIEWS) of any such initializer, whatever its size (a PReLU's weight
    of one element, read through an Identity copy or an Unsqueeze), or of such a view.
    Folded into a Constant, a weight of up to MAX_FOLD_ELEMENTS had stopped being a parameter,
    and only where folding ran (a graph with a symbolic size left after inference).
    """
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    values: dict[str, np.ndarray] = {}
    # float initializers of rank 1 or more, and views of them: costs.parameter_tensors counts
    # them as parameters wherever a node reads them, so their views stay nodes
    weights = set()
    for t in graph.initializer:
        if t.data_type in FLOAT_TYPES and len(t.dims) > 0:
            weights.add(t.name)
        # a vector of at most a tensor's rank (a Resize scale, a shape's factors folded by the
        # exporter) is shape arithmetic's; a weight has more elements
        weight = (t.data_type in FLOAT_TYPES and len(t.dims) > 0
                  and _numel(max(int(d), 0) for d in t.dims) > _MAX_SHAPE_VECTOR)
        v = _inline_array(t) if t.data_type != 8 and not weight else None  # 8: strings
        if v is not None:
            values[t.name] = v
    folded = 0
    for index, node in enumerate(graph.node):
        op = node.op_type
        if op in WEIGHT_VIEWS and node.input and node.input[0] in weights:
            weights.update(o for o in node.output if o)
            continue
        if op == "Constant":
            for a in node.attribute:
                v = _inline_array(a.t) if a.name == "value" else None
                if v is not None:
                    values[node.output[0]] = v
            continue
        if op not in EVALUATORS or len(node.output) != 1:
            continue
        if op in ("Shape", "Size"):
            shape = shape_of(node.input[0])
            if shape is None:
                continue
            inputs = [np.zeros(0)]  # placeholder; evaluator uses the shape
        else:
            if not all(n == "" or n in values for n in node.input):
                continue
            inputs = [values.get(n) for n in node.input]
            shape = None
        attrs = {a.name: _attr(a) for a in node.attribute}
        try:
            if _result_bound(op, inputs, attrs) > MAX_FOLD_ELEMENTS:
                continue  # checked before numpy allocates it: two 65k-element inputs broadcast
                # to 4e9 elements (GBs) in a file of 131 kB
            result = np.asarray(EVALUATORS[op](inputs, attrs, shape))
        except Exception:  # an op form we do not evaluate: leave it to shape inference
            continue
        if result.size > MAX_FOLD_ELEMENTS or result.dtype == object:
            continue
        values[node.output[0]] = result
        tensor = numpy_helper.from_array(result, name=node.output[0] + "__folded")
        from onnx import helper

        graph.node[index].CopyFrom(helper.make_node("Constant", [], [node.output[0]],
                                                    name=node.name, value=tensor))
        folded += 1
    return folded


_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Mod", "Equal", "Less", "Greater", "And", "Or",
                 "Where", "Min", "Max"}


def _result_bound(op: str, inputs, attrs) -> int:
    """The most elements evaluating ``op`` can produce, before it is evaluated (0: no more
    than its inputs; the ops that build a shape from values check it themselves)."""
    import numpy as np

    if op in _BROADCASTING:
        return _numel(np.broadcast_shapes(*(x.shape for x in inputs if x is not None)))
    if op == "Gather":
        data, idx = inputs[0], inputs[1]
        axis = attrs.get("axis", 0) % max(data.ndim, 1)
        return (data.size // max(data.shape[axis], 1) if data.ndim else 1) * max(idx.size, 1)
    if op == "Concat":
        return sum(x.size for x in inputs if x is not None)
    if op == "Tile":
        return inputs[0].size * _numel(max(int(r), 0) for r in inputs[1].ravel())
    return 0


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _attr(a):
    from onnx import helper

    return helper.get_attribute_value(a)


def _axes(inputs, attrs, index=1):
    if len(inputs) > index and inputs[index] is not None:
        return [int(x) for x in inputs[index].ravel()]
    return list(attrs.get("axes", []))


def _shape(inputs, attrs, shape):
    import numpy as np

    start, end = attrs.get("start", 0), attrs.get("end", None)
    return np.array(shape[start:end] if end is not None else shape[start:], dtype=np.int64)


def _slice(inputs, attrs, shape):
    x, starts, ends = inputs[0], inputs[1], inputs[2]
    axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
    steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[int(a)] = slice(int(s), int(e), int(st))
    return x[tuple(index)]


def _reshape(inputs, attrs, shape):
    x, target = inputs[0], [int(d) for d in inputs[1]]
    if not attrs.get("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


def _tile(inputs, attrs, shape):
    """Tile's repeats, one per dimension of its input (the legacy exporter writes a dynamic
    torch.split's sizes as Tile(size, n), its repeats of shape (1, 1): Mamba's scan had left
    every size after it unknown, and no prediction)."""
    import numpy as np

    x, repeats = inputs[0], [int(r) for r in inputs[1].ravel()]
    if len(repeats) != x.ndim or min(repeats, default=0) < 0:
        raise ValueError("repeats do not match the input")
    return np.tile(x, repeats)


def _div(inputs, attrs, shape):
    import numpy as np

    a, b = inputs
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return a / b


def _cast(inputs, attrs, shape):
    from onnx import helper

    return inputs[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))


def _constant_of_shape(inputs, attrs, shape):
    import numpy as np

    value = _inline_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
    if value is None:
        raise ValueError("no inline value")
    dims = [int(d) for d in inputs[0]]
    if _numel(dims) > MAX_FOLD_ELEMENTS:
        raise ValueError("too large")
    return np.full(dims, value.ravel()[0], dtype=value.dtype)


def _range(inputs, attrs, shape):
    import numpy as np

    start, limit, delta = (x.item() for x in inputs)
    if abs((limit - start) / delta) > MAX_FOLD_ELEMENTS:
        raise ValueError("too large")
    return np.arange(start, limit, delta, dtype=inputs[0].dtype)


def _expand(inputs, attrs, shape):
    import numpy as np

    dims = [int(d) for d in inputs[1]]
    out = np.broadcast_shapes(inputs[0].shape, tuple(dims))
    if _numel(out) > MAX_FOLD_ELEMENTS:
        raise ValueError("too large")
    return np.broadcast_to(inputs[0], out).copy()


def _reduce(fn):
    def run(inputs, attrs, shape):
        """No axes reduce every one, or none with noop_with_empty_axes (opset 13 and later)."""
        axes = _axes(inputs, attrs)
        if not axes and attrs.get("noop_with_empty_axes", 0):
            return inputs[0]
        return fn(inputs[0], axis=tuple(axes) if axes else None,
                  keepdims=bool(attrs.get("keepdims", 1)))
    return run


def _build():
    import numpy as np

    return {
        "Shape": _shape,
        "Size": lambda i, a, s: np.array(_numel(s), dtype=np.int64),
        "Gather": lambda i, a, s: np.take(i[0], i[1], axis=a.get("axis", 0)),
        "Unsqueeze": lambda i, a, s: np.expand_dims(i[0], tuple(
            ax % (i[0].ndim + len(_axes(i, a))) for ax in _axes(i, a))),
        "Squeeze": lambda i, a, s: np.squeeze(i[0], axis=tuple(_axes(i, a)) or None),
        "Concat": lambda i, a, s: np.concatenate(i, axis=a["axis"]),
        "Slice": _slice,
        "Cast": _cast,
        "Add": lambda i, a, s: i[0] + i[1],
        "Sub": lambda i, a, s: i[0] - i[1],
        "Mul": lambda i, a, s: i[0] * i[1],
        "Div": _div,
        "Mod": lambda i, a, s: np.fmod(i[0], i[1]) if a.get("fmod") else np.mod(i[0], i[1]),
        "Equal": lambda i, a, s: np.equal(i[0], i[1]),
        "Less": lambda i, a, s: np.less(i[0], i[1]),
        "Greater": lambda i, a, s: np.greater(i[0], i[1]),
        "Not": lambda i, a, s: np.logical_not(i[0]),
        "And": lambda i, a, s: np.logical_and(i[0], i[1]),
        "Or": lambda i, a, s: np.logical_or(i[0], i[1]),
        "Where": lambda i, a, s: np.where(i[0], i[1], i[2]),
        "Min": lambda i, a, s: np.minimum.reduce(i),
        "Max": lambda i, a, s: np.maximum.reduce(i),
        "Neg": lambda i, a, s: -i[0],
        "Abs": lambda i, a, s: np.abs(i[0]),
        "Sqrt": lambda i, a, s: np.sqrt(i[0]),
        "Floor": lambda i, a, s: np.floor(i[0]),
        "Ceil": lambda i, a, s: np.ceil(i[0]),
        "Identity": lambda i, a, s: i[0],
        "Transpose": lambda i, a, s: np.transpose(i[0], a.get("perm")),
        "Reshape": _reshape,
        "ConstantOfShape": _constant_of_shape,
        "Range": _range,
        "Expand": _expand,
        "Tile": _tile,
        "ReduceProd": _reduce(np.prod),
        "ReduceSum": _reduce(np.sum),
        "ReduceMax": _reduce(np.max),
        "ReduceMin": _reduce(np.min),
    }


class _Evaluators(dict):
    """Built on first use so importing this module costs nothing."""

    def __missing__(self, key):
        raise KeyError(key)

    def _ensure(self):
        if not self:
            self.update(_build())

    def __contains__(self, key):
        self._ensure()
        return dict.__contains__(self, key)

    def __getitem__(self, key):
        self._ensure()
        return dict.__getitem__(self, key)


EVALUATORS = _Evaluators()
