"""hacct review 8: the numbers --plot and --summary print are the ones they name."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from rich.console import Console

from slurm_horus.cli.hacct import main
from slurm_horus.ledger import Ledger
from slurm_horus.ledger import plots

T0 = 1714521600  # 2024-05-01 00:00 UTC
DAY = 86400


@pytest.fixture
def url(tmp_path):
    """Jobs 1 and 2 measured in full (memory errors 4.4 % and 17.3 %), job 3 memory alone."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    for jid, pu, pm, au, am in ((1, 40.0, 5000.0, 45.0, 5230.0), (2, 65.0, 30000.0, 70.0, 36260.0),
                                (3, 20.0, 8000.0, None, 7000.0)):
        L.record_submission(job_id=jid, cluster="c", user="alice", submit_time=T0 + jid * DAY,
                            predictions={"a100": {"util_pct": pu, "mem_mib": pm,
                                                  "predictor": "cold-start"}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=au, mem_peak_mib=am,
                       state="COMPLETED")
    return u


def _text(renderable) -> str:
    c = Console(width=80, record=True, file=open("/dev/null", "w"))
    c.print(renderable)
    return c.export_text()


def test_a_period_without_utilization_measured_shows_no_utilization_error(url):
    """--plot's table by submit time printed '0.0 pp' (a perfect prediction) for a period whose
    jobs had no utilization measured: '-', as for memory."""
    r = CliRunner().invoke(main, ["--ledger", url, "--plot", "-a"])
    assert r.exit_code == 0, r.output
    last = r.output.rstrip("\n").splitlines()[-1]  # job 3's period: memory alone
    assert last.split()[2:] == ["-", "14.3", "%", "1"], last
    assert "0.0 pp" not in r.output


def test_the_plots_median_memory_error_of_an_even_count_is_the_summarys(url):
    """Of two jobs (4.4 % and 17.3 %) the table by submit time said 17.3 %, the upper one; the
    median is their mean, 10.8 %, as --summary says."""
    points = [p for p in plots.plot_points(Ledger(url, readonly=True)) if p["act_util_pct"] is not None]
    text = _text(plots.terminal(points, "ledger l.db", bins=1))
    row = next(line for line in text.splitlines() if "pp" in line and "%" in line and "|" not in line)
    assert "10.8 %" in row and "17.3 %" not in row, row
    r = CliRunner().invoke(main, ["--ledger", url, "--summary", "-a", "-j", "1,2"])
    assert "10.8%" in r.output.splitlines()[1], r.output


def test_the_summarys_headings_stand_over_their_figures(url):
    """'UtilRMSLE' is nine characters in a column of eight: it and every heading after it stood
    one to the right of its figures."""
    r = CliRunner().invoke(main, ["--ledger", url, "--summary", "-a"])
    assert r.exit_code == 0, r.output
    head, line = r.output.splitlines()[:2]
    assert line.startswith("all ")

    def right_edges(text):
        ends, i = [], 0
        for word in text.split():
            i = text.index(word, i) + len(word)
            ends.append(i)
        return ends
    assert right_edges(head) == right_edges(line)[1:], (head, line)


def test_a_plot_of_more_jobs_than_it_draws_says_it_shows_the_latest(url, monkeypatch):
    """--plot draws the latest PLOT_LIMIT measured jobs; beyond that its title still said 'N
    measured jobs' and its p90 coverage read as every matching job's: it says they are the
    latest."""
    monkeypatch.setattr(plots, "PLOT_LIMIT", 2, raising=False)
    r = CliRunner().invoke(main, ["--ledger", url, "--plot", "-a"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "2 measured jobs" in text and "the latest 2 by submit time" in text, r.output
    monkeypatch.setattr(plots, "PLOT_LIMIT", 3, raising=False)
    r = CliRunner().invoke(main, ["--ledger", url, "--plot", "-a"])
    assert "3 measured jobs" in r.output and "the latest 3" in " ".join(r.output.split())
    monkeypatch.setattr(plots, "PLOT_LIMIT", 4, raising=False)
    r = CliRunner().invoke(main, ["--ledger", url, "--plot", "-a"])
    assert "3 measured jobs" in r.output and "latest" not in r.output


def test_a_family_or_predictor_a_user_wrote_cannot_drive_the_readers_terminal(tmp_path):
    """The list printed them inert, but --summary's groups and --plot's legend wrote a model
    family and a predictor (from the user's hint) with their escapes: a hint could clear or
    retitle the reader's terminal."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    L.record_submission(job_id=1, cluster="c", user="u", model_family="\x1b]0;pwn\x07x",
                        submit_time=T0, predictions={"a100": {"util_pct": 10, "mem_mib": 100,
                                                              "predictor": "\x1b[2Jevil"}})
    L.record_usage(job_id=1, cluster="c", source="sacct", util_mean=10, mem_peak_mib=100,
                   gpu_type="a100")
    for mode in ("--summary", "--plot"):
        r = CliRunner().invoke(main, ["--ledger", u, mode, "-a"])
        assert r.exit_code == 0, r.output
        assert "\x1b" not in r.output and "\x07" not in r.output, (mode, r.output)
        assert "?[2Jevil" in r.output, r.output
    assert "?]0;pwn?x" in CliRunner().invoke(main, ["--ledger", u, "--summary", "-a"]).output


def test_a_field_name_is_taken_as_sacct_takes_it(url):
    """sacct takes any prefix of a field name (the first in its alphabetical table) and ALL
    (a, al) for every field; hacct had refused 'elap' as an unknown field."""
    from slurm_horus.ledger.report import COLUMNS, parse_format

    assert parse_format("jobid,elap,Pred,ActU%7") == [("jobid", None), ("elapsed", None),
                                                      ("predictor", None), ("actutil", 7)]
    assert parse_format("job,sub") == [("jobid", None), ("submit", None)]
    assert parse_format("ALL%9") == [(k, 9) for k in COLUMNS] == parse_format("a%9")
    r = CliRunner().invoke(main, ["--ledger", url, "-S", "2000-01-01", "-P", "-o", "jobid,stat,memerr"])
    assert r.exit_code == 0 and r.output.splitlines()[0] == "JobID|State|MemErr", r.output
    for name, said in (("Part", "field 'Part': the ledger does not record it"),
                       ("Bogus", "unknown field 'Bogus'")):
        r = CliRunner().invoke(main, ["--ledger", url, "-o", f"JobID,{name}"])
        assert r.exit_code == 2 and said in r.output and len(r.output.strip().splitlines()) == 1, r.output
