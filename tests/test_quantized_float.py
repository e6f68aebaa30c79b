"""A low-precision float model's weights (FP8, FP4, FP6): stored, frozen weights like int8 ones,
counted apart as quantized at their stored size, never trained as float parameters; their
scales and zero points are never weights.

The graphs are laid out as ONNX's own quantization writes them (DequantizeLinear of an FP8
weight, per channel; MX block scaling: FP4 data, FLOAT8E8M0 block scales) and as an exporter
upcasts a stored weight (Cast), built with onnx.helper.
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from graphs import external_tensor
from slurm_horus.graph.features import extract_features
from slurm_horus.graph.load import TensorInfo, load_graph
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu

F = TensorProto.FLOAT
FP8 = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2,
       TensorProto.FLOAT8E5M2FNUZ)
# the newer types, where this onnx has them (MX block scaling: opset 24, FLOAT6: opset 28)
FP4 = getattr(TensorProto, "FLOAT4E2M1", None)
E8M0 = getattr(TensorProto, "FLOAT8E8M0", None)
FP6 = tuple(getattr(TensorProto, n) for n in ("FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, n))
needs_fp4 = pytest.mark.skipif(FP4 is None or E8M0 is None or onnx.defs.onnx_opset_version() < 24,
                               reason="this onnx has no MX block scaling (FLOAT4E2M1, FLOAT8E8M0)")
needs_fp6 = pytest.mark.skipif(not FP6 or onnx.defs.onnx_opset_version() < 28,
                               reason="this onnx has no FLOAT6 (opset 28)")


def _w(name, dtype, dims, value=0.5):
    return helper.make_tensor(name, dtype, dims, [value] * math.prod(dims))


def _save(path: Path, nodes, inits, k, n, opset, outputs=()) -> Path:
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", F, ["batch", k])],
                              [helper.make_tensor_value_info("y", F, ["batch", n]), *outputs], inits)
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
                     .SerializeToString())
    return path


def _dq_linear(path: Path, dtype, k, n, opset, w=None) -> Path:
    """x -> MatMul(DequantizeLinear(W [k, n] of ``dtype``, per-channel scale and zero point)) ->
    Add(float bias [n]) -> y, as ONNX's FP8 quantization writes a Linear layer."""
    inits = [w if w is not None else _w("w_q", dtype, [k, n]), _w("w_s", F, [n], 0.01),
             _w("w_zp", dtype, [n], 0.0), _w("b", F, [n], 0.0)]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    return _save(path, nodes, inits, k, n, opset)


@pytest.mark.parametrize("dtype", FP8)
def test_an_fp8_weight_dequantized_is_a_quantized_parameter(tmp_path, dtype):
    """Each FP8 type: the weight one byte a value, counted quantized; its scale and zero point
    (an FP8 vector, a weight's type) no parameter; the float bias the one trainable one (the
    FP8 weight had been a trainable float parameter)."""
    k, n = 64, 32
    r = extract_features(_dq_linear(tmp_path / "fp8.onnx", dtype, k, n, 21), batch_size=1)
    assert (r.values["params"], r.values["param_bytes"]) == (k * n + n, k * n + 4 * n)
    assert (r.quantized_params, r.quantized_param_bytes) == (k * n, k * n)
    assert r.by_op["DequantizeLinear"].params == k * n and r.by_op["Add"].params == n


