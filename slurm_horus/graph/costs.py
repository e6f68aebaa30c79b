"""Stage 2a: what each node of a graph costs: FLOPs, parameters, bytes moved, kernels, memory kept.

FLOPs count 2 per multiply-accumulate (the convention of published model figures). Every op gets
a category; an op without a cost rule (any op of a custom domain, whatever its name, is one) is
reported by name and costed conservatively: at least one FLOP per output element, and its inputs
and outputs kept for the backward pass, since we cannot know what it needs.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, replace

from slurm_horus.graph.flops import ELEMENTWISE, NORMS, RNN_GATES, node_flops, int_attr, numel, shape_of
from slurm_horus.errors import ModelError
from slurm_horus.graph.load import (MAX_DIM, MAX_SUBGRAPH_DEPTH, SMALL_INT_TYPES, Graph, TensorInfo,
                                    _subgraphs, attention_dims, bodies, body_names, int_attr_reader,
                                    body_scope)
from slurm_horus.graph.shapefold import SMALL_FLOAT_TYPES

# Ops that only relabel a tensor: no kernel, no traffic, nothing kept for backward.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size",
                      "Constant", "Optional", "OptionalGetElement"})
# Element-wise ops whose gradient needs their output (the rest need their inputs). Clip is
# ReLU6 as exported; models run it in place (hardtanh_), whose backward keeps `result`.
SAVES_OUTPUT = frozenset({"Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Softmax", "LogSoftmax",
                          "Elu", "Selu", "Celu", "HardSigmoid", "Clip"})
# Ops whose gradient needs nothing of their inputs' values (only shapes).
SAVES_NOTHING = frozenset({"Add", "Sub", "Neg", "Sum", "Cast", "CastLike", "Concat", "Split",
                           "Slice", "Transpose", "Pad", "Expand", "Tile", "Resize", "Upsample",
                           "AveragePool", "GlobalAveragePool", "ReduceMean", "ReduceSum",
                           "DepthToSpace", "SpaceToDepth", "ConstantOfShape", "Range",
                           "Trilu", "Equal", "Less", "Greater", "Not", "And", "Or"})
REDUCES = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                     "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
                     "ArgMax", "ArgMin", "TopK", "CumSum"})
DATA_MOVEMENT = frozenset({"Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements",
                           "GatherND", "Scatter", "ScatterElements", "ScatterND", "Expand", "Tile",
                           "Pad", "DepthToSpace", "SpaceToDepth", "ConstantOfShape", "Range",
                           "NonZero", "OneHot", "Compress", "ReverseSequence", "Resize", "Upsample",
                           "EyeLike", "Unique", "SequenceConstruct", "SplitToSequence",
                           "ConcatFromSequence", "SequenceAt"})
ATTENTION = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention",
                       "PackedAttention", "DecoderMaskedMultiHeadAttention"})
CATEGORIES = ("conv", "matmul", "attention", "rnn", "norm", "pool", "elementwise", "reduce",
              "softmax", "data", "view", "shape", "other")
# Domains whose ops the rules below know by name (ONNX and onnxruntime's contrib ops).
RULE_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})
# Names the legacy ONNX exporter gives initializers it creates itself (folded constants).
FOLDED_PREFIX = "onnx::"
# Shape arithmetic (tiny integer tensors) runs on the host in the frameworks that train models.
SHAPE_TENSOR_MAX_ELEMENTS = 64
# Quantized ops' inputs by position, ONNX's and onnxruntime's (its quantizer's QDQ and QOperator
# layouts, its dynamic quantization, its n-bit weight-only LLM ops): (the inputs that are the
# quantized weights, the quantization parameters).  An integer initializer read at a weight
# position is a parameter (int8/uint8/int16, int4/int2 packed, the int32 biases of
# DequantizeLinear and QLinearConv); scales, zero points and g_idx are never one, per-channel
# float vectors and FLOAT8 zero points included.  A float input at another position
# (QuantizeLinear's x: a fake-quant QAT weight, Q -> DQ -> Conv) is a parameter as anywhere.
QUANTIZED_INPUTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "QuantizeLinear": ((), (1, 2)),
    "DequantizeLinear": ((0,), (1, 2)),
    "QLinearConv": ((3, 8), (1, 2, 4, 5, 6, 7)),      # x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, B
    "QLinearMatMul": ((0, 3), (1, 2, 4, 5, 6, 7)),
    "MatMulInteger": ((0, 1), (2, 3)),                 # A, B, a_zp, b_zp
    "ConvInteger": ((1,), (2, 3)),                     # x, w, x_zp, w_zp
    "QLinearAdd": ((0, 3), (1, 2, 4, 5, 6, 7)),
    "QLinearMul": ((0, 3), (1, 2, 4, 5, 6, 7)),
    "QGemm": ((0, 3, 6), (1, 2, 4, 5, 7, 8)),          # A, a_s, a_zp, B, b_s, b_zp, C, y_s, y_zp
    "DynamicQuantizeMatMul": ((1,), (2, 3)),           # A, B, b_s, b_zp, bias
    "MatMulIntegerToFloat": ((0, 1), (2, 3, 4, 5)),    # A, B, a_s, b_s, a_zp, b_zp, bias
    "QAttention": ((1,), (3, 4, 6, 7)),                # input, weight, bias, i_s, w_s, mask, i_zp, w_zp
    "DynamicQuantizeLSTM": ((1, 2), (8, 9, 10, 11)),   # X, W, R, B, ..., W_s, W_zp, R_s, R_zp
    "MatMulNBits": ((1,), (2, 3, 4)),                  # A, B (packed uint8), scales, zp, g_idx, bias
    "MatMulBnb4": ((1,), (2,)),                        # A, B (packed uint8), absmax
    "GatherBlockQuantized": ((0,), (2, 3)),            # data, indices, scales, zero_points
    "GemmFloat8": ((1,), (3, 4, 5)),                   # A, B, C, scaleA, scaleB, scaleY
}
# ops whose uint8 weight packs 8 / bits values a byte (attribute "bits", default 4; Bnb4: 4)
PACKED_WEIGHT_OPS = frozenset({"MatMulNBits", "MatMulBnb4", "GatherBlockQuantized"})
# a quantized weight's types, stored as such and frozen: SMALL_INT_TYPES and INT32 (a quantized
# bias), weights where a quantized op reads them as one; SMALL_FLOAT_TYPES (FLOAT8, FLOAT4E2M1,
# FLOAT6), weights wherever read, as any float (a float is never an index or a shape: a Cast
# that upcasts an FP8 weight reads it as DequantizeLinear does)
QUANTIZED_WEIGHT_TYPES = SMALL_INT_TYPES | SMALL_FLOAT_TYPES | {6}


@dataclass(frozen=True)
class NodeCost:
    """What one node costs at the graph's bound dimensions."""

    name: str
    op_type: str
    category: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int
    params: int
    param_bytes: int
    out_bytes: int
    read_bytes: int
    write_bytes: int
    kernels: int
    saved: tuple[str, ...]  # tensors the backward pass keeps (deduplicated across nodes later)
    extra_saved_bytes: int  # backward state that is no graph tensor (masks, indices, RNN reserve)
    has_rule: bool
    shapes_known: bool = True  # False: its rule lacked its inputs' shapes (costed per output element)


