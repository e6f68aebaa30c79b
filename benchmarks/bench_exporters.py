"""What the exporter changes: features and cold-start predictions of the same model exported by
torch.onnx.export's legacy TorchScript exporter (`dynamo=False`, as README asks) and by its
dynamo exporter (torch's default).

    pip install onnxscript transformers   # dev tools, not project dependencies
    python benchmarks/bench_exporters.py [--only NAME ...] [--keep DIR]

Each model is built from its configuration alone (random weights, nothing downloaded), put in
training mode and exported twice from one example (batch 2; sequences of 16 tokens):

- TorchScript: `dynamo=False, training=TrainingMode.TRAINING, do_constant_folding=False`,
  opset 17, as README's example;
- dynamo: the model's own training mode (the exporter ignores `training` and always folds
  constants), opset 18, torch's defaults otherwise (`optimize=True`);

both with the same input and output names and the same `dynamic_axes` (batch, and the sequence
of the text models), the files as the exporter writes them (weights inline or in its `.data`
file), in a temporary folder deleted afterwards. Each file goes through
`slurm_horus.graph.features.extract_features` and hsubmit's `predict_for`, the cold start forced
(no site registry read), for a training job on an A100 40 GB: Adam, fp32, one CPU per GPU (the
`horus predict` defaults), at the batch (and `seq`) of each model's row.  Prints a Markdown table.
Skips (exit 0) with one line when torch, transformers or onnxscript is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPU = "a100-40gb"
EXAMPLE_BATCH, EXAMPLE_SEQ = 2, 16
TS_OPSET, DYNAMO_OPSET = 17, 18


def _logits(model, mask: bool = False):
    """The model as a module returning its logits tensor alone (a Hugging Face model returns a
    ModelOutput): both exporters then see the same one output.  ``mask``: pass an all-ones
    attention mask, as a tokenizer's does (without one, transformers' causal-mask code checks the
    position ids for packed sequences with torch.diff, which the TorchScript exporter refuses)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            if mask:
                return self.m(x, attention_mask=torch.ones_like(x)).logits
            return self.m(x).logits

    return Logits(model)


def _hf(cls_name: str, cfg_name: str, mask: bool = False, **cfg):
    def build():
        import transformers

        config = getattr(transformers, cfg_name)(**cfg)
        return _logits(getattr(transformers, cls_name)(config), mask)
    return build


def _plain_cnn():
    """A small VGG-like CNN with BatchNorm and a two-layer head, plain torch.nn."""
    from torch import nn

    def block(a, b):
        return [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(inplace=True)]

    return nn.Sequential(*block(3, 64), *block(64, 64), nn.MaxPool2d(2),
                         *block(64, 128), *block(128, 128), nn.MaxPool2d(2),
                         *block(128, 256), *block(256, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(256, 512), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(512, 10))


TEXT = {"input_names": ["input_ids"], "dynamic_axes": {"input_ids": {0: "batch", 1: "seq"},
                                                        "logits": {0: "batch", 1: "seq"}}}
IMAGE = {"input_names": ["pixel_values"], "dynamic_axes": {"pixel_values": {0: "batch"},
                                                            "logits": {0: "batch"}}}
# name: (build, kind, image size or vocabulary, batch predicted, dims predicted)
MODELS = {
    "bert-base (MLM)": (_hf("BertForMaskedLM", "BertConfig"), TEXT, 30522, 8, {"seq": 512}),
    "gpt2 (LM head)": (_hf("GPT2LMHeadModel", "GPT2Config", mask=True, use_cache=False), TEXT, 50257, 8,
                       {"seq": 512}),
    "vit-base/16": (_hf("ViTForImageClassification", "ViTConfig"), IMAGE, 224, 32, {}),
    "resnet-50": (_hf("ResNetForImageClassification", "ResNetConfig"), IMAGE, 224, 32, {}),
    "convnext-tiny": (_hf("ConvNextForImageClassification", "ConvNextConfig"), IMAGE, 224, 32, {}),
    "plain CNN (torch.nn)": (_plain_cnn, IMAGE, 32, 128, {}),
    # transformers' TF padding: an F.pad before each Conv, which dynamo's optimizer fuses into it
    "mobilenet-v2": (_hf("MobileNetV2ForImageClassification", "MobileNetV2Config"), IMAGE, 224, 32, {}),
    "efficientnet-b0": (_hf("EfficientNetForImageClassification", "EfficientNetConfig", width_coefficient=1.0,
                            depth_coefficient=1.0, image_size=224, hidden_dim=1280), IMAGE, 224, 32, {}),
}


def _example(kind: dict, size: int):
    import torch

    if kind is TEXT:
        return (torch.randint(0, size, (EXAMPLE_BATCH, EXAMPLE_SEQ)),)
    return (torch.randn(EXAMPLE_BATCH, 3, size, size),)


def export_both(build, kind: dict, size: int, folder: Path) -> tuple[Path, Path, int, float, float]:
    """-> (TorchScript file, dynamo file, PyTorch's parameter count, seconds of each export)."""
    import torch

    torch.manual_seed(0)
    model = build().train()
    params = sum(p.numel() for p in model.parameters())
    example = _example(kind, size)
    names = dict(input_names=kind["input_names"], output_names=["logits"],
                 dynamic_axes=kind["dynamic_axes"])
    ts, dyn = folder / "ts" / "model.onnx", folder / "dynamo" / "model.onnx"
    ts.parent.mkdir(parents=True)
    dyn.parent.mkdir(parents=True)
    # the exporters' progress lines and the legacy one's IR dump on failure: not the table's
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        torch.onnx.export(model, example, str(ts), dynamo=False, opset_version=TS_OPSET,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          **names)
        t1 = time.perf_counter()
        model.train()  # the legacy exporter restores the mode; dynamo exports the model's own
        torch.onnx.export(model, example, str(dyn), dynamo=True, opset_version=DYNAMO_OPSET,
                          verbose=False, **names)
        t2 = time.perf_counter()
    return ts, dyn, params, t1 - t0, t2 - t1


def analyse(path: Path, batch: int, dims: dict):
    from slurm_horus.graph.features import extract_features
    from slurm_horus.predict.chain import PredictorChoice, predict_for
    from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
    from slurm_horus.predict.gpus import get_gpu

    report = extract_features(path, batch_size=batch, dims=dims)
    report.require_bound()
    workload = Workload(batch_size=batch, task="train", optimizer="adam", precision="fp32",
                        cpus_per_gpu=1.0)
    choice = PredictorChoice(ColdStartEstimator(), "cold start (forced)")
    (pred,) = predict_for(report, [get_gpu(GPU)], workload, choice)
    return report, pred


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.3f}" if a else "-"


