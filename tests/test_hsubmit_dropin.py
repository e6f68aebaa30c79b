"""hsubmit where it must behave as sbatch does (a review against sbatch 25.11): sbatch's own
--task (each occurrence judged by its value), a script's comment bytes kept as written, a
request that cannot be read first, hsubmit installed as ``sbatch``, -Q and sbatch's reading of
flag variables.  The stand-in sbatch of ``slurm_bin`` records its argv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.slurm import sbatch_args as sa
from slurm_horus.slurm import submit as sub

ZOO = Path(__file__).resolve().parent / "data" / "zoo"


def hsubmit(args, env, **kw):
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", *args],
                          capture_output=True, timeout=120, env=env, **kw)


@pytest.mark.parametrize("argv,task,passed", [
    # a count is sbatch's --tasks-per-node wherever it stands; a word is hsubmit's
    (["--model", "m.onnx", "--task", "4", "--task", "train", "j.sh"], "train", ["--task", "4"]),
    (["--model", "m.onnx", "--task", "train", "--task", "4", "j.sh"], "train", ["--task", "4"]),
    (["--model", "m.onnx", "--task=2", "--task=infer", "j.sh"], "infer", ["--task=2"]),
    (["--model", "m.onnx", "--task", "infer", "j.sh"], "infer", []),
])
def test_each_task_option_goes_where_its_value_says(argv, task, passed):
    s = sa.split_args(argv)
    assert dict(s.horus)["task"] == task
    assert s.sbatch_argv(replace_comment=None) == [*passed, "j.sh"]


def test_a_count_on_the_command_line_keeps_the_scripts_horus_task(tmp_path):
    """--task 1 (sbatch's) beside #HORUS --task infer had dropped the script's task: the job
    was predicted as training, its hint said task=train."""
    script = tmp_path / "inf.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\n#HORUS --task infer\ntrue\n")
    plan = sub.prepare(["--model", "m.onnx", "--batch-size", "8", "--task", "1", str(script)], env={})
    assert plan.horus["task"] == "infer" and plan.sbatch_argv == ["--task", "1", str(script)]


def test_a_scripts_comment_bytes_reach_sbatch_as_written(tmp_path, slurm_bin):
    env, log = slurm_bin
    script = tmp_path / "lat.sh"
    script.write_bytes(b'#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --comment="caf\xe9 \xb5s"\ntrue\n')
    cp = hsubmit(["-p", "gpu", "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", str(script)], env)
    assert cp.returncode == 0, cp.stderr
    sent = log.read_bytes().split(b"\n")
    comment = next(a for a in sent if a.startswith(b"--comment="))
    assert comment.startswith(b"--comment=caf\xe9 \xb5s horus:v1;"), comment  # not U+FFFD


def test_a_script_sbatch_reads_itself_is_not_taken_for_a_job_without_gpus(tmp_path, slurm_bin):
    """A script hsubmit cannot read first (a pipe) may ask for a GPU in its #SBATCH lines: it
    had been told "asks for no GPU", and a site's on_prediction_error = refuse let it through."""
    env, log = slurm_bin
    r, w = os.pipe()
    os.write(w, b"#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n")
    os.close(w)
    args = ["-p", "gpu", "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", f"/dev/fd/{r}"]
    try:
        cp = hsubmit(args, env, pass_fds=(r,))
        assert cp.returncode == 0 and b"asks for no GPU" not in cp.stderr, cp.stderr
        assert b"could not be read as a regular file" in cp.stderr
        log.unlink()
        conf = Path(env["HORUS_CONF"])
        conf.write_text("on_prediction_error = refuse\n")
        cp = hsubmit(args, env, pass_fds=(r,))
        assert cp.returncode == 1 and not log.exists(), cp.stderr
    finally:
        os.close(r)


def test_hsubmit_installed_as_sbatch_runs_the_real_one(tmp_path, slurm_bin):
    """An admin who links hsubmit in as `sbatch` (first on PATH) made every submission run
    itself again, for ever."""
    env, log = slurm_bin
    shim = tmp_path / "dropin"
    shim.mkdir()
    (shim / "sbatch").write_text(f"#!{sys.executable}\nimport sys\nfrom slurm_horus.cli.hsubmit import main\n"
                                 "sys.exit(main())\n")
    (shim / "sbatch").chmod(0o755)
    env = {**env, "PATH": f"{shim}:{env['PATH']}"}
    cp = subprocess.run(["sbatch", "-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8",
                         "--wrap", "true"], capture_output=True, text=True, timeout=60, env=env,
                        stdin=subprocess.DEVNULL)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    assert "horus:v1;" in log.read_text()


@pytest.mark.parametrize("run", ["exec ", ""])
def test_a_sites_sbatch_wrapper_that_runs_hsubmit_submits_once(tmp_path, slurm_bin, run):
    """A shell wrapper named sbatch that runs hsubmit (exec'd or as a child), the usual way to
    make hsubmit the default: hsubmit took it for Slurm's sbatch and ran it, which ran hsubmit
    again, for ever.  Now the second hsubmit passes the call on to the next sbatch on PATH as
    the first made it."""
    env, log = slurm_bin
    shim = tmp_path / "wrapper"
    shim.mkdir()
    (shim / "hsubmit").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m slurm_horus.cli.hsubmit "$@"\n')
    (shim / "sbatch").write_text(f'#!/bin/sh\n{run}hsubmit "$@"\n')  # names no package of ours
    for f in ("hsubmit", "sbatch"):
        (shim / f).chmod(0o755)
    env = {**env, "PATH": f"{shim}:{env['PATH']}"}
    cp = subprocess.run(["sbatch", "-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "small_cnn.onnx"),
                         "--batch-size", "8", "--wrap", "true"], capture_output=True, text=True,
                        timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    assert cp.stderr == "", cp.stderr  # predicted once: no warning of a hint already there
    assert log.read_text().count("horus:v1;") == 1 and "--model" not in log.read_text()


def test_a_wrapper_mark_counts_only_for_the_process_that_made_it(monkeypatch):
    """The mark a job's environment may carry (a wrapper that ran Slurm's sbatch itself) names
    its hsubmit by pid and start: a later process of that pid (a job's, a container's) had
    taken it for a re-entry and passed its --model on to sbatch, which refused the job."""
    from slurm_horus.proc import started
    from slurm_horus.slurm import commands

    me = os.getpid()
    for mark, ours in ((f"{me}\t/x/sbatch\n", False), (f"{me} 1\t/x/sbatch\n", False),
                       (f"{me} {started(me)}\t/x/sbatch\n", True), (f"{me} {started(me)}\t\n", False),
                       (f"{os.getppid()} {started(os.getppid())}\t/x/sbatch\n", True), ("junk", False)):
        monkeypatch.setenv(commands.REENTRY_VAR, mark)
        assert commands.reentered() is ours, mark


def test_a_parent_proc_hides_is_no_error(monkeypatch):
    """/proc mounted hidepid=1 hides a parent of another user's (sudo, slurmstepd): reading its
    start raised PermissionError, and hsubmit stopped with an internal error, nothing submitted."""
    import builtins

    from slurm_horus.slurm import commands

    real_open = builtins.open

    def hidden(path, *a, **k):
        if str(path).startswith("/proc/"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", hidden)
    monkeypatch.setenv(commands.REENTRY_VAR, f"{os.getpid()} 1\t/x/sbatch\n")
    assert commands.reentered() is False


@pytest.mark.parametrize("how", [["-Q"], ["--quiet"], "script"])
def test_quiet_holds_back_hsubmits_warnings(tmp_path, slurm_bin, how):
    env, log = slurm_bin
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n" + ("#SBATCH -Q\n" if how == "script" else "") + "true\n")
    opts = how if isinstance(how, list) else []
    args = [*opts, "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", str(script)]
    cp = hsubmit(args, env)  # asks for no GPU: a warning, held back
    assert cp.returncode == 0 and cp.stderr == b"" and log.exists()


def test_sbatch_quiet_is_no_variable_of_sbatchs_and_holds_back_nothing(tmp_path, slurm_bin):
    """Neither 22.05's sbatch nor 25.11's reads SBATCH_QUIET: it had silenced hsubmit's warnings
    (why a job went without its hint) while sbatch spoke on, and undone a script's -Q."""
    env, log = slurm_bin
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", str(script)],
                 {**env, "SBATCH_QUIET": "1"})
    assert cp.returncode == 0 and b"asks for no GPU" in cp.stderr and log.exists()
    script.write_text("#!/bin/sh\n#SBATCH -Q\ntrue\n")
    assert sub.prepare([str(script)], env={"SBATCH_QUIET": "0"}).quiet


@pytest.mark.parametrize("value,is_set", [
    ("", True), ("yes", True), ("YES", True), ("1", True), (" 7", True), ("-1", True),
    ("0", False), ("no", False), ("true", False), ("1x", False), (None, False),
])
def test_flag_variables_are_read_as_sbatch_reads_them(value, is_set):
    assert sa.env_flag(value) is is_set


def test_sbatch_ignore_pbs_no_leaves_pbs_lines_translated(tmp_path):
    script = tmp_path / "pbs.sh"
    script.write_text("#!/bin/sh\n#PBS -l walltime=1:00:00\ntrue\n")
    base = ["--model", "m.onnx", str(script)]
    assert sub.prepare(base, env={"SBATCH_IGNORE_PBS": "no"}).script_translated
    assert not sub.prepare(base, env={"SBATCH_IGNORE_PBS": "yes"}).script_translated


def test_explain_prints_a_scripts_undecodable_comment_bytes_on_a_strict_stdout(tmp_path, slurm_bin):
    """--explain had crashed (UnicodeEncodeError) on them under a UTF-8 locale's strict stdout."""
    env, log = slurm_bin
    script = tmp_path / "lat.sh"
    script.write_bytes(b'#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --comment="caf\xe9"\ntrue\n')
    cp = hsubmit(["--explain", "-p", "gpu", "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8",
                  str(script)], {**env, "PYTHONIOENCODING": "utf-8:strict"})
    assert cp.returncode == 0 and b"internal error" not in cp.stderr, cp.stderr
    assert b"--comment=caf\xe9 horus:v1;" in cp.stdout and not log.exists()


@pytest.mark.parametrize("asks", [["--gres=help"], ["--gres", "LIST"], ["--hint=help"],
                                  ["--mem-bind", "verbose,help"], ["-N1", "--gres=help", ":", "-n2"]])
def test_a_help_value_is_sbatchs_call_alone(asks, monkeypatch):
    """sbatch answers --gres=help (list, and help in --hint or --mem-bind) with a list and
    submits nothing: hsubmit read the script from stdin first (there only because of its own
    options) and predicted for a job that never comes.  The call is now sbatch's, less
    hsubmit's options, with stdin unread."""
    from slurm_horus.cli import hsubmit as cli
    from slurm_horus.slurm import commands

    class Unread:
        def isatty(self):
            return False

        @property
        def buffer(self):
            raise AssertionError("hsubmit read stdin")
    sent = []
    monkeypatch.setattr(commands, "exec_sbatch", lambda a, stdin=None: sent.append((a, stdin)) or sys.exit(0))
    monkeypatch.setattr(sub, "predict", lambda *a, **k: pytest.fail("predicted"))
    monkeypatch.setattr(sys, "stdin", Unread())
    with pytest.raises(SystemExit):
        cli.main(["--model", "m.onnx", "--batch-size", "8", *asks, "--task", "infer"])
    assert sent == [(asks, None)]
    assert sa.help_request(sa.split_args(asks).parsed)
    for job in (["--gres=gpu:1"], ["--hint=compute_bound"], ["--mem-bind=local"], ["--comment=help"]):
        assert sa.help_request(sa.split_args(job).parsed) is None, job


def test_gres_help_reaches_sbatch_with_its_stdin_and_no_warning(tmp_path, slurm_bin):
    env, log = slurm_bin
    fed = tmp_path / "fed"
    (Path(env["PATH"].split(":")[0]) / "sbatch").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}; cat > {fed}; echo "Valid gres options are:"\n')
    script = b"#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n"
    cp = hsubmit(["--gres=help", "-p", "gpu", "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8"],
                 env, stdin=None, input=script)
    assert cp.returncode == 0 and cp.stderr == b"" and cp.stdout == b"Valid gres options are:\n", cp.stderr
    assert log.read_text().splitlines() == ["--gres=help", "-p", "gpu"] and fed.read_bytes() == script