def parameter_tensors(graph: Graph) -> dict[str, TensorInfo]:
    """The trainable parameters, keyed by the tensor name their consumers read.

    An exporter that deduplicated identical initializers feeds each extra copy through an
    Identity node: each Identity output a node reads as a weight is its own parameter (a fresh
    running variance is all ones, like a fresh norm weight, and shares its initializer). An
    initializer read directly by several nodes (tied weights) is one parameter. Scalars (rank 0),
    integer tensors and batch-norm running statistics are constants, not parameters.  An
    initializer only an If, Loop or Scan body reads (by name, from the graph around it, at any
    depth) is a parameter all the same; a body's own initializers are its constants.  The dynamo
    exporter merges without an Identity: load.load_graph undoes that where its metadata tells
    (graph.dynamo), and what its optimizer folded from weights is a constant.

    A quantized model's weights are parameters too, at their stored size: an integer
    initializer a quantized op reads as its weight (QUANTIZED_INPUTS: DequantizeLinear's data,
    QLinearConv's w and int32 bias, MatMulInteger's B, MatMulNBits' packed B...), and an FP8,
    FP6 or FP4 one wherever read (QUANTIZED_WEIGHT_TYPES); they are what its memory holds.  Its
    scales and zero points are not, nor is an integer tensor read anywhere else (indices,
    shapes).  A float weight a fake-quant graph quantizes and dequantizes (QAT: W ->
    QuantizeLinear -> DequantizeLinear -> Conv) is one float parameter.  Quantized weights
    cannot train (PyTorch refuses requires_grad on an integer tensor, and no optimizer steps an
    FP8 one): features_of reports their count apart (FeatureReport.quantized_params), as the
    params figure does not tell.
    """
    candidates = ChainMap({name: info for name, info in graph.initializers.items()
                           if info.shape and (info.is_float or info.dtype in QUANTIZED_WEIGHT_TYPES)
                           and name not in graph.folded_constants})
    params: dict[str, TensorInfo] = {}
    _read_parameters(graph.nodes, candidates, params, 0)
    for name in _folded_tied_embeddings(graph, params):
        del params[name]
    return params


