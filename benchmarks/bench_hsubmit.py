"""hsubmit benchmarks on the local Slurm cluster (bash tests/cluster/up; source tests/cluster/env.sh).

(a) wall time of hsubmit --model resnet50 vs plain sbatch for the same job (median, alternating)
(b) slurmctld submission throughput: jobs without a horus hint (the hook returns at once) vs jobs
    with a hint (the hook parses it, reads the policy and rewrites the request)
(c) packing: a mixed batch of 12 jobs submitted exclusive (sbatch --gres=gpu:1) vs via hsubmit

    python benchmarks/bench_hsubmit.py [--runs 10] [--throughput 500]
Each part cancels its own jobs (and only those) when it is done.  Prints a markdown summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from slurm_horus.slurm import parse as sp  # noqa: E402

ZOO = Path(__file__).resolve().parent.parent / "tests" / "data" / "zoo"
HINT = "horus:v1;a100=6.0/1301/1752;t4=6.0/1301/1752"


def run(cmd, cwd):
    t = time.perf_counter()
    cp = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    dt = time.perf_counter() - t
    if cp.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}: {cp.stderr.strip()}")
    return dt, cp.stdout.strip()


def cancel(ids):
    """Cancel this benchmark's own jobs (never anyone else's) and wait until they are gone."""
    ids = [i for i in ids if i]
    if not ids:
        return
    subprocess.run(["scancel", *ids], capture_output=True)
    for _ in range(60):
        if not subprocess.run(["squeue", "-h", "-t", "PD,R,CG", "-j", ",".join(ids)],
                              capture_output=True, text=True).stdout.strip():
            return
        time.sleep(0.5)


def bench_latency(runs, cwd):
    job = ["--parsable", "--gres=gpu:1", "-o", "/dev/null", "-H", "--wrap", "true"]
    hs = ["hsubmit", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "32", *job]
    sb = ["sbatch", *job]
    t_hs, t_sb, ids = [], [], []
    for _ in range(runs):
        for cmd, times in ((hs, t_hs), (sb, t_sb)):
            dt, out = run(cmd, cwd)
            times.append(dt)
            ids.append(sp.parse_sbatch_stdout(out))
    cancel(ids)
    return statistics.median(t_hs), statistics.median(t_sb)


def bench_throughput(n, cwd, rounds=4, workers=4):
    """Submissions per second, alternating rounds without and with a hint; lists per kind."""
    def submit(comment):
        args = ["sbatch", "--parsable", "-H", "-o", "/dev/null", "--gres=gpu:1", "--wrap", "true"]
        if comment:
            args.insert(1, f"--comment={comment}")
        cp = subprocess.run(args, capture_output=True, text=True, cwd=cwd, check=True)
        return sp.parse_sbatch_stdout(cp.stdout)

    out = {"no hint": [], "hint": []}
    for _ in range(rounds):
        for label, comment in (("no hint", None), ("hint", HINT)):
            t = time.perf_counter()
            with ThreadPoolExecutor(workers) as ex:
                ids = list(ex.map(lambda _: submit(comment), range(n)))
            out[label].append(n / (time.perf_counter() - t))
            cancel(ids)
    return out


MIX = [("small_cnn.onnx", "8", "infer"), ("mobilenet_v2.onnx", "8", "infer"),
       ("small_cnn.onnx", "16", "infer"), ("small_cnn.onnx", "4", "infer"),
       ("mobilenet_v2.onnx", "16", "infer"), ("small_cnn.onnx", "32", "infer"),
       ("small_cnn.onnx", "8", "train"), ("mobilenet_v2.onnx", "4", "infer"),
       ("vgg16.onnx", "128", "train"), ("resnet50.onnx", "32", "train"),
       ("vgg16.onnx", "64", "train"), ("small_cnn.onnx", "2", "infer")]


def occupancy(ids):
    running, gpus = 0, set()
    for i in ids:
        job = sp.parse_scontrol_records(subprocess.run(["scontrol", "-d", "show", "job", i],
                                                       capture_output=True, text=True).stdout)[0]
        if job["JobState"] != "RUNNING":
            continue
        running += 1
        for d in sp.job_gres_detail(job):
            for g in d["gres"]:
                for idx in g["idx"] or []:
                    gpus.add((d["node"], idx))
    return running, len(gpus)


def bench_packing(cwd):
    res = {}
    for mode in ("exclusive", "hsubmit"):
        ids = []
        for m, b, task in MIX:
            if mode == "exclusive":
                cmd = ["sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 60"]
            else:
                cmd = ["hsubmit", "--parsable", "--model", str(ZOO / m), "--batch-size", b,
                       "--task", task, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 60"]
            ids.append(run(cmd, cwd)[1])
        time.sleep(4)
        res[mode] = occupancy(ids)
        cancel(ids)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--throughput", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds of each kind")
    a = ap.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("SLURM_CONF unset: bash tests/cluster/up; source tests/cluster/env.sh")
    with tempfile.TemporaryDirectory() as cwd:
        hs, sb = bench_latency(a.runs, cwd)
        print(f"(a) submit latency, median of {a.runs}: hsubmit {hs:.3f} s, sbatch {sb:.3f} s, "
              f"overhead {hs - sb:+.3f} s (target <= 0.5 s)")
        tp = bench_throughput(a.throughput, cwd, a.rounds)
        nh, wh = statistics.median(tp["no hint"]), statistics.median(tp["hint"])
        print(f"(b) throughput, {a.rounds} alternating rounds of {a.throughput} submissions "
              f"each, 4 concurrent sbatch: "
              + "; ".join(f"{k} " + ", ".join(f"{v:.0f}" for v in vs) + "/s"
                          for k, vs in tp.items())
              + f"; ratio of medians {wh / nh:.3f} (target >= 0.9)")
        pk = bench_packing(cwd)
        for mode, (r, g) in pk.items():
            print(f"(c) {mode:>9}: {r} of {len(MIX)} jobs running on {g} GPUs")


if __name__ == "__main__":
    main()
