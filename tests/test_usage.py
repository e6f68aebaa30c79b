"""Actual use from sacct --json: 22.05 (recorded), 23.02 and 25.11 (hand-made) layouts; sync."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger
from slurm_horus.usage import (colocations, gpu_use_from_tres_strings, parse_gres_detail,
                               parse_sacct_json, run_sacct, size_mib, sync)

FIX = Path(__file__).parent / "fixtures"
F2302 = FIX / "sacct" / "sacct_23.02_v0.0.39.json"
F2511 = FIX / "sacct" / "sacct_25.11_v0.0.44.json"
F2205 = FIX / "slurm" / "sacct_json_finished_shard.stdout"


def test_sizes_and_tres_strings():
    assert size_mib("36266M") == 36266
    assert size_mib("1.5G") == 1536
    assert size_mib("40777023488") == pytest.approx(38888.0, abs=1)
    assert size_mib(40777023488) == pytest.approx(38888.0, abs=1)
    assert size_mib("512K") == 0.5
    with pytest.raises(HorusError):
        size_mib("lots")
    u = gpu_use_from_tres_strings("cpu=00:01:00,gres/gpumem=36266M,gres/gpuutil=100",
                                  "gres/gpumem=30000M,gres/gpuutil=63")
    assert u == {"util_max": 100.0, "util_mean": 63.0, "mem_peak_mib": 36266.0}
    u = gpu_use_from_tres_strings("gres/gpumem=40777023488,gres/gpuutil=7")
    assert u["mem_peak_mib"] == pytest.approx(38888.0, abs=1)


def test_gres_detail():
    assert parse_gres_detail(["shard:30(IDX:0)"]) == (None, 0)
    assert parse_gres_detail(["gpu:a100:1(IDX:2)"]) == ("a100", 2)
    assert parse_gres_detail("shard:a100:25(IDX:3)") == ("a100", 3)
    assert parse_gres_detail([]) == (None, None)


def test_parse_2205_recorded():
    (j,) = parse_sacct_json(F2205.read_text())
    assert j["job_id"] == 2 and j["state"] == "COMPLETED" and j["shards"] == 20
    assert j["node"] == "gpu-a100" and j["elapsed_s"] == 2
    assert j["util_mean"] is None and j["mem_peak_mib"] is None  # 22.05 has no gpuutil/gpumem


def test_parse_2302_gpu_tres():
    jobs = {j["job_id"]: j for j in parse_sacct_json(F2302.read_text())}
    assert jobs[101]["util_mean"] == 45 and jobs[101]["util_max"] == 97
    assert jobs[101]["mem_peak_mib"] == 5230 and jobs[101]["shards"] == 30
    assert jobs[102]["mem_peak_mib"] == pytest.approx(36260.48, abs=0.01)
    assert jobs[103]["state"] == "FAILED" and jobs[103]["gpu_index"] is None


def test_parse_2511_gpu_tres_and_index():
    jobs = {j["job_id"]: j for j in parse_sacct_json(F2511.read_text())}
    assert jobs[201]["state"] == "COMPLETED" and jobs[201]["gpu_index"] == 1
    assert jobs[201]["util_mean"] == 81 and jobs[201]["mem_peak_mib"] == 20480
    assert jobs[202]["mem_peak_mib"] == 9216 and jobs[203]["gpu_index"] == 0
    assert jobs[202]["comment"].endswith("horus:v1;h100-sxm=30.0/10000/12000")


def test_colocations_respect_gpu_index():
    js = [{"cluster": "c", "job_id": 1, "node": "n", "gpu_index": 0, "start_time": 0, "end_time": 10},
          {"cluster": "c", "job_id": 2, "node": "n", "gpu_index": 0, "start_time": 5, "end_time": 20},
          {"cluster": "c", "job_id": 3, "node": "n", "gpu_index": 1, "start_time": 5, "end_time": 20},
          {"cluster": "c", "job_id": 4, "node": "n", "gpu_index": 0, "start_time": 20, "end_time": 30}]
    co = colocations(js)
    assert co == {("c", 1): {2}, ("c", 2): {1}}


def test_sync_fixture_2511_all_and_idempotent(tmp_path):
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    res = sync(L, sacct_json=F2511.read_text(), all_jobs=True)
    # 201 and 202 carry hints -> submissions from the hint; 203 has no hint but used shards
    assert res["recorded"] == 3 and res["new_submissions"] == 2
    again = sync(L, sacct_json=F2511.read_text(), all_jobs=True)
    assert again["recorded"] == 3
    assert L.count("usage") == 3 and L.count("jobs") == 3
    jobs = {j["job_id"]: j for j in L.jobs()}
    assert jobs[201]["gpu_type"] == "h100-sxm" and jobs[201]["pred_util_pct"] == 75.0
    assert jobs[201]["act_util_pct"] == 81 and jobs[201]["act_mem_mib"] == 20480
    assert jobs[201]["colocated"] == "202" and jobs[202]["colocated"] == "201"
    assert jobs[203]["colocated"] is None  # other GPU (IDX:0)


def test_sync_only_ledger_jobs_by_default(tmp_path):
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    L.record_submission(job_id=102, cluster="gpucl", user="bob",
                        predictions={"a100": {"util_pct": 65, "mem_mib": 30000}})
    res = sync(L, sacct_json=F2302.read_text(), node_types={"gpu-a100": "a100"})
    assert res["recorded"] == 1
    (j,) = L.jobs()
    assert j["job_id"] == 102 and j["gpu_type"] == "a100" and j["shards"] == 50
    assert j["act_util_pct"] == 70 and j["act_util_max"] == 100
    assert j["act_mem_mib"] == pytest.approx(36260.48, abs=0.01)


def test_sync_cli_from_file(tmp_path):
    from click.testing import CliRunner

    from slurm_horus.cli.admin_ledger import sync as sync_cmd

    url = f"sqlite:///{tmp_path}/l.db"
    r = CliRunner().invoke(sync_cmd, ["--ledger", url, "--from-file", str(F2302), "--all", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["recorded"] == 3
    r = CliRunner().invoke(sync_cmd, ["--ledger", url, "--from-file", str(tmp_path / "nope")])
    assert r.exit_code != 0 and "error" in r.output


def _cluster_ok() -> bool:
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.cluster
def test_sync_from_real_cluster(tmp_path):
    if not _cluster_ok():
        pytest.skip("SLURM_CONF unset or the local cluster is down (tests/cluster/up)")
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    ids = []
    for shards in (10, 15):
        out = subprocess.run(["sbatch", "--parsable", f"--gres=shard:{shards}", "-p", "a100",
                              "-o", str(tmp_path / "out-%j"), "--wrap", "sleep 1"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True)
        jid = int(out.stdout.strip().split(";")[0])
        ids.append(jid)
        cluster = out.stdout.strip().split(";")[1] if ";" in out.stdout else "horus"
        L.record_submission(job_id=jid, cluster=cluster, user="root",
                            predictions={"a100": {"util_pct": 10, "mem_mib": 500}})
    # Wait until both jobs appear finished in a time-window query, which is what sync runs:
    # slurmdbd fills in a short job's start a moment after `sacct -j` already says COMPLETED.
    deadline = time.time() + 90
    while time.time() < deadline:
        seen = [j for j in parse_sacct_json(run_sacct(time.time() - 3600, time.time()))
                if j["job_id"] in ids and j["state"] == "COMPLETED"]
        if len(seen) == 2:
            break
        time.sleep(1)
    else:
        pytest.fail(f"jobs {ids} did not show up finished in sacct")
    res = sync(L, since=time.time() - 3600)
    assert res["recorded"] == 2
    jobs = {j["job_id"]: j for j in L.jobs()}
    assert {jobs[i]["shards"] for i in ids} == {10, 15}
    assert all(jobs[i]["state"] == "COMPLETED" and jobs[i]["node"] == "gpu-a100" for i in ids)
    assert all(jobs[i]["gpu_type"] == "a100" for i in ids)
    assert L.get_state("last_sync") is not None
    assert sync(L, since=time.time() - 3600)["recorded"] == 2 and L.count("usage") == 2
