"""Small hand-built ONNX graphs for tests that need exact, known structure."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def external_tensor(name: str, dims: list[int], location: str, dtype: int = TensorProto.FLOAT,
                    nbytes: int | None = None) -> onnx.TensorProto:
    """An initializer whose data lives in `location` (which need not exist): its shape alone,
    as costing reads a big weight; ``nbytes`` its stored size (default: 4 bytes a value)."""
    t = onnx.TensorProto()
    t.name = name
    t.data_type = dtype
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"),
                       ("length", str(4 * _prod(dims) if nbytes is None else nbytes))):
        e = t.external_data.add()
        e.key, e.value = key, value
    return t


def _prod(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def mlp(path: Path, widths=(16, 32, 8), batch="batch", location: str | None = None) -> Path:
    """x[batch, w0] -> (MatMul + Add + Relu)* -> y; weights optionally external."""
    nodes, inits = [], []
    prev = "x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        w = (external_tensor(f"w{i}", [a, b], location) if location
             else helper.make_tensor(f"w{i}", TensorProto.FLOAT, [a, b], [0.0] * (a * b)))
        inits += [w, helper.make_tensor(f"b{i}", TensorProto.FLOAT, [b], [0.0] * b)]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"h{i}"])]
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [batch, widths[-1]])], inits)
    return save(graph, path)


def save(graph, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def tiny_lm():
    """A two-layer Transformer language model built from torch.nn, its head tied to its
    embedding, as freshly initialised (all-one norm weights, all-zero attention biases): what
    the dynamo exporter merges, folds and drops.  Dev-only: torch is no dependency."""
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self, d=32, heads=4, vocab=100, layers=2, positions=16):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(positions, d)
            self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
                                        for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            x = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
            for layer in self.layers:
                x = layer(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return TinyLM().train()


def dynamo_tiny_lm(path: Path) -> Path:
    """tiny_lm exported by torch.onnx.export(dynamo=True) (needs onnxscript), its weights of
    1 KiB or more left out as tests/data/make_zoo.py leaves them (external data, deleted):
    tests/data/zoo/dynamo_tiny_lm.onnx is `python3 -c 'import tests.graphs as g, pathlib;
    g.dynamo_tiny_lm(pathlib.Path("tests/data/zoo/dynamo_tiny_lm.onnx"))'`."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / path.name
        torch.onnx.export(tiny_lm(), (torch.randint(0, 100, (2, 8)),), str(raw), dynamo=True,
                          input_names=["ids"], dynamic_axes={"ids": {0: "batch", 1: "seq"}},
                          external_data=False)
        model = onnx.load(str(raw))
    return _save_stripped(model, path)


def _save_stripped(model, path: Path) -> Path:
    """``model`` at ``path`` without the weights' bytes (a missing external file, as make_zoo
    strips them): the graph stage reads shapes, never values."""
    data = path.with_name(path.name + ".data")
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    data.unlink(missing_ok=True)  # none where every weight is under 1 KiB
    return path


def bn_cnn():
    """A small BatchNorm CNN built from torch.nn, in training mode, what the dynamo exporter's
    optimizer fuses (FuseBatchNormIntoConv, FuseBatchNormIntoGemm) and drops
    (RemoveOptionalBiasFromConv): a Conv with its own bias before a norm (the fused bias keeps
    the conv bias's name), a bias-free Conv before a norm whose shift is not zero (the fused bias
    is a new '<weight>_bias' initializer), a bias-free Conv before a fresh norm (the fused bias
    is zero and dropped), a residual Add, a 1x1 Conv whose bias is zero (dropped), a Linear
    before a BatchNorm1d.  Dev-only: torch is no dependency."""
    import torch
    from torch import nn

    class BnCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2, self.b2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
            self.c3, self.b3 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.c4 = nn.Conv2d(16, 24, 1)
            self.fc1, self.bf = nn.Linear(24, 32), nn.BatchNorm1d(32)
            self.fc2 = nn.Linear(32, 10)
            nn.init.normal_(self.b2.weight)
            nn.init.normal_(self.b2.bias)
            nn.init.zeros_(self.c4.bias)

        def forward(self, x):
            x = torch.relu(self.b1(self.c1(x)))
            x = torch.relu(self.b2(self.c2(x)))
            x = torch.relu(self.b3(self.c3(x)) + x)
            x = self.c4(x).mean((2, 3))
            return self.fc2(torch.relu(self.bf(self.fc1(x))))

    torch.manual_seed(0)
    return BnCNN().train()


BN_CNN_EXAMPLE = (2, 3, 16, 16)  # the example input's shape, batch 2


