"""Graph loading: external data, dimension binding, parameter counting rules, bad input."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from graphs import external_tensor, mlp, save
from slurm_horus.errors import ModelError
from slurm_horus.graph.features import extract_features
from slurm_horus.graph.load import load_graph
from slurm_horus.predict.workload import dims_key

ZOO = Path(__file__).parent / "data" / "zoo"


def test_binds_batch_and_counts_mlp(tmp_path):
    r = extract_features(mlp(tmp_path / "m.onnx"), batch_size=4)
    assert r.bound_dims == {"batch": 4}
    assert r.values["params"] == 16 * 32 + 32 + 32 * 8 + 8
    assert r.values["flops"] == 2 * 4 * (16 * 32 + 32 * 8) + 2 * 4 * (32 + 8)  # matmul, add+relu
    assert r.unknown_dims == []


def test_unbound_dimension_is_named(tmp_path):
    r = extract_features(mlp(tmp_path / "m.onnx", batch="tokens"))
    assert r.unknown_dims == ["tokens"]
    r = extract_features(mlp(tmp_path / "m.onnx", batch="tokens"), dims={"tokens": 3})
    assert r.unknown_dims == [] and r.bound_dims == {"tokens": 3}
    assert r.unused_dims == [] and not r.warnings()


def test_a_batch_dim_that_contradicts_the_batch_size_is_refused(tmp_path):
    with pytest.raises(ModelError, match="contradicts --batch-size 4"):
        extract_features(mlp(tmp_path / "m.onnx"), batch_size=4, dims={"batch": 8})
    assert extract_features(mlp(tmp_path / "m.onnx"), batch_size=4, dims={"batch": 4}).bound_dims == {"batch": 4}


def test_a_non_batch_dim_with_a_batch_like_name_is_not_a_contradiction(tmp_path):
    # points[batch, n, 3]: n is the point count, not the batch
    graph = helper.make_graph([helper.make_node("Relu", ["p"], ["y"])], "points",
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", "n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n", 3])])
    r = extract_features(save(graph, tmp_path / "p.onnx"), batch_size=8, dims={"n": 1024})
    assert r.bound_dims == {"batch": 8, "n": 1024}


def _matmul_inputs(path, *shapes):
    """x0, x1...: each input's MatMul by a (64, 64) weight, so every input's shape is its own."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [64, 64], [0.0] * 64 * 64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", [f"x{i}", "W"], [f"y{i}"]) for i in range(len(shapes))], "g",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(shapes))], [w])
    return save(graph, path)


def test_a_sequence_first_input_binds_the_batch_by_name_not_position(tmp_path):
    """nn.LSTM's and nn.Transformer's (seq, batch, d): the batch size had bound seq by its
    position, so the job was costed at a sequence as long as the batch, and nothing said so."""
    path = _matmul_inputs(tmp_path / "sf.onnx", ["seq", "batch", 64])
    g = load_graph(path, batch_size=16)
    assert g.bound_dims == {"batch": 16} and g.unknown_dims == ["seq"]
    g = load_graph(path, batch_size=16, dims={"seq": 512})
    assert g.bound_dims == {"seq": 512, "batch": 16} and g.tensors["y0"].shape == (512, 16, 64)
    # hsubmit keys its history lookup by the bound dims, the history export by the --dim given
    assert dims_key(g.bound_dims, 16) == dims_key({"seq": 512}, 16) == "seq=512"
    with pytest.raises(ModelError, match="contradicts --batch-size 16"):
        load_graph(path, batch_size=16, dims={"batch": 8})


def test_the_leading_dim_binds_by_position_unless_a_sequence_or_beside_a_batch(tmp_path):
    # time first without a batch name; a name some input holds beside its batch; one unnamed;
    # one an exporter made up
    path = _matmul_inputs(tmp_path / "p.onnx", ["time", 64], ["batch", "src", 64], ["src", 64],
                          [0, 64], ["s0", 64])
    g = load_graph(path, batch_size=4)
    assert g.bound_dims == {"batch": 4, "x3[0]": 4, "s0": 4} and g.unknown_dims == ["src", "time"]


def test_a_dim_the_model_lacks_is_reported(tmp_path):
    # a typo in --dim (seq for tokens) would otherwise pass silently and leave the job unpredicted
    r = extract_features(mlp(tmp_path / "m.onnx", batch="tokens"), dims={"tokens": 3, "seq": 128})
    assert r.unused_dims == ["seq"] and r.bound_dims == {"tokens": 3}
    assert any("--dim seq" in w and "no dimension" in w for w in r.warnings())


def test_missing_external_data_is_fine(tmp_path):
    r = extract_features(mlp(tmp_path / "m.onnx", location="weights.bin"), batch_size=2)
    assert r.missing_external_data == ["weights.bin"]
    assert r.values["params"] == 16 * 32 + 32 + 32 * 8 + 8


def test_model_above_2gb_loads_from_its_graph(tmp_path):
    """1.5 G parameters (6 GB of fp32) described by a graph of a few hundred bytes."""
    w = external_tensor("w", [50_000, 30_000], "big.bin")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 50_000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 30_000])], [w])
    r = extract_features(save(graph, tmp_path / "big.onnx"), batch_size=8)
    assert r.values["params"] == 1_500_000_000
    assert r.values["param_bytes"] == 6_000_000_000
    assert r.values["flops"] == 2 * 8 * 50_000 * 30_000


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "a/../../x.bin", "a\0b.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, location):
    path = mlp(tmp_path / "m.onnx", location=location)
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_graph(path, batch_size=1)


def test_external_data_name_too_long_for_the_system_is_missing_data(tmp_path):
    path = mlp(tmp_path / "m.onnx", location="x" * 5000 + ".bin")
    assert load_graph(path, batch_size=1).missing_external_data == ["x" * 5000 + ".bin"]


def test_external_data_symlink_escaping_folder_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    os.symlink("/etc", tmp_path / "model" / "link")
    path = mlp(tmp_path / "model" / "m.onnx", location="link/passwd")
    with pytest.raises(ModelError, match="outside"):
        load_graph(path, batch_size=1)


