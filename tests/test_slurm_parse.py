"""slurm.parse and slurm.sbatch_args on the outputs of the real Slurm 22.05.8 daemons recorded by
tests/cluster/record_fixtures.py in tests/fixtures/slurm (job ids from its index.json)."""

import json
from pathlib import Path

import pytest

from slurm_horus.slurm import parse as sp
from slurm_horus.slurm import sbatch_args as sa

FIX = Path(__file__).parent / "fixtures" / "slurm"
META = json.loads((FIX / "index.json").read_text())
INDEX = {f["name"]: f for f in META["fixtures"]}
IDS = META["job_ids"]


def out(name, stream="stdout"):
    return (FIX / INDEX[name][stream]).read_text()


def test_recorded_on_22_05_with_the_hook():
    assert META["slurm_version"].startswith("slurm-wlm 22.05.") and META["job_submit_lua"]


def test_sbatch_stdout_job_ids():
    assert sp.parse_sbatch_stdout(out("sbatch_submit")) == str(IDS["running_shard_job"])
    assert sp.parse_sbatch_stdout(out("sbatch_parsable")) == str(IDS["finished_shard_job"])
    assert sp.parse_sbatch_stdout(out("sbatch_parsable_gpu")) == str(IDS["running_gpu_job"])
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
    # asked for gpu:1 with a light hint: the hook packed it into shards (22.05: gres:shard:N)
    job = sp.parse_scontrol_records(out("scontrol_show_job_running_shard"))[0]
    assert job["JobId"] == str(IDS["running_shard_job"]) and job["JobState"] == "RUNNING"
    assert job["TresPerNode"].startswith("gres:shard:") and job["Comment"].startswith("fixture-running")
    shards = int(job["TresPerNode"].rsplit(":", 1)[1])
    (d,) = sp.job_gres_detail(job)
    assert d["node"] == job["NodeList"]
    (g,) = d["gres"]
    assert (g["name"], g["count"]) == ("shard", shards) and len(g["idx"]) == 1
    assert job["AdminComment"].startswith("horus: shared")


def test_show_job_whole_gpu_detail():
    job = sp.parse_scontrol_records(out("scontrol_show_job_running_gpu"))[0]
    assert job["JobId"] == str(IDS["running_gpu_job"]) and job["Partition"] == "a100"
    (d,) = sp.job_gres_detail(job)
    (g,) = d["gres"]
    assert (g["name"], g["type"], g["count"]) == ("gpu", "a100", 1) and len(g["idx"]) == 1


def test_parse_gres_forms():
    assert sp.parse_gres("gres:shard:t4:10") == [{"name": "shard", "type": "t4", "count": 10, "idx": None}]
    assert sp.parse_gres("gres/shard=3")[0]["name"].startswith("shard")
    assert sp.parse_gres("gpu:a100:2(IDX:0-1),shard:0(IDX:N/A)")[0]["idx"] == [0, 1]
    assert sp.parse_gres("(null)") == [] and sp.parse_gres(None) == []


def test_parse_gres_count_suffix():
    """Slurm prints a count that is a multiple of 1024 as nK/nM (gres.c, _get_suffix): four GPUs
    of 256 shards read as one shard made the queue loop never pack that type."""
    got = sp.parse_gres("gpu:a100:4,shard:a100:1K")
    assert [g["count"] for g in got] == [4, 1024] and got[1]["type"] == "a100"
    assert sp.parse_gres("shard:2M(IDX:0)")[0]["count"] == 2 * 1024 ** 2
    assert sp.parse_gres("gpu:3090:4")[0] == {"name": "gpu", "type": "3090", "count": 4, "idx": None}
    # slurm.conf and gres.conf take the suffix in either case (gres.c, _get_gres_cnt)
    assert [g["count"] for g in sp.parse_gres("shard:a100:1k,shard:2m")] == [1024, 2 * 1024 ** 2]
    assert sp.gres_count("1K") == sp.gres_count("1k") == 1024 and sp.gres_count("1x") is None


