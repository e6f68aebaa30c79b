"""hacct and horus-admin against odd input and sacct's conventions (a review's findings, kept as
cases): hacct's default window, -p/-X/-V, unknown states, local times, plot paths; sync's
--policy, --from-file and bad accounting records; simulate --ledger read-only and multi-GPU;
NaN options; doctor on folders others may write and on Include files that multiply."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurm_horus.cli.admin import main as admin
from slurm_horus.cli.hacct import main as hacct
from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger
from slurm_horus.slurm.accounting import parse_sacct_json

FIX = Path(__file__).resolve().parent / "fixtures" / "slurm-25.11"
SACCT = FIX / "sacct_json_finished_gpu.stdout"
ZOO = Path(__file__).resolve().parent / "data" / "zoo"


@pytest.fixture
def ledger(tmp_path):
    """Job 1 submitted three days ago, job 2 an hour ago."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    now = int(time.time())
    for jid, submit in ((1, now - 3 * 86400), (2, now - 3600)):
        L.record_submission(job_id=jid, cluster="c", user="ann", account="ml", submit_time=submit,
                            predictions={"a100": {"util_pct": 30, "mem_mib": 3000}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=40, mem_peak_mib=3500,
                       state="COMPLETED", elapsed_s=600, gpus=1, start_time=submit + 10,
                       end_time=submit + 610)
    return u


# doctor judges files by whether they are root's
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="doctor's checks want root's files")


def ids(out: str) -> list[int]:
    return [int(x.strip("|")) for x in out.split()]


def test_hacct_lists_todays_jobs_unless_told_otherwise(ledger):
    """As sacct: no -j and no -S means since midnight; -j or -S widen it; the summary is all."""
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", "-n", "-o", "JobID"])
    midnight = time.mktime(time.strptime(time.strftime("%Y-%m-%d"), "%Y-%m-%d"))
    # job 2 ended 3600 - 610 s ago: listed when that is after midnight (in the first hour of a
    # day too, where the end is)
    assert r.exit_code == 0 and ids(r.output) == ([2] if time.time() - 3600 + 610 >= midnight else [])
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", "-n", "-o", "JobID", "-j", "1"])
    assert ids(r.output) == [1]
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", "-n", "-o", "JobID", "-S", "now-7days"])
    assert ids(r.output) == [1, 2]
    s = json.loads(CliRunner().invoke(hacct, ["--ledger", ledger, "--summary", "--json"]).output)
    assert json.dumps(s).count('"n": 2') or s  # the summary covers both jobs
    assert CliRunner().invoke(hacct, ["--ledger", ledger, "--summary", "--json", "-j", "1"]).output != \
        CliRunner().invoke(hacct, ["--ledger", ledger, "--summary", "--json"]).output


def test_hacct_speaks_sacct(ledger):
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-p", "-X", "-j", "1", "-o", "JobID,User"])
    assert r.exit_code == 0 and r.output == "JobID|User|\n1|ann|\n"
    r = CliRunner().invoke(hacct, ["-V"])
    assert r.exit_code == 0 and r.output.startswith("hacct (slurm-horus) ")
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-s", "XX"])
    assert r.exit_code != 0 and "unknown state XX" in r.output
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-s", "cd,OOM", "-j", "1", "-P", "-n", "-o", "JobID"])
    assert ids(r.output) == [1]


