"""slurm.parse functions horus-probe and horus-admin queue use, on output recorded from the local
clusters (tests/cluster/record_probe_fixtures.py -> tests/fixtures/slurm/probe on Slurm 22.05.8,
tests/fixtures/slurm-25.11/probe on 25.11.7)."""

import json
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = {"22.05": FIXTURES / "slurm" / "probe", "25.11": FIXTURES / "slurm-25.11" / "probe"}


def job(version, name):
    """The job's record from the recorded ``squeue --json`` (and the node it ran on)."""
    fix = VERSIONS[version]
    index = json.loads((fix / "index.json").read_text())["fixtures"]
    jid = index["squeue_json_all"]["job_ids"][name]
    (rec,) = sp.squeue_json_records((fix / "squeue_json_all.stdout").read_text(), jid)
    assert rec["JobId"] == str(jid) == str(index[f"scontrol_show_job_{name}"]["job_id"])
    return rec, index[f"scontrol_show_job_{name}"]["node"]


@pytest.mark.parametrize("version", VERSIONS)
def test_untyped_shard_jobs_take_their_type_from_the_node(version):
    rec, node = job(version, "shard_t4")
    assert node == "gpu-t4" and rec["JobState"] == sp.job_state(rec) == "RUNNING"
    assert sp.job_gpus_on_node(rec, node) == {"indices": [0], "type": None, "shards": 9, "gpus": None}
    rec, node = job(version, "shard_a100")  # the hook asks untyped shards, with a feature
    assert node == "gpu-a100" and rec["Features"] == "a100"
    assert sp.job_gpus_on_node(rec, node) == {"indices": [0], "type": None, "shards": 12, "gpus": None}
    nodes = sp.parse_scontrol_records((FIXTURES / "slurm" / "scontrol_show_node.stdout").read_text())
    assert {n["NodeName"]: sp.gpu_types_of_node(n) for n in nodes} == {"gpu-a100": {"a100": 4},
                                                                       "gpu-t4": {"t4": 2}}


@pytest.mark.parametrize("version", VERSIONS)
def test_two_whole_gpus(version):
    rec, node = job(version, "gpu_a100_x2")
    assert sp.job_gpus_on_node(rec, node) == {"indices": [1, 2], "type": "a100", "shards": None,
                                              "gpus": 2}
    assert sp.job_gpus_on_node(rec, None)["indices"] == [1, 2]  # single node: its only line


@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_name_and_comment_forge_scontrols_text_but_not_squeues_json(version):
    """What the job's owner wrote (tests/cluster/record_probe_fixtures.py: FORGED_NAME and
    FORGED_COMMENT) reads, in scontrol's text, as a failed job of root's with 99 typed shards,
    a second GPU and a record of job 1; squeue's JSON has the job as Slurm holds it."""
    fix = VERSIONS[version]
    text = (fix / "scontrol_show_job_forged_t4.stdout").read_text()
    recs = sp.parse_scontrol_records(text)
    assert {r["JobId"] for r in recs[1:]} == {"1"}  # forged records of another job
    forged = recs[0]
    assert forged["JobState"] == "FAILED" and forged["TresPerNode"] == "gres:shard:a100:99"
    rec, node = job(version, "forged_t4")
    assert rec["JobState"] == "RUNNING" and rec["UserId"] == "root(0)"
    assert rec["TresPerNode"] in ("gres:shard:9", "gres/shard:9")
    assert rec["Comment"].startswith("horus:v1;t4=5/1000/1200\n") and "\nJobId=1 " in rec["Comment"]
    assert rec["AdminComment"].startswith("horus: shared t4 shards=9/100")
    place = sp.job_gpus_on_node(rec, node)
    assert place["shards"] == 9 and place["type"] is None and len(place["indices"]) == 1


def test_records_of_one_job_or_of_all():
    text = (VERSIONS["22.05"] / "squeue_json_all.stdout").read_text()
    every = sp.squeue_json_records(text)
    assert len(every) >= 4 and len({r["JobId"] for r in every}) == len(every)
    assert sp.squeue_json_records(text, 10 ** 9) == []
    assert all(r["SubmitTime"][:2] == "20" for r in every)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["shard_t4", "shard_a100", "gpu_a100_x2"])
def test_listpids(version, name):
    text = (VERSIONS[version] / f"scontrol_listpids_{name}.stdout").read_text()
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


def test_a_hostlist_of_more_names_than_any_cluster_is_refused_in_one_line():
    """Each range is capped, their product was not: NodeName=a[1-3000]b[1-3000] took doctor
    44 s (9 million names), a[1-100000]b[1-100000] would have filled memory in doctor, sync
    and anything that expands a node list."""
    from slurm_horus.errors import HorusError

    with pytest.raises(HorusError, match="more than 1,000,000 names"):
        sp.expand_hostlist("a[1-2000]b[1-1000]")
    assert len(sp.expand_hostlist("a[1-100]b[1-100]")) == 10_000
