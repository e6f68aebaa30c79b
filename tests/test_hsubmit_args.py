"""hsubmit's argument splitting, #SBATCH/#HORUS parsing and comment merging (pure, no Slurm)."""

import io
import os
import sys
from pathlib import Path

import pytest

from slurm_horus.slurm import sbatch_args as sa
from slurm_horus.slurm import submit as sub
from slurm_horus.errors import HorusError
from slurm_horus.slurm.hint import MAX_SLURM_COMMENT, attach_hint, parse_hint, parse_workload


def split(*argv):
    return sa.split_args(list(argv))


def test_no_horus_options_is_identity():
    argv = ["-p", "gpu", "--gres=gpu:1", "-J", "name", "--wrap", "sleep 60"]
    s = split(*argv)
    assert s.horus == [] and s.sbatch_argv() == argv and s.rest == []


def test_horus_options_exact_and_equals_forms():
    s = split("--model", "m.onnx", "--batch-size=32", "--dim", "seq=128", "--dim=x=2",
              "--task", "infer", "--optimizer=sgd", "--precision", "amp", "--explain",
              "--horus-model-dir", "/reg", "-p", "gpu", "job.sh")
    assert s.horus == [("model", "m.onnx"), ("batch-size", "32"), ("dim", "seq=128"),
                       ("dim", "x=2"), ("task", "infer"), ("optimizer", "sgd"),
                       ("precision", "amp"), ("explain", None), ("horus-model-dir", "/reg")]
    assert s.sbatch_opts == ["-p", "gpu"] and s.rest == ["job.sh"]


@pytest.mark.parametrize("tok", ["--batch=x", "--batch", "--mod=x", "--tas=1", "--tasks-per-node=2",
                                 "--expl", "--model-dir=x", "--precis=fp16"])
def test_prefixes_and_lookalikes_go_to_sbatch(tok):
    s = split(tok, "--wrap", "true")
    assert s.horus == []
    assert s.sbatch_argv() == [tok, "--wrap", "true"]


def test_sbatch_batch_option_takes_a_value():
    # --batch is sbatch's (batch step node features) with a required value
    s = split("--batch", "haswell", "--model", "m.onnx", "run.sh")
    assert s.sbatch_opts == ["--batch", "haswell"] and s.horus == [("model", "m.onnx")]
    assert sa.last_value(s.parsed, "batch") == "haswell"


def test_separate_values_are_not_the_script():
    s = split("-p", "gpu", "-J", "name", "--gres", "gpu:1", "-c", "4", "--part", "a100",
              "--model", "m.onnx", "job.sh", "arg1")
    assert s.rest == ["job.sh", "arg1"]
    assert sa.last_value(s.parsed, "partition") == "a100"      # --part is a prefix of --partition
    assert sa.last_value(s.parsed, "gres") == "gpu:1"
    assert sa.last_value(s.parsed, "job-name") == "name"
    assert sa.last_value(s.parsed, "cpus-per-task") == "4"


def test_short_clusters_and_attached_values():
    s = split("-Hpgpu", "-vv", "-Jx", "-c2", "script.sh")
    names = [(o.name, o.value) for o in s.parsed]
    assert ("hold", None) in names and ("partition", "gpu") in names
    assert ("job-name", "x") in names and ("cpus-per-task", "2") in names
    assert s.rest == ["script.sh"]


def test_required_value_takes_next_token_whatever_it_is():
    s = split("-J", "--model", "x.sh")  # like getopt: --model is the job name
    assert s.horus == [] and s.rest == ["x.sh"] and sa.last_value(s.parsed, "job-name") == "--model"


def test_script_args_looking_like_horus_options_are_left_alone():
    s = split("--model", "m.onnx", "train.sh", "--model", "other", "--batch-size", "3", "--explain")
    assert s.horus == [("model", "m.onnx")]
    assert s.rest == ["train.sh", "--model", "other", "--batch-size", "3", "--explain"]


def test_wrap_with_separate_value_and_double_dash():
    s = split("--wrap", "python train.py --model x", "--model", "m.onnx")
    assert sa.last_value(s.parsed, "wrap") == "python train.py --model x"
    assert s.horus == [("model", "m.onnx")] and s.rest == []
    s = split("--", "--model", "x")
    assert s.horus == [] and s.rest == ["--model", "x"]


def test_optional_value_options_do_not_eat_the_script():
    s = split("--exclusive", "job.sh", "--nice", "a")
    assert s.rest == ["job.sh", "--nice", "a"]
    s = split("--nice=5", "--exclusive=user", "--propagate", "job.sh")
    assert s.rest == ["job.sh"]


def test_missing_horus_value_is_an_error():
    assert split("--model").errors


def test_option_table_matches_sbatch_help():
    # every long option in sbatch 22.05's --help takes the kind of value it shows there
    for name in ("partition", "gres", "gpus", "constraint", "comment", "wrap", "job-name",
                 "cpus-per-task", "batch", "output", "chdir", "export", "array", "time"):
        assert sa.SBATCH_LONG_OPTS[name] == "required"
    for name in ("parsable", "hold", "wait", "test-only", "contiguous"):
        assert sa.SBATCH_LONG_OPTS[name] == "none"
    assert sa.resolve_long("part") == "partition"
    # sbatch takes --task as its hidden --tasks-per-node (22.05 and 25.11): hsubmit's --task only
    # when a model is asked (test_task_without_a_model_is_sbatchs)
    assert sa.resolve_long("tas") == sa.resolve_long("task") == "tasks-per-node"
    assert sa.resolve_long("ntasks-per") is None  # ambiguous
    assert sa.resolve_long("cpus-per-t") == "cpus-per-task"



def test_prefixes_22_05_reads_as_one_option_are_that_option():
    """25.11's options in the one table made --cons (22.05: constraint), --res, --ext, --conta
    look ambiguous: hsubmit read the value as the script, stopped reading #SBATCH lines after
    it, and a user's --comment further down was replaced by the hint."""
    for prefix, name in (("cons", "constraint"), ("res", "reservation"),
                         ("ext", "extra-node-info"), ("conta", "container")):
        assert sa.resolve_long(prefix) == name, prefix
    opts = sa.parse_sbatch_tokens(sa.script_directives(
        "#!/bin/sh\n#SBATCH --cons a100\n#SBATCH -p a100\n#SBATCH --comment=keepme\nhostname\n").sbatch)
    assert [sa.last_value(opts, k) for k in ("constraint", "partition", "comment")] == ["a100", "a100", "keepme"]
    assert sa.resolve_long("cont") is None  # contiguous, container: ambiguous on 22.05 too


SCRIPT = """#!/bin/bash
# a comment
#SBATCH -p a100 --gres=gpu:1
#SBATCH --comment="my run"   # trailing comment
#HORUS --model=/m/resnet.onnx --batch-size 16
#HORUS --dim seq=128

#SBATCH --job-name=x
echo hello
#SBATCH --partition=t4
#HORUS --task=infer
"""


def test_script_directives_only_leading_block():
    d = sa.script_directives(SCRIPT)
    sb, hz = d.sbatch, d.horus
    assert sb == ["-p", "a100", "--gres=gpu:1", "--comment=my run", "--job-name=x"]
    assert hz == ["--model=/m/resnet.onnx", "--batch-size", "16", "--dim", "seq=128"]
    opts = sa.parse_sbatch_tokens(sb)
    assert sa.last_value(opts, "partition") == "a100"
    assert sa.last_value(opts, "comment") == "my run"