def test_squeue_json_gres_detail():
    jobs = {int(j["JobId"]): j for j in sp.squeue_json_records(out("squeue_json"))}
    shard, gpu = jobs[IDS["running_shard_job"]], jobs[IDS["running_gpu_job"]]
    got = sp.job_gpus_on_node(shard, shard["NodeList"])
    assert got["shards"] == int(shard["TresPerNode"].rsplit(":", 1)[1]) and len(got["indices"]) == 1
    assert sp.job_gpus_on_node(gpu, "gpu-a100")["gpus"] == 1
    assert gpu["TresPerNode"] == "gres:gpu:1" and shard["Comment"].startswith("fixture-running")


def test_a_json_reply_that_names_errors_is_an_error_not_an_empty_queue():
    # recorded with slurmctld unreachable: 22.05's squeue --json exits 0 with no jobs and the
    # failure in "errors"; read as an empty queue, horus-admin queue saw no pressure and wrote so
    from slurm_horus.errors import HorusError
    from slurm_horus.slurm.accounting import parse_sacct_json

    assert INDEX["squeue_json_unreachable"]["exit_code"] == 0
    with pytest.raises(HorusError, match="squeue --json: Failed while looking for jobs"):
        sp.squeue_json_records(out("squeue_json_unreachable"))
    reply = json.loads(out("squeue_json_unreachable"))
    with pytest.raises(HorusError, match="^sacct --json: Failed"):
        parse_sacct_json(reply)
    with pytest.raises(HorusError, match="^sinfo --json: Failed"):
        sp.sinfo_json_nodes(json.dumps({**reply, "nodes": []}))
    from slurm_horus.sim.replay import from_sacct_json

    with pytest.raises(HorusError, match="^sacct json: Failed"):  # horus-admin simulate --sacct
        from_sacct_json(json.dumps(reply), ["a100"])
    assert sp.squeue_json_records(out("squeue_json"))  # "errors": [] is no error


def test_a_window_without_jobs_is_an_empty_answer_not_an_error():
    # recorded: 22.05's sacct --json over a window without jobs says "Nothing found" in errors;
    # taken for a failure, horus-admin sync failed on every quiet window
    from slurm_horus.slurm.accounting import parse_sacct_json

    reply = json.loads(out("sacct_json_empty_window"))
    assert INDEX["sacct_json_empty_window"]["exit_code"] == 0 and reply["errors"]
    assert parse_sacct_json(out("sacct_json_empty_window")) == []
    with pytest.raises(Exception, match="Failed"):  # beside a real failure, it hides nothing
        parse_sacct_json({**reply, "errors": reply["errors"] + json.loads(out("squeue_json_unreachable"))["errors"]})


def test_squeue_and_sinfo_text():
    rows = {r["JOBID"]: r for r in sp.parse_pipe_table(out("squeue_text"))}
    shard = rows[str(IDS["running_shard_job"])]
    assert shard["TRES_PER_NODE"].startswith("gres:shard:") and shard["STATE"] == "RUNNING"
    rows = sp.parse_pipe_table(out("sinfo_text"))
    assert {r["NODELIST"] for r in rows} == {"gpu-a100", "gpu-t4"}
    assert sp.gpu_types_of_node({"Gres": rows[0]["GRES"]}) == {"a100": 4}


def test_sinfo_json_nodes():
    nodes = {n["name"]: n for n in sp.sinfo_json_nodes(out("sinfo_json"))}
    assert nodes["gpu-a100"]["gpu_types"] == {"a100": 4}
    assert set(nodes["gpu-t4"]["partitions"]) == {"gpu", "t4"}


def test_sacct_pipe_table():
    rows = sp.parse_pipe_table(out("sacct_text_finished_shard"))
    assert rows[0]["JobID"] == str(IDS["finished_shard_job"]) and "gres/shard=" in rows[0]["AllocTRES"]
    assert rows[0]["Comment"].startswith("fixture-done") and rows[1]["JobID"].endswith(".batch")


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


