"""Accuracy of the predictors on the GPUMemNet measurements (../shared/datasets/gpumemnet).

    python benchmarks/bench_accuracy.py            # both tables
    python benchmarks/bench_accuracy.py --real     # real models only (cold start)
    python benchmarks/bench_accuracy.py --mlp      # 3,000 MLP runs: cold start and learned (80/20)
    python benchmarks/bench_accuracy.py --fit-util # fit the cold start's utilization constants (80/20)

The GPU is treated as an A100 40 GB; training with Adam in fp32, as in the data set. Prints a
Markdown table for BENCHMARKS.md. Skips (exit 0) with a message when the data is absent.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("gpumemnet", ROOT / "benchmarks" / "gpumemnet.py")
gm = importlib.util.module_from_spec(_spec)
sys.modules["gpumemnet"] = gm
_spec.loader.exec_module(gm)

from slurm_horus.predict.coldstart import ColdStartEstimator, ColdStartParams, Workload  # noqa: E402
from slurm_horus.graph.features import extract_features  # noqa: E402
from slurm_horus.predict.gpus import get_gpu  # noqa: E402
from slurm_horus.predict.learned import accuracy, holdout_split, input_row, train_holdout  # noqa: E402

GPU = "a100-40gb"
# The cold start's utilization constants and the physically plausible range each is fitted in.
UTIL_BOUNDS = {
    "launch_us": (3.0, 20.0),              # host cost of one eager kernel
    "kernel_min_us": (1.5, 8.0),           # shortest kernel, launch latency included
    "compute_efficiency": (0.2, 0.9),      # of peak FLOP/s
    "memory_efficiency": (0.4, 0.95),      # of peak bandwidth
    "step_overhead_us": (50.0, 5000.0),    # data loader, loss.item() sync, zero_grad
    "input_gbs": (0.5, 25.0),              # host->device input copy incl. collation
}
ZOO = ROOT / "tests" / "data"
# Sequence lengths the data set does not state; GPUMemNet's own module dumps of these runs are
# named by them (Test_Pipeline/Trans_models/BERT_base_bs:32_sl:512.txt, gpt2_large_bs:8_sl:512.txt, ...).
SEQ = {"BERT_base": 512, "BERT_large": 512, "xlnet_base": 512, "xlnet_large": 512,
       "gpt2_large": 512, "gpt2_xl": 512}


def real_models() -> None:
    zoo = {e.get("gpumemnet_name"): e for e in json.loads((ZOO / "zoo.json").read_text())}
    est, gpu = ColdStartEstimator(), get_gpu(GPU)
    print("| model | batch | measured MiB | slurm-horus cold start | error | Horus formula | "
          "error |")
    print("|---|---|---|---|---|---|---|")
    ours, theirs, skipped = [], [], []
    for row in gm.real_model_rows():
        entry = zoo.get(row["name"])
        if entry is None:
            skipped.append(row["name"])
            continue
        dims = dict(entry["dims"], batch=row["batch_size"])
        if "seq" in dims:
            dims["seq"] = SEQ.get(row["name"], dims["seq"])
        report = extract_features(ZOO / entry["file"], dims=dims)
        pred = est.predict(report, gpu, Workload(batch_size=row["batch_size"])).mem_mib
        e_ours = (pred - row["mem_mib"]) / row["mem_mib"]
        e_horus = (row["horus"] - row["mem_mib"]) / row["mem_mib"]
        ours.append(abs(e_ours))
        theirs.append(abs(e_horus))
        print(f"| {row['name']} | {row['batch_size']} | {row['mem_mib']:,.0f} | {pred:,.0f} | "
              f"{100 * e_ours:+.1f} % | {row['horus']:,.0f} | {100 * e_horus:+.1f} % |")
    print(f"\nMedian absolute relative error over {len(ours)} runs: slurm-horus cold start "
          f"**{100 * statistics.median(ours):.1f} %**, Horus formula "
          f"{100 * statistics.median(theirs):.1f} % (same rows).")
    fake = [abs(r["faketensor"] - r["mem_mib"]) / r["mem_mib"] for r in gm.real_model_rows()
            if r["faketensor"] is not None]
    print(f"FakeTensor's estimates (as the data set gives them, where it ran): median absolute "
          f"relative error {100 * statistics.median(fake):.1f} % over {len(fake)} runs.")
    if skipped:
        print(f"Not in the test corpus, skipped: {', '.join(sorted(set(skipped)))}")


def _mlp_point(row: dict):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp.onnx"
        gm.build_mlp_onnx(row, path)
        report = extract_features(path, batch_size=row["batch_size"])
    gpu, w = get_gpu(GPU), Workload(batch_size=row["batch_size"])
    cold = ColdStartEstimator().predict(report, gpu, w)
    return input_row(report.values, gpu, w, cold), cold.mem_mib, cold.util_pct


def _mlp_report(row: dict):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mlp.onnx"
        gm.build_mlp_onnx(row, path)
        return extract_features(path, batch_size=row["batch_size"])


def fit_util(seed: int = 0) -> None:
    """The cold start's utilization constants, fitted (Powell, in log space, each within its
    UTIL_BOUNDS range; RMSLE) on the training part of the valid MLP runs (the split --mlp scores
    the learned model on) from two starts, the middle of every range and the constants the
    package ships (Powell finds a local optimum: the start matters), each scored on the held-out
    part."""
    import numpy as np
    from scipy.optimize import minimize

    rows = [r for r in gm.mlp_rows() if r["smact"] > 0]  # the failed measurements out, as --mlp
    with ProcessPoolExecutor(2) as pool:
        reports = list(pool.map(_mlp_report, rows, chunksize=50))
    gpu = get_gpu(GPU)
    work = [Workload(batch_size=r["batch_size"]) for r in rows]
    util = np.array([r["util_pct"] for r in rows], float)
    ones = np.ones(len(rows))  # accuracy() scores memory too: none here
    test, train = holdout_split(len(rows), 0.2, seed)
    names = list(UTIL_BOUNDS)
    shipped = ColdStartParams()

    def params_of(logx) -> ColdStartParams:
        return replace(shipped, **{n: float(np.exp(v)) for n, v in zip(names, logx)})

    def predicted(params: ColdStartParams, idx) -> np.ndarray:
        est = ColdStartEstimator(params)
        return np.array([est.utilization_pct(reports[i], gpu, work[i])[0] for i in idx])

    def scores(params: ColdStartParams, idx) -> dict:
        return accuracy(ones[: len(idx)], ones[: len(idx)], predicted(params, idx), util[idx])

    def rmsle(params: ColdStartParams, idx) -> float:
        return scores(params, idx)["util_rmsle"]

    bounds = [(np.log(lo), np.log(hi)) for lo, hi in UTIL_BOUNDS.values()]
    starts = {"the geometric middle of the ranges": [(lo + hi) / 2 for lo, hi in bounds],
              "the shipped constants": [np.log(getattr(shipped, n)) for n in names]}
    table = []
    for label, x0 in starts.items():
        res = minimize(lambda x: rmsle(params_of(x), train), x0, method="Powell", bounds=bounds,
                       options={"xtol": 1e-3, "ftol": 1e-5})
        table += [(label, params_of(x0)), (f"fitted from {label} ({res.nfev} evaluations)", params_of(res.x))]
    print(f"MLP training runs with a valid measurement: {len(rows)}; fitted on {len(train)}, "
          f"scored on the {len(test)} held out (seed {seed}).\n")
    print("| constants | " + " | ".join(names) + " | held-out RMSLE | held-out MAE | training RMSLE |")
    print("|---|" + "---|" * (len(names) + 3))
    for label, p in table:
        m = scores(p, test)
        print(f"| {label} | " + " | ".join(f"{getattr(p, n):.3g}" for n in names)
              + f" | {m['util_rmsle']:.3f} | {m['util_mae_pct']:.2f} pp | {rmsle(p, train):.3f} |")


def mlp(seed: int = 0) -> None:
    """Cold start and learned, on a fixed 80/20 split of the runs with valid measurements.

    22 runs report DCGM SM activity of exactly 0 (the profiler saw no kernel at all) beside an
    nvidia-smi utilization of a few percent: failed measurements, left out of training and of
    the headline figures, and reported separately.
    """
    import numpy as np

    rows = gm.mlp_rows()
    with ProcessPoolExecutor(2) as pool:
        points = list(pool.map(_mlp_point, rows, chunksize=50))
    valid = [i for i, r in enumerate(rows) if r["smact"] > 0]
    failed = [i for i, r in enumerate(rows) if r["smact"] <= 0]
    X = [points[i][0] for i in valid]
    cold_mem = [points[i][1] for i in valid]
    cold_util = [points[i][2] for i in valid]
    mem = [rows[i]["mem_mib"] for i in valid]
    util = [rows[i]["util_pct"] for i in valid]
    model, test = train_holdout(X, mem, util, cold_mem, test_fraction=0.2, seed=seed)
    cold_test = accuracy([cold_mem[i] for i in test], [mem[i] for i in test],
                         [cold_util[i] for i in test], [util[i] for i in test])
    learned = model.metrics
    print(f"MLP training runs: {len(rows)}, of which {len(failed)} failed measurements (DCGM SM "
          f"activity 0); {len(valid) - len(test)} train / {len(test)} held out (seed {seed}).\n")
    print("| predictor | memory median abs. rel. error | utilization RMSLE | utilization MAE |")
    print("|---|---|---|---|")
    for name, m in (("cold start", cold_test), ("learned (80/20)", learned)):
        print(f"| {name} | {m['mem_mdape_pct']:.2f} % | {m['util_rmsle']:.3f} | "
              f"{m['util_mae_pct']:.2f} pp |")
    Xf = np.asarray([points[i][0] for i in failed] + [X[i] for i in test], float)
    cold_f = np.asarray([points[i][1] for i in failed] + [cold_mem[i] for i in test])
    both = accuracy(cold_f * np.exp(model.mem.predict(Xf)),
                    [rows[i]["mem_mib"] for i in failed] + [mem[i] for i in test],
                    np.clip(np.expm1(model.util.predict(Xf)), 0, 100),
                    [rows[i]["util_pct"] for i in failed] + [util[i] for i in test])
    print(f"| learned, held-out + the {len(failed)} failed runs | {both['mem_mdape_pct']:.2f} % | "
          f"{both['util_rmsle']:.3f} | {both['util_mae_pct']:.2f} pp |")
    print(f"\nLearned p90 memory margin: x{np.exp(model.mem_log_q90):.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--mlp", action="store_true")
    parser.add_argument("--fit-util", action="store_true",
                        help="fit the cold start's utilization constants on the MLP runs' 80 %%")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if gm.data_dir() is None:
        print(f"skipped: GPUMemNet data not found ({gm.DataMissing.__doc__ or ''} "
              "expected ../shared/datasets/gpumemnet or $HORUS_GPUMEMNET_DIR)")
        return 0
    if args.fit_util:
        fit_util(args.seed)
        return 0
    both = not (args.real or args.mlp)
    if args.real or both:
        real_models()
    if args.mlp or both:
        print()
        mlp(args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
