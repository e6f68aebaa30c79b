"""Stage 2b: a graph's costs summed into a stable, versioned, named feature vector.

The vector is the predictor's input and is stored in the ledger, so its names and meaning only
change together with FEATURE_VERSION; a costing fix that changes some graphs' values only is
listed under docs/admin-guide.md's Upgrades instead (a bump refuses every site's model).
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

from slurm_horus.errors import HorusError
from slurm_horus.graph.costs import (CATEGORIES, QUANTIZED_WEIGHT_TYPES, NodeCost, is_noop_dropout,
                                     node_costs, parameter_tensors, weight_views)
from slurm_horus.graph.load import BATCH_DIM_NAMES, Graph, bodies, body_names, body_scope, load_graph
from slurm_horus.graph.limits import ANALYSIS_FILE_FACTOR, ANALYSIS_MEM_MIB, run_bounded

FEATURE_VERSION = 1
MIX_CATEGORIES = ("conv", "matmul", "attention", "rnn", "norm", "pool", "elementwise", "reduce",
                  "softmax", "data")
FEATURE_NAMES = (
    "batch_size", "flops", "params", "param_bytes", "activation_bytes", "saved_activation_bytes",
    "peak_live_bytes", "max_activation_bytes", "input_bytes", "read_bytes", "write_bytes",
    "kernels", "depth", "n_nodes", "n_unknown_ops", "arithmetic_intensity", "flops_per_kernel",
    *(f"frac_flops_{c}" for c in MIX_CATEGORIES),
    *(f"n_{c}" for c in MIX_CATEGORIES),
)
# outside the vector, in a quantized graph's values alone (FeatureReport.quantized_params): the
# ledger stores values, so an export's cold start reads them as hsubmit's did; none is 0
QUANTIZED_NAMES = ("quantized_params", "quantized_param_bytes")


@dataclass
class OpSummary:
    """Totals for one op type, for the per-op table."""

    count: int = 0
    flops: int = 0
    params: int = 0
    activation_bytes: int = 0


@dataclass
class FeatureReport:
    """Features of one model at bound dimensions, with the per-node breakdown behind them."""

    model: str
    sha256: str
    values: dict[str, float]
    nodes: list[NodeCost]
    by_op: dict[str, OpSummary]
    unknown_ops: list[str]
    unknown_dims: list[str]
    bound_dims: dict[str, int]
    missing_external_data: list[str] = field(default_factory=list)
    assumed_shapes: list[str] = field(default_factory=list)
    unused_dims: list[str] = field(default_factory=list)
    fixed_batch: list[int] = field(default_factory=list)
    shapeless: list[str] = field(default_factory=list)
    unshaped_ops: list[str] = field(default_factory=list)  # ops whose rule lacked input shapes
    single_trips: list[str] = field(default_factory=list)  # Loops and Scans costed as one iteration
    unnamed_dims: list[str] = field(default_factory=list)  # inputs' unnamed unbound sizes, INPUT[POS]
    unsized_params: list[str] = field(default_factory=list)  # a dynamo export's, graph.dynamo
    # the user's --dim bindings: what a job's record stores, so what the history keys its runs
    # by (bound_dims holds the batch's too, by name or position: "images=32" had keyed no run)
    given_dims: dict[str, int] = field(default_factory=dict)
    version: int = FEATURE_VERSION

    @property
    def quantized_params(self) -> int:
        """Of values["params"], the quantized weights (integer, FP8, FP6, FP4): frozen, as no
        framework trains them, and held at their stored size, not the job's precision."""
        return int(self.values.get("quantized_params", 0))

    @property
    def quantized_param_bytes(self) -> int:
        """Of values["param_bytes"], the quantized weights' (their stored size)."""
        return int(self.values.get("quantized_param_bytes", 0))

    def warnings(self) -> list[str]:
        """What makes these figures guesses, one line each: every command that reads a model
        prints them, since an op we cannot cost would otherwise hide a whole network's cost."""
        out = []
        if self.unknown_ops:
            out.append(f"no cost rule for {_few(self.unknown_ops)}: costed conservatively (one "
                       "FLOP per output element, inputs and outputs kept for the backward pass)")
        if self.unshaped_ops:
            out.append(f"shapes of the inputs of {_few(self.unshaped_ops)} unknown: costed at one "
                       "FLOP per output element (none where the output's shape is unknown too), so "
                       "the figures are low")
        if self.single_trips:
            out.append(f"trip count of {_few(self.single_trips)} unknown (not a constant in the "
                       "graph, or a condition that may end it sooner): its body is costed as one "
                       "iteration, so the figures are low if it runs more")
        copies = sum(n.out_bytes for n in self.nodes if n.op_type == "DequantizeLinear" and n.params)
        if copies:
            out.append(f"the float copies DequantizeLinear makes of the quantized weights "
                       f"({copies / 2**20:,.1f} MiB) are costed as activations (for --task train, "
                       "kept for the backward pass), as a job that dequantizes as the graph does "
                       "makes them: the memory predicted is high where the runtime fuses them into "
                       "the ops that read them")
        if self.assumed_shapes:
            out.append(f"shape of {_few(self.assumed_shapes)} assumed equal to its op's largest "
                       "activation input (ONNX cannot infer it)")
        if self.shapeless:
            out.append(f"shape of {len(self.shapeless)} tensor(s) unknown ({_few(self.shapeless)}): "
                       "the ops that read them cost nothing, so the figures are low")
        if self.unused_dims:
            out.append(f"--dim {_few(self.unused_dims)}: the model has no dimension of that name; "
                       "ignored")
        if self.unsized_params:
            out.append(f"parameter(s) {_few(self.unsized_params)} fused, folded or merged away by the "
                       "dynamo exporter, their size lost: the parameter count is low (export with "
                       "dynamo=False, or dynamic shapes for a folded position table)")
        if self.fixed_batch:
            out.append(f"batch size {self.values.get('batch_size')} not applied: the model's inputs "
                       f"have a fixed leading size ({', '.join(map(str, self.fixed_batch))}; "
                       "exported with a fixed batch?), so the figures are for that size")
        return out

    def require_bound(self) -> None:
        """Refuse to predict from sizes taken as 1: a sequence length left unbound would cost
        the job as one token (what hsubmit and ``horus predict`` both refuse)."""
        if self.unknown_dims:
            # an input's size without a name is ONNX's unk__N, which no --dim binds: it is
            # bound by its input's name and position (INPUT[POS], as bound_dims names it)
            named = [d for d in self.unknown_dims if not d.startswith("unk__")] + self.unnamed_dims
            if not named:  # a name an exporter gave an input's size, or ONNX a data-dependent one
                raise HorusError(f"model {self.model}: size(s) {_few(self.unknown_dims, 5)} "
                                 f"unknown: --dim {_cut(self.unknown_dims[0])}=VALUE where an input has "
                                 "it; otherwise it depends on the data (ops such as NonZero or "
                                 "Unique) and the graph alone gives no prediction")
            positional = ("; an input's unnamed dimension is INPUT[POS], its position from 0"
                          if self.unnamed_dims else "")
            raise HorusError(f"model {self.model}: dimension(s) {_few(named, 5)} unbound; "
                             f"add --dim NAME=VALUE (e.g. --dim {_cut(named[0])}=512{positional})")

    def vector(self) -> list[float]:
        return [float(self.values[n]) for n in FEATURE_NAMES]

    def to_dict(self, nodes: bool = False) -> dict:
        d = {
            "model": self.model, "sha256": self.sha256, "feature_version": self.version,
            "params": int(self.values["params"]), "flops": int(self.values["flops"]),
            "activation_bytes": int(self.values["activation_bytes"]),
            "features": dict(self.values),
            "by_op": {k: asdict(v) for k, v in self.by_op.items()},
            "unknown_ops": self.unknown_ops, "unknown_dims": self.unknown_dims,
            "bound_dims": self.bound_dims, "missing_external_data": self.missing_external_data,
            "assumed_shapes": self.assumed_shapes, "warnings": self.warnings(),
        }
        if nodes:
            d["nodes"] = [asdict(n) for n in self.nodes]
        return d