def test_squeue_json_says_why_a_job_waits_and_its_state_flags():
    # recorded: 22.05 gives a held job's reason and priority 0 (a held job is no GPU load)
    recs = {r["JobId"]: r for r in sp.squeue_json_records(out("squeue_json"))}
    held = [r for r in recs.values() if r["Reason"] == "JobHeldUser"]
    assert held and all(r["Priority"] == "0" for r in held)
    assert all(r["_flags"] == "" and r["_het"] is None for r in recs.values())
    assert all(isinstance(r["_submit"], int) for r in recs.values())


def test_show_config_slurm_user_and_private_data():
    conf = sp.parse_scontrol_config(out("scontrol_show_config"))
    assert sp.config_user_id(conf["SlurmUser"]) == 0  # the test cluster's daemons run as root
    assert conf["PrivateData"] == "none"
    assert sp.config_user_id("slurm(64030)") == 64030 and sp.config_user_id("slurm") is None


def test_batch_stdio_patterns_scontrol_leaves():
    # 22.05's scontrol shows StdErr=/tmp/oomt-%N-%t-%n-1118-root-wrap.err; slurmstepd wrote
    # /tmp/oomt-vm-0-0-1118-root-wrap.err on the test cluster (host "vm"), and %% as %
    f = {"N": "vm.example.org", "j": "1118", "u": "root", "x": "wrap"}
    assert sp.expand_batch_stdio("/tmp/oomt-%N-%t-%n-1118.err", f) == "/tmp/oomt-vm-0-0-1118.err"
    assert sp.expand_batch_stdio("/x/%%-%3t", {}) == "/x/%-000"
    assert sp.expand_batch_stdio("/x/e-%5j-%J-%s.err", f) == "/x/e-01118-1118.batch-batch.err"
    assert sp.expand_batch_stdio("/x/%N.err", {}) is None
    assert sp.expand_batch_stdio("/x/a\\%N.err", {}) == "/x/a\\%N.err"  # taken literally


def test_an_array_task_is_looked_up_on_the_cluster_asked(monkeypatch):
    from slurm_horus.slurm import commands

    seen = []
    monkeypatch.setattr(commands, "run", lambda args, timeout=None: seen.append(args) or '{"jobs": []}')
    assert commands.array_task_job_ids([(7, 2)], "other") == {}
    assert seen[0][-4:] == ["-M", "other", "-j", "7_2"]


@pytest.mark.parametrize("fixtures", ["slurm", "slurm-25.11"])
def test_a_het_jobs_components_are_asked_for_in_one_sacct(monkeypatch, fixtures):
    """hacct -j N lists heterogeneous job N's components, as sacct -j N does: one sacct for all
    the ids, on N+K's cluster, within a short timeout. Ordinary jobs and an array's tasks (sacct -j lists
    them by the array's id) are no job's components. Recorded: sacct --json -j 2173,2175 and
    -j 2241 (22.05; 196,198 and 2099 on 25.11)."""
    from slurm_horus.slurm import commands

    idx = {f["name"]: f for f in json.loads((FIX.parent / fixtures / "index.json").read_text())["fixtures"]}
    for name in ("sacct_json_finished", "sacct_json_finished_array"):
        f, seen = idx[name], []
        ids = [int(x) for x in f["command"][-1].split(",")]
        recorded = (FIX.parent / fixtures / f["stdout"]).read_text()
        monkeypatch.setattr(commands, "run", lambda args, timeout=None: seen.append((args, timeout)) or recorded)
        assert commands.het_job_component_ids(ids, "horus") == {}
        assert seen == [(["sacct", "--json", "--allusers", "-M", "horus", "-j", f["command"][-1]], commands.LOOKUP_TIMEOUT_S)]


