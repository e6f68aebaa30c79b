"""Build tests/data/zoo/: real architectures as weightless ONNX graphs, and tests/data/zoo.json.

Why: slurm-horus predicts GPU utilization and memory from a job's ONNX graph, so its tests
need the graphs real users export -- without gigabytes of weights.  Each model is built
from its config with random weights (nothing is downloaded), exported the way most users'
scripts do it (legacy TorchScript exporter, opset 17, symbolic ``batch``/``seq``), and saved
with every tensor of 1 KiB or more moved to an external ``NAME.onnx.data`` file, which is then
deleted: the committed .onnx keeps every initializer's name, dtype and dims, and small
tensors (shape constants) inline.

Dev-only: torch/torchvision/timm/transformers are never runtime dependencies of the project.

Setup (once):
    python3 -m venv /opt/zoo-venv && /opt/zoo-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm transformers onnx onnxscript

Run from the repository root:
    /opt/zoo-venv/bin/python tests/data/make_zoo.py                 # every model
    /opt/zoo-venv/bin/python tests/data/make_zoo.py gpt2 t5_small   # some; zoo.json merged by name
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnx
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

DATA = Path(__file__).resolve().parent
ZOO = DATA / "zoo"
MANIFEST = DATA / "zoo.json"
OPSET = 17
DYNAMO_OPSET = 18  # the dynamo exporter's own opset; converting its graphs down to 17 leaves invalid nodes
M = 10**6
G = 10**9


# --- hand-written models --------------------------------------------------------------------


class RNNLM(nn.Module):
    """Word-level language model: embedding, stacked LSTM/GRU, linear decoder (PTB-style)."""

    def __init__(self, cell: type[nn.RNNBase], vocab: int, emb: int, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.rnn = cell(emb, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embedding(input_ids))
        return self.decoder(out)


class UNet(nn.Module):
    """The classic U-Net (Ronneberger et al. 2015), 64..1024 channels, padded 3x3 convs + BN."""

    @staticmethod
    def _double(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )

    def __init__(self, in_channels: int = 3, n_classes: int = 2, base: int = 64):
        super().__init__()
        widths = [base * 2**i for i in range(5)]
        self.inc = self._double(in_channels, widths[0])
        self.downs = nn.ModuleList(self._double(a, b) for a, b in zip(widths, widths[1:]))
        self.ups = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in zip(widths, widths[1:]))
        self.up_convs = nn.ModuleList(self._double(b, a) for a, b in zip(widths, widths[1:]))
        self.outc = nn.Conv2d(widths[0], n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(nn.functional.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up, conv in zip(reversed(self.ups), reversed(self.up_convs)):
            x = conv(torch.cat([skips.pop(), up(x)], dim=1))
        return self.outc(x)


class SmallCNN(nn.Module):
    """The CIFAR-10 net of the PyTorch 60-minute tutorial: the smallest realistic CNN."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# --- the zoo --------------------------------------------------------------------------------


@dataclass
class Spec:
    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: dict[str, list[str | int]]  # name -> shape, symbolic dims by name
    outputs: dict[str, list[str | int]]  # name -> shape, only the symbolic dims matter
    dims: dict[str, int]
    published_params: int | None = None
    published_macs: int | None = None
    source: str | None = None
    gpumemnet_name: str | None = None
    note: str | None = None
    training_only_params: int = 0  # in torch_params but not in an inference export
    training_only_note: str | None = None
    published_params_note: str | None = None
    input_dtype: torch.dtype = torch.float32
    vocab: int = 0  # token ids are drawn below this
    # Exported as a training job should be (TrainingMode.TRAINING): the graph keeps its Dropout
    # nodes, whose masks training keeps and an eval export hides (XLNet: 17 % of its peak).
    training: bool = False


def _tv(name: str, **kw) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return torchvision.models.get_model(name, weights=None, **kw)

    return build


def _timm(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False)

    return build


