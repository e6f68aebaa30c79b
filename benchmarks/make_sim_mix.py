"""Generate slurm_horus/data/sim_mix.json: the simulator's model mix, shipped with the package.

    python benchmarks/make_sim_mix.py [--out slurm_horus/data/sim_mix.json]

For every (model, batch, task) of `slurm_horus.sim.mix.MIX` and every GPU type of
`SHIPPED_TYPES`: the cold-start prediction (util %, memory MiB, p90 MiB) on the real ONNX graph
of tests/data/zoo, so `horus-admin simulate` never reads the test corpus at run time.

Memory residuals, log(measured / predicted), of the same cold start on GPUMemNet's 18 named runs
(real_models_memory.csv, an A100 40 GB; these runs are not among the rows the cold start's
constants were fitted on): per model where the model was measured, pooled for the others.  Read
from ../shared/datasets/gpumemnet (or $HORUS_GPUMEMNET_DIR); when absent the table keeps the
residuals of the existing file and says so (never a silent unbiased default).

Utilization residuals, log(measured / predicted) nvidia-smi utilization, of the same cold start
on the held-out 20 % of GPUMemNet's MLP runs (an A100 40 GB): the runs with a valid DCGM
measurement, split as benchmarks/bench_accuracy.py does (train_holdout, seed 0); the cold
start's six utilization constants were fitted on the other 80 %.  Pooled over all runs: the
only measured utilization errors of the cold start (MLPs, not the mix's architectures).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from bench_accuracy import _mlp_point, gm  # noqa: E402
from bench_coldstart import GPU, SEQ  # noqa: E402
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload  # noqa: E402
from slurm_horus.graph.features import extract_features  # noqa: E402
from slurm_horus.predict.gpus import get_gpu  # noqa: E402
from slurm_horus.sim.mix import MIX, SHIPPED_MIX, SHIPPED_TYPES  # noqa: E402

ZOO = ROOT / "tests" / "data"


def zoo_index() -> dict[str, dict]:
    return {e["name"]: e for e in json.loads((ZOO / "zoo.json").read_text())}


def predictions(est: ColdStartEstimator) -> list[dict]:
    zoo, out, reports = zoo_index(), [], {}
    for model, batch, task, weights in MIX:
        key = (model, batch)
        if key not in reports:
            dims = {"seq": 128, "dec_seq": 128, **zoo[model].get("dims", {}), "batch": batch}
            reports[key] = extract_features(ZOO / zoo[model]["file"], dims=dims)
        pred = {}
        for t in SHIPPED_TYPES:
            p = est.predict(reports[key], get_gpu(t), Workload(batch_size=batch, task=task))
            pred[t] = [round(float(p.util_pct), 3), round(float(p.mem_mib), 1), round(float(p.mem_mib_p90), 1)]
        out.append({"model": model, "batch": batch, "task": task, "weights": weights, "pred": pred})
        print(f"{model} b{batch} {task}: a100 {pred['a100-40gb']}, t4 {pred['t4']}", flush=True)
    return out


def mem_residuals(est: ColdStartEstimator) -> dict | None:
    try:
        rows = gm.real_model_rows()
    except gm.DataMissing:
        return None
    zoo = {e.get("gpumemnet_name"): e for e in zoo_index().values() if e.get("gpumemnet_name")}
    by_model: dict[str, list[float]] = {}
    for r in rows:
        entry = zoo[r["name"]]
        dims = dict(entry["dims"], batch=r["batch_size"])
        if "seq" in dims:
            dims["seq"] = SEQ.get(r["name"], dims["seq"])
        report = extract_features(ZOO / entry["file"], dims=dims)
        pred = est.predict(report, get_gpu(GPU), Workload(batch_size=r["batch_size"])).mem_mib
        by_model.setdefault(entry["name"], []).append(round(math.log(r["mem_mib"] / pred), 4))
    pooled = sorted(x for xs in by_model.values() for x in xs)
    return {"source": "GPUMemNet real_models_memory.csv (18 runs, A100 40 GB), log(measured/predicted)",
            "by_model": by_model, "pooled": pooled}


def util_residuals() -> dict | None:
    try:
        rows = gm.mlp_rows()
    except gm.DataMissing:
        return None
    valid = [r for r in rows if r["smact"] > 0]  # 22 runs whose profiler saw no kernel: failed
    order = np.random.default_rng(0).permutation(len(valid))  # train_holdout's split, seed 0
    held = [valid[i] for i in order[:max(int(round(len(valid) * 0.2)), 1)]]
    res = sorted(round(math.log(r["util_pct"] / _mlp_point(r)[2]), 4) for r in held)
    return {"source": f"GPUMemNet mlp_training_runs.csv, held-out 20 % ({len(res)} runs, A100 40 GB), "
                      "log(measured/predicted) nvidia-smi utilization", "pooled": res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=SHIPPED_MIX)
    args = ap.parse_args()
    est = ColdStartEstimator()
    res = mem_residuals(est)
    if res is None:
        if not args.out.is_file():
            print(f"{gm.DataMissing(gm.REAL_CSV)}: cannot measure the residuals", file=sys.stderr)
            return 1
        print(f"{gm.DataMissing(gm.REAL_CSV)}: keeping the residuals of {args.out}")
        res = json.loads(args.out.read_text())["mem_residuals"]
    ures = util_residuals()
    if ures is None:
        print(f"GPUMemNet MLP runs not found: keeping the utilization residuals of {args.out}")
        ures = json.loads(args.out.read_text())["util_residuals"]
    table = {"schema": 1, "generated_by": "benchmarks/make_sim_mix.py",
             "predictor": "ColdStartEstimator (defaults)", "types": list(SHIPPED_TYPES),
             "entries": predictions(est), "mem_residuals": res, "util_residuals": ures}
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {args.out}: {len(table['entries'])} entries x {len(SHIPPED_TYPES)} types; "
          f"memory residuals of {len(res['by_model'])} models, {len(res['pooled'])} runs; "
          f"utilization residuals of {len(ures['pooled'])} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
