"""Actual use from sacct --json: 22.05 and 25.11 (recorded), 23.02 (hand-made) layouts; sync."""

import copy
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger
from slurm_horus.ledger.claims import open_as_owner
from slurm_horus.ledger.publish import RECORD_HEADER, claim_record
from slurm_horus.ledger.sync import colocations, sync
from slurm_horus.slurm.accounting import gres_placement, num, parse_job, parse_sacct_json, size_mib

FIX = Path(__file__).parent / "fixtures"
F2302 = FIX / "sacct" / "sacct_23.02_v0.0.39.json"
F2205 = FIX / "slurm" / "sacct_json_finished_shard.stdout"
F2511 = FIX / "slurm-25.11" / "sacct_json_finished.stdout"  # recorded: the shard and 2-GPU jobs
IDS2511 = json.loads((FIX / "slurm-25.11" / "index.json").read_text())["job_ids"]
SHARD_JOB, GPU_JOB = IDS2511["finished_shard_job"], IDS2511["finished_gpu_job"]


def test_sizes_and_tres_strings():
    assert size_mib("36266M") == 36266
    assert size_mib("1.5G") == 1536
    assert size_mib("40777023488") == pytest.approx(38888.0, abs=1)
    assert size_mib(40777023488) == pytest.approx(38888.0, abs=1)
    assert size_mib("512K") == 0.5
    with pytest.raises(HorusError):
        size_mib("lots")

    def step(mx, av=None, elapsed=10):
        return {"time": {"elapsed": elapsed}, "tres": {"requested": {"max": mx, "average": av}}}
    # TRESUsageIn in its text form, as sacct prints it outside --json
    j = parse_job({"job_id": 1, "steps": [
        step("cpu=00:01:00,gres/gpumem=36266M,gres/gpuutil=100",
             "gres/gpumem=30000M,gres/gpuutil=63"),
        step("gres/gpumem=40777023488,gres/gpuutil=7", "gres/gpuutil=3", elapsed=30)]})
    assert (j["util_max"], j["mem_peak_mib"]) == (100.0, pytest.approx(38888.0, abs=1))
    assert j["util_mean"] == pytest.approx((63 * 10 + 3 * 30) / 40)  # weighted by step time


def test_num_reads_plain_and_data_parser_numbers():
    assert num(7) == 7 and num("12") == 12 and num("1.5") == 1.5
    assert num({"set": True, "infinite": False, "number": 42}) == 42
    assert num({"set": False, "infinite": False, "number": 0}) is None
    assert num({"set": True, "infinite": True, "number": 0}) is None
    assert num(None) is None and num(True) is None and num("n/a") is None


def test_gres_placement():
    assert gres_placement(["shard:30(IDX:0)"]) == (None, 0)
    assert gres_placement(["gpu:a100:1(IDX:2)"]) == ("a100", 2)
    assert gres_placement("shard:a100:25(IDX:3)") == ("a100", 3)
    assert gres_placement(["gpu:a100:2(IDX:1-2)"]) == ("a100", 1)
    # 25.11 prints a shard job's per-GPU counts: the index is the GPU it holds shards of
    assert gres_placement(["shard:23(23/100,0/100)"]) == (None, 0)
    assert gres_placement(["shard:66(0/100,66/100)"]) == (None, 1)
    assert gres_placement(["license:2", "gpu:t4:1(IDX:1)"]) == ("t4", 1)
    assert gres_placement([]) == (None, None) and gres_placement(None) == (None, None)


def test_parse_2205_recorded():
    (j,) = parse_sacct_json(F2205.read_text())
    ids = json.loads((FIX / "slurm" / "index.json").read_text())["job_ids"]
    assert j["job_id"] == ids["finished_shard_job"] and j["state"] == "COMPLETED" and j["shards"] > 0
    assert j["node"] in ("gpu-a100", "gpu-t4") and j["elapsed_s"] >= 2
    assert j["admin_comment"].startswith("horus: shared")  # recorded with the hook in slurmctld
    assert j["util_mean"] is None and j["mem_peak_mib"] is None  # 22.05 has no gpuutil/gpumem


def test_parse_2302_gpu_tres():
    jobs = {j["job_id"]: j for j in parse_sacct_json(F2302.read_text())}
    assert jobs[101]["util_mean"] == 45 and jobs[101]["util_max"] == 97
    assert jobs[101]["mem_peak_mib"] == 5230 and jobs[101]["shards"] == 30
    assert jobs[102]["mem_peak_mib"] == pytest.approx(36260.48, abs=0.01)
    assert jobs[103]["state"] == "FAILED" and jobs[103]["gpu_index"] is None


def test_parse_2511_recorded():
    """Real 25.11 sacct --json: no gres_detail (no index, no type), comments under comment.*,
    a whole-GPU job counted in GPUs and a shard job in shards, never one for the other."""
    jobs = {j["job_id"]: j for j in parse_sacct_json(F2511.read_text())}
    assert set(jobs) == {SHARD_JOB, GPU_JOB}
    s, g = jobs[SHARD_JOB], jobs[GPU_JOB]
    assert (s["shards"], s["gpus"], g["gpus"], g["shards"]) == (23, None, 2, None)
    assert s["node"] == "gpu-t4" and g["node"] == "gpu-a100" and s["cluster"] == "horus"
    assert s["gpu_index"] is None and s["gpu_type"] is None and s["state"] == "COMPLETED"
    assert s["comment"].endswith("horus:v1;a100=20/2000/2500;t4=20/2000/2500")
    assert s["admin_comment"].startswith("horus: shared any shards=23/100")
    assert g["admin_comment"] is None and g["comment"] == "fixture-gpu-done"
    assert s["end_time"] - s["start_time"] == 2 and s["cpus"] == 1 and s["user"] == "root"


def _recorded(job_id: int) -> dict:
    """A copy of one recorded 25.11 job (sacct --json layout)."""
    (j,) = [j for j in json.loads(F2511.read_text())["jobs"] if j["job_id"] == job_id]
    return j


def test_unset_times_and_typed_tres():
    """A job that never started carries start = 4294967294 (and end may be INFINITE): None,
    never a time in 2106; typed-only TRES give the count and the type."""
    j = _recorded(SHARD_JOB)
    j["time"]["start"], j["time"]["end"] = 4294967294, {"set": True, "infinite": False,
                                                        "number": 4294967295}
    j["state"]["current"] = ["CANCELLED"]
    g = _recorded(GPU_JOB)
    g["tres"]["allocated"] = [t for t in g["tres"]["allocated"] if t["type"] != "gres"] + [
        {"type": "gres", "name": "gpu:a100", "id": 1005, "count": 2}]
    jobs = {x["job_id"]: x for x in parse_sacct_json({"jobs": [j, g]})}
    assert jobs[SHARD_JOB]["start_time"] is None and jobs[SHARD_JOB]["end_time"] is None
    assert (jobs[GPU_JOB]["gpus"], jobs[GPU_JOB]["shards"], jobs[GPU_JOB]["gpu_type"]) == \
        (2, None, "a100")


# --- GPU use per GPU from Slurm's per-task TRESUsageIn ---------------------------------------
# No recording has gres/gpumem or gres/gpuutil (the test clusters have no GPU, so no gpu/nvml):
# these cases take the recorded 25.11 2-GPU job and MODIFY its parsed structure, each change
# marked, to the layouts Slurm writes (25.11 source: gpu_nvml.c gpu_p_usage_read sums one
# process's own memory / SM utilization over the GPUs it uses; common_jag.c sums a task's
# processes and keeps its latest sample (Tot) and its maximum (Max); jobacct_gather.c takes the
# max over tasks and sums Tot; as_mysql_job.c stores Ave = Tot / the step's tasks, 1 for batch).
GIB = 2 ** 30