def _read_parameters(nodes, candidates: ChainMap, params: dict, depth: int) -> None:
    """Add to ``params`` the ``candidates`` (name -> info, None: a body's own tensor of that
    name hides the enclosing scope's) that ``nodes`` read as weights, the nodes of their
    subgraphs (If, Loop, Scan bodies) included, at any depth: a weight only a loop body reads
    from the enclosing graph is a parameter all the same.  It walks any op's graphs, which
    load_graph's bound on bodies does not bound: hence its own bound."""
    for node in nodes:
        if node.op_type == "Identity" and node.input and candidates.get(node.input[0]) is not None:
            candidates[node.output[0]] = candidates[node.input[0]]
            continue  # a parameter where a node reads the copy as one (not a running stat)
        weights, qparams = QUANTIZED_INPUTS.get(op_name(node), ((), ()))
        for i, name in enumerate(node.input):
            info = candidates.get(name)
            running_stat = node.op_type == "BatchNormalization" and i >= 3
            if info is None or running_stat or i in qparams:
                continue
            if info.is_float:
                params[name] = info
            elif i in weights:
                params[name] = _unpacked(node, info)
        for sub in _subgraphs(node):
            if depth >= MAX_SUBGRAPH_DEPTH:
                break
            local = {n: None for n in body_names(sub) if n in candidates}
            _read_parameters(sub.node, candidates.new_child(local), params, depth + 1)


