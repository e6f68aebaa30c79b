"""hacct: golden -P and --json outputs from a ledger with fixed rows; summary; plots; whole
GPUs vs shards; the claim audit; PrivateData."""

import json
import os
from pathlib import Path
import time

import pytest
from click.testing import CliRunner

from slurm_horus.cli.hacct import main
from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger

ALL = ("-S", "2000-01-01")  # every job of the fixtures: without -j or -S, hacct lists today's, as sacct


@pytest.fixture
def url(tmp_path):
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    rows = [  # job, user, family, pred util/mem, act util/mem, idx, shards, coloc
        (101, "alice", "resnet50", 40.0, 5000.0, 45.0, 5230.0, 0, 30, [102]),
        (102, "bob", "bert", 65.0, 30000.0, 70.0, 36260.0, 0, 50, [101]),
        (103, "alice", "resnet50", 20.0, 2000.0, None, None, 1, 20, []),
    ]
    admin = {  # AdminComment as sync stores it: the hook's decision, then the queue loop's marks
        101: "horus: shared a100 shards=30/100 (util 40%, mem 5000 MiB p90) "
             "horus-decision:v1;action=shared;type=a100;shards=30/100",
        102: "horus: whole GPU horus-decision:v1;action=exclusive;type=a100;reason=util "
             "horus-queue:v1;action=pack;from=gpu:1"}
    for jid, user, fam, pu, pm, au, am, idx, sh, co in rows:
        L.record_submission(job_id=jid, cluster="c", user=user, account="ml",
                            submit_time=1700000000 + jid, model_family=fam,
                            policy_decision=admin.get(jid),
                            predictions={"a100": {"util_pct": pu, "mem_mib": pm,
                                                  "predictor": "cold-start"}})
        if au is not None:
            L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=au, util_max=99,
                           mem_peak_mib=am, gpu_index=idx, shards=sh, colocated=co,
                           state="COMPLETED", elapsed_s=3725, node="gpu-a100",
                           start_time=1700000200, end_time=1700003925)
    return u


GOLDEN_P = """\
JobID|User|GPUType|GPUIdx|Alloc|PredUtil|ActUtil|UtilErr|PredMem|ActMem|MemErr|CoLocated|State|Elapsed|Predictor|QueueAct
101|alice|a100|0|30 shards|40.0|45.0|-5.0|5000|5230|-4.4|102|COMPLETED|01:02:05|cold-start|
102|bob|a100|0|50 shards|65.0|70.0|-5.0|30000|36260|-17.3|101|COMPLETED|01:02:05|cold-start|pack
103|alice||||20.0|||2000||||||cold-start|
"""


def test_golden_parsable(url):
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P"])
    assert r.exit_code == 0, r.output
    assert r.output == GOLDEN_P


def test_golden_parsable_filters_noheader_format(url):
    r = CliRunner().invoke(main, [*ALL, "-E", "now", "--ledger", url, "-P", "-n", "-u", "alice", "-s", "CD",
                                  "-o", "JobID,User,Family,ActMem,Node"])
    assert r.output == "101|alice|resnet50|5230|gpu-a100\n"
    # as sacct: with -s and no -E, the window is the moment -S (nothing completed then)
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-u", "alice", "-s", "CD"])
    assert r.exit_code == 0 and r.output == ""
    r = CliRunner().invoke(main, ["--ledger", url, "-P", "-n", "-j", "102,103", "-o", "jobid"])
    assert r.output == "102\n103\n"
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "JobID,HookAct,QueueAct"])
    assert r.output == "101|shared|\n102|exclusive:util|pack\n103||\n"


def test_of_p_and_P_the_last_given_wins_as_in_sacct(url):
    # -P had always won, whatever the order (sacct -P -p ends each line with '|')
    q = ["--ledger", url, "-n", "-j", "102", "-o", "JobID,User"]
    assert CliRunner().invoke(main, [*q, "-P", "-p"]).output == "102|bob|\n"
    assert CliRunner().invoke(main, [*q, "-p", "-P"]).output == "102|bob\n"
    assert CliRunner().invoke(main, [*q, "-p"]).output == "102|bob|\n"
    assert CliRunner().invoke(main, [*q, "--parsable2", "--parsable"]).output == "102|bob|\n"
    # a repeated flag counts where it is last used (click orders options by their first use)
    assert CliRunner().invoke(main, [*q, "-p", "-P", "-p"]).output == "102|bob|\n"
    assert CliRunner().invoke(main, [*q, "-P", "-p", "-P"]).output == "102|bob\n"
    assert CliRunner().invoke(main, [*q, "-Pp", "-nP"]).output == "102|bob\n"


GOLDEN_JSON = [
    {"job_id": 101, "array_job_id": None, "array_task_id": None, "het_job_id": None, "het_job_offset": None, "cluster": "c", "user": "alice", "account": "ml", "model_family": "resnet50",
     "gpu_type": "a100", "gpu_index": 0, "node": "gpu-a100", "gpus": None, "shards": 30,
     "state": "COMPLETED",
     "elapsed_s": 3725, "submit_time": 1700000101, "pred_util_pct": 40.0, "pred_mem_mib": 5000.0,
     "actual_util_pct": 45.0, "actual_util_max_pct": 99.0, "actual_mem_mib": 5230.0,
     "util_err_pp": -5.0, "mem_err_pct": -4.4, "colocated": [102], "predictor": "cold-start",
     "sources": "sacct", "pred_mem_p90_mib": None, "under_claim": False, "claim_flags": None,
     "hook_action": "shared", "hook_reason": None, "queue_actions": []},
    {"job_id": 102, "array_job_id": None, "array_task_id": None, "het_job_id": None, "het_job_offset": None, "cluster": "c", "user": "bob", "account": "ml", "model_family": "bert",
     "gpu_type": "a100", "gpu_index": 0, "node": "gpu-a100", "gpus": None, "shards": 50,
     "state": "COMPLETED",
     "elapsed_s": 3725, "submit_time": 1700000102, "pred_util_pct": 65.0, "pred_mem_mib": 30000.0,
     "actual_util_pct": 70.0, "actual_util_max_pct": 99.0, "actual_mem_mib": 36260.0,
     "util_err_pp": -5.0, "mem_err_pct": -17.26, "colocated": [101], "predictor": "cold-start",
     "sources": "sacct", "pred_mem_p90_mib": None, "under_claim": True, "claim_flags": "mem",
     "hook_action": "exclusive", "hook_reason": "util", "queue_actions": ["pack"]},
    {"job_id": 103, "array_job_id": None, "array_task_id": None, "het_job_id": None, "het_job_offset": None, "cluster": "c", "user": "alice", "account": "ml", "model_family": "resnet50",
     "gpu_type": None, "gpu_index": None, "node": None, "gpus": None, "shards": None,
     "state": None,
     "elapsed_s": None, "submit_time": 1700000103, "pred_util_pct": 20.0, "pred_mem_mib": 2000.0,
     "actual_util_pct": None, "actual_util_max_pct": None, "actual_mem_mib": None,
     "util_err_pp": None, "mem_err_pct": None, "colocated": [], "predictor": "cold-start",
     "sources": None, "pred_mem_p90_mib": None, "under_claim": None, "claim_flags": None,
     "hook_action": None, "hook_reason": None, "queue_actions": []},
]


