"""The cold start's memory rules: what the backward pass keeps, the per-GPU fixed overhead, and
the timm benchmark's clean-row rule and family split."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from graphs import save
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.gpus import get_gpu

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
BATCH, C, HW = 4, 8, 16
ACT = BATCH * C * HW * HW * 4  # bytes of one [batch, C, HW, HW] float activation

_spec = importlib.util.spec_from_file_location("bench_coldstart",
                                               ROOT / "benchmarks" / "bench_coldstart.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _conv_relu_conv(path: Path, bias_name: str) -> Path:
    """x -> Conv(bias `bias_name`) -> Relu -> Conv -> y, all [batch, C, HW, HW]."""
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [C, C, 3, 3], [0.01] * C * C * 9)
             for n in ("w1", "w2")]
    inits += [helper.make_tensor(bias_name, TensorProto.FLOAT, [C], [0.0] * C)]
    pads = helper.make_attribute("pads", [1, 1, 1, 1])
    c1 = helper.make_node("Conv", ["x", "w1", bias_name], ["c1"])
    c1.attribute.append(pads)
    c2 = helper.make_node("Conv", ["r1", "w2"], ["y"])
    c2.attribute.append(pads)
    shape = ["batch", C, HW, HW]
    graph = helper.make_graph(
        [c1, helper.make_node("Relu", ["c1"], ["r1"]), c2], "crc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return save(graph, path)


def _saved(path: Path) -> int:
    return extract_features(path, dims={"batch": BATCH}).values["saved_activation_bytes"]


def test_conv_with_its_own_bias_keeps_only_its_input(tmp_path):
    """VGG-style Conv -> ReLU -> Conv: x (conv 1), the ReLU output (ReLU and conv 2), once each;
    the first convolution's output is kept by nothing (an in-place ReLU overwrites it)."""
    assert _saved(_conv_relu_conv(tmp_path / "vgg.onnx", "features.0.bias")) == 2 * ACT


def test_conv_with_a_folded_norm_also_keeps_its_output(tmp_path):
    """The legacy exporter names a folded batch norm's bias 'onnx::Conv_N': in training that
    norm keeps the convolution's output as its input, one tensor more."""
    assert _saved(_conv_relu_conv(tmp_path / "bn.onnx", "onnx::Conv_7")) == 3 * ACT


def test_fixed_overhead_follows_the_gpu_stack_reservation():
    """Per-thread stack (1 KiB) x resident threads: 108 SMs x 2048 on an A100, 82 x 1536 on an
    RTX 3090 (compute capability 8.6)."""
    est = ColdStartEstimator()
    base = est.params.context_mib
    assert est.fixed_overhead_mib(get_gpu("a100-40gb")) == pytest.approx(base + 216)
    assert est.fixed_overhead_mib(get_gpu("rtx3090")) == pytest.approx(base + 123)


@pytest.mark.parametrize("name, batch, measured, tolerance", [
    ("vgg16", 32, 8222, 0.25),       # measured rows: GPUMemNet real_models_memory.csv
    ("resnet50", 32, 5262, 0.10),
    ("resnet50", 128, 15120, 0.10),
])
def test_zoo_cnns_near_their_measured_peak(name, batch, measured, tolerance):
    """Constants fitted on timm architectures only; these runs were never fitted on."""
    entry = {e["name"]: e for e in json.loads((DATA / "zoo.json").read_text())}[name]
    report = extract_features(DATA / entry["file"], dims=dict(entry["dims"], batch=batch))
    pred = ColdStartEstimator().predict(report, get_gpu("a100-40gb"), Workload(batch_size=batch))
    assert abs(pred.mem_mib - measured) / measured <= tolerance


def _row(model, batch, peak):
    return {"model": model, "batch_size": batch, "peak_mib": float(peak)}


def test_clean_rows_drop_oom_and_unstable_runs():
    rows = [_row("a", 8, 3000), _row("a", 16, 2500), _row("a", 32, 5000), _row("a", 64, 39800),
            _row("b", 8, 2000), _row("b", 16, 1900), _row("b", 32, 4000)]
    kept = {(r["model"], r["batch_size"]) for r in bench.gm.clean_timm_rows(rows)}
    assert kept == {("a", 8), ("a", 32), ("b", 8), ("b", 32)}


def test_family_split_never_puts_a_family_in_two_folds():
    families = {f"m{i}": f"fam{i % 7}" for i in range(40)}
    rows = [_row(m, b, 1000 + b) for m in families for b in (8, 16, 32)]
    fold_of = bench.family_folds(families, rows, 5)
    folds_per_family: dict[str, set[int]] = {}
    for r in rows:
        folds_per_family.setdefault(families[r["model"]], set()).add(fold_of[families[r["model"]]])
    assert all(len(f) == 1 for f in folds_per_family.values())
    assert set(fold_of.values()) == set(range(5))


N, D = 64, 32  # tokens x width of the transformer-ish graphs below


