"""Weightless ONNX export: how calibrate and benchmarks/timm_graphs.py turn a PyTorch model into
the kind of graph file a user submits (tests/data/make_zoo.py builds the test zoo the same way).

Graphs are exported as most users' scripts do it (legacy TorchScript exporter, opset 17,
symbolic dims; eval mode, or training mode for a training job as README asks) and saved with
every tensor of 1 KiB or more moved to an external data file that is then deleted, so the graph
keeps each initializer's name, dtype and dims but no weights (a few hundred KiB). torch is
imported when a model is exported, never when this module is imported.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx

OPSET = 17          # the legacy exporter's opset, as users (and tests/data/zoo) export
DYNAMO_OPSET = 18   # the dynamo exporter's lowest opset
WEIGHT_BYTES = 1024  # tensors this large or larger are dropped from the saved graph


def decorrelate(model) -> None:
    """Nudge every floating parameter and buffer by a different small random amount.

    In eval mode the legacy exporter merges initializers with equal values; a fresh model has
    many (zero biases, unit norm scales), a trained one none, so without this the graph would
    share tensors that a user's export would not."""
    import torch

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.add_(torch.rand_like(t), alpha=1e-3)


def export_weightless(model, example: tuple, out: str | os.PathLike, *, input_names: list[str],
                      output_names: list[str], dynamic_axes: dict, opset: int = OPSET,
                      dynamo_fallback: bool = True, training: bool = False) -> str:
    """Export `model` (called on `example`) to `out` without weight data; -> the exporter used,
    ``"torchscript"`` or ``"dynamo"`` (tried at DYNAMO_OPSET when the legacy one fails and
    `dynamo_fallback` is set). `out` appears whole or not at all (written beside, then renamed).
    `training` exports as a training job (TrainingMode.TRAINING, no constant folding); the
    legacy exporter otherwise puts the model in eval mode, while dynamo keeps the model's own mode.
    """
    import torch

    out = Path(out)
    kw = dict(input_names=list(input_names), output_names=list(output_names),
              dynamic_axes=dynamic_axes)
    mode = {}
    if training:
        mode = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    exporter = "torchscript"
    # beside `out` (same file system, so the rename is atomic); the exporter may write data
    # files of its own next to the raw graph, and the folder takes them all away
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        raw, part = Path(tmp) / "raw.onnx", Path(tmp) / out.name
        try:
            torch.onnx.export(model, example, str(raw), dynamo=False, opset_version=opset, **kw,
                              **mode)
        except Exception:
            if not dynamo_fallback:
                raise
            exporter = "dynamo"
            torch.onnx.export(model, example, str(raw), dynamo=True, opset_version=DYNAMO_OPSET,
                              **kw)
        proto = onnx.load(str(raw))
        onnx.save_model(proto, str(part), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=part.name + ".data",
                        size_threshold=WEIGHT_BYTES)
        os.replace(part, out)
    return exporter
