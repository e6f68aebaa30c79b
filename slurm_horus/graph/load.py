"""Stage 1: load an ONNX model's graph (never its weights) and give every tensor a concrete shape.

Only shapes matter for prediction, so weight data is never read: models whose weights live in
external files, whose external files are missing, or that are larger than protobuf's 2 GB limit all
load the same way. External-data locations are still checked, so a model cannot point us at files
outside its own folder.

Ops that ONNX cannot infer (custom domains, unknown ops) would leave every tensor after them
without a shape, and a whole network would cost nothing: their outputs are assumed to have the
shape and type of their largest input (listed in `Graph.assumed_shapes`), so shapes keep flowing;
onnxruntime's matrix products (GemmFloat8, MatMulNBits, FusedMatMul...), attention ops and
GatherBlockQuantized (PRODUCT_SHAPES) take their own rule's shape instead, where their inputs'
shapes tell it, and are not listed.
The rule runs inside ONNX's inference, as a schema registered for the time of the analysis, so
one pass carries shapes past every such op; where that fails, a round of inference per op does.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import math
import os
import re
import signal
import threading
from collections import ChainMap
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from slurm_horus.errors import HorusError, ModelError
from slurm_horus.graph.shapefold import FLOAT_TYPES, MAX_FOLD_ELEMENTS, _inline_array, fold_shapes

# protobuf cannot parse a message above 2 GiB; bigger models must keep weights in external files.
MAX_PROTO_BYTES = 2**31 - 1
# A dimension above this is a mistake, not a model (int32 indexing limits real kernels anyway).
MAX_DIM = 2**31 - 1
# A tensor this large (elements) cannot exist on any GPU; refuse rather than report nonsense.
MAX_TENSOR_ELEMENTS = 2**44
MAX_FOLD_ROUNDS = 4  # shape arithmetic chains resolve in a round or two; bound the work
# ONNX's shape inference is one C++ call that the analysis timer (graph.limits) cannot stop, and
# its time grows with the nodes: a cap bounds it (the largest real graph here, GPT-2 XL, has
# 10,096), so that a crafted file cannot stall hsubmit or horus-admin sync's claim checks
MAX_GRAPH_NODES = 300_000  # GPT-2 XL has 10,096; past it the answer alone would pass limits.MAX_RESULT_BYTES
# Each round of inference carries shapes past one more op it cannot infer where the schemas of
# _opaque_schemas could not be registered (and past ops waiting on folded shapes); bound the work.
MAX_SHAPE_ROUNDS = 32
# If, Loop and Scan bodies nest; protobuf's own parsing limit keeps real files far below this,
# and load_graph refuses deeper bodies whatever the parser allowed, so that the walks of bodies
# after it (costing, peak memory) need no bound of their own
MAX_SUBGRAPH_DEPTH = 64
# the top-level protobuf fields _check_framing walks before reading a file whole (a ModelProto
# has a handful: ir_version, opset_import, graph...); past them protobuf decides
MAX_FRAMING_FIELDS = 4096
# what _opaque_schemas writes on an opaque node for its inference (removed after): per input 0 an
# activation, 1 a weight, 2 absent; per output the element type to give it (0: its input's), -1
# none (no name, or a shape already declared or assumed)
OPAQUE_INPUTS_ATTR, OPAQUE_OUTPUTS_ATTR = "horus_opaque_inputs", "horus_opaque_outputs"
# ONNX's schema registry is the process's: one analysis registers its schemas at a time
_SCHEMA_LOCK = threading.Lock()
# TensorProto's integer types of 16 bits and fewer (UINT8, INT8, UINT16, INT16, UINT4, INT4, UINT2, INT2):
# a quantized model's weights, never a shape
SMALL_INT_TYPES = frozenset({2, 3, 4, 5, 21, 22, 25, 26})
BATCH_DIM_NAMES = re.compile(r"^(n|b|bs|batch|batch_?size|.*batch.*)$", re.IGNORECASE)
# a sequence or time axis: never taken for the batch by its position (nn.LSTM's and
# nn.Transformer's inputs are (seq, batch, ...) by default)
SEQUENCE_DIM_NAMES = re.compile(r"^(t|l|.*(seq|len|time|step|token|frame).*)$", re.IGNORECASE)

# ONNX TensorProto data types -> bytes per element (strings and unknown types count as 0).
DTYPE_BYTES = {
    1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8,
    14: 8, 15: 16, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1, 24: 1,
}
# the types ONNX packs below a byte (onnx.numpy_helper's _pack_4bitx2, _pack_2bitx4, _pack_6bit)
# -> bits per element: UINT4, INT4, FLOAT4E2M1 two a byte, UINT2, INT2 four, FLOAT6E2M3,
# FLOAT6E3M2 four in three bytes; a tensor of n takes ceil(n x bits / 8) bytes
PACKED_BITS = {21: 4, 22: 4, 23: 4, 25: 2, 26: 2, 27: 6, 28: 6}


@dataclass(frozen=True)
class TensorInfo:
    """Element type and shape of one tensor; a dimension is an int, or a str/None where unknown."""

    dtype: int
    shape: tuple[int | str | None, ...] | None

    @property
    def known(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @cached_property
    def numel(self) -> int:
        """Element count, treating unknown dimensions as 1 (callers check `known` when it matters)."""
        n = 1
        for d in self.shape or ():
            n *= d if isinstance(d, int) and d >= 0 else 1
        return n

    @cached_property
    def nbytes(self) -> int:
        """Bytes it takes: a packed type's (int4, float4...) the bytes its elements fill."""
        if self.dtype in PACKED_BITS:
            return -(-self.numel * PACKED_BITS[self.dtype] // 8)
        return self.numel * DTYPE_BYTES.get(self.dtype, 0)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_TYPES


@dataclass
class Graph:
    """A shape-inferred ONNX graph: nodes in topological order plus what is known of each tensor."""

    path: Path
    nodes: list  # onnx.NodeProto, topologically sorted
    tensors: dict[str, TensorInfo]
    initializers: dict[str, TensorInfo]
    graph_inputs: list[str]
    graph_outputs: list[str]
    bound_dims: dict[str, int]
    unknown_dims: list[str]
    missing_external_data: list[str] = field(default_factory=list)
    assumed_shapes: list[str] = field(default_factory=list)  # outputs of ops ONNX cannot infer,
    #                                                            shaped as their largest input
    unused_dims: list[str] = field(default_factory=list)  # --dim names the graph does not have
    fixed_batch: list[int] = field(default_factory=list)  # the inputs' fixed leading sizes, where
    #                                                      the batch size asked bound nothing
    shapeless: list[str] = field(default_factory=list)  # op outputs whose shape stayed unknown
    unnamed_dims: list[str] = field(default_factory=list)  # inputs' unnamed dynamic dimensions
    #                                                       left unbound, as INPUT[POS]
    trip_counts: dict[str, int] = field(default_factory=dict)  # Loop trip-count inputs' constant
    #                                                           values, by tensor name
    tied_heads: dict[str, bool] = field(default_factory=dict)  # see _tied_heads
    # a dynamo export's (graph.dynamo): initializers folded from weights, which are no parameter,
    # and the parameters whose size its optimizer lost
    folded_constants: set[str] = field(default_factory=set)
    unsized_params: list[str] = field(default_factory=list)
    noop_dropouts: set[str] = field(default_factory=set)  # see _noop_dropouts
    opset: int = 0
    producer: str = ""
    sha256: str = ""

    def info(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name)

    @cached_property
    def consumers(self) -> dict[str, list]:
        """Tensor name -> the nodes that read it, in order, each once (a node listing its input
        20,000 times had every walk over its readers take minutes)."""
        out: dict[str, list] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.input):
                out.setdefault(name, []).append(node)
        return out