def _unpacked(node, info: TensorInfo) -> TensorInfo:
    """A quantized weight as its values: a uint8 tensor of onnxruntime's n-bit ops
    (PACKED_WEIGHT_OPS) holds 8 / bits of them a byte, so it counts as that many of the packed
    type (UINT4, UINT2), whose bytes are the stored ones; bits that do not divide a byte
    (MatMulNBits' 3, 5...) leave it as stored (its bytes right, its count low)."""
    if node.op_type not in PACKED_WEIGHT_OPS or info.dtype != 2 or not info.shape:
        return info
    bits = 4 if node.op_type == "MatMulBnb4" else int_attr({a.name: a for a in node.attribute}, "bits", 4)
    packed = {4: 21, 2: 25}.get(bits)
    last = info.shape[-1]
    if packed is None or not isinstance(last, int):
        return info
    return TensorInfo(packed, (*info.shape[:-1], last * (8 // bits)))


def weight_views(graph: Graph, params) -> set[str]:
    """Tensors that are a parameter read through a view (Linear's W.t() when the export is not
    constant-folded, as in training mode): the parameter itself in PyTorch, no tensor of its
    own, no kernel, and nothing autograd keeps a copy of."""
    views: set[str] = set()
    for node in graph.nodes:
        if (op_name(node) in VIEW_OPS | {"Transpose"} and node.input and node.output
                and (node.input[0] in params or node.input[0] in views)):
            views.add(node.output[0])
    return views


def _folded_tied_embeddings(graph: Graph, params: dict[str, TensorInfo]) -> list[str]:
    """Output layers tied to the input embedding, as an exporter leaves them after folding.

    A tied language-model head reads the embedding matrix (V, D) transposed; constant folding
    turns that Transpose into a new anonymous initializer ('onnx::...') of shape (D, V). It is
    the same parameter and counts once. Where both are in the file, their values decide
    (load._tied_heads: the head is the table transposed, or not). Where they are not (external
    data, stripped weights), its use does: a tied head is read by a MatMul with no bias (GPT-2,
    T5), an untied one has its own bias, so a MatMul followed by an Add of a (V,) parameter is
    left alone, and so is a weight whose product is not the model's output or its loss's input
    (a layer's bias-free weight shaped like a position table's transpose); an untied head
    without a bias (LLaMA's), and a tied head with its own bias (BERT's masked-LM head: counted
    twice, D x V parameters high), are the cases this rule cannot tell apart. An export without
    folding (training mode) reads the embedding itself through a Transpose, so a tied head is
    one parameter there whatever its bias.
    """
    embeddings = {params[n.input[0]].shape for n in graph.nodes
                  if n.op_type == "Gather" and n.input and n.input[0] in params
                  and len(params[n.input[0]].shape) == 2}
    consumers = graph.consumers

    def has_bias(matmul) -> bool:
        return any(c.op_type == "Add" and any(i in params for i in c.input)
                   for o in matmul.output for c in consumers.get(o, ()))

    tied, ends = [], {}
    for name, info in params.items():
        if not (name.startswith("onnx::") and len(info.shape) == 2
                and info.shape[0] != info.shape[1] and tuple(reversed(info.shape)) in embeddings):
            continue
        if name in graph.tied_heads:
            if graph.tied_heads[name]:
                tied.append(name)
            continue
        users = consumers.get(name, [])
        if users and all(u.op_type == "MatMul" and not has_bias(u)
                         and all(_ends_the_model(o, graph, consumers, ends) for o in u.output) for u in users):
            tied.append(name)
    return tied


# what a language-model head's logits pass through on their way out: views, the causal shift
# and last-token picks (Slice, Gather), temperature and soft-capping (Div, Mul, Tanh), and the
# loss; a layer's product meets another matmul first
_LOGIT_VIEWS = {"Reshape", "Transpose", "Cast", "Identity", "Flatten", "Squeeze", "Unsqueeze",
                "Slice", "Gather", "Div", "Mul", "Tanh"}
_LOGIT_ENDS = {"Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss",
               "ArgMax", "TopK"}


def _ends_the_model(name: str, graph: Graph, consumers, memo: dict, depth: int = 0) -> bool:
    """Whether tensor ``name`` is the model's output (through views) or what its loss reads:
    a head's logits, not a layer's activations (a bias-free FFN weight shaped like a position
    table's transpose was dropped as tied).  ``memo`` keeps each (tensor, depth) answered once:
    a node listing its input many times made every path count (a 1.7 KB file took minutes)."""
    if name in graph.graph_outputs:
        return True
    key = (name, depth)
    if key not in memo:
        users = consumers.get(name, ())
        memo[key] = bool(users) and depth < 8 and all(
            u.op_type in _LOGIT_ENDS or (u.op_type in _LOGIT_VIEWS and all(
                _ends_the_model(o, graph, consumers, memo, depth + 1) for o in u.output))
            for u in users)
    return memo[key]


def node_costs(graph: Graph, params: dict[str, TensorInfo], views: set[str],
               single_trips: list[str] | None = None) -> list[NodeCost]:
    """Cost every node of `graph`, attributing each parameter to the first node that reads it.
    ``params``: parameter_tensors(graph); ``views``: weight_views(graph, params) (the caller
    keeps both for the live-tensor count).

    The nodes of If, Loop and Scan bodies are costed too, listed before the node that runs them
    (named after it, 'loop/MatMul:m'): an If's costlier branch (by FLOPs, then bytes moved); a
    Loop's body times its trip count where that is a constant, a Scan's times its scan length
    where that is known, once otherwise, naming the node in ``single_trips``.  A body node's
    FLOPs, bytes moved, kernels and backward state count once per iteration, its parameters
    and output size once; a parameter only the branch not taken reads is the If's own."""
    constants = _Names({*graph.initializers, *(o for n in graph.nodes if n.op_type == "Constant"
                                               for o in n.output)})
    return _scope_costs(graph, params, _Names(views), _Names(), constants, _Names(),
                        single_trips if single_trips is not None else [], 1, "")


class _Names:
    """Membership in a scope's own names (``own``) or its enclosing scopes' (chained, not
    copied, so that many small bodies cost their own size each).  The parameters claimed so
    far are such names too: an If's branches each claim in a child, merged after."""

    __slots__ = ("own", "outer")

    def __init__(self, own: set[str] | None = None, outer: "_Names | None" = None):
        self.own = set() if own is None else own
        self.outer = outer

    def __contains__(self, name) -> bool:
        return name in self.own or (self.outer is not None and name in self.outer)

    def child(self, own: set[str] | None = None) -> "_Names":
        return _Names(own, self)


# nested loops' iterations beyond which a step is not plausible (a microsecond each: 12 days)
MAX_TRIPS = 2**40


def _scope_costs(graph: Graph, params, views: _Names, claimed: _Names, constants: _Names,
                 local: _Names, single_trips: list[str], times: int, prefix: str) -> list[NodeCost]:
    """node_costs for one scope: ``graph`` (a body's: load.body_scope), run ``times`` times;
    ``local``: the names the enclosing bodies (and this one) define, whose tensors exist per
    iteration (a body's tensor kept for backward is counted in bytes, per iteration)."""
    ctx = _BackwardContext(graph, params, constants, views)
    out = []
    for node in graph.nodes:
        if node.op_type == "Identity" and node.output and node.output[0] in params:
            continue  # a parameter copy, costed where it is used
        if bodies(node):
            out += _control_flow_costs(node, graph, params, views, claimed, constants, local,
                                       single_trips, times, prefix)
            continue
        cost = _cost(node, graph, params, claimed, constants, ctx)
        out.append(cost if not prefix else _per_iteration(cost, graph, local, times, prefix))
    return out


def _per_iteration(c: NodeCost, graph: Graph, local: _Names, times: int, prefix: str) -> NodeCost:
    """A body node's cost run ``times`` times: what it does and keeps per iteration times that;
    a tensor of the body it keeps for backward, one per iteration, in bytes (a tensor of the
    model's graph it keeps is that one tensor, named)."""
    kept = sum(graph.info(n).nbytes for n in c.saved if n in local and graph.info(n) is not None)
    flops, extra = c.flops * times, (c.extra_saved_bytes + kept) * times
    if not (flops <= MAX_NODE_FLOPS and extra <= MAX_NODE_BYTES):
        raise ModelError(f"{graph.path}: node '{prefix}{c.name}' ({c.op_type}) would cost {flops:.3g} "
                         f"FLOPs and keep {extra:.3g} bytes over its loop's iterations; the model's "
                         "trip counts or sizes are not plausible")
    return replace(c, name=prefix + c.name, flops=flops, read_bytes=c.read_bytes * times,
                   write_bytes=c.write_bytes * times, kernels=c.kernels * times,
                   saved=tuple(n for n in c.saved if n not in local), extra_saved_bytes=extra)


def _runs_all_trips(node) -> bool:
    """Does this Loop run all of its M trips: no condition input, or a body that hands its
    condition on unchanged (as is, or through an Identity)?  A body that computes its
    condition may stop early: M is then only a bound."""
    if len(node.input) < 2 or not node.input[1]:
        return True
    body = dict(bodies(node)).get("body")
    if body is None or len(body.input) < 2 or not body.output:
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_out == cond_in:
        return True
    return any(n.op_type == "Identity" and list(n.output) == [cond_out] and list(n.input) == [cond_in]
               for n in body.node)


def _trips(node, graph: Graph) -> int | None:
    """How many times a Loop or Scan runs its body, where the graph says; None otherwise (a
    Loop's trip count M computed at run time, or absent: a while loop; a Scan's symbolic
    length); an If runs one branch once."""
    if node.op_type == "Loop":
        m = node.input[0] if node.input else ""
        trip = graph.trip_counts.get(m) if m else None
        if trip is None or not 0 <= trip <= MAX_DIM or not _runs_all_trips(node):
            return None  # M from the run, or a bound a condition may cut short (generation)
        return trip
    if node.op_type == "Scan":
        attrs = {a.name: a for a in node.attribute}
        n_scan = int_attr(attrs, "num_scan_inputs")
        if graph.opset and graph.opset < 9:  # Scan-8: (sequence_lens, states..., inputs...), batch first
            first, axis = len(node.input) - n_scan, 1
        else:
            first = len(node.input) - n_scan
            axes = tuple(attrs["scan_input_axes"].ints) if "scan_input_axes" in attrs else ()
            axis = axes[0] if axes else 0
        info = graph.info(node.input[first]) if 0 <= first < len(node.input) and node.input[first] else None
        if info is None or info.shape is None or not -len(info.shape) <= axis < len(info.shape):
            return None
        length = info.shape[axis]
        return length if isinstance(length, int) else None
    return 1


def _control_flow_costs(node, graph: Graph, params, views: _Names, claimed: _Names,
                        constants: _Names, local: _Names, single_trips: list[str], times: int,
                        prefix: str) -> list[NodeCost]:
    """The costs of an If's, a Loop's or a Scan's body nodes (node_costs), then the node's own:
    no work of its own, the parameters it reads itself or only a branch not taken reads."""
    op = node.op_type
    name = node.name or f"{op}:{node.output[0] if node.output else ''}"
    trips = _trips(node, graph)
    if trips is None:
        single_trips.append(prefix + name)
        trips = 1
    if times * trips > MAX_TRIPS:
        raise ModelError(f"{graph.path}: node '{prefix}{name}' ({op}) would run its body "
                         f"{times * trips:.3g} times; the model's trip counts are not plausible")
    own = [n for n in dict.fromkeys(node.input) if n in params and n not in claimed]
    claimed.own.update(own)
    runs = []  # (body costs, its claims, its outputs)
    for _, body in bodies(node):
        scope = body_scope(graph, body)
        claims = claimed.child() if op == "If" else claimed
        consts = constants.child({*(t.name for t in body.initializer),
                                  *(o for n in scope.nodes if n.op_type == "Constant" for o in n.output)})
        sub_views = views.child(weight_views(scope, params))
        costs = _scope_costs(scope, params, sub_views, claims, consts, local.child(body_names(body)),
                             single_trips, times * trips, f"{prefix}{name}/")
        runs.append((costs, claims, scope.graph_outputs))
    chosen = max(runs, key=lambda r: (sum(c.flops for c in r[0]),
                                      sum(c.read_bytes + c.write_bytes for c in r[0])),
                 default=([], claimed, []))
    if op == "If":
        branch_only = {n for _, claims, _ in runs if claims is not chosen[1] for n in claims.own}
        branch_only -= chosen[1].own
        claimed.own.update(chosen[1].own | branch_only)
        own += sorted(branch_only)
    outs = [graph.info(n) for n in node.output if n]
    return [*chosen[0], NodeCost(
        name=prefix + name, op_type=op, category="view",
        inputs=tuple(n for n in (*node.input, *chosen[2]) if n),
        outputs=tuple(n for n in node.output if n), flops=0,
        params=sum(params[n].numel for n in own), param_bytes=sum(params[n].nbytes for n in own),
        out_bytes=sum(o.nbytes for o in outs if o), read_bytes=0, write_bytes=0, kernels=0,
        saved=(), extra_saved_bytes=0, has_rule=True)]


class _BackwardContext:
    """What autograd keeps depends on a node's neighbours; this looks at them once per graph.

    - An exported activation function is often a chain of element-wise ops on one tensor
      (GELU = Div, Erf, Add, Mul, Mul; SiLU = Sigmoid, Mul): the framework runs it as one op
      that keeps only that tensor, its `root`. Dropout is never part of one: the framework
      runs it as its own op (native_dropout), which keeps its mask; one of p = 0
      (graph.noop_dropouts) returns its input, a view of no kernel and no mask (`same`).
    - Attention probabilities (a Softmax whose output reaches a MatMul through masking or
      dropout) are not kept by the fused attention kernels PyTorch uses for training
      (scaled_dot_product_attention); they are recomputed in the backward pass, and so is the
      dropout mask (the kernels keep the RNG seed and offset, not a mask). Attention written
      with einsum (XLNet) never reaches those kernels and keeps both.
    - A convolution whose bias the exporter made up had a batch norm folded into it: the legacy
      exporter's eval-mode Conv+BatchNorm fusion (torch/csrc/jit/passes/onnx/eval_peephole.cpp,
      fuseConvBatchNorm) writes the fused weight and bias as new initializers, which it names
      'onnx::Conv_N', while a bias the model has keeps its parameter name ('features.0.bias').
      In training that norm exists, and cuDNN batch norm keeps its input (derivatives.yaml:
      cudnn_batch_norm saves `input`), so the convolution's output is kept, apart from the
      norm's output, which the graph's tensor stands for (an activation after it that keeps its
      input, SiLU or GELU, keeps that one too). A convolution with
      a bias of its own (VGG) or none keeps only its input; a graph exported in training mode
      shows its BatchNormalization nodes, whose rule keeps the same tensor.
    """

    PROB_PASSTHROUGH = frozenset({"Where", "Dropout", "Cast", "IsNaN", "Add"})

    def __init__(self, graph: Graph, params, constants, views: set[str]):
        self.root: dict[str, str] = {}
        for node in graph.nodes:
            if op_name(node) in ELEMENTWISE and op_name(node) != "Dropout" and node.output:
                acts = [n for n in node.input if n and n not in constants and n not in params]
                roots = {self.root.get(a, a) for a in acts}
                if len(roots) == 1:
                    self.root[node.output[0]] = roots.pop()
        # Only chains of two or more ops are fused activations; a lone ReLU keeps its own rule.
        # A chain with a Pow in it was written op by op in Python (Hugging Face's NewGELU:
        # 0.5*x*(1+tanh(c*(x+0.044715*pow(x,3))))): no exporter writes Pow when it decomposes
        # one framework op, and autograd keeps what each op of the chain needs (measured:
        # pow's input, tanh's output and both factors of the last Mul, four tensors, not one).
        composite = {self.root[n.output[0]] for n in graph.nodes
                     if op_name(n) == "Pow" and n.output and n.output[0] in self.root}
        self.fused: set[str] = set()
        for node in graph.nodes:
            out = node.output[0] if node.output else None
            if out in self.root and self.root[out] not in composite:
                inner = [a for a in node.input if a in self.root
                         and self.root[a] == self.root[out]]
                if inner:
                    self.fused.update([out, *inner])
        # each tensor's readers (graph.consumers) looked at once for all the walks below: 5,000
        # Softmaxes whose walks met one tensor of 5,000 readers took 30 s
        to_matmul, passed = set(), {}
        for n, readers in graph.consumers.items():
            if any(op_name(c) == "MatMul" for c in readers):
                to_matmul.add(n)
            passed[n] = [c.output[0] for c in readers if op_name(c) in self.PROB_PASSTHROUGH and c.output]
        self.probs: set[str] = set()
        for node in graph.nodes:
            if op_name(node) == "Softmax" and node.output:
                chain, frontier = [], [node.output[0]]
                while frontier and len(chain) < 8:
                    name = frontier.pop()
                    chain.append(name)
                    if name in to_matmul:
                        self.probs.update(chain)
                    frontier += passed.get(name, ())[-8:]  # (no more than 8 are ever popped)
        self.param_views = views
        # the output of a Dropout that returns its input (p = 0) -> that input, through chains
        # of them: a tensor kept past one is its input's storage, counted once
        self.same: dict[str, str] = {}
        for node in graph.nodes:
            if is_noop_dropout(node, graph):
                self.same[node.output[0]] = self.same.get(node.input[0], node.input[0])
        self.folded_norm = {
            node.output[0] for node in graph.nodes
            if op_name(node) in ("Conv", "ConvTranspose") and len(node.input) > 2 and node.output
            and node.input[2].startswith(FOLDED_PREFIX) and node.input[2] in graph.initializers}


# one node's work in one step beyond which a model is not plausible: an exaflop (a second of a
# thousand H100s) and a pebibyte kept for the backward pass
MAX_NODE_FLOPS = 1e18
MAX_NODE_BYTES = 2.0 ** 50


def _cost(node, graph: Graph, params, claimed: _Names, constants: _Names,
          ctx: _BackwardContext) -> NodeCost:
    op = op_name(node)
    infos = [graph.info(n) if n else None for n in node.input]
    outs = [graph.info(n) for n in node.output if n]
    out_bytes = sum(o.nbytes for o in outs if o)
    # once each: a node reading a weight twice (W * W) had counted it twice
    own_params = [n for n in dict.fromkeys(node.input) if n in params and n not in claimed]
    claimed.own.update(own_params)
    n_params = sum(params[n].numel for n in own_params)
    param_bytes = sum(params[n].nbytes for n in own_params)
    # a weight read through a view (W.t()) is no tensor of its own: no kernel, no bytes moved
    param_view = bool(node.output) and node.output[0] in ctx.param_views
    # a Dropout that is its input (graph.noop_dropouts: p = 0) is no kernel either, nor a mask
    category = "view" if param_view or is_noop_dropout(node, graph) else categorize(op, outs)
    attrs = {a.name: a for a in node.attribute}
    try:
        flops, has_rule, shapes_known = node_flops(op, category, infos, outs, attrs)
    except ModelError as e:  # an attribute no rule can read (an Einsum equation not UTF-8)
        raise ModelError(f"{graph.path}: node '{node.name or op}' ({op}): {e}") from None
    if category in ("view", "shape"):
        read = write = kernels = 0
    else:
        read = sum(i.nbytes for i in infos if i)
        write = out_bytes
        kernels = _kernels(op, category, infos, attrs, node)
    activations = [n for n in node.input
                   if n and n not in constants and n not in params and n not in ctx.param_views]
    saved, extra = _saved_for_backward(op, category, node, activations, infos, outs, attrs, params,
                                       ctx)
    if not (0 <= flops <= MAX_NODE_FLOPS and 0 <= extra <= MAX_NODE_BYTES):
        # attributes no shape check sees (a negative kernel_shape or K, num_heads = 2**62): one
        # such node cancelled a network's FLOPs, or gave it an exaflop
        raise ModelError(f"{graph.path}: node '{node.name or op}' ({op}) would cost {flops:.3g} "
                         f"FLOPs and keep {extra:.3g} bytes; its attributes are not plausible")
    saved = [ctx.same.get(n, n) for n in saved if n not in ctx.probs]
    return NodeCost(name=node.name or f"{op}:{node.output[0] if node.output else ''}",
                    op_type=op, category=category, inputs=tuple(n for n in node.input if n),
                    outputs=tuple(n for n in node.output if n), flops=int(flops), params=n_params,
                    param_bytes=param_bytes, out_bytes=out_bytes, read_bytes=read,
                    write_bytes=write, kernels=kernels, saved=tuple(saved),
                    extra_saved_bytes=int(extra), has_rule=has_rule, shapes_known=shapes_known)


def is_noop_dropout(node, graph: Graph) -> bool:
    """Is ``node`` a Dropout that returns its input (graph.noop_dropouts: p = 0, or not
    training)?  Its first output is that input, as an Identity's: no kernel, no mask, no tensor."""
    return (op_name(node) == "Dropout" and bool(node.input) and bool(node.input[0])
            and bool(node.output) and node.output[0] in graph.noop_dropouts)


def op_name(node) -> str:
    """The name rules know an op by; ops of other domains keep theirs ('com.acme.Relu'), so a
    custom op is never taken for the standard op it shares a name with."""
    return node.op_type if node.domain in RULE_DOMAINS else f"{node.domain}.{node.op_type}"


def categorize(op: str, outs: list[TensorInfo | None]) -> str:
    """The op family a node belongs to, used for op-mix features and kernel estimates."""
    if "." in op:  # a custom domain's op: no rule applies
        return "other"
    if op in ("Conv", "ConvTranspose", "FusedConv", "QLinearConv", "ConvInteger", "NhwcConv"):
        return "conv"
    if op in ("Gemm", "MatMul", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "Einsum",
              "FusedGemm", "MatMulNBits", "GemmFloat8", "QGemm", "MatMulIntegerToFloat",
              "DynamicQuantizeMatMul", "MatMulBnb4"):
        return "matmul"
    if op in ATTENTION:
        return "attention"
    if op in RNN_GATES:
        return "rnn"
    if op in NORMS:
        return "norm"
    if "Pool" in op:
        return "pool"
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return "softmax"
    if op in VIEW_OPS:
        return "view"
    if outs and all(o is not None and not o.is_float and o.known
                    and o.numel <= SHAPE_TENSOR_MAX_ELEMENTS for o in outs):
        return "shape"
    if op in ELEMENTWISE:
        return "elementwise"
    if op in REDUCES:
        return "reduce"
    if op in DATA_MOVEMENT:
        return "data"
    return "other"


def _kernels(op, category, infos, attrs, node) -> int:
    """GPU kernel launches for one node, as an eager framework issues them."""
    if category == "rnn":
        x = shape_of(infos[0]) if infos else None
        seq = (x[1] if int_attr(attrs, "layout") else x[0]) if x and len(x) == 3 else 1
        w = shape_of(infos[1]) if len(infos) > 1 else None
        directions = w[0] if w else 1
        return 2 * seq * directions
    if category == "conv" and len(node.input) > 2 and node.input[2]:
        return 2  # convolution and bias add are separate kernels in cuDNN's common paths
    if category == "attention":
        return 4
    return 1


def _saved_for_backward(op, category, node, activations, infos, outs, attrs, params, ctx):
    """Names of tensors kept for the backward pass, and bytes kept that are no graph tensor."""
    extra = 0
    if category in ("view", "shape") or op in SAVES_NOTHING:
        return [], 0
    if category == "other":  # no rule: keep what any backward could need
        return list(activations) + [n for n in node.output if n], 0
    if category == "conv":  # a folded norm keeps its input, a tensor of its own in training
        folded = node.output and node.output[0] in ctx.folded_norm
        return list(activations), (outs[0].nbytes if folded and outs and outs[0] else 0)
    if category == "elementwise" and node.output and node.output[0] in ctx.fused:
        return [ctx.root[node.output[0]]], 0
    if category in ("matmul", "attention"):
        saved = list(activations)
        dims = attention_dims(op, int_attr_reader(attrs),
                              [shape_of(i) for i in infos]) if category == "attention" else None
        if dims is not None:  # the softmax probabilities stay too
            batch, heads, sq, skv, _, _ = dims
            extra = batch * heads * sq * skv * 4
        return saved, extra
    if category == "rnn":
        x = shape_of(infos[0]) if infos else None
        w = shape_of(infos[1]) if len(infos) > 1 else None
        if x is not None and w is not None and len(x) == len(w) == 3:  # else a layout no rule reads
            directions, gates = w[0], w[1]
            # cuDNN's training reserve: every step's gates and cell/hidden states
            extra = x[0] * x[1] * directions * (gates + 2 * (gates // RNN_GATES[op])) * 4
        return list(activations) + [n for n in node.output if n], extra
    if category in ("norm",):
        return activations[:1], 0
    if category == "pool":
        if op in ("MaxPool", "GlobalMaxPool", "MaxRoiPool", "LpPool"):
            extra = numel(outs[0] if outs else None) * 8  # argmax indices (int64)
            return activations[:1], extra
        return [], 0
    if op == "Dropout":  # the boolean mask; fused attention redraws its own from the RNG seed
        fused = bool(node.input) and node.input[0] in ctx.probs
        return [], 0 if fused else numel(infos[0] if infos else None)
    if op in SAVES_OUTPUT or category == "softmax":
        return [n for n in node.output[:1] if n], 0
    if op == "Gather":  # an embedding lookup keeps its indices
        return activations[1:2], 0
    if category == "elementwise" or category == "reduce":
        if op in ("Mul", "Div") and len(activations) < 2 and not any(
                n in params or n in ctx.param_views for n in node.input):
            return [], 0  # scaling by a constant needs no saved tensor
        return list(activations), 0
    return [], 0