def test_identity_copies_count_as_separate_parameters_and_tied_weights_once(tmp_path):
    """Deduplicated initializers (via Identity) are separate parameters; direct reuse is tying."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], [0.0] * 64)
    nodes = [helper.make_node("Identity", ["w"], ["w_copy"]),
             helper.make_node("MatMul", ["x", "w"], ["h1"]),
             helper.make_node("MatMul", ["h1", "w_copy"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w"], ["y"])]  # w again: tied with the first use
    graph = helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w])
    r = extract_features(save(graph, tmp_path / "t.onnx"), batch_size=1)
    assert r.values["params"] == 2 * 64


def test_batchnorm_running_statistics_are_not_parameters(tmp_path):
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [4], [1.0] * 4)
             for n in ("scale", "bias", "mean", "var")]
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])],
        "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 5, 5])], inits)
    r = extract_features(save(graph, tmp_path / "bn.onnx"), batch_size=2)
    assert r.values["params"] == 8


def test_op_without_rule_is_listed_not_fatal(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("MyCustomOp", ["x"], ["y"], domain="com.example"),
         helper.make_node("Relu", ["y"], ["z"])], "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    (tmp_path / "c.onnx").write_bytes(model.SerializeToString())
    r = extract_features(tmp_path / "c.onnx", batch_size=2)
    assert r.unknown_ops == ["com.example.MyCustomOp"]  # named with its domain
    assert r.values["n_unknown_ops"] == 1
    assert r.assumed_shapes == ["y"] and r.by_op["Relu"].flops == 2 * 4  # costed past it



def test_fused_op_takes_its_activation_shape_not_its_weight_shape(tmp_path):
    # onnxruntime's fused Attention reads x (batch, 768) and a (768, 2304) weight: given the
    # weight's shape, the MatMul after it failed inference and cost nothing
    import numpy as np
    from onnx import numpy_helper

    inits = [numpy_helper.from_array(np.zeros((768, 2304), np.float32), "qkv"),
             numpy_helper.from_array(np.zeros((768, 768), np.float32), "w")]
    graph = helper.make_graph(
        [helper.make_node("Attention", ["x", "qkv"], ["a"], domain="com.microsoft"),
         helper.make_node("MatMul", ["a", "w"], ["y"])], "fused",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 768])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 768])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    (tmp_path / "f.onnx").write_bytes(model.SerializeToString())
    r = extract_features(tmp_path / "f.onnx", batch_size=4)
    assert r.assumed_shapes == ["a"] and r.by_op["MatMul"].flops == 2 * 4 * 768 * 768

# onnxruntime's attention ops, laid out as its contrib op docs say (B 2, S 16 queries, L 24 keys,
# P 40 past keys, N 8 heads of H 32, KV 2 key and value heads): (op, attributes, inputs by
# name and shape, "" for an absent one) -> the keys each query attends to, and the queries
# where not 16
_N, _H, _KV = 8, 32, 2
ATTENTION_LAYOUTS = {
    "mha": ("MultiHeadAttention", {}, [("q", [2, 16, _N * _H]), ("k", [2, 24, _N * _H]), ("v", [2, 24, _N * _H])], 24),
    "mha_bnsh_kv": ("MultiHeadAttention", {}, [("q", [2, 16, _N * _H]), ("k", [2, _N, 24, _H]),
                                                ("v", [2, _N, 24, _H])], 24),
    "mha_packed_qkv": ("MultiHeadAttention", {}, [("q", [2, 16, _N, 3, _H])], 16),
    "mha_packed_kv": ("MultiHeadAttention", {}, [("q", [2, 16, _N * _H]), ("k", [2, 24, _N, 2, _H])], 24),
    "mha_past": ("MultiHeadAttention", {}, [("q", [2, 16, _N * _H]), ("k", [2, 16, _N * _H]), ("v", [2, 16, _N * _H]),
                                             ("", None), ("", None), ("", None), ("pk", [2, _N, 40, _H]),
                                             ("pv", [2, _N, 40, _H])], 56),
    "gqa": ("GroupQueryAttention", {"kv_num_heads": _KV},
            [("q", [2, 16, _N * _H]), ("k", [2, 16, _KV * _H]), ("v", [2, 16, _KV * _H])], 16),
    "gqa_packed": ("GroupQueryAttention", {"kv_num_heads": _KV}, [("q", [2, 16, (_N + 2 * _KV) * _H])], 16),
    "gqa_past": ("GroupQueryAttention", {"kv_num_heads": _KV},
                 [("q", [2, 16, _N * _H]), ("k", [2, 16, _KV * _H]), ("v", [2, 16, _KV * _H]),
                  ("pk", [2, _KV, 40, _H]), ("pv", [2, _KV, 40, _H])], 56),
    "decoder_cross": ("DecoderMaskedMultiHeadAttention", {}, [("q", [2, 1, _N * _H]), ("k", [2, _N, 24, _H]),
                                                               ("v", [2, _N, 24, _H])], 24, 1),
    "decoder_past": ("DecoderMaskedMultiHeadAttention", {}, [("q", [2, 1, _N * _H]), ("k", [2, 1, _N * _H]),
                                                              ("v", [2, 1, _N * _H]), ("", None), ("", None),
                                                              ("pk", [2, _N, 40, _H]), ("pv", [2, _N, 40, _H])], 41, 1),
    "decoder_packed_qkv": ("DecoderMaskedMultiHeadAttention", {}, [("q", [2, 1, 3 * _N * _H])], 1, 1),
}


@pytest.mark.parametrize("layout", ATTENTION_LAYOUTS)
def test_onnxruntime_attention_costs_its_heads_and_gives_the_projection_after_it_its_shape(tmp_path, layout):
    """Scores and context of 2·B·N·S·L·H each and a softmax of 5·B·N·S·L, whatever the layout:
    GroupQueryAttention's values of kv_num_heads heads had been taken for N heads (H / 4), its
    QKV packed query for N heads of (N + 2·KV)·H / N, a [B, N, L, H] value's last size for N
    heads' width, a packed query's 3 for its length, and past keys were not attended to.  The
    output [B, S, N·H] (the largest input's had been a packed query's) feeds the projection."""
    import numpy as np
    from onnx import numpy_helper

    op, attrs, inputs, keys, *queries = ATTENTION_LAYOUTS[layout]
    queries = queries[0] if queries else 16
    w = numpy_helper.from_array(np.zeros((_N * _H, 64), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node(op, [n for n, _ in inputs], ["a"], domain="com.microsoft", num_heads=_N, **attrs),
         helper.make_node("MatMul", ["a", "w"], ["y"])], "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs if n],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    (tmp_path / "a.onnx").write_bytes(model.SerializeToString())
    r = extract_features(tmp_path / "a.onnx")
    probs = 2 * _N * queries * keys  # B·N·S·L
    assert r.by_op[op].flops == 2 * (2 * probs * _H) + 5 * probs
    assert r.nodes[0].extra_saved_bytes == 4 * probs
    assert r.by_op["MatMul"].flops == 2 * 2 * queries * _N * _H * 64 and r.assumed_shapes == []


def test_a_packed_query_of_unbound_heads_gives_no_one_head_width(tmp_path):
    # its heads unbound (a 0 placeholder) had been taken for one: the output [B, S, H], a
    # confident shape an eighth of the real one, listed nowhere as assumed
    graph = helper.make_graph(
        [helper.make_node("MultiHeadAttention", ["q"], ["a"], domain="com.microsoft", num_heads=_N)], "attention",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", 16, "heads", 3, _H])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    (tmp_path / "a.onnx").write_bytes(model.SerializeToString())
    g = load_graph(tmp_path / "a.onnx", batch_size=2)
    assert g.tensors["a"].shape != (2, 16, _H) and g.assumed_shapes == ["a"]


@pytest.mark.parametrize("inputs, attrs, keys", [
    ([("q", [2, _N, 16, _H]), ("k", [2, _KV, 24, _H]), ("v", [2, _KV, 24, _H])], {}, 24),
    ([("q", [2, 16, _N * _H]), ("k", [2, 16, _KV * _H]), ("v", [2, 16, _KV * _H]), ("", None),
      ("pk", [2, _KV, 40, _H]), ("pv", [2, _KV, 40, _H])], {"q_num_heads": _N, "kv_num_heads": _KV}, 56),
])
def test_onnx_own_attention_is_costed_by_its_heads_and_past_keys(tmp_path, inputs, attrs, keys):
    """ONNX's Attention (opset 23) shares onnxruntime's name: its [B, N, S, H] or [B, S, N·H]
    keys had been read as onnxruntime's packed QKV weight, no layout, and the op left uncosted."""
    graph = helper.make_graph(
        [helper.make_node("Attention", [n for n, _ in inputs], ["y"], **attrs)], "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in inputs if n],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    (tmp_path / "a.onnx").write_bytes(model.SerializeToString())
    r = extract_features(tmp_path / "a.onnx")
    probs = 2 * _N * 16 * keys  # B·N·S·L
    assert r.by_op["Attention"].flops == 2 * (2 * probs * _H) + 5 * probs and r.unknown_ops == []
    assert r.nodes[0].extra_saved_bytes == 4 * probs


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_onnxruntime_fused_products_give_the_op_after_them_their_product_shape(tmp_path, trans_a, trans_b):
    # FusedMatMul (MatMul's broadcasting, its last two sizes transposed by transA, transB) and
    # FusedGemm had taken A's shape, as any op ONNX has no schema for: the Relu after them was
    # misshaped; a symbolic size (seq, unbound) flows through; transBatchA is not ruled: A's
    import numpy as np
    from onnx import numpy_helper

    k, n = 64, 32
    fm = np.zeros((1, n, k) if trans_b else (1, k, n), np.float32)
    fg = np.zeros((n, k) if trans_b else (k, n), np.float32)
    graph = helper.make_graph(
        [helper.make_node("FusedMatMul", ["x", "fm"], ["m"], domain="com.microsoft", transA=trans_a,
                          transB=trans_b, alpha=1.0),
         helper.make_node("Relu", ["m"], ["y"]),
         helper.make_node("FusedGemm", ["g", "fg"], ["h"], domain="com.microsoft", transA=trans_a,
                          transB=trans_b, activation="Relu"),
         helper.make_node("Relu", ["h"], ["z"]),
         helper.make_node("FusedMatMul", ["x", "x"], ["t"], domain="com.microsoft", transBatchA=1)], "fused",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"] + ([k, "seq"] if trans_a else ["seq", k])),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, [k, "batch"] if trans_a else ["batch", k])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "z", "t")],
        [numpy_helper.from_array(fm, "fm"), numpy_helper.from_array(fg, "fg")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    (tmp_path / "f.onnx").write_bytes(model.SerializeToString())
    g = load_graph(tmp_path / "f.onnx", batch_size=4)
    assert g.tensors["y"].shape == (4, "seq", n) and g.tensors["z"].shape == (4, n)
    assert g.assumed_shapes == ["t"] and g.tensors["t"].shape == g.tensors["x"].shape
    r = extract_features(tmp_path / "f.onnx", batch_size=4, dims={"seq": 8})
    assert [c.flops for c in r.nodes if c.outputs == ("m",)] == [2 * 4 * 8 * k * n]
    assert r.by_op["FusedGemm"].flops == 2 * 4 * k * n
    assert r.by_op["Relu"].activation_bytes == 4 * (4 * 8 * n + 4 * n)


# --- bad input through the CLI: one line on stderr, non-zero exit, bounded time and memory ---

def _cycle(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
        "cycle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])])
    return save(graph, tmp_path / "cycle.onnx")


def _empty_graph(tmp_path):
    graph = helper.make_graph([], "empty", [], [])
    return save(graph, tmp_path / "emptygraph.onnx")


def _absurd(tmp_path):
    return mlp(tmp_path / "absurd.onnx", batch=10**12)


def _truncated(tmp_path):
    data = mlp(tmp_path / "full.onnx").read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(data[: len(data) // 2])
    return tmp_path / "trunc.onnx"


BAD_INPUTS = {
    "zero_bytes": (lambda p: (p / "zero.onnx").write_bytes(b"") and None or p / "zero.onnx",
                   [], "empty"),
    "random_bytes": (lambda p: (p / "rand.onnx").write_bytes(os.urandom(4096)) and None
                     or p / "rand.onnx", [], "ONNX"),
    "truncated": (_truncated, [], "ONNX"),
    "cycle": (_cycle, [], "cycle"),
    "empty_graph": (_empty_graph, [], "no nodes"),
    "absurd_fixed_dims": (_absurd, ["-b", "1"], "not plausible|between"),
    "absurd_dim_flag": (lambda p: mlp(p / "m.onnx"), ["--dim", "batch=1e12"], "between"),
    "negative_batch": (lambda p: mlp(p / "m.onnx"), ["-b", "-3"], "batch size"),
    "external_dotdot": (lambda p: mlp(p / "m.onnx", location="../../etc/shadow"), ["-b", "1"],
                        "outside"),
    "missing_file": (lambda p: p / "nope.onnx", [], "No such file"),
    "directory": (lambda p: p, [], "not a regular file|directory"),
}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_one_line_error(tmp_path, case):
    make, args, pattern = BAD_INPUTS[case]
    path = make(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "slurm_horus.cli.horus", "features", str(path),
                           *args], capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    import re
    assert re.search(pattern, lines[0]), lines[0]


def test_folding_refuses_a_broadcast_bomb_before_allocating_it():
    # two 65,536-element constants broadcast to 4.3e9 elements: a 131 kB file had taken 8 GB
    # (and root's sync recomputes users' models)
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from slurm_horus.graph.shapefold import fold_shapes

    a = numpy_helper.from_array(np.zeros((65536, 1), np.int8), "a")
    b = numpy_helper.from_array(np.zeros((1, 65536), np.int8), "b")
    c = numpy_helper.from_array(np.arange(4, dtype=np.int64).reshape(4, 1), "c")
    nodes = [helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Gather", ["b", "a"], ["g"]),
             helper.make_node("Add", ["c", "c"], ["cc"])]
    out = [helper.make_tensor_value_info(n, onnx.TensorProto.INT8, None) for n in ("ab", "g", "cc")]
    model = helper.make_model(helper.make_graph(nodes, "bomb", [], out, [a, b, c]))
    assert fold_shapes(model, lambda name: None) == 1  # only the small Add
    assert [n.op_type for n in model.graph.node] == ["Add", "Gather", "Constant"]


def test_weight_values_are_dropped_after_reading_and_still_counted(tmp_path):
    # shape inference copied the whole model every round: 5x the file in memory for inline weights
    import numpy as np
    from onnx import numpy_helper

    from slurm_horus.graph.load import _drop_weight_values

    inits = [numpy_helper.from_array(np.ones((300, 300), np.float32), "w"),
             numpy_helper.from_array(np.array([4, 300], np.int64), "shape")]
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["xr"]), helper.make_node("MatMul", ["xr", "w"], ["y"])],
        "w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1200])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 300])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    big_ints = numpy_helper.from_array(np.arange(70000, dtype=np.int64), "ids")
    model.graph.initializer.append(big_ints)
    _drop_weight_values(model)
    w, shape, ids = model.graph.initializer
    assert not w.raw_data and list(w.dims) == [300, 300] and shape.raw_data  # the small one folds
    assert ids.raw_data  # integers may become a shape (ONNX's data propagation slices them)
    (tmp_path / "w.onnx").write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString())
    r = extract_features(tmp_path / "w.onnx")
    assert r.values["params"] == 300 * 300 and r.by_op["MatMul"].flops == 2 * 4 * 300 * 300


def test_a_custom_op_with_an_input_never_shaped_still_takes_its_known_input(tmp_path):
    # waiting for every activation input had left its output shapeless when one never got a
    # shape (a graph input declared without one): every op after it cost nothing
    import numpy as np
    from onnx import numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MyOp", ["x", "aux"], ["a"], domain="com.example"),
         helper.make_node("MatMul", ["a", "w"], ["y"])], "wait",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64]),
         helper.make_tensor_value_info("aux", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [numpy_helper.from_array(np.zeros((64, 32), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    (tmp_path / "w.onnx").write_bytes(model.SerializeToString())
    r = extract_features(tmp_path / "w.onnx", batch_size=4)
    assert r.by_op["MatMul"].flops == 2 * 4 * 64 * 32


def _custom_chain(tmp_path, n: int = 40):
    """n custom ops, each followed by a standard one, then a MatMul: before one inference pass
    carried shapes past every custom op, each pair took a round of its own."""
    import numpy as np
    from onnx import numpy_helper

    nodes, prev = [], "x"
    for i in range(n):
        nodes += [helper.make_node("MyOp", [prev], [f"c{i}"], domain="com.example"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("MatMul", [prev, "w"], ["y"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.zeros((4, 8), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    (tmp_path / "chain.onnx").write_bytes(model.SerializeToString())
    return tmp_path / "chain.onnx"


def test_a_chain_of_custom_ops_longer_than_the_rounds_is_shaped_in_one_pass(tmp_path):
    import onnx

    g = load_graph(_custom_chain(tmp_path), batch_size=2)
    assert g.shapeless == [] and len(g.assumed_shapes) == 40
    assert g.tensors["r39"].shape == (2, 4) and g.tensors["y"].shape == (2, 8)
    # the schemas lived for the analysis only, and the nodes carry nothing of them
    assert not onnx.defs.has("MyOp", "com.example")
    assert all(a.name.startswith("horus") is False for n in g.nodes for a in n.attribute)
    r = extract_features(tmp_path / "chain.onnx", batch_size=2)
    assert r.by_op["MatMul"].flops == 2 * 2 * 4 * 8 and not any("unknown" in w for w in r.warnings())


def test_a_custom_op_inside_an_if_body_is_shaped(tmp_path):
    # the schemas served the top-level graph only: a custom op in a branch left the If's
    # output, and the MatMul after it, without a shape (it cost nothing)
    import numpy as np
    import onnx
    from onnx import numpy_helper

    def branch(name):  # reads the outer graph's input x and the outer weight s
        return helper.make_graph([helper.make_node("MyOp", ["x", "s"], [f"{name}_c"], domain="com.example"),
                                  helper.make_node("Relu", [f"{name}_c"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["a"], then_branch=branch("then"), else_branch=branch("else")),
         helper.make_node("MatMul", ["a", "w"], ["y"])], "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros((64, 32), np.float32), "w"),
         numpy_helper.from_array(np.zeros((64,), np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    (tmp_path / "if.onnx").write_bytes(model.SerializeToString())
    g = load_graph(tmp_path / "if.onnx", batch_size=4)
    assert g.shapeless == [] and g.tensors["a"].shape == (4, 64) and g.tensors["y"].shape == (4, 32)
    assert not onnx.defs.has("MyOp", "com.example")
    assert not any(a.name.startswith("horus") for sub in g.nodes[0].attribute
                   for n in sub.g.node for a in n.attribute)
    r = extract_features(tmp_path / "if.onnx", batch_size=4)
    assert r.by_op["MatMul"].flops == 2 * 4 * 64 * 32 and not any("unknown" in w for w in r.warnings())


def test_a_branchs_names_do_not_shadow_the_graphs_for_its_own_custom_ops(tmp_path):
    # an If branch's initializer named like the graph's input x made the top-level custom op
    # read x as a weight: its output took w2's (1000, 1000) shape, and the MatMul lost its cost
    import numpy as np
    from onnx import numpy_helper

    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
                             [numpy_helper.from_array(np.zeros((2,), np.float32), "x")])
    other = helper.make_graph([helper.make_node("Relu", ["q"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("MyOp", ["x", "w2"], ["q"], domain="com.example"),
         helper.make_node("If", ["cond"], ["a"], then_branch=then, else_branch=other),
         helper.make_node("MatMul", ["q", "w"], ["y"])], "shadow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros((64, 32), np.float32), "w"),
         numpy_helper.from_array(np.zeros((1000, 1000), np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    (tmp_path / "s.onnx").write_bytes(model.SerializeToString())
    g = load_graph(tmp_path / "s.onnx", batch_size=4)
    assert g.tensors["q"].shape == (4, 64) and g.tensors["y"].shape == (4, 32)


def test_shapes_left_unknown_after_the_last_round_are_a_warning(tmp_path, monkeypatch):
    # where ONNX takes no schema from Python, a round per custom op carries the shapes, up to
    # MAX_SHAPE_ROUNDS; the tensors left without a shape cost nothing, which was silent
    import onnx

    def refuse(schema):
        raise RuntimeError("no Python schemas here")

    monkeypatch.setattr(onnx.defs, "register_schema", refuse)
    r = extract_features(_custom_chain(tmp_path), batch_size=2)
    assert r.shapeless and any("tensor(s) unknown" in w for w in r.warnings())
    short = extract_features(mlp(tmp_path / "m.onnx"), batch_size=2)
    assert short.shapeless == []


def test_bert_with_a_custom_op_per_layer_norm_and_softmax_costs_as_bert(tmp_path):
    # 37 custom ops in a chain (BERT-base's 25 LayerNormalization and 12 Softmax moved to a
    # custom domain, as a fused-kernel export has them): every MatMul after them still counts
    import onnx

    model = onnx.load(str(ZOO / "bert_base.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type in ("LayerNormalization", "Softmax"):
            node.domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(model, str(tmp_path / "bert_custom.onnx"))
    plain = extract_features(ZOO / "bert_base.onnx", batch_size=2)
    custom = extract_features(tmp_path / "bert_custom.onnx", batch_size=2)
    # the last LayerNorm's output is the graph's, its shape declared in the file
    assert custom.shapeless == [] and len(custom.assumed_shapes) == 36
    # before, the sequence length (symbolic) kept the first LayerNorm waiting until it took its
    # weight's shape, (768,), and 48 tensors after it had none: half the MatMul FLOPs
    assert custom.by_op["MatMul"].flops == plain.by_op["MatMul"].flops > 0
    assert custom.values["params"] == plain.values["params"]


def _save(path, nodes, inits=(), opset_custom: int = 1):
    import numpy as np
    from onnx import numpy_helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v[1], dtype=v[2]), v[0]) for v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", opset_custom)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


W48 = ("w", [[0.0] * 8] * 4, "float32")


def test_custom_ops_with_no_inputs_or_no_outputs_do_not_stop_the_analysis(tmp_path):
    # a review's finding: an empty attribute list has no type for onnx.helper, and the whole
    # analysis failed where the rounds alone had shaped everything else
    nodes = [helper.make_node("MyConst", [], ["k"], domain="com.example"),
             helper.make_node("MyPrint", ["x"], [], domain="com.example"),
             helper.make_node("MyOp", ["x"], ["c"], domain="com.example"),
             helper.make_node("MatMul", ["c", "w"], ["y"])]
    g = load_graph(_save(tmp_path / "e.onnx", nodes, [W48]), batch_size=2)
    assert g.tensors["c"].shape == (2, 4) and g.tensors["y"].shape == (2, 8) and g.shapeless == ["k"]


def test_a_models_own_attribute_of_the_schemas_name_is_not_read_as_theirs(tmp_path):
    # the rounds wrote into any attribute of that name (an IndexError on a string one); opset 0
    # of the custom domain takes the rounds' path, opset 1 the schemas'
    for version in (0, 1):
        nodes = [helper.make_node("MyOp", ["x"], ["c"], domain="com.example", horus_opaque_outputs="s",
                                  horus_opaque_inputs=[1, 1, 1]),
                 helper.make_node("MatMul", ["c", "w"], ["y"])]
        g = load_graph(_save(tmp_path / f"a{version}.onnx", nodes, [W48], opset_custom=version), batch_size=2)
        assert g.tensors["y"].shape == (2, 8) and g.assumed_shapes == ["c"], version


def test_without_schemas_a_shape_waiting_on_a_fold_is_not_frozen_early(tmp_path, monkeypatch):
    # Range(0, batch x 3000) has no size until folded: the rounds must not take it, symbolic,
    # for good before the fold settles it (MatMul cost 2 x 1 x 512 instead of 2 x 6000 x 512)
    import onnx

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["g"], axis=0),
             helper.make_node("Mul", ["g", "k"], ["m"]), helper.make_node("Range", ["zs", "m", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["cf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["cf", "ax"], ["cu"]),
             helper.make_node("MyOp", ["cu"], ["c"], domain="com.example"),
             helper.make_node("MatMul", ["c", "w"], ["y"])]
    inits = [("zero", 0, "int64"), ("k", 3000, "int64"), ("zs", 0, "int64"), ("one", 1, "int64"),
             ("ax", [1], "int64"), ("w", [[0.0] * 512], "float32")]
    path = _save(tmp_path / "fold.onnx", nodes, inits)

    def refuse(schema):
        raise RuntimeError("no Python schemas here")

    for patched in (False, True):
        if patched:
            monkeypatch.setattr(onnx.defs, "register_schema", refuse)
        g = load_graph(path, batch_size=2)
        assert g.tensors["c"].shape == (6000, 1) and g.tensors["y"].shape == (6000, 512), patched


def test_a_local_function_is_costed_as_its_body(tmp_path):
    # a call of a model-local function (export_modules_as_functions) had cost its output's size
    fn = helper.make_function("local", "Linear", ["a", "w"], ["b"], [helper.make_node("MatMul", ["a", "w"], ["b"])],
                              [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("Linear", ["x", "w"], ["h"], domain="local"),
         helper.make_node("Linear", ["h", "w"], ["y"], domain="local")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [256, 256], [0.0] * 256 * 256)])
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                    helper.make_opsetid("local", 1)])
    model.ir_version = 8
    (tmp_path / "f.onnx").write_bytes(model.SerializeToString())
    v = extract_features(tmp_path / "f.onnx", batch_size=64).values
    assert v["flops"] == 2 * (2 * 64 * 256 * 256)


@pytest.mark.parametrize("equation, shapes, macs", [
    ("bhqd,bhkd->bhqk", [[2, 4, 8, 16], [2, 4, 12, 16]], 2 * 4 * 8 * 12 * 16),
    ("...ij,jk->...ik", [[2, 3, 4, 5], [5, 6]], 2 * 3 * 4 * 5 * 6),  # a Linear on any leading sizes
    ("...ij,...jk->...ik", [[3, 1, 4, 5], [7, 5, 6]], 3 * 7 * 4 * 5 * 6),  # broadcast batches
])
def test_einsum_costs_every_index_its_ellipsis_included(tmp_path, equation, shapes, macs):
    # an ellipsis had left Einsum without a rule: one FLOP per output element, a contraction
    # over j (5) and the op reported as one no rule costs
    graph = helper.make_graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], "g",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip("ab", shapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    r = extract_features(save(graph, tmp_path / "e.onnx"))
    assert r.by_op["Einsum"].flops == 2 * macs and r.unknown_ops == []


@pytest.mark.parametrize("node,says", [
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[-1000, 1]), "MaxPool"),
    (helper.make_node("Einsum", ["x", "x", "x", "x"], ["y"], equation="ab,cd,ef,gh->"), "Einsum"),
])
def test_attributes_that_make_a_cost_absurd_are_refused(tmp_path, node, says):
    # a negative kernel cancelled a network's FLOPs; huge products gave exaflops, exit 0
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096, 1 << 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ModelError, match=f"{says}.*not plausible"):
        extract_features(save(graph, tmp_path / "a.onnx"), batch_size=1)


def test_an_unbound_name_does_not_hide_huge_numbered_sizes(tmp_path):
    graph = helper.make_graph([helper.make_node("Foo", ["x"], ["y"], domain="acme")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2**31 - 1] * 3 + ["s"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    model.ir_version = 8
    (tmp_path / "n.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="not plausible"):
        extract_features(tmp_path / "n.onnx", batch_size=1)


def test_running_statistics_behind_an_identity_are_no_parameters(tmp_path):
    # exported before training, a fresh running variance (all ones) shares the norm weight's
    # initializer behind an Identity, and counted as a parameter
    from slurm_horus.graph.costs import parameter_tensors

    ones = helper.make_tensor("ones", TensorProto.FLOAT, [8], [1.0] * 8)
    zeros = helper.make_tensor("zeros", TensorProto.FLOAT, [8], [0.0] * 8)
    nodes = [helper.make_node("Identity", ["ones"], [f"{k}{i}"]) for i in (1, 2) for k in ("w", "var")]
    nodes += [helper.make_node("Identity", ["zeros"], [f"{k}{i}"]) for i in (1, 2) for k in ("b", "mean")]
    nodes += [helper.make_node("BatchNormalization", ["x", "w1", "b1", "mean1", "var1"], ["h"]),
              helper.make_node("BatchNormalization", ["h", "w2", "b2", "mean2", "var2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [ones, zeros])
    params = parameter_tensors(load_graph(save(graph, tmp_path / "bn.onnx"), batch_size=2))
    assert sorted(params) == ["b1", "b2", "w1", "w2"]


def test_a_layer_weight_shaped_like_a_tables_transpose_is_not_tied(tmp_path):
    # only a head whose product is the model's output (or its loss's input) can be the tied
    # embedding; a bias-free FFN weight of shape (256, 1024) beside a (1024, 256) position
    # table was dropped as tied
    from slurm_horus.graph.costs import parameter_tensors

    table = helper.make_tensor("pos", TensorProto.FLOAT, [1024, 256], [0.0] * 1024 * 256)
    w = helper.make_tensor("onnx::MatMul_7", TensorProto.FLOAT, [256, 1024], [0.0] * 1024 * 256)
    nodes = [helper.make_node("Gather", ["pos", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "onnx::MatMul_7"], ["h"]),
             helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [table, w])
    g = load_graph(save(graph, tmp_path / "u.onnx"), batch_size=2)
    assert sorted(parameter_tensors(g)) == ["onnx::MatMul_7", "pos"]
    nodes[2] = helper.make_node("Softmax", ["h"], ["y"])  # a head's logits: tied, counted once
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [table, w])
    assert sorted(parameter_tensors(load_graph(save(graph, tmp_path / "t.onnx"), batch_size=2))) == ["pos"]
    # GPT-2's loss-only export shifts the logits (a Slice) on their way to the loss: still tied
    ints = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in (("s0", 0), ("s1", -1), ("ax", 1))]
    nodes[2:] = [helper.make_node("Slice", ["h", "s0", "s1", "ax"], ["hs"]),
                 helper.make_node("Div", ["hs", "temp"], ["hd"]),
                 helper.make_node("LogSoftmax", ["hd"], ["y"])]
    temp = helper.make_tensor("temp", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [table, w, temp, *ints])
    assert sorted(parameter_tensors(load_graph(save(graph, tmp_path / "s.onnx"), batch_size=2))) == ["pos"]


def test_a_local_functions_constants_are_dropped_once_inlined(tmp_path):
    # the weights were dropped before inlining, and a function's Constant, copied into the graph
    # at each call, kept its values through every inference round
    from onnx import numpy_helper
    import numpy as np

    big = numpy_helper.from_array(np.zeros((512, 512), dtype=np.float32), "c")
    fn = helper.make_function("local", "AddC", ["a"], ["b"],
                              [helper.make_node("Constant", [], ["k"], value=big),
                               helper.make_node("Add", ["a", "k"], ["b"])], [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("AddC", ["x"], ["h"], domain="local"),
                               helper.make_node("AddC", ["h"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                    helper.make_opsetid("local", 1)])
    model.ir_version = 8
    (tmp_path / "c.onnx").write_bytes(model.SerializeToString())
    g = load_graph(tmp_path / "c.onnx", batch_size=1)
    consts = [a.t for n in g.nodes for a in n.attribute if a.HasField("t")]
    assert len(consts) == 2 and not any(t.raw_data or t.float_data for t in consts)


def test_a_node_listing_its_input_many_times_does_not_make_the_tied_head_search_explode(tmp_path):
    """Eight Identity views that each list their input 40 times made every path from a
    tied-head candidate count (40**8): a 1.7 KB file ran until the analysis timer (a review).
    Each (tensor, depth) is now answered once; the answer is unchanged: tied, counted once."""
    from slurm_horus.graph.costs import parameter_tensors

    table = helper.make_tensor("E", TensorProto.FLOAT, [6, 4], [0.0] * 24)
    head = helper.make_tensor("onnx::W", TensorProto.FLOAT, [4, 6], [0.0] * 24)
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("MatMul", ["h", "onnx::W"], ["t0"])]
    nodes += [helper.make_node("Identity", [f"t{d}"] * 40, [f"t{d + 1}"]) for d in range(8)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
                              [helper.make_tensor_value_info("t8", TensorProto.FLOAT, None)], [table, head])
    g = load_graph(save(graph, tmp_path / "fan.onnx"), batch_size=4)
    assert sorted(parameter_tensors(g)) == ["E"]  # the head's product is the output: tied
    for _ in range(3):  # each call alone had taken minutes
        assert sorted(parameter_tensors(g)) == ["E"]


def test_a_dimension_name_that_is_not_utf8_is_refused_not_costed_as_one(tmp_path):
    """protobuf hands such a name over as bytes: it was neither bound nor counted unknown, so a
    sequence input's unbound length was costed as 1 with no warning (a review)."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [64, 64], [0.0] * 64 * 64)
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, ["SEQLEN", 64])
    nodes = [helper.make_node("Constant", [], ["i0"], value=helper.make_tensor("iv", TensorProto.INT64, [], [0])),
             helper.make_node("SequenceAt", ["s", "i0"], ["t"]), helper.make_node("MatMul", ["t", "W"], ["y"])]
    graph = helper.make_graph(nodes, "g", [seq], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    good = save(graph, tmp_path / "str.onnx")
    assert "SEQLEN" in load_graph(good, batch_size=2).unknown_dims  # a str name: unbound, so refused
    # --dim binds it (it had been taken for a typo, and the advice to bind it could not work);
    # the batch size alone does not: a sequence's leading dimension is not known to be a batch
    g = load_graph(good, batch_size=2, dims={"SEQLEN": 128})
    assert g.unknown_dims == [] and g.bound_dims == {"SEQLEN": 128} and g.unused_dims == []
    assert g.tensors["y"].shape == (128, 64)
    # a 0 in a sequence's element is not refused as a plain input's is: no flag could bind it
    zero = helper.make_graph(nodes, "g", [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [0, 64])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    load_graph(save(zero, tmp_path / "zero.onnx"), batch_size=2)
    bad = tmp_path / "bytes.onnx"
    bad.write_bytes(good.read_bytes().replace(b"SEQLEN", b"\xff\xfeQLEN"))
    with pytest.raises(ModelError, match="not UTF-8 text"):
        load_graph(bad, batch_size=2)


def _loop_model(path, trip, n=64, nested_trip=None, cond=None):
    """s = tanh(s @ W), ``trip`` times (a Constant M, or None: M is a graph input), W (n, n)
    of the enclosing graph; ``nested_trip``: the body is itself such a Loop, run that often;
    ``cond``: None (no condition input), "pass" (the body hands it on) or "computed" (the body
    makes a new one: a while loop that M only bounds)."""
    def body(name, inner):
        ins = [helper.make_tensor_value_info(f"{name}_i", TensorProto.INT64, []),
               helper.make_tensor_value_info(f"{name}_c", TensorProto.BOOL, []),
               helper.make_tensor_value_info(f"{name}_s", TensorProto.FLOAT, ["batch", n])]
        outs = [helper.make_tensor_value_info(f"{name}_co", TensorProto.BOOL, []),
                helper.make_tensor_value_info(f"{name}_so", TensorProto.FLOAT, ["batch", n])]
        if inner is None:
            nodes = [helper.make_node("MatMul", [f"{name}_s", "W"], [f"{name}_m"]),
                     helper.make_node("Tanh", [f"{name}_m"], [f"{name}_so"])]
        else:
            nodes = [helper.make_node("Constant", [], [f"{name}_M"],
                                      value=helper.make_tensor("v", TensorProto.INT64, [], [inner])),
                     helper.make_node("Loop", [f"{name}_M", "", f"{name}_s"], [f"{name}_so"],
                                      body=body(f"{name}x", None), name="inner")]
        nodes.append(helper.make_node("Not" if cond == "computed" and inner is None and name == "b" else "Identity",
                                      [f"{name}_c"], [f"{name}_co"]))
        return helper.make_graph(nodes, name, ins, outs)

    w = helper.make_tensor("W", TensorProto.FLOAT, [n, n], [0.0] * n * n)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])]
    nodes = [helper.make_node("Loop", ["M", "c0" if cond else "", "x"], ["y"], body=body("b", nested_trip),
                              name="loop")]
    if cond:
        inputs.append(helper.make_tensor_value_info("c0", TensorProto.BOOL, []))
    if trip is None:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["M"],
                                         value=helper.make_tensor("m", TensorProto.INT64, [], [trip])))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return save(graph, path)


def test_a_loop_body_costs_its_trip_count_and_its_outer_weight_is_a_parameter(tmp_path):
    """A Loop's body and the weight it reads from the graph around it cost nothing: 100 steps
    of tanh(s @ W) were 0 parameters and 1 FLOP (a review)."""
    from slurm_horus.graph.features import features_of

    r = features_of(load_graph(_loop_model(tmp_path / "l.onnx", 100), batch_size=8), 8)
    assert r.values["params"] == 64 * 64 and r.by_op["MatMul"].params == 64 * 64
    assert r.by_op["MatMul"].flops == 100 * 2 * 8 * 64 * 64 and r.by_op["Tanh"].flops == 100 * 4 * 8 * 64
    assert r.values["kernels"] == 200 and r.unknown_ops == [] and r.warnings() == []
    # each iteration keeps its MatMul's input and its Tanh's output for the backward pass
    assert r.values["saved_activation_bytes"] == 100 * 2 * 8 * 64 * 4
    assert r.values["peak_live_bytes"] >= 3 * 8 * 64 * 4  # x, y, and the body's own tensors
    # a trip count computed at run time: the body once, and a warning that says so
    r = features_of(load_graph(_loop_model(tmp_path / "u.onnx", None), batch_size=8), 8)
    assert r.by_op["MatMul"].flops == 2 * 8 * 64 * 64 and r.values["params"] == 64 * 64
    assert r.single_trips == ["loop"]
    assert any("trip count of loop unknown" in w and "one iteration" in w for w in r.warnings())
    # nested loops multiply; beyond any plausible step they are refused, not summed to 1e30
    r = features_of(load_graph(_loop_model(tmp_path / "n.onnx", 10, nested_trip=7), batch_size=8), 8)
    assert r.by_op["MatMul"].flops == 70 * 2 * 8 * 64 * 64 and r.values["params"] == 64 * 64
    with pytest.raises(ModelError, match="not plausible"):
        features_of(load_graph(_loop_model(tmp_path / "h.onnx", 2**31 - 1, nested_trip=2**31 - 1),
                               batch_size=8), 8)



def test_a_loop_whose_condition_may_end_it_is_costed_once_not_m_times(tmp_path):
    """A generation loop bounds its steps with a large M and ends on a condition it computes:
    M was taken as exact (2^31 - 1 trips: 3.6e16 FLOPs, or the model refused as implausible)
    (a regression review).  A condition handed on unchanged leaves M exact."""
    from slurm_horus.graph.features import features_of

    r = features_of(load_graph(_loop_model(tmp_path / "w.onnx", 2**31 - 1, cond="computed"), batch_size=8), 8)
    assert r.by_op["MatMul"].flops == 2 * 8 * 64 * 64 and r.single_trips == ["loop"]
    assert any("may end it sooner" in w for w in r.warnings())
    r = features_of(load_graph(_loop_model(tmp_path / "p.onnx", 100, cond="pass"), batch_size=8), 8)
    assert r.by_op["MatMul"].flops == 100 * 2 * 8 * 64 * 64 and r.single_trips == []


def test_shape_arithmetic_through_a_small_float_vector_still_folds(tmp_path):
    """Shape -> Cast(float) -> Mul by a float vector initializer (an exporter's folded scale)
    -> Cast(int64) -> ConstantOfShape: folding had stopped at every float initializer, so the
    shape was lost (34 FLOPs instead of 2,048) and the vector counted as a parameter."""
    from slurm_horus.graph.features import features_of

    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["sf", "F"], ["sm"]),
             helper.make_node("Cast", ["sm"], ["si"], to=TensorProto.INT64),
             helper.make_node("ConstantOfShape", ["si"], ["z"],
                              value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
             helper.make_node("MatMul", ["z", "W"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("F", TensorProto.FLOAT, [2], [1.0, 2.0]),
                               helper.make_tensor("W", TensorProto.FLOAT, [16, 8], [0.0] * 128)])
    r = features_of(load_graph(save(graph, tmp_path / "f.onnx"), batch_size=8), 8)
    assert r.values["params"] == 128 and r.values["flops"] == 2 * 8 * 16 * 8


def test_folding_a_reduce_with_no_axes_and_noop_with_empty_axes_keeps_its_input(tmp_path):
    # ReduceMax(shape, axes=[]) with noop_with_empty_axes is the shape itself: folded as a
    # reduction over every axis, it had reshaped x [batch, 6] into [6]
    import numpy as np
    from onnx import numpy_helper

    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ReduceMax", ["s", "none"], ["r"], noop_with_empty_axes=1),
             helper.make_node("Reshape", ["x", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.zeros(0, np.int64), "none")])
    assert load_graph(save(graph, tmp_path / "r.onnx", opset=18), batch_size=2).tensors["y"].shape == (2, 6)


def test_an_if_costs_its_costlier_branch_and_counts_both_branches_weights(tmp_path):
    from slurm_horus.graph.features import features_of

    out = [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["batch", 64])]
    heavy = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["o"])], "then", [], out)
    light = helper.make_graph([helper.make_node("Mul", ["x", "g"], ["o"])], "else", [], out)
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=light, else_branch=heavy, name="if"),
         helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("W", TensorProto.FLOAT, [64, 64], [0.0] * 64 * 64),
         helper.make_tensor("g", TensorProto.FLOAT, [64], [1.0] * 64)])
    r = features_of(load_graph(save(graph, tmp_path / "if.onnx"), batch_size=4), 4)
    assert r.values["params"] == 64 * 64 + 64  # the branch not costed still holds a weight
    assert r.by_op["If"].params == 64 and "Mul" not in r.by_op
    assert r.values["flops"] == 2 * 4 * 64 * 64 + 4 * 64  # the MatMul branch, then the Relu
    assert r.unknown_ops == [] and r.warnings() == []


def test_a_scan_body_costs_its_scan_length(tmp_path):
    from slurm_horus.graph.features import features_of

    body = helper.make_graph(
        [helper.make_node("MatMul", ["xt", "W"], ["a"]), helper.make_node("Add", ["a", "h"], ["h2"]),
         helper.make_node("Identity", ["h2"], ["yt"])], "body",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("xt", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("h2", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("yt", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["h0", "xs"], ["hT", "ys"], body=body, num_scan_inputs=1)], "g",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["batch", 16]),
         helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["seq", "batch", 16])],
        [helper.make_tensor_value_info("hT", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)],
        [helper.make_tensor("W", TensorProto.FLOAT, [16, 16], [0.0] * 256)])
    path = save(graph, tmp_path / "scan.onnx")
    r = features_of(load_graph(path, batch_size=8, dims={"seq": 10}), 8)
    assert r.values["params"] == 256 and r.by_op["MatMul"].flops == 10 * 2 * 8 * 16 * 16
    assert r.warnings() == []


def test_folding_never_turns_a_weight_into_a_constant(tmp_path):
    """Shape folding evaluated whatever had values, small weights included: Linear's W.t() of a
    training-mode export, a Gather from a position table, the Identity copy of a deduplicated
    norm weight became Constants and stopped being parameters (0 of 24,576; a review)."""
    import numpy as np
    from onnx import numpy_helper

    n = 64
    const = lambda name, v: helper.make_node("Constant", [], [name],  # noqa: E731
                                             value=helper.make_tensor(name, TensorProto.INT64, [], [v]))
    nodes = [const("zero", 0), const("one", 1), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["L"]),
             helper.make_node("Range", ["zero", "L", "one"], ["pos"]),  # leaves seq to folding
             helper.make_node("Gather", ["P", "pos"], ["pe"]), helper.make_node("Add", ["x", "pe"], ["h"]),
             helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "Wt"], ["m"]),
             helper.make_node("Identity", ["gamma"], ["ln2.weight"]),
             helper.make_node("LayerNormalization", ["m", "gamma"], ["l1"], axis=-1),
             helper.make_node("LayerNormalization", ["l1", "ln2.weight"], ["y"], axis=-1)]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random((n, n), dtype=np.float32), "W"),
             numpy_helper.from_array(rng.random((32, n), dtype=np.float32), "P"),
             numpy_helper.from_array(np.ones(n, np.float32), "gamma")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    r = extract_features(save(graph, tmp_path / "f.onnx"), batch_size=2, dims={"seq": 16})
    assert r.values["params"] == n * n + 32 * n + 2 * n
    assert r.by_op["MatMul"].flops == 2 * 2 * 16 * n * n and r.unknown_dims == []


def test_a_fixed_batch_warns_whatever_value_another_dimension_took(tmp_path):
    """The warning looked for the batch size among all bound values: --dim seq=8 with -b 8 hid
    it, and the figures were for batch 16 (a review)."""
    path = _matmul_inputs(tmp_path / "f.onnx", [16, "seq", 64])
    for seq in (8, 9):
        r = extract_features(path, batch_size=8, dims={"seq": seq})
        assert r.fixed_batch == [16] and any("batch size 8 not applied" in w for w in r.warnings())
    assert extract_features(path, batch_size=16, dims={"seq": 8}).fixed_batch == []


def test_an_unnamed_input_dimension_is_bound_by_its_position(tmp_path):
    """ONNX calls an input's unnamed dynamic size unk__0, which --dim cannot bind: the error
    advised --dim unk__0=VALUE, which did nothing (a review)."""
    from slurm_horus.errors import HorusError

    path = _matmul_inputs(tmp_path / "u.onnx", ["batch", None, 64])
    r = extract_features(path, batch_size=8)
    assert r.unnamed_dims == ["x0[1]"]
    with pytest.raises(HorusError, match=r"dimension\(s\) x0\[1\] unbound; add --dim NAME=VALUE "
                                         r"\(e.g. --dim x0\[1\]=512; an input's unnamed dimension is INPUT\[POS\]"):
        r.require_bound()
    r = extract_features(path, batch_size=8, dims={"x0[1]": 32})
    assert r.bound_dims == {"batch": 8, "x0[1]": 32} and r.unknown_dims == [] and r.unused_dims == []
    assert r.by_op["MatMul"].flops == 2 * 8 * 32 * 64 * 64
    r.require_bound()


def test_a_sparse_initializer_is_a_parameter_of_its_full_shape(tmp_path):
    """A weight stored as a sparse_initializer had 0 parameters and left its MatMul without
    shapes, reported as having no cost rule (a review)."""
    values = helper.make_tensor("W", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    indices = helper.make_tensor("W_idx", TensorProto.INT64, [4], [0, 513, 1026, 1539])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              sparse_initializer=[helper.make_sparse_tensor(values, indices, [512, 512])])
    r = extract_features(save(graph, tmp_path / "s.onnx"), batch_size=8)
    assert r.values["params"] == 512 * 512 and r.values["flops"] == 2 * 8 * 512 * 512
    assert r.warnings() == []
    # its files are checked as a dense weight's
    values.data_location = TensorProto.EXTERNAL
    values.ClearField("float_data")
    values.external_data.add(key="location", value="../w.bin")
    graph.ClearField("sparse_initializer")
    graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [512, 512]))
    with pytest.raises(ModelError, match="outside the model's folder"):
        load_graph(save(graph, tmp_path / "e.onnx"), batch_size=8)


def test_an_op_whose_inputs_have_no_shape_is_not_reported_as_having_no_rule(tmp_path):
    from slurm_horus.graph.features import features_of

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor("W", TensorProto.FLOAT, [16, 8], [0.0] * 128)])
    r = features_of(load_graph(save(graph, tmp_path / "n.onnx"), batch_size=4), 4)
    assert r.unknown_ops == [] and r.unshaped_ops == ["MatMul"] and r.values["n_unknown_ops"] == 1
    assert r.values["flops"] == 4 * 8  # one per output element, as the warning says
    assert any(w.startswith("shapes of the inputs of MatMul unknown: costed at one FLOP per output")
               for w in r.warnings())
    assert not any("no cost rule" in w for w in r.warnings())


def test_a_file_that_cannot_be_a_message_is_refused_before_it_is_read(tmp_path):
    """A 2 GiB file of zeros (sparse on disk) was read whole, 2.1 GB, before protobuf refused it."""
    zeros = tmp_path / "zeros.onnx"
    with open(zeros, "wb") as f:
        f.truncate(2**31 - 2)
    proc = subprocess.run([sys.executable, "-m", "slurm_horus.cli.horus", "features", str(zeros)],
                          capture_output=True, text=True, timeout=60, preexec_fn=_limit_memory)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        f"horus features: error: {zeros}: not a readable ONNX model (no protobuf field at byte 0)"]
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(mlp(tmp_path / "m.onnx").read_bytes()[:-10])
    with pytest.raises(ModelError, match="runs past the end of the file"):
        load_graph(cut, batch_size=1)
    assert load_graph(tmp_path / "m.onnx", batch_size=1).nodes  # the whole file still loads


def test_an_einsum_equation_that_is_not_utf8_is_a_model_error(tmp_path):
    import onnx

    node = helper.make_node("Einsum", ["x", "x"], ["y"], name="mix")
    attr = node.attribute.add()
    attr.name, attr.type, attr.s = "equation", onnx.AttributeProto.STRING, b"\xff\xfe"
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ModelError, match=r"node 'mix' \(Einsum\): its equation is not UTF-8 text"):
        extract_features(save(graph, tmp_path / "e.onnx"), batch_size=2)


def _lm(path, head, bias: bool, table=None, v: int = 50, d: int = 8):
    """A language model as PyTorch's constant-folded export leaves it: an embedding table
    Gathered, a tanh layer, a head 'onnx::MatMul_216' of shape (d, v) (a tied one is the
    table transposed) with an optional bias, LogSoftmax (word_language_model's --tied)."""
    import numpy as np
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((v, d)).astype(np.float32) if table is None else table
    head = table.T.copy() if isinstance(head, str) else head
    inits = [numpy_helper.from_array(table, "encoder.weight"), numpy_helper.from_array(head, "onnx::MatMul_216"),
             numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), "onnx::MatMul_215")]
    nodes = [helper.make_node("Gather", ["encoder.weight", "x"], ["e"]),
             helper.make_node("MatMul", ["e", "onnx::MatMul_215"], ["h0"]), helper.make_node("Tanh", ["h0"], ["h"]),
             helper.make_node("MatMul", ["h", "onnx::MatMul_216"], ["m"])]
    if bias:
        inits.append(numpy_helper.from_array(np.zeros(v, np.float32), "decoder.bias"))
        nodes.append(helper.make_node("Add", ["m", "decoder.bias"], ["logits"]))
    nodes.append(helper.make_node("LogSoftmax", ["logits" if bias else "m"], ["y"], axis=-1))
    graph = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("x", TensorProto.INT64, ["seq", "batch"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", "batch", v])], inits)
    return save(graph, path)


def test_a_folded_head_is_tied_by_its_values_not_by_its_bias(tmp_path):
    """A constant-folded export was judged tied or untied by the head's bias alone: PyTorch's
    word_language_model --tied (its decoder has a bias) counted the table twice, an untied
    head without a bias (LLaMA's) once (a review).  Inline values decide now."""
    import numpy as np

    from slurm_horus.graph.features import features_of

    def params(path):
        return features_of(load_graph(path, batch_size=2, dims={"seq": 4}), 2).values["params"]

    v, d = 50, 8
    other = np.random.default_rng(1).standard_normal((d, v)).astype(np.float32)
    assert params(_lm(tmp_path / "tied_bias.onnx", "tied", bias=True)) == v * d + d * d + v
    assert params(_lm(tmp_path / "untied.onnx", other, bias=False)) == 2 * v * d + d * d
    assert params(_lm(tmp_path / "tied.onnx", "tied", bias=False)) == v * d + d * d
    assert params(_lm(tmp_path / "untied_bias.onnx", other, bias=True)) == 2 * v * d + d * d + v
    # a placeholder table (one value repeated) says nothing: the bias decides, as for weights
    # kept outside the file
    zeros = np.zeros((v, d), np.float32)
    assert params(_lm(tmp_path / "z.onnx", "tied", bias=False, table=zeros)) == v * d + d * d
    assert params(_lm(tmp_path / "zb.onnx", "tied", bias=True, table=zeros)) == 2 * v * d + d * d + v


def _prelu(path, view: str, fold: bool = True):
    """PReLU's one-element weight as nn.PReLU exports leave it: read directly and through an
    Identity copy (eval, deduplicated), or each through an Unsqueeze (training mode); ``fold``
    adds position ids over the sequence (a Range), which leaves a size to shape folding."""
    w = [helper.make_tensor(n, TensorProto.FLOAT, [1], [0.25]) for n in ("act.weight", "act2.weight")]
    const = lambda name, v, dims=(): helper.make_node(  # noqa: E731
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, list(dims), v))
    if view == "identity":
        nodes = [helper.make_node("Identity", ["act.weight"], ["w_copy"]),
                 helper.make_node("PRelu", ["x", "act.weight"], ["h"]),
                 helper.make_node("PRelu", ["h", "w_copy"], ["y0"])]
        w = w[:1]
    else:
        nodes = [const("ax", [0], [1]),
                 helper.make_node("Unsqueeze", ["act.weight", "ax"], ["u1"]),
                 helper.make_node("Unsqueeze", ["act2.weight", "ax"], ["u2"]),
                 helper.make_node("PRelu", ["x", "u1"], ["h"]), helper.make_node("PRelu", ["h", "u2"], ["y0"])]
    if fold:
        nodes += [helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
                  helper.make_node("Squeeze", ["s"], ["n"]), const("zero", [0]), const("one", [1]),
                  helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
                  helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
                  helper.make_node("Add", ["y0", "posf"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])], w)
    return save(graph, path)


@pytest.mark.parametrize("view", ["identity", "unsqueeze"])
def test_a_small_weight_read_through_a_view_stays_a_parameter_when_folding_runs(tmp_path, view):
    """Shape folding turned a view of a float weight of 8 elements or fewer into a Constant:
    nn.PReLU's weight, behind an exporter's Identity copy (eval) or an Unsqueeze (training),
    stopped being a parameter, and only where a size was left to folding (a review)."""
    from slurm_horus.graph.features import features_of

    for fold in (True, False):
        g = load_graph(_prelu(tmp_path / f"p{fold}.onnx", view, fold), batch_size=2, dims={"seq": 16})
        assert features_of(g, 2).values["params"] == 2, (view, fold)


def test_large_integer_weights_are_not_copied_into_every_inference_round(tmp_path, monkeypatch):
    """An int8 QDQ model kept its weights' values through every round of shape inference: 200
    MB peaked at 1 GB, and larger ones ran out of the analysis's memory (a review)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from slurm_horus.graph.load import _drop_weight_values

    d, rng = 1024, np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-128, 127, (d, d), dtype=np.int8), "w"),
             numpy_helper.from_array(np.array(0.01, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.zeros((2, 70000), np.int64), "table"),
             numpy_helper.from_array(np.zeros((2, 4), np.int64), "small")]
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"]),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = save(graph, tmp_path / "q.onnx")
    sizes = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, *a, **k: sizes.append(model.ByteSize()) or real(model, *a, **k))
    g = load_graph(path, batch_size=4)
    assert sizes and max(sizes) < 10_000 and g.tensors["y"].shape == (4, d)
    assert g.initializers["w"] == g.tensors["w"] and g.initializers["w"].shape == (d, d)
    model = onnx.load(str(path))
    _drop_weight_values(model)
    kept = {t.name for t in model.graph.initializer if t.raw_data}
    assert kept == {"s", "z", "small"}  # folding reads small ones


def test_a_local_function_of_another_onnx_version_is_inlined_where_it_means_the_same(tmp_path):
    """ONNX's inliner leaves a call of a function importing another ONNX version than the
    model's: a function of two MatMuls at opset 18 called from an opset-17 model cost 8 FLOPs
    (one per output element, an op without a rule) instead of 256 (a review)."""
    def model(path, ops):
        nodes, prev = [], "a"
        for i, op in enumerate(ops):
            nodes.append(helper.make_node(op, [prev, "w"] if op == "MatMul" else [prev], [f"t{i}"]))
            prev = f"t{i}"
        fn = helper.make_function("local", "F", ["a", "w"], [prev], nodes, [helper.make_opsetid("", 18)])
        graph = helper.make_graph([helper.make_node("F", ["x", "w"], ["y"], domain="local")], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.0] * 16)])
        m = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                    helper.make_opsetid("local", 1)])
        m.ir_version = 8
        path.write_bytes(m.SerializeToString())
        return path

    r = extract_features(model(tmp_path / "f.onnx", ["MatMul", "MatMul"]), batch_size=4)
    assert r.values["flops"] == 2 * (2 * 4 * 4 * 4) and r.unknown_ops == [] and r.warnings() == []
    # ReduceMean takes its axes as an input from opset 18: that function is left as it is
    r = extract_features(model(tmp_path / "r.onnx", ["MatMul", "ReduceMean"]), batch_size=4)
    assert r.unknown_ops == ["local.F"]


def test_a_tensor_with_two_external_data_locations_is_refused(tmp_path):
    """Only the first location was checked; ONNX's reader takes the last (a review)."""
    w = external_tensor("w", [16, 32], "w.bin")
    w.external_data.add(key="location", value="/etc/shadow")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    with pytest.raises(ModelError, match="2 external-data locations; refusing it"):
        load_graph(save(graph, tmp_path / "m.onnx"), batch_size=1)


def test_an_unbound_dimension_with_a_huge_name_is_refused_in_a_short_line(tmp_path):
    """A name of a million characters made a 2 MB error line (a review)."""
    from slurm_horus.errors import HorusError

    name = "s" * 1_000_000
    r = extract_features(_matmul_inputs(tmp_path / "n.onnx", ["batch", name, 64]), batch_size=2)
    with pytest.raises(HorusError) as e:
        r.require_bound()
    assert len(str(e.value)) < 400 and "s" * 77 + "..." in str(e.value)