def test_indented_sbatch_is_not_a_directive_and_command_stops():
    sb = sa.script_directives("#!/bin/sh\n  #SBATCH -p x\n#SBATCH -p y\n  \nls\n#SBATCH -p z\n").sbatch
    assert sb == ["-p", "y"]


def test_prepare_merges_horus_lines_command_line_wins(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    plan = sub.prepare(["--batch-size", "64", "-c", "3", str(script), "--model", "ignored"], env={})
    assert plan.model == "/m/resnet.onnx" and plan.horus["batch-size"] == "64"
    assert plan.horus["dim"] == ["seq=128"] and "task" not in plan.horus
    assert plan.request("partition") == "a100" and plan.request("cpus-per-task") == "3"
    assert plan.user_comment() == "my run"


def test_request_precedence_cmdline_env_script(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p a100\nls\n")
    assert sub.prepare([str(script)], env={}).request("partition") == "a100"
    assert sub.prepare([str(script)], env={"SBATCH_PARTITION": "t4"}).request("partition") == "t4"
    assert sub.prepare(["-p", "gpu", str(script)], env={"SBATCH_PARTITION": "t4"}).request("partition") == "gpu"


def test_sbatch_account_overrides_the_scripts_account_as_in_sbatch(tmp_path):
    """sbatch reads SBATCH_ACCOUNT after #SBATCH -A: --explain had judged the job under the
    script's account (and its claim record), not the one the job goes under."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -A proj\nls\n")
    assert sub.job_desc_of(sub.prepare([str(script)], env={}))["account"] == "proj"
    assert sub.job_desc_of(sub.prepare([str(script)], env={"SBATCH_ACCOUNT": "other"}))["account"] == "other"
    assert sub.job_desc_of(sub.prepare(["-A", "cli", str(script)], env={"SBATCH_ACCOUNT": "other"}))["account"] == "cli"
    # set but empty: sbatch sends none, and slurmctld takes the user's default account
    assert "account" not in sub.job_desc_of(sub.prepare([str(script)], env={"SBATCH_ACCOUNT": ""}))


def test_an_empty_input_variable_overrides_the_script_as_in_sbatch(tmp_path):
    """sbatch applies an SBATCH_* variable that is set but empty over #SBATCH (export
    SBATCH_GRES=$G with G unset): hsubmit had read the script's request and hinted a job that
    asked for no GPU."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p a100\n#SBATCH --gres=gpu:1\nls\n")
    assert sub.prepare([str(script)], env={"SBATCH_PARTITION": ""}).request("partition") == ""
    assert sub.asks_for_gpus(sub.prepare([str(script)], env={}))
    assert not sub.asks_for_gpus(sub.prepare([str(script)], env={"SBATCH_GRES": ""}))


def test_stdin_script_is_read_where_the_command_line_has_horus_options():
    data = b"#!/bin/sh\n#SBATCH -p t4\n#HORUS --batch-size=4\nls\n"
    plan = sub.prepare(["--model", "m.onnx"], env={}, stdin=io.BytesIO(data))
    assert plan.stdin_script == data and plan.request("partition") == "t4"
    assert plan.horus["batch-size"] == "4"
    # a #HORUS line may name the model the command line's --task belongs to: read
    named = data.replace(b"=4", b"=4 --model=m.onnx")
    plan = sub.prepare(["--task", "train"], env={}, stdin=io.BytesIO(named))
    assert plan.stdin_script is not None and plan.model == "m.onnx" and plan.horus["task"] == "train"
    # plain sbatch use is sbatch's to read (it reads none with --external, or when it refuses
    # an option: hsubmit waited on a pipe sbatch never reads); nor with --wrap
    for argv in (["-p", "gpu"], ["--external", "--model", "m.onnx"], ["--wrap", "true", "--model", "m.onnx"]):
        assert sub.prepare(argv, env={}, stdin=io.BytesIO(named)).stdin_script is None, argv


def test_a_stdin_script_is_read_without_reserving_sbatchs_whole_limit():
    class Stream(io.BytesIO):
        def read(self, n=-1):
            assert 0 < n <= 1 << 20  # read(512 MiB + 1) reserved it all: MemoryError under ulimit -v
            return super().read(n)

    data = b"#!/bin/sh\n" + b"#" * (3 << 20) + b"\nls\n"
    assert sub.prepare(["--model", "m.onnx"], env={}, stdin=Stream(data)).stdin_script == data


def test_ignore_pbs_on_the_command_line_or_in_the_environment_keeps_the_hint(tmp_path):
    script = tmp_path / "pbs.sh"
    script.write_text("#!/bin/bash\n#PBS -N foo\n#SBATCH -p gpu\ntrue\n")
    assert sub.prepare([str(script)], env={}).script_translated == "#PBS"
    assert sub.prepare(["--ignore-pbs", str(script)], env={}).script_translated is None
    assert sub.prepare([str(script)], env={"SBATCH_IGNORE_PBS": "1"}).script_translated is None


HINT = "horus:v1;a100=10.0/2000/2500;t4=20.0/2000/2500"


def test_comment_merging_single_comment_passed():
    s = split("--comment", "mine", "-p", "gpu", "--comm=second", "--wrap", "true")
    out = s.sbatch_argv(replace_comment=attach_hint("second", HINT))
    assert out == [f"--comment=second {HINT}", "-p", "gpu", "--wrap", "true"]
    assert sum(a.startswith("--comm") for a in out) == 1


def test_our_comment_goes_first_so_nothing_can_come_between():
    """A '--' before the script, or an option this table does not know with its value: the
    comment put at the end took the script's place, or the option's value."""
    for args in (["-H", "--", "job.sh"], ["--segment", "1", "job.sh"], ["--new-option", "v", "job.sh"]):
        out = split(*args).sbatch_argv(replace_comment=HINT)
        assert out == [f"--comment={HINT}", *args], out


def test_task_without_a_model_is_sbatchs(tmp_path):
    plan = sub.prepare(["-H", "--task", "1", "-n", "2", "--wrap", "true"], env={})
    assert "task" not in plan.horus and plan.sbatch_argv == ["-H", "--task", "1", "-n", "2", "--wrap", "true"]
    plan = sub.prepare(["--model", "m.onnx", "--task", "infer", "--wrap", "true"], env={})
    assert plan.horus["task"] == "infer" and "--task" not in plan.sbatch_argv


