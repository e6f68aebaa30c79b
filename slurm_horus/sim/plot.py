"""horus-admin simulate --plot: the policies side by side, one panel per metric; and, for a sweep
(benchmarks/bench_simulate.py), mean JCT against offered load, one panel per workload mix.

Reads only the result dicts: one run is ``{policy: metrics}``; a sweep is
``{(mix, load): [per seed {policy: metrics}]}``. ``figure``/``sweep_figure`` return the
matplotlib Figure (what the PNG shows); ``terminal``/``sweep_terminal`` draw the same in
characters.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rich.text import Text

from slurm_horus.plot import TERM_STYLES, bars, color, pyplot

# (metric, panel title, kind): kind sets the unit and which way is better.
PANELS = (("makespan_s", "makespan", "time"),
          ("mean_jct_s", "mean job completion time", "time"),
          ("p95_jct_s", "p95 job completion time", "time"),
          ("mean_wait_s", "mean queue wait", "time"),
          ("sm_busy", "busy SMs, arrival window", "share"),
          ("gpus_alloc", "GPUs allocated, arrival window", "share"),
          ("oom_failures", "OOM failures", "count"))
BETTER = {"time": "lower is better", "count": "lower is better"}
BETTER_METRIC = {"sm_busy": "higher is better"}

Results = Mapping[str, Mapping[str, Any]]
Sweep = Mapping[tuple[str, float], Sequence[Results]]


def time_unit(seconds: float) -> tuple[str, float]:
    """Hours, unless the largest value is under an hour (then minutes, or seconds)."""
    if seconds >= 3600:
        return "h", 3600.0
    return ("min", 60.0) if seconds >= 120 else ("s", 1.0)


def _values(results: Results, metric: str, kind: str) -> tuple[list[float | None], str]:
    """The policies' values of ``metric`` in its unit; None where a policy has none (a time
    over no ended job, a share over no time: metrics' None)."""
    vals = [None if results[p].get(metric) is None else float(results[p][metric]) for p in results]
    if kind == "time":
        unit, div = time_unit(max((v for v in vals if v is not None), default=0.0))
        return [None if v is None else v / div for v in vals], unit
    if kind == "share":
        return [None if v is None else 100.0 * v for v in vals], "%"
    return vals, "jobs"


def _fmt(v: float | None, unit: str) -> str:
    if v is None:  # drawn as an empty bar, labelled '-': not a 0
        return "-"
    if unit == "jobs":
        return f"{v:.0f}"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def figure(results: Results, title: str):
    """Bars per policy for each metric in PANELS; the last cell names the policies."""
    plt = pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    pols = list(results)
    fig, axes = plt.subplots(2, 4, figsize=(15, 7.5))
    fig.suptitle(title, fontsize=12)
    cols = [color(p, i) for i, p in enumerate(pols)]
    for ax, (metric, name, kind) in zip(axes.flat, PANELS):
        vals, unit = _values(results, metric, kind)
        labels = [_fmt(v, unit) for v in vals]
        vals = [v or 0.0 for v in vals]
        bars_ = ax.bar(range(len(pols)), vals, color=cols)
        ax.bar_label(bars_, labels=labels, fontsize=8, padding=2)
        ax.set_xticks(range(len(pols)), pols, fontsize=9)
        ax.set_ylabel(f"{name.split(',')[0]} ({unit})")
        better = BETTER_METRIC.get(metric) or BETTER.get(kind)
        ax.set_title(name + (f"\n({better})" if better else "\n"), fontsize=10)
        top = max(vals, default=0.0)
        ax.set_ylim(0, (100 if unit == "%" and top <= 100 else top * 1.15) or 1)
        ax.spines[["top", "right"]].set_visible(False)
        if kind == "count":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    last = axes.flat[len(PANELS)]
    last.axis("off")
    last.legend(handles=[Patch(color=c, label=p) for p, c in zip(pols, cols)], title="policy",
                loc="center", fontsize=10)
    fig.tight_layout()
    return fig