class ByName(nn.Module):
    """Feed a transformers model its inputs by keyword and return the named outputs as a tuple.

    Passed positionally, the legacy exporter pads the call with every default of forward(),
    which transformers 5 turns into a duplicate ``use_cache`` argument and extra graph inputs.
    Users' export scripts wrap the model the same way.
    """

    def __init__(self, model: nn.Module, inputs: list[str], outputs: list[str]):
        super().__init__()
        self.model, self.inputs, self.outputs = model, inputs, outputs

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.inputs, tensors)))
        return tuple(out[k] for k in self.outputs)


def _image(name, build, size, family="cnn", **kw) -> Spec:
    return Spec(name, family, build, {"input": ["batch", 3, size, size]}, {"output": ["batch"]}, {"batch": 1}, **kw)


SEQ = ["batch", "seq"]
DEC_SEQ = ["batch", "dec_seq"]


def _text(name, family, build, vocab, inputs, outputs, dims=None, **kw) -> Spec:
    """inputs: names, token ids of shape [batch, seq] ([batch, dec_seq] for decoder_*); outputs: name -> shape."""
    return Spec(name, family, build, {n: DEC_SEQ if n.startswith("decoder_") else SEQ for n in inputs}, outputs,
                dims or {"batch": 1, "seq": 128}, input_dtype=torch.int64, vocab=vocab, **kw)


def _hf(name, family, model_cls, config_cls, vocab, inputs=("input_ids", "attention_mask"),
        outputs=None, config=None, **kw) -> Spec:
    """A transformers model from its config alone, without cache/mems so the graph is one forward pass."""
    outputs = outputs or {"last_hidden_state": SEQ}

    def build() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_cls)(**(config or {}))
        return ByName(getattr(transformers, model_cls)(cfg), list(inputs), list(outputs))

    return _text(name, family, build, vocab, inputs, outputs, **kw)


BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
BERT_IN = ("input_ids", "attention_mask", "token_type_ids")
BERT_OUT = {"last_hidden_state": SEQ, "pooler_output": ["batch"]}
LOGITS = {"logits": SEQ}
RNN_DIMS = {"batch": 1, "seq": 35}  # the classic truncated-BPTT length of PTB language models
GPT2_LARGE = dict(n_embd=1280, n_layer=36, n_head=20, use_cache=False)
GPT2_XL = dict(n_embd=1600, n_layer=48, n_head=25, use_cache=False)
XLNET_BASE = dict(d_model=768, n_layer=12, n_head=12, d_inner=3072, use_mems_eval=False)
XLNET_LARGE = dict(d_model=1024, n_layer=24, n_head=16, d_inner=4096, use_mems_eval=False)
TIED = ("LM head tied to the token embedding: one parameter in torch, but the graph holds the embedding "
        "and a constant-folded transposed copy for the LM-head MatMul")
TV = "torchvision model docs (acc. table: params, GFLOPS = GMACs)"

