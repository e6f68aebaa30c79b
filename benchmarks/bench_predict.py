"""Wall time of `horus predict` on ResNet-50: cold start alone, and with a learned model serving.

    python benchmarks/bench_predict.py [--repeat 11]

The learned model is trained here on rows from the corpus graphs (its accuracy does not matter
for timing; its size does: 300 trees per target, as `learned.fit` builds them), stored in a
temporary registry and promoted. Runs alternate between the two setups; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slurm_horus.coldstart import ColdStartEstimator, Workload  # noqa: E402
from slurm_horus.features import extract_features  # noqa: E402
from slurm_horus.gpus import get_gpu  # noqa: E402
from slurm_horus.learned import fit, input_row  # noqa: E402
from slurm_horus.registry import Registry  # noqa: E402

MODEL = ROOT / "tests" / "data" / "zoo" / "resnet50.onnx"


def _train(registry: Registry) -> None:
    rows, mem, util, cold = [], [], [], []
    for name in ("resnet50", "mobilenet_v2", "vgg16", "small_cnn", "unet"):
        for batch in (1, 4, 16, 64):
            report = extract_features(MODEL.parent / f"{name}.onnx", batch_size=batch)
            for gpu in ("a100", "t4", "h100", "l4"):
                g, w = get_gpu(gpu), Workload(batch_size=batch)
                c = ColdStartEstimator().predict(report, g, w)
                rows.append(input_row(report.values, g, w, c))
                mem.append(c.mem_mib * 1.1)
                util.append(c.util_pct)
                cold.append(c.mem_mib)
    registry.promote(registry.add(fit(rows, mem, util, cold)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as trained:
        _train(Registry(trained))
        cmd = ["horus", "predict", str(MODEL), "--batch-size", "32", "--gpu", "a100", "--json"]
        times: dict[str, list[float]] = {"cold start": [], "learned": []}
        for _ in range(args.repeat):
            for label, folder in (("cold start", empty), ("learned", trained)):
                t = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True,
                               env={**os.environ, "HORUS_MODEL_DIR": folder})
                times[label].append(time.perf_counter() - t)
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.3f} s | {min(values):.3f} s | "
              f"{max(values):.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