@pytest.mark.parametrize("fixtures", ["slurm", "slurm-25.11"])
def test_a_recorded_het_job_is_found_by_its_leaders_id_and_by_its_components(monkeypatch, fixtures):
    """Recorded: sacct --json -j HETJOBID of a finished job of two components (gpu:1 in shards,
    one CPU). Each component is a job of its own id with (HetJobId, offset) beside it: -j N
    finds both (the leader's id is the first's), -j N+1 the second's own id."""
    from slurm_horus.slurm import commands
    from slurm_horus.slurm.accounting import parse_sacct_json

    idx = {f["name"]: f for f in json.loads((FIX.parent / fixtures / "index.json").read_text())["fixtures"]}
    f = idx["sacct_json_finished_het"]
    hid, recorded = f["het_job_id"], (FIX.parent / fixtures / f["stdout"]).read_text()
    own = {r["het"]: r["job_id"] for r in parse_sacct_json(recorded)}
    assert set(own) == {(hid, 0), (hid, 1)} and own[hid, 0] == hid and own[hid, 1] != hid
    monkeypatch.setattr(commands, "run", lambda args, timeout=None: recorded)
    assert commands.het_job_component_ids([hid, hid + 1000], None) == {hid: sorted(own.values())}
    assert commands.het_component_job_ids([(hid, 1), (hid, 2)]) == {(hid, 1): own[hid, 1]}


def test_slurmdbd_private_data_hides_jobs_from_sacct_and_so_from_hacct(monkeypatch):
    """sacct's privacy is slurmdbd.conf's PrivateData, which scontrol does not show: a site
    that set it there alone had its ledger treated as public (hacct -a listed every user)."""
    from slurm_horus.slurm import commands as slurm

    text = out("sacctmgr_show_configuration")
    dbd = sp.parse_slurmdbd_config(text)
    assert dbd["PrivateData"] == "none" and dbd["StorageType"] == "accounting_storage/mysql"
    assert "SLURM_VERSION" not in dbd and sp.parse_slurmdbd_config("no section") is None
    conf = out("scontrol_show_config")
    head, _, tail = text.partition("SlurmDBD configuration:")
    private_dbd = head + "SlurmDBD configuration:" + tail.replace("PrivateData            = none",
                                                                   "PrivateData            = accounts,jobs")
    for answer, want in ((text, False), (private_dbd, True)):
        monkeypatch.setattr(slurm, "run", lambda args, timeout=30, a=answer:
                            conf if args[0] == "scontrol" else a)
        assert slurm.private_jobs(unknown=None) is want

    def no_sacctmgr(args, timeout=30):
        if args[0] == "scontrol":
            return conf
        raise slurm.HorusError("sacctmgr: no answer")
    monkeypatch.setattr(slurm, "run", no_sacctmgr)
    assert slurm.private_jobs(unknown=None) is None and slurm.private_jobs(unknown=True) is True
    # slurmdbd away: sacctmgr prints slurm.conf's part alone and exits 0; that is no answer
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30:
                        conf if args[0] == "scontrol" else head)
    assert slurm.private_jobs(unknown=None) is None and slurm.private_jobs(unknown=True) is True


def test_the_queue_loop_knows_its_own_requeuehold_in_recorded_squeue_json():
    """Root's scontrol requeuehold leaves JobHeldUser and "job requeued in held state" (not
    JobHeldAdmin): the journal's heal had dropped exactly the jobs it exists for."""
    jid = INDEX["squeue_json_requeue_held"]["job_id"]
    (rec,) = [r for r in sp.squeue_json_records(out("squeue_json_requeue_held")) if r["JobId"] == str(jid)]
    assert rec["JobState"] == "PENDING" and rec["Reason"] == "JobHeldUser"
    assert sp.held_by_requeue(rec)
    assert not sp.held_by_requeue({**rec, "Reason": "JobHeldAdmin"})
    assert not sp.held_by_requeue({**rec, "StateDesc": ""})