def test_golden_json(url):
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == GOLDEN_JSON


def test_plain_text_when_piped(url):
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-o", "JobID,User,ActMem"])
    assert r.output.splitlines()[:3] == ["JobID  User ActMem", "----- ----- ------",
                                         "  101 alice   5230"]


def test_summary(url):
    r = CliRunner().invoke(main, ["--ledger", url, "--summary", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["all"]["jobs"] == 3 and s["all"]["measured"] == 2
    assert s["all"]["coverage_pct"] == pytest.approx(66.67)
    assert s["all"]["util_mae_pp"] == 5.0
    assert s["model_family"]["resnet50"]["coverage_pct"] == 50.0
    assert s["user"]["bob"]["far_exceeding"] == 0
    assert (s["all"]["claims_audited"], s["all"]["under_claims"]) == (2, 1)
    assert s["user"]["bob"]["under_claims"] == 1 and s["user"]["alice"]["under_claims"] == 0
    # median of |pred-act|/act over {0.0440, 0.1727}: between them
    assert 4.0 < s["all"]["mem_median_rel_err_pct"] < 17.5
    r = CliRunner().invoke(main, ["--ledger", url, "--summary"])
    assert "by model family" in r.output and "resnet50" in r.output and "UnderClaim" in r.output


def test_far_exceeding(tmp_path):
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    L.record_submission(job_id=1, cluster="c", user="x", predictions={"t4": {"util_pct": 10,
                                                                           "mem_mib": 1000}})
    L.record_usage(job_id=1, cluster="c", source="probe", util_mean=90, mem_peak_mib=4000)
    r = CliRunner().invoke(main, ["--ledger", u, "--summary", "--json"])
    s = json.loads(r.output)
    assert s["all"]["far_exceeding"] == 1 and s["far_exceeding"][0]["job_id"] == 1


def test_a_far_jobs_unknown_figure_reads_as_unknown_and_its_id_as_sacct_names_it(tmp_path):
    """A job far above its prediction on memory alone, its hint with no utilization, was
    listed as 'util None->90.0'; an array task by its own id, not the JobID hacct lists."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    L.record_submission(job_id=7, cluster="c", user="x", predictions={"t4": {"util_pct": None,
                                                                           "mem_mib": 1000}})
    L.record_usage(job_id=7, cluster="c", source="sacct", util_mean=90, mem_peak_mib=4000, gpu_type="t4",
                   array_job_id=5, array_task_id=2)
    r = CliRunner().invoke(main, ["--ledger", u, "--summary"])
    assert r.exit_code == 0, r.output
    far = r.output.splitlines()[-1].split()
    assert far == ["5_2", "x", "t4", "util", "-", "->", "90.0", "mem", "1000", "->", "4000", "MiB"]


def test_plot_png(url, tmp_path):
    """The filters reach the plot (tests/test_plots.py checks the figure itself)."""
    r = CliRunner().invoke(main, ["--ledger", url, "--plot", "-u", "bob"])
    assert r.exit_code == 0, r.output
    assert "1 measured job\n" in r.output and "user bob" in r.output
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    r = CliRunner().invoke(main, ["--ledger", url, "--plot", str(png)])
    assert r.exit_code == 0 and r.output == f"wrote {png}\n", r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_one_line(url):
    for args in (["-o", "JobID,Bogus"], ["-S", "yesterday-ish"], ["-j", "abc"]):
        r = CliRunner().invoke(main, ["--ledger", url, *args])
        assert r.exit_code != 0 and r.output.startswith("hacct: error:"), r.output
        assert len(r.output.strip().splitlines()) == 1


def test_whole_gpus_and_under_claims(tmp_path):
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    for jid, gpus, shards, mem in ((1, 2, None, 500.0), (2, None, 1, 900.0), (3, None, 25, 4000.0)):
        L.record_submission(job_id=jid, cluster="c", user="x", submit_time=1700000000 + jid,
                            predictions={"t4": {"util_pct": 10, "mem_mib": 800,
                                                "mem_mib_p90": 1000, "predictor": "hint"}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", gpus=gpus, shards=shards,
                       mem_peak_mib=mem)
    r = CliRunner().invoke(main, [*ALL, "--ledger", u, "-P", "-n", "-o",
                                  "JobID,Alloc,GPUs,Shards,UnderClaim"])
    assert r.output == "1|2 GPU|2||no\n2|1 shard||1|no\n3|25 shards||25|mem\n"
    r = CliRunner().invoke(main, [*ALL, "--ledger", u, "--json", "--under-claims"])
    (job,) = json.loads(r.output)
    assert (job["job_id"], job["gpus"], job["shards"]) == (3, None, 25)
    assert job["under_claim"] is True and job["claim_flags"] == "mem"
    assert job["pred_mem_p90_mib"] == 1000
    r = CliRunner().invoke(main, [*ALL, "--ledger", u, "--json"])
    assert json.loads(r.output)[0]["gpus"] == 2


PRIVATE = "ClusterName             = c\nPrivateData             = accounts,jobs\n"


def test_private_data_shows_a_reader_only_their_own_jobs(url, monkeypatch):
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.ledger import current_user

    me = current_user()
    Ledger(url).record_submission(job_id=104, cluster="c", user=me,
                                  predictions={"a100": {"util_pct": 1}})
    monkeypatch.setattr(Ledger, "writable", lambda self: False)  # an ordinary user
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: PRIVATE)
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "JobID,User"])
    assert r.output == f"104|{me}\n"
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "JobID", "-u", "bob"])
    assert r.output == ""  # -u cannot show others' jobs, nor yours under their name (sacct)
    r = CliRunner().invoke(main, ["--ledger", url, "--summary", "--json"])
    assert json.loads(r.output)["all"]["jobs"] == 1
    # the jobs that shared a GPU with yours: named only where they are yours (bob's 102 hidden)
    L = Ledger(url)
    L.record_submission(job_id=105, cluster="c", user=me, predictions={"a100": {"util_pct": 1}})
    L.record_usage(job_id=105, cluster="c", source="sacct", util_mean=5, mem_peak_mib=100,
                   colocated=[102, 104], state="COMPLETED")
    for fmt in (["-P"], []):
        r = CliRunner().invoke(main, [*ALL, "--ledger", url, *fmt, "-n", "-o", "JobID,CoLocated"])
        assert "102" not in r.output and "104" in r.output, r.output
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "--json", "-j", "105"])
    assert json.loads(r.output)[0]["colocated"] == [104]
    # --summary's jobs far above their prediction too (it had named bob's 102 there)
    L.record_submission(job_id=106, cluster="c", user=me, predictions={"a100": {"util_pct": 5}})
    L.record_usage(job_id=106, cluster="c", source="sacct", util_mean=90, mem_peak_mib=100,
                   colocated=[102, 104], state="COMPLETED")
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "--summary", "--json"])
    far = {x["job_id"]: x["colocated"] for x in json.loads(r.output)["far_exceeding"]}
    assert far[106] == [104], far
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: "PrivateData = none\n")
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "JobID"])
    assert r.output == "101\n102\n103\n104\n105\n106\n"
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "CoLocated", "-j", "105"])
    assert r.output == "102,104\n"


def test_reader_of_old_or_missing_ledger_gets_one_line(tmp_path):
    r = CliRunner().invoke(main, ["--ledger", f"sqlite:///{tmp_path}/none.db"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1
    assert "ask an admin to run horus-admin sync" in r.output
    assert not (tmp_path / "none.db").exists()


def test_summary_p90_coverage_and_failed_measurements(tmp_path):
    """--summary: achieved p90 coverage overall, per GPU type and per predictor; failed
    measurements (util 0, memory at most a bare CUDA context) counted as excluded and left out
    of every error figure; the views agree."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    jobs = [  # job, gpu, predictor, pred mem, p90, act util, act mem
        (1, "a100", "cold-start", 1000, 1200, 50, 1100),   # within p90
        (2, "a100", "cold-start", 1000, 1200, 50, 1300),   # above p90
        (3, "a100", "learned:v0002", 1000, 1200, 50, 900),  # within
        (4, "t4", "learned:v0002", 1000, 1200, 50, 1200),   # at p90: within
        (5, "t4", "cold-start", 1000, 1200, 0, 400),        # failed measurement
    ]
    for jid, g, pred, pm, p90, au, am in jobs:
        L.record_submission(job_id=jid, cluster="c", user="u", predictor=pred,
                            predictions={g: {"util_pct": 40, "mem_mib": pm, "mem_mib_p90": p90,
                                             "predictor": pred}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=au, mem_peak_mib=am,
                       gpu_type=g)
    s = json.loads(CliRunner().invoke(main, ["--ledger", u, "--summary", "--json"]).output)
    a = s["all"]
    assert (a["jobs"], a["measured"], a["excluded"], a["p90_jobs"]) == (5, 5, 1, 4)
    assert a["p90_coverage_pct"] == 75.0 and a["util_mae_pp"] == 10.0  # job 5 not in MAE
    assert s["gpu_type"]["t4"]["p90_coverage_pct"] == 100.0 and s["gpu_type"]["t4"]["excluded"] == 1
    assert s["predictor"]["cold-start"]["p90_coverage_pct"] == 50.0
    assert s["predictor"]["learned"]["p90_coverage_pct"] == 100.0
    assert s["gpu_type_predictor"]["a100 cold-start"]["p90_jobs"] == 2
    text = CliRunner().invoke(main, ["--ledger", u, "--summary"]).output
    assert "P90Cov" in text and "Excluded" in text and "by GPU type and predictor" in text
    import sqlite3

    con = sqlite3.connect(tmp_path / "l.db")
    got = con.execute("SELECT gpu_type, failed_measurements, p90_coverage_pct FROM "
                      "v_accuracy_by_gpu_type ORDER BY gpu_type").fetchall()
    assert got == [("a100", 0, pytest.approx(200 / 3)), ("t4", 1, 100.0)]
    errs = dict(con.execute("SELECT job_id, mem_err_pct FROM v_job_errors").fetchall())
    assert errs[2] == pytest.approx(100 * (1000 - 1300) / 1300) and errs[5] is None


def test_summary_figures_match_their_definitions(tmp_path):
    """--summary against the definitions (docs/definitions.md) computed here in plain Python
    from the jobs rows, over random jobs with gaps, failed measurements and far misses."""
    import math
    import random

    from slurm_horus.ledger.report import summary

    rng = random.Random(7)
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    for jid in range(1, 201):
        g = rng.choice(["a100", "t4"])
        pred = {"util_pct": rng.uniform(5, 90), "mem_mib": rng.uniform(300, 9000),
                "predictor": rng.choice(["cold-start", "learned:v0001", "learned:v0002"])}
        if rng.random() < 0.8:
            pred["mem_mib_p90"] = pred["mem_mib"] * 1.2
        L.record_submission(job_id=jid, cluster="c", user=rng.choice(["ann", "bob"]),
                            predictions={g: pred})
        r = rng.random()
        if r < 0.1:
            continue  # never measured
        au = 0.0 if r < 0.15 else min(100.0, max(1.0, pred["util_pct"] + rng.gauss(0, 20)))
        am = 300.0 if r < 0.15 else pred["mem_mib"] * rng.lognormvariate(0, 0.3)
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=au, mem_peak_mib=am,
                       gpu_type=g)
    jobs = L.jobs()

    def expect(rows):
        ok = [r for r in rows if not r["failed_measurement"] and r["act_util_pct"] is not None]
        p90 = [r for r in ok if r["pred_mem_p90_mib"]]
        far = [r for r in ok if r["act_util_pct"] - r["pred_util_pct"] > 25
               or r["act_mem_mib"] > 1.25 * r["pred_mem_mib"]]
        sq = [(math.log1p(r["pred_mem_mib"]) - math.log1p(r["act_mem_mib"])) ** 2 for r in ok]
        return {"jobs": len(rows), "excluded": sum(1 for r in rows if r["failed_measurement"]),
                "util_mae_pp": round(sum(abs(r["act_util_pct"] - r["pred_util_pct"])
                                         for r in ok) / len(ok), 3),
                "p90_coverage_pct": round(100 * sum(r["act_mem_mib"] <= r["pred_mem_p90_mib"]
                                                    for r in p90) / len(p90), 2),
                "mem_rmsle": round(math.sqrt(sum(sq) / len(sq)), 4), "far_exceeding": len(far)}

    s = summary(L, far_limit=1000)
    keys = ("jobs", "excluded", "util_mae_pp", "p90_coverage_pct", "mem_rmsle", "far_exceeding")
    assert {k: s["all"][k] for k in keys} == expect(jobs)
    for g in ("a100", "t4"):
        assert {k: s["gpu_type"][g][k] for k in keys} == expect(
            [r for r in jobs if r["gpu_type"] == g])
    learned = [r for r in jobs if r["predictor"].startswith("learned")]
    assert {k: s["predictor"]["learned"][k] for k in keys} == expect(learned)
    assert 0 < s["all"]["excluded"] and 0 < s["all"]["far_exceeding"] == len(s["far_exceeding"])


def test_queue_actions_listed_and_oom_requeues_counted(tmp_path):
    """QueueAct and the summary's count come from the AdminComment sync stored; an OOM requeue
    counts as completed only when the rerun completed, and the summary's filters apply."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    shared = "horus-decision:v1;action=shared;type=a100;shards=30/100"
    oom = "horus-queue:v1;action=oom-requeue;from=shard:30"
    jobs = [(1, "ann", f"{shared} {oom}", "COMPLETED"), (2, "ann", f"{shared} {oom}", "FAILED"),
            (3, "bob", f"{shared} {oom}", "COMPLETED"),
            (4, "ann", "horus-decision:v1;action=exclusive;type=a100;reason=util "
                       "horus-queue:v1;action=pack;from=gpu:1 "
                       "horus-queue:v1;action=spread;from=shard:50", "COMPLETED"),
            (5, "ann", shared, "COMPLETED"), (6, "ann", None, "COMPLETED")]
    for jid, user, admin, state in jobs:
        L.record_submission(job_id=jid, cluster="c", user=user, policy_decision=admin,
                            predictions={"a100": {"util_pct": 30, "mem_mib": 4000}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", state=state, shards=30)
    r = CliRunner().invoke(main, [*ALL, "--ledger", u, "-P", "-n", "-o", "JobID,HookAct,QueueAct,State"])
    assert r.output.splitlines() == [
        "1|shared|oom-requeue|COMPLETED", "2|shared|oom-requeue|FAILED",
        "3|shared|oom-requeue|COMPLETED", "4|exclusive:util|pack,spread|COMPLETED",
        "5|shared||COMPLETED", "6|||COMPLETED"]
    r = CliRunner().invoke(main, ["--ledger", u, "--summary", "--json"])
    assert json.loads(r.output)["queue_actions"] == {
        "oom_requeues": 3, "oom_requeues_completed": 2, "pack": 1, "spread": 1}
    r = CliRunner().invoke(main, ["--ledger", u, "--summary", "-u", "ann"])
    assert "horus-admin queue: 2 OOM requeues (1 then completed), 1 packed" in r.output
    r = CliRunner().invoke(main, ["--ledger", u, "--json", "-j", "4"])
    assert json.loads(r.output)[0]["queue_actions"] == ["pack", "spread"]


def test_text_users_wrote_cannot_drive_the_readers_terminal():
    """A ledger cell with terminal escapes and rich markup (a model family from an older ledger,
    before workload tokens with control characters were refused) prints inert."""
    import io

    from rich.console import Console

    from slurm_horus.ledger.report import column_widths, plain_lines, rich_table

    row = {"job_id": 7, "model_family": "\x1b]0;pwn\x07\x1b[2j[red]x", "user_name": "alice"}
    cols = [("jobid", None), ("family", None), ("user", None)]
    for parsable in (True, False):
        out = "\n".join(plain_lines([row], cols, parsable, noheader=True,
                                    widths=column_widths([row], cols)))
        assert "\x1b" not in out and "\x07" not in out and "?]0;pwn??[2j[red]x" in out
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system="standard", width=200).print(
        rich_table([row], cols, noheader=True))
    text = buf.getvalue()
    assert "[red]x" in text and "\x1b[31m" not in text and "\x1b]0;" not in text


def test_the_summarys_memory_median_is_within_a_bin_of_the_exact_one():
    """The median comes from a histogram counted in SQL; for any group, small or even-sized,
    it is within a bin of the exact median (0.5 pp below 100 %, 10 pp to 1000 %)."""
    import random
    import statistics

    from slurm_horus.ledger.jobs import mem_err_bucket
    from slurm_horus.ledger.report import _median_from_hist

    def estimate(errs):
        hist = {}
        for e in errs:
            b = mem_err_bucket(10000 * (1 + e), 10000)
            hist[b] = hist.get(b, 0) + 1
        return _median_from_hist(hist)
    assert abs(estimate([0.0, 0.9]) - 0.45) <= 0.0025 + 1e-9  # two jobs: between them, not the first
    assert abs(estimate([0.05, 0.05, 0.5, 0.5]) - 0.275) <= 0.0025 + 1e-9
    rng = random.Random(0)
    for n in range(1, 60):
        for top, bin_width in ((1.0, 0.005), (10.0, 0.1)):
            errs = [rng.uniform(0, top) for _ in range(n)]
            errs += [min(errs)] * (n % 3)  # ties: several values at one point of a bin
            if top == 10.0:
                errs = [e for e in errs if e >= 1.0] or [1.5]
            assert abs(estimate(errs) - statistics.median(errs)) < bin_width, (n, errs)
    assert estimate([19.0, 29.0, 49.0]) == 10.0  # above 1000 %: the one bin, read as 1000 %


def test_a_failed_measurement_shows_no_error(tmp_path):
    """hacct agrees with v_job_errors and the summary: a job that never used its GPU has no
    utilization or memory error to show."""
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    for jid, mem in ((4, None), (5, 512.0)):
        L.record_submission(job_id=jid, cluster="c", user="u", gpu_types=["a100"],
                            predictions={"a100": {"util_pct": 40.0, "mem_mib": 5000.0}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=0.0, mem_peak_mib=mem,
                       gpu_type="a100", state="COMPLETED")
    r = CliRunner().invoke(main, [*ALL, "--ledger", f"sqlite:///{tmp_path}/l.db", "-P", "-o",
                                  "JobID,UtilErr,MemErr"])
    assert r.exit_code == 0 and r.output.splitlines()[1:] == ["4||", "5||"], r.output
    r = CliRunner().invoke(main, [*ALL, "--ledger", f"sqlite:///{tmp_path}/l.db", "--json"])
    assert all(j["util_err_pp"] is None and j["mem_err_pct"] is None for j in json.loads(r.output))
    assert all(j["under_claim"] is None for j in json.loads(r.output))  # no claim audited either


def test_a_model_name_cannot_shift_the_columns(tmp_path):
    # the family comes from the file name the user chose: a '|' in it added a column to -P's
    # output, a space one to the plain table's
    from slurm_horus.graph.names import family_of

    assert family_of("/home/u/my|net v2.onnx") == "my_net_v2" and family_of("/m/résnet.onnx") == "résnet"
    assert family_of("/m/resnet50_bs64.onnx") == "resnet50" and family_of("/m/Llama-3.1-8B.onnx") == "llama-3.1-8b"
    url = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(url)
    L.record_submission(job_id=1, cluster="c", user="u", model_path="/home/u/a|b c.onnx",
                        predictions={"a100": {"util_pct": 10, "mem_mib": 100}})
    L.record_usage(job_id=1, cluster="c", source="sacct", util_mean=10, mem_peak_mib=100,
                   gpu_type="a100", state="COMPLETED")
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "JobID,Family,State"])
    assert r.output == "1|a_b_c|COMPLETED\n", r.output


def test_sacct_time_formats_and_default_window(url, monkeypatch):
    # sacct's man page formats (today, noon, MM/DD, HH:MM, now+N, weeks) were "bad time"
    from slurm_horus.cli.common import parse_time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = time.time()
        day = time.strftime("%Y-%m-%d", time.localtime(now))
        midnight = parse_time(f"{day}T00:00:00", "-S")
        for text, want in (("today", midnight), ("midnight", midnight), ("noon", midnight + 43200),
                           ("teatime", midnight + 57600), ("10:30", midnight + 37800),
                           ("3:30pm", midnight + 55800), (f"{day}T10", midnight + 36000)):
            assert parse_time(text, "-S") == want, text
        assert parse_time("12/01/26", "-S") == parse_time("2026-12-01", "-S") == parse_time("120126", "-S")
        assert parse_time("12.01.2026-10:00", "-S") == parse_time("2026-12-01T10:00", "-S")
        assert abs(parse_time("now-1weeks", "-S") - (now - 7 * 86400)) < 5
        assert abs(parse_time("now+2hours", "-S") - (now + 7200)) < 5
        # no year: a month after this one is last year's, as sacct's parse_time(past=1) takes it
        # (on 2027-01-15, 12/01 is 2026-12-01: it was read as 2027-12-01, and -S listed nothing)
        real = time.localtime
        jan = time.mktime((2027, 1, 15, 12, 0, 0, 0, 0, -1))
        monkeypatch.setattr(time, "localtime", lambda t=None: real(jan if t is None else t))
        for text, year in (("12/01", 2026), ("1201", 2026), ("01/10", 2027), ("0110", 2027)):
            assert real(parse_time(text, "-S")).tm_year == year, text
        monkeypatch.setattr(time, "localtime", real)
        # tomorrow, and spaces around the sign and the unit: sacct takes them (parse_time.c)
        assert parse_time("tomorrow", "-E") == midnight + 86400
        assert abs(parse_time("now - 2 hours", "-S") - (now - 7200)) < 5
        for bad in ("13/01", "25:00", "2026-13-01", "now-2x", "tomorrow2"):
            with pytest.raises(HorusError, match="bad time"):
                parse_time(bad, "-S")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    # -E alone keeps the midnight default (as sacct; it dropped the start); -s lifts it
    r = CliRunner().invoke(main, ["--ledger", url, "-E", "now", "-P", "-n", "-o", "JobID"])
    assert r.exit_code == 0 and r.output == ""  # the fixtures' jobs are from 2023
    r = CliRunner().invoke(main, ["--ledger", url, "-s", "CD", "-P", "-n", "-o", "JobID"])
    assert r.output == "101\n102\n"
    # a start after the end is sacct's error, not an empty list (with the default -S too)
    for args in (["-S", "2023-02-01", "-E", "2023-01-01"], ["-E", "2023-01-01"]):
        r = CliRunner().invoke(main, ["--ledger", url, *args, "-P", "-n", "-o", "JobID"])
        assert r.exit_code != 0 and "requested is after end time (2023-01-01T00:00:00)" in r.output, r.output
    r = CliRunner().invoke(main, ["--ledger", url, "-S", "2023-01-01", "-E", "2023-01-01", "-P", "-n"])
    assert r.exit_code == 0


def test_sacct_selection_forms_clusters_accounts_uids_and_left_justified_widths(tmp_path, monkeypatch):
    """sacct shows this cluster's jobs unless -M names others (a list, or all; -L), lower-cases
    accounts, takes uids for -u, and reads Name%-W as left-justified: hacct mixed clusters by
    default, printed nothing for -M c,d, -A ML or -u <uid>, and refused %-20."""
    import pwd

    from slurm_horus.slurm import commands as slurm

    me = pwd.getpwuid(os.getuid())
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    for cluster, jid in (("c", 101), ("d", 101), ("e", 7)):
        L.record_submission(job_id=jid, cluster=cluster, user=me.pw_name, account="ml",
                            submit_time=1700000000, predictions={"a100": {"util_pct": 1}})
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: "ClusterName = c\nPrivateData = none\n")
    q = [*ALL, "--ledger", u, "-P", "-n", "-o", "Cluster,JobID"]
    assert CliRunner().invoke(main, q).output == "c|101\n"  # this host's cluster
    assert CliRunner().invoke(main, [*q, "-M", "c,d"]).output == "c|101\nd|101\n"
    for every in (["-M", "all"], ["-L"], ["-M", "ALL"]):
        assert CliRunner().invoke(main, [*q, *every]).output == "c|101\nd|101\ne|7\n", every
    assert CliRunner().invoke(main, [*q, "-A", "ML"]).output == "c|101\n"
    assert CliRunner().invoke(main, [*q, "-u", str(me.pw_uid)]).output == "c|101\n"
    r = CliRunner().invoke(main, [*ALL, "--ledger", u, "-n", "-o", "JobID%-8,Cluster%4"])
    assert r.exit_code == 0 and r.output == "101         c\n", repr(r.output)
    # a ledger of one cluster, or of none under this name: all of it (a renamed cluster)
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: "ClusterName = z\nPrivateData = none\n")
    assert CliRunner().invoke(main, q).output == "c|101\nd|101\ne|7\n"
    # where Slurm cannot say which cluster this is: every cluster's
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: (_ for _ in ()).throw(slurm.HorusError("no")))
    assert CliRunner().invoke(main, [*q, "-a"]).output == "c|101\nd|101\ne|7\n"


def test_a_terminal_narrower_than_the_table_gets_whole_values(url):
    """rich fitted the table to the terminal: at 80 columns every job id and user read '…'.
    sacct prints whole values and lets the terminal wrap; so does hacct."""
    rc, text = _on_terminal([*ALL, "--ledger", url], columns="80")
    assert rc == 0 and "…" not in text, text
    assert all(v in text for v in ("101", "alice", "COMPLETED", "01:02:05", "cold-start")), text


def test_long_options_take_unambiguous_prefixes_and_usage_errors_are_one_line(url):
    """As sacct (getopt_long): --start, --end, --form; click had refused them, in four lines."""
    want = CliRunner().invoke(main, ["--ledger", url, "-S", "2000-01-01", "-o", "JobID,State", "-P"])
    got = CliRunner().invoke(main, ["--led", url, "--start", "2000-01-01", "--end=now",
                                    "--form", "JobID,State", "--parsable2"])
    assert got.exit_code == 0 and got.output == want.output and "101|COMPLETED" in got.output
    for bad, says in ((["--sta", "x"], "No such option '--sta'"),  # --starttime or --state
                      (["--bogus"], "No such option '--bogus'"), (["-S"], "requires an argument")):
        r = CliRunner().invoke(main, ["--ledger", url, *bad], prog_name="hacct")
        assert r.exit_code == 2 and r.output.startswith("hacct: error: ") and says in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output
    # a value that looks like an option is the option's value, never spelled out
    r = CliRunner().invoke(main, ["--ledger", url, "-S", "2000-01-01", "-o", "--sta"])
    assert r.exit_code != 0 and "'--sta'" in r.output and "--state" not in r.output, r.output


def _on_terminal(args, columns="200"):
    """hacct's output and exit status with a terminal (a pty) as its standard output."""
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": columns, "TERM": "dumb"}
    with subprocess.Popen([sys.executable, "-m", "slurm_horus.cli.hacct", *args],
                          stdout=follower, stderr=subprocess.PIPE, env=env) as p:
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            out += chunk
        p.wait(timeout=60)
    os.close(leader)
    return p.returncode, out.decode().replace("\r\n", "\n")


def test_sacct_fields_the_ledger_holds_and_a_clear_no_for_those_it_lacks(url, monkeypatch):
    """-o Start, End, JobIDRaw (and NodeList, ElapsedRaw) were 'unknown field' though the ledger
    stores them; JobName, Partition, ExitCode are sacct's but not recorded: the error says so."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-o",
                                      "JobID,JobIDRaw,Submit,Start,End,ElapsedRaw,NodeList"])
        assert r.exit_code == 0, r.output
        assert r.output == (
            "JobID|JobIDRaw|Submit|Start|End|ElapsedRaw|NodeList\n"
            "101|101|2023-11-14T22:15:01|2023-11-14T22:16:40|2023-11-14T23:18:45|3725|gpu-a100\n"
            "102|102|2023-11-14T22:15:02|2023-11-14T22:16:40|2023-11-14T23:18:45|3725|gpu-a100\n"
            "103|103|2023-11-14T22:15:03|Unknown|Unknown||\n"), r.output  # as sacct: Unknown
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    for field in ("JobName", "Partition", "ExitCode"):
        r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-o", f"JobID,{field},State"])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert f"field '{field}': the ledger does not record it (available: JobID," in r.output
        assert "Start, End" in r.output, r.output
    r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-o", "JobID,Bogus"])
    assert r.exit_code == 2 and "unknown field 'Bogus' (available: JobID," in r.output, r.output


def test_helpformat_and_delimiter_as_in_sacct(url):
    """sacct -e lists the fields (four a line, padded to 19) and exits 0; --delimiter sets the
    separator of -p/-P and is ignored without them. hacct had neither."""
    from slurm_horus.ledger.report import COLUMNS

    for args in (["-e"], ["--helpformat"], ["-o", "help"]):
        r = CliRunner().invoke(main, ["--ledger", url, *args])
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert lines[0] == "JobID               JobIDRaw            ArrayJobID          ArrayTaskID        "
        assert r.output.split() == list(COLUMNS.values()) and "Start" in r.output
        assert all(len(ln.split()) <= 4 for ln in lines)
    q = [*ALL, "--ledger", url, "-o", "JobID,User"]
    assert CliRunner().invoke(main, [*q, "-P", "--delimiter=,"]).output == \
        "JobID,User\n101,alice\n102,bob\n103,alice\n"
    assert CliRunner().invoke(main, [*q, "-p", "-n", "--delimiter", "::"]).output == \
        "101::alice::\n102::bob::\n103::alice::\n"
    plain = CliRunner().invoke(main, q).output
    assert CliRunner().invoke(main, [*q, "--delimiter=,"]).output == plain and "-----" in plain


def test_widths_in_format_give_sacct_fixed_width_table_on_a_terminal(url):
    """On a terminal hacct printed its rich table whatever -o said: Name%W cut values to '…'
    and there was no '-----' line. A width asks for sacct's table, there as when piped."""
    rc, text = _on_terminal([*ALL, "--ledger", url, "-o", "JobID%6,User%3,State%-10"])
    assert rc == 0, text
    assert text.splitlines()[:3] == [" JobID Use State     ", "------ --- ----------",
                                     "   101 al+ COMPLETED "], text
    assert "…" not in text
    rc, text = _on_terminal([*ALL, "--ledger", url, "-o", "JobID,User"])  # no width: rich
    assert rc == 0 and "-----" not in text and "alice" in text, text


def test_a_start_after_now_is_an_error_without_E_too(url):
    """-S tomorrow, now+1hours or a later hour today listed nothing and exited 0: sacct compares
    the start with its default end, now, and exits 1."""
    later = time.localtime(time.time() + 7200)
    starts = ["tomorrow", "now+1hours"]
    if later.tm_mday == time.localtime().tm_mday:  # an hour later today (as teatime may be)
        starts.append(time.strftime("%H:%M", later))
    for s in starts:
        r = CliRunner().invoke(main, ["--ledger", url, "-S", s, "-P", "-o", "JobID"])
        assert r.exit_code == 1, (s, r.output)
        assert r.output.startswith("hacct: error: Start time (") and "requested is after end time (" in r.output
        assert len(r.output.strip().splitlines()) == 1
    r = CliRunner().invoke(main, ["--ledger", url, "-S", "now", "-P", "-n", "-o", "JobID"])
    assert r.exit_code == 0 and r.output == "", r.output


def test_of_u_and_a_the_later_wins_and_u_minus_1_is_everyone(url):
    """As sacct (options.c): -u bob -a lists everyone's jobs, -a -u bob bob's; -u -1 is every
    user's.  hacct had listed only bob's for -u bob -a."""
    def users(*args):
        r = CliRunner().invoke(main, [*ALL, "--ledger", url, "-P", "-n", "-o", "User", *args])
        assert r.exit_code == 0, r.output
        return sorted(set(r.output.split()))
    assert users("-u", "bob", "-a") == ["alice", "bob"]
    assert users("-a", "-u", "bob") == ["bob"]
    assert users("-u", "-1") == ["alice", "bob"]
    assert users("-u", "bob") == ["bob"]
    # each use in turn, as getopt reads them (the first use of each alone had decided)
    assert users("-u", "alice", "-a", "-u", "bob") == ["alice", "bob"]
    assert users("-a", "-u", "bob", "-a") == ["alice", "bob"]
    assert users("-u", "-1", "-u", "bob") == ["bob"]
    assert users("-au", "bob") == ["bob"]


def test_a_state_with_a_window_is_the_state_during_it(url):
    """As sacct (slurmdbd's _state_time_string): with -S/-E, -s R lists the jobs running at some
    time in the window, -s PD those waiting in it, an end state those ending in it with it.
    hacct had matched the final state and -s R/PD found nothing."""
    import time as _time

    def ids(state, lo, hi):
        t = lambda x: _time.strftime("%Y-%m-%dT%H:%M:%S", _time.localtime(x))  # noqa: E731
        r = CliRunner().invoke(main, ["--ledger", url, "-P", "-n", "-o", "JobID", "-s", state,
                                      "-S", t(lo), "-E", t(hi)])
        assert r.exit_code == 0, r.output
        return r.output.split()
    # 101 and 102: submitted at 1700000101/102, ran 1700000200..1700003925, COMPLETED
    assert ids("R", 1700001000, 1700002000) == ["101", "102"]
    assert ids("R", 1700004000, 1700005000) == []
    assert ids("PD", 1700000150, 1700000180) == ["101", "102"]
    assert ids("PD", 1700000300, 1700000400) == []
    assert ids("CD", 1700003900, 1700004000) == ["101", "102"]
    assert ids("CD", 1700001000, 1700002000) == []  # completed, but not in this window
    assert ids("R,CD", 1700003900, 1700004000) == ["101", "102"]
    # without -E, as sacct: the window is the moment -S (running at 1700001000; not at 1700004000)
    at = lambda x: CliRunner().invoke(main, ["--ledger", url, "-P", "-n", "-o", "JobID", "-s", "R", "-S",  # noqa: E731
                                             _time.strftime("%Y-%m-%dT%H:%M:%S", _time.localtime(x))]).output.split()
    assert at(1700001000) == ["101", "102"] and at(1700004000) == []
    # a row with no submit time (a probe's alone) was never pending, with or without -E
    L = Ledger(url)
    L.record_usage(job_id=200, cluster="c", source="probe", util_mean=10, mem_peak_mib=100,
                   start_time=1700000500, end_time=1700000600)
    assert "200" not in ids("PD", 1700000100, 1700000300)


def test_a_figure_past_any_gpu_is_shown_empty_as_json_shows_null(tmp_path):
    """A review: a row an import or an old predictor wrote with inf or 1e308 printed 'inf' and a
    309-digit number (and MemRMSLE inf in the summary) where --json shows null."""
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    for jid, mem in ((201, float("inf")), (202, 1e308)):
        L.record_submission(job_id=jid, cluster="c", user="alice", account="ml", submit_time=1700000000,
                            predictions={"a100": {"util_pct": 40.0, "mem_mib": mem, "predictor": "cold-start"}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=45.0, util_max=99,
                       mem_peak_mib=5000.0, gpu_index=0, shards=30, colocated=[], state="COMPLETED",
                       elapsed_s=60, node="n", start_time=1700000200, end_time=1700000260)
    r = CliRunner().invoke(main, ["--ledger", u, *ALL, "-M", "c", "-P", "-o", "JobID,PredMem,MemErr"])
    assert r.exit_code == 0 and r.output.splitlines()[1:] == ["201||", "202||"], r.output
    r = CliRunner().invoke(main, ["--ledger", u, *ALL, "-M", "c", "--summary"])
    assert r.exit_code == 0 and "inf" not in r.output and "e+" not in r.output, r.output


@pytest.mark.parametrize("jobs,said", [("101,abc,102", "-j/--jobs: abc: not a job id"),
                                       ("101+x", "101+x' is not HetJobId+Offset"),
                                       ("9" * 100, "9" * 40 + "...: not a job id")])
def test_a_bad_job_id_is_named_in_a_short_line(url, jobs, said):
    r = CliRunner().invoke(main, ["--ledger", url, "-j", jobs])
    assert r.exit_code != 0 and said in r.output and len(r.output) < 200, r.output


def test_a_het_jobs_id_lists_its_components_as_sacct_does(tmp_path, monkeypatch):
    """sacct -j N lists every component of heterogeneous job N, each a job of its own id; the
    ledger keeps no HetJobId, and hacct -j N listed the leader alone. The components come from
    Slurm's accounting in one lookup for all the ids named, on the cluster N+K's would use;
    where Slurm cannot answer, the ledger's jobs of those ids are listed, as before."""
    import pwd

    from slurm_horus.slurm import commands as slurm

    me = pwd.getpwuid(os.getuid()).pw_name
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    for jid in (300, 301, 302, 400, 500):  # 301, 302: het job 300's components 1 and 2
        L.record_submission(job_id=jid, cluster="c", user=me, account="ml", submit_time=1700000000 + jid,
                            predictions={"a100": {"util_pct": 1}})
    asked = []

    def components(job_ids, cluster=None):
        asked.append((list(job_ids), cluster))
        return {300: [300, 301, 302]} if 300 in job_ids else {}
    monkeypatch.setattr(slurm, "het_job_component_ids", components)
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: "ClusterName = c\nPrivateData = none\n")

    def listed(*args):
        r = CliRunner().invoke(main, ["--ledger", u, *args, "-P", "-n", "-o", "JobID"])
        assert r.exit_code == 0, r.output
        return [int(x) for x in r.output.split()]
    assert listed("-j", "300") == [300, 301, 302] and asked == [([300], "c")]
    assert listed("-j", "400,300.batch") == [300, 301, 302, 400] and asked[-1] == ([400, 300], "c")
    assert listed("-j", "400") == [400]
    assert listed("-M", "d", "-j", "300") == [] and asked[-1] == ([300], "d")  # the cluster asked
    r = CliRunner().invoke(main, ["--ledger", u, "-j", "300", "--json"])
    assert [j["job_id"] for j in json.loads(r.output)] == [300, 301, 302], r.output
    n = len(asked)
    assert listed("-M", "c,d", "-j", "300") == [300] and len(asked) == n  # one cluster only, as N+K
    assert listed("-L", "-j", "300") == [300] and len(asked) == n  # every cluster: no one job
    assert listed("-S", "2000-01-01") == [300, 301, 302, 400, 500] and len(asked) == n  # no -j: none
    # Slurm's accounting unreachable: the ledger's jobs of those ids, as before, and no error
    monkeypatch.setattr(slurm, "het_job_component_ids", lambda job_ids, cluster=None: (_ for _ in ()).throw(
        HorusError("sacct not found on PATH (is Slurm installed?)")))
    assert listed("-j", "300,400") == [300, 400]


def test_an_output_width_takes_ascii_digits_only(url):
    r = CliRunner().invoke(main, ["--ledger", url, "-j", "101", "-o", "JobID%\u0661\u0660"])
    assert r.exit_code != 0 and "bad width" in r.output


@pytest.mark.parametrize("fixtures", ["slurm", "slurm-25.11"])
def test_a_het_job_component_is_named_as_sacct_names_it(tmp_path, monkeypatch, fixtures):
    """sacct -j N+K shows component K of heterogeneous job N, a job of its own id (the id the
    ledger keys it by): hacct refused N+K. The component's id comes from Slurm's accounting, as
    an array task's does; one Slurm does not know names no job. N_K and N.step keep working.
    Slurm's answers: the recorded sacct --json -j HETJOBID of a finished two-component job."""
    import pwd

    from slurm_horus.slurm import commands as slurm

    fix = Path(__file__).parent / "fixtures" / fixtures
    f = next(f for f in json.loads((fix / "index.json").read_text())["fixtures"]
             if f["name"] == "sacct_json_finished_het")
    recorded = (fix / f["stdout"]).read_text()
    het = f["het_job_id"]
    comp = next(j["job_id"] for j in json.loads(recorded)["jobs"] if j["job_id"] != het)
    other = max(het, comp) + 100  # a job of no heterogeneous job
    me = pwd.getpwuid(os.getuid()).pw_name
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u)
    for jid in (het, comp, other):
        L.record_submission(job_id=jid, cluster="c", user=me, account="ml", submit_time=1700000000,
                            predictions={"a100": {"util_pct": 1}})
    seen = []

    def run(args, timeout=30):
        if args[0] != "sacct":
            return "ClusterName = c\nPrivateData = none\n"
        seen.append(args)
        return recorded
    monkeypatch.setattr(slurm, "run", run)

    def listed(ids):
        r = CliRunner().invoke(main, ["--ledger", u, "-j", ids, "-P", "-n", "-o", "JobID"])
        assert r.exit_code == 0, r.output
        return [int(x) for x in r.output.split()]
    assert listed(f"{het}+1") == [comp] and seen[-1][-4:] == ["-M", "c", "-j", f"{het}+1"]
    assert listed(f"{het}+1.batch") == [comp]  # a step names its job: the ledger holds no steps
    assert listed(f"{het}+0,{other}") == sorted([het, other])
    assert listed(f"{het}+7") == []  # Slurm knows no such component: no job, as in sacct
    n = len(seen)
    assert listed(f"{other}.0") == [other]  # a plain id is asked for once, as a heterogeneous job's leader
    assert [a[-4:] for a in seen[n:]] == [["-M", "c", "-j", str(other)]]
    assert listed(str(het)) == sorted([het, comp])  # the leader's id: every component, as sacct -j N
    r = CliRunner().invoke(main, ["--ledger", u, "-M", "c,d", "-j", f"{het}+1"])
    assert r.exit_code != 0 and "looked up in one cluster" in r.output, r.output
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: (_ for _ in ()).throw(
        slurm.HorusError("sacct: command not found")))
    r = CliRunner().invoke(main, ["--ledger", u, "-M", "c", "-j", f"{het}+1"])
    assert r.exit_code != 0 and "looked up in Slurm's accounting" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("fixtures", ["slurm", "slurm-25.11"])
