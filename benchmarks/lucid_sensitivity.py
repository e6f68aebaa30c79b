"""How much of a job's interference sensitivity k belongs to its own configuration, and so could
be learned from the site's history of it (BENCHMARKS.md, section 6; docs/simulator.md).

The simulator (slurm_horus.sim.interference) gives a co-located job the speed
max(1/3.2, 1 - k L(S)), L(S) = 1 - f(S) the measured median loss at the pair's summed SOLO
utilization S, and draws k per job (lognormal, median 1, sigma 0.6), independent of the model.
Lucid's 1,388 measured pairs give each job's k_obs = (1 - speed) / L(S); this script asks, out of
sample, how much of the variance of log k_obs knowing the job's own configuration (model, data,
batch size, AMP), its model alone, or its partner's configuration removes, and how that depends on
the least predicted loss counted and on how many pairs a configuration has been seen in.

Method: 20 repeats of 5-fold cross-validation over pairs (both jobs of a held-out pair held out);
a key's estimate is its training observations' mean of log k, shrunk towards the training mean by
one-way random-effects moments fitted on the training folds alone.  PPO and TD3 (speed exactly
1.000 in every pair: not measured) count only as partners.  Observations with L(S) <= 0.03 (no
predicted loss to scale; also 0.05 and 0.10) are left out; k_obs <= 0 (faster with a partner) is dropped, or, in the
second table, clipped at 0.1.

The data is Lucid's artifact (github.com/S-Lab-System-Group/Lucid, commit 9b9ba89):
simulation/data/colocate_info.csv and simulation/analyzer/single_data.csv (the solo profiles).
Neither ships with the project or ../shared; without them the script says so and exits 0:

    python3 benchmarks/lucid_sensitivity.py --pairs colocate_info.csv --solo single_data.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slurm_horus.sim.interference import LUCID_POINTS, SENSITIVITY_SIGMA  # noqa: E402

XS, YS = np.array([p[0] for p in LUCID_POINTS]), np.array([p[1] for p in LUCID_POINTS])
UNMEASURED = {"PPO", "TD3"}  # speed exactly 1.000 in all their pairs
MIN_LOSS = 0.03
REPEATS, FOLDS = 20, 5


def load(pairs: Path, solo: Path) -> dict[str, np.ndarray]:
    """One row per job of each pair: its keys, speed, the pair's S and the curve's loss L."""
    with open(solo, newline="") as f:
        util = {(r["model"], r["dataset"], r["batchsize"], r["amp"]): float(r["gpu_util"]) for r in csv.DictReader(f)}
    obs = defaultdict(list)
    with open(pairs, newline="") as f:
        for pid, r in enumerate(csv.DictReader(f)):
            c = {j: (r["model" + j], r["dataset" + j], r["batchsize" + j], r["amp" + j]) for j in "12"}
            s = util[c["1"]] + util[c["2"]]
            for j, o in (("1", "2"), ("2", "1")):
                obs["pair"].append(pid)
                obs["config"].append("/".join(c[j]))
                obs["model"].append("/".join(c[j][:2]))
                obs["partner"].append("/".join(c[o]))
                obs["measured"].append(c[j][0] not in UNMEASURED)
                obs["speed"].append(float(r["speed" + j]))
                obs["S"].append(s)
    o = {k: np.array(v) for k, v in obs.items()}
    o["L"] = 1.0 - np.interp(o["S"], XS, YS)
    return o


def _effects(y: np.ndarray, g: np.ndarray, ng: int) -> tuple[float, float]:
    """(mean, shrinkage in pseudo-observations: within variance / between variance) by moments."""
    n = np.bincount(g, minlength=ng).astype(float)
    means = np.bincount(g, weights=y, minlength=ng) / np.maximum(n, 1)
    keep = n >= 2
    within = np.bincount(g, weights=(y - means[g]) ** 2, minlength=ng)[keep].sum() / max((n[keep] - 1).sum(), 1)
    between = max(means[keep].var(ddof=1) - np.mean(within / n[keep]), 1e-12)
    return float(y.mean()), within / between


def cross_validated(y: np.ndarray, keys: np.ndarray, pair: np.ndarray, cap: int | None = None,
                    seed: int = 0) -> tuple[float, float, float]:
    """(R^2 out of sample against the population mean, sd of log k before, after); ``cap``: each
    key's estimate from at most that many of its training observations (a short history)."""
    _, g = np.unique(keys, return_inverse=True)
    ng, pairs = g.max() + 1, np.unique(pair)
    rng = np.random.default_rng(seed)
    r2, before, after = [], [], []
    for _ in range(REPEATS):
        fold_of = np.empty(pairs.max() + 1, dtype=int)
        fold_of[rng.permutation(pairs)] = np.arange(len(pairs)) % FOLDS
        fold = fold_of[pair]
        pop, own = np.empty_like(y), np.empty_like(y)
        for k in range(FOLDS):
            tr, te = fold != k, fold == k
            mu, m = _effects(y[tr], g[tr], ng)
            used = tr
            if cap is not None:  # a random cap of each key's training observations
                used = np.zeros_like(tr)
                for key in range(ng):
                    idx = np.flatnonzero(tr & (g == key))
                    used[rng.permutation(idx)[:cap]] = True
            n = np.bincount(g[used], minlength=ng)
            shrunk = (np.bincount(g[used], weights=y[used], minlength=ng) + m * mu) / (n + m)
            pop[te], own[te] = mu, shrunk[g[te]]
        r2.append(1.0 - np.sum((y - own) ** 2) / np.sum((y - pop) ** 2))
        before.append(np.sqrt(np.mean((y - pop) ** 2)))
        after.append(np.sqrt(np.mean((y - own) ** 2)))
    return float(np.mean(r2)), float(np.mean(before)), float(np.mean(after))


