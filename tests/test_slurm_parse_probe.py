"""slurm.parse functions horus-probe uses, on output recorded from the local cluster
(tests/cluster/record_probe_fixtures.py -> tests/fixtures/slurm/probe)."""

import json
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp

FIX = Path(__file__).parent / "fixtures" / "slurm" / "probe"
INDEX = json.loads((FIX / "index.json").read_text())["fixtures"]


def job(name):
    recs = sp.parse_scontrol_records((FIX / f"scontrol_show_job_{name}.stdout").read_text())
    assert len(recs) == 1
    meta = INDEX[f"scontrol_show_job_{name}"]
    assert recs[0]["JobId"] == str(meta["job_id"])
    return recs[0], meta["node"]


def test_untyped_shard_job_on_t4():
    rec, node = job("shard_t4")
    assert node == "gpu-t4"
    assert sp.job_gpus_on_node(rec, node) == {"indices": [0], "type": None, "shards": 7,
                                              "gpus": None}
    assert sp.job_state(rec) == "RUNNING"


def test_typed_shard_job_takes_type_from_tres_per_node():
    rec, node = job("shard_typed_a100")
    assert sp.job_gpus_on_node(rec, node) == {"indices": [0], "type": "a100", "shards": 20,
                                              "gpus": None}


def test_two_whole_gpus():
    rec, node = job("gpu_a100_x2")
    assert sp.job_gpus_on_node(rec, node) == {"indices": [1, 2], "type": "a100", "shards": None,
                                              "gpus": 2}
    assert sp.job_gpus_on_node(rec, None)["indices"] == [1, 2]  # single node: its only line


def test_other_node_or_no_gres_is_none():
    rec, _ = job("shard_t4")
    assert sp.job_gpus_on_node(rec, "gpu-a100") is None
    no_gres = dict(rec, _details=[{"Nodes": "gpu-t4", "CPU_IDs": "0", "Mem": "100"}])
    assert sp.job_gpus_on_node(no_gres, "gpu-t4") is None
    assert sp.job_gpus_on_node({"_details": []}, None) is None


def test_untyped_shard_type_comes_from_node_record():
    nodes = sp.parse_scontrol_records(
        (FIX.parent / "scontrol_show_node.stdout").read_text())
    t4 = [n for n in nodes if n["NodeName"] == "gpu-t4"][0]
    assert sp.gpu_types_of_node(t4) == {"t4": 2}


@pytest.mark.parametrize("name", ["shard_t4", "shard_typed_a100", "gpu_a100_x2"])
def test_listpids(name):
    text = (FIX / f"scontrol_listpids_{name}.stdout").read_text()
    pids = sp.parse_listpids(text)
    assert pids and all(p > 1 for p in pids)
    assert len(pids) == len(text.strip().splitlines()) - 1  # header line
    assert sp.parse_listpids("PID      JOBID    STEPID   LOCALID GLOBALID\n") == []


def test_hostlist_match():
    assert sp._hostlist_has("gpu[01-03,07],login1", "gpu02")
    assert sp._hostlist_has("gpu[01-03,07],login1", "login1")
    assert not sp._hostlist_has("gpu[01-03]", "gpu04")
    assert not sp._hostlist_has("gpu[01-03]", "gpu2")
    assert sp._hostlist_has("gpu-t4", "gpu-t4") and not sp._hostlist_has(None, "x")
