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
