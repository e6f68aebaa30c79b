"""benchmarks/gpumemnet.py: rebuilding the GPUMemNet MLP runs as ONNX graphs.

The first tests need no data (hand-written rows in the data set's format); the rest use the
GPUMemNet CSVs when ../shared/datasets/gpumemnet/ (or $HORUS_GPUMEMNET_DIR) holds them and skip
otherwise, saying where they looked.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import onnx
import pytest

from slurm_horus.graph.features import extract_features

ROOT = Path(__file__).resolve().parents[1]


def _load():
    name = "gpumemnet"  # registered so worker processes can pickle its functions
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "gpumemnet.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gm = _load()

HEADER = ("Filename,Depth,Activations-Params,Activation Function,Total Activations,"
          "Total Parameters,Batch Size,Batch Normalization Layers,Dropout Layers,"
          "Max GPU Memory (MiB),Avg GPUTL,Avg GRACT,Avg SMACT,Avg SMOCC,Avg FP32A")

# One row of every layer type, in the data set's format: input 64 -> 32 -> 16 -> 8.
LAYERS = [("linear", 32, 64 * 32 + 32), ("batch_normalization", 32, 64), ("PReLU", 32, 0),
          ("dropout", 32, 0), ("linear", 16, 32 * 16 + 16), ("SiLU", 16, 0), ("GELU", 16, 0),
          ("Mish", 16, 0), ("SELU", 16, 0), ("ELU", 16, 0), ("LeakyReLU", 16, 0),
          ("ReLU", 16, 0), ("Tanh", 16, 0), ("Softplus", 16, 0), ("Identity", 16, 0),
          ("linear", 8, 16 * 8 + 8), ("Sigmoid", 8, 0), ("Softmax", 8, 0)]
TOTAL = sum(p for _, _, p in LAYERS)
FILENAME = ("input:64_output:8_depth:2_arch:pyramid_batch:128_act:prelu_dropout:0.25_"
            "dropout:True_batchnorm:True.out")


def _raw(layers=LAYERS, filename=FILENAME, total=TOTAL) -> dict[str, str]:
    return {"Filename": filename, "Depth": "3", "Activations-Params": repr(layers),
            "Activation Function": "PReLU", "Total Activations": "56",
            "Total Parameters": str(total), "Batch Size": "128",
            "Batch Normalization Layers": "1", "Dropout Layers": "1",
            "Max GPU Memory (MiB)": "1502", "Avg GPUTL": "12.5", "Avg GRACT": "0.1",
            "Avg SMACT": "0.05", "Avg SMOCC": "0.02", "Avg FP32A": "0.03"}


def test_parse_row():
    row = gm.parse_mlp_row(_raw(), 7)
    assert row["input_width"] == 64 and row["batch_size"] == 128 and row["index"] == 7
    assert row["layers"][0] == ("linear", 32, 2080) and row["dropout_ratio"] == 0.25
    assert row["mem_mib"] == 1502 and row["util_pct"] == 12.5 and row["smact"] == 0.05
    assert row["row_id"] == gm.parse_mlp_row(_raw(), 0)["row_id"]  # from the filename only


def test_build_graph_nodes_and_params(tmp_path):
    row = gm.parse_mlp_row(_raw())
    path = tmp_path / "mlp.onnx"
    built = gm.build_mlp_onnx(row, path)
    assert built["nodes"] == [
        "Gemm", "BatchNormalization", "PRelu", "Dropout", "Gemm", "Sigmoid", "Mul", "Gelu",
        "Mish", "Selu", "Elu", "LeakyRelu", "Relu", "Tanh", "Softplus", "Gemm", "Sigmoid",
        "Softmax"]
    # the data set counts no PReLU slope; the graph has nn.PReLU()'s one
    assert built["params"] == TOTAL + 1 and built["prelu_params"] == 1
    assert gm.graph_param_count(path) == TOTAL + 1
    assert not (tmp_path / gm.WEIGHTS_FILE).exists()
    model = onnx.load(str(path), load_external_data=False)
    assert model.opset_import[0].version == 20
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert onnx.helper.get_attribute_value(gemm.attribute[-1]) == 1  # transB
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    assert inits["fc0.weight"] == [32, 64] and inits["fc0.bias"] == [32]
    assert inits["prelu2.weight"] == [1] and inits["bn1.running_var"] == [32]
    x = model.graph.input[0].type.tensor_type.shape.dim
    assert (x[0].dim_param, x[1].dim_value) == ("batch", 64)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)  # every node types and shapes


def test_extract_features_on_rebuilt_graph(tmp_path):
    row = gm.parse_mlp_row(_raw())
    path = tmp_path / "mlp.onnx"
    gm.build_mlp_onnx(row, path)
    report = extract_features(path, batch_size=row["batch_size"])
    v = report.values
    assert v["batch_size"] == 128 and v["n_unknown_ops"] == 0 and not report.unknown_dims
    assert v["params"] == TOTAL + 1  # PyTorch's PReLU slope, which the data set's total omits
    assert v["n_matmul"] == 3 and v["n_norm"] == 1 and v["n_softmax"] == 1
    assert v["flops"] >= 2 * 128 * (64 * 32 + 32 * 16 + 16 * 8)
    assert report.missing_external_data  # weights.bin was never written


@pytest.mark.parametrize("layers, message", [
    ([("linear", 32, 999)], "Linear"),
    ([("linear", 32, 2080), ("batch_normalization", 32, 32)], "BatchNorm1d"),
    ([("linear", 32, 2080), ("PReLU", 32, 5)], "PReLU"),
    ([("linear", 32, 2080), ("ReLU", 16, 0)], "width"),
    ([("linear", 32, 2080), ("Swish", 32, 0)], "unknown layer"),
])
def test_builder_rejects_inconsistent_layers(tmp_path, layers, message):
    row = gm.parse_mlp_row(_raw(layers=layers))
    with pytest.raises(gm.LayerMismatch, match=message):
        gm.build_mlp_onnx(row, tmp_path / "bad.onnx")


def test_missing_data_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv(gm.ENV_VAR, str(tmp_path / "nowhere"))
    assert gm.data_dir() is None
    with pytest.raises(gm.DataMissing, match="nowhere"):
        gm.mlp_rows()
    with pytest.raises(gm.DataMissing):
        gm.real_model_rows()
    assert gm.main(["--limit", "3"]) == 0  # the CLI says it skipped and exits cleanly


def test_synthetic_data_dir(tmp_path, monkeypatch):
    """A hand-written data folder: CSV parsing, the repeated real-models block, the cache."""
    lines = [HEADER]
    for i, width in enumerate((32, 48, 24)):
        layers = [("linear", width, 64 * width + width), ("ReLU", width, 0),
                  ("linear", 8, width * 8 + 8), ("Softmax", 8, 0)]
        raw = _raw(layers=layers, filename=FILENAME.replace("batch:128", f"batch:{i + 1}"),
                   total=sum(p for *_, p in layers))
        raw["Batch Size"] = str(i + 1)
        lines.append(",".join(f'"{raw[k]}"' for k in HEADER.split(",")))
    (tmp_path / gm.MLP_CSV).write_text("\n".join(lines) + "\n")
    block = ["vgg16,32,8222,16000,3121.3,21525.8", ",128,24408,24000,9894.4,82119.9",
             "BERT_base,32,20774,32000,-,17456.9"]
    head = ",batch_size,Actual GPU memory,GPUMemNet ,FakeTensor,Horus"
    (tmp_path / gm.REAL_CSV).write_text("\n".join([head, *block, head, *block]) + "\n")
    monkeypatch.setenv(gm.ENV_VAR, str(tmp_path))
    assert gm.data_dir() == tmp_path
    rows = gm.mlp_rows()
    assert [r["batch_size"] for r in rows] == [1, 2, 3] and len({r["row_id"] for r in rows}) == 3
    real = gm.real_model_rows()
    assert [(r["name"], r["batch_size"]) for r in real] == [
        ("vgg16", 32), ("vgg16", 128), ("BERT_base", 32)]
    assert real[1]["mem_mib"] == 24408 and real[1]["gpumemnet"] == 24000
    assert real[2]["faketensor"] is None and real[2]["horus"] == 17456.9


# ------------------------------------------------------------------------ with the real data

@pytest.fixture(scope="module")
def rows():
    try:
        return gm.mlp_rows()
    except gm.DataMissing as e:
        pytest.skip(str(e))


def test_all_rows_rebuild_with_matching_param_counts(rows):
    assert len(rows) == 3000
    sample = rows  # all 3,000: about 5-15 s
    result = gm.check_param_counts(sample)
    assert result["errors"] == [] and result["unexplained"] == []
    assert result["exact"] + result["prelu_only"] == len(sample)
    # every gap is the PReLU rows' slopes: exactly the rows with PReLU layers
    with_prelu = sum(1 for r in sample if any(t == "PReLU" for t, *_ in r["layers"]))
    assert result["prelu_only"] == with_prelu


def test_sample_featurizes_without_unknown_ops(rows, tmp_path):
    narrow = [r for r in rows if min(w for _, w, _ in r["layers"]) == 1][:5]
    sample = random.Random(0).sample(rows, 40) + narrow
    for row in sample:
        path = tmp_path / f"{row['row_id']}.onnx"
        gm.build_mlp_onnx(row, path)
        built = gm.build_mlp_onnx(row, path)
        v = extract_features(path, batch_size=row["batch_size"]).values
        assert v["n_unknown_ops"] == 0 and v["batch_size"] == row["batch_size"]
        # the data set's totals leave out PyTorch's one-element PReLU slopes
        assert v["params"] == row["total_parameters"] + built["prelu_params"]


def test_feature_table_and_cache(rows, tmp_path):
    first = gm.mlp_feature_table(limit=12, cache_dir=tmp_path, progress=False)
    assert [r["row_id"] for r, _ in first] == [r["row_id"] for r in rows[:12]]
    assert gm.cache_path(tmp_path).is_file()
    again = gm.mlp_feature_table(limit=12, cache_dir=tmp_path, workers=1, progress=False)
    assert [f for _, f in again] == [f for _, f in first]
    assert first[0][1]["params"] == rows[0]["total_parameters"]


def test_real_model_rows():
    try:
        real = gm.real_model_rows()
    except gm.DataMissing as e:
        pytest.skip(str(e))
    assert len(real) == 18 and len({(r["name"], r["batch_size"]) for r in real}) == 18
    assert all(r["name"] and r["mem_mib"] and r["gpumemnet"] and r["horus"] for r in real)
    assert sum(r["faketensor"] is not None for r in real) == 12
    assert real[0] == {"name": "vgg16", "batch_size": 32, "mem_mib": 8222, "gpumemnet": 16000,
                       "faketensor": 3121.344643, "horus": 21525.8262}
