"""History first, measured on the GPUMemNet runs (../shared/datasets/gpumemnet): warm and unseen.

    python benchmarks/bench_history.py                 # all three parts
    python benchmarks/bench_history.py --part timm     # warm memory, 316 timm architectures
    python benchmarks/bench_history.py --part real     # the 18 named runs (zoo graphs)
    python benchmarks/bench_history.py --part mlp      # unseen MLP graphs, 5 folds by graph

Warm: a graph's runs at the other batch sizes are the history, the scored run never is (leave
one batch size out). Unseen: folds split by graph; the history holds only other graphs measured
on the same GPU type (site offsets, and family evidence where said). Every run is on one A100
40 GB class GPU, PyTorch, fp32, Adam (see the data set's README). Prints Markdown tables; skips
(exit 0) when the data is absent.

timm clean-row rule (the README's, gpumemnet.clean_timm_rows): a run at >= 39,500 MiB ran out
of memory, and a run below the same model's peak at a smaller batch size is unstable; both are
left out of history and scoring. timm graphs are not built here (no torch), so the timm part scores the history alone:
a line through the two nearest measured batch sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("bench_accuracy",
                                               ROOT / "benchmarks" / "bench_accuracy.py")
ba = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ba)
gm = ba.gm

from slurm_horus.predict.coldstart import ColdStartEstimator, Workload  # noqa: E402
from slurm_horus.graph.features import extract_features  # noqa: E402
from slurm_horus.predict.gpus import get_gpu  # noqa: E402
from slurm_horus.predict.history import HistoryPredictor  # noqa: E402
from slurm_horus.predict.workload import dims_key  # noqa: E402

GPU = get_gpu(ba.GPU)


def _row(name, err_mem, err_util=None):
    """| name | rows | util MAE | memory median | p90 | (errors relative to the measurement)."""
    e = sorted(abs(x) for x in err_mem)
    p90 = e[min(int(0.9 * len(e)), len(e) - 1)] if e else float("nan")
    util = f"{statistics.mean(abs(u) for u in err_util):.1f} pp" if err_util else "-"
    return (f"| {name} | {len(e)} | {util} | {100 * statistics.median(e):.1f} % | "
            f"{100 * p90:.1f} % |")


HEADER = ("| set / predictor | runs scored | util MAE | memory median abs. rel. error | "
          "memory p90 abs. rel. error |\n|---|---|---|---|---|")


def _run(sha, bs, mem, util=None, cold_mem=None, cold_util=None, family=None, dims=""):
    return {"sha": sha, "gpu": GPU.name, "bs": bs, "task": "train", "opt": "adam",
            "prec": "fp32", "dims": dims, "mem": mem, "util": util, "cold_mem": cold_mem,
            "cold_util": cold_util, "family": family, "user": None}


# --------------------------------------------------------------------------- timm (warm)

def timm_clean() -> dict[str, dict[int, float]]:
    """model -> {batch: peak MiB} on the clean rows (gpumemnet.clean_timm_rows)."""
    clean: dict[str, dict[int, float]] = defaultdict(dict)
    for r in gm.clean_timm_rows(gm.timm_rows()):
        clean[r["model"]][r["batch_size"]] = r["peak_mib"]
    return clean


def timm_warm() -> None:
    clean = timm_clean()
    errs = []
    for model, runs in clean.items():
        sha = hashlib.sha256(model.encode()).hexdigest()
        for b in runs:
            history = [_run(sha, x, m) for x, m in runs.items() if x != b]
            if len(history) < 2:  # one point needs the cold start, which needs the graph
                continue
            h = HistoryPredictor().fit(history)
            a = h.estimate(sha, GPU.name, Workload(batch_size=b), "", None, None, None, None,
                           1.0, 0.0, "none")
            assert a.tier == "exact"
            errs.append((a.mem_mib - runs[b]) / runs[b])
    print(f"timm: {len(clean)} architectures, {sum(map(len, clean.values()))} clean runs.\n")
    print(HEADER)
    print(_row("timm warm: history:exact (other batch sizes of the model)", errs))


# --------------------------------------------------------------------------- real models

def _real_points():
    """(name, batch, measured MiB, report, cold) for the named runs whose graph is in the zoo."""
    zoo = {e.get("gpumemnet_name"): e for e in json.loads((ba.ZOO / "zoo.json").read_text())}
    est = ColdStartEstimator()
    out = []
    for row in gm.real_model_rows():
        entry = zoo.get(row["name"])
        if entry is None:
            continue
        dims = dict(entry["dims"], batch=row["batch_size"])
        if "seq" in dims:
            dims["seq"] = ba.SEQ.get(row["name"], dims["seq"])
        report = extract_features(ba.ZOO / entry["file"], dims=dims)
        w = Workload(batch_size=row["batch_size"])
        out.append((row["name"], row["batch_size"], row["mem_mib"], report,
                    est.predict(report, GPU, w)))
    return out


def _hrun(name, b, mem, report, cold):
    return _run(report.sha256, b, mem, cold_mem=cold.mem_mib, cold_util=cold.util_pct,
                family=name, dims=dims_key(report.bound_dims, b))


def real() -> None:
    points = _real_points()
    cold, warm, unseen = [], [], []
    for name, b, mem, report, c in points:
        w = Workload(batch_size=b)
        cold.append((c.mem_mib - mem) / mem)
        same = [_hrun(*p) for p in points if p[0] == name and p[1] != b]
        if same:
            p = HistoryPredictor(user="-").fit(same).predict(report, GPU, w)
            assert p.predictor == "history:exact", p.predictor
            warm.append((p.mem_mib - mem) / mem)
        others = [_hrun(*p) for p in points if p[0] != name]
        p = HistoryPredictor(user="-").fit(others).predict(report, GPU, w)
        assert p.predictor == "cold-start", p.predictor
        unseen.append((p.mem_mib - mem) / mem)
    print(f"\nNamed runs with a zoo graph: {len(points)}.\n")
    print(HEADER)
    print(_row("named runs: cold start", cold))
    print(_row("named runs warm: history:exact from the model's other batch size (one point)",
               warm))
    print(_row("named runs unseen: cold start + site offsets of the other models", unseen))


# --------------------------------------------------------------------------- MLP (unseen)

def _mlp_cold(row: dict):
    _, cold_mem, cold_util = ba._mlp_point(row)
    return cold_mem, cold_util


def mlp(folds: int, limit: int | None, seed: int) -> None:
    import numpy as np

    rows = [r for r in gm.mlp_rows() if r["smact"] > 0][:limit]  # failed measurements out
    with ProcessPoolExecutor(2) as pool:
        colds = list(pool.map(_mlp_cold, rows, chunksize=50))
    runs = [_run(hashlib.sha256(r["row_id"].encode()).hexdigest(), r["batch_size"],
                 r["mem_mib"], r["util_pct"], cm, cu, family=f"mlp-{r['arch']}")
            for r, (cm, cu) in zip(rows, colds)]
    parts = np.array_split(np.random.default_rng(seed).permutation(len(runs)), folds)
    res: dict[str, tuple[list, list]] = {k: ([], []) for k in ("cold", "offsets", "family")}
    for test in parts:
        test_set = set(test.tolist())
        train = [r for i, r in enumerate(runs) if i not in test_set]
        h = HistoryPredictor().fit(train)
        for i in test:
            r = runs[i]
            w = Workload(batch_size=r["bs"])
            for key, family in (("offsets", None), ("family", r["family"])):
                a = h.estimate(r["sha"], GPU.name, w, "", r["cold_mem"], r["cold_util"], family,
                               None, r["cold_mem"], r["cold_util"], "cold-start")
                res[key][0].append((a.mem_mib - r["mem"]) / r["mem"])
                res[key][1].append(a.util_pct - r["util"])
            res["cold"][0].append((r["cold_mem"] - r["mem"]) / r["mem"])
            res["cold"][1].append(r["cold_util"] - r["util"])
    print(f"\nMLP runs with valid measurements: {len(runs)}; {folds} folds split by graph "
          f"(seed {seed}); the history of each fold holds only the other folds' graphs.\n")
    print(HEADER)
    print(_row("MLP unseen: cold start", *res["cold"]))
    print(_row("MLP unseen: cold start + site offsets", *res["offsets"]))
    print(_row("MLP unseen: + family evidence (same MLP shape)", *res["family"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("timm", "real", "mlp"), action="append")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--limit", type=int, default=None, help="first N MLP runs only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if gm.data_dir() is None:
        print("skipped: GPUMemNet data not found (expected ../shared/datasets/gpumemnet or "
              "$HORUS_GPUMEMNET_DIR)")
        return 0
    parts = args.part or ["timm", "real", "mlp"]
    if "timm" in parts:
        if (gm.data_dir() / gm.TIMM_CSV).is_file():
            timm_warm()
        else:
            print(f"timm part skipped: {gm.TIMM_CSV} not in {gm.data_dir()}")
    if "real" in parts:
        real()
    if "mlp" in parts:
        mlp(args.folds, args.limit, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