def test_an_array_records_tasks_are_counted_never_expanded():
    from slurm_horus.slurm.parse import array_task_count

    cases = {"1-100": 100, "1-99:2": 50, "3,5,7-9": 5, "0-31%4": 4, "1-3%0": 3, "7": 1,
             "0-4294967294": 4294967295, "": 1, "9-1": 1, "1-5:0": 1, "a-b": 1}
    assert {t: array_task_count(t) for t in cases} == cases


def test_the_cli_backend_reads_hidden_partitions_as_pyslurm_does(monkeypatch):
    """pyslurm loads nodes and partitions with SHOW_ALL; a user's scontrol without --all leaves
    out Hidden partitions (and those their AllowGroups exclude), their names in a node's
    Partitions= and nodes in no other (slurmctld's _node_is_hidden, scontrol's
    slurm_populate_node_partitions): ``hsubmit -p debug`` found "no node" on the CLI alone."""
    from slurm_horus.slurm import commands as slurm

    def scontrol(args, timeout=30):  # what Slurm shows a user, by its show flags
        every = "--all" in args or "-a" in args
        kind = args[args.index("show") + 1]
        if kind == "partition":
            return ("PartitionName=gpu Default=YES Hidden=NO Nodes=gpu-[1-2]\n"
                    + ("PartitionName=debug Default=NO Hidden=YES Nodes=gpu-2,h100-1\n" if every else ""))
        assert args[0] == "scontrol" and kind == "node", args
        return ("NodeName=gpu-1 Gres=gpu:a100:4 Partitions=gpu State=IDLE\n"
                f"NodeName=gpu-2 Gres=gpu:t4:2 Partitions={'gpu,debug' if every else 'gpu'} State=IDLE\n"
                + ("NodeName=h100-1 Gres=gpu:h100:8 Partitions=debug State=IDLE\n" if every else ""))
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "cli")
    monkeypatch.setattr(slurm, "_chosen", {})
    monkeypatch.setattr(slurm, "run", scontrol)
    assert slurm.partition_gpu_types("debug") == ("debug", {"t4": 2, "h100": 8})
    assert [p["PartitionName"] for p in slurm.scontrol_partitions()] == ["gpu", "debug"]
    assert slurm.node_gpu_types() == {"gpu-1": "a100", "gpu-2": "t4", "h100-1": "h100"}


def test_sacct_j_lookups_of_many_array_tasks_stay_within_one_arguments_limit(tmp_path, monkeypatch):
    """Linux refuses one argument over 128 KiB (E2BIG): 20,000 array tasks named in one sacct -j
    had made the lookup fail ("Argument list too long"). Slurm's stand-in is a real program, so
    the kernel's limit is the real one; it answers for the two tasks accounting knows."""
    import os
    import sys
    from slurm_horus.slurm import commands as slurm

    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!{sys.executable}\n" + """import json, sys
names = sys.argv[sys.argv.index("-j") + 1].split(",")
known = {"9_1": 10, "9_19999": 11}
print(json.dumps({"jobs": [{"job_id": known[n], "array": {"job_id": 9, "task_id": int(n[2:])}}
                           for n in names if n in known]}))
