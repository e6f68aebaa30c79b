"""hacct --plot: predicted against measured GPU utilization and peak memory, and the error over
time, coloured by the predictor source (cold-start, learned, history).

Errors follow docs/definitions.md: predicted minus measured, utilization in percentage points,
memory in percent of the measured peak. Failed measurements count in no figure, as in the
summary. ``figure`` returns the matplotlib Figure (what the PNG shows); ``terminal`` draws the
same in characters for a login node.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import datetime, timezone

from rich.text import Text
from sqlalchemy import func, or_, select

from slurm_horus.errors import HorusError
from slurm_horus.ledger import job_filters, mask_url, tables
from slurm_horus.ledger.report import predictor_source, printable
from slurm_horus.plot import Canvas, TERM_STYLES, bars, color, legend, pyplot, side_by_side

SOURCES = ("cold-start", "learned", "history")  # the order of the legends
GLYPHS = {"cold-start": "c", "learned": "L", "history": "h"}
MEM_CLIP_PCT = 500.0  # memory errors above this are drawn at the panel's edge
PLOT_LIMIT = 20000  # the latest measured jobs drawn (describe says so when it is reached)


def plot_points(ledger, limit: int | None = None, **filters) -> list[dict]:
    """The latest ``limit`` (PLOT_LIMIT) measured jobs, oldest first: submit time, predictor
    source, predicted and measured utilization and memory (p50 and p90)."""
    limit = limit or PLOT_LIMIT
    j = tables()["jobs"]
    stmt = select(j.c.submit_time, j.c.predictor, j.c.pred_util_pct, j.c.act_util_pct,
                  j.c.pred_mem_mib, j.c.pred_mem_p90_mib, j.c.act_mem_mib)
    stmt = stmt.where(or_(j.c.act_util_pct.isnot(None), j.c.act_mem_mib.isnot(None)),
                      func.coalesce(j.c.failed_measurement, 0) == 0)
    stmt = job_filters(stmt, submitted_only=True, **filters)
    stmt = stmt.order_by(j.c.submit_time.desc()).limit(limit)
    with ledger.engine.connect() as conn:
        rows = [r._asdict() for r in conn.execute(stmt)][::-1]
    for r in rows:
        # a predictor named in a user's hint: printable, as hacct's list prints it (the legend
        # drove the reader's terminal)
        r["source"] = printable(predictor_source(r.pop("predictor")) or "unknown")
        for k, v in r.items():  # a damaged ledger's inf or nan: no point (it had overflowed)
            if isinstance(v, float) and not math.isfinite(v):
                r[k] = None
    return [r for r in rows if r["submit_time"] is not None]


def describe(url: str, filters: dict, shown: int | None = None) -> str:
    """'ledger sqlite:///l.db, user alice, since 2024-05-01 00:00': where the points came from;
    with ``shown`` points at PLOT_LIMIT, that they are the latest (the titles' job counts and the
    p90 coverage are of those, not of every job that matched)."""
    parts = [f"ledger {mask_url(url)}"]
    # task_ids: the own ids of array tasks and heterogeneous job components, jobs as any other
    jobs = list(dict.fromkeys([*(filters.get("job_ids") or ()), *(filters.get("task_ids") or ())]))
    for name, vals in (("user", filters.get("users")), ("account", filters.get("accounts")),
                       ("state", filters.get("states")), ("jobs", jobs)):
        if vals:
            s = ",".join(map(str, vals))
            parts.append(f"{name} {s if len(s) <= 30 else s[:29] + '+'}")
    for key, name in (("start", "since"), ("end", "until")):
        if filters.get(key) is not None:
            parts.append(f"{name} {time.strftime('%Y-%m-%d %H:%M', time.localtime(filters[key]))}")
    if filters.get("cluster"):
        c = filters["cluster"]
        parts.append(f"cluster {c if isinstance(c, str) else ','.join(c)}")
    if filters.get("under_claims"):
        parts.append("under-claims only")
    if shown is not None and shown >= PLOT_LIMIT:
        parts.append(f"the latest {shown} by submit time")
    return ", ".join(parts)


def _sources(points: list[dict]) -> list[str]:
    present = {p["source"] for p in points}
    return [s for s in SOURCES if s in present] + sorted(present - set(SOURCES))


def _util(points, src=None):
    return [p for p in points if p["pred_util_pct"] is not None and p["act_util_pct"] is not None
            and (src is None or p["source"] == src)]


def _mem(points, src=None):
    return [p for p in points if p["pred_mem_mib"] and p["act_mem_mib"]
            and (src is None or p["source"] == src)]


def _mem_unit(points) -> tuple[str, float]:
    top = max((max(p["act_mem_mib"], p["pred_mem_mib"], p["pred_mem_p90_mib"] or 0)
               for p in points), default=0.0)
    return ("GiB", 1024.0) if top >= 4096 else ("MiB", 1.0)


def _mem_err(p) -> float:
    return 100.0 * (p["pred_mem_mib"] - p["act_mem_mib"]) / p["act_mem_mib"]


def _check(points: list[dict]) -> None:
    if not _util(points) and not _mem(points):
        raise HorusError("no measured job with a prediction matches; nothing to plot")


# --------------------------------------------------------------------------- PNG

def figure(points: list[dict], where: str):
    """The 2x2 figure: utilization and memory scatters (y = x marks a perfect prediction),
    utilization and memory error over submit time."""
    _check(points)
    plt = pyplot()
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    srcs = _sources(points)
    n = len(points)
    fig, ((au, am), (eu, em)) = plt.subplots(2, 2, figsize=(12, 9.5))
    fig.suptitle(f"hacct: predicted vs measured GPU use, {n} measured job{'s' * (n != 1)}\n{where}",
                 fontsize=12)
    size = 18 if n < 500 else 6
    alpha = 0.75 if n < 500 else 0.35

    nu = len(_util(points))
    au.plot([0, 100], [0, 100], color="0.6", lw=1, ls="--", label="predicted = measured")
    for i, s in enumerate(srcs):
        pts = _util(points, s)
        if pts:
            au.scatter([p["pred_util_pct"] for p in pts], [p["act_util_pct"] for p in pts],
                       s=size, alpha=alpha, color=color(s, i), label=f"{s} ({len(pts)})")
    au.set(xlim=(0, 100), ylim=(0, 100), xlabel="predicted GPU utilization (%)",
           ylabel="measured GPU utilization (%)", title=f"GPU utilization, {nu} jobs")
    au.legend(title="predictor (jobs)", loc="lower right", fontsize=9)
    au.text(2, 97, "above the line: busier than predicted", va="top", fontsize=8, color="0.35")

    mem = _mem(points)
    unit, div = _mem_unit(mem)
    vals = [v / div for p in mem for v in (p["act_mem_mib"], p["pred_mem_mib"],
                                           p["pred_mem_p90_mib"]) if v]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    log = lo > 0 and hi / lo > 30
    lim = (lo / 1.3, hi * 1.3) if log else (0, hi * 1.05)
    am.plot(lim, lim, color="0.6", lw=1, ls="--")
    for i, s in enumerate(srcs):
        pts = _mem(points, s)
        if not pts:
            continue
        act = [p["act_mem_mib"] / div for p in pts]
        am.scatter([p["pred_mem_mib"] / div for p in pts], act, s=size, alpha=alpha,
                   color=color(s, i))
        p90 = [(p["pred_mem_p90_mib"] / div, a) for p, a in zip(pts, act) if p["pred_mem_p90_mib"]]
        if p90:
            am.scatter(*zip(*p90), s=size * 1.6, marker="^", facecolors="none",
                       edgecolors=color(s, i), alpha=alpha)
    am.set(xlim=lim, ylim=lim, xlabel=f"predicted peak memory ({unit})",
           ylabel=f"measured peak memory ({unit})", title=f"peak GPU memory, {len(mem)} jobs")
    if log:
        am.set(xscale="log", yscale="log")
        for axis in (am.xaxis, am.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        am.set_xlabel(f"predicted peak memory ({unit}, log scale)")
        am.set_ylabel(f"measured peak memory ({unit}, log scale)")
    handles = [Line2D([], [], ls="", marker="o", color="0.3", label="p50 prediction"),
               Line2D([], [], ls="--", color="0.6", label="predicted = measured")]
    if any(p["pred_mem_p90_mib"] for p in mem):
        handles.insert(1, Line2D([], [], ls="", marker="^", mfc="none", color="0.3",
                                 label="p90 prediction (bound)"))
    am.legend(handles=handles, loc="lower right", fontsize=9)
    am.text(0.02, 0.97, "above the line: more memory than predicted", transform=am.transAxes,
            va="top", fontsize=8, color="0.35")
    if not mem:
        am.text(0.5, 0.5, "no job with both predicted and measured memory",
                transform=am.transAxes, ha="center", color="0.35")

    def over_time(ax, rows, err, ylabel, what, clip=None):
        ax.axhline(0, color="0.6", lw=1, ls="--")
        for i, s in enumerate(srcs):
            pts = [p for p in rows if p["source"] == s and p["submit_time"] is not None]
            if pts:
                ys = [err(p) for p in pts]
                ax.scatter([_dt(p["submit_time"]) for p in pts],
                           [min(y, clip) if clip else y for y in ys], s=size, alpha=alpha,
                           color=color(s, i), label=s)
        loc = AutoDateLocator()
        ax.xaxis.set_major_locator(loc)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(loc))
        ax.set(xlabel="submit time (UTC)", ylabel=ylabel, title=what)
        if rows:
            ax.legend(title="predictor", fontsize=9, loc="upper right")
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="0.35")

    util = _util(points)
    over_time(eu, util, lambda p: p["pred_util_pct"] - p["act_util_pct"],
              "predicted − measured utilization (pp)",
              "utilization error over time (below 0: busier than predicted)")
    above = sum(_mem_err(p) > MEM_CLIP_PCT for p in mem)
    over_time(em, mem, _mem_err, "predicted − measured memory (% of measured)",
              "memory error over time (below 0: more than predicted)"
              + (f"\n{above} jobs above +{MEM_CLIP_PCT:.0f} % drawn at the top" if above else ""),
              clip=MEM_CLIP_PCT)
    fig.tight_layout()
    return fig


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


# --------------------------------------------------------------------------- terminal

def terminal(points: list[dict], where: str, bins: int = 10) -> Text:
    """Both scatters side by side (glyph per predictor source, '.' the y = x line), the p90
    coverage, then the mean error per period of submit time; fits 80 columns."""
    _check(points)
    srcs = _sources(points)
    n = len(points)
    out = Text(f"predicted (x) vs measured (y), {n} measured job{'s' * (n != 1)}\n{where}\n\n",
               style="bold")
    u = Canvas(30, 12, (0, 100), (0, 100))
    u.diagonal()
    mem = _mem(points)
    unit, div = _mem_unit(mem)
    vals = [v / div for p in mem for v in (p["act_mem_mib"], p["pred_mem_mib"])]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    log = lo > 0 and hi / lo > 30
    m = Canvas(30, 12, (lo / 1.2, hi * 1.2) if log else (0, hi * 1.05),
               (lo / 1.2, hi * 1.2) if log else (0, hi * 1.05), log=log)
    m.diagonal()
    for s in srcs:
        g, st = GLYPHS.get(s, "o"), TERM_STYLES.get(s, "magenta")
        u.series(s, g, st, [(p["pred_util_pct"], p["act_util_pct"]) for p in _util(points, s)])
        m.series(s, g, st, [(p["pred_mem_mib"] / div, p["act_mem_mib"] / div)
                            for p in _mem(points, s)])
    out.append_text(side_by_side([
        u.render(f"GPU util %, {len(_util(points))} jobs", "predicted %"),
        m.render(f"peak memory {unit}{' (log)' if log else ''}, {len(mem)} jobs",
                 f"predicted p50 {unit}")]))
    out.append_text(legend(srcs, glyph_of=lambda s: GLYPHS.get(s, "o")))
    out.append("   . predicted = measured\n")
    p90 = [p for p in mem if p["pred_mem_p90_mib"]]
    if p90:
        inside = sum(p["act_mem_mib"] <= p["pred_mem_p90_mib"] for p in p90)
        out.append(f"  p90 memory bound held for {inside} of {len(p90)} jobs "
                   f"({100 * inside / len(p90):.0f} %)\n")
    out.append_text(_error_table(points, bins))
    return out


def _error_table(points: list[dict], bins: int) -> Text:
    """Mean |utilization error| (bars) and median |memory error| per period of submit time."""
    timed = [p for p in points if p["submit_time"] is not None]
    if not timed:
        return Text()
    t0, t1 = timed[0]["submit_time"], timed[-1]["submit_time"]
    nb = max(1, min(bins, len(timed)))
    span = max(t1 - t0, 1)
    groups: list[list[dict]] = [[] for _ in range(nb)]
    for p in timed:
        groups[min(int((p["submit_time"] - t0) / span * nb), nb - 1)].append(p)
    fmt = "%Y-%m-%d %H:%M" if span < 30 * 86400 else "%Y-%m-%d"
    rows = []
    for k, g in enumerate(groups):
        if not g:
            continue
        ue = [abs(p["pred_util_pct"] - p["act_util_pct"]) for p in _util(g)]
        me = [abs(_mem_err(p)) for p in _mem(g)]
        when = time.strftime(fmt, time.gmtime(t0 + span * k / nb))
        # a period with no utilization (or memory) measured has no error to show: '-', as for
        # memory, never 0.0 (it read as a perfect prediction); an even count's median is the
        # mean of the middle two, as the summary's
        mean_u = sum(ue) / len(ue) if ue else 0.0
        util_s = f"{mean_u:5.1f} pp" if ue else "    -   "
        mem_s = f"{statistics.median(me):5.1f} %" if me else "     - "
        rows.append((when, mean_u, f"{util_s} {mem_s} {len(g):>6}"))
    out = Text("\n  by submit time (UTC): mean |util error| (bars), median |mem error|, jobs\n",
               style="bold")
    out.append_text(bars(rows, width=26, style_of=lambda _: "dodger_blue1"))
    if not any(v > 0 for _, v, _ in rows):
        out.append("  (no utilization error to draw)\n")
    return out
