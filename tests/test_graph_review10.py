"""Graph-stage defects of review 10: a no-op Dropout's output in the live-memory count, and
parameters the dynamo exporter's optimizer removes with every call that read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_horus.graph.features import extract_features
from slurm_horus.graph.load import load_graph
from tests import graphs

X_BYTES = 2 * 64 * 4  # graphs.dropouts' x[2, 64], float32 (beside it, a few bytes of scalar constants)

ZOO = Path(__file__).parent / "data" / "zoo"
ZERO_BIAS_BN_CNN = ZOO / "dynamo_zero_bias_bn_cnn.onnx"
ZERO_BIAS_BN_CNN_PARAMS = 662  # sum(p.numel() for p in graphs.zero_bias_bn_cnn().parameters())
TINY_DEIT = ZOO / "dynamo_tiny_deit.onnx"
TINY_DEIT_PARAMS = 15754  # sum(p.numel() for p in graphs.tiny_deit().parameters())
DISTILLATION_TOKEN = 32  # its (1, 1, 32) token, merged into the class token's call
UNUSED_TOKEN_NET = ZOO / "dynamo_unused_token_net.onnx"
UNUSED_TOKEN_NET_PARAMS = 228  # sum(p.numel() for p in graphs.unused_token_net().parameters())
MASK_TOKEN = 16  # the token forward does not read: in neither export


@pytest.mark.parametrize("forms", [
    [{"ratio": 0.0, "mode": True}, {"ratio": 0.0, "mode": True}],  # nn.Dropout(p=0.0) in training
    [{"ratio": 0.1, "mode": False}, {"ratio": 0.0, "mode": "input"}],  # not training; p = 0
])
def test_a_dropout_that_returns_its_input_is_no_new_live_tensor(tmp_path, forms):
    """x through two Dropouts that are x (graph.noop_dropouts): x alone is alive, as costs
    counts them (views, no kernel), not x and a copy (twice the bytes before)."""
    report = extract_features(graphs.dropouts(tmp_path / "noop.onnx", forms))
    assert X_BYTES <= report.values["peak_live_bytes"] < 2 * X_BYTES


def test_a_dropout_that_keeps_a_mask_still_writes_its_output(tmp_path):
    report = extract_features(graphs.dropouts(tmp_path / "kept.onnx", [{"ratio": 0.0, "mode": True},
                                                                         {"ratio": 0.1, "mode": True}]))
    assert 2 * X_BYTES <= report.values["peak_live_bytes"] < 3 * X_BYTES  # x, the second's output


def test_a_zero_bias_dropped_before_its_norm_was_fused_counts():
    """Conv, ConvTranspose and Linear, each with a zero bias of its own, before a BatchNorm:
    the optimizer dropped each bias, then fused the norm in, so no call read the bias (632,
    the 30 bias values missing and no warning, before)."""
    report = extract_features(ZERO_BIAS_BN_CNN, dims={"batch": 2})
    assert report.values["params"] == ZERO_BIAS_BN_CNN_PARAMS
    assert report.warnings() == []
    graph = load_graph(ZERO_BIAS_BN_CNN, dims={"batch": 2})
    biases = {n.op_type: n.input[2] for n in graph.nodes if n.op_type in ("Conv", "ConvTranspose", "Gemm")
              and len(n.input) > 2 and n.input[2].endswith(".bias") and not n.input[2].startswith("head.")}
    assert biases == {"Conv": "conv.bias", "ConvTranspose": "up.bias", "Gemm": "fc.bias"}
    assert [graph.initializers[b].shape for b in biases.values()] == [(8,), (6,), (16,)]


def test_a_parameter_merged_away_with_its_call_is_warned_of():
    """DeiT's all-zero distillation token: the optimizer merged it into the class token's
    initializer, then its expand into the class token's; nothing in the graph tells its size,
    so it is named (it had been lost without a word)."""
    report = extract_features(TINY_DEIT, dims={"batch": 2})
    assert report.values["params"] == TINY_DEIT_PARAMS - DISTILLATION_TOKEN
    assert report.unsized_params == ["deit.embeddings.distillation_token"]
    assert any("distillation_token" in w and "dynamo" in w for w in report.warnings())


def test_an_identity_dropped_beside_an_unread_parameter_is_no_merge():
    """embed's output plus its dropout in eval mode, dropped by the optimizer: the Add reads
    one tensor twice where its call names %linear and %clone, but a clone is no merged linear,
    so the mask token forward never reads is no lost parameter (it was warned of before)."""
    report = extract_features(UNUSED_TOKEN_NET, dims={"batch": 2})
    assert report.values["params"] == UNUSED_TOKEN_NET_PARAMS - MASK_TOKEN
    assert report.unsized_params == []
    assert report.warnings() == []


def test_a_tied_weight_is_not_taken_for_a_lost_one():
    """The tied head of graphs.tiny_lm: the embedding's call reads the head's weight, so the
    embedding's own name, unread, is the same tensor, no warning."""
    report = extract_features(ZOO / "dynamo_tiny_lm.onnx", dims={"batch": 2, "seq": 8})
    assert report.unsized_params == []


@pytest.mark.parametrize("build, expected", [("zero_bias_bn_cnn", ZERO_BIAS_BN_CNN_PARAMS),
                                             ("tiny_deit", TINY_DEIT_PARAMS),
                                             ("unused_token_net", UNUSED_TOKEN_NET_PARAMS)])
def test_fixtures_are_the_models(build, expected):
    pytest.importorskip("torch")
    if build == "tiny_deit":
        pytest.importorskip("transformers")
    assert sum(p.numel() for p in getattr(graphs, build)().parameters()) == expected


@pytest.mark.parametrize("export, expected", [("export_zero_bias_bn_cnn", ZERO_BIAS_BN_CNN_PARAMS),
                                              ("export_tiny_deit", TINY_DEIT_PARAMS),
                                              ("export_unused_token_net", UNUSED_TOKEN_NET_PARAMS - MASK_TOKEN)])
def test_the_torchscript_export_counts_them_all(tmp_path, export, expected):
    """The reference: the TorchScript export of each model counts every parameter it reads."""
    pytest.importorskip("torch")
    if export == "export_tiny_deit":
        pytest.importorskip("transformers")
    path = getattr(graphs, export)(tmp_path / "ts.onnx", dynamo=False)
    assert extract_features(path, dims={"batch": 2}).values["params"] == expected