def _log_k(o: dict[str, np.ndarray], min_loss: float, clip: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(the jobs used, their log k_obs): measured jobs where L > min_loss; k_obs <= 0 dropped,
    or with ``clip`` raised to it."""
    k = (1.0 - o["speed"]) / np.where(o["L"] > 0, o["L"], 1.0)
    sel = o["measured"] & (o["L"] > min_loss)
    if clip is None:
        sel &= k > 0
        return sel, np.log(k[sel])
    return sel, np.log(np.maximum(k[sel], clip))


KEYS = (("its configuration (model, data, batch, AMP)", "config"), ("its model (model, data)", "model"),
        ("its partner's configuration", "partner"))


def report(o: dict[str, np.ndarray]) -> str:
    out = [f"{len(o['speed']) // 2:,} pairs, {len(o['speed']):,} job observations, "
           f"{len(np.unique(o['config']))} configurations of {len(np.unique(o['model']))} models\n",
           "| summed solo util S | jobs | median speed measured | the simulator's curve |", "|---|---|---|---|"]
    for lo, hi in ((0, 75), (75, 100), (100, 125), (125, 150), (150, 175), (175, 400)):
        sel = o["measured"] & (o["S"] >= lo) & (o["S"] < hi)
        out.append(f"| {lo}-{hi} % | {sel.sum()} | {np.median(o['speed'][sel]):.3f} "
                   f"| {np.interp(np.median(o['S'][sel]), XS, YS):.3f} |")
    base = o["measured"] & (o["L"] > MIN_LOSS)
    k = (1.0 - o["speed"][base]) / o["L"][base]
    sim = np.exp(SENSITIVITY_SIGMA * np.random.default_rng(0).standard_normal(100_000))
    out += ["", f"k_obs where L > {MIN_LOSS} ({base.sum()} jobs): median {np.median(k):.2f}, p10 {np.quantile(k, 0.1):.2f}, "
            f"p90 {np.quantile(k, 0.9):.2f}; {np.mean(k < 0):.1%} below 0 (faster beside a partner), "
            f"{np.mean(k == 0):.1%} at 0 (speed 1.000); "
            f"the simulator's k: median {np.median(sim):.2f}, p10 {np.quantile(sim, 0.1):.2f}, p90 {np.quantile(sim, 0.9):.2f}", ""]
    losses = (MIN_LOSS, 0.05, 0.10)
    for title, clip in (("k_obs <= 0 dropped", None), ("k_obs clipped at 0.1", 0.1)):
        cols = [_log_k(o, x, clip) for x in losses]
        out += [f"#### log k out of sample, {title} ({REPEATS} x {FOLDS}-fold over pairs): R^2 (sd of log k: "
                "population -> with the key), by the least loss L counted", "",
                "| the job's history known by | " + " | ".join(f"L > {x:g} ({sel.sum()} jobs)" for x, (sel, _) in zip(losses, cols)) + " |",
                "|---|" + "---|" * len(losses)]
        for name, key in KEYS:
            cells = []
            for sel, y in cols:
                r2, before, after = cross_validated(y, o[key][sel], o["pair"][sel])
                cells.append(f"{r2:.2f} ({before:.2f} -> {after:.2f})")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    sel, y = _log_k(o, MIN_LOSS, None)
    out += [f"#### A short history: each configuration's estimate from at most n of its pairs (L > {MIN_LOSS}, "
            "k_obs <= 0 dropped)", "", "| n | R^2 out of sample | sd of log k: population -> with the key |", "|---|---|---|"]
    for cap in (1, 2, 4, 8, None):
        r2, before, after = cross_validated(y, o["config"][sel], o["pair"][sel], cap=cap)
        out.append(f"| {cap or 'all'} | {r2:.2f} | {before:.2f} -> {after:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=Path, default=Path("colocate_info.csv"), help="Lucid's colocate_info.csv")
    ap.add_argument("--solo", type=Path, default=Path("single_data.csv"), help="Lucid's single_data.csv")
    args = ap.parse_args()
    if not (args.pairs.is_file() and args.solo.is_file()):
        print(f"skipped: {args.pairs} and {args.solo} (Lucid's artifact, commit 9b9ba89) are needed")
        return
    print(report(load(args.pairs, args.solo)))


if __name__ == "__main__":
    main()