def test_hacct_reads_and_prints_local_time(ledger, monkeypatch):
    """-S is local time, as in sacct, and so is the Submit column."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        r = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", "-n", "-o", "JobID,Submit", "-j", "2"])
        shown = r.output.strip().split("|")[1]
        r2 = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", "-n", "-o", "JobID", "-S", shown])
        assert ids(r2.output) == [2]
        assert time.mktime(time.strptime(shown, "%Y-%m-%dT%H:%M:%S")) == \
            Ledger(ledger).jobs(job_ids=[2])[0]["submit_time"]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_plot_paths_are_reported_as_written(ledger, tmp_path):
    pytest.importorskip("matplotlib")
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "--plot", str(tmp_path / "report")])
    assert r.exit_code == 0 and r.output.strip() == f"wrote {tmp_path / 'report.png'}"
    assert (tmp_path / "report.png").is_file()
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "--plot", str(tmp_path / "dot.")])
    assert r.exit_code == 0 and r.output.strip() == f"wrote {tmp_path / 'dot.png'}", r.output  # as matplotlib
    assert (tmp_path / "dot.png").is_file()
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "--plot", str(tmp_path)])
    assert r.exit_code != 0 and "name a FILE.png" in r.output
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()


def test_sync_refuses_what_it_would_get_wrong(tmp_path, monkeypatch):
    u = f"sqlite:///{tmp_path}/s.db"
    base = ["sync", "--ledger", u, "--from-file", str(SACCT)]
    r = CliRunner().invoke(admin, [*base, "--policy", str(tmp_path / "typo.conf")])
    assert r.exit_code == 2 and "does not exist" in r.output  # no claim record overwritten
    r = CliRunner().invoke(admin, [*base, "-S", "2025-01-01"])
    assert r.exit_code == 2 and "with --from-file the file is the window" in r.output
    r = CliRunner().invoke(admin, ["sync", "--ledger", u, "-S", "2025-02-01", "-E", "2025-01-01"])
    assert r.exit_code == 2 and "--since is after --until" in r.output
    from slurm_horus.cli import admin_ledger
    monkeypatch.setattr(admin_ledger, "MAX_SACCT_JSON", 1000)
    r = CliRunner().invoke(admin, ["sync", "--ledger", u, "--from-file", "/dev/zero"])
    assert r.exit_code != 0 and "larger than" in r.output
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = CliRunner().invoke(admin, ["sync", "--ledger", u, "--from-file", str(fifo)])
    assert r.exit_code != 0 and "not JSON" in r.output  # nobody writes to it: empty, no hang
    # a FIFO as the policy read as an empty one: the record went to the default path
    r = CliRunner().invoke(admin, [*base, "--policy", str(fifo)])
    assert r.exit_code == 2 and "not a regular file" in r.output


def test_odd_accounting_records_are_skipped_not_fatal():
    data = json.loads(SACCT.read_text())
    good = data["jobs"][0]
    bad = []
    for path, value in ((("job_id",), 2 ** 70), (("time", "elapsed"), 1e30), (("time", "elapsed"), -100),
                        (("job_id",), -5)):
        j = copy.deepcopy(good)
        d = j
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        bad.append(j)
    jobs = parse_sacct_json({"jobs": [5, "x", None, *bad, good]})
    assert [j["job_id"] for j in jobs] == [good["job_id"]]


def test_simulate_reads_a_ledger_read_only_and_replays_its_gpus(tmp_path):
    missing = tmp_path / "typo" / "ledger.db"
    r = CliRunner().invoke(admin, ["simulate", "--ledger", f"sqlite:///{missing}"])
    assert r.exit_code != 0 and "not found" in r.output and not missing.parent.exists()
    from slurm_horus.sim.replay import rows_from_ledger_jobs
    row = {"submit_time": 0, "elapsed_s": 3600, "pred_util_pct": 50, "pred_mem_mib": 1000,
           "act_util_pct": 60, "act_mem_mib": 1200}
    rows = rows_from_ledger_jobs([dict(row, gpus=8), dict(row, gpus=None, shards=30)])
    assert [r["gpus"] for r in rows] == [8, 1]


@pytest.mark.parametrize("args", [["queue", "--dry-run", "--interval", "nan"],
                                  ["queue", "--dry-run", "--min-wait", "inf"],
                                  ["calibrate", "--seconds", "nan"],
                                  ["retrain", "--seed", "-1"]])
def test_nan_and_out_of_range_options_are_usage_errors(args):
    r = CliRunner().invoke(admin, args)
    assert r.exit_code == 2 and ("finite" in r.output or "range" in r.output), r.output


@pytest.mark.parametrize("args,says", [
    (["simulate", "--jobs", "10000000"], "--jobs must be 1..2,000,000"),
    (["simulate", "--load", "1e-300"], "--load must be 0.001..1000"),
    (["simulate", "--bf-interval", "1e300"], "at most 30 days"),
    (["simulate", "--interference", "1:1,nan:0.5"], "not a pair of finite numbers"),
])
def test_simulate_refuses_what_it_cannot_simulate_in_one_line(args, says):
    # a hostile review: ten million jobs ran out of memory with a traceback, 1e-300 and 1e300
    # gave results of 1e305 s, and a NaN point an internal IndexError
    r = CliRunner().invoke(admin, args)
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_simulate_skips_sacct_records_too_large_and_refuses_nesting_too_deep(tmp_path):
    dump = json.loads(SACCT.read_text())
    odd = copy.deepcopy(dump["jobs"][0])
    odd["job_id"] = 999
    for t in odd.get("tres", {}).get("allocated", []):
        t["count"] = 1e400  # JSON's infinity: an int of it overflows
    (tmp_path / "big.json").write_text(json.dumps({**dump, "jobs": [odd, *dump["jobs"]]}))
    r = CliRunner().invoke(admin, ["simulate", "--sacct", str(tmp_path / "big.json"), "--policies", "exclusive"])
    assert r.exit_code == 0, r.output
    (tmp_path / "deep.json").write_text("[" * 100_000)
    r = CliRunner().invoke(admin, ["simulate", "--sacct", str(tmp_path / "deep.json")])
    assert r.exit_code == 2 and "not JSON" in r.output and "internal error" not in r.output, r.output


def test_import_reads_a_csv_with_a_byte_order_mark(tmp_path):
    # Excel's "CSV UTF-8" starts with one; the first column then did not match its name
    from slurm_horus.cli.admin_ledger import import_

    src = tmp_path / "m.csv"
    src.write_bytes(b"\xef\xbb\xbfgpu_type,util_pct,mem_mib,model,batch_size\n"
                    b"a100,40,3000," + str(Path(__file__).parent / "data" / "zoo" / "small_cnn.onnx").encode()
                    + b",8\n")
    r = CliRunner().invoke(import_, [str(src), "--ledger", f"sqlite:///{tmp_path}/l.db"])
    assert r.exit_code == 0 and "imported 1 rows" in r.output, r.output


def test_a_registry_state_with_odd_history_entries_is_refused_in_one_line(tmp_path):
    (tmp_path / "current.json").write_text(json.dumps({"serving": "v0001", "history": [5]}))
    r = CliRunner().invoke(admin, ["models", "rollback", "--model-dir", str(tmp_path)])
    assert r.exit_code != 0 and "not a registry state file" in r.output and "internal" not in r.output, r.output


def test_a_model_path_that_is_no_file_neither_imports_nor_hangs_the_history_export(tmp_path):
    """A row with features and model=/dev/zero (or a FIFO) was imported, and every later
    history export, so every retrain and sync, hashed it for ever."""
    from slurm_horus.cli.admin_ledger import import_
    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION
    from slurm_horus.ledger.history_export import export_history
    from slurm_horus.predict.registry import Registry

    feats = json.dumps({n: 1.0 for n in FEATURE_NAMES}).replace('"', '""')
    src = tmp_path / "m.csv"
    src.write_text("gpu_type,util_pct,mem_mib,batch_size,cold_util_pct,cold_mem_mib,model,features\n"
                   f'a100,40,3000,8,40,3000,/dev/zero,"{feats}"\n')
    r = CliRunner().invoke(import_, [str(src), "--ledger", f"sqlite:///{tmp_path}/l.db"])
    assert r.exit_code != 0 and "/dev/zero: not a regular file" in r.output, r.output
    # a row an older version let in: the export skips the file and finishes
    os.mkfifo(tmp_path / "fifo")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    for jid, path in ((1, "/dev/zero"), (2, str(tmp_path / "fifo"))):
        L.record_submission(job_id=jid, cluster="c", user="alice", model_path=path,
                            features={n: 1.0 for n in FEATURE_NAMES}, feature_version=FEATURE_VERSION,
                            workload={"batch_size": 8, "task": "train"},
                            predictions={"a100-40gb": {"util_pct": 40.0, "mem_mib": 3000.0}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=40.0, mem_peak_mib=3000.0,
                       gpu_index=0, state="COMPLETED", elapsed_s=600, node="n1", gpu_type="a100-40gb",
                       start_time=1700000000, end_time=1700000600)
    out = export_history(L, Registry(tmp_path / "models"))
    assert out["graphs"] == 0  # no graph known by its sha: nothing to answer for


@pytest.mark.parametrize("limit", ["NaN", "Infinity"])
def test_a_replayed_time_limit_that_is_no_number_is_none_given(tmp_path, limit):
    # json.loads takes NaN and Infinity: the first emptied a heap (IndexError), the second
    # divided by it (ZeroDivisionError), both an internal error
    dump = json.loads(SACCT.read_text())
    for j in dump["jobs"]:
        j.setdefault("time", {})["limit"] = "LIMIT"
    (tmp_path / "s.json").write_text(json.dumps(dump).replace('"LIMIT"', limit))
    r = CliRunner().invoke(admin, ["simulate", "--sacct", str(tmp_path / "s.json"), "--policies", "horus,naive"])
    assert r.exit_code == 0 and "internal" not in r.output, r.output


def test_a_cluster_the_simulator_cannot_hold_is_refused_in_one_line(tmp_path):
    # a slurm.conf line of 10^11 GPUs filled 22 GB before the OOM killer came; a node defined
    # twice was counted twice
    for text, says in (("NodeName=g1 Gres=gpu:a100:99999999999\n", "more than 1,000,000 GPUs"),
                       ("NodeName=g[01-02] Gres=gpu:a100:4\nNodeName=g01 Gres=gpu:a100:4\n", "g01 defined twice"),
                       ("NodeName=big Gres=gpu:a100:500000\nNodeName=s[1-99999] Gres=gpu:a100:1\n",
                        "very different sizes")):
        (tmp_path / "slurm.conf").write_text(text)
        r = CliRunner().invoke(admin, ["simulate", "--slurm-conf", str(tmp_path / "slurm.conf"), "--jobs", "20"])
        assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_sync_ending_in_the_future_leaves_the_next_window_starting_now_at_the_latest(tmp_path, monkeypatch):
    """sync -E now+30days saved its end as the last sync: every later default window started
    after it ended, and sacct refused them all for a month."""
    import time as _time

    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger import sync as sync_mod
    from slurm_horus.slurm import commands as slurm

    windows = []
    monkeypatch.setattr(slurm, "accounting_jobs", lambda since, until: windows.append((since, until)) or [])
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: "c")
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    sync_mod.sync(L, since=_time.time() - 3600, until=_time.time() + 30 * 86400)
    sync_mod.sync(L)
    since, until = windows[-1]
    assert since < until and sync_mod.last_sync(L, "c") <= _time.time()


def test_sync_keeps_each_clusters_progress_never_goes_back_and_asks_an_hour_at_a_time(tmp_path, monkeypatch):
    """One ledger, several clusters: each one's sync kept the ledger's one last_sync and open
    jobs, so a second cluster's sync moved the first's window past jobs it never asked for and
    dropped its running jobs; a backfill (-S/-E of last year) set the next window to a year;
    a long window was asked in one piece (all of it in memory, failing for good), then a day at
    a time (a busy day's 287 MB of JSON took 1 GB); the windows each asked sacct for the
    carried jobs and replayed the spool."""
    import time as _time

    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger import sync as sync_mod
    from slurm_horus.slurm import commands as slurm

    now = _time.time()
    windows, here = [], ["alpha"]

    def running(i):
        return {"cluster": here[0], "job_id": i, "state": "RUNNING", "shards": 10, "gpus": None, "comment": ""}

    def accounting(since, until):
        windows.append((here[0], since, until))
        return [running(700)] if until >= now - 60 else []
    by_id = []
    monkeypatch.setattr(slurm, "accounting_jobs", accounting)
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: by_id.append(ids) or [running(i) for i in ids])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: here[0])
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    sync_mod.sync(L, since=now - 3600)
    alpha = sync_mod.last_sync(L, "alpha")
    here[0] = "beta"
    sync_mod.sync(L, since=now - 60)
    assert sync_mod.last_sync(L, "alpha") == alpha and sync_mod._open_jobs(L, "alpha") | sync_mod._open_jobs(L, "beta") == {("alpha", 700), ("beta", 700)}
    here[0] = "alpha"
    by_id.clear()
    sync_mod.sync(L, since=now - 400 * 86400, until=now - 399 * 86400)  # a backfill
    assert sync_mod.last_sync(L, "alpha") == alpha and sync_mod._open_jobs(L, "alpha") | sync_mod._open_jobs(L, "beta") == {("alpha", 700), ("beta", 700)}
    assert by_id == [[700]]  # alpha's own open job, asked of alpha's sacct
    windows.clear()
    by_id.clear()
    replays, replay = [], L.spool.replay
    monkeypatch.setattr(L.spool, "replay", lambda ledger: replays.append(1) or replay(ledger))
    sync_mod.sync(L, since=now - 3 * 3600 - 5, until=now)
    assert [round(u - s) for _, s, u in windows] == [3600, 3600, 3600, 5]
    assert by_id == [[700]] and replays == [1]  # once a sync, not once a window
    assert sync_mod._open_jobs(L, "alpha") == {("alpha", 700)}
    assert windows[0][1] == now - 3 * 3600 - 5 and windows[-1][2] == now
    windows.clear()
    sync_mod.sync(L, since=_time.time() - 60, until=_time.time() + 365 * 86400)  # nothing ends ahead
    assert len(windows) == 1 and windows[0][2] <= _time.time()
    # 6,000 open jobs on each of two clusters: each keeps its own, within one TEXT column
    many = [running(1000000 + i) for i in range(6000)]
    monkeypatch.setattr(slurm, "accounting_jobs", lambda since, until: many)
    for here[0] in ("alpha", "beta"):
        sync_mod.sync(L, since=now - 60)
        assert len(L.get_state(f"open_jobs:{here[0]}")) < 65535
    assert len(sync_mod._open_jobs(L, "alpha")) == sync_mod.MAX_OPEN_JOBS
    # Slurm cannot name the cluster (slurmctld restarting): nothing synced, no state touched
    # (a legacy window from before the upgrade had been read, and the other clusters' lost)
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: None)
    state = {k: L.get_state(k) for k in ("last_sync:alpha", "open_jobs:alpha", "open_jobs:beta")}
    with pytest.raises(HorusError, match="does not name this cluster"):
        sync_mod.sync(L)
    assert state == {k: L.get_state(k) for k in state}


def test_a_window_a_sync_died_reading_is_read_in_halves_by_the_next(tmp_path, monkeypatch):
    """A sync killed reading a window (out of memory: --mem=1G) had saved no progress in it, and
    every later sync asked for the same window and died the same way."""
    import time as _time

    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger import sync as sync_mod
    from slurm_horus.slurm import commands as slurm

    class Killed(BaseException):
        pass
    now, windows, fits = int(_time.time()), [], [3600]

    def accounting(since, until):
        windows.append(round(until - since))
        if until - since > fits[0]:
            raise Killed
        return []
    monkeypatch.setattr(slurm, "accounting_jobs", accounting)
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: "alpha")
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    sync_mod.sync(L, since=now - 7200, until=now - 3600)
    windows.clear()
    fits[0] = 900
    for _ in range(2):
        with pytest.raises(Killed):
            sync_mod.sync(L, until=now)
    assert windows == [3600, 1800] and sync_mod.last_sync(L, "alpha") == now - 3600
    windows.clear()
    sync_mod.sync(L, until=now)
    assert windows == [900] * 4 + [300] and sync_mod.last_sync(L, "alpha") == now
    # Slurm not answering is no fault of the window's: the next sync reads as much
    windows.clear()

    def unanswered(since, until):
        windows.append(0)
        raise HorusError("sacct --json --allusers: Unable to contact slurm controller")
    monkeypatch.setattr(slurm, "accounting_jobs", unanswered)
    with pytest.raises(HorusError):
        sync_mod.sync(L, since=now - 3600, until=now)
    monkeypatch.setattr(slurm, "accounting_jobs", accounting)
    fits[0] = 3600
    sync_mod.sync(L, since=now - 3600, until=now)
    assert windows == [0, 3600]
    # sacct itself killed (the OOM killer) or timed out on the window: halved next, as above
    for answer in ("sacct --json --allusers: exit -9", "sacct --json --allusers timed out after 300 s"):
        windows.clear()

        def dies(since, until, answer=answer):
            windows.append(round(until - since))
            raise HorusError(answer)
        monkeypatch.setattr(slurm, "accounting_jobs", dies)
        with pytest.raises(HorusError):
            sync_mod.sync(L, since=now - 3600, until=now)
        monkeypatch.setattr(slurm, "accounting_jobs", accounting)
        sync_mod.sync(L, since=now - 3600, until=now)
        assert windows == [3600, 1800, 1800], answer


def test_sacct_is_asked_in_seconds_before_its_now(monkeypatch):
    """A local clock time is ambiguous in the hour the clocks go back: sacct read 02:30 as the
    later one, and a window around it ended before it began."""
    import time as _time

    from slurm_horus.slurm import commands as slurm

    asked = []
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: asked.append(args) or '{"jobs": []}')
    slurm.run_sacct(_time.time() - 600.5, _time.time() - 60)
    (args,) = asked
    start, end = args[args.index("-S") + 1], args[args.index("-E") + 1]
    assert start in ("now-601", "now-602") and end in ("now-60", "now-59"), args


def test_import_refuses_rows_it_would_get_wrong(tmp_path):
    from slurm_horus.cli.admin_ledger import import_

    u = f"sqlite:///{tmp_path}/l.db"
    extra = tmp_path / "extra.csv"
    extra.write_text(f"model,gpu_type,util_pct,mem_mib,batch_size\n{ZOO / 'small_cnn.onnx'},t4,50,3000,32,x,y\n")
    r = CliRunner().invoke(import_, [str(extra), "--ledger", u])
    assert r.exit_code == 2 and "extra.csv:2: 7 fields, the header has 5" in r.output, r.output
    # a text model's sequence taken as one token: hsubmit and sync refuse it, import taught it
    text = tmp_path / "text.csv"
    text.write_text(f"model,gpu_type,util_pct,mem_mib,batch_size\n{ZOO / 'bert_base.onnx'},t4,50,3000,8\n")
    r = CliRunner().invoke(import_, [str(text), "--ledger", u])
    assert r.exit_code == 2 and "not set by its batch size" in r.output, r.output
    # batch_size 0 had become 1 (workload_from's "not given"), a user name with a newline was kept
    for cells, says in ((("0", "alice"), "batch_size 0"), (("8", '"a\nb"'), "not a user name")):
        bad = tmp_path / "bad.csv"
        bad.write_text(f"model,gpu_type,util_pct,mem_mib,batch_size,user\n{ZOO / 'small_cnn.onnx'},t4,50,3000,"
                       + ",".join(cells) + "\n")
        r = CliRunner().invoke(import_, [str(bad), "--ledger", u])
        assert r.exit_code == 2 and "bad.csv:2: " in r.output and says in r.output, r.output


def test_a_file_the_command_may_not_write_is_one_line_not_an_internal_error(tmp_path):
    from slurm_horus.cli.common import one_line_errors

    @one_line_errors("prog")
    def write():
        open(tmp_path, "w")  # a folder where a file goes

    r = CliRunner().invoke(click.command()(write))
    assert r.exit_code == 1 and r.output.startswith("prog: error: Is a directory: ") and "internal" not in r.output
    r = CliRunner().invoke(click.command()(write), env={"HORUS_DEBUG": "1"})  # the traceback, as promised
    assert isinstance(r.exception, IsADirectoryError)


def test_a_job_that_ends_within_a_caught_up_sync_is_not_carried(tmp_path, monkeypatch):
    """A sync over several days kept a job running in an early window as open though a later
    window saw it end: the next sync asked sacct for it again and recorded it twice."""
    import time as _time

    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger import sync as sync_mod
    from slurm_horus.slurm import commands as slurm

    now = _time.time()

    def accounting(since, until):
        state = "RUNNING" if until < now - 86400 else "COMPLETED"
        return [{"cluster": "alpha", "job_id": 800, "state": state, "shards": 10, "gpus": None,
                 "comment": "", "submit_time": 1, "start_time": 2},
                {"cluster": "alpha", "job_id": 801, "state": "RUNNING", "shards": 10, "gpus": None,
                 "comment": "", "submit_time": 1, "start_time": 2}]
    monkeypatch.setattr(slurm, "accounting_jobs", accounting)
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: "alpha")
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    sync_mod.sync(L, since=now - 3 * 86400, until=now)
    assert sync_mod._open_jobs(L, "alpha") == {("alpha", 801)}


def test_the_queue_packs_by_the_policys_shards(tmp_path, monkeypatch):
    """--pack-shards was 1..99 "of 100 per GPU" whatever the policy said: with shards_per_gpu =
    200 a half-GPU pack (100) was refused, with 1000 the default packed onto 5 % of a GPU."""
    policy = tmp_path / "policy.conf"
    policy.write_text("shards_per_gpu = 200\npressure_shards = 100\n")
    monkeypatch.setenv("HORUS_POLICY", str(policy))
    r = CliRunner().invoke(admin, ["queue", "--dry-run", "--pack-shards", "200"])
    assert r.exit_code != 0 and "--pack-shards 200: must be 1..199" in r.output, r.output
    r = CliRunner().invoke(admin, ["queue", "--dry-run", "--pack-shards", "150"])
    assert "--pack-shards" not in r.output, r.output  # a quarter of a GPU here


def test_models_list_says_a_named_registry_folder_is_not_there(tmp_path, monkeypatch):
    """`models list --model-dir /typo` printed "no models" with exit 0, as for a new site."""
    monkeypatch.delenv("HORUS_MODEL_DIR", raising=False)
    r = CliRunner().invoke(admin, ["models", "list", "--model-dir", str(tmp_path / "typo")])
    assert r.exit_code != 0 and f"no registry folder {tmp_path / 'typo'}" in r.output, r.output
    r = CliRunner().invoke(admin, ["models", "list", "--model-dir", str(tmp_path)])
    assert r.exit_code == 0 and "no models" in r.output, r.output


def test_a_ledger_a_mistyped_url_makes_replaces_neither_record_nor_history(tmp_path, monkeypatch):
    """sync --ledger sqlite:////nonexist/x.db made a new ledger, then wrote its empty claim
    record over the site's (forgiving every under-claimer) and its history.json of 0 runs over
    one of 72; a relative sqlite:/// path made a ledger in whatever folder sync ran from."""
    record = tmp_path / "record"
    record.write_text("# record\nuser 1001 alice 4 9\n")
    policy = tmp_path / "policy.conf"
    policy.write_text(f"record_file = {record}\n")
    models = tmp_path / "models"
    models.mkdir()
    history = {"version": 1, "graphs": {"g": [{"gpu": "a100"}] * 3}, "offsets": {}}
    (models / "history.json").write_text(json.dumps(history))
    monkeypatch.setenv("HORUS_MODEL_DIR", str(models))
    new = f"sqlite:///{tmp_path}/typo/x.db"
    r = CliRunner().invoke(admin, ["sync", "--ledger", new, "--from-file", str(SACCT), "--policy", str(policy)])
    assert r.exit_code == 0, r.output
    assert "kept: it names under-claimers" in r.output and "remove the record" in r.output
    assert "user 1001 alice" in record.read_text()
    # and at every pass after (a scrontab line with the typo), until the admin says otherwise
    r = CliRunner().invoke(admin, ["sync", "--ledger", new, "--from-file", str(SACCT), "--policy", str(policy)])
    assert r.exit_code == 0 and "kept: it names under-claimers" in r.output, r.output
    from slurm_horus.ledger.history_export import export_history
    from slurm_horus.predict.registry import Registry
    typo = Ledger(f"sqlite:///{tmp_path}/typo2/y.db")
    for _ in range(2):
        with pytest.raises(HorusError, match="history.json kept: it holds 3 measured runs"):
            export_history(typo, Registry(models))
    assert json.loads((models / "history.json").read_text()) == history
    # the site's own new ledger: the record removed, it writes both from then on
    record.unlink()
    r = CliRunner().invoke(admin, ["sync", "--ledger", new, "--from-file", str(SACCT), "--policy", str(policy)])
    assert r.exit_code == 0 and "kept" not in r.output, r.output
    (models / "history.json").unlink()
    export_history(typo, Registry(models))
    assert json.loads((models / "history.json").read_text())["graphs"] == {}
    # a ledger from before this guard (no "made" mark) is the site's
    site = Ledger(f"sqlite:///{tmp_path}/site.db")
    assert site.unproven("published")
    import sqlite3
    con = sqlite3.connect(tmp_path / "site.db")
    con.execute("DELETE FROM ledger_state WHERE name = 'made'")
    con.commit()
    con.close()
    assert not site.unproven("published") and not site.unproven("history")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HorusError, match="a relative path; give the absolute one"):
        Ledger("sqlite:///var/lib/ledger.db")
    assert not (tmp_path / "var").exists()
    from slurm_horus.doctor import check_ledger
    assert "relative path" in check_ledger("sqlite:///var/lib/ledger.db")[0].what