def terminal(results: Results, title: str, width: int = 36) -> Text:
    """The same panels as bars in characters, one block per metric; fits 80 columns."""
    out = Text(f"{title}\n", style="bold")
    for metric, name, kind in PANELS:
        vals, unit = _values(results, metric, kind)
        better = BETTER_METRIC.get(metric) or BETTER.get(kind)
        out.append(f"\n{name} ({unit})" + (f", {better}" if better else "") + "\n")
        out.append_text(bars([(p, v or 0.0, _fmt(v, unit)) for p, v in zip(results, vals)], width,
                             style_of=lambda p: TERM_STYLES.get(p, "magenta"),
                             top=100.0 if unit == "%" else None))
    return out


# --------------------------------------------------------------------------- sweeps

def _sweep_table(sweep: Sweep) -> tuple[list[str], list[float], list[str], dict]:
    """mixes, loads, policies, and {(mix, load, policy): mean JCT in s, mean of the seeds}."""
    mixes = list(dict.fromkeys(m for m, _ in sweep))
    loads = sorted({lo for _, lo in sweep})
    pols: list[str] = []
    cells = {}
    for (mix, load), runs in sweep.items():
        runs = [runs] if isinstance(runs, Mapping) else list(runs)
        for p in runs[0]:
            if p not in pols:
                pols.append(p)
            v = [r[p]["mean_jct_s"] for r in runs]
            if None not in v:  # a seed where no job ended has no JCT: no cell ('-'), not a mean of the rest
                cells[mix, load, p] = sum(map(float, v)) / len(v)
    return mixes, loads, pols, cells


def sweep_figure(sweep: Sweep, title: str):
    """Mean JCT (h, log scale) against offered load, one line per policy, one panel per mix
    (means over the seeds)."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, LogFormatter

    mixes, loads, pols, cells = _sweep_table(sweep)
    fig, axes = plt.subplots(1, len(mixes), figsize=(4.6 * len(mixes) + 0.6, 4.4),
                             squeeze=False, sharey=True)
    fig.suptitle(title, fontsize=12)
    for ax, mix in zip(axes[0], mixes):
        for i, p in enumerate(pols):
            xs = [lo for lo in loads if (mix, lo, p) in cells]
            ax.plot(xs, [cells[mix, lo, p] / 3600 for lo in xs], marker="o", color=color(p, i),
                    label=p)
        ax.set(xscale="log", yscale="log", title=f"{mix} mix", xlabel="offered load")
        ax.set_xticks(loads, [f"{lo:g}" for lo in loads])
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("mean job completion time (h, log scale)")
    axes[0][-1].legend(title="policy", fontsize=9)
    fig.tight_layout()
    return fig


def sweep_terminal(sweep: Sweep, title: str) -> Text:
    """Mean JCT (h) per policy and load, one table per mix, the lowest of each load marked *."""
    mixes, loads, pols, cells = _sweep_table(sweep)
    out = Text(f"{title}\n", style="bold")
    out.append("mean job completion time (h); * lowest at that load\n")
    pw = max(len(p) for p in pols) + 2
    for mix in mixes:
        out.append(f"\n{mix} mix\n", style="bold")
        out.append(f"{'load':<{pw}}" + "".join(f"{lo:>9g}" for lo in loads) + "\n")
        best = {lo: min((cells[mix, lo, p] for p in pols if (mix, lo, p) in cells),
                        default=None) for lo in loads}
        for p in pols:
            out.append(f"{p:<{pw}}", style=TERM_STYLES.get(p, "magenta"))
            for lo in loads:
                c = cells.get((mix, lo, p))
                s = "-" if c is None else f"{c / 3600:.2f}" + ("*" if c == best[lo] else " ")
                out.append(f"{s:>9}")
            out.append("\n")
    return out