def test_a_script_that_is_a_pipe_is_left_for_sbatch(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plan = sub.prepare(["-H", str(fifo)], env={})  # returns: the pipe is not opened
    assert plan.script_text is None and plan.sbatch_argv == ["-H", str(fifo)]


def test_help_version_usage_read_no_stdin():
    class Endless:
        def read(self, *a):
            raise AssertionError("stdin read")
    for flag in ("--help", "--version", "--usage"):
        plan = sub.prepare(["--model", "m.onnx", flag], env={}, stdin=Endless())
        assert plan.stdin_script is None


def test_comment_merging_replaces_old_hint():
    c = attach_hint("run 3 horus:v1;t4=1/1/1", HINT)
    assert c == f"run 3 {HINT}" and parse_hint(c)["t4"] == (20.0, 2000.0, 2500.0)
    assert attach_hint(None, HINT) == HINT


def test_predict_offline_and_job_desc(tmp_path):
    zoo = "tests/data/zoo/small_cnn.onnx"
    plan = sub.prepare(["--model", zoo, "--batch-size", "8", "--task", "infer",
                        "--gres=gpu:1", "--comment", "hello", "-C", "fast", "--wrap", "true"], env={})
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    assert set(parse_hint(plan.comment)) == {"a100", "t4"}
    assert plan.comment.startswith("hello horus:v1;")
    jd = sub.job_desc_of(plan)
    assert jd["tres_per_node"] == "gres:gpu:1" and jd["features"] == "fast"
    assert jd["comment"] == plan.comment
    argv = plan.sbatch_argv
    assert argv.count(f"--comment={plan.comment}") == 1 and "hello" not in argv
    # the workload token follows the hint: what sync needs to recompute the features
    job = parse_workload(plan.comment, strict=True)
    assert job == {"sha": plan.report.sha256, "bs": 8, "task": "infer", "opt": "adam",
                   "prec": "fp32", "model": str(Path(zoo).resolve())}
    assert plan.comment.index("horus:v1;") < plan.comment.index("horus-job:v1;")


@pytest.mark.parametrize("user_len, kept", [(0, "model"), (830, "dims"), (855, "sha"),
                                             (950, "hint"), (1000, None)])
def test_comment_never_passes_slurms_limit(user_len, kept):
    """Dropped to fit, in order: model=, dims=, the workload token, the hint (job submitted)."""
    zoo = "tests/data/zoo/bert_base.onnx"
    argv = ["--model", zoo, "--batch-size", "8", "--dim", "seq=128", "--wrap", "true"]
    if user_len:
        argv += ["--comment", "c" * user_len]
    plan = sub.prepare(argv, env={})
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    if kept is None:
        assert plan.hint is None and any("no room for the hint" in w for w in plan.warnings)
        assert plan.sbatch_argv[-2:] == ["--comment", "c" * user_len]  # as the user gave it
        return
    assert len(plan.comment.encode()) <= MAX_SLURM_COMMENT
    job = parse_workload(plan.comment) or {}
    assert ("model" in job) == (kept == "model")
    assert ("dims" in job) == (kept in ("model", "dims"))
    assert ("sha" in job) == (kept != "hint")
    assert parse_hint(plan.comment)
    # the user hears when the run cannot teach the site (the path, or the whole token, dropped)
    assert plan.warnings == ([] if kept == "model" else
                             [w for w in plan.warnings if "the site cannot learn from this run" in w
                              and ("model's path" in w) == (kept != "hint")])
    assert len(plan.warnings) == (kept != "model")


def test_job_desc_gpus_and_nodes():
    plan = sub.prepare(["--gpus=a100:1", "-N", "1-2", "--cpus-per-gpu=4", "--wrap", "x"], env={})
    jd = sub.job_desc_of(plan)
    assert jd["tres_per_job"] == "gres:gpu:a100:1" and jd["min_nodes"] == 1 and jd["max_nodes"] == 2
    assert jd["cpus_per_tres"] == "gres:gpu:4"


@pytest.mark.parametrize("argv, env, want", [
    # the learned model's CPU input is CPUs per GPU, on both sides: this job had served as 8
    # (its --cpus-per-task) and trained as 32 (its CPUs in all)
    (["--gres=gpu:4", "--ntasks-per-node=4", "-c", "8"], {}, 8.0),
    (["--cpus-per-gpu=8", "--gpus=2"], {}, 8.0),  # had served as 1 (no --cpus-per-task)
    (["--gpus=2"], {"SBATCH_CPUS_PER_GPU": "6"}, 6.0),
    (["--gpus=2"], {}, 0.5),  # Slurm's one CPU for the job's one task
    (["-G", "a100:2,v100:2", "-c", "4"], {}, 1.0),
    (["-N", "2", "--gpus-per-node=4", "--ntasks-per-node=4", "-c", "8"], {}, 8.0),
    (["-N", "1-2", "--gpus-per-node=4", "--ntasks-per-node=4", "-c", "8"], {}, 8.0),  # either way 8
    (["-N", "2", "--gres=gpu:2", "-c", "4"], {}, 2.0),  # a task a node
    (["-n", "8", "--gpus-per-task=1", "-c", "6"], {}, 6.0),
    (["--ntasks-per-gpu=2", "--gpus=4", "-c", "3"], {}, 6.0),
    (["--task", "4", "--gres=gpu:2", "-c", "2"], {}, 4.0),  # sbatch's --tasks-per-node
    # what cannot be told is unknown (the model's missing value), never an error
    (["-N", "1-2", "--gpus=4", "--ntasks-per-node=4", "-c", "8"], {}, None),
    (["--gpus-per-socket=1", "-c", "6"], {}, None),
    (["--gres=shard:10"], {}, None),
    (["--gres=gpu:0"], {}, None),
    ([], {}, None),
    (["-c", "x", "--gpus=1"], {}, None),
    (["-n", "0", "--gpus=1"], {}, None),
    (["-N", "two", "--gpus-per-node=1"], {}, None),
    (["--cpus-per-gpu=none", "--gpus=1"], {}, None),
    (["--gpus=" + "9" * 60], {}, None),
    (["--gres=gpu:a100:1(IDX:x)"], {}, 1.0),
    # from the regression review: -n with --ntasks-per-node gives the nodes (2 here, 8 GPUs, 64
    # CPUs: 8, served as 16), and -n alone with GPUs per node may span nodes (unknown)
    (["--gres=gpu:4", "-n", "8", "--ntasks-per-node=4", "-c", "8"], {}, 8.0),
    (["--gres=gpu:1", "-n", "2", "--ntasks-per-node=1", "-c", "4"], {}, 4.0),
    (["--gres=gpu:1", "-n", "2", "-c", "4"], {}, None),
    (["--gres=gpu:1", "-N", "1", "-n", "2", "-c", "4"], {}, 8.0),
    # a -c on the command line overrides SBATCH_CPUS_PER_GPU, as in sbatch (slurm_opt.c)
    (["--gres=gpu:1", "-c", "8"], {"SBATCH_CPUS_PER_GPU": "2"}, 8.0),
    # --tres-per-task's cpu is the CPUs per task (23.02+)
    (["-n", "2", "--tres-per-task=cpu=4,gres/gpu:1"], {}, 4.0),
    # a count of thousands of digits is sbatch's to refuse, not an internal error
    (["--gres=gpu:1", "--cpus-per-gpu=" + "9" * 4301], {}, None),
    (["--gres=gpu:1", "--tasks-per-node=" + "9" * 4301], {}, None),
    (["--gpus=1", "-N", "1-x"], {}, None),  # had been an internal error (no max_nodes), no job
    (["--gpus=1", "-N", "1-99999999999"], {}, None),
])
def test_the_cpus_per_gpu_a_job_asks_for(argv, env, want):
    plan = sub.prepare([*argv, "--model", "m.onnx", "--wrap", "x"], env=env)
    assert sub.requested_cpus_per_gpu(plan) == want
    assert sub.check_options(plan)[0].cpus_per_gpu == want


def test_the_cpus_per_gpu_of_sbatch_lines(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gpus-per-node=2\n#SBATCH --ntasks-per-node=2\n"
                      "#SBATCH -c 16\n#HORUS --model=m.onnx\npython train.py\n")
    assert sub.check_options(sub.prepare([str(script)], env={}))[0].cpus_per_gpu == 16
    assert sub.check_options(sub.prepare(["-c", "4", str(script)], env={}))[0].cpus_per_gpu == 4
    # --tasks-per-node (the alias) on the command line wins over the script's --ntasks-per-node
    assert sub.check_options(sub.prepare(["--tasks-per-node=1", str(script)], env={}))[0].cpus_per_gpu == 8


def test_the_task_count_22_05s_sbatch_sends_without_n():
    """--ntasks-per-node=2 alone reached the local cluster's hook as 2 tasks (unchanged: they
    may span nodes), where --explain had shown the job shared."""
    def tasks(*argv):
        return sub.job_desc_of(sub.prepare([*argv, "--gres=gpu:1", "--wrap", "x"], env={})).get("num_tasks")
    assert tasks("--ntasks-per-node=2") == 2 and tasks("-N", "2", "--ntasks-per-node=2") == 4
    assert tasks("-N", "1-2", "--ntasks-per-node=2") is None and tasks("-n", "3", "--ntasks-per-node=2") == 3
    assert tasks() is None


def test_an_environment_cpus_per_gpu_gives_way_to_a_command_line_c():
    plan = sub.prepare(["--gres=gpu:1", "-c", "8", "--wrap", "x"], env={"SBATCH_CPUS_PER_GPU": "2"})
    assert "cpus_per_tres" not in sub.job_desc_of(plan)  # what the hook sees: sbatch drops it
    plan = sub.prepare(["--gres=gpu:1", "--wrap", "x"], env={"SBATCH_CPUS_PER_GPU": "2"})
    assert sub.job_desc_of(plan)["cpus_per_tres"] == "gres:gpu:2"


def test_a_scripts_cpus_per_gpu_replaced_by_the_environments_goes_with_it(tmp_path):
    """sbatch reads the script, then the environment, then the command line: the environment's
    value replaces the script's, and a -c on the command line then drops it (slurm_opt.c)."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --cpus-per-gpu=8\n#SBATCH --gres=gpu:2\n#HORUS --model=m.onnx\ntrue\n")
    plan = sub.prepare(["-c", "2", str(script)], env={"SBATCH_CPUS_PER_GPU": "4"})
    assert "cpus_per_tres" not in sub.job_desc_of(plan) and sub.requested_cpus_per_gpu(plan) == 1.0
    plan = sub.prepare([str(script)], env={"SBATCH_CPUS_PER_GPU": "4"})
    assert sub.requested_cpus_per_gpu(plan) == 4.0
    plan = sub.prepare([str(script)], env={})
    assert sub.requested_cpus_per_gpu(plan) == 8.0


def test_bad_model_raises_horus_error(tmp_path):
    bad = tmp_path / "x.onnx"
    bad.write_text("not onnx")
    for m in (str(bad), str(tmp_path / "missing.onnx")):
        plan = sub.prepare(["--model", m, "--wrap", "true"], env={})
        with pytest.raises(HorusError):
            sub.predict(plan, gpu_types={"t4": 1}, partition="gpu")


@pytest.mark.parametrize("bs", ["0", "-3", "x", "1.5"])
def test_a_batch_size_that_is_not_a_count_is_an_error_not_batch_1(bs):
    with pytest.raises(HorusError, match="--batch-size"):  # x: at prepare (no number: no value)
        plan = sub.prepare(["--model", "tests/data/zoo/small_cnn.onnx", "--batch-size", bs,
                            "--wrap", "true"], env={})
        sub.predict(plan, gpu_types={"t4": 1}, partition="gpu")


@pytest.mark.parametrize("argv,word", [
    (["--batch-size", "job.sh"], "job.sh"),  # no --model: it had been dropped with a warning and
    (["--batch-size", "./job.sh", "arg"], "./job.sh"),  # sbatch, given no script, read stdin
    (["--model", "m.onnx", "--batch-size", "job.sh"], "job.sh"),
    (["--batch-size", "--wrap", "true"], "--wrap"),
    (["-p", "gpu", "--batch-size", "", "job.sh"], ""),
])
def test_a_batch_size_without_its_value_is_an_error_not_the_scripts_name(argv, word, monkeypatch, capsys):
    """getopt gives a value-taking option the next word whatever it is: --batch-size job.sh
    took the script for the batch size.  A word that is no number after --batch-size is the
    script or an option, so the value is missing: one line saying so, nothing submitted."""
    from slurm_horus.cli import hsubmit
    from slurm_horus.slurm import commands

    s = sa.split_args(argv)
    assert s.errors and s.errors[0].startswith(f"option --batch-size needs a value: {word!r} after it")
    assert ("batch-size", word) not in s.horus
    sent = []
    monkeypatch.setattr(commands, "exec_sbatch", lambda a, stdin=None: sent.append(a) or sys.exit(0))
    monkeypatch.setattr(sys, "stdin", None)  # closed: nothing to read either way
    assert hsubmit.main(argv) == 2 and not sent
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hsubmit: error: option --batch-size needs a value: "), err
    for fine in (["--batch-size", "8", "job.sh"], ["--batch-size", "-3", "job.sh"], ["--batch-size=x", "job.sh"],
                 ["--batch-size", "8\r", "job.sh"], ["--batch-size", "\u00a08\n", "job.sh"]):  # bs=$(cat f)
        assert not sa.split_args(fine).errors  # a number, right or wrong, is its value (check_options judges)


def test_a_directory_as_the_model_is_not_a_missing_file(tmp_path):
    plan = sub.prepare(["--model", str(tmp_path), "--wrap", "true"], env={})
    with pytest.raises(HorusError, match="not a regular file"):
        sub.predict(plan, gpu_types={"t4": 1}, partition="gpu")


def test_on_prediction_error_setting(tmp_path):
    assert sub.on_prediction_error({}) in ("submit", "refuse")
    assert sub.on_prediction_error({"HORUS_ON_PREDICTION_ERROR": "refuse"}) == "refuse"
    conf = tmp_path / "horus.conf"
    conf.write_text("# admin\non_prediction_error = refuse\n")
    assert sub.on_prediction_error({"HORUS_CONF": str(conf)}) == "refuse"
    conf.write_text("on_prediction_error = submit\n")
    assert sub.on_prediction_error({"HORUS_CONF": str(conf)}) == "submit"
    assert sub.on_prediction_error_problem({"HORUS_CONF": str(conf)}) is None
    # a misspelt refuse submits (no job lost to a typo), and says so
    conf.write_text("on_prediction_error = refuse_jobs\n")
    assert sub.on_prediction_error({"HORUS_CONF": str(conf)}) == "submit"
    assert "'refuse_jobs' (horus.conf) is neither submit nor refuse" in sub.on_prediction_error_problem(
        {"HORUS_CONF": str(conf)})
    assert "($HORUS_ON_PREDICTION_ERROR)" in sub.on_prediction_error_problem({"HORUS_ON_PREDICTION_ERROR": "refuze"})


def test_a_model_path_with_control_characters_goes_without_the_path_and_says_why(tmp_path):
    # the token had named it %09, which its own reader refuses: the whole workload was lost,
    # and the new room check blamed the user's (absent) --comment
    model = tmp_path / "tab\tm.onnx"
    model.write_bytes(Path("tests/data/zoo/mobilenet_v2.onnx").read_bytes())
    plan = sub.prepare(["--model", str(model), "--batch-size", "8", "--wrap", "true"], env={})
    sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
    job = parse_workload(plan.comment, strict=True)
    assert job["bs"] == 8 and "model" not in job
    assert [w for w in plan.warnings if "room" in w or "path" in w] == [
        "the model's path has control characters: the job is submitted without it, so the site "
        "cannot measure this graph's features"]


def test_a_misspelt_on_prediction_error_is_named_when_it_matters(tmp_path, monkeypatch, capsys):
    from slurm_horus.cli import hsubmit

    monkeypatch.setenv("HORUS_ON_PREDICTION_ERROR", "refuze")
    plan = sub.prepare(["--model", str(tmp_path / "missing.onnx"), "--gres=gpu:1", "--wrap", "true"], env={})
    monkeypatch.setattr(sub, "predict", lambda plan: (_ for _ in ()).throw(HorusError("model missing.onnx: no such file")))
    assert hsubmit._predict_or_warn(plan, sub, 0) is True  # submitted
    err = capsys.readouterr().err
    assert "'refuze' ($HORUS_ON_PREDICTION_ERROR) is neither submit nor refuse" in err and "submitting the job" in err


def test_hsubmit_start_is_lazy():
    import subprocess
    import sys
    code = ("import sys; import slurm_horus.cli.hsubmit as h, slurm_horus.slurm.submit, slurm_horus.slurm.commands;"
            "p = slurm_horus.slurm.submit.prepare(['-p', 'gpu', '--wrap', 'true'], env={});"
            "print(sorted(m for m in ('onnx', 'sklearn', 'click', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- --horus-probe --------------------------------------------------------------------------

def test_horus_probe_is_accepted_and_ignored():
    """The site's Prolog measures jobs now: drop-in scripts keep working, with one warning."""
    plan = sub.prepare(["--horus-probe", "--gres=gpu:1", "--wrap", "python t.py"], env={})
    assert plan.sbatch_argv == ["--gres=gpu:1", "--wrap", "python t.py"]
    assert len(plan.warnings) == 1 and "--horus-probe is ignored" in plan.warnings[0]


def test_hsubmit_writes_nothing_but_the_comment(tmp_path, monkeypatch):
    """No ledger, no spool, no process left behind (the graph's analysis runs in a child that
    is reaped before sbatch): the prediction travels in the comment only."""
    import sys

    from slurm_horus.slurm import commands as slurm
    from slurm_horus.cli import hsubmit

    seen = []
    monkeypatch.setattr(slurm, "exec_sbatch", lambda argv, stdin=None: seen.append(argv))
    monkeypatch.setattr(slurm, "partition_gpu_types", lambda p: ("gpu", {"t4": 2}))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO()))
    monkeypatch.setenv("HORUS_LEDGER_URL", f"sqlite:///{tmp_path}/ledger.db")
    monkeypatch.setenv("HORUS_SPOOL", str(tmp_path / "spool"))
    rc = hsubmit.main(["--horus-probe", "--model", "tests/data/zoo/small_cnn.onnx",
                       "--gres=gpu:1", "--wrap", "true"])
    (argv,) = seen
    assert rc == 1 and not list(tmp_path.iterdir())  # rc: exec_sbatch returned (mocked)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no child of ours left, running or unreaped
    (comment,) = [a for a in argv if a.startswith("--comment=")]
    assert parse_hint(comment[10:]) and parse_workload(comment[10:])["bs"] == 1


