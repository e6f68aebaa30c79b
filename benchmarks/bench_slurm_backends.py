"""hsubmit's Slurm reads with each backend (cli: scontrol/sinfo; pyslurm: the C API).

Needs a running local cluster whose Slurm matches the installed pyslurm (25.11):

    HORUS_SLURM=25.11 bash tests/cluster/up && HORUS_SLURM=25.11 source tests/cluster/env.sh
    python benchmarks/bench_slurm_backends.py [--runs 7]

(a) hsubmit --explain (a fresh process each run: the Slurm reads plus the prediction), median wall;
(b) the reads alone in a fresh process: the default partition and its GPU types (what hsubmit
    asks Slurm). Accounting is sacct's on either backend (pyslurm has no GPU usage TRES);
Runs alternate the backends. Prints a markdown table; submits nothing.
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

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "tests" / "data" / "zoo"
READS = {
    "hsubmit reads (partition, GPU types)":
        "from slurm_horus.slurm import commands; commands.partition_gpu_types(None)",
}
HSUBMIT = [sys.executable, "-m", "slurm_horus.cli.hsubmit", "--model", str(ZOO / "mobilenet_v2.onnx"),
           "--batch-size", "8", "--task", "infer", "--gres=gpu:1", "--explain", "--wrap", "true"]


def timed(cmd, env, cwd):
    t = time.perf_counter()
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    dt = time.perf_counter() - t
    if cp.returncode != 0:
        raise SystemExit(f"failed ({env['HORUS_SLURM_BACKEND']}): {' '.join(cmd[:4])}: "
                         f"{cp.stderr.strip()[-300:]}")
    return dt, cp.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("SLURM_CONF unset: start the 25.11 cluster and source its env.sh")
    rows = {}
    with tempfile.TemporaryDirectory() as cwd:
        cases = [("hsubmit --explain (whole command)", HSUBMIT)]
        cases += [(name, [sys.executable, "-c", code]) for name, code in READS.items()]
        for name, cmd in cases:
            times = {"cli": [], "pyslurm": []}
            for _ in range(args.runs):
                for be in times:
                    env = {**os.environ, "HORUS_SLURM_BACKEND": be, "PYTHONPATH": str(ROOT)}
                    dt, out = timed(cmd, env, cwd)
                    times[be].append(dt)
            rows[name] = {be: statistics.median(v) for be, v in times.items()}
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{version}, {args.runs} runs each, median wall seconds of a fresh process\n")
    print("| what | cli | pyslurm |")
    print("|---|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['cli']:.3f} | {r['pyslurm']:.3f} |")


if __name__ == "__main__":
    main()