""")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert slurm.array_task_job_ids([(9, t) for t in range(20000)]) == {(9, 1): 10, (9, 19999): 11}


def test_a_gpu_type_of_digits_is_read_by_the_tools_not_as_pyslurms_count(monkeypatch):
    """pyslurm 25.11.2's to_gres_dict reads Gres=gpu:3090:2,shard:3090:200 as
    {"gpu": 3090, "shard": 3090} (untyped, the type as the count): the pyslurm backend gave the
    partition no GPU type, so no prediction, where scontrol gives 3090:2. An untyped GPU from
    pyslurm is ambiguous: the tools read that node (auto), forced pyslurm says so in one line."""
    from types import SimpleNamespace

    from slurm_horus.errors import HorusError
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm import pyslurm_backend

    node = SimpleNamespace(name="n1", configured_gres={"gpu": 3090, "shard": 3090},
                           partitions=["gpu"], available_features=[], active_features=[])
    fake = SimpleNamespace(PyslurmError=type("PyslurmError", (Exception,), {}),
                           Nodes=SimpleNamespace(load=lambda: {"n1": node}))
    monkeypatch.setattr(pyslurm_backend, "load", lambda: fake)
    monkeypatch.setattr(slurm, "run", lambda args, timeout=30:
                        "NodeName=n1 Gres=gpu:3090:2,shard:3090:200 Partitions=gpu State=IDLE\n")
    monkeypatch.setattr(slurm, "_chosen", {"auto": "pyslurm", "pyslurm": "pyslurm"})
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "auto")
    assert slurm.partition_gpu_types("gpu") == ("gpu", {"3090": 2})
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "pyslurm")
    with pytest.raises(HorusError, match="type of digits"):
        slurm.scontrol_nodes()


def test_slurm_queries_ignore_the_callers_display_defaults(tmp_path, monkeypatch):
    """squeue honours SQUEUE_USERS, sinfo SINFO_PARTITION...: an admin who keeps one in their
    shell narrowed `horus-admin queue`'s view of the queue to those users' jobs."""
    import os

    from slurm_horus.slurm import commands

    fake = tmp_path / "squeue"
    fake.write_text('#!/bin/sh\necho "users=$SQUEUE_USERS states=$SQUEUE_STATES conf=$SLURM_CONF"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SQUEUE_USERS", "alice")
    monkeypatch.setenv("SQUEUE_STATES", "R")
    monkeypatch.setenv("SLURM_CONF", "/etc/x/slurm.conf")
    assert commands.run(["squeue", "--json"]).strip() == "users= states= conf=/etc/x/slurm.conf"


def test_the_cli_backend_reads_nodes_under_posixly_correct(tmp_path, monkeypatch):
    """scontrol parses its options with getopt_long, which stops at the first word when
    POSIXLY_CORRECT is set: ``scontrol show node -o --all`` then has two words too many
    ("too many arguments for keyword:show", 22.05.8 and 25.11's scontrol.c), and hsubmit of a
    user who set it found no node.  The stand-in parses as scontrol does (Python's gnu_getopt
    honours POSIXLY_CORRECT as glibc's does) and answers with the recorded nodes."""
    import os
    import sys
    from slurm_horus.slurm import commands as slurm

    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!{sys.executable}\n" + f"""import getopt, sys
opts, words = getopt.gnu_getopt(sys.argv[1:], "adhM:FoQu:vV", ["all", "oneliner", "details"])
if words[:1] == ["show"] and len(words) > 3:
    sys.exit("too many arguments for keyword:show")
sys.stdout.write(open({str(FIX / "scontrol_show_node.stdout")!r}).read())
""")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("POSIXLY_CORRECT", "1")
    monkeypatch.setenv("HORUS_SLURM_BACKEND", "cli")
    monkeypatch.setattr(slurm, "_chosen", {})
    assert {n["NodeName"] for n in slurm.scontrol_nodes()} >= {"gpu-a100", "gpu-t4"}


def test_slurm_queries_ask_this_cluster_whatever_slurm_clusters_says(tmp_path, monkeypatch):
    """scontrol, sinfo and squeue ask the cluster SLURM_CLUSTERS names (pyslurm never does): a
    user's SLURM_CLUSTERS=far had made ``scontrol show config`` answer far's ClusterName, so
    hsubmit took far for this cluster and hinted a job sent there for this one's GPU types."""
    import os

    from slurm_horus.slurm import commands

    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\necho "ClusterName = ${SLURM_CLUSTERS:-here}"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CLUSTERS", "far")
    assert commands.local_cluster() == "here"
