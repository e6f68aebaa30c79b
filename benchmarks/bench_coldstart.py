"""The cold start's peak-memory accuracy on real architectures, held out by architecture family.

    python benchmarks/bench_coldstart.py [--folds 5] [--cache-dir DIR] [--rev c815c1d]

Data (never copied into the project): GPUMemNet's timm_training_memory.csv and
real_models_memory.csv in ../shared/datasets/gpumemnet (or $HORUS_GPUMEMNET_DIR); the timm
graphs come from benchmarks/timm_graphs.py's cache. Skips (exit 0) saying why when either is
absent.

Clean rows (`gpumemnet.clean_timm_rows`): a row at or above 39,500 MiB ran out of memory at the card's limit
(40,960 MiB), and a row below the same model's peak at a smaller batch (among the rows kept) is an
unstable run; both are dropped before anything is fitted or scored.

Folds: the families (the timm module defining each architecture: `resnet` holds ResNets,
SE-ResNets, ResNeXts) are dealt to k folds; the memory constants are fitted on k-1 folds and
each held-out fold is scored with the constants fitted without it, so no family is in both
halves. The 18 named runs and the zoo use the constants fitted on every clean timm row, which
are the shipped defaults. `--rev REV` scores the code of an older commit (its own constants,
nothing fitted) on the same rows, for the before/after table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpumemnet as gm  # noqa: E402
CACHE = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slurm-horus"
         / "timm-onnx")
GPU = "a100-40gb"
# The memory constants the fit may move, each within a physically plausible range.
FIT_BOUNDS = {
    "context_mib": (300.0, 2500.0),       # context + libraries beyond the stack reservation
    "reserve_factor": (1.0, 1.5),          # allocator caching/fragmentation over allocated
    "activation_factor": (0.8, 2.0),       # what autograd keeps beyond the graph's saved tensors
    "workspace_factor": (0.0, 8.0),        # transients, x the largest activation
}
SEQ = {"BERT_base": 512, "BERT_large": 512, "xlnet_base": 512, "xlnet_large": 512,
       "gpt2_large": 512, "gpt2_xl": 512}


def family_folds(families: dict[str, str], rows: list[dict], k: int) -> dict[str, int]:
    """Fold of each family: largest families first, each to the fold with the fewest rows."""
    count: dict[str, int] = {}
    for r in rows:
        f = families[r["model"]]
        count[f] = count.get(f, 0) + 1
    sizes, fold_of = [0] * k, {}
    for f in sorted(count, key=lambda f: (-count[f], f)):
        i = sizes.index(min(sizes))
        fold_of[f] = i
        sizes[i] += count[f]
    return fold_of


def _features(args: tuple[str, list[int]]) -> dict[int, dict]:
    """Feature values of one timm graph at each batch size (None when it cannot be read)."""
    from slurm_horus.graph.features import extract_features

    path, batches = args
    try:
        return {b: extract_features(path, dims={"batch": b}).values for b in batches}
    except Exception as e:  # a graph the pipeline rejects is reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"[:200]}


class _Values:
    """The part of a FeatureReport the memory estimate reads."""

    def __init__(self, values: dict):
        self.values = values


def _predict(params, values: dict, batch: int) -> float:
    from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
    from slurm_horus.predict.gpus import get_gpu

    est = ColdStartEstimator(params) if params is not None else ColdStartEstimator()
    return est.memory_mib(_Values(values), _gpu(get_gpu), Workload(batch_size=batch))[0]


def _gpu(get_gpu, cache={}):
    """The catalog entry, looked up once (the fit evaluates the estimate many times)."""
    if not cache:
        cache["gpu"] = get_gpu(GPU)
    return cache["gpu"]


def fit(samples: list[tuple[dict, int, float]]):
    """Memory constants minimising the mean |log(predicted/measured)| on `samples`."""
    from scipy.optimize import minimize

    from slurm_horus.predict.coldstart import ColdStartParams

    names = list(FIT_BOUNDS)
    base = ColdStartParams()

    def params_of(x):
        return replace(base, **dict(zip(names, x)))

    def loss(x):
        p = params_of(x)
        return sum(abs(math.log(_predict(p, v, b) / y)) for v, b, y in samples) / len(samples)

    x0 = [getattr(base, n) for n in names]
    res = minimize(loss, x0, method="Powell", bounds=[FIT_BOUNDS[n] for n in names],
                   options={"xtol": 1e-3, "ftol": 1e-5})
    return params_of(res.x)


def p90_margin(params, samples: list[tuple[dict, int, float]]) -> float:
    """The 90th percentile of measured/predicted on `samples`: the p90 bound's factor."""
    return max(1.0, _q([y / _predict(params, v, b) for v, b, y in samples], 0.9))