def test_any_failure_of_the_prediction_still_submits_the_job(tmp_path, monkeypatch, capsys):
    """A bug or an input nobody foresaw (here: a GPU catalog that is /dev/zero, and an error no
    code expects) costs the hint, never the job."""
    import sys

    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm import submit as sub_mod
    from slurm_horus.cli import hsubmit

    seen = []
    monkeypatch.setattr(slurm, "exec_sbatch", lambda argv, stdin=None: seen.append(argv))
    monkeypatch.setattr(slurm, "partition_gpu_types", lambda p: ("gpu", {"t4": 2}))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO()))
    args = ["--model", "tests/data/zoo/small_cnn.onnx", "--gres=gpu:1", "--wrap", "true"]
    from slurm_horus.predict.gpus import default_catalog

    monkeypatch.setenv("HORUS_GPU_CATALOG", "/dev/zero")
    default_catalog.cache_clear()  # read once per process: this test's process reads it again
    hsubmit.main(args)
    monkeypatch.delenv("HORUS_GPU_CATALOG")
    default_catalog.cache_clear()

    def boom(plan, **kw):
        raise KeyError("surprise")
    monkeypatch.setattr(sub_mod, "predict", boom)
    hsubmit.main(args)
    assert len(seen) == 2 and not [a for argv in seen for a in argv if a.startswith("--comment")]
    err = capsys.readouterr().err
    assert "GPU catalog /dev/zero: larger than" in err and "internal error: KeyError" in err
    assert err.count("submitting the job unchanged") == 2


