"""Reproduction table and scale timing of `horus-admin simulate` (results in BENCHMARKS.md, section 6).

    python benchmarks/bench_simulate.py                 # everything (about 2-4 minutes on 2 cores)
    python benchmarks/bench_simulate.py --skip-scale    # only the 2000-job tables

Part 1: for each trace (philly, helios, pai) the equivalent of
``horus-admin simulate --jobs 2000 --gpus 64 --seed 1 --trace T --json`` (plus the same at
--load 2, a 64-GPU T4 cluster and a mixed A100/T4 cluster), as markdown tables, with how close
horus comes to the oracle.  Part 2: 100,000 jobs on 1,000 A100s, all four policies, wall time
per policy (trace generation and the hook's decisions timed separately).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurm_horus.sim_traces import ModelMix, generate_trace  # noqa: E402
from slurm_horus.simulate import (POLICIES, cluster_from_json, homogeneous_cluster,  # noqa: E402
                                  run_policies)

MIXED = {"nodes": [{"name": "a", "gpu_type": "a100", "gpus": 8, "count": 4},
                   {"name": "t", "gpu_type": "t4", "gpus": 4, "count": 8}]}


def table(results: dict) -> str:
    rows = ["| policy | makespan (s) | mean JCT (s) | median JCT (s) | p95 JCT (s) | mean wait (s) "
            "| GPU util | GPUs busy | slowdown | OOMs | shared starts |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p, m in results.items():
        rows.append(f"| {p} | {m['makespan_s']:,.0f} | {m['mean_jct_s']:,.0f} | {m['median_jct_s']:,.0f} "
                    f"| {m['p95_jct_s']:,.0f} | {m['mean_wait_s']:,.0f} | {m['gpu_util']:.3f} "
                    f"| {m['gpus_busy_frac']:.3f} | {m['mean_slowdown']:.3f} | {m['oom_failures']} "
                    f"| {m['shared_starts']} |")
    h, o, e = results.get("horus"), results.get("oracle"), results.get("exclusive")
    if h and o and e:
        rows.append("")
        rows.append(f"horus vs oracle: mean JCT x{h['mean_jct_s'] / o['mean_jct_s']:.3f}, "
                    f"makespan x{h['makespan_s'] / o['makespan_s']:.3f}, "
                    f"GPU util {h['gpu_util'] - o['gpu_util']:+.3f}; "
                    f"horus vs exclusive: mean JCT x{h['mean_jct_s'] / e['mean_jct_s']:.3f}, "
                    f"mean wait x{h['mean_wait_s'] / max(e['mean_wait_s'], 1e-9):.3f}")
    return "\n".join(rows)


def part1(mix: ModelMix, out: list[str]) -> None:
    scenarios = [(t, 1.0, "a100") for t in ("philly", "helios", "pai")]
    scenarios += [(t, 2.0, "a100") for t in ("philly", "helios", "pai")]
    scenarios += [("philly", 1.0, "t4"), ("philly", 1.0, "mixed")]
    for trace, load, kind in scenarios:
        if kind == "mixed":
            cluster = cluster_from_json(json.dumps(MIXED))
            cmd = "--cluster mixed.json"
        else:
            cluster = homogeneous_cluster(64, kind)
            cmd = "" if kind == "a100" else f" --gpu-type {kind}"
        cmd = (f"horus-admin simulate --jobs 2000 --gpus 64 --seed 1 --trace {trace}"
               + ("" if load == 1.0 else f" --load {load:g}") + (f" {cmd}" if cmd.startswith("--c") else cmd)
               + " --json")
        jobs = generate_trace(trace, 2000, cluster.gpu_types, cluster.total_gpus, seed=1, load=load, mix=mix,
                              max_gpus_per_job=cluster.max_gpus_per_node)
        res = run_policies(cluster, jobs)
        out.append(f"### {trace}, load {load:g}, {cluster.describe()}\n\n`{cmd}`\n\n{table(res)}\n")
        print(out[-1], flush=True)


def part2(mix: ModelMix, out: list[str], n_jobs: int, gpus: int) -> None:
    cluster = homogeneous_cluster(gpus)
    t = time.process_time()
    jobs = generate_trace("philly", n_jobs, cluster.gpu_types, cluster.total_gpus, seed=1, mix=mix)
    t_gen = time.process_time() - t
    t, c = time.perf_counter(), time.process_time()
    res = run_policies(cluster, jobs, POLICIES)
    t_all, c_all = time.perf_counter() - t, time.process_time() - c
    lines = [f"### {n_jobs:,} jobs (philly) on {gpus:,} A100\n",
             f"trace generation: {t_gen:.1f} s CPU; all four policies: {c_all:.1f} s CPU, {t_all:.1f} s wall "
             "(wall includes time the machine gave to other processes)\n",
             "| policy | requests incl. hook (CPU s) | simulation (CPU s) | total (CPU s) | simulation (wall s) "
             "| events/CPU s | mean JCT (s) | GPU util |",
             "|---|---|---|---|---|---|---|---|"]
    for p, m in res.items():
        tot = m["request_cpu_s"] + m["sim_cpu_s"]
        lines.append(f"| {p} | {m['request_cpu_s']:.2f} | {m['sim_cpu_s']:.2f} | {tot:.2f} | {m['sim_wall_s']:.2f} "
                     f"| {2 * n_jobs / m['sim_cpu_s']:,.0f} | {m['mean_jct_s']:,.0f} | {m['gpu_util']:.3f} |")
    out.append("\n".join(lines) + "\n")
    print(out[-1], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--scale-jobs", type=int, default=100_000)
    ap.add_argument("--scale-gpus", type=int, default=1000)
    ap.add_argument("--out", help="also write the markdown here")
    args = ap.parse_args()
    out = [f"python {platform.python_version()}, {platform.platform()}\n"]
    mix = ModelMix()
    part1(mix, out)
    if not args.skip_scale:
        part2(ModelMix(), out, args.scale_jobs, args.scale_gpus)  # cold cache: predictions timed too
    if args.out:
        Path(args.out).write_text("\n".join(out))


if __name__ == "__main__":
    main()
