"""Review 9's bad input for hsubmit and horus-probe: a GRES index range (or hostlist, or count)
too big to build, a script on a stdin that is a folder or non-blocking, and a Ctrl-C under
``horus-probe -- CMD`` run by a user.  One line, an exit status, never a traceback or a hang;
the job always reaches sbatch unless sbatch itself would refuse it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.slurm import parse
from slurm_horus.slurm import submit as sub

ZOO = Path(__file__).resolve().parent / "data" / "zoo"
MODEL = str(ZOO / "small_cnn.onnx")
HUGE = "gpu:1(IDX:0-99999999999)"
GiB = 1 << 30


def _memory_cap(limit: int):
    """A preexec_fn: the child's address space capped, so that a range built in full fails
    fast with a MemoryError instead of filling this machine."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_huge_gpu_index_range_is_refused_without_being_built():
    """IDX:0-99999999999 was built into a list of 10^11 indices: a MemoryError (or a hang)."""
    code = ("from slurm_horus.errors import HorusError\n"
            "from slurm_horus.slurm.parse import parse_gres\n"
            f"for g in ({HUGE!r}, 'gpu:1(IDX:' + '0-60000,' * 3 + '1)', 'gpu:1(IDX:0-' + '9' * 5000 + ')'):\n"
            "    try:\n"
            "        parse_gres(g)\n"
            "    except HorusError as e:\n"
            "        print(e)\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        preexec_fn=_memory_cap(GiB))
    assert cp.returncode == 0 and cp.stderr == "", cp.stderr[-500:]
    lines = cp.stdout.splitlines()
    assert len(lines) == 3 and all("more than 65,536 GPU indices" in ln for ln in lines), lines
    assert parse.parse_gres("gpu:a100:2(IDX:0-1,3)")[0]["idx"] == [0, 1, 3]


@pytest.mark.parametrize("where", ["command line", "#SBATCH line", "SBATCH_GRES"])
def test_a_job_whose_gres_names_a_huge_index_range_is_still_submitted(tmp_path, slurm_bin, where):
    """hsubmit built the range before its guarded prediction: a MemoryError ("internal error",
    exit 1) and the job lost.  sbatch, not hsubmit, judges such a request."""
    env, log = slurm_bin
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n{'#SBATCH --gres=' + HUGE if where == '#SBATCH line' else ''}\ntrue\n")
    args = ["-p", "gpu", "--model", MODEL, "--batch-size", "2", str(script)]
    if where == "command line":
        args.insert(0, f"--gres={HUGE}")
    elif where == "SBATCH_GRES":
        env = {**env, "SBATCH_GRES": HUGE}
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", *args], capture_output=True,
                        text=True, timeout=300, env=env, stdin=subprocess.DEVNULL,
                        preexec_fn=_memory_cap(4 * GiB))
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr[-500:]
    assert "internal error" not in cp.stderr
    sent = log.read_text().splitlines()
    assert str(script) in sent and (where != "command line" or f"--gres={HUGE}" in sent), sent


def test_hostlists_and_counts_past_any_slurms_are_one_line_errors():
    """A hostlist's 5,000-digit bound was int()'s ValueError and 1,500 bracketed ranges a
    RecursionError, where callers (sync, doctor, the queue loop) catch only HorusError."""
    for expr in ("gpu[1-" + "9" * 5000 + "]", "a[1]" * 1500, "gpu[01-99999999]"):
        with pytest.raises(HorusError, match="hostlist: "):
            parse.expand_hostlist(expr)
    assert parse.expand_hostlist("gpu[01-02]x[1-2]") == ["gpu01x1", "gpu01x2", "gpu02x1", "gpu02x2"]
    assert parse.gres_count("9" * 5000) is None and parse.gres_count("2K") == 2048
    with pytest.raises(HorusError, match="a count past"):
        parse.parse_gres("gpu:a100:" + "9" * 5000)
    assert parse.parse_gres("shard:66(0/100," + "0" * 5000 + "/1,66/100)")[0]["idx"] == [2]
    job = {"_details": [{"Nodes": "n1", "GRES": "gpu:2(IDX:0-40000),shard:1(IDX:1)"}]}
    assert len(parse.job_gpus_on_node(job, "n1")["indices"]) == 40001


def test_doctor_reads_a_gres_conf_count_past_any_slurms_without_a_traceback():
    from slurm_horus.doctor import check_nodes

    class Conf:
        nodes = [{"nodename": "gpu[1-2]", "gres": "gpu:a100:2,shard:8"}]

    problems = check_nodes(Conf, "NodeName=gpu[1-2] Name=shard Count=" + "9" * 5000, 4,
                           "features", {"a100"}, {"a100"})
    assert isinstance(problems, list)