def _linear_dropout(path: Path, dropout: bool, weight_view: bool = False) -> Path:
    """x[N, D] -> MatMul(w1) + b1 -> [Dropout, training mode] -> MatMul(w2) -> y.

    `weight_view` reads w2 through a Transpose, as an export without constant folding does."""
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [D, D], [0.01] * D * D) for n in ("w1", "w2")]
    inits += [helper.make_tensor("b1", TensorProto.FLOAT, [D], [0.0] * D),
              helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.1]),
              helper.make_tensor("on", TensorProto.BOOL, [], [True])]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"])]
    h = "a1"
    if dropout:
        nodes.append(helper.make_node("Dropout", ["a1", "ratio", "on"], ["d1", "mask"]))
        h = "d1"
    w2 = "w2"
    if weight_view:
        nodes.append(helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]))
        w2 = "w2t"
    nodes.append(helper.make_node("MatMul", [h, w2], ["y"]))
    graph = helper.make_graph(nodes, "ld", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, D])], inits)
    return save(graph, path)


def _attention_saved(path: Path, fused: bool, dropout: bool) -> int:
    """softmax(q k^T) v, as the exporter writes scaled_dot_product_attention (q and k^T each
    scaled by a Mul before the MatMul) or as einsum-written attention (XLNet)."""
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.35]),
             helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.1]),
             helper.make_tensor("on", TensorProto.BOOL, [], [True])]
    if fused:
        nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
                 helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Mul", ["kt", "s"], ["ks"]),
                 helper.make_node("MatMul", ["qs", "ks"], ["scores"])]
    else:
        nodes = [helper.make_node("Einsum", ["q", "k"], ["e"], equation="id,jd->ij"),
                 helper.make_node("Mul", ["e", "s"], ["scores"])]
    nodes.append(helper.make_node("Softmax", ["scores"], ["p"], axis=-1))
    probs = "p"
    if dropout:
        nodes.append(helper.make_node("Dropout", ["p", "ratio", "on"], ["pd", "mask"]))
        probs = "pd"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"]) if fused else
                 helper.make_node("Einsum", [probs, "v"], ["y"], equation="ij,jd->id"))
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [N, D]) for n in "qkv"]
    graph = helper.make_graph(nodes, "att", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, D])],
                              inits)
    return extract_features(save(graph, path), dims={}).values["saved_activation_bytes"]


def test_dropout_keeps_a_one_byte_mask_and_its_output_for_the_next_op(tmp_path):
    """native_dropout keeps its boolean mask; the next MatMul keeps the dropout's output. The
    bias Add before it is not an activation chain that Dropout joins (eval exports show none)."""
    act = N * D * 4
    without = _saved(_linear_dropout(tmp_path / "a.onnx", dropout=False))
    with_dropout = _saved(_linear_dropout(tmp_path / "b.onnx", dropout=True))
    assert without == 2 * act                          # x, and the Add output for MatMul 2
    assert with_dropout == 2 * act + N * D             # x, the dropout output, the mask


def test_a_weight_read_through_a_transpose_is_not_an_activation(tmp_path):
    """Linear's W.t() in an export without constant folding is the parameter, a view in PyTorch:
    not a tensor kept for the backward pass, nor a forward activation, a live tensor, a kernel
    or bytes moved; the graph costs what the folded export does."""
    assert _saved(_linear_dropout(tmp_path / "t.onnx", dropout=False, weight_view=True)) == 2 * N * D * 4
    folded = extract_features(_linear_dropout(tmp_path / "f.onnx", dropout=False), dims={}).values
    view = extract_features(_linear_dropout(tmp_path / "v.onnx", dropout=False, weight_view=True),
                            dims={}).values
    for key in ("activation_bytes", "max_activation_bytes", "peak_live_bytes", "kernels",
                "read_bytes", "write_bytes", "params", "flops"):
        assert view[key] == folded[key], key


def test_fused_attention_keeps_no_dropout_mask_einsum_attention_keeps_it(tmp_path):
    """scaled_dot_product_attention redraws its dropout mask from the RNG state and recomputes
    the probabilities; attention written with einsum keeps the mask and the dropped-out probs."""
    fused = [_attention_saved(tmp_path / f"f{d}.onnx", True, d) for d in (False, True)]
    manual = [_attention_saved(tmp_path / f"m{d}.onnx", False, d) for d in (False, True)]
    assert fused[1] == fused[0]
    assert manual[1] - manual[0] == N * N * 5  # the bool mask and the float dropout output


def test_amp_inference_keeps_the_fp32_weights():
    # autocast leaves parameters fp32 (and caches half copies): amp inference had counted 2
    # bytes a parameter, a third of GPT-2 XL's weights missing
    r = extract_features(Path(__file__).parent / "data" / "zoo" / "gpt2_xl.onnx", batch_size=1, dims={"seq": 512})
    est, gpu = ColdStartEstimator(), get_gpu("a100-80gb")
    amp = est.predict(r, gpu, Workload(batch_size=1, task="infer", precision="amp"))
    fp32 = est.predict(r, gpu, Workload(batch_size=1, task="infer", precision="fp32"))
    fp16 = est.predict(r, gpu, Workload(batch_size=1, task="infer", precision="fp16"))
    assert amp.breakdown["weights_mib"] >= r.values["params"] * 4 / 2**20
    assert fp16.mem_mib < fp32.mem_mib <= amp.mem_mib
