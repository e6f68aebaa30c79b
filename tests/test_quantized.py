"""A quantized model's weights: counted as parameters at their stored size (int8 one byte, int4
half of one), never their scales or zero points; a fake-quant (QAT) float weight once.

The graphs are laid out as onnxruntime's quantizer writes them (quantize_static's QDQ and
QOperator formats, quantize_dynamic's MatMulInteger, its MatMulNBits 4-bit weight-only LLM
layers), built with onnx.helper since neither torch nor onnxruntime is a dependency here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphs import external_tensor, mlp
from slurm_horus.graph.features import extract_features
from slurm_horus.graph.load import TensorInfo
from slurm_horus.predict.coldstart import MIB, ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu

F, I8, U8, I32, I4 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32, TensorProto.INT4


def _t(name, dtype, dims, value=1):
    """An initializer of `dims` (no dims: a scalar) holding `value`."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    return numpy_helper.from_array(np.full(dims, value, dtype=np_type), name) \
        if dtype != I4 else helper.make_tensor(name, dtype, dims, [value] * int(np.prod(dims)))


def _save(path: Path, nodes, inputs, outputs, inits, opset=13, ms=False) -> Path:
    graph = helper.make_graph(nodes, "q", inputs, outputs, inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10 if opset >= 21 else 8
    path.write_bytes(model.SerializeToString())
    return path


def _qdq(src, dst, scale, zp, axis=None):
    """QuantizeLinear -> DequantizeLinear, the pair quantize_static puts on each activation."""
    kw = {} if axis is None else {"axis": axis}
    return [helper.make_node("QuantizeLinear", [src, scale, zp], [src + "_q"], **kw),
            helper.make_node("DequantizeLinear", [src + "_q", scale, zp], [dst], **kw)]


def qdq_cnn(path: Path) -> Path:
    """quantize_static, QDQ format, per-channel: x -> Q/DQ -> Conv(DQ(int8 W), DQ(int32 B)) ->
    Relu -> Q/DQ -> GlobalAveragePool -> Flatten -> Q/DQ -> Gemm(DQ(int8 W2), DQ(int32 B2))."""
    inits = [_t("x_s", F, [], 0.1), _t("x_zp", U8, [], 128), _t("c_s", F, [], 0.1), _t("c_zp", U8, [], 0),
             _t("f_s", F, [], 0.1), _t("f_zp", U8, [], 0),
             _t("w_q", I8, [16, 3, 3, 3]), _t("w_s", F, [16], 0.01), _t("w_zp", I8, [16], 0),
             _t("b_q", I32, [16]), _t("b_s", F, [16], 0.001), _t("b_zp", I32, [16], 0),
             _t("w2_q", I8, [16, 10]), _t("w2_s", F, [], 0.01), _t("w2_zp", I8, [], 0),
             _t("b2_q", I32, [10]), _t("b2_s", F, [], 0.001), _t("b2_zp", I32, [], 0)]
    nodes = [*_qdq("x", "x_dq", "x_s", "x_zp"),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], axis=0),
             helper.make_node("DequantizeLinear", ["b_q", "b_s", "b_zp"], ["b"], axis=0),
             helper.make_node("Conv", ["x_dq", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             *_qdq("r", "r_dq", "c_s", "c_zp"),
             helper.make_node("GlobalAveragePool", ["r_dq"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             *_qdq("f", "f_dq", "f_s", "f_zp"),
             helper.make_node("DequantizeLinear", ["w2_q", "w2_s", "w2_zp"], ["w2"]),
             helper.make_node("DequantizeLinear", ["b2_q", "b2_s", "b2_zp"], ["b2"]),
             helper.make_node("Gemm", ["f_dq", "w2", "b2"], ["y"])]
    return _save(path, nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", F, ["batch", 10])], inits)


def qop_cnn(path: Path) -> Path:
    """quantize_static, QOperator format, then quantize_dynamic's head: QuantizeLinear ->
    QLinearConv(int8 W, int32 B) -> DequantizeLinear -> GlobalAveragePool -> Flatten ->
    DynamicQuantizeLinear -> MatMulInteger(int8 W2) -> Cast -> Mul(scales)."""
    inits = [_t("x_s", F, [], 0.1), _t("x_zp", U8, [], 128), _t("y_s", F, [], 0.1), _t("y_zp", U8, [], 0),
             _t("w_q", I8, [16, 3, 3, 3]), _t("w_s", F, [16], 0.01), _t("w_zp", I8, [16], 0),
             _t("b_q", I32, [16]),
             _t("w2_q", I8, [16, 10]), _t("w2_s", F, [], 0.01), _t("w2_zp", I8, [10], 0)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["x_q"]),
             helper.make_node("QLinearConv", ["x_q", "x_s", "x_zp", "w_q", "w_s", "w_zp", "y_s", "y_zp",
                                              "b_q"], ["c_q"], pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["c_q", "y_s", "y_zp"], ["c"]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("DynamicQuantizeLinear", ["f"], ["f_q", "f_s", "f_zp"]),
             helper.make_node("MatMulInteger", ["f_q", "w2_q", "f_zp", "w2_zp"], ["m"]),
             helper.make_node("Cast", ["m"], ["mf"], to=F),
             helper.make_node("Mul", ["f_s", "w2_s"], ["s"]),
             helper.make_node("Mul", ["mf", "s"], ["y"])]
    return _save(path, nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", F, ["batch", 10])], inits)


def test_qdq_weights_are_parameters_and_their_scales_are_not(tmp_path):
    r = extract_features(qdq_cnn(tmp_path / "qdq.onnx"), batch_size=2)
    # int8 conv weight, int32 bias, int8 FC weight, int32 bias: the float model's 618 parameters
    assert r.values["params"] == 16 * 27 + 16 + 16 * 10 + 10
    assert r.values["param_bytes"] == 16 * 27 + 16 * 4 + 16 * 10 + 10 * 4
    assert r.by_op["DequantizeLinear"].params == 618 and r.by_op["Conv"].params == 0
    assert (r.quantized_params, r.quantized_param_bytes) == (618, 696)


def test_qoperator_and_dynamic_weights_are_parameters(tmp_path):
    r = extract_features(qop_cnn(tmp_path / "qop.onnx"), batch_size=2)
    assert r.values["params"] == 16 * 27 + 16 + 16 * 10
    assert r.values["param_bytes"] == 16 * 27 + 16 * 4 + 16 * 10
    assert r.by_op["QLinearConv"].params == 16 * 27 + 16 and r.by_op["MatMulInteger"].params == 160
    assert r.by_op["QLinearConv"].flops == 2 * 2 * 16 * 8 * 8 * 27  # the weight is still read


def test_conv_integer_weight_is_a_parameter_its_zero_point_is_not(tmp_path):
    inits = [_t("w_q", I8, [8, 3, 3, 3]), _t("x_zp", U8, [], 128), _t("w_zp", I8, [8], 0)]
    path = _save(tmp_path / "ci.onnx", [helper.make_node("ConvInteger", ["x", "w_q", "x_zp", "w_zp"], ["y"])],
                 [helper.make_tensor_value_info("x", U8, ["batch", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 8, 6, 6])], inits)
    r = extract_features(path, batch_size=1)
    assert (r.values["params"], r.values["param_bytes"]) == (216, 216)


def test_int4_weights_pack_two_a_byte(tmp_path):
    """opset 21 block quantization (quantize_static / MatMul4BitsQuantizer's QDQ int4 output):
    DequantizeLinear(int4 W [64, 32], scale [2, 32], int4 zero point, block_size 32) -> MatMul."""
    inits = [_t("w_q", I4, [64, 32]), _t("w_s", F, [2, 32], 0.01), _t("w_zp", I4, [2, 32], 0)]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], axis=0, block_size=32),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    path = _save(tmp_path / "i4.onnx", nodes, [helper.make_tensor_value_info("x", F, ["batch", 64])],
                 [helper.make_tensor_value_info("y", F, ["batch", 32])], inits, opset=21)
    r = extract_features(path, batch_size=1)
    assert (r.values["params"], r.values["param_bytes"]) == (64 * 32, 64 * 32 // 2)
    assert TensorInfo(TensorProto.INT4, (7, 3)).nbytes == 11  # an odd count fills its last byte
    assert TensorInfo(TensorProto.UINT2, (9,)).nbytes == 3


def test_matmul_nbits_and_gather_block_quantized_count_their_packed_values(tmp_path):
    """onnxruntime's 4-bit LLM layers (MatMul4BitsQuantizer, onnxruntime-genai's int4 models):
    MatMulNBits' B is uint8 [N, K / block, block / 2], two weights a byte; so is
    GatherBlockQuantized's quantized embedding table; scales, zero points are not weights."""
    n, k, block = 32, 64, 32
    inits = [_t("emb_q", U8, [100, k // 2]), _t("emb_s", F, [100, k // block], 0.01),
             _t("b_q", U8, [n, k // block, block // 2]), _t("b_s", F, [n * k // block], 0.01),
             _t("b_zp", U8, [n], 0x88), _t("bias", F, [n], 0.0)]
    nodes = [helper.make_node("GatherBlockQuantized", ["emb_q", "ids", "emb_s"], ["e"], domain="com.microsoft",
                              block_size=block, gather_axis=0, quantize_axis=1, bits=4),
             helper.make_node("MatMulNBits", ["e", "b_q", "b_s", "b_zp", "", "bias"], ["y"],
                              domain="com.microsoft", K=k, N=n, bits=4, block_size=block)]
    path = _save(tmp_path / "nbits.onnx", nodes,
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
                 [helper.make_tensor_value_info("y", F, ["batch", 8, n])], inits, ms=True)
    r = extract_features(path, batch_size=1)
    assert r.values["params"] == 100 * k + n * k + n
    assert r.values["param_bytes"] == 100 * k // 2 + n * k // 2 + 4 * n
    assert r.quantized_params == 100 * k + n * k


@pytest.mark.parametrize("schemas", [True, False])
def test_matmul_nbits_and_bnb4_give_the_op_after_them_their_product_shape(tmp_path, monkeypatch, schemas):
    """MatMulNBits' and MatMulBnb4's output, declared nowhere, is A's shape with its last size
    the attribute N (ONNX has no schema for them): it had taken A's [..., K], costed
    2·M·K·K and misshaped the Relu after it.  Without schemas from Python, the rounds apply
    the same rule."""
    from slurm_horus.graph.load import load_graph

    if not schemas:
        import onnx

        monkeypatch.setattr(onnx.defs, "register_schema", lambda schema: 1 / 0)
    n, k, block = 32, 64, 32
    inits = [_t("b_q", U8, [n, k // block, block // 2]), _t("b_s", F, [n * k // block], 0.01),
             _t("b_zp", U8, [n], 0x88), _t("c_q", U8, [n * k // 2]), _t("c_s", F, [n * k // block], 0.01)]
    nodes = [helper.make_node("MatMulNBits", ["x", "b_q", "b_s", "b_zp"], ["m"], domain="com.microsoft",
                              K=k, N=n, bits=4, block_size=block),
             helper.make_node("Relu", ["m"], ["y"]),
             helper.make_node("MatMulBnb4", ["x", "c_q", "c_s"], ["b"], domain="com.microsoft",
                              K=k, N=n, block_size=block, quant_type=1),
             helper.make_node("Relu", ["b"], ["z"])]
    path = _save(tmp_path / "nbits.onnx", nodes, [helper.make_tensor_value_info("x", F, ["batch", 8, k])],
                 [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, None)],
                 inits, ms=True)
    g = load_graph(path, batch_size=4)
    assert g.tensors["y"] == g.tensors["z"] == TensorInfo(F, (4, 8, n)) and g.assumed_shapes == []
    r = extract_features(path, batch_size=4)
    assert r.by_op["MatMulNBits"].flops == 2 * 4 * 8 * k * n
    assert r.by_op["Relu"].activation_bytes == 2 * 4 * 4 * 8 * n


@pytest.mark.parametrize("schemas", [True, False])
def test_gather_block_quantized_gives_a_gather_shape_unpacked_and_its_scales_type(tmp_path, monkeypatch,
                                                                                   schemas):
    """GatherBlockQuantized's output (onnxruntime's contrib op docs) is Gather's shape, indices'
    sizes in place of data's gather_axis, a uint8 table's last size unpacked (8 / bits values
    a byte), typed as its scales: it had taken its int64 ids' shape, [batch, 8], and the
    layers after the embedding lookup cost nothing.  An int4 table's sizes are its values'."""
    from slurm_horus.graph.load import load_graph

    if not schemas:
        import onnx

        monkeypatch.setattr(onnx.defs, "register_schema", lambda schema: 1 / 0)
    k, block, f16 = 64, 32, TensorProto.FLOAT16
    inits = [_t("emb_q", U8, [100, k // 2]), _t("emb_s", f16, [100, k // block], 0.01),
             _t("emb_8", U8, [100, k]), _t("emb_4", I4, [100, k]),
             _t("pos_4", I4, [2, 50, k]), _t("pos_s", f16, [2, 50, k // block], 0.01)]
    lookup = dict(domain="com.microsoft", block_size=block, quantize_axis=-1)
    nodes = [helper.make_node("GatherBlockQuantized", ["emb_q", "ids", "emb_s"], ["e"], **lookup),
             helper.make_node("GatherBlockQuantized", ["emb_8", "ids", "emb_s"], ["e8"], bits=8, **lookup),
             helper.make_node("GatherBlockQuantized", ["emb_4", "ids", "emb_s"], ["e4"], **lookup),
             helper.make_node("GatherBlockQuantized", ["pos_4", "ids", "pos_s"], ["p"], gather_axis=1, **lookup),
             helper.make_node("Relu", ["e"], ["y"])]
    path = _save(tmp_path / "gbq.onnx", nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
                 [helper.make_tensor_value_info(n, f16, None) for n in ("y", "e8", "e4", "p")],
                 inits, opset=21, ms=True)
    g = load_graph(path, batch_size=4)
    assert g.tensors["y"] == g.tensors["e8"] == g.tensors["e4"] == TensorInfo(f16, (4, 8, k))
    assert g.tensors["p"] == TensorInfo(f16, (2, 4, 8, k)) and g.assumed_shapes == []


def test_a_fake_quant_float_weight_counts_once_and_its_scales_never(tmp_path):
    """A QAT export: float W -> QuantizeLinear -> DequantizeLinear -> Conv, per-channel scales."""
    inits = [_t("w", F, [16, 3, 3, 3], 0.01), _t("w_s", F, [16], 0.01), _t("w_zp", I8, [16], 0),
             _t("b", F, [16], 0.0), _t("x_s", F, [], 0.1), _t("x_zp", U8, [], 128)]
    nodes = [*_qdq("x", "x_dq", "x_s", "x_zp"), *_qdq("w", "w_dq", "w_s", "w_zp", axis=0),
             helper.make_node("Conv", ["x_dq", "w_dq", "b"], ["y"], pads=[1, 1, 1, 1])]
    path = _save(tmp_path / "qat.onnx", nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", F, ["batch", 16, 8, 8])], inits)
    r = extract_features(path, batch_size=1)
    assert (r.values["params"], r.values["param_bytes"]) == (16 * 27 + 16, 4 * (16 * 27 + 16))
    assert r.quantized_params == 0 and not any("quantized" in w for w in r.warnings())


def _dynamic_linear(src, dst, w):
    """quantize_dynamic's Linear: DynamicQuantizeLinear -> MatMulInteger(int8 w) -> Cast -> Mul."""
    return [helper.make_node("DynamicQuantizeLinear", [src], [src + "_q", src + "_s", src + "_zp"]),
            helper.make_node("MatMulInteger", [src + "_q", w, src + "_zp", w + "_zp"], [dst + "_m"]),
            helper.make_node("Cast", [dst + "_m"], [dst + "_f"], to=F),
            helper.make_node("Mul", [src + "_s", w + "_s"], [dst + "_sc"]),
            helper.make_node("Mul", [dst + "_f", dst + "_sc"], [dst])]


def big_int8(path: Path) -> Path:
    """A 3 GB int8 weight [60000, 50000] behind quantize_dynamic's Linear (its data left out)."""
    inits = [external_tensor("w_q", [60_000, 50_000], "w_q.bin", I8, 3_000_000_000), _t("w_q_s", F, [], 0.01),
             _t("w_q_zp", I8, [], 0)]
    return _save(path, _dynamic_linear("x", "y", "w_q"),
                 [helper.make_tensor_value_info("x", F, ["batch", 60_000])],
                 [helper.make_tensor_value_info("y", F, ["batch", 50_000])], inits)


def mixed(path: Path) -> Path:
    """x -> MatMul(float W [4096, 2048], 32 MiB) -> quantize_dynamic's Linear(int8 W2
    [2048, 4096], 8 MiB) -> y: a model quantized but for one layer."""
    inits = [external_tensor("w", [4096, 2048], "w.bin", F, 4 * 2**23), external_tensor("w2_q", [2048, 4096], "w2_q.bin", I8, 2**23),
             _t("w2_q_s", F, [], 0.01), _t("w2_q_zp", I8, [], 0)]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), *_dynamic_linear("h", "y", "w2_q")]
    return _save(path, nodes, [helper.make_tensor_value_info("x", F, ["batch", 4096])],
                 [helper.make_tensor_value_info("y", F, ["batch", 4096])], inits)


def test_int8_model_memory_holds_its_weights_at_their_stored_size(tmp_path):
    """A 3 GB int8 model: its weights at 3 GB whatever the job's precision (sized at it, they
    had made 13,448 MiB on an A100 for inference), with no gradient, optimizer state or
    optimizer step for --task train (which had made them 60,230 MiB)."""
    r = extract_features(big_int8(tmp_path / "big.onnx"), batch_size=1)
    assert r.values["params"] == r.values["param_bytes"] == r.quantized_param_bytes == 3_000_000_000
    gpu, est = get_gpu("a100"), ColdStartEstimator()
    weights = 3e9 / MIB
    for precision in ("fp32", "amp", "bf16"):
        infer = est.predict(r, gpu, Workload(batch_size=1, task="infer", precision=precision))
        parts = infer.breakdown
        assert parts["weights_mib"] == pytest.approx(weights, abs=0.1)
        base = parts["weights_mib"] + parts["activations_mib"] + parts["transient_mib"] + parts["context_mib"]
        assert base < infer.mem_mib < 1.05 * base  # the allocator's reserve on top, nothing else
        train = est.predict(r, gpu, Workload(batch_size=1, task="train", precision=precision))
        assert train.breakdown["grads_mib"] == train.breakdown["optimizer_mib"] == 0
        assert train.mem_mib < 1.01 * infer.mem_mib
        # the optimizer step streams no weight: the step is the forward and backward kernels
        assert train.breakdown["gpu_ms_per_step"] < 3 * infer.breakdown["gpu_ms_per_step"] + 0.2
    assert not [x for x in r.warnings() if "quantized" in x]  # read as stored: nothing to warn of


def test_a_mixed_model_trains_and_sizes_its_float_weights_alone(tmp_path):
    r = extract_features(mixed(tmp_path / "mixed.onnx"), batch_size=1)
    assert (r.values["params"], r.quantized_params) == (2 * 2**23, 2**23)
    gpu, est = get_gpu("a100"), ColdStartEstimator()
    train = est.predict(r, gpu, Workload(batch_size=1, task="train", optimizer="adam")).breakdown
    # the float W: 32 MiB fp32, its gradient and Adam's two moments; the int8 W2: 8 MiB alone
    assert (train["weights_mib"], train["grads_mib"], train["optimizer_mib"]) == (40.0, 32.0, 64.0)
    half = est.predict(r, gpu, Workload(batch_size=1, task="train", optimizer="momentum",
                                        precision="bf16")).breakdown
    assert (half["weights_mib"], half["grads_mib"], half["optimizer_mib"]) == (24.0, 16.0, 16.0)
    assert est.predict(r, gpu, Workload(batch_size=1, task="infer", precision="fp16")).breakdown[
        "weights_mib"] == 24.0


def test_the_quantized_counts_survive_every_stored_form_of_the_report(tmp_path):
    """hsubmit predicts from the live report; sync stores its values in the ledger, imports
    take `horus features --json`'s features, and the history export runs the cold start again
    from them: each gives the quantized model hsubmit's prediction.  A float model's stored
    features are as they were, and a row stored before the counts reads none."""
    from slurm_horus.graph.features import FEATURE_NAMES, FeatureReport, report_from_dict, report_to_dict
    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger.history_export import _values_report, ledger_runs
    from slurm_horus.ledger.training import feature_values

    r = extract_features(mixed(tmp_path / "mixed.onnx"), batch_size=1)
    gpu, w = get_gpu("a100"), Workload(batch_size=1, task="train")
    live = ColdStartEstimator().predict(r, gpu, w)
    assert live.breakdown["grads_mib"] == 32.0
    back = report_from_dict(json.loads(json.dumps(report_to_dict(r))))
    stored = _values_report(feature_values(json.loads(json.dumps(r.to_dict()["features"]))))
    for again in (back, stored):
        assert (again.quantized_params, again.quantized_param_bytes) == (2**23, 2**23)
        assert ColdStartEstimator().predict(again, gpu, w).mem_mib == live.mem_mib

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    L.record_submission(job_id=1, cluster="c", user="alice", model_sha256="ab" * 32,
                        model_path=str(tmp_path / "mixed.onnx"), features=r.values,
                        feature_version=r.version, workload={"batch_size": 1, "task": "train"},
                        predictions={gpu.name: {"util_pct": 50.0, "mem_mib": 9999.0}})  # no cold
    L.record_usage(job_id=1, cluster="c", source="sacct", util_mean=50.0, util_max=99,
                   mem_peak_mib=2000.0, gpu_index=0, state="COMPLETED", elapsed_s=600, node="n1",
                   gpu_type=gpu.name, start_time=1700000000, end_time=1700000600)
    (run,) = ledger_runs(L)
    assert run["cold_mem"] == live.mem_mib

    old = {k: v for k, v in r.values.items() if k in FEATURE_NAMES}
    assert FeatureReport(model="", sha256="", values=old, nodes=[], by_op={}, unknown_ops=[],
                         unknown_dims=[], bound_dims={}).quantized_params == 0
    assert set(extract_features(mlp(tmp_path / "float.onnx"), batch_size=1).values) == set(FEATURE_NAMES)


def test_qdq_float_copies_of_the_weights_are_the_warning_left(tmp_path):
    """quantize_static's QDQ layout dequantizes each weight into a float tensor the op reads:
    costed as an activation (4x the int8 weight), which a runtime that fuses the pair never
    makes; the warning says so, and a graph that reads its int8 weights as stored has none."""
    inits = [external_tensor("w_q", [2048, 4096], "w_q.bin", I8, 2**23), _t("w_s", F, [4096], 0.01), _t("w_zp", I8, [4096], 0)]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    path = _save(tmp_path / "qdq.onnx", nodes, [helper.make_tensor_value_info("x", F, ["batch", 2048])],
                 [helper.make_tensor_value_info("y", F, ["batch", 4096])], inits)
    r = extract_features(path, batch_size=1)
    assert r.values["param_bytes"] == r.quantized_param_bytes == 2**23
    assert [x for x in r.warnings() if "quantized" in x] == [
        "the float copies DequantizeLinear makes of the quantized weights (32.0 MiB) are costed "
        "as activations (for --task train, kept for the backward pass), as a job that dequantizes "
        "as the graph does makes them: the memory predicted is high where the runtime fuses them "
        "into the ops that read them"]
    for model in (qop_cnn(tmp_path / "qop.onnx"), mixed(tmp_path / "mixed.onnx")):
        assert not [x for x in extract_features(model, batch_size=1).warnings() if "quantized" in x]


def test_onnxruntime_integer_products_are_costed_as_matrix_products(tmp_path):
    """QGemm (B at input 3), MatMulIntegerToFloat and DynamicQuantizeMatMul (MatMul's layout)
    and MatMulBnb4 (K an attribute) are matrix products: 2·M·K·N FLOPs each.  They had no cost
    rule (one FLOP per output element)."""
    m, k, n = 4, 64, 32
    inits = [_t("w", I8, [k, n]), _t("w_s", F, [], 0.01), _t("w_zp", I8, [], 0), _t("a_s", F, [], 0.1),
             _t("a_zp", U8, [], 0), _t("y_s", F, [], 0.1), _t("y_zp", U8, [], 0), _t("c", I32, [n]),
             _t("bnb", U8, [n * k // 2]), _t("absmax", F, [n * k // 64], 1.0), _t("ws", F, [n], 0.01)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "a_s", "a_zp"], ["xq"]),
             helper.make_node("QGemm", ["xq", "a_s", "a_zp", "w", "w_s", "w_zp", "c"], ["g"],
                              domain="com.microsoft"),  # no y_scale: a float output
             helper.make_node("MatMulIntegerToFloat", ["xq", "w", "a_s", "ws", "a_zp", "w_zp"], ["i"],
                              domain="com.microsoft"),
             helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws", "w_zp"], ["d"], domain="com.microsoft"),
             helper.make_node("MatMulBnb4", ["x", "bnb", "absmax"], ["b"], domain="com.microsoft",
                              K=k, N=n, block_size=64, quant_type=1)]
    nodes += [helper.make_node("Relu", [o], [o + "_r"]) for o in ("g", "i", "d", "b")]
    outs = [helper.make_tensor_value_info(o + "_r", F, None) for o in ("g", "i", "d", "b")]
    path = _save(tmp_path / "products.onnx", nodes, [helper.make_tensor_value_info("x", F, [m, k])], outs,
                 inits, ms=True)
    r = extract_features(path, batch_size=m)
    # their outputs are float (QGemm's without y_scale): typed as the uint8 input, the Relu
    # after each failed ONNX's inference and lost its shape
    from slurm_horus.graph.load import load_graph
    g = load_graph(path, batch_size=m)
    for o in ("g", "i", "d", "b"):
        assert (g.tensors[o + "_r"].dtype, g.tensors[o + "_r"].shape) == (F, (m, n)), o
    for op in ("QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulBnb4"):
        assert r.by_op[op].flops >= 2 * m * k * n, (op, r.by_op[op].flops)
        assert r.by_op[op].flops <= 2 * m * k * n + m * n, (op, r.by_op[op].flops)
