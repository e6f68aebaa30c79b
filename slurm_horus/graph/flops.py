"""Stage 2a: the FLOPs of one node (2 per multiply-accumulate, the convention of published
model figures), with whether the count is exact or a floor."""

from __future__ import annotations

import itertools
import math

from slurm_horus.errors import ModelError
from slurm_horus.graph.load import TensorInfo, attention_dims, int_attr_reader

# Element-wise ops and their FLOPs per output element (transcendentals cost more than a multiply).
ELEMENTWISE = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Relu", "Neg", "Abs", "Max", "Min", "Sum", "Mean",
                     "Where", "Clip", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                     "Not", "And", "Or", "Xor", "Sign", "Floor", "Ceil", "Round", "Reciprocal",
                     "PRelu", "LeakyRelu", "ThresholdedRelu", "Mod", "BitShift", "IsNaN", "IsInf",
                     "Sqrt", "Pow", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"), 1),
    **dict.fromkeys(("Exp", "Log", "Sigmoid", "Tanh", "Erf", "Softplus", "Softsign", "Elu", "Selu",
                     "Celu", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
                     "Acosh", "Atanh", "HardSigmoid"), 4),
    **dict.fromkeys(("HardSwish", "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "Swish"), 6),
    "Mish": 8,
    **dict.fromkeys(("Dropout", "Cast", "CastLike", "Trilu", "Bernoulli",
                     "RandomNormalLike", "RandomUniformLike"), 0),
}
NORMS = {"BatchNormalization": 4, "LayerNormalization": 8, "InstanceNormalization": 8,
         "GroupNormalization": 8, "LpNormalization": 3, "LRN": 6, "MeanVarianceNormalization": 8,
         "SkipLayerNormalization": 9, "SimplifiedLayerNormalization": 6, "RMSNormalization": 6,
         "SkipSimplifiedLayerNormalization": 7, "EmbedLayerNormalization": 9}
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def shape_of(info: TensorInfo | None) -> tuple[int, ...] | None:
    if info is None or info.shape is None:
        return None
    return tuple(d if isinstance(d, int) else 1 for d in info.shape)


def numel(info: TensorInfo | None) -> int:
    return info.numel if info is not None else 0


def ints_attr(attrs, name, default=()):
    a = attrs.get(name)
    return tuple(a.ints) if a is not None else default


def int_attr(attrs, name, default=0):
    a = attrs.get(name)
    return a.i if a is not None else default


def node_flops(op, category, infos, outs, attrs) -> tuple[int, bool, bool]:
    """Forward FLOPs of one node, whether a rule covered it, and whether the rule had the shapes
    it needs.  A node without a rule, or whose rule lacks its inputs' shapes, costs one FLOP per
    output element (nothing where the output's shape is unknown too)."""
    y = outs[0] if outs else None
    n_out = numel(y)
    flops, has_rule = _rule_flops(op, category, infos, outs, attrs)
    if flops is None:  # the rule's inputs have no shape
        return n_out, True, False
    return (flops if has_rule else n_out), has_rule, True


def _rule_flops(op, category, infos, outs, attrs) -> tuple[int | None, bool]:
    """(FLOPs, whether a rule covers the op); FLOPs None where the rule lacks a shape."""
    y = outs[0] if outs else None
    x = infos[0] if infos else None
    n_out = numel(y)
    if category in ("view", "shape"):
        return 0, True
    if category == "conv":
        w_index = 3 if op == "QLinearConv" else 1
        w = shape_of(infos[w_index]) if len(infos) > w_index else None
        if w is None or y is None:
            return None, True
        per_out = math.prod(w[1:])
        if op == "ConvTranspose":  # each input element scatters into Cout/g * kernel outputs
            macs = numel(x) * per_out
        else:
            macs = n_out * per_out
        has_bias = len(infos) > 2 and infos[2] is not None and op in ("Conv", "ConvTranspose")
        return 2 * macs + (n_out if has_bias else 0), True
    if category == "matmul":
        return _matmul_flops(op, infos, y, attrs)
    if category == "attention":
        return _attention_flops(op, infos, attrs)
    if category == "rnn":
        return _rnn_flops(op, infos, attrs)
    if category == "norm":
        return NORMS[op] * numel(x), True
    if category == "pool":
        if op.startswith("Global"):
            return numel(x), True
        kernel = ints_attr(attrs, "kernel_shape", (1,))
        return n_out * math.prod(kernel), True
    if category == "softmax":
        return 5 * numel(x), True
    if category == "elementwise":
        return ELEMENTWISE[op] * n_out, True
    if category == "reduce":
        return numel(x), True
    if category == "data":
        return (4 * n_out if op in ("Resize", "Upsample") else 0), True
    return n_out, False


def _matmul_flops(op, infos, y, attrs) -> tuple[int | None, bool]:
    if op == "Einsum":
        return _einsum_flops(infos, attrs)
    b_index = 3 if op in ("QLinearMatMul", "QGemm") else 1
    a = shape_of(infos[0]) if infos else None
    b = shape_of(infos[b_index]) if len(infos) > b_index else None
    if a is None or b is None or y is None:
        return None, True
    if not a:
        return 0, False  # a scalar operand: no matrix product
    if op in ("Gemm", "FusedGemm", "GemmFloat8", "QGemm"):
        k = a[0] if int_attr(attrs, "transA") else a[-1]
        macs = numel(y) * k
        c = 6 if op == "QGemm" else 2  # the bias C
        bias = numel(y) if len(infos) > c and infos[c] is not None else 0
        return 2 * macs + bias, True
    if op in ("MatMulNBits", "MatMulBnb4"):
        k = int_attr(attrs, "K", a[-1])
    elif op == "FusedMatMul" and int_attr(attrs, "transA") and len(a) > 1:
        k = a[-2]  # A's last two sizes transposed
    else:
        k = a[-1]
    return 2 * numel(y) * k, True


def _einsum_flops(infos, attrs) -> tuple[int | None, bool]:
    """2 per multiply over every index of the equation's inputs, an ellipsis' sizes broadcast
    over the terms that have one (numpy's einsum: a size of 1 stretches to the other)."""
    try:
        eq = attrs["equation"].s.decode() if "equation" in attrs else ""
    except UnicodeDecodeError:
        raise ModelError("its equation is not UTF-8 text") from None
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []  # the broadcast sizes, last first
    for term, info in zip(lhs, infos):
        shape = shape_of(info)
        if shape is None:
            return None, True
        letters = term.replace("...", "", 1)
        rest = len(shape) - len(letters)  # the ellipsis' dimensions
        if "." in letters or rest < 0 or (rest and "..." not in term):
            return 0, False  # a term that does not match its input: no rule
        at = term.find("...") if "..." in term else len(term)
        ellipsis = [max(a, b) for a, b in itertools.zip_longest(ellipsis, reversed(shape[at:at + rest]),
                                                                fillvalue=1)]
        for letter, d in zip(letters, shape[:at] + shape[at + rest:]):
            sizes[letter] = max(sizes.get(letter, 1), d)
    return 2 * math.prod(sizes.values()) * math.prod(ellipsis), True


def _attention_flops(op, infos, attrs) -> tuple[int | None, bool]:
    """Scores (Q K^T) and context (P V) matmuls, softmax, and packed projections if present."""
    if not infos or infos[0] is None or any(i is not None and i.shape is None for i in infos[:3]):
        return None, True  # (a key or value without a shape is no absent one)
    dims = attention_dims(op, int_attr_reader(attrs), [shape_of(i) for i in infos])
    if dims is None:
        return 0, False  # a layout no rule reads
    batch, heads, sq, skv, dq, dv = dims
    flops = 2 * batch * heads * sq * skv * (dq + dv) + 5 * batch * heads * sq * skv
    if op == "Attention" and len(shape_of(infos[1])) == 2:  # onnxruntime's packed QKV projection
        flops += 2 * batch * sq * math.prod(shape_of(infos[1]))
    return flops, True


def _rnn_flops(op, infos, attrs) -> tuple[int | None, bool]:
    x = shape_of(infos[0]) if infos else None
    w = shape_of(infos[1]) if len(infos) > 1 else None
    if x is None or w is None:
        return None, True
    if len(x) != 3 or len(w) != 3:
        return 0, False
    seq, batch = (x[1], x[0]) if int_attr(attrs, "layout") else (x[0], x[1])
    directions, gates_h, inputs = w
    hidden = gates_h // RNN_GATES[op]
    per_step = 2 * batch * gates_h * (inputs + hidden) + 2 * batch * gates_h + 10 * batch * hidden
    return directions * seq * per_step, True