def test_unbound_model_dimension_attaches_no_hint():
    """A sequence length left unbound would be costed as 1: no prediction rather than a wrong one."""
    from pathlib import Path

    import pytest

    from slurm_horus.slurm import submit as sub
    from slurm_horus.errors import HorusError

    bert = Path(__file__).parent / "data" / "zoo" / "bert_base.onnx"
    plan = sub.prepare(["--model", str(bert), "--batch-size", "8", "--wrap", "true"], env={})
    with pytest.raises(HorusError, match=r"dimension\(s\) seq unbound; add --dim"):
        sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
    plan = sub.prepare(["--model", str(bert), "--batch-size", "8", "--dim", "seq=128",
                        "--wrap", "true"], env={})
    assert sub.predict(plan, gpu_types={"a100": 4}, partition="gpu").hint.startswith("horus:v1;a100=")


def test_an_unquoted_hash_ends_a_directive_as_in_sbatch():
    """sbatch 22.05 and 25.11 store --comment=x#y as 'x' (checked on both clusters)."""
    sb = sa.script_directives("#!/bin/bash\n#SBATCH --comment=x#y -J a\n#SBATCH -J 'b # c'\n").sbatch
    assert sb == ["--comment=x", "-J", "b # c"]


def test_the_explained_job_desc_carries_the_task_counts_the_hook_decides_on():
    # --explain said "shared" for --gpus=1 -n 4 and --ntasks-per-gpu=2, which slurmctld's hook
    # leaves unchanged; a --nodes past 64 bits was an OverflowError in lupa
    plan = sub.prepare(["--gpus=1", "-n", "4", "--ntasks-per-gpu=2", "--nodes=99999999999999999999",
                        "--wrap", "true"], env={})
    jd = sub.job_desc_of(plan)
    assert jd["num_tasks"] == 4 and jd["ntasks_per_tres"] == 2 and "min_nodes" not in jd
    jd = sub.job_desc_of(sub.prepare(["--gres=gpu:1", "-N", "1-2", "--wrap", "true"], env={}))
    assert (jd["min_nodes"], jd["max_nodes"]) == (1, 2) and "num_tasks" not in jd


def test_the_explained_job_desc_carries_what_keeps_a_job_unshared():
    """--explain had said "shared" for --exclusive (the shards then waited forever) and for a
    node list the hook's pinned type may miss (sbatch refused the job); -N 1 is 1-1, as sbatch
    sets it, which lets several tasks share (checked on 22.05)."""
    jd = sub.job_desc_of(sub.prepare(["--gres=gpu:1", "--exclusive", "-w", "n1", "-x", "n2", "-N", "1",
                                      "--wrap", "true"], env={}))
    assert (jd["shared"], jd["req_nodes"], jd["exc_nodes"]) == (0, "n1", "n2")
    assert (jd["min_nodes"], jd["max_nodes"]) == (1, 1)
    for argv, env, shared in ((["--exclusive=user"], {}, 2), (["--exclusive", "-s"], {}, 1),
                              (["-s", "--exclusive"], {}, 0), ([], {"SBATCH_EXCLUSIVE": ""}, 0),
                              (["-s"], {"SBATCH_EXCLUSIVE": ""}, 1), ([], {}, None)):
        jd = sub.job_desc_of(sub.prepare(["--gres=gpu:1", *argv, "--wrap", "true"], env=env))
        assert jd.get("shared") == shared, argv
    plan = sub.prepare(["--gres=gpu:1", "--wrap", "true"], env={})
    plan.script_opts = sa.parse_sbatch_tokens(["--exclusive"])
    assert sub.job_desc_of(plan)["shared"] == 0