def load_graph(path: str | os.PathLike, batch_size: int | None = None,
               dims: dict[str, int] | None = None) -> Graph:
    """Read `path`, bind symbolic dimensions and infer every tensor's shape.

    `batch_size` binds dimensions named like a batch and, in an input without one, the leading
    symbolic dimension unless named like a sequence's (see _bind_inputs); `dims` binds
    dimensions by name and wins over `batch_size`.
    """
    import onnx

    from slurm_horus.graph.dynamo import separate_parameters  # it imports TensorInfo from here

    path = Path(path)
    dims = _check_dims(batch_size, dims)
    model, sha256 = _read_model(path, onnx)
    _check_node_count(model.graph, path)
    tied = _tied_heads(model.graph)  # the last look at the weights' values
    _drop_weight_values(model)  # first: inlining copies the model, weights and all
    if model.functions:
        model = _inline_functions(model, path, onnx)
        _drop_weight_values(model)  # the functions' own Constants, now in the graph
    missing = _check_external_data(model, path.parent.resolve(), onnx)
    _densify_sparse(model.graph)  # after the check: a sparse weight's files are checked as a dense one's
    graph = model.graph
    if not graph.node:
        raise ModelError(f"{path}: the graph has no nodes")
    # Refuse cycles before any work. Folding below rewrites nodes in place into input-less
    # Constants, so this order stays valid to the end.
    nodes = _topological_order(graph, path)
    _check_static_dims(graph, path)
    positional = _positional_names(graph)
    unused = sorted(set(dims) - _symbolic_names(graph) - set(positional))
    bound, batch_bound = _bind_inputs(graph, batch_size, dims)
    # the batch size bound no dimension (whatever other dimension took the same value)
    fixed = [] if batch_size is None or batch_bound else _fixed_leading(graph)
    unnamed = [n for n in positional if n not in bound]
    _check_input_dims(graph, path)
    _bind_annotations(graph, {**bound, **dims})
    _check_nesting(graph, path, 0)  # before _shape_loops, the first walk that relies on it
    initializers = {t.name: TensorInfo(t.data_type, tuple(t.dims)) for t in graph.initializer}
    assumed: set[str] = set()
    trips = _trip_counts(graph)
    with _opaque_schemas(graph, nodes, onnx) as (opaque_nodes, opaque):
        inferred = _infer_shapes(model, path, onnx)
        tensors = _collect_tensors(inferred.graph, onnx)
        for round_ in range(MAX_SHAPE_ROUNDS):
            before = len(assumed)  # the schemas' progress counts as waiting's would
            assumed.update(n for n in opaque if n in tensors and tensors[n].shape is not None)
            known = {**tensors, **initializers}
            changed = (_assume_opaque_outputs(graph, opaque_nodes, known, assumed, onnx, wait=True)
                       or len(assumed) > before)
            if round_ < MAX_FOLD_ROUNDS and any(isinstance(d, str) or d is None
                                                for t in tensors.values() for d in t.shape or ()):
                folded = fold_shapes(model, lambda n: _known_shape(tensors, n))
                if folded:  # a trip count may be a Constant now; nothing else makes one
                    trips = _trip_counts(graph)
                changed += folded
            # Loop bodies and outputs ONNX leaves unshaped (its inference drops a loop-carried
            # value's sizes): the state keeps its initial shape
            changed += _shape_loops(graph, inferred.graph, {**tensors, **initializers}, trips)
            # stop waiting only when nothing else moved: before folding, an op whose activation
            # waited on a folded size took its weight's shape (BERT's LayerNorm a (768,) batch)
            if not changed:
                changed = _assume_opaque_outputs(graph, opaque_nodes, known, assumed, onnx, wait=False)
            if not changed:
                break
            inferred = _infer_shapes(model, path, onnx)
            tensors = _collect_tensors(inferred.graph, onnx)
    _adopt_body_types(graph, inferred.graph, 0)  # If, Loop and Scan bodies' shapes, for costing
    tensors.update(initializers)
    # a matrix product's output shaped by its own rule (PRODUCT_SHAPES) is not assumed
    assumed -= {node.output[0] for node in opaque_nodes if node.output and node.output[0] in tensors
                and (product := _node_product(node, tensors)) is not None
                and tensors[node.output[0]].shape == product.shape}
    for name, info in tensors.items():
        if any(isinstance(d, int) and d < 0 for d in info.shape or ()):
            raise ModelError(f"{path}: tensor '{name}' would have a negative dimension "
                             f"{info.shape}; the model's dimensions are not plausible")
        # over its numbered sizes: an unbound name beside three sizes of 2**31 hid them all
        if info.shape is not None and math.prod(d for d in info.shape if isinstance(d, int)) > MAX_TENSOR_ELEMENTS:
            raise ModelError(f"{path}: tensor '{name}' would have {info.numel:.3g} elements; "
                             "the model's dimensions are not plausible")
    unknown = sorted({d for t in tensors.values() for d in (t.shape or ()) if isinstance(d, str)})
    shaped_sequences = _shaped_sequences(inferred.graph)
    shapeless = [n for node in nodes for n in node.output
                 if n and (tensors.get(n) is None or tensors[n].shape is None) and n not in shaped_sequences]
    shapeless += _body_shapeless(graph, tensors)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    dynamo = separate_parameters(graph, nodes, tensors, initializers)  # after inference: it renames inputs
    return Graph(path=path, nodes=nodes, tensors=tensors, initializers=initializers,
                 graph_inputs=[i.name for i in graph.input if i.name not in initializers],
                 graph_outputs=[o.name for o in graph.output], bound_dims=bound,
                 unknown_dims=unknown, missing_external_data=missing,
                 assumed_shapes=sorted(assumed), unused_dims=unused, shapeless=shapeless,
                 fixed_batch=[] if batch_size in fixed else fixed, unnamed_dims=unnamed,
                 trip_counts=trips, tied_heads=tied, opset=opset,
                 producer=model.producer_name, sha256=sha256,
                 folded_constants=dynamo.constants, unsized_params=dynamo.unsized,
                 noop_dropouts=_noop_dropouts(graph))


def _check_dims(batch_size, dims):
    if batch_size is not None and not 1 <= batch_size <= MAX_DIM:
        raise ModelError(f"batch size must be between 1 and {MAX_DIM}, got {batch_size}")
    dims = dict(dims or {})
    for name, value in dims.items():
        if not isinstance(value, int) or not 1 <= value <= MAX_DIM:
            raise ModelError(f"dimension '{name}' must be between 1 and {MAX_DIM}, got {value}")
    return dims


def _tensor_types(tp) -> list:
    """The tensor types a TypeProto holds: its own, or its sequence's, optional's or map's
    element's (protobuf bounds the nesting)."""
    if tp.HasField("tensor_type"):
        return [tp.tensor_type]
    for kind in ("sequence_type", "optional_type"):
        if tp.HasField(kind):
            return _tensor_types(getattr(tp, kind).elem_type)
    return _tensor_types(tp.map_type.value_type) if tp.HasField("map_type") else []


def _check_static_dims(graph, path: Path) -> None:
    """A negative size written in the file is never a model: refuse it before it turns into
    negative FLOPs or bytes.  A dimension name that is not UTF-8 text (protobuf hands it over
    as bytes) was neither bound nor counted unknown, and was costed as 1."""
    for vi in (*graph.input, *graph.value_info, *graph.output):
        for tt in _tensor_types(vi.type):
            for dim in tt.shape.dim:
                if dim.HasField("dim_value") and dim.dim_value < 0:
                    raise ModelError(f"{path}: tensor '{vi.name}' has a negative dimension "
                                     f"({dim.dim_value})")
                if dim.HasField("dim_param") and not isinstance(dim.dim_param, str):
                    raise ModelError(f"{path}: tensor '{vi.name}' has a dimension name that is not "
                                     "UTF-8 text")
    for t in graph.initializer:
        if any(d < 0 for d in t.dims):
            raise ModelError(f"{path}: initializer '{t.name}' has a negative dimension "
                             f"({min(t.dims)})")