def extract_features(model: str | os.PathLike, batch_size: int | None = None,
                     dims: dict[str, int] | None = None) -> FeatureReport:
    """Load `model`, bind its dimensions and compute its feature vector, in a child process
    within bounded memory and time (a user names the file: graph.limits.run_bounded)."""
    for lib in ("numpy", "onnx"):  # imported before: the child starts warm, outside the limits
        importlib.import_module(lib)

    try:
        size = os.stat(model).st_size
    except OSError:
        size = 0  # load_graph says what is wrong with it
    report = run_bounded(str(model), lambda: features_of(load_graph(model, batch_size=batch_size, dims=dims),
                                                         batch_size),
                         report_to_dict, report_from_dict, ANALYSIS_MEM_MIB + ANALYSIS_FILE_FACTOR * (size >> 20))
    report.given_dims = dict(dims or {})
    return report


_NODE_FIELDS = [f.name for f in fields(NodeCost)]
_NODE_TUPLES = [i for i, f in enumerate(fields(NodeCost)) if str(f.type).startswith("tuple")]


def report_to_dict(report: FeatureReport) -> dict:
    """The report as JSON-ready values for report_from_dict, each node a row of NodeCost's
    fields (dataclasses.asdict copies deeply: seconds for a few 100,000 nodes)."""
    d = {f.name: getattr(report, f.name) for f in fields(report)}
    d["nodes"] = [[getattr(n, k) for k in _NODE_FIELDS] for n in report.nodes]
    d["by_op"] = {k: asdict(v) for k, v in report.by_op.items()}
    return d