SPECS = [
    _image("resnet50", _tv("resnet50"), 224, published_params=25_600_000, published_macs=4_100_000_000,
           source=f"He et al. 2016; {TV}", gpumemnet_name="resnet50"),
    _image("vgg16", _tv("vgg16"), 224, published_params=138_400_000, published_macs=15_500_000_000,
           source=f"Simonyan & Zisserman 2015; {TV}", gpumemnet_name="vgg16"),
    _image("mobilenet_v2", _tv("mobilenet_v2"), 224, published_params=3_500_000, published_macs=300_000_000,
           source=f"Sandler et al. 2018; {TV}", gpumemnet_name="mobilenetV2"),
    _image("efficientnet_b0", _tv("efficientnet_b0"), 224, published_params=5_300_000,
           published_macs=390_000_000, source="Tan & Le 2019, table 2", gpumemnet_name="efficientnet"),
    _image("inception_v3", _tv("inception_v3", aux_logits=True, init_weights=True), 299,
           published_params=23_800_000, published_macs=5_700_000_000,
           source=f"Szegedy et al. 2016 / Keras (23.8M without aux head); {TV} (27.2M with aux, 5.7 GFLOPS)",
           gpumemnet_name="inception",
           note="torchvision model with the aux classifier: counted in torch_params, absent from the eval graph",
           training_only_params=3_326_696,
           training_only_note="AuxLogits branch (conv 768->128 1x1, conv 128->768 5x5, their batch norms, "
                              "fc 768->1000): runs only in training mode, absent from the inference export"),
    _image("xception", _timm("legacy_xception"), 299, published_params=22_900_000,
           source="Chollet 2017 / Keras Applications"),
    _image("vit_b_16", _tv("vit_b_16"), 224, family="vit", published_params=86_600_000,
           published_macs=17_600_000_000, source=f"Dosovitskiy et al. 2021; {TV}"),
    _image("unet", UNet, 256, family="segmentation",
           note="classic U-Net written in make_zoo.py: 64..1024 channels, BN, transposed-conv up, 2 classes"),
    _image("small_cnn", SmallCNN, 32, note="PyTorch tutorial CIFAR-10 net (LeNet-style)"),
    _hf("bert_base", "transformer-encoder", "BertModel", "BertConfig", 30522, BERT_IN, BERT_OUT,
        published_params=110 * M, source="Devlin et al. 2019 (bert-base-uncased)"),
    _hf("bert_large", "transformer-encoder", "BertModel", "BertConfig", 30522, BERT_IN, BERT_OUT, BERT_LARGE,
        published_params=340 * M, source="Devlin et al. 2019 (bert-large-uncased)"),
    _hf("gpt2", "transformer-decoder", "GPT2LMHeadModel", "GPT2Config", 50257, outputs=LOGITS,
        config=dict(use_cache=False), published_params=124 * M,
        source="OpenAI GPT-2 small (124M after recount; the paper says 117M)",
        note=TIED),
    _hf("gpt2_large", "transformer-decoder", "GPT2LMHeadModel", "GPT2Config", 50257, outputs=LOGITS,
        config=GPT2_LARGE, published_params=774 * M, source="OpenAI GPT-2 release (774M)",
        gpumemnet_name="gpt2_large", note=TIED),
    _hf("gpt2_xl", "transformer-decoder", "GPT2LMHeadModel", "GPT2Config", 50257, outputs=LOGITS,
        config=GPT2_XL, published_params=1558 * M, source="OpenAI GPT-2 release (1.5B)", gpumemnet_name="gpt2_xl",
        note=TIED),
    _hf("xlnet_base", "transformer-encoder", "XLNetModel", "XLNetConfig", 32000, config=XLNET_BASE,
        published_params_note="the often quoted 110M does not match the Hugging Face implementation's own "
                              "count, which the graph matches; not used",
        source="Yang et al. 2019; HF pretrained list (xlnet-base-cased)"),
    _hf("xlnet_large", "transformer-encoder", "XLNetModel", "XLNetConfig", 32000, config=XLNET_LARGE,
        published_params_note="the often quoted 340M does not match the Hugging Face implementation's own "
                              "count, which the graph matches; not used",
        source="Yang et al. 2019; HF pretrained list (xlnet-large-cased)"),
    # The models GPUMemNet's real_models_memory.csv measured, as its own scripts built them
    # (itu-rad/GPUMemNet, Test_Pipeline/): Xception is timm's at 224x224 (Resize(256) +
    # CenterCrop(224) in cnn_models/Xception.py), BERT a BertForMaskedLM with the cased 28,996-token
    # vocabulary and XLNet an XLNetForSequenceClassification (Trans_models/*.txt, module dumps
    # named by batch size and sequence length: all sl:512).
    _image("xception_224", _timm("legacy_xception"), 224, source="Chollet 2017; GPUMemNet's input size",
           gpumemnet_name="Xception"),
    _hf("bert_base_mlm", "transformer-encoder", "BertForMaskedLM", "BertConfig", 28996, BERT_IN, LOGITS,
        config=dict(vocab_size=28996), source="bert-base-cased with its MLM head (GPUMemNet's run)",
        gpumemnet_name="BERT_base", training=True),
    _hf("bert_large_mlm", "transformer-encoder", "BertForMaskedLM", "BertConfig", 28996, BERT_IN, LOGITS,
        config=dict(BERT_LARGE, vocab_size=28996), source="bert-large-cased with its MLM head (GPUMemNet's run)",
        gpumemnet_name="BERT_large", training=True),
    _hf("xlnet_base_cls", "transformer-encoder", "XLNetForSequenceClassification", "XLNetConfig", 32000,
        outputs={"logits": ["batch"]}, config=XLNET_BASE, source="xlnet-base-cased, 2 classes (GPUMemNet's run)",
        gpumemnet_name="xlnet_base", training=True),
    _hf("xlnet_large_cls", "transformer-encoder", "XLNetForSequenceClassification", "XLNetConfig", 32000,
        outputs={"logits": ["batch"]}, config=XLNET_LARGE, source="xlnet-large-cased, 2 classes (GPUMemNet's run)",
        gpumemnet_name="xlnet_large", training=True),
    _hf("t5_small", "encoder-decoder", "T5ForConditionalGeneration", "T5Config", 32128,
        ("input_ids", "attention_mask", "decoder_input_ids"), {"logits": DEC_SEQ, "encoder_last_hidden_state": SEQ},
        dict(use_cache=False), dims={"batch": 1, "seq": 128, "dec_seq": 128}, published_params=60 * M,
        source="Raffel et al. 2020 (t5-small)",
        note=f"encoder input [batch, seq], decoder input [batch, dec_seq]; {TIED}"),
    _text("lstm_lm", "rnn", lambda: RNNLM(nn.LSTM, 10000, 650, 650, 2), 10000, ["input_ids"], LOGITS, RNN_DIMS,
          note="Zaremba et al. 2014 medium PTB LSTM (vocab 10000, 2x650, untied), unrolled 35 steps. FlopCounterMode "
               "does not see the fused LSTM kernel: torch_flops_fwd is the decoder only; the LSTM adds "
               "2*35*2*4*650*(650+650) = 473.2M FLOPs"),
    _text("gru_lm", "rnn", lambda: RNNLM(nn.GRU, 10000, 256, 512, 2), 10000, ["input_ids"], LOGITS, RNN_DIMS,
          note="GRU language model: vocab 10000, emb 256, 2x512 (unlike the LSTM, FlopCounterMode counts the GRU)"),
]
BY_NAME = {s.name: s for s in SPECS}


