"""hacct --plot and horus-admin simulate --plot: what the figures say (titles, axes, units,
legends, the points drawn), the terminal renderings, and the message without matplotlib."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner
from rich.console import Console

from slurm_horus.cli.hacct import main as hacct
from slurm_horus.ledger import Ledger
from slurm_horus.ledger import plots as lplots
from slurm_horus.sim import plot as splot

T0 = 1714521600  # 2024-05-01 00:00 UTC


@pytest.fixture
def url(tmp_path):
    """One job per predictor source; job 3 has memory but no utilization measured; job 4 has
    a failed measurement (never used its GPU) and must count nowhere; job 5 is unmeasured."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    rows = [  # job, predictor, pred util, mem, p90, act util, mem
        (1, "cold-start", 40.0, 5000.0, 6000.0, 45.0, 5230.0),
        (2, "learned:v0003", 65.0, 30000.0, 40000.0, 70.0, 36260.0),
        (3, "history:family", 20.0, 8000.0, None, None, 7000.0),
        (4, "cold-start", 30.0, 3000.0, None, 0.0, 100.0),
        (5, "cold-start", 50.0, 9000.0, None, None, None),
    ]
    for jid, pred, pu, pm, p90, au, am in rows:
        p = {"util_pct": pu, "mem_mib": pm, "predictor": pred}
        if p90:
            p["mem_mib_p90"] = p90
        L.record_submission(job_id=jid, cluster="c", user="alice", submit_time=T0 + jid * 86400,
                            predictions={"a100": p})
        if am is not None:
            L.record_usage(job_id=jid, cluster="c", source="probe", util_mean=au,
                           mem_peak_mib=am, state="COMPLETED")
    return u


def _console_text(renderable, width=80) -> str:
    c = Console(width=width, record=True, file=open("/dev/null", "w"))
    c.print(renderable)
    return c.export_text()


def _no_matplotlib(monkeypatch):
    """An environment without matplotlib: importing it raises ImportError."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


# --------------------------------------------------------------------------- hacct

def test_points_skip_failed_and_unmeasured(url):
    pts = lplots.plot_points(Ledger(url))
    assert [(p["source"], p["act_util_pct"], p["act_mem_mib"]) for p in pts] == [
        ("cold-start", 45.0, 5230.0), ("learned", 70.0, 36260.0), ("history", None, 7000.0)]


def test_hacct_figure_says_what_it_shows(url):
    pytest.importorskip("matplotlib")
    pts = lplots.plot_points(Ledger(url))
    fig = lplots.figure(pts, lplots.describe(url, {"users": ["alice"], "start": T0}))
    title = fig._suptitle.get_text()
    assert "3 measured jobs" in title and "l.db" in title and "user alice" in title
    assert "since 2024-0" in title
    au, am, eu, em = fig.axes
    assert au.get_title() == "GPU utilization, 2 jobs"
    assert (au.get_xlabel(), au.get_ylabel()) == ("predicted GPU utilization (%)",
                                                  "measured GPU utilization (%)")
    assert [t.get_text() for t in au.get_legend().get_texts()] == [
        "predicted = measured", "cold-start (1)", "learned (1)"]
    # memory: in GiB (the largest value is above 4 GiB), p50 points of all three jobs (the
    # history job has memory but no utilization) and p90 triangles of the two that have one
    assert am.get_title() == "peak GPU memory, 3 jobs"
    assert am.get_xlabel().startswith("predicted peak memory (GiB")
    drawn = sorted(tuple(xy) for c in am.collections for xy in c.get_offsets())
    want = sorted([(5000 / 1024, 5230 / 1024), (30000 / 1024, 36260 / 1024),
                   (8000 / 1024, 7000 / 1024), (6000 / 1024, 5230 / 1024),
                   (40000 / 1024, 36260 / 1024)])
    # flat: pytest >= 9.1's approx refuses nested sequences
    assert [v for xy in drawn for v in xy] == pytest.approx([v for xy in want for v in xy])
    assert "p90 prediction (bound)" in [t.get_text() for t in am.get_legend().get_texts()]
    assert eu.get_ylabel() == "predicted − measured utilization (pp)"
    assert em.get_ylabel() == "predicted − measured memory (% of measured)"
    assert eu.get_xlabel() == em.get_xlabel() == "submit time (UTC)"
    errs = sorted(xy[1] for c in em.collections for xy in c.get_offsets())
    assert errs == pytest.approx(sorted([100 * (5000 - 5230) / 5230, 100 * (30000 - 36260) / 36260,
                                         100 * (8000 - 7000) / 7000]))
    assert [t.get_text() for t in em.get_legend().get_texts()] == [
        "cold-start", "learned", "history"]


def test_hacct_memory_panel_with_memory_only(tmp_path):
    pytest.importorskip("matplotlib")
    u = f"sqlite:///{tmp_path}/m.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    for jid in (1, 2):
        L.record_submission(job_id=jid, cluster="c", submit_time=T0 + jid,
                            predictions={"t4": {"util_pct": 30, "mem_mib": 1000.0 * jid,
                                                "predictor": "cold-start"}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", mem_peak_mib=1100.0 * jid)
    fig = lplots.figure(lplots.plot_points(L), "ledger m.db")
    am = fig.axes[1]
    assert am.get_xlabel() == "predicted peak memory (MiB)"
    assert [tuple(xy) for xy in am.collections[0].get_offsets()] == [(1000, 1100), (2000, 2200)]
    assert fig.axes[0].get_title() == "GPU utilization, 0 jobs"


def test_hacct_png_and_terminal(url, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    png = tmp_path / "acc.png"
    r = CliRunner().invoke(hacct, ["--ledger", url, "--plot", str(png)])
    assert r.exit_code == 0, r.output
    assert r.output == f"wrote {png}\n"
    img = imread(png)
    assert img.shape[0] > 500 and img.shape[1] > 800 and img[..., :3].min() < 0.2  # has ink
    for args in (["--plot"], ["--plot", "-"]):
        r = CliRunner().invoke(hacct, ["--ledger", url, *args])
        assert r.exit_code == 0, r.output
        assert "3 measured jobs" in r.output and "GPU util %, 2 jobs" in r.output
        assert "peak memory GiB, 3 jobs" in r.output
        assert "c cold-start" in r.output and "L learned" in r.output and "h history" in r.output
        assert "p90 memory bound held for 2 of 2 jobs" in r.output
        assert max(len(line) for line in r.output.splitlines()) <= 80


def test_hacct_plot_names_looked_up_jobs_as_jobs(url, monkeypatch):
    """-j N+K (a heterogeneous job's component) and -j N of a heterogeneous job select jobs by
    the own ids Slurm's accounting gives, as -j N_T (an array task) does: --plot called them
    all 'array tasks'. Job 2 stands for het job 1's component 1 here."""
    from slurm_horus.slurm import commands as slurm

    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: "ClusterName = c\nPrivateData = none\n")
    monkeypatch.setattr(slurm, "het_component_job_ids", lambda pairs, cluster=None: {(1, 1): 2})
    monkeypatch.setattr(slurm, "het_job_component_ids", lambda ids, cluster=None: {1: [1, 2]} if 1 in ids else {})
    for jobs, said, n in (("1+1", "jobs 2 GPU", "1 measured job"), ("1", "jobs 1,2 GPU", "2 measured jobs")):
        r = CliRunner().invoke(hacct, ["--ledger", url, "--plot", "-j", jobs])
        text = " ".join(r.output.split())
        assert r.exit_code == 0 and said in text and n in text and "array tasks" not in text, r.output
    assert lplots.describe(url, {"job_ids": [7], "task_ids": [7, 9]}).endswith(", jobs 7,9")