def report_from_dict(d: dict) -> FeatureReport:
    """The FeatureReport of report_to_dict's ``d`` (through JSON: tuples as lists)."""
    d = dict(d)
    nodes = []
    for row in d["nodes"]:
        for i in _NODE_TUPLES:
            row[i] = tuple(row[i])
        nodes.append(NodeCost(*row))
    d["nodes"] = nodes
    d["by_op"] = {k: OpSummary(**v) for k, v in d["by_op"].items()}
    return FeatureReport(**d)


def features_of(graph: Graph, batch_size: int | None = None) -> FeatureReport:
    params = parameter_tensors(graph)
    quantized = [info for info in params.values() if info.dtype in QUANTIZED_WEIGHT_TYPES]
    views = weight_views(graph, params)
    single_trips: list[str] = []
    costs = node_costs(graph, params, views, single_trips)
    by_op: dict[str, OpSummary] = {}
    flops_by_cat: Counter = Counter()
    count_by_cat: Counter = Counter()
    for c in costs:
        s = by_op.setdefault(c.op_type, OpSummary())
        s.count += 1
        s.flops += c.flops
        s.params += c.params
        s.activation_bytes += _activation_bytes(c)
        flops_by_cat[c.category] += c.flops
        count_by_cat[c.category] += 1
    flops = sum(c.flops for c in costs)
    read = sum(c.read_bytes for c in costs)
    write = sum(c.write_bytes for c in costs)
    kernels = sum(c.kernels for c in costs)
    saved = {n for c in costs for n in c.saved}
    if batch_size is None:  # the batch-like dimension bound by --dim, if any (not a seq's)
        batch_size = next((v for k, v in graph.bound_dims.items() if BATCH_DIM_NAMES.match(k)), 1)
    values: dict[str, float] = {
        "batch_size": batch_size,
        "flops": flops,
        "params": sum(c.params for c in costs),
        "param_bytes": sum(c.param_bytes for c in costs),
        "activation_bytes": sum(_activation_bytes(c) for c in costs),
        "saved_activation_bytes": sum(_nbytes(graph, n) for n in saved)
        + sum(c.extra_saved_bytes for c in costs),
        "peak_live_bytes": peak_live_bytes(graph, set(params) | views),
        "max_activation_bytes": max((_activation_bytes(c) for c in costs), default=0),
        "input_bytes": sum(_nbytes(graph, n) for n in graph.graph_inputs),
        "read_bytes": read,
        "write_bytes": write,
        "kernels": kernels,
        "depth": graph_depth(costs),
        "n_nodes": len(costs),
        "n_unknown_ops": sum(1 for c in costs if not (c.has_rule and c.shapes_known)),
        "arithmetic_intensity": flops / max(read + write, 1),
        "flops_per_kernel": flops / max(kernels, 1),
    }
    for cat in MIX_CATEGORIES:
        values[f"frac_flops_{cat}"] = flops_by_cat[cat] / flops if flops else 0.0
        values[f"n_{cat}"] = count_by_cat[cat]
    assert set(values) == set(FEATURE_NAMES) and set(flops_by_cat) <= set(CATEGORIES)
    if quantized:
        values.update(quantized_params=sum(i.numel for i in quantized),
                      quantized_param_bytes=sum(i.nbytes for i in quantized))
    return FeatureReport(
        model=str(graph.path), sha256=graph.sha256, values=values, nodes=costs, by_op=by_op,
        unknown_ops=sorted({c.op_type for c in costs if not c.has_rule}),
        unknown_dims=graph.unknown_dims, bound_dims=graph.bound_dims,
        missing_external_data=graph.missing_external_data, assumed_shapes=graph.assumed_shapes,
        unused_dims=graph.unused_dims, shapeless=graph.shapeless, fixed_batch=graph.fixed_batch,
        unshaped_ops=sorted({c.op_type for c in costs if c.has_rule and not c.shapes_known}),
        single_trips=single_trips, unnamed_dims=graph.unnamed_dims, unsized_params=graph.unsized_params)


