"""slurm.parse and slurm.sbatch_args on the recorded outputs of Slurm 22.05.8 (tests/fixtures/slurm)."""

import json
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp
from slurm_horus.slurm import sbatch_args as sa

FIX = Path(__file__).parent / "fixtures" / "slurm"
INDEX = {f["name"]: f for f in json.loads((FIX / "index.json").read_text())["fixtures"]}


def out(name, stream="stdout"):
    return (FIX / INDEX[name][stream]).read_text()


def test_sbatch_stdout_job_ids():
    assert sp.parse_sbatch_stdout(out("sbatch_submit")) == "1"
    assert sp.parse_sbatch_stdout(out("sbatch_parsable")) == "2"
    assert sp.parse_sbatch_stdout(out("sbatch_typed_shard")) == "6"
    assert sp.parse_sbatch_stdout("12;horus\n") == "12"
    assert sp.parse_sbatch_stdout(out("sbatch_invalid_partition")) is None


@pytest.mark.parametrize("name", ["sbatch_invalid_partition", "sbatch_invalid_gres_type",
                                  "sbatch_gpu_and_shard"])
def test_sbatch_errors_recorded(name):
    assert INDEX[name]["exit_code"] == 1
    assert out(name, "stderr").startswith("sbatch: error:")


def test_recorded_commands_split_like_sbatch():
    for f in INDEX.values():
        if f["command"][0] != "sbatch":
            continue
        s = sa.split_args(f["command"][1:])
        assert s.horus == [] and s.sbatch_argv() == f["command"][1:]
        assert sa.last_value(s.parsed, "wrap") is not None and s.rest == []


def test_show_partition_default_and_nodes():
    parts = sp.parse_scontrol_records(out("scontrol_show_partition"))
    assert [p["PartitionName"] for p in parts] == ["gpu", "a100", "t4"]
    assert sp.default_partition(parts) == "gpu"
    assert parts[0]["Nodes"] == "gpu-a100,gpu-t4"


def test_show_node_gpu_types_per_partition():
    nodes = sp.parse_scontrol_records(out("scontrol_show_node"))
    assert [n["NodeName"] for n in nodes] == ["gpu-a100", "gpu-t4"]
    assert sp.gpu_types_of_node(nodes[0]) == {"a100": 4}
    assert nodes[0]["OS"].startswith("Linux ")  # value with spaces kept whole
    assert sp.partition_gpu_types(nodes, "gpu") == {"a100": 4, "t4": 2}
    assert sp.partition_gpu_types(nodes, "t4") == {"t4": 2}
    assert sp.partition_gpu_types(nodes, "a100,t4") == {"a100": 4, "t4": 2}
    assert sp.partition_gpu_types(nodes, "nosuch") == {}
    detail = sp.parse_scontrol_records(out("scontrol_show_node_detail"))
    assert {n["NodeName"] for n in detail} == {"gpu-a100", "gpu-t4"}


def test_one_line_format():
    line = ("NodeName=gpu-t4 Arch=x86_64 CoresPerSocket=16 Gres=gpu:t4:2,shard:t4:200 "
            "Partitions=gpu,t4 OS=Linux 6.1 #1 SMP\n"
            "NodeName=n2 Gres=gpu:4(S:0-1) Partitions=gpu\n")
    nodes = sp.parse_scontrol_records(line)
    assert len(nodes) == 2 and sp.gpu_types_of_node(nodes[0]) == {"t4": 2}
    assert sp.gpu_types_of_node(nodes[1]) == {}  # untyped GPUs: no type to predict for


def test_show_job_shard_detail():
    job = sp.parse_scontrol_records(out("scontrol_show_job_running_shard"))[0]
    assert job["JobId"] == "1" and job["JobState"] == "RUNNING"
    assert job["TresPerNode"] == "gres:shard:30" and job["Comment"] == "fixture-running"
    assert sp.job_gres_detail(job) == [
        {"node": "gpu-a100", "gres": [{"name": "shard", "type": None, "count": 30, "idx": [0]}]}]


def test_show_job_whole_gpu_detail():
    job = sp.parse_scontrol_records(out("scontrol_show_job_running_gpu"))[0]
    assert job["Partition"] == "a100" and "Comment" not in job
    (d,) = sp.job_gres_detail(job)
    assert d["gres"] == [{"name": "gpu", "type": "a100", "count": 1, "idx": [1]}]


def test_parse_gres_forms():
    assert sp.parse_gres("gres:shard:t4:10") == [{"name": "shard", "type": "t4", "count": 10, "idx": None}]
    assert sp.parse_gres("gres/shard=3")[0]["name"].startswith("shard")
    assert sp.parse_gres("gpu:a100:2(IDX:0-1),shard:0(IDX:N/A)")[0]["idx"] == [0, 1]
    assert sp.parse_gres("(null)") == [] and sp.parse_gres(None) == []


def test_squeue_json_gres_detail():
    jobs = {j["JobId"]: j for j in sp.squeue_json_records(out("squeue_json"))}
    assert sp.job_gpus_on_node(jobs["1"], "gpu-a100") == {"shards": 30, "gpus": None, "indices": [0],
                                                        "type": None}
    assert sp.job_gpus_on_node(jobs["3"], "gpu-a100")["indices"] == [1]
    assert jobs["3"]["TresPerNode"] == "gres:gpu:1" and jobs["1"]["Comment"] == "fixture-running"


def test_squeue_and_sinfo_text():
    rows = sp.parse_pipe_table(out("squeue_text"))
    assert rows[0]["JOBID"] == "5" and rows[0]["TRES_PER_NODE"] == "gres:shard:150"
    rows = sp.parse_pipe_table(out("sinfo_text"))
    assert {r["NODELIST"] for r in rows} == {"gpu-a100", "gpu-t4"}
    assert sp.gpu_types_of_node({"Gres": rows[0]["GRES"]}) == {"a100": 4}


def test_sinfo_json_nodes():
    nodes = {n["name"]: n for n in sp.sinfo_json_nodes(out("sinfo_json"))}
    assert nodes["gpu-a100"]["gpu_types"] == {"a100": 4}
    assert set(nodes["gpu-t4"]["partitions"]) == {"gpu", "t4"}


def test_sacct_pipe_table():
    rows = sp.parse_pipe_table(out("sacct_text_finished_shard"))
    assert rows[0]["JobID"] == "2" and "gres/shard=20" in rows[0]["AllocTRES"]
    assert rows[0]["Comment"] == "fixture-done"


def test_tres_spelling():
    assert sa.gres_to_tres("gpu:1") == "gres:gpu:1"
    assert sa.gres_to_tres("gpu:a100:1,foo:2") == "gres:gpu:a100:1,gres:foo:2"
    assert sa.gpus_to_tres("1") == "gres:gpu:1"


def test_node_default_lines_fold_into_the_lines_after_them():
    recs = sp.parse_conf_lines("NodeName=DEFAULT Gres=gpu:a100:4 RealMemory=1000\n"
                               "NodeName=a[1-2] CPUs=8\n"
                               "PartitionName=gpu Nodes=ALL\n"
                               "NodeName=DEFAULT Gres=gpu:t4:2\n"
                               "NodeName=t1 RealMemory=500\n")
    assert sp.node_lines(recs) == [
        {"nodename": "a[1-2]", "gres": "gpu:a100:4", "realmemory": "1000", "cpus": "8"},
        {"nodename": "t1", "gres": "gpu:t4:2", "realmemory": "500"}]