def _errors(pred: list[float], actual: list[float]) -> list[float]:
    return [abs(p - a) / a for p, a in zip(pred, actual)]


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def _line(name: str, errs: list[float], covered: list[bool] | None) -> str:
    cov = f"{100 * sum(covered) / len(covered):.1f} %" if covered else "-"
    return (f"| {name} | {len(errs)} | {100 * statistics.median(errs):.1f} % | "
            f"{100 * _q(errs, 0.9):.1f} % | {cov} |")


def _named_runs(params) -> tuple[list[float], list[bool], list[str]]:
    """Errors and p90 coverage on the 18 named runs (zoo graphs), and one line per run."""
    from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
    from slurm_horus.graph.features import extract_features
    from slurm_horus.predict.gpus import get_gpu

    zoo = {e.get("gpumemnet_name"): e
           for e in json.loads((ROOT / "tests" / "data" / "zoo.json").read_text())}
    est = ColdStartEstimator(params) if params is not None else ColdStartEstimator()
    errs, cov, lines = [], [], []
    for r in gm.real_model_rows():
        name, batch, actual = r["name"], r["batch_size"], r["mem_mib"]
        entry = zoo[name]
        dims = dict(entry["dims"], batch=batch)
        if "seq" in dims:
            dims["seq"] = SEQ.get(name, dims["seq"])
        report = extract_features(ROOT / "tests" / "data" / entry["file"], dims=dims)
        pred = est.predict(report, get_gpu(GPU), Workload(batch_size=batch))
        errs.append(abs(pred.mem_mib - actual) / actual)
        cov.append(actual <= pred.mem_mib_p90)
        lines.append(f"| {name} | {batch} | {actual:,.0f} | {pred.mem_mib:,.0f} | "
                     f"{100 * (pred.mem_mib - actual) / actual:+.1f} % |")
    return errs, cov, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--cache-dir", type=Path, default=CACHE)
    ap.add_argument("--rev", help="also score this commit's code (e.g. c815c1d), unfitted")
    ap.add_argument("--no-fit", action="store_true", help=argparse.SUPPRESS)  # --rev's child
    args = ap.parse_args(argv)
    if gm.data_dir() is None or not (gm.data_dir() / gm.TIMM_CSV).exists():
        print("skipped: the GPUMemNet data (../shared/datasets/gpumemnet) is not here; it is not "
              "part of the project")
        return 0
    meta_path = args.cache_dir / "models.json"
    if not meta_path.exists():
        print(f"skipped: no timm graphs in {args.cache_dir}; run benchmarks/timm_graphs.py first")
        return 0
    meta = json.loads(meta_path.read_text())
    all_rows = gm.timm_rows()
    rows = [r for r in gm.clean_timm_rows(all_rows) if r["model"] in meta]
    batches: dict[str, list[int]] = {}
    for r in rows:
        batches.setdefault(r["model"], []).append(r["batch_size"])
    jobs = [(str(args.cache_dir / f"{m}.onnx"), bs) for m, bs in batches.items()]
    with ProcessPoolExecutor(2) as pool:
        feats = dict(zip(batches, pool.map(_features, jobs)))
    broken = {m: f["error"] for m, f in feats.items() if "error" in f}
    rows = [r for r in rows if r["model"] not in broken]
    families = {m: meta[m]["family"] for m in batches}
    n_models = len({r["model"] for r in rows})
    print(f"timm: {len(all_rows)} rows, {len(gm.clean_timm_rows(all_rows))} clean; scored {len(rows)} "
          f"clean rows of {n_models} models with a graph ({len(broken)} graphs unreadable"
          f"{': ' + ', '.join(sorted(broken)) if broken else ''}).")

    actual = [r["peak_mib"] for r in rows]
    if args.no_fit:
        pred = [_predict(None, feats[r["model"]][r["batch_size"]], r["batch_size"]) for r in rows]
        errs = _errors(pred, actual)
        print(f"RESULT {statistics.median(errs)} {_q(errs, 0.9)}")
        n_err, _, _ = _named_runs(None)
        print(f"NAMED {statistics.median(n_err)} {_q(n_err, 0.9)}")
        return 0

    from slurm_horus.predict.coldstart import ColdStartEstimator

    fold_of = family_folds(families, rows, args.folds)
    pred, p90 = [0.0] * len(rows), [0.0] * len(rows)
    for k in range(args.folds):
        train = [(feats[r["model"]][r["batch_size"]], r["batch_size"], r["peak_mib"])
                 for r in rows if fold_of[families[r["model"]]] != k]
        params = fit(train)
        margin = p90_margin(params, train)
        for i, r in enumerate(rows):
            if fold_of[families[r["model"]]] == k:
                pred[i] = _predict(params, feats[r["model"]][r["batch_size"]], r["batch_size"])
                p90[i] = pred[i] * margin
    errs = _errors(pred, actual)
    covered = [a <= q for a, q in zip(actual, p90)]
    ft_rows = [r for r in rows if r["faketensor_mib"]]
    ft = _errors([r["faketensor_mib"] for r in ft_rows], [r["peak_mib"] for r in ft_rows])

    everything = [(feats[r["model"]][r["batch_size"]], r["batch_size"], r["peak_mib"])
                  for r in rows]
    final = fit(everything)
    final = replace(final, p90_factor=p90_margin(final, everything))
    shipped = ColdStartEstimator().params
    print("\nConstants fitted on every clean timm row (the shipped ColdStartParams defaults were "
          "fitted on the first 104 architectures exported):")
    for n in [*FIT_BOUNDS, "p90_factor"]:
        print(f"  {n} = {getattr(final, n):.3f}   (shipped: {getattr(shipped, n)})")

    print("\n| cold start, peak memory | rows | median abs. rel. error | p90 | p90 bound covers |")
    print("|---|---|---|---|---|")
    if args.rev:
        before = _score_rev(args.rev, args.cache_dir)
        if before:
            print(f"| timm, {args.rev} (before) | {len(rows)} | {100 * before[0]:.1f} % | "
                  f"{100 * before[1]:.1f} % | - |")
    print(_line(f"timm, family-split {args.folds}-fold held-out (after)", errs, covered))
    print(_line("timm, PyTorch FakeTensor (same rows where it ran)", ft, None))
    n_err, n_cov, n_lines = _named_runs(None)
    if args.rev and before:
        print(f"| 18 named runs, {args.rev} (before) | 18 | {100 * before[2]:.1f} % | "
              f"{100 * before[3]:.1f} % | - |")
    print(_line("18 named runs, shipped constants (after)", n_err, n_cov))
    print("\n| named run | batch | measured MiB | cold start | error |\n|---|---|---|---|---|")
    print("\n".join(n_lines))
    by_family: dict[str, list[float]] = {}
    for r, e in zip(rows, errs):
        by_family.setdefault(families[r["model"]], []).append(e)
    worst = sorted(by_family, key=lambda f: -statistics.median(by_family[f]))[:8]
    print("\nWorst held-out families (median error, rows): " + ", ".join(
        f"{f} {100 * statistics.median(by_family[f]):.0f} % ({len(by_family[f])})" for f in worst))
    return 0


def _score_rev(rev: str, cache_dir: Path) -> tuple[float, float, float, float] | None:
    """Median and p90 error of commit `rev`'s own cold start (timm rows, then named runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "slurm_horus"],
                                 capture_output=True, check=False)
        if archive.returncode:
            print(f"(--rev {rev}: {archive.stderr.decode().strip()})")
            return None
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env = dict(os.environ, PYTHONPATH=tmp)
        out = subprocess.run([sys.executable, "-c",
                              "import sys; sys.path.insert(0, sys.argv[1]); "
                              "import runpy; sys.argv = sys.argv[2:]; "
                              "runpy.run_path(sys.argv[0], run_name='__main__')",
                              tmp, __file__, "--no-fit", "--cache-dir", str(cache_dir)],
                             capture_output=True, text=True, env=env, check=True).stdout
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()
             if ln.startswith(("RESULT", "NAMED"))}
    return (*map(float, lines["RESULT"]), *map(float, lines["NAMED"]))


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # after PYTHONPATH, so --rev's older package wins
    sys.exit(main())