# --- export ---------------------------------------------------------------------------------


def _decorrelate(model: nn.Module) -> None:
    """Nudge every float tensor by a distinct tiny amount.

    In eval mode the legacy exporter merges initializers with equal *values*.  A fresh model
    has many (all-zero biases, all-one LayerNorm/BN scales), a trained one has none; without
    this the graph would share tensors that a user's export would not.  Tied weights are one
    Parameter, so they stay shared.
    """
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.add_(torch.rand_like(t), alpha=1e-3)


def _example(spec: Spec) -> dict[str, torch.Tensor]:
    def make(shape):
        concrete = [spec.dims[d] if isinstance(d, str) else d for d in shape]
        if spec.input_dtype == torch.int64:
            return torch.randint(0, spec.vocab, concrete)
        return torch.randn(concrete)

    ex = {n: make(s) for n, s in spec.inputs.items()}
    if "attention_mask" in ex:
        ex["attention_mask"] = torch.ones_like(ex["attention_mask"])
    if "token_type_ids" in ex:
        ex["token_type_ids"] = torch.zeros_like(ex["token_type_ids"])
    return ex


def _axes(shapes: dict[str, list]) -> dict[str, dict[int, str]]:
    return {n: {i: d for i, d in enumerate(s) if isinstance(d, str)} for n, s in shapes.items()}


def _export(model: nn.Module, spec: Spec, example: dict[str, torch.Tensor], path: Path, opset: int,
            dynamo: bool) -> None:
    mode = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False) if spec.training else {}
    torch.onnx.export(model, tuple(example.values()), str(path), dynamo=dynamo, opset_version=opset,
                      input_names=list(spec.inputs), output_names=list(spec.outputs),
                      dynamic_axes=_axes(spec.inputs | spec.outputs), **mode)


def _bind(model: onnx.ModelProto, dims: dict[str, int]) -> onnx.ModelProto:
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    for vi in [*bound.graph.input, *bound.graph.output]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
    return bound


def _shape(vi: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in vi.type.tensor_type.shape.dim]