def _few(names: list[str], n: int = 4, width: int = 80) -> str:
    """A few names for a warning, each cut to ``width`` characters (a graph's names are its
    author's: 50 kB each had made every warning line that long)."""
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(_cut(x, width) for x in names[:n]) + more


def _cut(name: str, width: int = 80) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def _activation_bytes(c: NodeCost) -> int:
    return 0 if c.category in ("view", "shape") else c.out_bytes


def _nbytes(graph: Graph, name: str) -> int:
    info = graph.info(name)
    return info.nbytes if info else 0


def graph_depth(costs: list[NodeCost]) -> int:
    """Longest chain of kernel-launching nodes: the serial part no parallelism can hide."""
    depth: dict[str, int] = {}
    best = 0
    for cost in costs:
        d = max((depth.get(i, 0) for i in cost.inputs), default=0) + (1 if cost.kernels else 0)
        for o in cost.outputs:
            depth[o] = d
        best = max(best, d)
    return best


def peak_live_bytes(graph: Graph, weights: set[str], _reads: dict | None = None) -> int:
    """Largest total of activations alive at once in a forward pass (inference working set).

    Each tensor lives from the node that makes it to its last reader; view ops alias their input,
    and so does a Dropout that returns it (costs.is_noop_dropout), as costs counts it.
    Parameters are not counted (they are accounted separately), nor a copy or view of one
    (``weights``: the parameters and costs.weight_views, as the W.t() of an unfolded export is
    the weight, not a tensor).

    An If, Loop or Scan node keeps what its bodies read of the graph alive until it runs, and
    adds, while it runs, the largest of its bodies' own peaks (one iteration's).
    """
    alias: dict[str, str] = {}
    last_use: dict[str, int] = {}
    made = {*graph.graph_inputs, *(o for n in graph.nodes for o in n.output if o)}

    def is_init(name):  # a scope's membership tests: a body's initializers chain its graph's
        return name in graph.initializers or name in weights

    reads = {} if _reads is None else _reads  # each body's outer reads, found once for all depths
    outer_reads: dict[int, set[str]] = {}
    for step, node in enumerate(graph.nodes):
        if node.output and node.output[0] in weights:
            continue  # a parameter's copy or view: made by no kernel, alive as the parameter
        if bodies(node):
            outer_reads[step] = _outer_reads(node, reads)
        for name in (*node.input, *outer_reads.get(step, ())):
            if name and name in made and not is_init(name):
                root = alias.get(name, name)
                last_use[root] = step
        if (node.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
                or is_noop_dropout(node, graph)) and node.input and not is_init(node.input[0]):
            alias[node.output[0]] = alias.get(node.input[0], node.input[0])
    for name in graph.graph_outputs:
        last_use[alias.get(name, name)] = len(graph.nodes)
    live = sum(_nbytes(graph, n) for n in graph.graph_inputs)
    peak = live
    freed_at: dict[int, list[str]] = {}
    for name, step in last_use.items():
        freed_at.setdefault(step, []).append(name)
    for n in graph.graph_inputs:
        last_use.setdefault(n, -1)
    for step, node in enumerate(graph.nodes):
        for o in node.output:
            if o and o not in alias:
                live += _nbytes(graph, o) if o in last_use else 0
        peak = max(peak, live)
        if step in outer_reads:  # a body's working set, on top of what is alive around it
            peak = max(peak, live + max((peak_live_bytes(body_scope(graph, b), weights, reads)
                                         for _, b in bodies(node)), default=0))
        for name in freed_at.get(step, ()):
            live -= _nbytes(graph, name)
    return peak


def _outer_reads(node, memo: dict) -> set[str]:
    """The names an If's, Loop's or Scan's bodies read from the graphs around them, at any
    depth (their implicit inputs).  ``memo``: by the node's op and outputs (names are unique in
    a model), so a deep nest is walked once, not once per level above it."""
    key = (node.op_type, tuple(node.output))
    if key in memo:
        return memo[key]
    out: set[str] = set()
    for _, body in bodies(node):
        own = body_names(body)
        for inner in body.node:
            out.update(n for n in inner.input if n and n not in own)
            if bodies(inner):
                out.update(n for n in _outer_reads(inner, memo) if n not in own)
    memo[key] = out
    return out
