"""The parameters of a graph from torch's dynamo exporter (torch.onnx.export's default), told
apart by the metadata it leaves.

Its optimizer treats weights as constants: it merges initializers of equal bytes (a fresh model's
all-ones norm weights, all-zero biases) into one that several nodes read, with no Identity node
between; it folds W.t() into a new initializer ('val_N', its sources in the value's
'pkg.onnxscript.optimizer.folded_from'), a tied head's too; and it drops a Gemm's all-zero bias
('RemoveOptionalBiasFromGemm').  What tells them apart: the graph's
'pkg.torch.export.ExportedProgram.graph_signature' lists every parameter (placeholder and name:
initializers keep the names), and each node's 'pkg.torch.onnx.fx_node' is the PyTorch call it
lowers, naming the placeholders it read.  A tied weight's calls all name one placeholder (the
signature lists its other name, unread), so it counts once; a merged one's name their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurm_horus.graph.load import TensorInfo

SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
FX_NODE = "pkg.torch.onnx.fx_node"
RULE = "pkg.onnxscript.rewriter.rule_name"

_INPUT_SPEC = re.compile(r"^(\w+): (PARAMETER|BUFFER|CONSTANT_TENSOR) target='([^']+)'", re.M)
_PLACEHOLDER = re.compile(r"%(\w+)")
_QUOTED = re.compile(r"'([^']*)'")


@dataclass
class DynamoParameters:
    constants: set[str] = field(default_factory=set)  # folded initializers that are no parameter
    unsized: list[str] = field(default_factory=list)  # parameters whose size the graph lost


def separate_parameters(graph, nodes, tensors: dict[str, TensorInfo],
                        initializers: dict[str, TensorInfo]) -> DynamoParameters:
    """Undo the dynamo exporter's merges where its metadata tells them, so that costs counts
    each PyTorch parameter once: a node whose call names a parameter it reads through another's
    initializer reads it under the parameter's own name (added to ``tensors`` and
    ``initializers``, the node's input renamed), and a Gemm whose zero bias the optimizer
    dropped gets it back.  A folded initializer is a constant unless it is the only tensor of a
    weight that has no initializer of its own (W.t() of a Linear's; a tied head's is a copy).
    A parameter still without a size (fused into a convolution, folded with constants) is listed
    in ``unsized``.  A name the graph already uses for another tensor is never taken (the
    metadata is the file's claim)."""
    meta = {p.key: p.value for p in graph.metadata_props}
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
              for m in vi.metadata_props if m.key == FOLDED_FROM}
    out = DynamoParameters()
    for name, sources in sorted(folded.items(), key=lambda kv: len(kv[1])):
        used.update(s for s in sources if s in params)
        if len(sources) == 1 and sources[0] in params and sources[0] not in sized:
            stands_for[name] = sources[0]
            sized.add(sources[0])
        else:
            out.constants.add(name)
    for node in nodes:
        node_meta = {p.key: p.value for p in node.metadata_props}
        reads = list(dict.fromkeys(targets[p] for p in _PLACEHOLDER.findall(node_meta.get(FX_NODE, ""))
                                   if p in targets))
        used.update(t for t in reads if t in params)
        pending = [t for t in reads if t in params and t not in sized]
        if not pending or any(t in tensors for t in pending):
            continue
        rule = node_meta.get(RULE)
        if rule is None:  # the node lowers the call as written: its merged inputs are the pending
            read = set(reads)  # (a list: a crafted node of 10**5 inputs and reads took minutes)
            stand_ins = [i for i, n in enumerate(node.input) if n in lifted and n in initializers
                         and n not in read and stands_for.get(n) not in read]
            if len(stand_ins) == len(pending) and len({initializers[node.input[i]] for i in stand_ins}) == 1:
                for target, i in zip(pending, stand_ins):
                    tensors[target] = initializers[target] = initializers[node.input[i]]
                    node.input[i] = target
                    sized.add(target)
        elif rule == "RemoveOptionalBiasFromGemm" and node.op_type == "Gemm" and len(pending) == 1 \
                and len(node.input) == 2 and (y := tensors.get(node.output[0])) is not None \
                and y.shape and isinstance(y.shape[-1], int):
            tensors[pending[0]] = initializers[pending[0]] = TensorInfo(y.dtype, (y.shape[-1],))
            node.input.append(pending[0])  # C broadcast along the rows: Linear's (N,) bias
            sized.add(pending[0])
    out.unsized = sorted(used - sized)
    return out