def test_hacct_terminal_places_points(url):
    text = _console_text(lplots.terminal(lplots.plot_points(Ledger(url)), "ledger l.db"))
    grid = [line for line in text.splitlines() if "|" in line]
    # the utilization panel is the left one: 'c' (40 -> 45) sits left of and below 'L' (65 -> 70)
    left = [line.split("|")[1][:31] for line in grid]
    (rc, cc), = [(r, line.index("c")) for r, line in enumerate(left) if "c" in line]
    (rl, cl), = [(r, line.index("L")) for r, line in enumerate(left) if "L" in line]
    assert cc < cl and rc > rl
    assert "by submit time (UTC)" in text


def test_hacct_nothing_to_plot(tmp_path):
    u = f"sqlite:///{tmp_path}/e.db"
    Ledger(u, spool=str(tmp_path / "sp"))
    r = CliRunner().invoke(hacct, ["--ledger", u, "--plot"])
    assert r.exit_code != 0 and r.output.startswith("hacct: error: no measured job")
    assert len(r.output.strip().splitlines()) == 1


def test_hacct_plot_path_is_checked_before_the_ledger(tmp_path):
    pytest.importorskip("matplotlib")
    none = f"sqlite:///{tmp_path}/none.db"  # no ledger there: the path is what it says first
    r = CliRunner().invoke(hacct, ["--ledger", none, "--plot", str(tmp_path / "acc.docx")])
    assert r.exit_code != 0 and ".docx is no image format matplotlib writes" in r.output, r.output
    r = CliRunner().invoke(hacct, ["--ledger", none, "--plot", str(tmp_path / "no" / "acc.png")])
    assert r.exit_code != 0 and "no folder" in r.output, r.output


