"""slurm.parse against the outputs of the real Slurm 25.11.7 daemons recorded by
tests/cluster/record_fixtures.py in tests/fixtures/slurm-25.11 (job ids from its index.json)."""

import json
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp

FIX = Path(__file__).parent / "fixtures" / "slurm-25.11"
META = json.loads((FIX / "index.json").read_text())
INDEX = {f["name"]: f for f in META["fixtures"]}
IDS = META["job_ids"]


def out(name, stream="stdout"):
    return (FIX / INDEX[name][stream]).read_text()


def test_recorded_on_25_11():
    assert META["slurm_version"].startswith("slurm 25.11.")


def test_sbatch_stdout_job_ids():
    assert sp.parse_sbatch_stdout(out("sbatch_submit")) == str(IDS["running_shard_job"])
    assert sp.parse_sbatch_stdout(out("sbatch_parsable")) == str(IDS["finished_shard_job"])
    assert sp.parse_sbatch_stdout(out("sbatch_invalid_partition")) is None


def test_sinfo_json_nodes_keyed_sinfo():
    assert "nodes" not in json.loads(out("sinfo_json"))
    nodes = {n["name"]: n for n in sp.sinfo_json_nodes(out("sinfo_json"))}
    assert set(nodes) == {"gpu-a100", "gpu-t4"}
    assert nodes["gpu-a100"]["gpu_types"] == {"a100": 4}
    assert nodes["gpu-t4"]["gpu_types"] == {"t4": 2}
    assert sorted(nodes["gpu-a100"]["partitions"]) == ["a100", "gpu"]
    assert nodes["gpu-t4"]["features"] == "t4"


def test_node_gres_has_typed_shards():
    nodes = sp.parse_scontrol_records(out("scontrol_show_node"))
    a100 = next(n for n in nodes if n["NodeName"] == "gpu-a100")
    assert {(g["name"], g["type"], g["count"]) for g in sp.parse_gres(a100["Gres"])} == {
        ("gpu", "a100", 4), ("shard", "a100", 400)}
    assert sp.partition_gpu_types(nodes, "gpu") == {"a100": 4, "t4": 2}
    parts = sp.parse_scontrol_records(out("scontrol_show_partition"))
    assert sp.default_partition(parts) == "gpu"


def test_squeue_json_state_is_a_string_and_gres_detail_gives_the_gpu():
    raw = {j["job_id"]: j for j in json.loads(out("squeue_json"))["jobs"]}
    jobs = {int(j["JobId"]): j for j in sp.squeue_json_records(out("squeue_json"))}
    shard = IDS["running_shard_job"]
    assert raw[shard]["job_state"] == ["RUNNING"] and jobs[shard]["JobState"] == "RUNNING"
    assert jobs[shard]["TresPerNode"].startswith("gres/shard:")
    node = jobs[shard]["NodeList"]
    g = sp.job_gpus_on_node(jobs[shard], node)
    assert g["shards"] and g["indices"] == [0]
    job = jobs[IDS["running_gpu_job"]]
    g = sp.job_gpus_on_node(job, job["NodeList"])
    assert (g["gpus"], g["type"]) == (1, "a100") and len(g["indices"]) == 1


def test_shard_job_detail_lists_per_gpu_counts():
    """25.11 prints a shard job's GPUs as per-GPU counts, not (IDX:i)."""
    seen = set()
    for name in ("scontrol_show_job_packed_a", "scontrol_show_job_packed_b"):
        (job,) = sp.parse_scontrol_records(out(name))
        assert "IDX" not in job["_details"][0]["GRES"]
        got = sp.job_gpus_on_node(job, "gpu-t4")
        assert got["shards"] == int(job["TresPerNode"].rsplit(":", 1)[1]) and got["gpus"] is None
        assert len(got["indices"]) == 1
        seen.add(got["indices"][0])
    assert seen == {0, 1}  # two jobs too big to share one GPU: one on each
    (job,) = sp.parse_scontrol_records(out("scontrol_show_job_running_gpu"))
    got = sp.job_gpus_on_node(job, None)
    assert got["gpus"] == 1 and got["shards"] is None and got["type"] == "a100"


def test_parse_gres_per_gpu_counts():
    assert sp.parse_gres("shard:66(0/100,66/100)")[0]["idx"] == [1]
    assert sp.parse_gres("shard:30(10/100,20/100)")[0]["idx"] == [0, 1]
    assert sp.parse_gres("shard:a100:0(0/100,0/100)")[0]["idx"] == []