def export_bn_cnn(path: Path, dynamo: bool) -> Path:
    """bn_cnn exported with its batch dynamic ('x': (batch, 3, 16, 16)): by the dynamo exporter
    (needs onnxscript), its weights of 1 KiB or more left out as dynamo_tiny_lm's are, or by
    the TorchScript exporter as README asks (training mode, no constant folding), whole.
    tests/data/zoo/dynamo_bn_cnn.onnx is `python3 -c 'import tests.graphs as g, pathlib;
    g.export_bn_cnn(pathlib.Path("tests/data/zoo/dynamo_bn_cnn.onnx"), True)'`."""
    return _export_cnn(bn_cnn, BN_CNN_EXAMPLE, path, dynamo)


def pad_cnn():
    """A small CNN with TensorFlow-style explicit padding (F.pad before a Conv of padding 0, as
    transformers' MobileNetV2 and EfficientNet pad), what the dynamo exporter's optimizer fuses
    into the Conv (FuseConvPad) though PyTorch's pad copies: an asymmetric pad before a
    stride-2 Conv and a BatchNorm, a zero pad before a 1x1 Conv (still a copy), a pad before a
    Conv with no norm; and a BatchNorm its module keeps in eval mode (frozen statistics, as
    fine-tuning code does in train()), which the optimizer fuses too (its weight and bias
    trainable all the same).  Dev-only: torch is no dependency."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class PadCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(3, 8, 3, stride=2, bias=False), nn.BatchNorm2d(8)
            self.c2, self.b2 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
            self.c3 = nn.Conv2d(16, 16, 3)
            self.c4, self.b4 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, 10)

        def train(self, mode: bool = True):
            super().train(mode)
            self.b4.eval()  # frozen: its running statistics are not updated
            return self

        def forward(self, x):
            x = torch.relu(self.b1(self.c1(F.pad(x, (0, 1, 0, 1)))))
            x = torch.relu(self.b2(self.c2(F.pad(x, (0, 0, 0, 0)))))
            x = torch.relu(self.c3(F.pad(x, (1, 1, 1, 1))))
            x = torch.relu(self.b4(self.c4(x)))
            return self.fc(x.mean((2, 3)))

    torch.manual_seed(0)
    return PadCNN().train()


def export_pad_cnn(path: Path, dynamo: bool) -> Path:
    """pad_cnn exported as export_bn_cnn exports bn_cnn.  tests/data/zoo/dynamo_pad_cnn.onnx is
    `python3 -c 'import tests.graphs as g, pathlib;
    g.export_pad_cnn(pathlib.Path("tests/data/zoo/dynamo_pad_cnn.onnx"), True)'`."""
    return _export_cnn(pad_cnn, BN_CNN_EXAMPLE, path, dynamo)


def zero_bias_bn_cnn():
    """A CNN whose Conv, ConvTranspose and Linear have a bias of their own, all zero (as a model
    initialised with zero biases), each before a BatchNorm in training mode: the dynamo exporter's
    optimizer drops each zero bias (RemoveOptionalBiasFrom*) before it fuses the norm into the
    node (FuseBatchNormInto*), so no call reads the bias any more.  Dev-only: torch is no
    dependency."""
    import torch
    from torch import nn

    class ZeroBiasBnCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.conv_bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.up, self.up_bn = nn.ConvTranspose2d(8, 6, 2, stride=2), nn.BatchNorm2d(6)
            self.fc, self.fc_bn = nn.Linear(6, 16), nn.BatchNorm1d(16)
            self.head = nn.Linear(16, 4)
            for layer in (self.conv, self.up, self.fc):
                nn.init.zeros_(layer.bias)

        def forward(self, x):
            x = torch.relu(self.conv_bn(self.conv(x)))
            x = torch.relu(self.up_bn(self.up(x))).mean((2, 3))
            return self.head(torch.relu(self.fc_bn(self.fc(x))))

    torch.manual_seed(0)
    return ZeroBiasBnCNN().train()


def export_zero_bias_bn_cnn(path: Path, dynamo: bool) -> Path:
    """zero_bias_bn_cnn exported as export_bn_cnn exports bn_cnn.
    tests/data/zoo/dynamo_zero_bias_bn_cnn.onnx is `python3 -c 'import tests.graphs as g, pathlib;
    g.export_zero_bias_bn_cnn(pathlib.Path("tests/data/zoo/dynamo_zero_bias_bn_cnn.onnx"), True)'`."""
    return _export_cnn(zero_bias_bn_cnn, BN_CNN_EXAMPLE, path, dynamo)


def tiny_deit():
    """transformers' DeiTForImageClassificationWithTeacher from a one-layer config, freshly
    initialised: its class and distillation tokens are both zeros (1, 1, 32), which the dynamo
    exporter's optimizer merges into one initializer, and then the two expand calls that read
    them into one.  Dev-only: torch and transformers are no dependency."""
    import torch
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher

    config = DeiTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, image_size=32, patch_size=8, num_labels=5)
    torch.manual_seed(0)
    return DeiTForImageClassificationWithTeacher(config).train()


DEIT_EXAMPLE = (2, 3, 32, 32)


def export_tiny_deit(path: Path, dynamo: bool) -> Path:
    """tiny_deit exported as export_bn_cnn exports bn_cnn, without the dynamo exporter's stack
    traces (a fixture under 100 KB).  tests/data/zoo/dynamo_tiny_deit.onnx is
    `python3 -c 'import tests.graphs as g, pathlib;
    g.export_tiny_deit(pathlib.Path("tests/data/zoo/dynamo_tiny_deit.onnx"), True)'`."""
    return _export_cnn(tiny_deit, DEIT_EXAMPLE, path, dynamo, stack_traces=False)


def unused_token_net():
    """A patch embedding whose mask token forward reads only with a mask (ViT's, for masked
    image modelling), its output added to a dropout of itself, in eval mode: the exporter drops
    the dropout (the identity, out of training), so the Add reads the embedding's output twice
    where its call names %linear and %clone, the latter computed by no node.  Nothing was merged:
    the unread token is no lost parameter (the TorchScript export has no such tensor either).
    Dev-only: torch is no dependency."""
    import torch
    from torch import nn

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.randn(16, 8)), nn.Parameter(torch.randn(16))
            self.mask_token = nn.Parameter(torch.zeros(16))
            self.dropout = nn.Dropout(0.1)

        def forward(self, x, mask=None):
            h = nn.functional.linear(x, self.weight, self.bias)
            if mask is not None:
                h = torch.where(mask[..., None], self.mask_token, h)
            return h + self.dropout(h)

    class UnusedTokenNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = Embedding(), nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.embed(x))

    torch.manual_seed(0)
    return UnusedTokenNet().eval()


UNUSED_TOKEN_EXAMPLE = (2, 8)


def export_unused_token_net(path: Path, dynamo: bool) -> Path:
    """unused_token_net exported as export_bn_cnn exports bn_cnn (the TorchScript export in
    training mode).  tests/data/zoo/dynamo_unused_token_net.onnx is `python3 -c 'import
    tests.graphs as g, pathlib; g.export_unused_token_net(pathlib.Path(
    "tests/data/zoo/dynamo_unused_token_net.onnx"), True)'`."""
    return _export_cnn(unused_token_net, UNUSED_TOKEN_EXAMPLE, path, dynamo, stack_traces=False)


def _export_cnn(build, shape, path: Path, dynamo: bool, stack_traces: bool = True) -> Path:
    """``build()`` exported by the TorchScript or the dynamo exporter; ``stack_traces`` False
    leaves out the dynamo exporter's per-node Python stack traces (most of a transformers
    model's bytes, and no part of what the graph stage reads)."""
    import contextlib
    import io
    import tempfile
    import warnings

    import torch

    names = dict(input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        raw = Path(tmp) / path.name
        example = (torch.randn(*shape),)
        if not dynamo:
            torch.onnx.export(build(), example, str(path), dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              **names)
            return path
        torch.onnx.export(build(), example, str(raw), dynamo=True, external_data=False, **names)
        model = onnx.load(str(raw))
    if not stack_traces:
        for node in model.graph.node:
            kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
    return _save_stripped(model, path)


def dropouts(path: Path, forms: list[dict], opset: int = 17, n: int = 64) -> Path:
    """x[2, n] -> one Dropout per entry of ``forms``, chained -> y, as the TorchScript exporter
    writes nn.Dropout in training mode: each form gives its ``ratio`` (a number, "input": a
    graph input, None: absent) and ``mode`` (its training_mode: a bool, "input" or None), as
    Constant nodes (``via="constant"``, the exporter's) or initializers; in an ``opset`` below
    12 the ratio is an attribute (None: absent, 0.5 by default)."""
    nodes, inits, inputs = [], [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n])]
    prev = "x"
    for i, form in enumerate(forms):
        args = [prev]
        for key, dtype in (("ratio", TensorProto.FLOAT), ("mode", TensorProto.BOOL)):
            value = form.get(key)
            if opset < 12 or (value is None and key == "mode"):
                continue
            name = f"{key}{i}" if value is not None else ""
            if value == "input":
                inputs.append(helper.make_tensor_value_info(name, dtype, []))
            elif value is not None:
                t = helper.make_tensor(name, dtype, [], [value])
                if form.get("via", "constant") == "constant":
                    nodes.append(helper.make_node("Constant", [], [name], value=t))
                else:
                    inits.append(t)
            args.append(name)
        attrs = {"ratio": float(form["ratio"])} if opset < 12 and form.get("ratio") is not None else {}
        nodes.append(helper.make_node("Dropout", args, [f"d{i}", f"mask{i}"], **attrs))
        prev = f"d{i}"
    graph = helper.make_graph(nodes, "dropouts", inputs,
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [2, n])], inits)
    return save(graph, path, opset)