def test_hacct_without_matplotlib(url, tmp_path, monkeypatch):
    _no_matplotlib(monkeypatch)
    png = tmp_path / "acc.png"
    r = CliRunner().invoke(hacct, ["--ledger", url, "--plot", str(png)])
    assert r.exit_code != 0 and not png.exists()
    assert r.output.strip().splitlines() == [
        "hacct: error: --plot FILE.png needs matplotlib: pip install matplotlib (the [plot] extra); "
        "or --plot - to draw in the terminal"]
    r = CliRunner().invoke(hacct, ["--ledger", url, "--plot", "-"])  # the terminal needs none
    assert r.exit_code == 0 and "GPU util %" in r.output


# --------------------------------------------------------------------------- simulate

RESULTS = {p: {"makespan_s": 36000.0 * k, "mean_jct_s": 7200.0 * k, "p95_jct_s": 14400.0 * k,
               "mean_wait_s": 600.0 * k, "sm_busy": 0.1 * k, "gpus_alloc": 0.2 * k,
               "oom_failures": k - 1}
           for k, p in enumerate(("exclusive", "naive", "horus", "oracle"), 1)}


def test_sim_figure_panels_units_legend():
    pytest.importorskip("matplotlib")
    fig = splot.figure(RESULTS, "400 jobs on 16 a100")
    assert fig._suptitle.get_text() == "400 jobs on 16 a100"
    axes = fig.axes
    got = {ax.get_ylabel(): [round(b.get_height(), 3) for b in ax.patches] for ax in axes[:7]}
    assert got == {"makespan (h)": [10, 20, 30, 40], "mean job completion time (h)": [2, 4, 6, 8],
                   "p95 job completion time (h)": [4, 8, 12, 16],
                   "mean queue wait (min)": [10, 20, 30, 40], "busy SMs (%)": [10, 20, 30, 40],
                   "GPUs allocated (%)": [20, 40, 60, 80], "OOM failures (jobs)": [0, 1, 2, 3]}
    assert axes[1].get_title() == "mean job completion time\n(lower is better)"
    assert axes[4].get_title() == "busy SMs, arrival window\n(higher is better)"
    for ax in axes[:7]:
        assert [t.get_text() for t in ax.get_xticklabels()] == list(RESULTS)
    assert [t.get_text() for t in axes[7].get_legend().get_texts()] == list(RESULTS)
    assert axes[7].get_legend().get_title().get_text() == "policy"


def test_sim_terminal_fits_and_orders():
    text = _console_text(splot.terminal(RESULTS, "400 jobs on 16 a100"))
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    k = lines.index("mean job completion time (h), lower is better")
    rows = lines[k + 1:k + 5]
    assert [r.split()[0] for r in rows] == list(RESULTS)
    assert [r.count("█") for r in rows] == sorted(r.count("█") for r in rows)  # 2 < 4 < 6 < 8
    assert rows[-1].rstrip().endswith("8.00")
    assert "busy SMs, arrival window (%), higher is better" in lines


SWEEP = {(mix, load): [{p: {"mean_jct_s": 3600.0 * load * (i + 1) * s} for i, p in
                        enumerate(("exclusive", "horus"))} for s in (1, 2)]
         for mix in ("philly", "llm") for load in (0.5, 1, 2)}


def test_sweep_figure_and_terminal():
    pytest.importorskip("matplotlib")
    fig = splot.sweep_figure(SWEEP, "sweep")
    assert [ax.get_title() for ax in fig.axes] == ["philly mix", "llm mix"]
    assert fig.axes[0].get_ylabel() == "mean job completion time (h, log scale)"
    assert fig.axes[0].get_xlabel() == "offered load"
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[1].get_lines()}
    assert lines == {"exclusive": pytest.approx([0.75, 1.5, 3.0]),  # mean of the two seeds
                     "horus": pytest.approx([1.5, 3.0, 6.0])}
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["exclusive", "horus"]
    text = _console_text(splot.sweep_terminal(SWEEP, "sweep"))
    assert "philly mix" in text and "llm mix" in text
    assert [ln.split() for ln in text.splitlines() if ln.startswith("exclusive")][0] == \
        ["exclusive", "0.75*", "1.50*", "3.00*"]


def test_simulate_plot_terminal_and_errors(simulate_cli, tmp_path, monkeypatch):
    args = ["simulate", "--jobs", "40", "--gpus", "8", "--seed", "1"]
    r = CliRunner().invoke(simulate_cli, [*args, "--plot"])
    assert r.exit_code == 0, r.output
    assert "mean job completion time" in r.output and "OOM failures (jobs)" in r.output
    r = CliRunner().invoke(simulate_cli, [*args, "--plot", "-", "--json"])
    assert r.exit_code != 0 and "with --json name a FILE.png" in r.output
    _no_matplotlib(monkeypatch)
    r = CliRunner().invoke(simulate_cli, [*args, "--plot", str(tmp_path / "s.png")])
    assert r.exit_code != 0 and "pip install matplotlib (the [plot] extra)" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "s.png").exists()