def build_one(name: str) -> dict:
    """Export one model to zoo/NAME.onnx without weight data; return its zoo.json entry."""
    spec = BY_NAME[name]
    torch.manual_seed(0)
    model = spec.build().train(spec.training)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    _decorrelate(model)
    example = _example(spec)
    # Deliberately not under torch.no_grad() (nor is the export, as in most users' scripts):
    # there nn.MultiheadAttention takes a fused fast path that FlopCounterMode does not count
    # and the legacy exporter cannot export.
    with FlopCounterMode(display=False) as counter:
        model(*example.values())
    flops = counter.get_total_flops()

    out = ZOO / f"{name}.onnx"
    exporter, opset, note = "torchscript", OPSET, spec.note
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / out.name
        try:
            _export(model, spec, example, raw, OPSET, dynamo=False)
        except Exception as e:  # any legacy failure: fall back to dynamo and say so
            exporter, opset = "dynamo", DYNAMO_OPSET
            note = "; ".join(filter(None, [note, f"legacy exporter failed: {type(e).__name__}: {e}"[:300]]))
            _export(model, spec, example, raw, opset, dynamo=True)
        del model
        proto = onnx.load(str(raw))
    data = out.with_name(out.name + ".data")
    onnx.save_model(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    del proto
    onnx.checker.check_model(str(out))
    data.unlink(missing_ok=True)

    graph = onnx.load(str(out), load_external_data=False)
    onnx.shape_inference.infer_shapes(_bind(graph, spec.dims), strict_mode=True)

    return {
        "name": name,
        "family": spec.family,
        "file": str(out.relative_to(DATA)),
        "inputs": {vi.name: _shape(vi) for vi in graph.graph.input},
        "dims": spec.dims,
        "torch_params": params,
        "torch_buffers": buffers,
        "torch_flops_fwd": flops,
        "published_params": spec.published_params,
        "published_macs": spec.published_macs,
        "source": spec.source,
        "exporter": exporter,
        "opset": opset,
        "mode": "training" if spec.training else "eval",
        "gpumemnet_name": spec.gpumemnet_name,
        "note": note,
        **({"training_only_params": spec.training_only_params,
            "training_only_note": spec.training_only_note} if spec.training_only_params else {}),
        **({"published_params_note": spec.published_params_note}
           if spec.published_params_note else {}),
        "onnx_bytes": out.stat().st_size,
    }


def _one_line(match: re.Match) -> str:
    """Keep short lists (shapes) on one line in zoo.json."""
    return "[" + re.sub(r"\s+", " ", match[1]) + "]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models to (re)build, default all: {' '.join(BY_NAME)}")
    names = ap.parse_args().names or list(BY_NAME)
    if unknown := set(names) - set(BY_NAME):
        ap.error(f"unknown model(s): {' '.join(sorted(unknown))}")
    ZOO.mkdir(exist_ok=True)
    entries = {e["name"]: e for e in json.loads(MANIFEST.read_text())} if MANIFEST.exists() else {}
    failed = []
    # One fresh process per model: memory (GPT-2 XL) goes back to the OS, and a crash or OOM kill
    # costs one model, not the run.
    ctx = multiprocessing.get_context("spawn")
    for name in names:
        start = time.time()
        try:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                entries[name] = pool.submit(build_one, name).result()
            e = entries[name]
            print(f"{name:16} {e['exporter']:11} {e['onnx_bytes'] / 1024:8.0f} KiB"
                  f"  params {e['torch_params'] / M:8.1f}M  fwd {e['torch_flops_fwd'] / G:8.1f} GFLOP"
                  f"  {time.time() - start:5.0f}s", flush=True)
        except Exception:  # report it and go on with the others
            failed.append(name)
            print(f"{name:16} FAILED after {time.time() - start:.0f}s\n{traceback.format_exc()}", flush=True)
    order = {n: i for i, n in enumerate(BY_NAME)}
    text = json.dumps(sorted(entries.values(), key=lambda e: order.get(e["name"], 1e9)), indent=1)
    MANIFEST.write_text(re.sub(r"\[\s+([^][{}]*?)\s+\]", _one_line, text) + "\n")
    if failed:
        print("failed:", " ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