@as_root
def test_doctor_finds_a_sticky_ledger_or_registry_folder_and_folders_others_may_rename(tmp_path):
    """A sticky world-writable folder (/tmp) lets anyone make a new name in it: a ledger's -wal
    journal SQLite replays on open, a registry's current.json or model file; and whoever may
    rename a folder above the ledger swaps it for their own.  doctor had passed all three."""
    from slurm_horus.doctor import check_ledger, check_registry

    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (p,) = check_ledger(f"sqlite:///{sticky}/ledger.db")
    assert p.what.startswith(f"the ledger folder {sticky} is writable by group or others"), p
    assert "folder only root can write" in p.fix and "chmod" not in p.fix
    (p,) = check_registry(sticky)
    assert p.what.startswith(f"the model registry {sticky} is writable"), p
    theirs = tmp_path / "theirs"
    (theirs / "horus").mkdir(parents=True)
    os.chmod(theirs, 0o777)
    (p,) = check_ledger(f"sqlite:///{theirs}/horus/ledger.db")
    assert p.what.startswith(f"a folder above the ledger {theirs} is writable"), p
    assert p.fix == f"chmod go-w {theirs}"
    os.chmod(theirs, 0o1777)  # above the folder the sticky bit does stop a rename
    assert check_ledger(f"sqlite:///{theirs}/horus/ledger.db") == []


