"""The parameters of a graph from torch's dynamo exporter (torch.onnx.export's default), told
apart by the metadata it leaves.

Its optimizer treats weights as constants: it merges initializers of equal bytes (a fresh model's
all-ones norm weights, all-zero biases) into one that several nodes read, with no Identity node
between; it folds W.t() into a new initializer ('val_N', its sources in the value's
'pkg.onnxscript.optimizer.folded_from'), a tied head's too; and it drops a Gemm's all-zero bias
('RemoveOptionalBiasFromGemm') or a Conv's ('RemoveOptionalBiasFromConv'); and it fuses a
BatchNorm into the Conv (or ConvTranspose, Gemm) before it ('FuseBatchNormIntoConv'), even in
training mode, leaving a Conv whose 'fx_node' is the batch-norm call and whose bias is the
fused one (the conv's own bias's name, or '<weight>_bias', a new initializer, where the conv's
own bias was zero and dropped first).  Equal calls on merged initializers are merged too (DeiT's
expands of its two all-zero tokens), the parameter of the one removed read by no node.  What
tells them apart: the graph's 'pkg.torch.export.ExportedProgram.graph_signature' lists every
parameter (placeholder and name: initializers keep the names), and each node's
'pkg.torch.onnx.fx_node' is the PyTorch call it lowers, naming the placeholders it read.  A
tied weight's calls all name one placeholder (the signature lists its other name, unread), so
it counts once; a merged one's name their own.
A fused BatchNorm is put back (restore_batch_norm: training mode, or eval mode where its
module's train() keeps it frozen), and so is a zero Pad fused into the Conv after it
('FuseConvPad', restore_pad: F.pad's copy, which the convolution keeps), so that each costs as
in a TorchScript export.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import count

from slurm_horus.graph.load import MAX_TENSOR_ELEMENTS, TensorInfo

SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
FX_NODE = "pkg.torch.onnx.fx_node"
RULE = "pkg.onnxscript.rewriter.rule_name"

_INPUT_SPEC = re.compile(r"^(\w+): (PARAMETER|BUFFER|CONSTANT_TENSOR) target='([^']+)'", re.M)
_PLACEHOLDER = re.compile(r"%(\w+)")
_QUOTED = re.compile(r"'([^']*)'")
# a batch-norm call's target and arguments in an fx_node: (input, weight, bias, running_mean,
# running_var, training, ...) for every overload but no_stats (input, weight, bias, training, ...)
# and no_training (input, weight, bias, running_mean, running_var, momentum, eps: eval mode)
_BN_CALL = re.compile(r"target=(?:torch\.ops\.)?aten\.(_native_batch_norm_legit_functional|"
                      r"_native_batch_norm_legit_no_training|"
                      r"_native_batch_norm_legit|native_batch_norm|batch_norm|cudnn_batch_norm)"
                      r"(?:\.\w+)?\]\(args = \(([^()]*)\)")
FUSED_INTO = frozenset({"Conv", "ConvTranspose", "Gemm"})  # FuseBatchNormInto{Conv,ConvTranspose,Gemm}


@dataclass
class DynamoParameters:
    constants: set[str] = field(default_factory=set)  # folded initializers that are no parameter
    unsized: list[str] = field(default_factory=list)  # parameters whose size the graph lost


def separate_parameters(graph, nodes, tensors: dict[str, TensorInfo],
                        initializers: dict[str, TensorInfo]) -> DynamoParameters:
    """Undo the dynamo exporter's merges where its metadata tells them, so that costs counts
    each PyTorch parameter once: a node whose call names a parameter it reads through another's
    initializer reads it under the parameter's own name (added to ``tensors`` and
    ``initializers``, the node's input renamed), and a Gemm or Conv whose zero bias the optimizer
    dropped gets it back, a norm fused into it or not.  A folded initializer is a constant
    unless it is the only tensor of a weight that has no initializer of its own (W.t() of a
    Linear's; a tied head's is a copy).
    A parameter still without a size (fused into a convolution, folded with constants, or read
    by no node since a call that read it was merged into another: _merged_call_modules) is
    listed in ``unsized``.  A name the graph already uses for another tensor is never taken (the
    metadata is the file's claim)."""
    meta = {p.key: p.value for p in getattr(graph, "metadata_props", ())}
    specs = _INPUT_SPEC.findall(meta.get(SIGNATURE, ""))
    if not specs:
        return DynamoParameters()
    placeholders = {ph: target for ph, kind, target in specs if kind == "PARAMETER"}
    targets = {ph: target for ph, _, target in specs}
    params = set(placeholders.values())
    lifted = set(targets.values())  # where a merged parameter's bytes may live
    stands_for = {t: t for t in params if t in initializers}
    sized = set(stands_for.values())
    used = set(sized)
    folded = {vi.name: _QUOTED.findall(m.value) for vi in graph.value_info if vi.name in initializers
              for m in getattr(vi, "metadata_props", ()) if m.key == FOLDED_FROM}
    out = DynamoParameters()
    fresh = _FreshNames(tensors, nodes)
    after: dict[int, object] = {}  # id(fused node): the BatchNormalization put back after it
    before: dict[int, object] = {}  # id(fused Conv): the Pad put back before it
    unbiased = []  # the fused nodes whose own zero bias the optimizer had dropped before fusing
    calls: set[str] = set()  # the fx values the graph's nodes compute ('%cat : ...')
    param_reads: dict[str, tuple[str, list[str]]] = {}  # a node's output: its call, the parameters read
    twice_read = []  # (node, the fx values its call names): nodes that read a tensor twice
    for name, sources in sorted(folded.items(), key=lambda kv: len(kv[1])):
        used.update(s for s in sources if s in params)
        if len(sources) == 1 and sources[0] in params and sources[0] not in sized:
            stands_for[name] = sources[0]
            sized.add(sources[0])
        else:
            out.constants.add(name)
    for node in nodes:
        node_meta = {p.key: p.value for p in getattr(node, "metadata_props", ())}
        named = _PLACEHOLDER.findall(node_meta.get(FX_NODE, ""))  # the call's value, then its arguments
        reads = list(dict.fromkeys(targets[p] for p in named if p in targets))
        used.update(t for t in reads if t in params)
        calls.update(named[:1])
        if node.output and any(t in params for t in reads):
            param_reads[node.output[0]] = (named[0], [t for t in reads if t in params])
        if len(set(node.input)) < len(node.input):
            twice_read.append((node, named[1:]))
        rule = node_meta.get(RULE)
        rules = {r.strip() for r in rule.split(",")} if rule is not None else set()
        if "FuseConvPad" in rules and node.op_type == "Conv" and node.output:
            pad = restore_pad(node, tensors, initializers, fresh, out.constants)
            if pad is not None:
                before[id(node)] = pad
        if f"FuseBatchNormInto{node.op_type}" in rules and node.op_type in FUSED_INTO and node.output:
            bn = restore_batch_norm(node, node_meta.get(FX_NODE, ""), params, targets, sized,
                                    tensors, initializers, fresh, out.constants)
            if bn is not None:
                after[id(node)] = bn
                if f"RemoveOptionalBiasFrom{node.op_type}" in rules:
                    unbiased.append(node)
            continue
        pending = [t for t in reads if t in params and t not in sized]
        if not pending or any(t in tensors for t in pending):
            continue
        if rule is None:  # the node lowers the call as written: its merged inputs are the pending
            read = set(reads)  # (a list: a crafted node of 10**5 inputs and reads took minutes)
            stand_ins = [i for i, n in enumerate(node.input) if n in lifted and n in initializers
                         and n not in read and stands_for.get(n) not in read]
            if len(stand_ins) == len(pending) and len({initializers[node.input[i]] for i in stand_ins}) == 1:
                for target, i in zip(pending, stand_ins):
                    tensors[target] = initializers[target] = initializers[node.input[i]]
                    node.input[i] = target
                    sized.add(target)
        elif f"RemoveOptionalBiasFrom{node.op_type}" in rules and node.op_type in ("Gemm", "Conv") \
                and len(pending) == 1 and len(node.input) == 2 and node.output \
                and (channels := _channels(tensors.get(node.output[0]), node.op_type)) is not None:
            _append_bias(node, pending[0], channels, tensors, initializers, sized)
    unread = params - used
    for node in unbiased:  # a bias found but not sized is listed unsized
        used.update(_restore_fused_bias(node, stands_for.get(node.input[1], node.input[1]), unread,
                                        sized, tensors, initializers))
    if after or before:
        nodes[:] = [m for n in nodes for m in ((before[id(n)],) if id(n) in before else ())
                    + ((n, after[id(n)]) if id(n) in after else (n,))]
    merged = _merged_call_modules(twice_read, calls | set(targets) | set(tensors), param_reads)
    lost = {t for t in params - used - sized if _module(t) in merged}
    out.unsized = sorted((used | lost) - sized)
    return out


def _merged_call_modules(twice_read, known: set[str],
                         param_reads: dict[str, tuple[str, list[str]]]) -> set[str]:
    """The modules whose parameter the optimizer may have taken away with the call that read
    it: it merges equal initializers (two all-zero tokens), then equal calls on them (their
    expands), so one node reads the survivor's output twice where its call names two values,
    one computed by no node and of the survivor's op (DeiT's cat of %expand and %expand_1, the
    distillation token's).  One of another op is a call the optimizer dropped as the identity
    (x + x.clone(), a dropout in eval mode), no merge.
    A parameter of the survivor's module that no call reads may be the merged one, its size
    untold; one no call reads elsewhere is a tied weight's other name (its calls name the kept
    one), counted once as PyTorch counts it."""
    modules: set[str] = set()
    for node, named in twice_read:
        gone = {_op(v) for v in named if v not in known}
        for i in (i for i, n in Counter(node.input).items() if i and n > 1 and i in param_reads):
            call, targets = param_reads[i]
            if _op(call) in gone:
                modules.update(_module(t) for t in targets)
    return modules


def _op(value: str) -> str:
    """The op an fx value is named after: 'expand' of 'expand_1' (torch.fx numbers its names)."""
    return re.sub(r"_\d+$", "", value)


def _module(target: str) -> str:
    """The module a parameter belongs to: 'deit.embeddings' of 'deit.embeddings.cls_token'."""
    return target.rpartition(".")[0]


def _restore_fused_bias(node, weight: str, unread: set[str], sized: set[str],
                        tensors: dict[str, TensorInfo], initializers: dict[str, TensorInfo]) -> list[str]:
    """Give the Conv, ConvTranspose or Gemm ``node``, whose BatchNormalization restore_batch_norm
    put back, its own bias, where the optimizer had dropped it as zero before fusing the norm
    (RemoveOptionalBiasFrom*, then FuseBatchNormInto*, whose bias is then '<weight>_bias'): the
    parameter beside its ``weight`` ('c.bias' of 'c.weight') that no call reads, its module's
    convolution call gone with the fusion; sized (C_out,) as the call's output's channels.
    Returns that parameter, if any (unsized where the output's channels are unknown)."""
    bias = weight[:-len("weight")] + "bias"
    if len(node.input) != 2 or not weight.endswith("weight") or bias not in unread \
            or bias in sized or bias in tensors:
        return []
    channels = _channels(tensors.get(node.output[0]), node.op_type)
    if channels is not None:
        _append_bias(node, bias, channels, tensors, initializers, sized)
    return [bias]


def _append_bias(node, bias: str, channels: int, tensors: dict[str, TensorInfo],
                 initializers: dict[str, TensorInfo], sized: set[str]) -> None:
    """``bias`` the Gemm's or Conv's third input, sized (C_out,) as its output's channels
    (Gemm: C broadcast along the rows, Linear's (N,) bias; Conv: B, dim 1 of Y)."""
    tensors[bias] = initializers[bias] = TensorInfo(tensors[node.output[0]].dtype, (channels,))
    node.input.append(bias)
    sized.add(bias)


def _channels(y: TensorInfo | None, op: str) -> int | None:
    """The channels of a node's output: dim 1 of a Conv's (N, C, ...) or a Gemm's (N, C)."""
    if y is None or not y.shape or (op != "Gemm" and len(y.shape) < 2):
        return None
    c = y.shape[-1] if op == "Gemm" else y.shape[1]
    return c if isinstance(c, int) else None


class _FreshNames:
    """Tensor names no node, initializer or value of the graph has: the tensors of the nodes
    put back are new ones (a crafted graph may name its own tensors as ours would be)."""

    def __init__(self, tensors: dict, nodes):
        self.tensors, self.nodes, self.taken = tensors, nodes, None
        self.counter = count()

    def __call__(self, stem: str) -> str:
        if self.taken is None:  # on first use: most graphs have no node put back
            self.taken = set(self.tensors)
            for node in self.nodes:
                self.taken.update(node.input)
                self.taken.update(node.output)
        name = stem
        while name in self.taken:
            name = f"{stem}.{next(self.counter)}"
        self.taken.add(name)
        return name


def restore_pad(node, tensors: dict[str, TensorInfo], initializers: dict[str, TensorInfo],
                fresh: _FreshNames, constants: set[str]):
    """The constant zero Pad the optimizer fused into the Conv ``node`` ('FuseConvPad': its
    spatial pads added to the Conv's), put back before it as a new node (returned; None where
    the shapes do not tell it): the Pad reads the Conv's input and writes a new tensor, padded
    by the Conv's pads, which the Conv reads with pads 0, as the TorchScript export's Pad and
    Conv (PyTorch's F.pad copies its input, a zero pad too, and the convolution keeps the copy
    for its backward pass; a MobileNetV2 with TF padding's saved activations had been 35 % low).
    The metadata does not tell the Conv's own padding from the Pad's: all of it is the Pad's,
    the copy at most the Conv's own padding larger."""
    import onnx

    x = tensors.get(node.input[0]) if node.input and node.input[0] else None
    attrs = {a.name: a for a in node.attribute}
    spatial = len(x.shape) - 2 if x is not None and x.shape is not None else -1
    pads = list(attrs["pads"].ints) if "pads" in attrs else [0] * (2 * max(spatial, 0))
    auto_pad = attrs["auto_pad"].s if "auto_pad" in attrs else b"NOTSET"
    if spatial < 1 or len(pads) != 2 * spatial or auto_pad not in (b"", b"NOTSET") \
            or any(p < 0 for p in pads) or not all(isinstance(d, int) for d in x.shape[2:]):
        return None
    padded = TensorInfo(x.dtype, (*x.shape[:2], *(d + pads[i] + pads[i + spatial]
                                                  for i, d in enumerate(x.shape[2:]))))
    if math.prod(d for d in padded.shape if isinstance(d, int)) > MAX_TENSOR_ELEMENTS:
        return None  # the loader's bound: a crafted pad of 10**9 under a stride of as much
    amounts = fresh(f"{node.name or node.output[0]}.pads")
    tensors[amounts] = initializers[amounts] = TensorInfo(onnx.TensorProto.INT64, (2 * len(x.shape),))
    constants.add(amounts)
    out = fresh(f"{node.input[0]}.padded")
    tensors[out] = padded
    pad = onnx.helper.make_node("Pad", [node.input[0], amounts], [out], mode="constant",
                                name=fresh(f"{node.name or out}/Pad"))
    node.input[0] = out
    if "pads" in attrs:
        del attrs["pads"].ints[:]
        attrs["pads"].ints.extend([0] * len(pads))
    return pad


def restore_batch_norm(node, fx_node: str, params: set[str], targets: dict[str, str],
                       sized: set[str], tensors: dict[str, TensorInfo],
                       initializers: dict[str, TensorInfo], fresh: _FreshNames, constants: set[str]):
    """The BatchNormalization the optimizer fused into ``node``, put back after
    it as a new node (returned; None where the metadata does not tell one): ``node`` writes a
    new tensor, which the norm reads, with its weight and bias (the call's parameters, sized
    (C,) under their own names, as the TorchScript exporter names them) and running statistics,
    and writes the node's output, as the TorchScript export's BatchNormalization (training_mode
    1, three outputs; eval mode below).  costs then costs it as it costs that one: its FLOPs, its 2*C
    parameters, its input kept for the backward pass.  The fused bias is dropped from ``node``
    unless it is a parameter of the model (the conv's own bias, renamed in place): a new
    initializer ('<weight>_bias') is the norm's shift, no parameter.  A call in eval mode
    (_native_batch_norm_legit_no_training: a norm whose module's train() keeps it frozen) is
    put back too, as the TorchScript export in training mode keeps it: training_mode 0, one
    output, its weight and bias still parameters (the optimizer's fusion had lost them)."""
    import onnx

    call = _BN_CALL.search(fx_node)
    if call is None or not node.output or not node.output[0]:
        return None
    args = [a.strip() for a in call.group(2).split(",")]
    no_stats = call.group(1) == "_native_batch_norm_legit" and len(args) > 3 and args[3] in ("True", "False")
    if call.group(1) == "_native_batch_norm_legit_no_training":
        flag = "False" if len(args) >= 5 else ""
    else:
        flag = args[3] if no_stats else (args[5] if len(args) > 5 else "")
    y = tensors.get(node.output[0])
    channels = _channels(y, node.op_type)
    if flag not in ("True", "False") or channels is None:
        return None
    training = flag == "True"
    names = ([a[1:] if a.startswith("%") else "" for a in args[1:(3 if no_stats else 5)]] + [""] * 4)[:4]
    stat = TensorInfo(y.dtype, (channels,))
    inputs = []
    for i, ph in enumerate(names):
        target = targets.get(ph)
        if i < 2 and target in params:  # the norm's weight or bias
            if target not in sized and target not in tensors:
                tensors[target] = initializers[target] = stat
                sized.add(target)
            if target in sized:
                inputs.append(target)
                continue
        name = fresh(target or f"{node.output[0]}.{('scale', 'shift', 'mean', 'var')[i]}")
        tensors[name] = initializers[name] = stat
        constants.add(name)  # a running statistic, or a norm without its own weight: no parameter
        inputs.append(name)
    if len(node.input) > 2 and node.input[2] and node.input[2] not in params:
        if node.input[2] in initializers:
            constants.add(node.input[2])  # the norm's shift, the weight's own name + '_bias'
        del node.input[2:]
    out = node.output[0]
    raw = fresh(f"{out}.pre_norm")
    tensors[raw] = y
    node.output[0] = raw
    stats_out = [fresh(f"{out}.running_mean"), fresh(f"{out}.running_var")] if training else []
    for name in stats_out:
        tensors[name] = stat
    return onnx.helper.make_node("BatchNormalization", [raw, *inputs], [out, *stats_out],
                                 name=fresh(f"{node.name or out}/BatchNormalization"),
                                 epsilon=1e-5, momentum=0.9, training_mode=int(training))