def _check_input_dims(graph, path: Path) -> None:
    """A graph input still of size zero after binding describes no job at all."""
    init_names = {t.name for t in graph.initializer}
    for inp in graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type"):
            continue  # (a sequence's element sizes are bound by name alone: no advice fits a 0 there)
        for pos, dim in enumerate(inp.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value == 0:
                raise ModelError(f"{path}: input '{inp.name}' has size 0 at dimension {pos}; "
                                 "bind it (--batch-size, --dim) or export it with a real size")


def _read_model(path: Path, onnx):
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ModelError(f"{path}: {e.strerror or e}") from None
    if not path.is_file():
        raise ModelError(f"{path}: not a regular file")
    if size == 0:
        raise ModelError(f"{path}: the file is empty")
    if size > MAX_PROTO_BYTES:
        raise ModelError(f"{path}: {size / 2**30:.1f} GiB is above protobuf's 2 GiB limit; "
                         "save the model with external data (onnx.save_model(..., "
                         "save_as_external_data=True))")
    _check_framing(path, size)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelError(f"{path}: {e.strerror or e}") from None
    try:  # parsing bytes (not onnx.load) guarantees no external file is ever opened
        model = onnx.ModelProto.FromString(data)
    except Exception as e:  # protobuf raises DecodeError and friends for non-ONNX bytes
        raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelError(f"{path}: not an ONNX model (no graph or IR version)")
    return model, hashlib.sha256(data).hexdigest()


def _varint(buf: bytes, i: int) -> tuple[int | None, int]:
    """The protobuf varint at ``buf[i:]`` and the index after it; None where it is cut off or
    longer than ten bytes."""
    value = 0
    for k in range(10):
        if i + k >= len(buf):
            return None, i
        value |= (buf[i + k] & 0x7F) << (7 * k)
        if buf[i + k] < 0x80:
            return value, i + k + 1
    return None, i


def _check_framing(path: Path, size: int) -> None:
    """Walk the file's top-level protobuf fields (their tags and lengths: a few bytes each)
    before reading it whole, and refuse it where they cannot be a message: a field number 0
    (a file of zero bytes, sparse on disk, had been read whole, 2 GB, before protobuf said so),
    an invalid wire type, or a field running past the end (a truncated copy).  Every file
    protobuf parses passes; groups, and fields past MAX_FRAMING_FIELDS, are left to it."""
    try:
        with open(path, "rb") as f:
            pos = 0
            for _ in range(MAX_FRAMING_FIELDS):
                if pos == size:
                    return
                f.seek(pos)
                head = f.read(22)  # a tag and a length: ten bytes each at most
                tag, i = _varint(head, 0)
                if tag is None or tag >> 3 == 0 or tag & 7 in (6, 7):
                    raise ModelError(f"{path}: not a readable ONNX model (no protobuf field at byte {pos})")
                wire = tag & 7
                if wire in (3, 4):
                    return  # a group: protobuf decides
                if wire in (0, 2):
                    value, i = _varint(head, i)
                    if value is None:
                        raise ModelError(f"{path}: not a readable ONNX model (a field at byte {pos} "
                                         "is cut off)")
                    pos += i + (value if wire == 2 else 0)
                else:
                    pos += i + (8 if wire == 1 else 4)
                if pos > size:
                    raise ModelError(f"{path}: not a readable ONNX model (a field runs past the end "
                                     "of the file: truncated?)")
    except OSError as e:
        raise ModelError(f"{path}: {e.strerror or e}") from None


def _check_node_count(graph, path: Path) -> None:
    """Refuse a graph of more than MAX_GRAPH_NODES nodes, its subgraphs' included, before any
    inference (no real model comes near it)."""
    left = MAX_GRAPH_NODES
    for g in _graphs(graph):
        if any(not isinstance(n.op_type, str) or not isinstance(n.domain, str) for n in g.node):
            raise ModelError(f"{path}: not a valid ONNX model (an op type or domain is not UTF-8 text)")
        left -= len(g.node)
        if left < 0:
            raise ModelError(f"{path}: the graph has more than {MAX_GRAPH_NODES:,} nodes (subgraphs "
                             "included); no real model has as many, so it is not analysed")


def _inline_functions(model, path: Path, onnx):
    """The model with its local functions' bodies in place of their calls: an op ONNX has no
    schema for is costed as an opaque one, and a call of a two-layer function had cost its
    output's size (2048x low); refused beyond MAX_GRAPH_NODES nodes once inlined."""
    if not model.functions:
        return model
    bodies = {(f.domain, f.name): f for f in model.functions}
    graph_types = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    for f in model.functions:
        if any(a.ref_attr_name and a.type in graph_types for n in _nested_nodes(f.node) for a in n.attribute):
            # the inliner copies the caller's graph into every such use: its size is the call's,
            # not the function's, and no exporter writes one
            raise ModelError(f"{path}: local function {f.name!r} takes a graph from its caller "
                             "(a graph attribute reference); such a model is not analysed")
    sizes: dict = {}

    def size(key, seen=()):  # nodes a call expands to (a recursive function: not plausible)
        if key in seen:
            raise ModelError(f"{path}: local function {key[1]!r} calls itself")
        if key not in sizes:
            sizes[key] = sum(size((n.domain, n.op_type), (*seen, key)) if (n.domain, n.op_type) in bodies
                             else 1 for n in _nested_nodes(bodies[key].node))
            if sizes[key] > MAX_GRAPH_NODES:
                raise ModelError(f"{path}: the graph has more than {MAX_GRAPH_NODES:,} nodes once its "
                                 "functions are inlined; no real model has as many")
        return sizes[key]
    total = sum(size((n.domain, n.op_type)) if (n.domain, n.op_type) in bodies else 1
                for n in _nested_nodes(model.graph.node))
    if total > MAX_GRAPH_NODES:
        raise ModelError(f"{path}: the graph has more than {MAX_GRAPH_NODES:,} nodes once its "
                         "functions are inlined; no real model has as many")
    _align_function_opsets(model, bodies, onnx)
    try:
        import onnx.inliner

        return onnx.inliner.inline_local_functions(model)
    except Exception as e:
        raise ModelError(f"{path}: its local functions cannot be inlined ({type(e).__name__})") from None


def _tied_heads(graph) -> dict[str, bool]:
    """For each inline 2-D floating-point initializer of ``graph`` shaped like the transpose of
    an inline embedding table (a Gather's, (V, D) with V != D), whether its values are exactly
    the table's transposed: a tied head as constant folding leaves it, which
    costs._folded_tied_embeddings could only guess at from its bias (a tied head with a bias
    counted twice, an untied one without counted once).  Absent where the values are not in
    the file (external, stripped), or the table is one value repeated (a placeholder says
    nothing).  Each tensor is read and hashed alone, a table's transpose a slice at a time:
    one tensor's copy at most is held (protobuf hands raw_data over as a copy)."""
    inits = {t.name: t for t in graph.initializer}
    tables: dict[tuple, list] = {}  # (data type, *a head's shape) -> the tables it may be tied to
    for name in {n.input[0] for n in graph.node if n.op_type == "Gather" and n.input}:
        t = inits.get(name)
        if t is not None and t.data_type in FLOAT_TYPES and len(t.dims) == 2 and t.dims[0] != t.dims[1]:
            tables.setdefault((t.data_type, t.dims[1], t.dims[0]), []).append(t)
    out, digests = {}, {}
    for head in graph.initializer:
        key = (head.data_type, *head.dims)
        if key not in tables:
            continue
        if key not in digests:  # the tables' transposes, digested once a head needs them
            digests[key] = [_digest(t, transpose=True) for t in tables[key]]
        mine = _digest(head)
        if mine is not None and (mine in digests[key] or None not in digests[key]):
            out[head.name] = mine in digests[key]
    return out


def _digest(t, transpose: bool = False) -> bytes | None:
    """SHA-256 of a 2-D tensor's values (its transpose's) in row order; None where they are not
    in the file, or (``transpose``: an embedding table) are one value repeated."""
    import numpy as np
    from onnx import numpy_helper

    if t.data_location == 1:  # external: never read (nor, by to_array, opened)
        return None
    try:
        a = numpy_helper.to_array(t)
    except Exception:  # no data (stripped weights), or malformed
        return None
    if not a.size:
        return None
    rows = a.T if transpose else a
    step = max(1, (1 << 20) // max(rows.shape[1], 1))  # a slice of about a million values
    h, varies = hashlib.sha256(), not transpose
    for i in range(0, rows.shape[0], step):
        part = np.ascontiguousarray(rows[i:i + step])
        varies = varies or bool((part != a.flat[0]).any())
        h.update(part.view(np.uint8))
    return h.digest() if varies else None


def _align_function_opsets(model, bodies: dict, onnx) -> None:
    """Give each local function importing another version of the ONNX domain than the model's
    the model's, where every ONNX op it calls (its branches' too) has the same definition at
    both versions: it then means the same thing at either.  ONNX's inliner leaves a call of a
    function of another version as it is (an opaque op: a function of two MatMuls cost 8 FLOPs
    instead of 256), and its version converter is not for files users name."""
    version = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)
    if version is None:
        return
    for f in model.functions:
        imports = [o for o in f.opset_import if o.domain in ("", "ai.onnx") and o.version != version]
        if not imports:
            continue
        ops = {n.op_type for n in _nested_nodes(f.node)
               if n.domain in ("", "ai.onnx") and (n.domain, n.op_type) not in bodies}
        try:
            same = all(onnx.defs.get_schema(op, o.version, "").since_version
                       == onnx.defs.get_schema(op, version, "").since_version for op in ops for o in imports)
        except Exception:  # an op ONNX does not know, or a version that is none
            same = False
        if same:
            for o in imports:
                o.version = version


def _drop_weight_values(model) -> None:
    """Forget the values of tensors too large to fold that no shape comes from, keeping their
    type and dims: floating-point ones (weights), small integers (a quantized model's
    weights: a 200 MB int8 model had peaked at 1 GB, over its memory bound when larger) and
    int32/int64 ones of rank 2 or more; every round of shape inference had copied the whole
    model, weights included.  An int32/int64 vector is kept: ONNX's data propagation may
    slice it into a shape."""
    fields = ("raw_data", "float_data", "int32_data", "int64_data", "double_data")
    for tensor in _all_tensors(model.graph):
        if tensor.data_location == 1 or math.prod(tensor.dims) <= MAX_FOLD_ELEMENTS:
            continue
        if (tensor.data_type in FLOAT_TYPES or tensor.data_type in SMALL_INT_TYPES
                or (tensor.data_type in (6, 7) and len(tensor.dims) >= 2)):  # INT32, INT64
            for f in fields:
                tensor.ClearField(f)


def _subgraphs(node):
    """The graphs a node holds in its attributes (If's branches, Loop's and Scan's bodies)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _graphs(graph):
    """The graph, then every subgraph in it, at any depth."""
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _nested_nodes(nodes):
    """The nodes, each followed by those of its subgraphs (If, Loop, Scan bodies), at any depth:
    a function body's branches call functions too."""
    for node in nodes:
        yield node
        for sub in _subgraphs(node):
            yield from _nested_nodes(sub.node)


def _all_tensors(graph):
    """Every TensorProto in the graph: initializers (sparse ones' values and indices too),
    Constant values and subgraphs."""
    for g in _graphs(graph):
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in g.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                for sparse in (*([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []),
                               *attr.sparse_tensors):
                    yield from (sparse.values, sparse.indices)


def _densify_sparse(graph) -> None:
    """Each sparse initializer (a pruned weight, stored as values and indices) as a dense
    initializer of its full shape, without values (none is ever read): ONNX's inference gave
    what reads it no shape, and it was no parameter.  Its files were checked already
    (_check_external_data); a dense initializer of the same name wins."""
    for g in _graphs(graph):
        if not g.sparse_initializer:
            continue
        dense = {t.name for t in g.initializer}
        for sparse in g.sparse_initializer:
            name = sparse.values.name
            if name and name not in dense:
                t = g.initializer.add()
                t.name, t.data_type = name, sparse.values.data_type
                t.dims.extend(sparse.dims)
                dense.add(name)
        g.ClearField("sparse_initializer")


def _check_external_data(model, folder: Path, onnx) -> list[str]:
    """Refuse external-data locations outside the model's folder; list the files that are absent.

    The files are never opened: their existence is all we look at.
    """
    missing = set()
    checked: set[str] = set()  # most tensors share one data file: resolve each location once
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        locations = [e.value for e in tensor.external_data if e.key == "location"]
        if len(locations) > 1:  # ONNX's reader takes the last, this check had the first
            raise ModelError(f"tensor '{tensor.name}': {len(locations)} external-data locations; "
                             "refusing it")
        location = locations[0] if locations else ""
        if not isinstance(location, str):  # not UTF-8: protobuf hands it over as bytes
            raise ModelError(f"tensor '{tensor.name}': external-data path {location[:80]!r} is not "
                             "UTF-8 text; refusing it")
        if location in checked:
            continue
        try:
            target = (folder / location).resolve() if "\0" not in location else None
        except (OSError, ValueError, RuntimeError):  # too long, a symlink loop
            target = None
        if (target is None or not location or os.path.isabs(location)
                or ".." in Path(location).parts or not target.is_relative_to(folder)):
            raise ModelError(f"tensor '{tensor.name}': external-data path '{location}' points "
                             "outside the model's folder; refusing it")
        checked.add(location)
        try:
            exists = target.exists()
        except (OSError, ValueError):
            exists = False
        if not exists:
            missing.add(location)
    return sorted(missing)


def _topological_order(graph, path: Path) -> list:
    """Nodes in dependency order; a cycle is an error, never an infinite loop.

    Exporters write nodes in order already, so the file's order is kept where it is valid;
    otherwise Kahn's algorithm runs, preferring file order among ready nodes.
    """
    import heapq

    producers = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if out:
                producers.setdefault(out, i)
    if all(producers.get(n, -1) < i for i, node in enumerate(graph.node) for n in node.input):
        return list(graph.node)
    consumers: dict[int, list[int]] = {}
    indegree = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        for name in {n for n in node.input if n in producers}:
            consumers.setdefault(producers[name], []).append(i)
            indegree[i] += 1
    heap = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        i = heapq.heappop(heap)
        order.append(i)
        for j in consumers.get(i, ()):
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(heap, j)
    if len(order) != len(graph.node):
        stuck = next(graph.node[i] for i, d in enumerate(indegree) if d > 0)
        raise ModelError(f"{path}: the graph has a cycle (through node "
                         f"'{stuck.name or stuck.op_type}')")
    return [graph.node[i] for i in order]


def _symbolic_names(graph) -> set[str]:
    """The symbolic dimension names of the graph's inputs and annotated tensors (a sequence's
    elements' too): what --dim can bind (a name outside them is a typo the user should hear of)."""
    return {d.dim_param for vi in (*graph.input, *graph.value_info, *graph.output)
            for tt in _tensor_types(vi.type) for d in tt.shape.dim if d.HasField("dim_param")}


def _positional_names(graph) -> list[str]:
    """The inputs' dynamic dimensions that have no name (neither a size nor a dim_param: ONNX's
    inference calls them unk__N, a name no --dim can bind), as INPUT[POS], the name --dim
    binds them by and bound_dims reports them under."""
    init_names = {t.name for t in graph.initializer}
    return [f"{inp.name}[{pos}]" for inp in graph.input if inp.name not in init_names
            for tt in _tensor_types(inp.type) for pos, d in enumerate(tt.shape.dim)
            if not d.HasField("dim_param") and not (d.HasField("dim_value") and d.dim_value > 0)]


def _bind_inputs(graph, batch_size, dims) -> tuple[dict[str, int], bool]:
    """Write the user's values into the graph inputs' symbolic dimensions (in place); returns
    them by name (an unnamed one as INPUT[POS], the name ``dims`` may give it too), and whether
    a batch dimension (named like one, or taken by position) was bound.

    The batch size binds every dimension named like a batch, wherever it is, and a tensor
    input's leading one by position only where no input holds it beside a batch-named one and
    its name is not a sequence's (a (seq, batch, d) input had its seq costed at the batch
    size).  A sequence's (or optional's) elements are bound by name alone: their leading
    dimension may as well be the sequence's length as a batch."""
    init_names = {t.name for t in graph.initializer}
    inputs = [(inp, [(p, d, d.dim_param if d.HasField("dim_param") else None)
                     for tt in _tensor_types(inp.type) for p, d in enumerate(tt.shape.dim)])
              for inp in graph.input if inp.name not in init_names]
    batch_named = {inp.name: next((p for p, _, n in ds if n and BATCH_DIM_NAMES.match(n)), None)
                   for inp, ds in inputs}
    beside_batch = {n for inp, ds in inputs if batch_named[inp.name] is not None for _, _, n in ds}
    # the leading dimensions taken for the batch by position: by name, or unnamed by place
    by_position = {n or (inp.name, 0) for inp, ds in inputs if inp.type.HasField("tensor_type")
                   and batch_named[inp.name] is None for _, _, n in ds[:1]
                   if not (n and (n in beside_batch or SEQUENCE_DIM_NAMES.match(n)))}
    bound, batch_bound = {}, False
    for inp, ds in inputs:
        for pos, dim, name in ds:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue  # a static size; 0 means unknown to some exporters, bound below
            value = dims.get(name or f"{inp.name}[{pos}]")
            is_batch = bool(name and BATCH_DIM_NAMES.match(name)) or (name or (inp.name, pos)) in by_position
            if value is None and batch_size is not None and is_batch:
                value = batch_size
            elif (value is not None and batch_size is not None and value != batch_size
                  and pos == batch_named[inp.name]):
                # the graph would be costed at one and the job's workload record say the other
                raise ModelError(f"--dim {name}={value} contradicts --batch-size {batch_size}")
            if value is not None:
                dim.dim_value = value  # clears dim_param (oneof)
                bound[name or f"{inp.name}[{pos}]"] = value
                batch_bound = batch_bound or is_batch
    return bound, batch_bound


def _fixed_leading(graph) -> list[int]:
    """The fixed leading sizes of the graph's inputs (a model exported with a fixed batch)."""
    init_names = {t.name for t in graph.initializer}
    out = set()
    for inp in graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type"):
            continue
        dims = inp.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            out.add(int(dims[0].dim_value))
    return sorted(out)


def _bind_annotations(graph, values: dict[str, int]) -> None:
    """Exporters annotate intermediate tensors with the same symbolic names: bind those too,
    and forget symbolic expressions (e.g. 'Min(512, seq)') so inference can recompute them;
    in If, Loop and Scan bodies their inputs' too (a body's own 'batch' had stayed a name)."""
    for i, g in enumerate(_graphs(graph)):
        for vi in (*(g.input if i else ()), *g.value_info, *g.output):
            _bind_dims(vi, values)


def _bind_dims(vi, values: dict[str, int]) -> None:
    for dim in (d for tt in _tensor_types(vi.type) for d in tt.shape.dim):
        if dim.HasField("dim_param"):
            if dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]
            else:
                dim.Clear()


def _assume_opaque_outputs(graph, opaque, tensors: dict[str, TensorInfo], assumed: set[str],
                           onnx, wait: bool) -> int:
    """Give each shapeless output of an op ONNX has no schema for (``opaque``, in topological
    order) the shape and type of the op's largest activation input, once every size of those is
    a number (a weight only for an op that reads no activation: fused Attention or FastGelu had
    taken their weight's shape, and every MatMul after them cost 0); ``wait=False`` (when
    nothing else moved: a fold may still settle a size) takes the largest input with a shape so
    far instead, symbolic sizes included, activations first (weights first, when an activation
    had only symbolic sizes, gave BERT's LayerNorm its weight's (768,) at a symbolic sequence
    length).  A matrix product of PRODUCT_SHAPES gives its first output its own shape instead,
    where its inputs' shapes tell it.  Written into `graph.value_info` for the next inference
    (where it stays); returns how many."""
    declared = {vi.name: vi for vi in (*graph.value_info, *graph.output)}
    weights = {t.name for t in graph.initializer}
    count = 0
    for node in opaque:
        inputs = [n for n in node.input if n and n not in weights] or [n for n in node.input if n]
        if wait:  # every size a number: a later fold may still settle a symbolic one
            known = [tensors[n] for n in inputs if n in tensors and tensors[n].known]
            if len(known) < len(inputs):
                continue
        else:
            known = ([tensors[n] for n in inputs if n in tensors and tensors[n].shape is not None]
                     or [tensors[n] for n in node.input if n in tensors and tensors[n].shape is not None])
        if not known:
            continue  # a later round may know the rest
        largest = max(known, key=lambda info: info.nbytes)
        product = _node_product(node, tensors)
        for index, name in enumerate(node.output):
            info = tensors.get(name)
            if not name or (info is not None and info.shape is not None):
                continue
            given = product if index == 0 and product is not None else largest
            dtype = info.dtype if info is not None and info.dtype else given.dtype or largest.dtype
            vi = declared.get(name) or graph.value_info.add()
            vi.CopyFrom(onnx.helper.make_tensor_value_info(name, dtype, given.shape))
            tensors[name] = TensorInfo(dtype, given.shape)  # the next op in this pass sees it
            assumed.add(name)
            count += 1
            for attr in node.attribute:  # declared now: _infer_opaque leaves it
                if attr.name == OPAQUE_OUTPUTS_ATTR:
                    attr.ints[index] = -1
    return count


def _gemm_shape(attr, shapes, types, b_index=1) -> tuple | None:
    """Gemm's [M, N]: of A [M, K] and B [K, N] (input ``b_index``), each transposed by its
    attribute (transA, transB)."""
    a, b = shapes[0], shapes[b_index] if len(shapes) > b_index else None
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    return (a[1] if attr("transA") else a[0], b[0] if attr("transB") else b[1])


def _matmul_shape(attr, shapes, types) -> tuple | None:
    """MatMul's shape (numpy's matmul) of A and B of two dimensions or more, the last two of
    either transposed by transA, transB; FusedMatMul's transBatchA, transBatchB are not ruled."""
    a, b = shapes[0], shapes[1] if len(shapes) > 1 else None
    if a is None or b is None or min(len(a), len(b)) < 2 or attr("transBatchA") or attr("transBatchB"):
        return None
    batch = []
    for x, y in itertools.zip_longest(reversed(a[:-2]), reversed(b[:-2]), fillvalue=1):
        # a size of 1 stretches to the other; a number names a size the other must have
        batch.append(y if x == 1 else x if y == 1 or x == y or isinstance(x, int)
                     else y if isinstance(y, int) else None)
    return (*reversed(batch), a[-1] if attr("transA") else a[-2], b[-2] if attr("transB") else b[-1])


def _n_shape(attr, shapes, types) -> tuple | None:
    """A [..., K] times the weight [K, N] packed as the op packs it: A's shape, its last size
    the attribute N."""
    n = attr("N")
    return None if not shapes[0] or n is None or not 0 < n <= MAX_DIM else (*shapes[0][:-1], n)


def attention_dims(op: str, attr, shapes) -> tuple[int, int, int, int, int, int] | None:
    """(batch, heads, query length, key length, query and key head size, value head size) of
    one of onnxruntime's attention ops, from ``attr`` (an int attribute by name) and its
    inputs' sizes (ints; None where absent or unknown), laid out as its contrib op docs say:
    Attention's input [B, S, D] and packed QKV weight [D, 3·N·H] (a past [2, B, N, P, H]
    ahead of its keys); otherwise a query [B, S, N·H], [B, N, S, H] or QKV packed
    [B, S, N, 3, H] (GroupQueryAttention's [B, S, (N + 2·kv_num_heads)·H] where it has no
    key), keys and values [B, L, N·H] (kv_num_heads heads for GroupQueryAttention),
    [B, N, L, H] or KV packed [B, L, N, 2, H], and MultiHeadAttention's, GroupQueryAttention's
    or DecoderMaskedMultiHeadAttention's past keys [B, N, P, H] ahead of them
    (DecoderMaskedMultiHeadAttention's QKV packed [B, 1, 3·N·H] where it has no key).  ONNX's
    own Attention (opset 23: a key [B, L, kv_num_heads·H] or [B, kv_num_heads, L, H], its query
    of q_num_heads) shares its name with onnxruntime's and reads as MultiHeadAttention, its past
    keys always ahead.  None for another layout."""
    heads = max(attr("num_heads") or 1, 1)
    q, k, v = (shapes[i] if len(shapes) > i else None for i in range(3))
    onnx_own = op == "Attention" and k is not None and len(k) in (3, 4)
    if onnx_own:
        heads = max(attr("q_num_heads") or 1, 1)
    elif op == "Attention":
        past = shapes[4] if len(shapes) > 4 and shapes[4] is not None and len(shapes[4]) == 5 else None
        if q is None or len(q) != 3 or k is None or len(k) != 2:
            return None
        head = k[1] // 3 // heads
        return q[0], heads, q[1], q[1] + (past[3] if past else 0), head, head
    kv_heads = max(attr("kv_num_heads") or heads, 1) if op == "GroupQueryAttention" or onnx_own else None
    if q is None or len(q) not in (3, 4, 5):
        return None
    if len(q) == 5:  # QKV packed
        batch, sq, heads, dq = q[0], q[1], max(q[2], 1), q[4]
    elif len(q) == 4:
        batch, heads, sq, dq = q[0], max(q[1], 1), q[2], q[3]
    else:
        packed = {"GroupQueryAttention": heads + 2 * (kv_heads or 0),
                  "DecoderMaskedMultiHeadAttention": 3 * heads}.get(op) if k is None else None
        batch, sq, dq = q[0], q[1], q[2] // (packed or heads)
    skv, dv = sq, dq
    if k is not None and len(k) in (3, 4, 5):
        skv = k[2] if len(k) == 4 else k[1]
        dv = k[4] if len(k) == 5 else dv  # KV packed
    if v is not None and len(v) in (3, 4):
        dv = v[3] if len(v) == 4 else v[2] // (kv_heads or heads)
    past_at = 4 if onnx_own else {"MultiHeadAttention": 6, "GroupQueryAttention": 3,
                                  "DecoderMaskedMultiHeadAttention": 5}.get(op)
    past = shapes[past_at] if past_at is not None and len(shapes) > past_at else None
    if past is not None and len(past) == 4 and (onnx_own or k is None or len(k) != 4):
        skv += past[2]
    return batch, heads, sq, skv, dq, dv


def _gather_block_shape(attr, shapes, types) -> tuple | None:
    """GatherBlockQuantized's: Gather's (data's sizes before gather_axis, the indices', data's
    after it), a uint8 table's last size unpacked to its 8 / bits values a byte (an int4 or
    uint4 table's sizes are its values')."""
    data, indices = shapes[0], shapes[1] if len(shapes) > 1 else None
    axis, bits = attr("gather_axis") or 0, attr("bits") or 4
    if data is None or indices is None or not -len(data) <= axis < len(data):
        return None
    axis %= len(data)
    out = [*data[:axis], *indices, *data[axis + 1:]]
    if types[0] == 2 and axis < len(data) - 1:  # UINT8: packed along its last axis
        if bits not in (2, 4, 8) or not isinstance(out[-1], int):
            return None
        out[-1] *= 8 // bits
    return tuple(out)


def _attention_shape(attr, shapes, types, op: str) -> tuple | None:
    """An attention op's output, [B, S, N·H] of its values' heads (attention_dims): its largest
    input's had been a QKV packed query's ([B, S, (N + 2·kv_num_heads)·H] for
    GroupQueryAttention) or a [B, N, L, H] key cache's, and the projection after it had no shape."""
    q = shapes[0]
    if any(shapes[i] is None and types[i] for i in (1, 2) if i < len(shapes)):
        return None  # a key or value without a shape yet, not an absent one
    dims = attention_dims(op, attr, [None if s is None else tuple(d if isinstance(d, int) else 0 for d in s)
                                     for s in shapes])  # 0: a size no width is made of
    if q is None or len(q) not in (3, 5) or dims is None or not dims[1] * dims[5] > 0 \
            or len(q) == 5 and not isinstance(q[2], int):  # (a packed query's unbound heads: not 1)
        return None
    return q[0], q[1], dims[1] * dims[5]


# onnxruntime's contrib ops (com.microsoft), which ONNX has no schema for: the shape of their
# output from (an int attribute by name, the inputs' shapes, their element types); the largest
# input's (A's [M, K]) cost a GemmFloat8 2·M·K·K and misshaped every op after it, and a
# GatherBlockQuantized's indices' gave an embedding lookup no hidden size
def _as_a(attr, shapes, types) -> int:
    return types[0]  # A's element type


def _float(attr, shapes, types) -> int:
    return 1  # FLOAT: an integer product given back as float


def _gemm8_type(attr, shapes, types) -> int:
    return attr("dtype") or 1  # its dtype attribute, FLOAT by default


def _qgemm_type(attr, shapes, types) -> int:
    return 1 if len(shapes) <= 7 or shapes[7] is None else types[0]  # FLOAT without y_scale, else A's


def _scales_type(attr, shapes, types) -> int:
    return types[2] if len(types) > 2 else 0  # a dequantized value's: its scales'


# (its output's shape, its element type: 0 where unknown) from (an int attribute by name, the
# inputs' shapes, their element types: 0 where unknown); a float product typed as its integer
# input had failed the next op's inference
PRODUCT_SHAPES = {
    "GemmFloat8": (_gemm_shape, _gemm8_type), "FusedGemm": (_gemm_shape, _as_a),
    "QGemm": (functools.partial(_gemm_shape, b_index=3), _qgemm_type),  # A, a_scale, a_zp, B, ...
    "FusedMatMul": (_matmul_shape, _as_a), "MatMulIntegerToFloat": (_matmul_shape, _float),
    "DynamicQuantizeMatMul": (_matmul_shape, _float),
    "MatMulNBits": (_n_shape, _as_a), "MatMulBnb4": (_n_shape, _as_a),
    "GatherBlockQuantized": (_gather_block_shape, _scales_type),  # data, indices, scales, zp
    **{op: (functools.partial(_attention_shape, op=op), _as_a)
       for op in ("MultiHeadAttention", "GroupQueryAttention", "DecoderMaskedMultiHeadAttention")},
}


def _product_rule(op: str, domain: str):
    """The PRODUCT_SHAPES rule of an op of ``domain`` (as _schema_domain names it), else None."""
    return PRODUCT_SHAPES.get(op) if domain == "com.microsoft" else None


def _int_value(attr) -> int | None:
    """An AttributeProto's integer (None for another kind, or no attribute)."""
    return attr.i if attr is not None and attr.type == attr.INT else None


def int_attr_reader(attrs: dict):
    """The ``attr`` callable that attention_dims and the PRODUCT_SHAPES rules take: an int
    attribute by name from a node's ``attrs`` ({name: AttributeProto}), None where it is
    absent or not an integer."""
    return lambda name: _int_value(attrs.get(name))


def _product_output(rule, attr, inputs: list) -> TensorInfo | None:
    """What ``rule`` (of PRODUCT_SHAPES, or None) makes of an op's first output, from ``attr``
    (an int attribute by name) and its inputs (None where unknown): its shape, and its
    element type where the rule knows it (else 0: the largest input's); None where the rule
    cannot tell."""
    shapes = [None if i is None else i.shape for i in inputs]
    types = [0 if i is None else i.dtype for i in inputs]
    shape = rule[0](attr, shapes, types) if rule is not None and shapes else None
    if shape is None:
        return None
    dtype = rule[1](attr, shapes, types)
    return TensorInfo(dtype if dtype in DTYPE_BYTES or dtype in PACKED_BITS else 0, shape)


def _node_product(node, tensors) -> TensorInfo | None:
    """_product_output for ``node``, its inputs as ``tensors`` has them."""
    attrs = {a.name: a for a in node.attribute}
    return _product_output(_product_rule(node.op_type, _schema_domain(node)),
                           int_attr_reader(attrs), [tensors.get(n) for n in node.input])


def _schema_domain(node) -> str:
    """The node's domain as ONNX's schema registry names it ("ai.onnx" is "")."""
    return "" if node.domain == "ai.onnx" else node.domain


def _is_opaque(node, onnx) -> bool:
    """An op ONNX has no schema for (a custom domain's, or unknown)."""
    return not onnx.defs.has(node.op_type, _schema_domain(node))


@contextmanager
def _opaque_schemas(graph, nodes, onnx):
    """For the body: the nodes (of ``nodes``, in order) of ops ONNX has no schema for, and a
    schema for each such op whose inference applies the rule of _assume_opaque_outputs as ONNX
    reaches the op, so that one pass carries shapes past every such op (a round per op stopped
    after MAX_SHAPE_ROUNDS, and a graph with a custom op per layer lost its last layers).
    Yields (those nodes, the names of the outputs the schemas may shape); registers nothing (the
    rounds alone then) where ONNX cannot take a schema from Python.  The registry is the
    process's, so the lock spans finding the ops to registering and removing them, and the
    analysis timer's signal waits while they are (re)moved: a schema left behind would make the
    op known to every later analysis of the process.  extract_features runs each analysis in
    a child process of its own anyway."""
    defs = onnx.defs
    with _SCHEMA_LOCK:
        opaque = [n for n in nodes if _is_opaque(n, onnx)]
        # the schemas serve the ops in If, Loop and Scan bodies as well (the rounds do not):
        # one there left the op's outputs, and everything after it, without a shape
        graphs = list(_graphs(graph))
        inner = [n for g in graphs[1:] for n in g.node if _is_opaque(n, onnx)]
        ours = (OPAQUE_INPUTS_ATTR, OPAQUE_OUTPUTS_ATTR)
        for node in (*opaque, *inner):  # a model's own attribute of these names would be read as ours
            _drop_attributes(node, ours)
        if not (opaque or inner) or not hasattr(defs, "register_schema"):
            yield opaque, set()
            return

        def scope(gs):  # the weights and declared types a node of these graphs may read
            return ({t.name for g in gs for t in g.initializer},
                    {vi.name: vi.type.tensor_type for g in gs for vi in (*g.value_info, *g.output)
                     if vi.type.HasField("tensor_type")})
        # the graph's own names for its nodes; a body reads the graphs' around it too (a
        # body's names never shadow the graph's for the graph's own nodes)
        scopes = [scope(graphs[:1])] * len(opaque) + [scope(graphs)] * len(inner)
        names: set[str] = set()
        ints = onnx.AttributeProto.INTS
        for k, (node, (weights, shaped)) in enumerate(zip((*opaque, *inner), scopes)):
            codes = []
            for name in node.output:
                tt = shaped.get(name)
                codes.append(-1 if not name or (tt is not None and tt.HasField("shape")) else
                             tt.elem_type if tt is not None else 0)
                if codes[-1] >= 0 and k < len(opaque):  # the graph's tensors, not a body's
                    names.add(name)
            kinds = [2 if not n else int(n in weights) for n in node.input]
            node.attribute.extend([onnx.helper.make_attribute(OPAQUE_INPUTS_ATTR, kinds, attr_type=ints),
                                   onnx.helper.make_attribute(OPAQUE_OUTPUTS_ATTR, codes, attr_type=ints)])
        ops = sorted({(n.op_type, _schema_domain(n)) for n in (*opaque, *inner)})
        registered: list[tuple[str, str]] = []
        try:
            with _alarm_held():
                try:
                    for op, domain in ops:
                        defs.register_schema(_opaque_schema(defs, op, domain))
                        registered.append((op, domain))
                except Exception:  # noqa: BLE001 - an older ONNX, or the name taken: the rounds
                    names = set()
                    _deregister(defs, registered)
            yield opaque, names
        finally:
            with _alarm_held():
                _deregister(defs, registered)
                for node in (*opaque, *inner):
                    _drop_attributes(node, ours)


def _opaque_schema(defs, op: str, domain: str):
    """A schema for ``op`` of ``domain`` taking and giving any tensors, inferred by _infer_opaque."""
    any_type = [f"tensor({t})" for t in ("float", "float16", "bfloat16", "double", "int8", "int16", "int32",
                                         "int64", "uint8", "uint16", "uint32", "uint64", "bool", "string")]
    variadic = dict(param_option=defs.OpSchema.FormalParameterOption.Variadic, is_homogeneous=False)
    schema = defs.OpSchema(op, domain, 1, inputs=[defs.OpSchema.FormalParameter("in", "T", **variadic)],
                           outputs=[defs.OpSchema.FormalParameter("out", "T", **variadic)],
                           type_constraints=[("T", any_type, "")])
    schema.set_type_and_shape_inference_function(
        functools.partial(_infer_opaque, rule=_product_rule(op, domain)))
    return schema


def _deregister(defs, registered: list[tuple[str, str]]) -> None:
    """Remove every schema of ``registered`` (emptied), even when one removal fails."""
    failed = None
    while registered:
        op, domain = registered.pop()
        try:
            defs.deregister_schema(op, 1, domain)
        except BaseException as e:  # noqa: BLE001 - the others go all the same
            failed = failed or e
    if failed is not None:
        raise failed


def _drop_attributes(node, names: tuple[str, ...]) -> None:
    kept = [a for a in node.attribute if a.name not in names]
    if len(kept) != len(node.attribute):
        del node.attribute[:]
        node.attribute.extend(kept)


@contextmanager
def _alarm_held():
    """The analysis timer's SIGALRM held back for the body (it raises wherever it lands)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # the timer runs on the main thread only (graph.limits)
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _infer_opaque(ctx, rule=None) -> None:
    """ONNX's inference of an opaque op (_opaque_schemas): as _assume_opaque_outputs gives them,
    once every activation input has a shape (a weight's where the op reads none), its first
    output the shape ``rule`` (a PRODUCT_SHAPES rule) gives, and every other output the shape
    of the largest activation input; nothing otherwise."""
    try:
        import onnx

        kinds = list(ctx.get_attribute(OPAQUE_INPUTS_ATTR).ints)
        codes = list(ctx.get_attribute(OPAQUE_OUTPUTS_ATTR).ints)
        active = [i for i, k in enumerate(kinds) if k == 0] or [i for i, k in enumerate(kinds) if k < 2]
        types = [ctx.get_input_type(i) if k < 2 and i < ctx.get_num_inputs() else None
                 for i, k in enumerate(kinds)]
        infos = [_info_of(t.tensor_type) if t is not None and t.HasField("tensor_type") else None
                 for t in types]
        if not active or any(infos[i] is None or infos[i].shape is None for i in active):
            return  # wait: a later round may know it
        largest = max((infos[i] for i in active), key=lambda info: info.nbytes)  # the rounds' size
        product = _product_output(rule, lambda name: _int_value(ctx.get_attribute(name)), infos)
        for o, code in enumerate(codes[:ctx.get_num_outputs()]):
            if code >= 0:
                given = product if o == 0 and product is not None else largest
                ctx.set_output_type(o, onnx.helper.make_tensor_type_proto(
                    code or given.dtype or largest.dtype, given.shape))
    except Exception:  # noqa: BLE001 - an error here must not stop the analysis: the rounds remain
        return


# the ops whose bodies (graph attributes) run as part of them, and are costed so
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
_INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})


def bodies(node) -> list:
    """(attribute name, graph) of each body of an If, Loop or Scan node; [] for another node."""
    if node.op_type not in CONTROL_FLOW or node.domain not in ("", "ai.onnx"):
        return []
    return [(a.name, a.g) for a in node.attribute if a.HasField("g")]


def body_names(body) -> set[str]:
    """The names a body defines itself (its inputs, initializers and node outputs); any other
    name it reads is the enclosing scopes'."""
    return {*(i.name for i in body.input), *(t.name for t in body.initializer),
            *(o for n in body.node for o in n.output)}


def body_scope(parent: Graph, body) -> Graph:
    """A body of one of ``parent``'s If, Loop or Scan nodes as a Graph of its own: its nodes in
    order, its tensors (their shapes as load_graph's inference left them) over the enclosing
    scopes' (a body reads those by name), its own initializers over theirs.  The enclosing
    scopes are chained, not copied: a graph of 300,000 small bodies costs each body's size.
    Built anew at each call: kept for the analysis, 200,000 empty bodies took 40 % longer (the
    garbage collector walking them) and 250 MB more.  ``parent`` is load_graph's graph or such
    a scope (load_graph bounded their nesting)."""
    inits = {t.name: TensorInfo(t.data_type, tuple(t.dims)) for t in body.initializer}
    local = _collect_tensors(body, None)
    local.update(inits)
    return Graph(path=parent.path, nodes=_topological_order(body, parent.path),
                 tensors=_child(parent.tensors, local), initializers=_child(parent.initializers, inits),
                 graph_inputs=[i.name for i in body.input if i.name not in inits],
                 graph_outputs=[o.name for o in body.output], bound_dims=parent.bound_dims,
                 unknown_dims=[], trip_counts=parent.trip_counts,
                 opset=parent.opset, producer=parent.producer, sha256=parent.sha256,
                 noop_dropouts=parent.noop_dropouts)


def _check_nesting(graph, path: Path, depth: int) -> None:
    """Refuse If, Loop or Scan bodies nested more than MAX_SUBGRAPH_DEPTH deep (``graph`` is
    ``depth`` levels down): every walk of the bodies after load_graph relies on it."""
    for node in graph.node:
        for _, body in bodies(node):
            if depth >= MAX_SUBGRAPH_DEPTH:
                raise ModelError(f"{path}: If, Loop or Scan bodies nest more than {MAX_SUBGRAPH_DEPTH} "
                                 "deep; such a model is not analysed")
            _check_nesting(body, path, depth + 1)


def _child(outer, local: dict) -> ChainMap:
    """``local`` over ``outer`` (a dict or a ChainMap, kept flat)."""
    return outer.new_child(local) if isinstance(outer, ChainMap) else ChainMap(local, outer)


def _int_scalar(t) -> int | None:
    """The value of a one-element integer tensor written in the file, else None."""
    return _scalar(t) if t.data_type in _INT_TYPES else None


def _trip_counts(graph) -> dict[str, int]:
    """The values of the Loops' trip-count inputs (M) that are constants (a Constant node's,
    folded shape arithmetic's, an initializer's), by tensor name, at any depth."""
    wanted = {n.input[0] for g in _graphs(graph) for n in g.node
              if n.op_type == "Loop" and n.domain in ("", "ai.onnx") and n.input and n.input[0]}
    out: dict[str, int] = {}
    if not wanted:
        return out
    for g in _graphs(graph):
        for t in g.initializer:
            if t.name in wanted and (v := _int_scalar(t)) is not None:
                out.setdefault(t.name, v)
        for n in g.node:
            if n.op_type == "Constant" and n.output and n.output[0] in wanted \
                    and (v := _constant_value(n, _int_scalar)) is not None:
                out.setdefault(n.output[0], v)
    return out


def _constant_value(node, scalar, floats: bool = False):
    """A Constant node's one-element value (its tensor read by ``scalar``, a value_int, and a
    value_float where ``floats``), else None."""
    value = None
    for a in node.attribute:
        v = (scalar(a.t) if a.name == "value" else a.i if a.name == "value_int"
             else float(a.f) if a.name == "value_float" and floats else None)
        value = v if v is not None else value
    return value


def _scalar(t) -> int | float | bool | None:
    """The value of a one-element numeric or boolean tensor written in the file, as Python's
    int, float or bool (an int64's exact, a trip count of 2**63 - 1 too), else None."""
    if math.prod(t.dims) != 1 or not (t.data_type in _INT_TYPES or t.data_type in FLOAT_TYPES
                                      or t.data_type == 9):  # BOOL
        return None
    value = _inline_array(t)  # None: external, no data (stripped), or malformed
    try:
        return None if value is None else value.ravel()[0].item()
    except (TypeError, ValueError):
        return None


def _noop_dropouts(graph) -> set[str]:
    """The first outputs of the Dropout nodes that are their input, at any depth: a constant
    ratio of exactly 0 (an input, opset 12 on, or the attribute before it; absent, it is 0.5),
    a constant training_mode of false or an is_test attribute of 1 (opset 6 and before).
    PyTorch's dropout returns its input when p == 0 (at::dropout, training or not), and the
    TorchScript exporter in training mode keeps nn.Dropout(p=0.0) as such a node (ViT's and
    DeiT's configs); it runs no kernel and keeps no mask.  A ratio or mode that is no constant
    here is unknown: the node keeps its mask, and so does one whose training_mode is absent
    (false by ONNX's rules, but a graph exported for inference says nothing of the job's)."""
    wanted = {name for g in _graphs(graph) for n in g.node
              if n.op_type == "Dropout" and n.domain in ("", "ai.onnx") for name in n.input[1:3] if name}
    noop: set[str] = set()
    kept: set[str] = set()  # a name two scopes' Dropouts write is kept unless both are no-ops

    def walk(g, outer):
        # the names this scope defines shadow its parents': a constant's value, else None
        # (a body's input, a node's output, a larger initializer); a top-level input with an
        # initializer is the initializer, as everywhere in the loader
        local: dict = {i.name: None for i in g.input}
        for t in g.initializer:
            local[t.name] = _scalar(t) if t.name in wanted else None
        for n in g.node:
            value = None
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output and n.output[0] in wanted:
                value = _constant_value(n, _scalar, floats=True)
            for o in n.output:
                local[o] = value
        scope = collections.ChainMap(local, *outer.maps)
        for n in g.node:
            if n.op_type == "Dropout" and n.domain in ("", "ai.onnx") and n.output and n.output[0]:
                attrs = {a.name: a for a in n.attribute}
                ratio = (scope.get(n.input[1]) if len(n.input) > 1 and n.input[1]
                         else attrs["ratio"].f if "ratio" in attrs else None)
                mode = scope.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
                if ratio == 0 or mode == 0 or ("is_test" in attrs and attrs["is_test"].i == 1):
                    noop.add(n.output[0])
                else:
                    kept.add(n.output[0])
            for sub in _subgraphs(n):
                walk(sub, scope)

    walk(graph, collections.ChainMap())
    return noop - kept


def _declare(vi, info: TensorInfo) -> int:
    """Give ``vi`` (a tensor's declared type) the sizes of ``info`` where it knows fewer, of the
    same rank or none; 1 if that changed it."""
    if vi.type.WhichOneof("value") not in (None, "tensor_type"):
        return 0
    tt = vi.type.tensor_type
    mine = _info_of(tt)
    if mine.known or (mine.shape is not None and len(mine.shape) != len(info.shape)):
        return 0
    tt.elem_type = tt.elem_type or info.dtype
    tt.shape.ClearField("dim")
    for d in info.shape:
        tt.shape.dim.add().dim_value = d
    return 1


def _shape_loops(graph, inferred, known, trips: dict[str, int]) -> int:
    """Shapes ONNX's inference leaves out of a Loop, written into ``graph`` (and its bodies, at
    any depth) for the next round: its body's loop-carried inputs take their initial values'
    shapes (ONNX passes the body their ranks only, so the whole body had no sizes), and the
    Loop's outputs its body's outputs' (a scan output stacked over a constant trip count).
    ``inferred`` is ``graph`` as the last inference left it, ``known`` the shapes so far.
    Returns how many types it changed."""
    count, declared = 0, None
    for node, done in zip(graph.node, inferred.node):
        subs = dict(bodies(node))
        if not subs:
            continue
        done_subs = dict(bodies(done))
        body, body_done = subs.get("body"), done_subs.get("body")
        if node.op_type == "Loop" and body is not None and body_done is not None:
            carried = list(node.input[2:])
            for k, name in enumerate(carried):
                info = known.get(name)
                if info is not None and info.known and k + 2 < len(body.input):
                    count += _declare(body.input[k + 2], info)
            trip = trips.get(node.input[0]) if node.input and node.input[0] else None
            for i, out in enumerate(node.output):
                info = known.get(out)
                if (not out or (info is not None and info.known) or i + 1 >= len(body_done.output)
                        or not body_done.output[i + 1].type.HasField("tensor_type")):
                    continue
                got = _info_of(body_done.output[i + 1].type.tensor_type)
                if not got.known:
                    continue
                if i >= len(carried):  # a scan output: each iteration's value, stacked
                    if trip is None or not 0 <= trip <= MAX_DIM:
                        continue
                    got = TensorInfo(got.dtype, (trip, *got.shape))
                if declared is None:
                    declared = {vi.name: vi for vi in (*graph.value_info, *graph.output)}
                if out not in declared:
                    declared[out] = graph.value_info.add()
                    declared[out].name = out
                count += _declare(declared[out], got)
        for key, sub in subs.items():
            if key in done_subs:
                count += _shape_loops(sub, done_subs[key],
                                      _child(known, _collect_tensors(done_subs[key], None)), trips)
    return count


def _adopt_body_types(graph, inferred, depth: int) -> None:
    """Copy the types the last inference gave the tensors of ``graph``'s bodies (``inferred``
    is ``graph`` inferred), at any depth, into them: costing reads a body's shapes there.  It
    walks any op's graphs, which _check_nesting does not bound: hence its own bound."""
    for node, done in zip(graph.node, inferred.node):
        done_subs = {a.name: a.g for a in done.attribute if a.HasField("g")}
        for attr in node.attribute:
            if not attr.HasField("g") or attr.name not in done_subs or depth >= MAX_SUBGRAPH_DEPTH:
                continue
            sub, sub_done = attr.g, done_subs[attr.name]
            del sub.value_info[:]
            sub.value_info.extend(sub_done.value_info)
            for mine, theirs in zip((*sub.input, *sub.output), (*sub_done.input, *sub_done.output)):
                mine.type.CopyFrom(theirs.type)
            _adopt_body_types(sub, sub_done, depth + 1)


def _shaped_sequences(graph) -> set[str]:
    """The tensors of ``graph`` (its own scope) typed as a sequence, optional or map whose
    elements' sizes are all known: no tensor of their own to shape (a SplitToSequence's output,
    the legacy exporter's dynamic torch.split), so never "shapeless"; what reads them (SequenceAt)
    has the elements' shape.  One whose elements' sizes are unknown stays shapeless."""
    out = set()
    for vi in (*graph.value_info, *graph.output):
        if vi.type.WhichOneof("value") in (None, "tensor_type"):
            continue
        elements = _tensor_types(vi.type)
        if elements and all(_info_of(tt).known for tt in elements):
            out.add(vi.name)
    return out


def _body_shapeless(graph, known) -> list[str]:
    """The outputs of the nodes of ``graph``'s If, Loop and Scan bodies, at any depth, that have
    no shape (their readers cost nothing)."""
    out = []
    for node in graph.node:
        for _, body in bodies(node):
            inits = {t.name: TensorInfo(t.data_type, tuple(t.dims)) for t in body.initializer}
            scope = _child(known, {**_collect_tensors(body, None), **inits})
            sequences = _shaped_sequences(body)
            out += [n for b in body.node for n in b.output
                    if n and (scope.get(n) is None or scope[n].shape is None) and n not in sequences]
            out += _body_shapeless(body, scope)
    return out


def _known_shape(tensors: dict, name: str):
    info = tensors.get(name)
    return tuple(info.shape) if info is not None and info.known else None


def _infer_shapes(model, path: Path, onnx):
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                 data_prop=True)
    except MemoryError:
        raise  # graph.limits says what ran out
    except Exception as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{path}: shape inference failed: {first_line[:300]}") from None


def _info_of(tt) -> TensorInfo:
    """A TypeProto.Tensor as a TensorInfo (a dimension: its size, its name, or None)."""
    shape = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        if any(isinstance(d, bytes) for d in shape):  # a subgraph's, which _check_static_dims does not see
            raise ModelError("a dimension name in the graph is not UTF-8 text")
    return TensorInfo(tt.elem_type, shape)


def _collect_tensors(graph, onnx) -> dict[str, TensorInfo]:
    tensors = {}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        t = vi.type
        if not t.HasField("tensor_type"):
            continue
        tensors[vi.name] = _info_of(t.tensor_type)
    for node in graph.node:  # Constant nodes' values have exact shapes even where inference is silent
        if node.op_type == "Constant" and node.output and node.output[0] not in tensors:
            for attr in node.attribute:
                if attr.name == "value":
                    tensors[node.output[0]] = TensorInfo(attr.t.data_type, tuple(attr.t.dims))
    return tensors


def parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    """`--dim name=value` pairs -> {name: int} (hsubmit and `horus` both take them; sizes are
    checked where they are bound)."""
    dims = {}
    for item in values:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise HorusError(f"--dim expects name=value, got '{item}'")
        try:
            dims[name] = int(value)
        except ValueError:
            try:
                as_float = float(value)
            except ValueError:
                raise HorusError(f"--dim {name}: '{value}' is not an integer") from None
            if not as_float.is_integer():
                raise HorusError(f"--dim {name}: '{value}' is not an integer") from None
            dims[name] = int(as_float) if abs(as_float) < 2**62 else 2**62
    return dims