def test_a_folder_on_stdin_is_a_one_line_error_as_sbatch_gives(slurm_bin, tmp_path):
    """read() of a folder is EISDIR: "internal error: IsADirectoryError".  sbatch's read fails
    as well ("Batch script is empty!", exit 1): nothing is submitted.  (From a shell, CPython
    itself refuses to start on such a stdin, before hsubmit runs.)"""
    env, log = slurm_bin
    code = (f"import os, sys; os.dup2(os.open({str(tmp_path)!r}, os.O_RDONLY), 0);"
            "from slurm_horus.cli.hsubmit import main;"
            f"sys.exit(main(['-p', 'gpu', '--gres=gpu:1', '--model', {MODEL!r}]))")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert cp.returncode == 1 and not log.exists(), cp.stderr
    assert cp.stderr == "hsubmit: error: cannot read the batch script from standard input: Is a directory\n"


def test_a_non_blocking_stdin_is_read_to_its_end():
    """A stdin left O_NONBLOCK (by whatever shares it) gives None while its writer is behind:
    the script had ended there, and sbatch had got only its head."""
    head, rest = b"#!/bin/sh\n#SBATCH -J a\n", b"#SBATCH --gres=gpu:1\necho done\n"
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.write(w, head)

    class Behind:
        """The pipe, its writer catching up only once the reader found it empty."""
        def __init__(self):
            self.f, self.behind = open(r, "rb"), True

        def read(self, n):
            chunk = self.f.read(n)
            if chunk is None and self.behind:
                os.write(w, rest)
                os.close(w)
                self.behind = False
            return chunk

        def fileno(self):
            return self.f.fileno()

    stream = Behind()
    try:
        plan = sub.prepare(["--model", MODEL], env={}, stdin=stream)
    finally:
        stream.f.close()
    assert plan.stdin_script == head + rest
    assert plan.request("gres") == "gpu:1"


def _probe_as_user(cmd: list[str]) -> subprocess.Popen:
    """The probe as a user's foreground job: SIGINT and SIGQUIT not ignored, whatever this
    test's runner had (a background job's are)."""
    code = ("import os, signal, sys; os.geteuid = lambda: 1234; sys.argv[0] = 'horus-probe';"
            "signal.signal(signal.SIGINT, signal.default_int_handler);"
            "signal.signal(signal.SIGQUIT, signal.SIG_DFL);"
            "from slurm_horus.cli.probe import main; main()")
    return subprocess.Popen([sys.executable, "-c", code, "--", *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("cmd,rc", [
    ([sys.executable, "-c", "import signal, sys, time\n"
      "signal.signal(signal.SIGINT, lambda *a: sys.exit(7))\nprint('ready', flush=True)\ntime.sleep(60)"], 7),
    (["sh", "-c", "echo ready; exec sleep 60"], -signal.SIGINT),
])
def test_ctrl_c_under_a_users_probe_is_cmds_to_answer(cmd, rc):
    """The terminal's SIGINT reaches the whole process group: horus-probe ended with
    "Aborted!" (or a traceback), exit 1, and killed CMD, which may have had cleanup to do.
    As a plain run: CMD answers, and its status (a death by SIGINT too) is horus-probe's,
    CMD having taken its place."""
    p = _probe_as_user(cmd)
    try:
        assert p.stdout.readline() == "ready\n"
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == rc, err
    assert err.count("\n") == 1 and "refusing to record as uid 1234" in err, err


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGHUP])
def test_a_signal_to_a_users_probe_is_cmds_to_answer(sig):
    """slurmstepd sends --signal=USR1@60 (and scancel's) to every process of the step, a
    hangup reaches the whole group: the waiting probe died of them (no handler), its status
    -N where CMD had answered and ended well, and under srun its death ended the step. CMD
    now takes the probe's place, so the answer and the status are CMD's."""
    p = _probe_as_user([sys.executable, "-c", "import signal, sys, time\n"
                        f"signal.signal({int(sig)}, lambda *a: sys.exit(7))\n"
                        "print('ready', flush=True)\ntime.sleep(60)"])
    try:
        assert p.stdout.readline() == "ready\n"
        os.killpg(p.pid, sig)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 7


def test_a_cmd_that_cannot_run_gives_a_shells_status(tmp_path):
    p = _probe_as_user([str(tmp_path / "missing")])
    _, err = p.communicate(timeout=60)
    assert p.returncode == 127 and f"horus-probe: {tmp_path / 'missing'}:" in err
    (tmp_path / "data").write_text("not a program\n")  # found, not executable
    p = _probe_as_user([str(tmp_path / "data")])
    _, err = p.communicate(timeout=60)
    assert p.returncode == 126 and f"horus-probe: {tmp_path / 'data'}:" in err


def test_a_cmd_ended_by_a_signal_gives_128_plus_n_as_a_shell_does():
    """Popen's -15 had been exit status 241, as root (no NVML: no sampler); as a user CMD
    takes the probe's place, and its death by the signal is the probe's status."""
    p = _probe_as_user(["sh", "-c", "kill -TERM $$"])
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    code = ("import sys; sys.modules['pynvml'] = None; os = __import__('os'); os.geteuid = lambda: 0;"
            "from slurm_horus.cli.probe import main; main(['--', 'sh', '-c', 'kill -TERM $$'])")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert cp.returncode == 143, cp.stderr