def _short(warning: str, width: int = 110) -> str:
    return warning if len(warning) <= width else warning[:width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=list(MODELS), metavar="NAME",
                    help=f"models to run (default all: {', '.join(MODELS)})")
    ap.add_argument("--keep", type=Path, help="copy the exported graphs here")
    args = ap.parse_args(argv)
    for lib in ("torch", "transformers", "onnxscript"):
        try:
            __import__(lib)
        except ImportError:
            print(f"skipped: {lib} is not installed (pip install torch transformers onnxscript)")
            return 0
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed"
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"onnxscript {__import__('onnxscript').__version__}, Python {platform.python_version()}; "
          f"cold start, {GPU}, training, Adam, fp32\n")
    rows, notes, timing = [], [], []
    with tempfile.TemporaryDirectory(prefix="horus-exporters-") as tmp:
        for name in args.only or MODELS:
            build, kind, size, batch, dims = MODELS[name]
            folder = Path(tmp) / name.replace(" ", "_").replace("/", "_")
            try:
                ts, dyn, params, t_ts, t_dyn = export_both(build, kind, size, folder)
            except Exception as e:  # one model's failed export is reported, not fatal
                first = (str(e).strip().splitlines() or [""])[0]
                rows.append(f"| {name} | export failed: {type(e).__name__}: {first[:100]} |||||||")
                continue
            (r_ts, p_ts), (r_dyn, p_dyn) = analyse(ts, batch, dims), analyse(dyn, batch, dims)
            v, w = r_ts.values, r_dyn.values
            at = f"b={batch}" + "".join(f", {k}={n}" for k, n in dims.items())
            dwarn = r_dyn.warnings()
            mem = f"{p_ts.mem_mib:,.0f} / {p_dyn.mem_mib:,.0f} ({(p_dyn.mem_mib / p_ts.mem_mib - 1) * 100:+.1f} %)"
            rows.append(
                f"| {name} ({at}) | {params:,} | {int(v['params']):,} / {int(w['params']):,} | "
                f"{_ratio(v['flops'], w['flops'])} | "
                f"{_ratio(v['activation_bytes'], w['activation_bytes'])} | "
                f"{_ratio(v['saved_activation_bytes'], w['saved_activation_bytes'])} | {mem} | "
                f"{p_ts.util_pct:.1f} / {p_dyn.util_pct:.1f} | {len(dwarn) or 'none'} |")
            for wline in dwarn:
                notes.append(f"- {name}, dynamo: {_short(wline)}")
            for wline in r_ts.warnings():
                notes.append(f"- {name}, TorchScript: {_short(wline)}")
            timing.append(f"{name} {t_ts:.0f} s / {t_dyn:.0f} s "
                          f"(nodes {int(v['n_nodes'])} / {int(w['n_nodes'])})")
            if args.keep:
                shutil.copytree(folder, args.keep / folder.name, dirs_exist_ok=True)
            print(f"  done: {timing[-1]}", file=sys.stderr, flush=True)
    print("| model (predicted at) | params PyTorch | params TS / dynamo | FLOPs dynamo/TS | "
          "activation bytes dynamo/TS | saved activations dynamo/TS | predicted MiB TS / dynamo "
          f"({GPU}) | predicted util % TS / dynamo | dynamo warnings |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if notes:
        print("\nWarnings:\n" + "\n".join(notes))
    print("\nExport seconds TS / dynamo (graph nodes TS / dynamo): " + "; ".join(timing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
