"""Weightless ONNX graphs of the timm architectures in GPUMemNet's timm_training_memory.csv.

The cold-start benchmark (benchmarks/bench_coldstart.py) needs each architecture's graph, as a
user's export script produces it: eval mode, random weights, the model's default input size
(timm `pretrained_cfg["input_size"]`), exported by slurm_horus.calibrate.export (legacy
TorchScript exporter, opset 17, symbolic `batch`, weights dropped: a few hundred KiB a graph),
as tests/data/zoo is.

Exporting 316 models takes hours on two cores, so the graphs are cached outside the repository
(default ~/.cache/slurm-horus/timm-onnx) and this script skips those already there:

    pip install timm onnx        # in any environment with torch; not a project dependency
    python benchmarks/timm_graphs.py [--cache-dir DIR] [--only NAME ...]

Models that fail to export are listed with the reason in DIR/failures.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import traceback
from pathlib import Path

from slurm_horus.calibrate.export import OPSET, decorrelate, export_weightless

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("HORUS_GPUMEMNET_DIR") or REPO_ROOT.parent / "shared" / "datasets"
                / "gpumemnet")
TIMM_CSV = "timm_training_memory.csv"
DEFAULT_CACHE = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "slurm-horus" / "timm-onnx")


def model_names(csv_path: Path) -> list[str]:
    """The distinct timm model names of the measurement file, smallest first (by the lowest peak
    measured), so that an interrupted export has covered as many models as its time allowed."""
    smallest: dict[str, float] = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            peak = float(row["peak_mib"])
            smallest[row["model"]] = min(peak, smallest.get(row["model"], peak))
    return sorted(smallest, key=smallest.get)


def export_one(name: str, out: Path, opset: int = OPSET, fused_attn: bool = True) -> dict:
    """Export `name` to `out` without weight data; return its input size, parameter count and
    family (the timm source module defining the architecture, e.g. `resnet` for SE-ResNets)."""
    import timm
    import torch

    timm.layers.set_fused_attn(fused_attn)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    size = tuple(model.pretrained_cfg["input_size"])
    decorrelate(model)
    params = sum(p.numel() for p in model.parameters())
    family = type(model).__module__.rsplit(".", 1)[-1]
    # no dynamo fallback: main() retries a failure with the two settings known to fix it
    export_weightless(model, (torch.randn(1, *size),), out, input_names=["input"],
                      output_names=["logits"], opset=opset, dynamo_fallback=False,
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return {"input_size": list(size), "torch_params": params, "family": family, "opset": opset,
            "fused_attn": fused_attn}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--only", nargs="*", help="export just these models")
    args = ap.parse_args(argv)
    csv_path = DATA_DIR / TIMM_CSV
    if not csv_path.exists():
        print(f"skipped: {csv_path} not found (the data set is not part of the project)")
        return 0
    import torch

    torch.set_num_threads(1)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path, fail_path = args.cache_dir / "models.json", args.cache_dir / "failures.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    failures = json.loads(fail_path.read_text()) if fail_path.exists() else {}
    for name in args.only or model_names(csv_path):
        out = args.cache_dir / f"{name}.onnx"
        if out.exists() and "family" in meta.get(name, {}) or name in failures and not args.only:
            continue
        t0 = time.time()
        try:
            try:
                meta[name] = export_one(name, out)
            except Exception:  # two known causes; the second try says which setting it changed
                # opset 17 has no col2im (VOLO's fold), and timm's rotary attention passes
                # sdpa a tensor where the tracer wants a bool: its unfused path exports.
                meta[name] = export_one(name, out, opset=18, fused_attn=False)
            failures.pop(name, None)
            print(f"{name}: {time.time() - t0:.1f}s", flush=True)
        except Exception as e:  # report every failure, keep going
            failures[name] = f"{type(e).__name__}: {e}"[:400]
            out.unlink(missing_ok=True)
            print(f"{name}: FAILED {failures[name]}", flush=True)
            traceback.print_exc(limit=2)
        meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True))
        fail_path.write_text(json.dumps(failures, indent=1, sort_keys=True))
    print(f"{len(meta)} exported, {len(failures)} failed -> {args.cache_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