@needs_fp4
def test_an_mxfp4_weight_packs_two_a_byte_and_its_block_scales_are_not_weights(tmp_path):
    """MXFP4: FP4 data [k, n] two values a byte, one FLOAT8E8M0 scale per 32 along k."""
    k, n = 64, 32
    inits = [_w("w_q", FP4, [k, n]), _w("w_s", E8M0, [k // 32, n], 1.0)]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], axis=0, block_size=32,
                              output_dtype=F),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    r = extract_features(_save(tmp_path / "mxfp4.onnx", nodes, inits, k, n, 24), batch_size=1)
    assert (r.values["params"], r.values["param_bytes"]) == (k * n, k * n // 2)
    assert (r.quantized_params, r.quantized_param_bytes) == (k * n, k * n // 2)
    assert r.by_op["MatMul"].flops == 2 * k * n


@needs_fp6
@pytest.mark.parametrize("dtype", FP6)
def test_an_fp6_weight_counts_packed_four_in_three_bytes(tmp_path, dtype):
    """FLOAT6 weights had been no parameter at all (no float type costing knew, no integer one)."""
    k, n = 64, 32
    r = extract_features(_dq_linear(tmp_path / "fp6.onnx", dtype, k, n, 28), batch_size=1)
    assert (r.values["params"], r.values["param_bytes"]) == (k * n + n, k * n * 6 // 8 + 4 * n)
    assert (r.quantized_params, r.quantized_param_bytes) == (k * n, k * n * 6 // 8)


@pytest.mark.parametrize("dtype", (FP8[0], *FP6))
def test_a_low_precision_weight_upcast_by_a_cast_is_one_all_the_same(tmp_path, dtype):
    """Read by a Cast instead, the stored weight is the same one: quantized wherever read, as a
    float weight is a parameter wherever read.  The NonZero leaves a size symbolic, so shape
    folding runs: it had made a Constant of the small FP6 weight (no parameter left)."""
    if dtype in FP6 and onnx.defs.onnx_opset_version() < 28:
        pytest.skip("this onnx has no FLOAT6 (opset 28)")
    k, n = 16, 8
    nodes = [helper.make_node("Cast", ["w_q"], ["w"], to=F), helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("NonZero", ["x"], ["nz"])]
    path = _save(tmp_path / "cast.onnx", nodes, [_w("w_q", dtype, [k, n])], k, n, 28 if dtype in FP6 else 21,
                 outputs=[helper.make_tensor_value_info("nz", TensorProto.INT64, None)])
    r = extract_features(path, batch_size=1)
    assert r.values["params"] == r.quantized_params == k * n
    assert r.by_op["Cast"].params == k * n and r.by_op["MatMul"].flops == 2 * k * n


@pytest.mark.parametrize("trans_a, trans_b, dtype", [(0, 0, F), (0, 1, F), (1, 0, TensorProto.FLOAT16),
                                                     (1, 1, TensorProto.BFLOAT16)])
@pytest.mark.parametrize("schemas", [True, False])
def test_gemm_float8_gives_the_op_after_it_its_product_shape(tmp_path, monkeypatch, trans_a, trans_b, dtype,
                                                             schemas):
    """GemmFloat8's output, declared nowhere, is [M, N] of its dtype (ONNX has no schema for
    it): it had taken A's shape and type, [M, K] FP8, costed 2·M·K·K and misshaped the Relu
    after it.  Without schemas from Python, the rounds apply the same rule."""
    k, n = 64, 32
    if not schemas:
        monkeypatch.setattr(onnx.defs, "register_schema", lambda schema: 1 / 0)
    inits = [_w("w_q", FP8[0], [n, k] if trans_b else [k, n]), _w("x_s", F, [], 0.1), _w("w_s", F, [1], 0.01),
             _w("y_s", F, [1], 1.0), _w("x_zp", FP8[0], [], 0.0)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["x_q"]),
             helper.make_node("GemmFloat8", ["x_q", "w_q", "", "x_s", "w_s", "y_s"], ["g"], domain="com.microsoft",
                              transA=trans_a, transB=trans_b, dtype=dtype),
             helper.make_node("Relu", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", F, [k, "batch"] if trans_a else ["batch", k])],
                              [helper.make_tensor_value_info("y", dtype, None)], inits)
    path = tmp_path / "gemm8.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                              helper.make_opsetid("com.microsoft", 1)])
                     .SerializeToString())
    g = load_graph(path, batch_size=4)
    assert g.tensors["g"] == g.tensors["y"] == TensorInfo(dtype, (4, n)) and g.assumed_shapes == []
    r = extract_features(path, batch_size=4)
    assert r.by_op["GemmFloat8"].flops == 2 * 4 * k * n
    assert r.by_op["Relu"].activation_bytes == 4 * n * (4 if dtype == F else 2)


def test_an_fp8_model_trains_its_float_bias_alone(tmp_path):
    """A 64 MiB FP8 weight [8192, 8192] and its float bias: the weight held at its stored size
    whatever the job's precision, with no gradient, optimizer state or optimizer step; as a
    trainable float parameter it had made 256 MiB of fp32 weights, 256 of gradients and 512
    of Adam's moments."""
    k = n = 8192
    path = _dq_linear(tmp_path / "big.onnx", FP8[0], k, n, 21, w=external_tensor("w_q", [k, n], "w_q.bin", FP8[0], k * n))
    r = extract_features(path, batch_size=1)
    assert r.quantized_param_bytes == k * n and r.values["params"] - r.quantized_params == n
    gpu, est = get_gpu("a100"), ColdStartEstimator()
    train = est.predict(r, gpu, Workload(batch_size=1, task="train", optimizer="adam")).breakdown
    assert (train["weights_mib"], train["grads_mib"], train["optimizer_mib"]) == (64.0, 0.0, 0.1)
    for precision in ("amp", "bf16"):
        infer = est.predict(r, gpu, Workload(batch_size=1, task="infer", precision=precision))
        assert infer.breakdown["weights_mib"] == 64.0


def test_onnxruntime_gemm_float8_is_a_matmul_over_its_fp8_weight(tmp_path):
    """onnxruntime's GemmFloat8 (com.microsoft; A, B, C, scaleA, scaleB, scaleY): B transposed
    is the FP8 weight, costed as a matrix product; its scales (scalars or one-element vectors)
    are no parameters.  It had
    been an unknown op (one FLOP per output element) with trainable float scales."""
    k, n = 64, 32
    inits = [_w("w_q", FP8[0], [n, k]), _w("x_s", F, [], 0.1), _w("w_s", F, [1], 0.01), _w("y_s", F, [1], 1.0),
             _w("x_zp", FP8[0], [], 0.0)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["x_q"]),
             helper.make_node("GemmFloat8", ["x_q", "w_q", "", "x_s", "w_s", "y_s"], ["y"],
                              domain="com.microsoft", transB=1, dtype=F)]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", F, ["batch", k])],
                              [helper.make_tensor_value_info("y", F, ["batch", n])], inits)
    path = tmp_path / "gemm8.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                              helper.make_opsetid("com.microsoft", 1)])
                     .SerializeToString())
    r = extract_features(path, batch_size=4)
    assert r.values["params"] == r.quantized_params == k * n
    assert r.by_op["GemmFloat8"].flops == 2 * 4 * k * n
    assert r.values["frac_flops_matmul"] * r.values["flops"] == pytest.approx(2 * 4 * k * n)
