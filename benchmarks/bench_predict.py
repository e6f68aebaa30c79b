"""Time to predict ResNet-50: in-process (load the serving model and history, predict once) and
the wall time of `horus predict`, cold start alone and with a learned model serving.

    python benchmarks/bench_predict.py [--repeat 11]

The learned model is trained here on rows from the corpus graphs with noisy targets, so that its
trees grow to full size (300 trees per target of up to 31 leaves, as `learned.fit` builds them:
about 1.3 MB of JSON, like a site's); its accuracy does not matter for timing. It is stored in a
temporary registry and promoted, beside a history of 2,000 measured runs of other graphs. The
in-process figure is choose_predictor + one prediction (features already extracted: they cost
the same whichever predictor serves). Last, hsubmit's wall time against sbatch's, with Slurm's
commands stood in for by scripts. Runs alternate between setups; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from slurm_horus.predict.coldstart import ColdStartEstimator, Workload  # noqa: E402
from slurm_horus.graph.features import extract_features  # noqa: E402
from slurm_horus.predict.gpus import get_gpu  # noqa: E402
from slurm_horus.predict.history import HistoryPredictor  # noqa: E402
from slurm_horus.predict.learned import fit, input_row  # noqa: E402
from slurm_horus.predict.chain import choose_predictor, predict_for  # noqa: E402
from slurm_horus.predict.registry import Registry  # noqa: E402

MODEL = ROOT / "tests" / "data" / "zoo" / "resnet50.onnx"


def _train(registry: Registry) -> None:
    rows, mem, util, cold, runs = [], [], [], [], []
    rng = np.random.default_rng(0)
    for name in ("mobilenet_v2", "vgg16", "small_cnn", "unet", "efficientnet_b0"):
        for batch in (1, 2, 4, 8, 16, 32, 64):
            report = extract_features(MODEL.parent / f"{name}.onnx", batch_size=batch)
            for gpu in ("a100", "t4", "h100", "l4"):
                for prec, opt in (("fp32", "adam"), ("amp", "adam"), ("fp32", "sgd")):
                    g, w = get_gpu(gpu), Workload(batch_size=batch, precision=prec, optimizer=opt)
                    c = ColdStartEstimator().predict(report, g, w)
                    rows.append(input_row(report.values, g, w, c))
                    mem.append(c.mem_mib * rng.lognormal(0.1, 0.15))
                    util.append(min(c.util_pct * rng.lognormal(0, 0.2), 100))
                    cold.append(c.mem_mib)
    registry.promote(registry.add(fit(rows, mem, util, cold)))
    for i in range(2000):  # other graphs' runs: the history file a busy site serves
        runs.append({"sha": f"{i // 4:064x}", "gpu": "a100-40gb", "bs": 2 ** (i % 4 + 3),
                     "task": "train", "opt": "adam", "prec": "fp32", "dims": "",
                     "mem": float(rng.uniform(2e3, 3e4)), "util": float(rng.uniform(5, 95)),
                     "cold_mem": float(rng.uniform(2e3, 3e4)),
                     "cold_util": float(rng.uniform(5, 95)), "family": f"f{i % 50}",
                     "user": f"u{i % 30}"})
    registry.save_history(HistoryPredictor().fit(runs).to_dict())


def _in_process(folder: str, report, gpu, w) -> float:
    t = time.perf_counter()
    predict_for(report, [gpu], w, choose_predictor(folder))
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as trained, \
            tempfile.TemporaryDirectory() as alone:
        _train(Registry(trained))
        for name in ("v0001.json", "current.json"):  # the same model without a history
            shutil.copy(Path(trained) / name, Path(alone) / name)
        sizes = {p.name: p.stat().st_size for p in Path(trained).glob("*.json")}
        print(f"registry files: {sizes}")
        report, gpu, w = extract_features(MODEL, batch_size=32), get_gpu("a100"), Workload(32)
        setups = (("cold start", empty), ("learned model", alone),
                  ("learned model + 2,000-run history", trained))
        inproc: dict[str, list[float]] = {label: [] for label, _ in setups}
        _in_process(trained, report, gpu, w)  # first imports (numpy...) are not the model's
        for _ in range(args.repeat):
            for label, folder in setups:
                inproc[label].append(_in_process(folder, report, gpu, w))
        print("| in-process: choose_predictor + one prediction | median | min | max |")
        print("|---|---|---|---|")
        for label, values in inproc.items():
            print(f"| {label} | {1e3 * statistics.median(values):.1f} ms | "
                  f"{1e3 * min(values):.1f} ms | {1e3 * max(values):.1f} ms |")
        cmd = ["horus", "predict", str(MODEL), "--batch-size", "32", "--gpu", "a100", "--json"]
        times: dict[str, list[float]] = {"cold start": [], "learned + history": []}
        for _ in range(args.repeat):
            for label, folder in (("cold start", empty), ("learned + history", trained)):
                times[label].append(_wall(cmd, {**os.environ, "HORUS_MODEL_DIR": folder}))
        print("\n| `horus predict --json` wall time | median | min | max |\n|---|---|---|---|")
        _table(times)
        with tempfile.TemporaryDirectory() as bin_dir:
            env = _stand_in_slurm(Path(bin_dir))
            job = ["-p", "gpu", "--gres=gpu:a100:1", "--wrap", "true"]
            hsubmit = [sys.executable, "-m", "slurm_horus.cli.hsubmit", "--model", str(MODEL),
                       "--batch-size", "32", *job]
            times = {"sbatch (stand-in)": [], "hsubmit, cold start": [],
                     "hsubmit, learned + history": []}
            for _ in range(args.repeat):
                times["sbatch (stand-in)"].append(_wall([Path(bin_dir) / "sbatch", *job], env))
                for label, folder in (("hsubmit, cold start", empty),
                                      ("hsubmit, learned + history", trained)):
                    times[label].append(_wall(hsubmit, {**env, "HORUS_MODEL_DIR": folder}))
        print("\n| wall time, Slurm's commands stood in for (no cluster) | median | min | max |"
              "\n|---|---|---|---|")
        _table(times)
    return 0


def _wall(cmd, env) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def _table(times: dict[str, list[float]]) -> None:
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.3f} s | {min(values):.3f} s | "
              f"{max(values):.3f} s |")


def _stand_in_slurm(bin_dir: Path) -> dict:
    """scontrol, sinfo and sbatch as scripts that answer at once: what hsubmit adds to sbatch
    is then hsubmit's own time (a real sbatch's round trip to slurmctld comes on top of both)."""
    scripts = {"scontrol": "echo 'NodeName=n1 Partitions=gpu Gres=gpu:a100:4 State=IDLE'",
               "sinfo": "echo 'slurm 22.05.11'", "sbatch": "echo 'Submitted batch job 42'"}
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


if __name__ == "__main__":
    sys.exit(main())