def test_sacct_json_has_no_gres_detail():
    """What sync gets on 25.11: untyped shard / gpu TRES, the comment, no GPU index."""
    for j in json.loads(out("sacct_json_finished"))["jobs"]:
        assert "gres_detail" not in j
        gres = {t["name"]: t["count"] for t in j["tres"]["allocated"] if t["type"] == "gres"}
        if j["job_id"] == IDS["finished_shard_job"]:
            assert set(gres) == {"shard"} and j["comment"]["job"].startswith("fixture-done horus:v1;")
        else:
            assert j["job_id"] == IDS["finished_gpu_job"] and gres == {"gpu": 2}


def test_accounting_is_sacct_on_either_backend(monkeypatch):
    """pyslurm's db.Job has no GPU usage TRES: the pyslurm backend had recorded none (a 25.11
    site with NVML accounting and no probe measured nothing, silently)."""
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm.accounting import parse_sacct_json

    recorded = (Path(__file__).parent / "fixtures" / "slurm-25.11" / "sacct_json_finished_gpu.stdout").read_text()
    calls = []
    monkeypatch.setattr(slurm, "run_sacct", lambda since, until: calls.append(1) or recorded)
    monkeypatch.setattr(slurm, "backend", lambda: "pyslurm")
    assert slurm.accounting_jobs(0, 1) == parse_sacct_json(recorded) and calls == [1]


def test_squeue_json_state_flags_are_kept_apart():
    # recorded: 25.11 lists a state's flags after it (["COMPLETED", "COMPLETING"]); the loop
    # acts on no job with flags (a FAILED job still COMPLETING, a PENDING one in REQUEUE_HOLD)
    raw = {j["job_id"]: j for j in json.loads(out("squeue_json"))["jobs"]}
    jobs = {int(j["JobId"]): j for j in sp.squeue_json_records(out("squeue_json"))}
    flagged = [i for i, j in raw.items() if len(j["job_state"]) > 1]
    assert flagged and all(jobs[i]["_flags"] == ",".join(raw[i]["job_state"][1:]) for i in flagged)
    assert all(jobs[i]["_flags"] == "" for i in raw if i not in flagged)
    assert all(j["_het"] is None and j["Priority"] == "1" for j in jobs.values())


def test_slurmdbd_settings_are_read_from_25_11s_sacctmgr_too():
    text = (FIX / "sacctmgr_show_configuration.stdout").read_text()
    dbd = sp.parse_slurmdbd_config(text)
    assert dbd["PrivateData"] == "none" and dbd["SLURMDBD_VERSION"].startswith("25.11")
    assert "SLURM_VERSION" not in dbd


def test_auto_backend_falls_back_to_the_cli_when_pyslurm_will_not_load(monkeypatch, tmp_path):
    """A pyslurm built for this Slurm whose libslurm is gone had been chosen anyway: every
    command then failed although the CLI worked. Forced, it is still pyslurm (and one line)."""
    import sys

    from slurm_horus.errors import HorusError
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm import pyslurm_backend

    broken = tmp_path / "pyslurm"
    broken.mkdir()
    (broken / "version.py").write_text('__version__ = "25.11.0"\n')
    (broken / "__init__.py").write_text(
        'raise ImportError("libslurm.so.43: cannot open shared object file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    monkeypatch.setattr(slurm, "slurm_version", lambda: "25.11.7")
    monkeypatch.setattr(slurm, "_chosen", {})
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "auto")
    assert slurm._pyslurm_version() == "25.11.0" and slurm.backend() == "cli"
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "pyslurm")
    assert slurm.backend() == "pyslurm"
    with pytest.raises(HorusError, match="pyslurm does not import .*libslurm.so.43"):
        pyslurm_backend.nodes()


def test_auto_backend_reads_with_the_tools_what_pyslurms_parser_cannot(monkeypatch):
    """pyslurm's Gres parser fails on a count Slurm writes as 1K (1,024 shards a node): every
    hsubmit of such a site lost its GPU types. Auto mode reads those records with scontrol."""
    from types import SimpleNamespace

    from slurm_horus.errors import HorusError
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm import pyslurm_backend

    def unparsable():
        raise ValueError("invalid literal for int() with base 10: '1K'")  # what pyslurm raises
    fake = SimpleNamespace(PyslurmError=RuntimeError, Nodes=SimpleNamespace(load=unparsable))
    monkeypatch.setattr(pyslurm_backend, "load", lambda: fake)
    monkeypatch.setattr(slurm, "backend", lambda: "pyslurm")
    asked = []
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30: asked.append(args) or out("scontrol_show_node"))
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "auto")
    nodes = slurm.scontrol_nodes()
    assert asked == [["scontrol", "-o", "--all", "show", "node"]] and {n["NodeName"] for n in nodes} >= {"gpu-a100"}
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "pyslurm")  # forced: its error, in one line
    with pytest.raises(HorusError, match="pyslurm nodes: ValueError: invalid literal .*'1K'"):
        slurm.scontrol_nodes()