def test_doctor_stops_on_include_files_that_include_each_other_many_times_over(tmp_path):
    """No loop, so within the nesting depth, but eight Include lines a level read 8**n files:
    five levels of 25 had doctor reading ten million of them for minutes."""
    from slurm_horus.doctor import read_slurm_conf

    (tmp_path / "L4.conf").write_text("PartitionName=p Nodes=n1\n")
    for level in range(4):
        (tmp_path / f"L{level}.conf").write_text(f"Include L{level + 1}.conf\n" * 8)
    (tmp_path / "slurm.conf").write_text("SlurmctldHost=ctl\nInclude L0.conf\n")
    t0 = time.monotonic()
    with pytest.raises(HorusError, match="Include: more than 1,000 files"):
        read_slurm_conf(tmp_path / "slurm.conf")
    assert time.monotonic() - t0 < 10
    (tmp_path / "L0.conf").write_text("Include L4.conf\n" * 3)  # a few: read as slurmctld does
    assert read_slurm_conf(tmp_path / "slurm.conf").settings["slurmctldhost"] == "ctl"


@as_root
def test_doctor_finds_site_settings_others_may_write(tmp_path):
    """Root's sync, probe and queue take the ledger from horus.conf's ledger_url: a file (or a
    folder) others may write lets them point root at a ledger of their own; doctor had said
    nothing."""
    from slurm_horus.doctor import check_site_settings

    conf = tmp_path / "etc" / "horus.conf"
    conf.parent.mkdir(mode=0o755)
    conf.write_text("ledger_url = sqlite:////var/lib/slurm-horus/ledger.db\n")
    os.chmod(conf, 0o644)
    assert check_site_settings({"HORUS_CONF": str(conf)}) == []
    os.chmod(conf, 0o666)
    (p,) = check_site_settings({"HORUS_CONF": str(conf)})
    assert p.what.startswith(f"the site settings {conf} is writable by group or others"), p
    os.chmod(conf, 0o644)
    os.chmod(conf.parent, 0o1777)  # a missing horus.conf anyone could make
    (p,) = check_site_settings({"HORUS_CONF": str(conf)})
    assert p.what.startswith(f"the folder of the site settings {conf.parent} is writable"), p


def test_the_queue_command_gives_sigterm_back_to_its_caller(monkeypatch):
    """horus-admin queue makes SIGTERM end its pass through its cleanups; run in-process it
    had left that handler behind, and a fork pool made later in the process hung at exit (its
    workers caught the pool's SIGTERM and went on waiting)."""
    import signal

    monkeypatch.setenv("PATH", "/nonexistent")  # no Slurm: the pass fails at once, in one line
    before = signal.getsignal(signal.SIGTERM)
    r = CliRunner().invoke(admin, ["queue", "--dry-run"])
    assert r.exit_code != 0 and "squeue not found" in r.output
    assert signal.getsignal(signal.SIGTERM) is before