def test_a_synced_het_jobs_components_show_as_sacct_names_them(tmp_path, monkeypatch, fixtures):
    """sacct's JobID names a heterogeneous job's component HetJobId+HetJobOffset (1234+0, the
    leader, and 1234+1); hacct showed each component's own id, and nothing said which job it
    was part of. Sync keeps accounting's HetJobId and HetJobOffset (schema v11): JobID shows
    N+K, JobIDRaw the own id, --json both; -j N lists the components from the ledger (Slurm
    unreachable here), -j of a component's own id that component, and -j N+K (looked up in
    Slurm's accounting, as sacct takes it) that one. Slurm's answers: the recorded sacct --json
    -j HETJOBID of a finished two-component job (22.05: plain numbers; 25.11: set/number)."""
    from slurm_horus.ledger.sync import sync
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm.accounting import parse_sacct_json

    fix = Path(__file__).parent / "fixtures" / fixtures
    f = next(f for f in json.loads((fix / "index.json").read_text())["fixtures"]
             if f["name"] == "sacct_json_finished_het")
    recorded = (fix / f["stdout"]).read_text()
    het = f["het_job_id"]
    jobs = {j["het"][1]: j for j in parse_sacct_json(recorded)}
    lead, comp = jobs[0]["job_id"], jobs[1]["job_id"]
    assert lead == het != comp and jobs[1]["het"] == (het, 1)
    cluster = jobs[0]["cluster"]
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    for jid in (lead, comp):  # hsubmit's records: sync records the runs of jobs it knows
        L.record_submission(job_id=jid, cluster=cluster, user="root", submit_time=1700000000,
                            predictions={"t4": {"util_pct": 10.0, "mem_mib": 1000.0}})
    assert sync(L, sacct_json=recorded, node_types={"gpu-t4": "t4"})["recorded"] == 2
    L.close()
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: (
        f"ClusterName = {cluster}\nPrivateData = none\n" if args[0] != "sacct"
        else (_ for _ in ()).throw(HorusError("sacct: command not found"))))

    def listed(*args):
        r = CliRunner().invoke(main, ["--ledger", u, *args, "-P", "-n", "-o", "JobID,JobIDRaw"])
        assert r.exit_code == 0, r.output
        return sorted(r.output.split())
    both = [f"{het}+0|{lead}", f"{het}+1|{comp}"]
    assert listed("-j", str(het)) == both  # from the ledger: Slurm cannot answer here
    assert listed("-a", *ALL) == both
    assert listed("-j", str(comp)) == [f"{het}+1|{comp}"]
    r = CliRunner().invoke(main, ["--ledger", u, "-j", str(het), "--json"])
    assert sorted((j["job_id"], j["het_job_id"], j["het_job_offset"]) for j in json.loads(r.output)) == \
        [(lead, het, 0), (comp, het, 1)]
    r = CliRunner().invoke(main, ["--ledger", u, "-j", str(het), "-o", "JobID%12,JobIDRaw"])
    assert r.exit_code == 0 and f"{het}+1".rjust(12) in r.output, r.output
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: (
        recorded if args[0] == "sacct" else f"ClusterName = {cluster}\nPrivateData = none\n"))
    assert listed("-j", f"{het}+1") == [f"{het}+1|{comp}"]
    assert listed("-j", f"{het}+0") == [f"{het}+0|{lead}"]