def test_directive_lines_are_split_as_sbatch_get_argument_splits_them():
    """Checked against 22.05's sbatch -v: a backslash escapes inside quotes too (shlex kept the
    quote and lost the rest: --comment='it\\'s mine' became "it\\'s"), an empty argument or a
    hetjob word ends the line, and HetJob in any case is a component separator."""
    d = sa.script_directives("#!/bin/bash\n#SBATCH --comment='it\\'s mine' -J a\\ b\n"
                             "#SBATCH -p x '' -J ignored\n#SBATCH -q y HETJOB -J ignored\ntrue\n")
    assert d.sbatch == ["--comment=it's mine", "-J", "a b", "-p", "x", "-q", "y"] and not d.hetjob
    assert sa.script_directives("#SBATCH -p a\n#SBATCH   HetJob\n#SBATCH -p b\n").hetjob
    assert sa.script_directives("#SBATCH -p a\n#SBATCH -J hetjobs\n").hetjob is False


def test_pbs_and_bsub_directives_sbatch_translates_are_seen():
    """sbatch (xlate.c) translates #PBS/#BSUB lines anywhere in the first 100 lines not starting
    with '#', unless #SBATCH --ignore-pbs: #PBS -q debug after a command still set the partition."""
    pbs = "#!/bin/bash\n#SBATCH -J x\necho start\n#PBS -q debug\ntrue\n"
    assert sa.script_directives(pbs).translated == "#PBS"
    assert sa.script_directives(pbs.replace("-J x", "-J x --ignore-pbs")).translated is None
    assert sa.script_directives("#BSUB -q a\n#PBS -q b\n").translated == "#BSUB"
    late = "#!/bin/bash\n" + "true\n" * 101 + "#PBS -q debug\n"
    assert sa.script_directives(late).translated is None
    assert sa.script_directives("#!/bin/bash\n#SBATCH -p gpu\ntrue\n").translated is None


def test_a_gpu_type_the_partition_lacks_is_named_before_the_hook_says_it_does_not_know_it():
    zoo = "tests/data/zoo/mobilenet_v2.onnx"
    for opt in ("--gres=gpu:v100:1", "--gpus=v100:1", "--gpus-per-node=V100:2"):
        plan = sub.prepare(["--model", zoo, "--batch-size", "8", opt, "--wrap", "true"], env={})
        sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
        assert any("requested, but partition gpu has a100, t4: Slurm will likely refuse" in w
                   for w in plan.warnings), (opt, plan.warnings)
    for opt in ("--gres=gpu:A100:1", "--gpus=2", "--gres=gpu:1", "--gpus=t4:1,a100:1"):  # Slurm's own judgement
        plan = sub.prepare(["--model", zoo, "--batch-size", "8", opt, "--wrap", "true"], env={})
        sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
        assert not any("requested, but" in w for w in plan.warnings), (opt, plan.warnings)


def test_a_partition_no_node_is_in_is_called_so(monkeypatch):
    from slurm_horus.slurm import commands

    nodes = [{"NodeName": "n1", "Partitions": "gpu,debug", "Gres": "gpu:a100:4"},
             {"NodeName": "n2", "Partitions": "cpu", "Gres": "(null)"}]
    monkeypatch.setattr(commands, "scontrol_nodes", lambda: nodes)
    with pytest.raises(HorusError, match="partition gpux: no node of Slurm's is in it"):
        commands.partition_gpu_types("gpux")
    assert commands.partition_gpu_types("cpu") == ("cpu", {})  # a real partition without GPUs
    assert commands.partition_gpu_types("debug,cpu") == ("debug,cpu", {"a100": 4})


def test_the_explained_job_desc_carries_the_script_the_hook_reads(tmp_path):
    """A job whose srun steps ask for GPUs by name stays unchanged in the hook; --explain
    must see the same script sbatch sends (--wrap's as sbatch writes it)."""
    jd = sub.job_desc_of(sub.prepare(["--gres=gpu:1", "--wrap", "srun --gpus=1 x"], env={}))
    assert jd["script"] == "#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsrun --gpus=1 x\n"
    for step, action in (("srun --gres=gpu:1 python t.py", "unchanged"), ("srun python t.py", "shared")):
        script = tmp_path / "job.sh"
        script.write_text(f"#!/bin/bash\n#SBATCH --gres=gpu:1\n{step}\n")
        plan = sub.prepare(["--model", "tests/data/zoo/small_cnn.onnx", "--batch-size", "8", str(script)], env={})
        sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
        assert sub.job_desc_of(plan)["script"] == script.read_text()
        d = sub.decision_of(plan)
        assert d.action == action and (action == "shared" or "srun steps" in d.note), d.note


def test_the_explained_job_desc_carries_what_makes_srun_steps_ask_for_gpus():
    """slurmctld's hook leaves whole a job whose environment makes its srun steps ask for GPUs
    (sbatch's SLURM_GPUS_PER_NODE for --gpus-per-node, or the submitting job's own) and one with
    --gpu-freq (Slurm refuses it beside shards); --explain had said "shared" for both."""
    model = ["--model", "tests/data/zoo/small_cnn.onnx", "--batch-size", "8", "--task", "infer"]

    def decision(argv, env):
        plan = sub.prepare([*model, *argv, "--wrap", "srun python t.py"], env=env)
        sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
        return sub.job_desc_of(plan), sub.decision_of(plan)

    jd, d = decision(["--gres=gpu:1"], {})
    assert d.action == "shared" and "environment" not in jd and "tres_freq" not in jd
    jd, d = decision(["--gpus-per-node=1"], {})
    assert jd["environment"] == {"SLURM_GPUS_PER_NODE": "1"} and d.action == "unchanged", d.note
    jd, d = decision(["--gres=gpu:1"], {"SLURM_GPUS": "1", "HOME": "/x"})  # inside another job
    assert jd["environment"] == {"SLURM_GPUS": "1"} and d.action == "unchanged", d.note
    jd, d = decision(["--gres=gpu:1", "--gpu-freq=high"], {})
    assert jd["tres_freq"] == "gpu:high" and d.action == "unchanged" and "--gpu-freq" in d.note
    jd, d = decision(["--gres=gpu:1"], {"SBATCH_GPU_FREQ": "low"})  # sbatch reads it too
    assert jd["tres_freq"] == "gpu:low" and d.action == "unchanged"
    # --gpu-bind: 25.11 gives a job on shards with it no GPU in its steps
    jd, d = decision(["--gres=gpu:1", "--gpu-bind=closest"], {})
    assert jd["tres_bind"] == "gres/gpu:closest" and d.action == "unchanged" and "--gpu-bind" in d.note
    jd, d = decision(["--gres=gpu:1"], {"SBATCH_GPU_BIND": "none"})
    assert jd["tres_bind"] == "gres/gpu:none" and d.action == "unchanged"
    jd, d = decision(["--gres=gpu:1"], {"SLURM_GPU_BIND": "closest"})  # the submitting shell's
    assert jd["environment"] == {"SLURM_GPU_BIND": "closest"} and d.action == "unchanged"