def _gres(name: str, count) -> dict:
    return {"type": "gres", "name": name, "id": 1003 if name == "gpumem" else 1004, "count": count}


def _use_step(base: dict, step: str, *, tasks: int, gpus: int | None, nodes: int = 1,
              mem_max: int, mem_tot: int, util_max: float, util_tot: float,
              elapsed: int = 600, shards: int | None = None) -> dict:
    """MODIFIED copy of a recorded step: id, tasks, nodes, its allocated GPUs (or shards) and
    TRESUsageIn gpumem/gpuutil (Max per task, Tot summed over tasks, Ave = Tot / tasks)."""
    st = copy.deepcopy(base)
    st["step"]["id"] = f"198.{step}"                                          # MODIFIED
    st["tasks"]["count"] = tasks                                              # MODIFIED
    st["nodes"]["count"] = nodes                                              # MODIFIED
    st["time"]["elapsed"] = elapsed                                           # MODIFIED
    alloc = [t for t in st["tres"]["allocated"] if t["type"] != "gres"]
    if gpus:
        alloc.append({"type": "gres", "name": "gpu", "id": 1001, "count": gpus})
    if shards:
        alloc.append({"type": "gres", "name": "shard", "id": 1002, "count": shards})
    st["tres"]["allocated"] = alloc                                           # MODIFIED
    st["tres"]["requested"] = {                                               # MODIFIED
        "max": [_gres("gpumem", mem_max), _gres("gpuutil", util_max)],
        "min": [],
        "average": [_gres("gpumem", mem_tot // tasks), _gres("gpuutil", util_tot / tasks)],
        "total": [_gres("gpumem", mem_tot), _gres("gpuutil", util_tot)]}
    return st


def _gpu_job_with(gpus: int, *steps, nodes: int = 1, shards: int | None = None, job_id: int = 198,
                  comment: str | None = None) -> dict:
    """The recorded 2-GPU job MODIFIED to hold ``gpus`` GPUs (or ``shards``) on ``nodes`` nodes
    and to have ``steps`` (each a _use_step keyword dict) instead of its recorded batch step."""
    j = _recorded(GPU_JOB)
    base = j["steps"][0]
    j["job_id"] = job_id                                                      # MODIFIED
    alloc = [t for t in j["tres"]["allocated"] if t["type"] != "gres"]
    alloc.append({"type": "gres", "name": "shard", "id": 1002, "count": shards} if shards else
                 {"type": "gres", "name": "gpu", "id": 1001, "count": gpus})
    j["tres"]["allocated"] = alloc                                            # MODIFIED
    j["allocation_nodes"] = nodes                                             # MODIFIED
    j["steps"] = [_use_step(base, **s) for s in steps]                        # MODIFIED
    if comment is not None:
        j["comment"]["job"] = comment                                         # MODIFIED
    return j


def _per_gpu(j: dict) -> tuple:
    """(util mean, util max, memory MiB) per GPU: parse_job's figures are summed over the
    job's GPUs, as a usage row holds them (merge_job divides by them)."""
    p = parse_job(j)
    n = p["gpus"] if p["gpus"] and p["gpus"] > 1 else 1
    return tuple(None if p[k] is None else round(p[k] / n, 3)
                 for k in ("util_mean", "util_max", "mem_peak_mib"))


def test_gpu_use_per_gpu_follows_the_steps_layout():
    """Slurm's Max/Ave are per task: a task's own processes over the GPUs it holds. Divided by
    the GPUs a task held, never by all the job's GPUs."""
    # one task (the batch script, e.g. torchrun) on 4 GPUs, 10 GiB and 80 % on each
    one_task = _gpu_job_with(4, dict(step="batch", tasks=1, gpus=4, mem_max=40 * GIB,
                                     mem_tot=40 * GIB, util_max=320, util_tot=320))
    assert _per_gpu(one_task) == (80.0, 80.0, 10240.0)
    # srun: 4 tasks x 1 GPU, each 10 GiB and 80 % (the review's case: was 2560 MiB and 20 %)
    four_tasks = _gpu_job_with(4, dict(step="0", tasks=4, gpus=4, mem_max=10 * GIB,
                                       mem_tot=40 * GIB, util_max=80, util_tot=320))
    assert _per_gpu(four_tasks) == (80.0, 80.0, 10240.0)
    # two nodes x 2 GPUs, one task per node on both its GPUs: 8 GiB and 70 % per GPU (was /4)
    two_nodes = _gpu_job_with(4, dict(step="0", tasks=2, gpus=4, nodes=2, mem_max=16 * GIB,
                                      mem_tot=32 * GIB, util_max=140, util_tot=280), nodes=2)
    assert _per_gpu(two_nodes) == (70.0, 70.0, 8192.0)
    # 8 tasks on 4 GPUs, two per GPU at 5 GiB / 40 % each: a GPU holds their sum
    shared = _gpu_job_with(4, dict(step="0", tasks=8, gpus=4, mem_max=5 * GIB, mem_tot=40 * GIB,
                                   util_max=40, util_tot=320))
    assert _per_gpu(shared) == (80.0, 80.0, 10240.0)
    # a shard job's two tasks on its one GPU at 3 GiB each
    on_shards = _gpu_job_with(0, dict(step="0", tasks=2, gpus=None, shards=30, mem_max=3 * GIB,
                                      mem_tot=6 * GIB, util_max=25, util_tot=50), shards=30)
    assert _per_gpu(on_shards) == (50.0, 50.0, 6144.0)
    # 3 tasks on 4 GPUs: which task held 2 is unknown, so none is divided (never under-reports)
    uneven = _gpu_job_with(4, dict(step="0", tasks=3, gpus=4, mem_max=12 * GIB,
                                   mem_tot=24 * GIB, util_max=90, util_tot=180))
    assert _per_gpu(uneven)[2] == 12288.0
    # a step whose allocation names no GPU: the job's GPUs per node on the step's node
    no_alloc = _gpu_job_with(4, dict(step="0", tasks=1, gpus=None, nodes=1, mem_max=20 * GIB,
                                     mem_tot=20 * GIB, util_max=160, util_tot=160), nodes=2)
    assert _per_gpu(no_alloc) == (80.0, 80.0, 10240.0)


def test_a_step_that_never_touched_a_gpu_does_not_dilute_the_mean():
    """A batch script that only runs srun (its processes hold no GPU memory) and an extern step
    that pam_slurm_adopt gave a process report gres/gpuutil=0 and gres/gpumem=0 over the whole
    job: the GPU step's mean stands. A job whose every step says 0 used no GPU."""
    idle = dict(tasks=1, gpus=2, mem_max=0, mem_tot=0, util_max=0, util_tot=0, elapsed=1000)
    j = _gpu_job_with(2, dict(step="extern", **{**idle, "tasks": 1}), dict(step="batch", **idle),
                      dict(step="0", tasks=2, gpus=2, mem_max=6 * GIB, mem_tot=12 * GIB,
                           util_max=90, util_tot=120, elapsed=500))
    assert _per_gpu(j) == (60.0, 90.0, 6144.0)
    nothing = _gpu_job_with(2, dict(step="batch", **idle))
    assert _per_gpu(nothing) == (0.0, 0.0, 0.0)


def test_sync_audits_a_per_task_job_per_gpu(tmp_path):
    """Through sync and the jobs row: 4 tasks x 1 GPU at 10 GiB each against a 2200 MiB claim
    is an under-claim (recorded per GPU as 10240 MiB and 80 %)."""
    j = _gpu_job_with(4, dict(step="0", tasks=4, gpus=4, mem_max=10 * GIB, mem_tot=40 * GIB,
                              util_max=80, util_tot=320),
                      comment="horus:v1;a100=80/2200/2200")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    sync(L, sacct_json={"jobs": [j]}, all_jobs=True, node_types={"gpu-a100": "a100"})
    (row,) = L.jobs()
    assert (row["gpus"], row["act_mem_mib"], row["act_util_pct"]) == (4, 10240.0, 80.0)
    assert row["under_claim"] == 1 and "mem" in row["claim_flags"]


def test_colocations_respect_gpu_index():
    js = [{"cluster": "c", "job_id": 1, "node": "n", "gpu_index": 0, "start_time": 0, "end_time": 10},
          {"cluster": "c", "job_id": 2, "node": "n", "gpu_index": 0, "start_time": 5, "end_time": 20},
          {"cluster": "c", "job_id": 3, "node": "n", "gpu_index": 1, "start_time": 5, "end_time": 20},
          {"cluster": "c", "job_id": 4, "node": "n", "gpu_index": 0, "start_time": 20, "end_time": 30}]
    co = colocations(js)
    assert co == {("c", 1): {2}, ("c", 2): {1}}


def test_colocations_whole_gpu_jobs_share_with_no_one():
    """Slurm gives a GPU allocated as gpu (one or several) to that job alone: only shard jobs
    share, compared by index where known, else by node."""
    js = [{"cluster": "c", "job_id": 1, "node": "n", "gpu_index": 0, "gpus": 2, "start_time": 0,
           "end_time": 10},
          {"cluster": "c", "job_id": 2, "node": "n", "gpus": 1, "start_time": 0, "end_time": 10},
          {"cluster": "c", "job_id": 3, "node": "n", "shards": 30, "start_time": 5, "end_time": 9},
          {"cluster": "c", "job_id": 4, "node": "n", "shards": 40, "start_time": 6, "end_time": 9}]
    assert colocations(js) == {("c", 3): {4}, ("c", 4): {3}}


def test_sync_recorded_2511_all_and_idempotent(tmp_path):
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    types = {"gpu-a100": "a100", "gpu-t4": "t4"}
    res = sync(L, sacct_json=F2511.read_text(), node_types=types)
    assert res["recorded"] == 1 and res["claims"] == 1  # only the shard job carries a hint
    res = sync(L, sacct_json=F2511.read_text(), all_jobs=True, node_types=types)
    assert res["recorded"] == 2 and L.count("usage") == 2 and L.count("jobs") == 2
    jobs = {j["job_id"]: j for j in L.jobs()}
    s, g = jobs[SHARD_JOB], jobs[GPU_JOB]
    assert (s["shards"], s["gpus"], g["gpus"], g["shards"]) == (23, None, 2, None)
    assert s["gpu_type"] == "t4" and s["pred_util_pct"] == 20 and s["predictor"] == "hint"
    assert g["gpu_type"] == "a100" and g["state"] == "COMPLETED"
    assert s["colocated"] is None and g["colocated"] is None  # other nodes
    assert s["gpu_index"] is None  # accounting has none, and no probe ran


@pytest.mark.parametrize("version", ["slurm", "slurm-25.11"])
def test_hacct_j_names_an_arrays_tasks_as_sacct_does(tmp_path, version, monkeypatch):
    """A recorded two-task array (one task keeps the array's id, the other has its own):
    sync keeps each task's ArrayJobId, and hacct -j ARRAYID lists both tasks, as sacct -j
    does (it listed only the task whose own id is the array's); a task's own id still names
    that task alone."""
    from click.testing import CliRunner

    from slurm_horus.cli.hacct import main

    meta = {f["name"]: f for f in json.loads((FIX / version / "index.json").read_text())["fixtures"]}
    aid = meta["sacct_json_finished_array"]["array_job_id"]
    text = (FIX / version / "sacct_json_finished_array.stdout").read_text()
    tasks = {j["array"]: j["job_id"] for j in parse_sacct_json(text)}
    assert set(tasks) == {(aid, 1), (aid, 2)} and len(set(tasks.values())) == 2 and aid in tasks.values()
    url = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(url, spool=str(tmp_path / "sp"))
    assert sync(L, sacct_json=text, node_types={"gpu-a100": "a100", "gpu-t4": "t4"})["recorded"] == 2
    L.close()

    def listed(ids):
        r = CliRunner().invoke(main, ["--ledger", url, "-M", "all", "-j", ids, "-P", "-n", "-o", "JobIDRaw"])
        assert r.exit_code == 0, r.output
        return sorted(int(x) for x in r.output.split())
    assert listed(str(aid)) == sorted(tasks.values())
    assert listed(str(tasks[aid, 1])) == [tasks[aid, 1]]
    r = CliRunner().invoke(main, ["--ledger", url, "-M", "all", "-j", str(aid), "-P", "-n", "-o", "JobIDRaw,ArrayJobID"])
    assert sorted(r.output.split()) == sorted(f"{t}|{aid}" for t in tasks.values())
    # and which task each row is (v10: the row whose own id is the array's is not task 1 here),
    # its JobID as sacct prints it, ArrayJobId_ArrayTaskId (it had been the task's own id)
    r = CliRunner().invoke(main, ["--ledger", url, "-M", "all", "-j", str(aid), "-P", "-n", "-o",
                                  "JobID,JobIDRaw,ArrayJobID,ArrayTaskID"])
    assert sorted(r.output.split()) == sorted(f"{a}_{t}|{own}|{a}|{t}" for (a, t), own in tasks.items())

    # the task that has the array's id, named ArrayJobId_TaskId, is that task alone (it listed
    # the whole array, as -j ARRAYID does); the ids come from accounting, here the recording
    from slurm_horus.slurm import commands as slurm

    (first,) = [t for (_, t), own in tasks.items() if own == aid]
    monkeypatch.setattr(slurm, "array_task_job_ids", lambda pairs, cluster=None: {p: tasks[p] for p in pairs})
    assert listed(f"{aid}_{first}") == [aid]
    assert listed(f"{aid}_{3 - first},{aid}_{first}") == sorted(tasks.values())


def test_a_long_job_beside_thousands_lists_at_most_max_colocated(tmp_path):
    """A week-long shard job on a busy node (no GPU index: every overlapping shard job there
    counts) had a co-located list past MariaDB's 64 kB TEXT: every later sync failed. At most
    MAX_COLOCATED ids are kept, in the job's own sync and when later jobs join it."""
    from slurm_horus.ledger.records import MAX_COLOCATED

    base = _recorded(SHARD_JOB)

    def job(jid, start, end):
        j = json.loads(json.dumps(base))
        j["job_id"], j["time"]["start"], j["time"]["end"] = jid, start, end
        return j
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    short = [job(10000 + i, 1000 + i, 1000 + i + 60) for i in range(MAX_COLOCATED + 200)]
    sync(L, sacct_json={"jobs": [*short, job(500, 900, 900 + 7 * 86400)]}, all_jobs=True)
    co = {r["job_id"]: r["colocated"] for r in L.jobs()}
    assert co[500].split(",") == [str(10000 + i) for i in range(MAX_COLOCATED)]
    later = [job(20000 + i, 5000 + i, 5000 + i + 60) for i in range(50)]
    assert sync(L, sacct_json={"jobs": later}, all_jobs=True)["colocated_updates"] == 0
    assert {r["job_id"]: r["colocated"] for r in L.jobs()}[500] == co[500]
    assert "500" in {r["job_id"]: r["colocated"] for r in L.jobs()}[20000].split(",")


def test_sync_takes_a_jobs_newest_run_and_carries_running_jobs_before_pending_ones(tmp_path, monkeypatch):
    """sacct -D lists every run of a requeued job, oldest last: the last record read won, and
    the job was recorded as its NODE_FAIL run. Open jobs are capped at MAX_OPEN_JOBS: one user's
    pending jobs had pushed a running job out of them."""
    from slurm_horus.ledger import sync as sync_mod
    from slurm_horus.slurm import commands as slurm

    new = _recorded(SHARD_JOB)
    old = json.loads(json.dumps(new))
    old["time"]["submission"] -= 5000
    old["time"]["start"], old["time"]["end"] = new["time"]["start"] - 4000, new["time"]["start"] - 3000
    old["state"]["current"] = ["NODE_FAIL"]
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    sync(L, sacct_json={"jobs": [new, old]}, all_jobs=True)
    (j,) = L.jobs()
    assert (j["state"], j["start_time"]) == ("COMPLETED", new["time"]["start"])

    def job(i, state):
        j = json.loads(json.dumps(new))
        j["job_id"], j["state"]["current"] = i, [state]
        return j
    flood = [*(job(100000 + i, "PENDING") for i in range(sync_mod.MAX_OPEN_JOBS)), job(5, "RUNNING")]
    monkeypatch.setattr(slurm, "accounting_jobs", lambda since, until: parse_sacct_json(json.dumps({"jobs": flood})))
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: "horus")
    sync(L, since=time.time() - 60)
    carried = sync_mod._open_jobs(L, "horus")
    assert ("horus", 5) in carried and len(carried) == sync_mod.MAX_OPEN_JOBS


def test_sync_takes_gpu_index_and_type_from_the_probe(tmp_path):
    """25.11 accounting has no GPU index: the probe's (same cluster and job id) reaches the
    jobs row, its GPU type beats the node's, and co-location goes by that index."""
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    base = _recorded(SHARD_JOB)
    jobs = []
    for jid, start in ((501, 1000), (502, 1010), (503, 1010), (504, 1010)):
        j = json.loads(json.dumps(base))
        j["job_id"], j["time"]["start"], j["time"]["end"] = jid, start, start + 100
        jobs.append(j)
    # 501 and 502 on GPU 1, 503 on GPU 0; 504 has no probe row (index unknown: by node)
    for jid, idx in ((501, 1), (502, 1), (503, 0)):
        L.record_usage(job_id=jid, cluster="horus", source="probe", util_mean=30.0,
                       mem_peak_mib=2000, node="gpu-t4", gpu_index=idx, gpu_type="t4")
    res = sync(L, sacct_json={"jobs": jobs}, node_types={"gpu-t4": "not-this"})
    assert res["recorded"] == 4
    rows = {j["job_id"]: j for j in L.jobs()}
    assert [rows[k]["gpu_index"] for k in (501, 502, 503, 504)] == [1, 1, 0, None]
    assert [rows[k]["gpu_type"] for k in (501, 502, 503, 504)] == ["t4", "t4", "t4", "not-this"]
    assert rows[501]["sources"] == "sacct,probe" and rows[501]["shards"] == 23
    assert rows[501]["colocated"] == "502,504" and rows[502]["colocated"] == "501,504"
    assert rows[503]["colocated"] == "504" and rows[504]["colocated"] == "501,502,503"
    # the sacct rows keep only what accounting said
    from sqlalchemy import select

    from slurm_horus.ledger import tables

    u = tables()["usage"]
    with L.engine.connect() as conn:
        got = conn.execute(select(u.c.gpu_index, u.c.gpu_type).where(
            u.c.source == "sacct", u.c.job_id == 501)).one()
    assert tuple(got) == (None, None)


def test_a_probe_of_a_requeued_jobs_earlier_run_leaves_the_node_its_gpu_type(tmp_path):
    """Any probe row kept sync from the node's GPU type, and merge_job then dropped an earlier
    run's row: the job was left with no type (out of history and training) and that run's
    GPU index."""
    job = _recorded(SHARD_JOB)
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    L.record_usage(job_id=SHARD_JOB, cluster="horus", source="probe", util_mean=40.0,
                   mem_peak_mib=3000.0, node="gpu-t4", gpu_type="a100", gpu_index=1, shards=23,
                   start_time=job["time"]["start"] - 200, end_time=job["time"]["start"] - 100)
    sync(L, sacct_json={"jobs": [job]}, node_types={"gpu-t4": "t4"})
    (j,) = L.jobs()
    assert (j["gpu_type"], j["gpu_index"], j["sources"]) == ("t4", None, "sacct")


def test_sync_by_default_jobs_with_claims_or_known(tmp_path):
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    res = sync(L, sacct_json=F2302.read_text(), node_types={"gpu-a100": "a100"})
    assert res["recorded"] == 2 and L.count("jobs") == 2  # 101, 102 carry hints; 103 not
    j = {j["job_id"]: j for j in L.jobs()}[102]
    assert j["gpu_type"] == "a100" and j["shards"] == 50 and j["gpus"] is None
    assert j["act_util_pct"] == 70 and j["act_util_max"] == 100
    assert j["act_mem_mib"] == pytest.approx(36260.48, abs=0.01)
    assert j["user_name"] == "bob" and j["pred_util_pct"] == 65 and j["predictor"] == "hint"
    # a job the ledger already knows (a probe measured it) is recorded without a hint
    L.record_usage(job_id=103, cluster="gpucl", source="probe", util_mean=15.0, mem_peak_mib=900)
    assert sync(L, sacct_json=F2302.read_text())["recorded"] == 3
    j = {j["job_id"]: j for j in L.jobs()}[103]
    assert j["user_name"] == "alice" and j["sources"] == "sacct,probe"
    assert j["act_util_pct"] == 15.0 and j["state"] == "FAILED"  # the probe's use wins
    assert L.count("jobs") == 3 and L.count("submissions") == 3


def test_sync_cli_from_file(tmp_path):
    from click.testing import CliRunner

    from slurm_horus.cli.admin_ledger import sync as sync_cmd

    url = f"sqlite:///{tmp_path}/l.db"
    policy = _policy(tmp_path)
    r = CliRunner().invoke(sync_cmd, ["--ledger", url, "--from-file", str(F2302), "--all",
                                      "--policy", policy, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["recorded"] == 3
    r = CliRunner().invoke(sync_cmd, ["--ledger", url, "--from-file", str(F2302), "--policy",
                                      policy])
    assert r.exit_code == 0, r.output
    # 103 (no hint) is known to the ledger since the --all run: recorded again
    # (a warning may come first: without a Slurm to say PrivateData, sync writes per-user
    # extracts, and this host knows neither user of the recorded jobs)
    assert any(line.startswith("sync: 3 of 3 finished jobs recorded (2 with claims, 0 with ")
               for line in r.output.splitlines()), r.output
    r = CliRunner().invoke(sync_cmd, ["--ledger", url, "--from-file", str(tmp_path / "nope")])
    assert r.exit_code != 0 and "error" in r.output


def _policy(tmp_path) -> str:
    """A policy that sends the claim record into tmp_path (never the machine's own)."""
    pol = tmp_path / "policy.conf"
    pol.write_text(f"record_file = {tmp_path / 'record'}\nunderclaim_window_days = 30\n")
    return str(pol)


ZOO = Path(__file__).parent / "data" / "zoo"
T0 = int(time.time()) - 3600


def _job(jid, comment="", *, user="root", admin="", shards=None, gpus=None, util=None, mem=None,
         node="gpu-a100", start=T0):
    """One finished job as sacct --json (data_parser v0.0.39) prints it."""
    alloc = [{"type": "cpu", "name": None, "count": 1}]
    alloc += [{"type": "gres", "name": n, "count": c} for n, c in (("shard", shards), ("gpu", gpus)) if c]
    steps = []
    if util is not None:
        steps = [{"time": {"elapsed": 100}, "tres": {"requested": {
            "max": [{"type": "gres", "name": "gpuutil", "count": util},
                    {"type": "gres", "name": "gpumem", "count": int(mem * 2 ** 20)}],
            "average": [{"type": "gres", "name": "gpuutil", "count": util}]}}}]
    return {"job_id": jid, "user": user, "account": "ml", "cluster": "gpucl",
            "comment": {"job": comment, "administrator": admin, "system": ""},
            "time": {"elapsed": 100, "submission": start - 10, "start": start, "end": start + 100},
            "tres": {"allocated": alloc}, "nodes": node, "state": {"current": ["COMPLETED"]},
            "steps": steps}


def _claim(model, bs=8, **extra):
    """A hint and a workload token as hsubmit writes them, for ``model``."""
    import hashlib

    from slurm_horus.slurm.hint import encode_workload

    sha = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    return ("mine horus:v1;a100=30/4000/4500;t4=60/4000/4500 " +
            encode_workload({"sha": sha, "bs": bs, "task": "train", "opt": "adam", "prec": "fp32",
                             "model": str(model), **extra}))


def test_sync_builds_rows_from_slurm_facts_and_claims(tmp_path):
    """Facts from sacct, claims from the comment, features recomputed only from a file whose
    sha256 is the claimed one; one row per job however often and however it is synced."""
    model = tmp_path / "small_cnn.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    changed = tmp_path / "changed.onnx"
    shutil.copy(ZOO / "mobilenet_v2.onnx", changed)
    lie = _claim(changed).replace("model=" + str(changed), "model=" + str(model))
    jobs = [_job(301, _claim(model), admin="horus: shared a100 shards=30", shards=30,
                 util=35, mem=4200),
            _job(302, lie, shards=20),                  # the sha is not the file's
            _job(303, _claim(model, bs=16), gpus=1),    # a whole GPU
            _job(304, "", shards=10),                   # no claim: only with --all
            _job(305, "", node="cpu-1")]                # no GPU: never
    data = {"jobs": jobs}
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    res = sync(L, sacct_json=data, node_types={"gpu-a100": "a100"})
    assert (res["recorded"], res["claims"], res["features"]) == (3, 3, 2)
    s = L.submission("gpucl", 301)
    assert s["user_name"] == "root" and s["uid"] == 0 and s["account"] == "ml"
    assert s["submit_time"] == T0 - 10 and s["policy_decision"] == "horus: shared a100 shards=30"
    assert s["hint"] == "horus:v1;a100=30/4000/4500;t4=60/4000/4500"
    assert s["model_path"] == str(model) and s["model_family"] == "small_cnn"
    wl = json.loads(s["workload"])
    assert wl["batch_size"] == 8 and wl["optimizer"] == "adam"
    feats = json.loads(s["features"])
    from slurm_horus.graph.features import extract_features

    assert feats == extract_features(model, batch_size=8).values and s["feature_version"] == 1
    preds = json.loads(s["predictions"])
    assert preds["a100"]["util_pct"] == 30 and preds["a100"]["predictor"] == "hint"
    assert preds["a100"]["cold"]["mem_mib"] > 0 and preds["t4"]["cold"]["util_pct"] > 0
    assert L.submission("gpucl", 302)["features"] is None  # a claim, kept as a claim
    assert L.submission("gpucl", 302)["model_sha256"] is not None
    j = {r["job_id"]: r for r in L.jobs()}
    assert j[301]["shards"] == 30 and j[301]["gpus"] is None and j[301]["pred_util_pct"] == 30
    assert j[301]["act_util_pct"] == 35 and j[301]["gpu_type"] == "a100"
    assert j[303]["gpus"] == 1 and j[303]["shards"] is None
    assert json.loads(L.submission("gpucl", 303)["workload"])["batch_size"] == 16
    # again, and with --all: nothing twice
    assert sync(L, sacct_json=data, all_jobs=True)["recorded"] == 4
    assert sync(L, sacct_json=data, all_jobs=True)["recorded"] == 4
    assert L.count("jobs") == 4 and L.count("submissions") == 4 and L.count("usage") == 4
    assert L.submission("gpucl", 304)["hint"] is None and j[301]["cluster"] == "gpucl"


@pytest.fixture()
def open_dir():
    """A folder under /tmp that every user may search (pytest's own tmp_path is 0700)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="horus-test-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def test_sync_drops_rows_users_wrote_under_an_empty_cluster(tmp_path):
    """Before 0.2 hsubmit keyed its own rows by cluster "" (sbatch --parsable's): once sacct's
    row exists, one row per job remains."""
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    L.record_submission(job_id=701, cluster="", user="root", features={"flops": 1.0})
    L.record_usage(job_id=701, cluster="", source="probe", util_mean=1.0)
    L.record_submission(job_id=702, cluster="", user="root")  # not in this sync: kept
    sync(L, sacct_json={"jobs": [_job(701, "horus:v1;a100=30/4000/4500", shards=30)]})
    assert sorted((j["cluster"], j["job_id"]) for j in L.jobs()) == [("", 702), ("gpucl", 701)]
    assert L.count("usage") == 1 and L.count("submissions") == 2


def test_features_only_for_what_the_jobs_owner_can_read(tmp_path, open_dir, python_for_others):
    import pwd

    model = open_dir / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    nobody = pwd.getpwnam("nobody")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    data = {"jobs": [_job(401, _claim(model), user="nobody", shards=10)]}
    for mode, readable in ((0o600, 0), (0o644, 1)):
        os.chmod(model, mode)
        assert sync(L, sacct_json=data)["features"] == readable, oct(mode)
    assert L.submission("gpucl", 401)["uid"] == nobody.pw_uid
    os.chmod(open_dir, 0o700)  # the file is readable, the folder is not searchable
    assert sync(L, sacct_json=data)["features"] == 0


def test_sync_reads_no_more_of_a_named_file_than_a_graph_can_be(tmp_path):
    """A user names the file root hashes: a (sparse) file larger than an ONNX graph is not read,
    and one sync reads at most its byte budget of users' files."""
    import hashlib

    from slurm_horus.ledger.claims import ModelFeatures

    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(3 << 30)
    wl = {"batch_size": 8, "task": "train", "optimizer": "adam", "precision": "fp32", "dims": {}}
    from slurm_horus.ledger import claims

    hashed = []
    real_sha = claims._sha256
    claims._sha256 = lambda fd, size: hashed.append(size) or real_sha(fd, size)
    try:
        assert ModelFeatures().get({"model": str(big), "sha": "0" * 64}, wl, 0, {0}) is None
    finally:
        claims._sha256 = real_sha
    assert hashed == []  # refused by its size, not hashed
    model = tmp_path / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    claim = {"model": str(model), "sha": hashlib.sha256(model.read_bytes()).hexdigest()}
    assert ModelFeatures().get(claim, wl, 0, {0}) is not None
    assert ModelFeatures(hash_budget=model.stat().st_size - 1).get(claim, wl, 0, {0}) is None


def test_a_named_file_whose_read_fails_costs_only_that_jobs_features(tmp_path, monkeypatch):
    """/sys/class/net/lo/speed is a readable regular file whose every read fails (EINVAL): a
    workload token naming it stopped every sync with an internal OSError, for good (the window
    never moved).  The kernel's file systems are refused at open, and a read that fails anyway
    is no graph."""
    from slurm_horus.ledger import claims
    from slurm_horus.ledger.claims import ModelFeatures

    wl = {"batch_size": 8, "task": "train", "optimizer": "adam", "precision": "fp32", "dims": {}}
    odd = "/sys/class/net/lo/speed"
    if not os.path.isfile(odd):
        pytest.skip("no /sys/class/net/lo here")
    claim = {"model": odd, "sha": "0" * 64}
    assert claims.open_as_owner(odd, 0, {0}) is None  # sysfs: not a file system of files
    monkeypatch.setattr(claims, "_not_files", lambda fd: False)  # were it taken, its read fails
    assert ModelFeatures().get(claim, wl, 0, {0}) is None


def test_one_users_files_spend_only_their_own_read_budget(open_dir):
    """The byte budget was the sync's: one user naming large files left every later job of the
    sync, other users' too, without features."""
    import hashlib
    import pwd

    from slurm_horus.ledger.claims import ModelFeatures

    nobody = pwd.getpwnam("nobody")
    wl = {"batch_size": 8, "task": "train", "optimizer": "adam", "precision": "fp32", "dims": {}}
    model = open_dir / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    os.chmod(model, 0o644)
    big = open_dir / "big.onnx"
    big.write_bytes(b"x" * (model.stat().st_size + 10))
    os.chmod(big, 0o644)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    models = ModelFeatures(hash_budget=model.stat().st_size + 20)
    assert models.get({"model": str(big), "sha": sha}, wl, nobody.pw_uid, {nobody.pw_gid}) is None
    assert models.get({"model": str(model), "sha": sha}, wl, nobody.pw_uid, {nobody.pw_gid}) is None  # spent
    assert models.get({"model": str(model), "sha": sha}, wl, 0, {0}) is not None  # another user's


def test_open_as_owner_follows_unix_permissions(open_dir):

    tmp_path = open_dir
    d = tmp_path / "d"
    d.mkdir()
    f = d / "m.onnx"
    f.write_bytes(b"x")
    os.chown(f, 5000, 6000)
    me, group, other = (5000, {5000}), (5001, {6000}), (5002, {5002})

    def can(uid_gids, path=f):
        fd = open_as_owner(str(path), uid_gids[0], uid_gids[1])
        if fd is not None:
            os.close(fd)
        return fd is not None
    for mode, want in ((0o400, (True, False, False)), (0o040, (False, True, False)),
                       (0o004, (False, False, True)), (0o604, (True, False, True))):
        os.chmod(f, mode)
        assert (can(me), can(group), can(other)) == want, oct(mode)
    os.chmod(f, 0o444)
    os.chmod(d, 0o750)                      # the folder: owner root, group root
    assert not can(other) and can((0, set()))
    os.chmod(d, 0o755)
    (tmp_path / "link").symlink_to(f)       # a link is judged by what it points to
    os.chmod(f, 0o400)
    assert not can(other, tmp_path / "link") and can(me, tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")            # never opened (would block) nor read
    assert not can((0, set()), tmp_path / "fifo")
    assert not can((0, set()), "relative/m.onnx") and not can((None, set()))


def test_claim_record_counts_users_and_accounts():

    rows = [{"user_name": "ann", "uid": 1001, "account": "ml", "under_claims": 1, "jobs": 4},
            {"user_name": "ann", "uid": None, "account": "cv", "under_claims": 2, "jobs": 2},
            {"user_name": "bob", "uid": 1002, "account": "ml", "under_claims": 0, "jobs": 3},
            {"user_name": "bad name", "uid": 7, "account": None, "under_claims": 9, "jobs": 9}]
    text, users, accounts = claim_record(rows)
    # most under-claims first, users and accounts together; bob has none: not listed
    assert text == RECORD_HEADER + ("user 1001 ann 3 6\naccount - cv 2 2\naccount - ml 1 7\n")
    assert (users, accounts) == (1, 2)


def test_the_hook_reads_an_accounts_record_behind_thousands_of_users(tmp_path):
    # users without under-claims came first, and at ~2,400 of them the accounts' lines lay past
    # the 64 KiB the hook reads: an account over its limit shared on
    from slurm_horus.slurm.policy import decide

    rows = [{"user_name": f"u{i}", "uid": 10000 + i, "account": f"a{i % 50}", "under_claims": 0,
             "jobs": 3} for i in range(4000)]
    rows += [{"user_name": n, "uid": u, "account": "physics", "under_claims": 2, "jobs": 5}
             for n, u in (("m", 777), ("e", 778))]
    record = tmp_path / "record"
    record.write_text(claim_record(rows)[0])
    pol = tmp_path / "policy.conf"
    pol.write_text("gpu.t4.mem_mib = 15360\ntype_order = t4\ntype_features = t4\n"
                   f"underclaim_limit = 3\nrecord_file = {record}\n")
    d = decide({"comment": "horus:v1;t4=20/3000/3500", "tres_per_node": "gres/gpu:1",
                "account": "physics"}, policy_path=pol, submit_uid=999)
    assert d.action == "exclusive" and "account physics" in d.admin_comment, d.admin_comment


def test_sync_cli_reports_quarantined_spool_and_writes_the_record(tmp_path):
    from click.testing import CliRunner

    from slurm_horus.cli.admin_ledger import sync as sync_cmd
    from slurm_horus.ledger import Spool

    spool = Spool(os.environ["HORUS_SPOOL"])
    spool.put("usage", {"job_id": "not-a-number", "source": "probe"})
    spool.put("usage", {"job_id": 601, "cluster": "gpucl", "source": "probe", "util_mean": 90.0,
                        "mem_peak_mib": 40000.0})
    sacct = tmp_path / "sacct.json"
    sacct.write_text(json.dumps({"jobs": [
        _job(601, "horus:v1;a100=65/30000/34000", user="bob", shards=50),
        _job(602, "horus:v1;a100=95/50000/50000", user="bob", shards=90, util=50, mem=1000)]}))
    url = f"sqlite:///{tmp_path}/l.db"
    r = CliRunner().invoke(
        sync_cmd, ["--ledger", url, "--from-file", str(sacct), "--policy", _policy(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "1 replayed, 1 quarantined, 0 skipped" in r.stdout
    warnings = r.stderr.splitlines()  # the extracts' warning too, where no Slurm answers (above)
    assert all(w.startswith("horus-admin sync: warning: ") for w in warnings)
    assert len([w for w in warnings if "quarantined as .bad" in w]) == 1
    record = (tmp_path / "record").read_text().splitlines()
    assert record[0].startswith("# slurm-horus claim record") and oct(
        os.stat(tmp_path / "record").st_mode & 0o777) == "0o644"
    # bob's job 601 claimed 34000 MiB p90 and 65 %; the probe measured 40000 MiB and 90 %
    assert record[1:] == ["user - bob 1 2", "account - ml 1 2"]


def _cluster_ok() -> bool:
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.cluster
def test_sync_from_real_cluster(tmp_path):
    """Jobs sbatch'ed with a hint (no hsubmit, nothing written beforehand) are recorded under the
    cluster name accounting reports (read through the chosen backend), once however often sync
    runs; a whole-GPU job is counted in GPUs, a packed one in shards."""
    from slurm_horus.slurm import commands as slurm

    if not _cluster_ok():
        pytest.skip("SLURM_CONF unset or the local cluster is down (tests/cluster/up)")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    ids = []
    try:
        for comment in ("horus:v1;a100=10/500/600", "horus:v1;a100=15/500/600", "whole"):
            out = subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", "-p", "a100",
                                  f"--comment={comment}",
                                  "-o", str(tmp_path / "out-%j"), "--wrap", "sleep 1"],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True)
            ids.append(int(out.stdout.strip().split(";")[0]))
        # Wait until the jobs appear finished in a time-window query, which is what sync runs:
        # slurmdbd fills in a short job's start a moment after `sacct -j` already says COMPLETED.
        deadline = time.time() + 90
        while time.time() < deadline:
            seen = [j for j in slurm.accounting_jobs(time.time() - 3600, time.time())
                    if j["job_id"] in ids and j["state"] == "COMPLETED" and j["end_time"]]
            if len(seen) == 3:
                break
            time.sleep(1)
        else:
            pytest.fail(f"jobs {ids} did not show up finished in accounting")
    finally:
        subprocess.run(["scancel", *map(str, ids)], capture_output=True)
    conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    cluster = re.search(r"^ClusterName\s*=\s*(\S+)", conf, re.M).group(1)
    assert seen[0]["cluster"] == cluster  # never "" (what sbatch --parsable says)
    hinted, whole = ids[:2], ids[2]
    res = sync(L, since=time.time() - 3600)
    assert res["recorded"] >= 2
    jobs = {j["job_id"]: j for j in L.jobs(job_ids=ids)}
    assert whole not in jobs  # no claim, not known: only with --all
    assert {jobs[i]["pred_util_pct"] for i in hinted} == {10, 15}
    for i in hinted:  # packed into shards, or (hook left it alone) one whole GPU: never both
        shared = L.submission(cluster, i)["policy_decision"].startswith("horus: shared")
        assert jobs[i]["cluster"] == cluster
        assert (jobs[i]["shards"], jobs[i]["gpus"]) == ((jobs[i]["shards"] or -1, None) if shared
                                                        else (None, 1)), jobs[i]
    assert all(jobs[i]["state"] == "COMPLETED" and jobs[i]["node"] == "gpu-a100" for i in hinted)
    assert all(jobs[i]["gpu_type"] == "a100" for i in hinted)
    from slurm_horus.ledger.sync import last_sync

    assert last_sync(L, cluster) is not None
    sync(L, since=time.time() - 3600, all_jobs=True)
    jobs = {j["job_id"]: j for j in L.jobs(job_ids=ids)}
    assert len(jobs) == 3 and L.count("jobs") == L.count("submissions")
    w = jobs[whole]
    assert (w["gpus"], w["shards"], w["gpu_type"]) == (1, None, "a100")


@pytest.mark.cluster
def test_a_job_seen_running_is_recorded_though_its_end_falls_outside_every_later_window(tmp_path):
    """sacct -S/-E returns the jobs of the window; one that a sync saw running and whose end
    slurmdbd then recorded before the next window began (a backlog longer than the 300 s
    overlap) was never recorded.  Jobs seen running are read again by id (sacct -j)."""
    from slurm_horus.slurm import commands as slurm

    if not _cluster_ok():
        pytest.skip("SLURM_CONF unset or the local cluster is down (tests/cluster/up)")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    out = subprocess.run(["sbatch", "--parsable", "--gres=gpu:1", "-p", "a100",
                          "--comment=horus:v1;a100=10/500/600", "-o", str(tmp_path / "out-%j"),
                          "--wrap", "sleep 6"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=30, check=True)
    jid = int(out.stdout.strip().split(";")[0])
    try:
        def state():
            return [j["state"] for j in slurm.accounting_jobs_by_id([jid]) if j["job_id"] == jid]
        deadline = time.time() + 60
        while state() != ["RUNNING"] and time.time() < deadline:
            time.sleep(0.5)
        assert state() == ["RUNNING"], state()
        sync(L, since=time.time() - 600)
        assert jid not in [j["job_id"] for j in L.jobs()]
        deadline = time.time() + 60
        while state() != ["COMPLETED"] and time.time() < deadline:
            time.sleep(0.5)
        assert state() == ["COMPLETED"], state()
        later = time.time() + 3600  # a window that holds nothing of the job's run
        res = sync(L, since=later, until=later + 60)
        # (with jobs of other tests running beside it, they are carried and recorded too)
        assert res["recorded"] >= 1 and [j["state"] for j in L.jobs(job_ids=[jid])] == ["COMPLETED"]
        from slurm_horus.ledger.sync import _open_jobs

        assert jid not in {i for _, i in _open_jobs(L, slurm.local_cluster())}  # ended: not carried
    finally:
        subprocess.run(["scancel", str(jid)], capture_output=True)


def test_a_damaged_open_jobs_state_falls_back_to_the_windows(tmp_path):
    from slurm_horus.ledger.sync import _open_jobs

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    assert _open_jobs(L, "c") == set()
    for damaged in ("[1, 2]", "{not json", '{"c": ["x"]}', '{"c": 5}'):
        L.set_state("open_jobs", damaged)
        assert _open_jobs(L, "c") == set()
    L.set_state("open_jobs", '{"c": [5, 7], "d": [9]}')  # a ledger-wide state from before
    assert _open_jobs(L, "c") == {("c", 5), ("c", 7)} and _open_jobs(L, "d") == {("d", 9)}
    L.set_state("open_jobs:c", "[8]")  # each cluster's own
    assert _open_jobs(L, "c") == {("c", 8)}
    L.set_state("open_jobs:c", '{"x": 1}')
    assert _open_jobs(L, "c") == set()


def test_sync_flags_failed_measurements_and_keeps_p95_p99(tmp_path):
    """A job whose GPU stayed idle (util 0, memory at most a bare CUDA context) is recorded,
    flagged and counted, and left out of the accuracy; a hint's p95/p99 reach the ledger."""
    jobs = [_job(401, "horus:v1;a100=30/4000/4500/4800/5200", shards=30, util=0, mem=300),
            _job(402, "horus:v1;a100=30/4000/4500", shards=30, util=0, mem=3000),
            _job(403, "horus:v1;a100=30/4000/4500", shards=30, util=40, mem=300)]
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    res = sync(L, sacct_json={"jobs": jobs}, node_types={"gpu-a100": "a100"})
    assert res["recorded"] == 3 and res["failed_measurements"] == 1
    j = {r["job_id"]: r for r in L.jobs()}
    assert [j[k]["failed_measurement"] for k in (401, 402, 403)] == [1, 0, 0]
    assert j[401]["mem_err_bucket"] == -1 and j[402]["mem_err_bucket"] >= 0
    preds = json.loads(L.submission("gpucl", 401)["predictions"])["a100"]
    assert (preds["mem_mib_p90"], preds["mem_mib_p95"], preds["mem_mib_p99"]) == (4500, 4800, 5200)
    assert "mem_mib_p95" not in json.loads(L.submission("gpucl", 402)["predictions"])["a100"]


# ------------------------------------------------- root reading what users name (a review's cases)

def test_a_workload_the_cold_start_refuses_costs_the_job_its_cold_figures_not_the_sync(tmp_path):
    """bf16 on a T4 has no cold start: that job gets none, and the other jobs are recorded."""
    model = tmp_path / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    bad = _claim(model).replace("prec=fp32", "prec=bf16")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    res = sync(L, sacct_json={"jobs": [_job(801, bad, shards=10), _job(802, _claim(model), shards=10)]})
    assert res["recorded"] == 2
    preds = json.loads(L.submission("gpucl", 801)["predictions"])
    assert "cold" not in preds["t4"] and preds["a100"]["cold"]["mem_mib"] > 0


def test_a_model_file_that_grows_under_the_hash_is_not_read_to_its_end(tmp_path, monkeypatch):
    """sync hashes at most the size it checked: a file made huge (sparse) meanwhile is a
    changed file, not gigabytes of zeros read as root."""
    import hashlib

    from slurm_horus.ledger import claims

    model = tmp_path / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    claim = {"model": str(model), "sha": hashlib.sha256(model.read_bytes()).hexdigest()}
    wl = {"batch_size": 8, "task": "train", "optimizer": "adam", "precision": "fp32", "dims": {}}
    real, read = claims._sha256, []

    def grow_then_hash(fd, size):
        with open(model, "r+b") as f:
            f.truncate(8 << 30)  # sparse: 8 GiB of zeros after the graph
        read.append(size)
        return real(fd, size)
    monkeypatch.setattr(claims, "_sha256", grow_then_hash)
    assert claims.ModelFeatures().get(claim, wl, 0, {0}) is None
    assert read == [len(open(ZOO / "small_cnn.onnx", "rb").read())]


def test_one_users_analyses_are_bounded_per_sync(tmp_path, monkeypatch):
    """Each batch size is a new analysis: past its budget a user's jobs get no features in this
    sync, and another user's still do."""
    import hashlib

    from slurm_horus.ledger import claims

    model = tmp_path / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    mf = claims.ModelFeatures(user_budget_s=0.0)
    wl = {"task": "train", "optimizer": "adam", "precision": "fp32", "dims": {}}
    assert mf.get({"model": str(model), "sha": sha}, dict(wl, batch_size=2), 0, {0}) is None
    # a clock on which reading the file takes no time and each analysis one second
    clock = [0.0]
    analyse = claims._features

    def slow(*a):
        clock[0] += 1.0
        return analyse(*a)
    monkeypatch.setattr(claims, "_features", slow)
    monkeypatch.setattr(claims.time, "monotonic", lambda: clock[0])
    mf = claims.ModelFeatures(user_budget_s=0.5)
    assert mf.get({"model": str(model), "sha": sha}, dict(wl, batch_size=2), 0, {0}) is not None
    assert mf.get({"model": str(model), "sha": sha}, dict(wl, batch_size=3), 0, {0}) is None
    assert mf.get({"model": str(model), "sha": sha}, dict(wl, batch_size=2), 0, {0}) is not None  # cached


def test_one_users_analysis_budget_is_the_syncs_not_each_windows(tmp_path, monkeypatch):
    """A sync reads accounting an hour at a time: each window had its own ModelFeatures, so a
    3-hour catch-up gave one user three budgets, and a long job listed in every window was
    analysed again in each.  One budget and one cache for the whole sync."""
    from slurm_horus.ledger import claims
    from slurm_horus.slurm import commands as slurm

    model = tmp_path / "m.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", model)
    jobs = [_job(600 + bs, _claim(model, bs=bs), shards=10) for bs in range(1, 9)]
    clock, analyses, analyse = [0.0], [], claims._features

    def slow(path, sha, workload):  # each analysis 100 s of the sync's clock
        clock[0] += 100.0
        analyses.append(workload["batch_size"])
        return analyse(path, sha, workload)
    monkeypatch.setattr(claims, "_features", slow)
    monkeypatch.setattr(claims.time, "monotonic", lambda: clock[0])
    # every job in every window (long jobs, or sacct listing a job in each window it overlaps)
    monkeypatch.setattr(slurm, "accounting_jobs",
                        lambda since, until: parse_sacct_json(json.dumps({"jobs": jobs})))
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: "gpucl")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    now = time.time()
    res = sync(L, since=now - 3 * 3600, until=now)  # three windows
    budget = claims.USER_ANALYSIS_BUDGET_S
    assert len(analyses) == len(set(analyses)) == int(budget // 100)  # once each, within budget
    assert clock[0] <= budget
    with_features = [j for j in range(601, 609) if L.submission("gpucl", j)["features"]]
    assert len(with_features) == len(analyses) and res["recorded"] == len(jobs)  # each job once


@pytest.mark.skipif(os.geteuid() != 0, reason="opens as another user: needs root")
def test_open_as_owner_lets_the_kernel_judge(open_dir):
    """Mode bits alone say yes to these; the kernel says no: another user's process's view of the
    file system through /proc, and an ACL that denies the user."""
    f = open_dir / "m.onnx"
    f.write_bytes(b"x")
    os.chmod(f, 0o644)
    other = (5002, {5002})
    assert open_as_owner(str(f), *other) is not None
    root_proc = subprocess.Popen(["sleep", "60"])  # another root process
    try:
        via_proc = f"/proc/{root_proc.pid}/root{f}"  # its view of the file system: none for 5002
        assert open_as_owner(via_proc, *other) is None
        fd = open_as_owner(via_proc, 0, {0})
        assert fd is not None
        os.close(fd)
    finally:
        root_proc.kill()
        root_proc.wait()
    if shutil.which("setfacl"):
        subprocess.run(["setfacl", "-m", "u:5002:---", str(f)], check=True)
        assert open_as_owner(str(f), *other) is None


def test_a_jobs_gpu_type_is_never_its_hints(tmp_path):
    """With no type from accounting, the probe or the node (scontrol unanswered: node_types
    {}), a hint naming one type was recorded as the type the job ran on, and its run taught
    that type's history.  The type the hook pinned (AdminComment) is a fact; the hint is not."""
    data = json.loads(F2205.read_text())
    job = data["jobs"][0]
    job["comment"]["job"] = "horus:v1;h100=20/2000/2500"  # it ran on gpu-t4
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    sync(L, sacct_json=data, node_types={})
    assert L.jobs()[0]["gpu_type"] is None and L.jobs()[0]["node"] == "gpu-t4"
    admin = job["comment"]["administrator"]
    job["comment"]["administrator"] = admin.replace(";type=any;", ";type=t4;")
    assert admin != job["comment"]["administrator"]
    sync(L, sacct_json=data, node_types={})
    assert L.jobs()[0]["gpu_type"] == "t4"


def test_every_model_dir_help_names_the_default_the_registry_uses():
    """--model-dir's help said '(default /var/lib/slurm-horus/models)' while $HORUS_MODEL_DIR,
    read first, was the default wherever admin.env is loaded."""
    from click.testing import CliRunner

    import slurm_horus.cli.hsubmit as hsubmit
    from slurm_horus.cli.admin import main as admin
    from slurm_horus.cli.horus import main as horus
    from slurm_horus.predict.registry import DEFAULT_DIR, ENV_VAR

    want = f"default ${ENV_VAR}, else {DEFAULT_DIR}"
    for cli, args in [(admin, [c]) for c in ("sync", "retrain", "import", "doctor")] + [
            (admin, ["models", c]) for c in ("list", "promote", "rollback")] + [(horus, ["predict"])]:
        r = CliRunner().invoke(cli, [*args, "--help"], terminal_width=1000)  # unwrapped
        assert r.exit_code == 0 and want in " ".join(r.output.split()), (args, r.output)
    assert want in " ".join(hsubmit.__doc__.split())
