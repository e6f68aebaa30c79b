"""The models calibrate measures, as builders PyTorch runs and exports to ONNX.

Plain ``torch.nn`` models always (so calibrate needs torch only); the test zoo's torchvision and
transformers architectures when those are importable. torch is imported when a model is built,
never when this module is imported (calibrate's orchestration and tests run without torch).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slurm_horus.calibrate.export import decorrelate, export_weightless
from slurm_horus.errors import HorusError
from slurm_horus.textfile import create_site_dirs, untrusted


@dataclass
class ModelSpec:
    """How to build one model, feed it, export it and bind its graph's dims."""

    name: str
    family: str
    build: Callable  # () -> torch.nn.Module
    kind: str  # "image" | "tokens" | "vector"
    size: int = 0  # image side, sequence length or vector width
    vocab: int = 0
    inputs: tuple = ("input",)
    outputs: tuple = ("output",)
    dims: dict = field(default_factory=dict)  # dims other than batch, for feature extraction
    needs: str = ""  # "torchvision" | "transformers" | "" (plain torch)


def _plain_models() -> dict[str, ModelSpec]:
    """Models written with torch.nn alone, so calibrate works with torch only."""
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self, d_in=1024, hidden=4096, layers=4, classes=1000):
            super().__init__()
            mods, d = [], d_in
            for _ in range(layers):
                mods += [nn.Linear(d, hidden), nn.ReLU()]
                d = hidden
            self.body = nn.Sequential(*mods, nn.Linear(d, classes))

        def forward(self, x):
            return self.body(x)

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (self.down(x) if self.down is not None else x))

    class ResNetMini(nn.Module):
        """ResNet-18-shaped (BasicBlock x [2,2,2,2], 64..512 channels), 224x224 input."""

        def __init__(self, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for i, c in enumerate((64, 128, 256, 512)):
                blocks += [Basic(cin, c, 1 if i == 0 else 2), Basic(c, c, 1)]
                cin = c
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    class SmallCNN(nn.Module):
        """The CIFAR-10 net of the PyTorch tutorial (as tests/data/make_zoo.py)."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                                          nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
            self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(),
                                            nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

        def forward(self, x):
            return self.classifier(self.features(x))

    class RNNLM(nn.Module):
        """Embedding, stacked LSTM/GRU, linear decoder (as make_zoo.py's lstm_lm / gru_lm)."""

        def __init__(self, cell, vocab, emb, hidden, layers):
            super().__init__()
            self.embedding = nn.Embedding(vocab, emb)
            self.rnn = cell(emb, hidden, layers, batch_first=True)
            self.decoder = nn.Linear(hidden, vocab)

        def forward(self, input_ids):
            out, _ = self.rnn(self.embedding(input_ids))
            return self.decoder(out)

    class Encoder(nn.Module):
        """BERT-base-shaped encoder from torch.nn.TransformerEncoder (12 x 768, 12 heads)."""

        def __init__(self, vocab=30522, d=768, heads=12, layers=12, ff=3072, max_len=512):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(max_len, d)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, activation="gelu",
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)

        def forward(self, input_ids):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            return self.norm(self.encoder(self.tok(input_ids) + self.pos(pos)[None]))

    seq = {"seq": 128}
    rnn = {"seq": 35}
    return {
        "small_cnn": ModelSpec("small_cnn", "cnn", SmallCNN, "image", 32),
        "resnet_mini": ModelSpec("resnet_mini", "cnn", ResNetMini, "image", 224),
        "mlp": ModelSpec("mlp", "mlp", MLP, "vector", 1024),
        "lstm_lm": ModelSpec("lstm_lm", "rnn", lambda: RNNLM(nn.LSTM, 10000, 650, 650, 2),
                             "tokens", 35, 10000, ("input_ids",), ("logits",), rnn),
        "gru_lm": ModelSpec("gru_lm", "rnn", lambda: RNNLM(nn.GRU, 10000, 256, 512, 2),
                            "tokens", 35, 10000, ("input_ids",), ("logits",), rnn),
        "transformer_encoder": ModelSpec("transformer_encoder", "transformer-encoder", Encoder,
                                         "tokens", 128, 30522, ("input_ids",),
                                         ("last_hidden_state",), seq),
    }


def _library_models() -> dict[str, ModelSpec]:
    """torchvision / transformers models of the test zoo (built when those are importable)."""
    def tv(name, **kw):
        def build():
            import torchvision

            return torchvision.models.get_model(name, weights=None, **kw)
        return build

    def hf(model_cls, config_cls, config=None):
        def build():
            import transformers
            from torch import nn

            class ByName(nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, input_ids):
                    out = self.m(input_ids=input_ids)
                    return out["logits"] if "logits" in out else out["last_hidden_state"]

            cfg = getattr(transformers, config_cls)(**(config or {}))
            return ByName(getattr(transformers, model_cls)(cfg))
        return build

    seq = {"seq": 128}
    out = {}
    for name, size, family in (("resnet50", 224, "cnn"), ("vgg16", 224, "cnn"),
                               ("mobilenet_v2", 224, "cnn"), ("efficientnet_b0", 224, "cnn"),
                               ("vit_b_16", 224, "vit")):
        out[name] = ModelSpec(name, family, tv(name), "image", size, needs="torchvision")
    out["bert_base"] = ModelSpec("bert_base", "transformer-encoder", hf("BertModel", "BertConfig"),
                                 "tokens", 128, 30522, ("input_ids",), ("last_hidden_state",), seq,
                                 needs="transformers")
    out["gpt2"] = ModelSpec("gpt2", "transformer-decoder",
                            hf("GPT2LMHeadModel", "GPT2Config", {"use_cache": False}), "tokens",
                            128, 50257, ("input_ids",), ("logits",), seq, needs="transformers")
    return out


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def model_specs() -> dict[str, ModelSpec]:
    """Every model calibrate can build here (plain torch ones always; library ones if installed)."""
    specs = _plain_models()
    for name, spec in _library_models().items():
        if _importable(spec.needs):
            specs[name] = spec
    return specs


def default_models(available: list[str]) -> list[str]:
    """About 10 minutes on one GPU at the defaults (see docs/calibrate.md)."""
    want = ["mlp", "resnet_mini", "lstm_lm", "transformer_encoder", "resnet50", "bert_base"]
    picked = [m for m in want if m in available]
    if "resnet50" not in picked and "resnet_mini" in picked:
        picked.append("small_cnn")
    return picked


def example_input(spec: ModelSpec, batch: int, device=None):
    """Synthetic input of `spec` at `batch`: images, token ids (full length) or vectors."""
    import torch

    if spec.kind == "image":
        return torch.randn(batch, 3, spec.size, spec.size, device=device)
    if spec.kind == "vector":
        return torch.randn(batch, spec.size, device=device)
    return torch.randint(0, spec.vocab, (batch, spec.size), device=device)


def trusted_cache(cache_dir: str | Path) -> None:
    """HorusError unless the export cache is this user's alone (or not there yet): a graph
    found there is taken as exported, and its features go into the rows root imports.  A
    symbolic link is refused, whoever made it: root had exported into the folder it names."""
    path = Path(cache_dir)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if untrusted(st, (os.geteuid(),), kind="folder"):
        raise HorusError(f"ONNX cache {path}: not a folder of yours that only you can write; "
                         "pass --cache-dir")


def export_spec(spec: ModelSpec, cache_dir: str | Path, training: bool = False) -> Path:
    """cache_dir/NAME.onnx (NAME.train.onnx with `training`): `spec` exported on the CPU without
    weights, symbolic batch (and seq for token models); exported once, then taken from the cache.
    Training rows get the training-mode export, as README tells users to export a training job:
    it keeps Dropout and BatchNorm, which the eval export drops or folds away, and with them
    memory that training keeps."""
    import torch

    cache_dir = Path(cache_dir)
    create_site_dirs(cache_dir)  # 0755 whatever the umask: trusted_cache refuses a group-writable one
    trusted_cache(cache_dir)  # again at use: another user may have made it since the start
    out = cache_dir / f"{spec.name}{'.train' if training else ''}.onnx"  # the modes never mix
    if out.exists():
        return out
    torch.manual_seed(0)
    model = spec.build().train(training)
    decorrelate(model)
    in_axes = {0: "batch", 1: "seq"} if spec.kind == "tokens" else {0: "batch"}
    axes = {n: in_axes for n in spec.inputs} | {n: {0: "batch"} for n in spec.outputs}
    export_weightless(model, (example_input(spec, 1),), out, input_names=list(spec.inputs),
                      output_names=list(spec.outputs), dynamic_axes=axes, training=training)
    return out