def test_explain_judges_a_job_without_an_account_under_the_users_default_account(tmp_path, monkeypatch):
    """slurmctld's hook reads the claim record under a job's default account when it has no -A
    (slurmctld fills it in after the hook); --explain had said "shared" where slurmctld gave a
    whole GPU.  The default account is sacctmgr's; where sacctmgr cannot say, none."""
    import os
    import stat

    record = tmp_path / "record"
    record.write_text("# slurm-horus claim record\naccount - physics 5 9\n")
    policy = tmp_path / "policy.conf"
    policy.write_text((Path(__file__).parent.parent / "etc" / "horus_policy.conf").read_text()
                      + f"\nrecord_file = {record}\nunderclaim_limit = 3\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sacctmgr"  # what sacctmgr -n -P show user U format=defaultaccount prints
    fake.write_text("#!/bin/sh\necho physics\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    model = ["--model", "tests/data/zoo/small_cnn.onnx", "--batch-size", "8", "--task", "infer"]

    def decision(*argv):
        plan = sub.prepare([*model, "--gres=gpu:1", *argv, "--wrap", "true"], env={"HORUS_POLICY": str(policy)})
        sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
        return sub.decision_of(plan)

    d = decision()
    assert d.action == "exclusive" and "claim record: account physics" in d.note, d.note
    assert decision("-A", "chem").action == "shared"
    fake.write_text("#!/bin/sh\necho 'sacctmgr: error: slurmdbd down' >&2\nexit 1\n")
    assert decision().action == "shared"


def test_only_plain_batch_names_in_dim_are_the_batch_size():
    """--dim n=64 (an axis named n, beside the batch) with --batch-size 8 had become "contradicts
    --batch-size 8", and alone had set the batch to 64: n and b may be other axes, which the
    graph loader judges by position."""
    for dims, bs in ((["--dim", "n=64", "--batch-size", "8"], 8), (["--dim", "n=64"], 1),
                     (["--dim", "bs=16"], 16), (["--dim", "Batch_Size=4"], 4)):
        w, got = sub.check_options(sub.prepare(["--model", "m.onnx", *dims, "--wrap", "true"], env={}))
        assert w.batch_size == bs, dims


def test_tres_per_task_is_a_gpu_request_the_hook_sees():
    """sbatch 23.02+ --tres-per-task=gres/gpu:1 (or SBATCH_TRES_PER_TASK) asks for a GPU: the
    job had lost its prediction as one that "asks for no GPU"."""
    for argv, env in ((["--tres-per-task=gres/gpu:1"], {}), ([], {"SBATCH_TRES_PER_TASK": "gres/gpu:1"})):
        plan = sub.prepare([*argv, "--wrap", "true"], env=env)
        assert sub.job_desc_of(plan)["tres_per_task"] == "gres/gpu:1" and sub.asks_for_gpus(plan)
    assert not sub.asks_for_gpus(sub.prepare(["-c", "4", "--wrap", "true"], env={}))


def spank_help(options: list[tuple[str, str | None, str]]) -> str:
    """``sbatch --help`` with a plugin section, written from Slurm 25.11's src/common/spank.c
    (no SPANK plugin is installed here): spank_print_options prints "\\nOptions provided by
    plugins:\\n", then _spank_opt_print(opt, fp, 6, 30) per option: info = "%*s--%s%s%s" (pad 6,
    name, "=" and arginfo where the plugin gives one); "%-*s%s\\n" (info padded to 30, then the
    usage) when info is under 30 columns, else "\\n%s\\n%*s%s\\n"; the usage wrapped to 80 - 30
    columns, each further line "%*s%s\\n" indented 30.  sbatch's GPU section follows."""
    import textwrap

    out = ["Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]", "",
           "Parallel run options:",
           "      --container             Path to OCI container bundle", "",
           "Options provided by plugins:"]
    for name, arginfo, usage in options:
        info = f"{'':6}--{name}" + (f"={arginfo}" if arginfo else "")
        first, *more = textwrap.wrap(usage, 50)
        out += [f"{info:<30}{first}"] if len(info) < 30 else ["", info, f"{'':30}{first}"]
        out += [f"{'':30}{line}" for line in more]
    out += ["", "GPU scheduling options:",
            "      --cpus-per-gpu=n        number of CPUs required per allocated GPU", ""]
    return "\n".join(out)


PYXIS = [("container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
          "the image to use for the container filesystem. Can be either a docker image given as "
          "an enroot URI, or a path to a squashfs file on the remote host filesystem."),
         ("container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]", "bind mount[s] inside the container."),
         ("container-remap-root", None, "ask to be remapped to root inside the container. --foo "
          "in a wrapped line is no option."),
         ("q", "n", "short")]


def test_sbatch_help_plugin_section_is_read():
    from slurm_horus.slurm.parse import sbatch_plugin_options

    assert sbatch_plugin_options(spank_help(PYXIS)) == {
        "container-image": True, "container-mounts": True, "container-remap-root": False, "q": True}
    assert sbatch_plugin_options(spank_help([])) == {}
    assert sbatch_plugin_options("Usage: sbatch\n      --container=x  y\n") == {}  # no plugin: no section


def test_plugin_options_in_sbatch_lines_take_the_word_after_them():
    """#SBATCH --container-image nvcr.io/x:1 had stopped the reading of the #SBATCH lines (the
    image taken for the script): the comment after it was lost to the hint, -p and --gres
    unread.  sbatch refuses a non-option word in a directive, so it is the option's value."""
    opts = sa.parse_sbatch_tokens(["--container-image", "nvcr.io/x:1", "--comment=exp-17", "-p", "a100",
                                   "--container-remap-root", "--gres", "gpu:1"])
    assert sa.last_value(opts, "comment") == "exp-17" and sa.last_value(opts, "partition") == "a100"
    assert sa.last_value(opts, "gres") == "gpu:1" and sa.last_value(opts, "?container-image") == "nvcr.io/x:1"


def test_plugin_options_on_the_command_line_take_a_value_as_sbatch_lists_them():
    """--container-image IMAGE had been read as a flag: IMAGE was the script, and --model and
    --batch-size went on to sbatch, which refused the job."""
    asked = []

    def plugins():
        asked.append(1)
        return {"container-image": True, "container-remap-root": False}

    s = sa.split_args(["--container-image", "nvcr.io/x:1", "--model", "M", "--batch-size", "8", "j.sh"],
                      plugin_options=plugins)
    assert s.horus == [("model", "M"), ("batch-size", "8")] and s.rest == ["j.sh"] and not s.unsure
    assert s.sbatch_argv() == ["--container-image", "nvcr.io/x:1", "j.sh"]
    # a flag: the next word is the script, whose own arguments stay its own
    s = sa.split_args(["--model", "M", "--container-remap-root", "t.py", "--model", "x"], plugin_options=plugins)
    assert s.rest == ["t.py", "--model", "x"] and s.horus == [("model", "M")] and not s.unsure
    # an unambiguous prefix, as getopt_long reads it
    s = sa.split_args(["--container-im", "img", "-p", "gpu", "j.sh"], plugin_options=plugins)
    assert s.rest == ["j.sh"] and sa.last_value(s.parsed, "partition") == "gpu" and not s.unsure
    # sbatch not asked where no unknown option needs it
    asked.clear()
    sa.split_args(["--container-image=img", "-p", "gpu", "--model", "M", "j.sh"], plugin_options=plugins)
    assert asked == []
    # not listed, or sbatch could not say: unsure; an hsubmit option after it may be the
    # script's argument (the word after the option the script): an error, never a guess
    for opts in (plugins, lambda: None, None):
        s = sa.split_args(["--nosuch", "v", "--model", "M", "j.sh"], plugin_options=opts)
        assert s.unsure[0] == "nosuch" and s.horus == [] and "--nosuch=VALUE if it takes one" in s.errors[0]
        s = sa.split_args(["--model", "M", "--nosuch", "v", "j.sh"], plugin_options=opts)
        assert s.unsure == ["nosuch"] and s.horus == [("model", "M")] and not s.errors
        assert s.sbatch_argv() == ["--nosuch", "v", "j.sh"]
    # an exact hsubmit option is never another option's value
    s = sa.split_args(["--container-image", "--model", "M", "j.sh"], plugin_options=plugins)
    assert s.unsure[0] == "container-image" and s.horus == [] and s.errors


def test_an_unsure_plugin_option_costs_the_hint_not_the_job(monkeypatch):
    from slurm_horus.slurm import commands

    monkeypatch.setattr(commands, "_plugin_options", [None])  # sbatch --help failed
    plan = sub.prepare(["--model", "tests/data/zoo/small_cnn.onnx", "--nosuch", "v", "--gres=gpu:1",
                        "--wrap", "true"], env={})
    with pytest.raises(HorusError, match="--nosuch is not sbatch's own.*no hint"):
        sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
    assert plan.hint is None and plan.sbatch_argv == ["--nosuch", "v", "--gres=gpu:1", "--wrap", "true"]


def test_a_script_from_the_terminal_is_unread():
    """No script path, no --wrap and stdin a terminal (prepare gets no stdin): sbatch reads the
    script the user types, hsubmit never sees its #SBATCH --comment, which the hint replaced."""
    plan = sub.prepare(["--model", "tests/data/zoo/small_cnn.onnx", "--gres=gpu:1"], env={})
    assert plan.script_unread
    with pytest.raises(HorusError, match="terminal.*no hint is attached"):
        sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
    assert "--comment" not in " ".join(plan.sbatch_argv)
    assert not sub.prepare(["--model", "m.onnx", "--external"], env={}).script_unread  # no script at all


class _BrokenPipe(io.StringIO):
    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")


def test_hsubmits_errors_and_warnings_are_one_line_and_never_fail(monkeypatch):
    """hsubmit's _err and submit.warn write through one errors.to_stderr: the same one line,
    and nothing raised when stderr is closed, gone or a broken pipe."""
    from slurm_horus.cli import hsubmit

    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    hsubmit._err("error: bad\nname \x1b[2J")
    sub.warn("no\tprediction \x9b")
    assert out.getvalue() == ("hsubmit: error: bad\\nname \\x1b[2J\n"
                              "hsubmit: warning: no\\tprediction \\x9b\n")
    closed = io.StringIO()
    closed.close()
    for stderr in (None, closed, _BrokenPipe()):
        monkeypatch.setattr(sys, "stderr", stderr)
        hsubmit._err("error: lost")
        sub.warn("lost")


@pytest.mark.parametrize("from_stdin", [False, True])
def test_a_directive_block_past_what_hsubmit_reads_attaches_no_hint(tmp_path, from_stdin):
    """A script whose leading comment block runs past DIRECTIVE_BYTES: the line the cut halved
    (#SBATCH --comment=keep_this_whole_comment) had been read as 'keep_thi' and sent on the
    command line, over the script's whole comment.  Now no half line is read, and as the lines
    past the cut are unknown, no hint is attached (the job goes unchanged, with a warning)."""
    import io

    line = b"#SBATCH --comment=keep_this_whole_comment\n"
    pad = b"#" * 99 + b"\n"
    head = b"#!/bin/sh\n#SBATCH --gres=gpu:1\n"
    fill = pad * ((sub.DIRECTIVE_BYTES - len(head) - 8) // len(pad))
    fill += b"#" * (sub.DIRECTIVE_BYTES - len(head) - len(fill) - 9) + b"\n"
    data = head + fill + line + b"srun true\n"
    assert len(head + fill) < sub.DIRECTIVE_BYTES < len(head + fill + line)
    script = tmp_path / "job.sh"
    script.write_bytes(data)
    args = ["--model", "m.onnx", "--batch-size", "8"] + ([] if from_stdin else [str(script)])
    plan = sub.prepare(args, env={}, stdin=io.BytesIO(data) if from_stdin else None)
    assert plan.user_comment() is None  # never the cut 'keep_thi'
    assert "run past the first 4 MiB" in (sub.request_unknown(plan) or "")
    # a block that ends within the bytes read is read whole, whatever follows it
    short = head + line + b"srun true\n" + fill * 2
    script.write_bytes(short)
    plan = sub.prepare(args, env={}, stdin=io.BytesIO(short) if from_stdin else None)
    assert plan.user_comment() == "keep_this_whole_comment" and sub.request_unknown(plan) is None


@pytest.mark.parametrize("argv, env, hinted", [
    (["-M", "far"], {}, False),
    (["--clusters=here,far"], {}, False),
    ([], {"SLURM_CLUSTERS": "far"}, False),
    ([], {"SBATCH_CLUSTERS": "far"}, False),
    (["-M", "here"], {"SLURM_CLUSTERS": "far"}, True),
    (["--cluster", " HERE,"], {}, True),  # sbatch trims and lowercases the names (slurm_addto_char_list)
    ([], {"SBATCH_CLUSTERS": "here"}, True),
    ([], {}, True),
])
def test_a_job_sent_to_another_cluster_gets_no_hint(monkeypatch, argv, env, hinted):
    """hsubmit reads this cluster's partitions: -M far had been given a hint for this
    cluster's GPU types, which pins the job, on far, to a type its partition may lack."""
    from slurm_horus.slurm import commands

    monkeypatch.setattr(commands, "local_cluster", lambda conf=None: "here")
    plan = sub.prepare([*argv, "--model", "tests/data/zoo/small_cnn.onnx", "--batch-size", "8",
                        "--gres=gpu:1", "--wrap", "true"], env=env)
    if hinted:
        sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
        assert set(parse_hint(plan.comment)) == {"a100"}
    else:
        with pytest.raises(HorusError, match="goes to cluster .*far.*no hint is attached"):
            sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")


@pytest.mark.parametrize("var", ["SLURM_GPUS_PER_NODE_HET_GROUP_0", "SLURM_GRES_PACK_GROUP_0"])
def test_explain_passes_the_het_group_gpu_variables_the_hook_reads(var):
    """The hook reads srun's GPU options with a het group's suffix too (hsubmit run inside a het
    job's allocation: sbatch passes SLURM_GPUS_PER_NODE_HET_GROUP_0 on) and keeps the job whole;
    --explain passed the plain names alone and said "shared"."""
    plan = sub.prepare(["--model", "tests/data/zoo/small_cnn.onnx", "--batch-size", "8", "--task", "infer",
                        "--gres=gpu:1", "--wrap", "srun python t.py"], env={var: "gpu:1", "HOME": "/x"})
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    assert sub.job_desc_of(plan)["environment"] == {var: "gpu:1"}
    d = sub.decision_of(plan)
    assert d.action == "unchanged" and "srun steps" in d.note, d.note
