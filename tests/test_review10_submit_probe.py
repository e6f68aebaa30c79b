"""Review 10: hsubmit's own errors exit with $SLURM_EXIT_ERROR where sbatch's do; --explain sends
Slurm 25.11's --tres-bind as sbatch does; the root probe running CMD delivers a signal to CMD
once (a terminal's Ctrl-C and slurmstepd's signals reach CMD themselves)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_horus.cli import hsubmit as hs
from slurm_horus.ledger import Ledger
from slurm_horus.slurm import submit as sub

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "tests" / "data" / "zoo"


def hsubmit(args, env):
    return subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


# --------------------------------------------------------------------------- SLURM_EXIT_ERROR

@pytest.mark.parametrize("value,code", [
    ("7", 7), (" 9x", 9), ("+3", 3),             # atoi: blanks, a sign, digits, the rest ignored
    ("-1", 255), ("300", 44),                    # exit() keeps the low 8 bits
    ("99999999999999999999999", 255),            # strtol clamps to LONG_MAX
    ("0", 2), ("abc", 2), ("", 2), ("256", 2),   # no non-zero status: the code hsubmit had
])
def test_error_exit_reads_slurm_exit_error_as_sbatch_does(monkeypatch, capsys, value, code):
    monkeypatch.setenv("SLURM_EXIT_ERROR", value)
    assert hs.error_exit(2) == code
    assert ("SLURM_EXIT_ERROR" in capsys.readouterr().err) == (code == 2)


def test_hsubmits_own_errors_exit_with_slurm_exit_error(tmp_path, slurm_bin):
    """sbatch exits with $SLURM_EXIT_ERROR where a submission fails; hsubmit, its drop-in, had
    exited 1 on its own regardless, so a pipeline set up for sbatch's code missed them."""
    env, log = slurm_bin
    env = {**env, "SLURM_EXIT_ERROR": "7"}
    model = ["--model", str(ZOO / "resnet50.onnx")]
    # a script on stdin that cannot be read: sbatch says "Batch script is empty!", exit(error_exit)
    code = (f"import os, sys; os.dup2(os.open({str(tmp_path)!r}, os.O_RDONLY), 0);"
            "from slurm_horus.cli.hsubmit import main;"
            f"sys.exit(main(['-p', 'gpu', '--gres=gpu:1', *{model!r}]))")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert cp.returncode == 7 and not log.exists() and "standard input" in cp.stderr, cp.stderr
    # a model that cannot be read, where the site refuses such jobs
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(bad), "--wrap", "true"],
                 {**env, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert cp.returncode == 7 and not log.exists() and "job refused" in cp.stderr, cp.stderr
    # without the variable: the codes hsubmit always had
    del env["SLURM_EXIT_ERROR"]
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(bad), "--wrap", "true"],
                 {**env, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert cp.returncode == 1, cp.stderr


@pytest.mark.parametrize("args", [
    ["--precision", "fp8"],          # a value hsubmit's option cannot take
    ["--batch-size", "-3"],
    ["--dim", "seq=x"],
])
def test_a_usage_error_keeps_exit_2_whatever_slurm_exit_error_says(slurm_bin, args):
    """sbatch's usage errors (an unknown option, a bad value, a bad #SBATCH line) exit 255 with
    SLURM_EXIT_ERROR set or not (slurm_process_option_or_exit's exit(-1); 22.05.8's sbatch
    --mem=foo and --bogus: 255 under SLURM_EXIT_ERROR=7); hsubmit's had become $SLURM_EXIT_ERROR,
    which a pipeline reads as a failed submission (retried, where a bad option never passes)."""
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"), *args,
                  "--wrap", "true"], {**env, "SLURM_EXIT_ERROR": "7"})
    assert cp.returncode == 2 and not log.exists() and "error" in cp.stderr, cp.stderr


def test_sbatchs_own_exit_status_passes_through(slurm_bin):
    """hsubmit execs sbatch: sbatch's status is the user's, SLURM_EXIT_ERROR or not."""
    env, log = slurm_bin
    sbatch = Path(env["PATH"].split(":")[0]) / "sbatch"
    sbatch.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\nexit 3\n')
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--wrap", "true"], {**env, "SLURM_EXIT_ERROR": "7"})
    assert cp.returncode == 3 and log.exists(), cp.stderr


# --------------------------------------------------------------------------- --tres-bind

@pytest.mark.parametrize("argv,env,want", [
    (["--tres-bind=gres/gpu:closest"], {}, "gres/gpu:closest"),
    (["--tres-b=gres/gpu:single:1"], {}, "gres/gpu:single:1"),                    # a prefix, as getopt
    (["--gpu-bind=none", "--tres-bind=gres/gpu:closest"], {}, "gres/gpu:closest"),  # the last wins
    (["--tres-bind=gres/gpu:closest", "--gpu-bind=none"], {}, "gres/gpu:none"),
    ([], {"SBATCH_TRES_BIND": "gres/gpu:closest"}, "gres/gpu:closest"),
    ([], {"SBATCH_TRES_BIND": "gres/gpu:closest", "SBATCH_GPU_BIND": "none"}, "gres/gpu:closest"),
    (["--gpu-bind=none"], {"SBATCH_TRES_BIND": "gres/gpu:closest"}, "gres/gpu:none"),  # command line last
    (["--tres-bind=gres/gpu:closest"], {"SBATCH_GPU_BIND": "none"}, "gres/gpu:closest"),
])
def test_the_explained_job_desc_carries_tres_bind_as_sbatch_2511_sends_it(argv, env, want):
    """sbatch 25.11's --tres-bind=Y sets job_desc.tres_bind to Y, --gpu-bind=X to gres/gpu:X, each
    over the other (slurm_opt.c); --explain had dropped --tres-bind, and said "shared" for a job
    the hook leaves whole (Slurm gives the steps of a job on shards with a GPU binding no GPU)."""
    plan = sub.prepare(["--gres=gpu:1", *argv, "--wrap", "true"], env=env)
    assert sub.job_desc_of(plan)["tres_bind"] == want


def test_a_scripts_tres_bind_yields_to_the_environments_gpu_bind(tmp_path):
    """sbatch reads #SBATCH lines first, then SBATCH_* variables, then the command line."""
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --tres-bind=gres/gpu:closest\ntrue\n")
    assert sub.job_desc_of(sub.prepare([str(script)], env={}))["tres_bind"] == "gres/gpu:closest"
    plan = sub.prepare([str(script)], env={"SBATCH_GPU_BIND": "none"})
    assert sub.job_desc_of(plan)["tres_bind"] == "gres/gpu:none"


def test_explain_leaves_a_tres_bind_job_whole():
    model = ["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", "--task", "infer"]
    plan = sub.prepare([*model, "--gres=gpu:1", "--tres-bind=gres/gpu:closest", "--wrap", "srun python t.py"],
                       env={})
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    d = sub.decision_of(plan)
    assert d.action == "unchanged", d.note


@pytest.mark.parametrize("bind,action", [("gres/gpu:closest", "unchanged"), ("gres/nic:closest", "shared")])
def test_explain_reads_a_parent_jobs_tres_bind_as_the_hook_does(bind, action):
    """hsubmit inside a job submitted with --gpu-bind (25.11 sbatch writes SLURM_TRES_BIND in its
    environment, which srun reads as --tres-bind): the hook keeps the new job whole, --explain
    had said "shared"."""
    model = ["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", "--task", "infer"]
    plan = sub.prepare([*model, "--gres=gpu:1", "--wrap", "srun python t.py"], env={"SLURM_TRES_BIND": bind})
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    d = sub.decision_of(plan)
    assert d.action == action, d.note


# --------------------------------------------------------------------------- the probe's signals

# CMD's exit status: 1 where it inherited SIGINT ignored, + 2 for SIGQUIT
IGNORED = ("import signal, sys; sys.exit((signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
           " + 2 * (signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN))")


@pytest.mark.parametrize("measured", [True, False])
def test_signals_ignored_on_entry_stay_ignored_for_cmd(tmp_path, measured):
    """sh starts a script's background job (`horus-probe -- CMD &`) with SIGINT and SIGQUIT
    ignored; the probe's handlers had made exec give CMD the default ones, so a Ctrl-C of the
    script killed the CMD it was meant to leave running (a SIGQUIT, with a core dump)."""
    from slurm_horus.ledger import probe

    cmd = [sys.executable, "-c", IGNORED]

    def run() -> int:
        if measured:
            return probe.run_probe(command=cmd, job_id="5", env={}, sampler_factory=lambda ids: None)
        # unmeasured, CMD takes the probe's place (exec): in a process of its own
        code = "import sys; from slurm_horus.ledger.probe import run_unmeasured; sys.exit(run_unmeasured(sys.argv[1:]))"
        return subprocess.run([sys.executable, "-c", code, *cmd], timeout=60).returncode

    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        assert run() == 3
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in old)
        # not ignored on entry (a foreground job's, whatever this test's runner had: a
        # background job's are ignored): CMD gets the default ones, the probe's handlers put back
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        assert run() == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the probe measures (and signals) only as root")

# CMD: counts the SIGINTs/SIGTERMs delivered to it (the wakeup fd gets a byte for each, where
# Python's handler may run once for two close together); after the first it says so (.got) and
# "cleans up" a while, when a second one would arrive, then writes the count and exits 0
CHILD = r"""
import os, signal, sys, time
out, sig = sys.argv[1], getattr(signal, sys.argv[2])
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(sig, lambda *_: None)
open(out + ".ready", "w").close()
got = os.read(r, 64)
open(out + ".got", "w").close()
time.sleep(2.0)
os.set_blocking(r, False)
try:
    got += os.read(r, 64)
except BlockingIOError:
    pass
with open(out, "w") as f:
    f.write(str(len(got)))
"""


def _caught(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (/proc's SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (sig - 1) & 1)


def _wait_for(cond, what: str) -> None:
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _env(tmp_path, **extra) -> dict:
    """The probe's environment: job 5 of cluster c, a fake sampler, a ledger in tmp_path."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "5.json").write_text('{"util_pct": 10, "mem_mib": 100}')
    env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
    env.update(PYTHONPATH=str(ROOT), SLURM_JOB_ID="5", SLURM_CLUSTER_NAME="c",
               HORUS_PROBE_SAMPLER=f"fake:{tmp_path / 'fake'}", HORUS_SPOOL=str(tmp_path / "spool"),
               HORUS_LEDGER_URL=f"sqlite:///{tmp_path / 'l.db'}", **extra)
    Ledger(env["HORUS_LEDGER_URL"])  # the site's ledger (the probe never makes one)
    return env


def _recorded(tmp_path) -> dict | None:
    return Ledger(f"sqlite:///{tmp_path / 'l.db'}").usage("c", 5).get("probe")


def _probe_and_signal(tmp_path, signame: str, extra_env: dict, group: bool) -> tuple[int, str]:
    """Run the root probe over CHILD in a session of their own (as a terminal's foreground job)
    and send ``signame``: to the whole group (a terminal's hangup, slurmstepd), else to the probe
    alone; the probe's status and the number of signals CHILD got. For the group the probe is
    held stopped until CHILD has had its copy, so that a copy the probe forwards comes after it,
    not merged into it while still pending. A probe the signal kills leaves CHILD behind: the
    group is killed at the end whatever happened."""
    out = tmp_path / "count"
    env = _env(tmp_path, **extra_env)
    sig = getattr(signal, signame)
    probe = subprocess.Popen([sys.executable, "-m", "slurm_horus.cli.probe", "--interval", "0.2", "--",
                              sys.executable, "-c", CHILD, str(out), signame],
                             env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        # all the probe's handlers are in place (with its SIGTERM's, before CMD starts), and CMD's
        _wait_for(lambda: _caught(probe.pid, signal.SIGTERM) and Path(f"{out}.ready").exists(), "ready")
        if group:
            os.kill(probe.pid, signal.SIGSTOP)
            os.killpg(probe.pid, sig)
            _wait_for(Path(f"{out}.got").exists, "CMD's signal")
            os.kill(probe.pid, signal.SIGCONT)
        else:
            os.kill(probe.pid, sig)
        probe.wait(timeout=120)
    finally:
        try:
            os.killpg(probe.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        probe.wait()
    return probe.returncode, out.read_text() if out.exists() else "no count"


@root_only
def test_a_terminals_ctrl_c_reaches_the_probes_cmd_once(tmp_path):
    """A Ctrl-C reaches the terminal's whole foreground process group, CMD too; the root probe
    forwarded its own copy, so CMD got two SIGINTs (Python's second one kills a handler
    mid-cleanup)."""
    assert _probe_and_signal(tmp_path, "SIGINT", {}, group=True) == (0, "1")


@root_only
def test_slurmstepds_sigterm_reaches_the_probes_cmd_once(tmp_path):
    """slurmstepd (scancel, a time limit) signals every process of the step: CMD has its SIGTERM
    without the probe's."""
    assert _probe_and_signal(tmp_path, "SIGTERM", {"SLURMD_NODENAME": "n1"}, group=True) == (0, "1")


@root_only
def test_a_sigterm_of_the_probe_alone_outside_a_step_still_reaches_cmd(tmp_path):
    """Outside a Slurm step a `kill` of the probe reaches the probe alone: it is forwarded."""
    assert _probe_and_signal(tmp_path, "SIGTERM", {}, group=False) == (0, "1")


# --------------------------------------------------------------------------- CMD as without the probe

USER_PROBE = ("import os, sys; os.geteuid = lambda: 1234; from slurm_horus.cli.probe import main; "
              "main()")
ROOT_PROBE = ("import os, sys; sys.modules['pynvml'] = None; os.geteuid = lambda: 0; "
              "from slurm_horus.cli.probe import main; main()")


@pytest.mark.parametrize("code", [USER_PROBE, ROOT_PROBE], ids=["user", "root"])
def test_cmd_gets_the_locale_and_fds_it_was_given(tmp_path, code):
    """Python's start sets LC_CTYPE=C.UTF-8 where the locale is C (PEP 538), and CMD inherited
    it (`wc -m` then counts characters); the root probe's Popen closed the fds a caller had
    passed (`horus-probe -- CMD 3>log`). CMD gets them as without the probe."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LC_ALL", "LC_CTYPE", "LANG", "SLURM_JOB_ID")}
    r, w = os.pipe()
    try:
        cp = subprocess.run([sys.executable, "-c", code, "--", "sh", "-c",
                             f'echo "${{LC_CTYPE-unset}} $LANG"; echo passed >/proc/self/fd/{w}'],
                            env={**env, "LANG": "C"}, capture_output=True, text=True, timeout=60,
                            pass_fds=(w,))
        os.close(w)
        w = None
        assert cp.returncode == 0, cp.stderr
        assert cp.stdout == "unset C\n"
        assert os.read(r, 64) == b"passed\n"
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_a_user_probe_with_stdout_or_stderr_closed_still_runs_cmd():
    """A closed stdout (`>&-`) is sys.stdout None: flushing it before exec raised, so CMD never
    ran and the probe ended with a traceback, exit 1."""
    for fd in (1, 2):
        cp = subprocess.run(["sh", "-c", f'exec "$@" {fd}>&-', "sh", sys.executable, "-c",
                             USER_PROBE, "--", "sh", "-c", "exit 4"], capture_output=True,
                            timeout=60)
        assert cp.returncode == 4, (fd, cp.stderr)


def test_a_sigterm_to_forward_before_cmd_starts_reaches_cmd(monkeypatch):
    """Outside a step a SIGTERM of the probe is CMD's; one arriving before Popen had set the
    probe's stop and found no CMD to pass it to: CMD, never told, ran to its end."""
    from slurm_horus.ledger import probe

    popen = subprocess.Popen

    def late_popen(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, before CMD exists
        return popen(*args, **kwargs)

    monkeypatch.setattr(probe.subprocess, "Popen", late_popen)
    rc = probe.run_probe(command=[sys.executable, "-c", "import time; time.sleep(30)"],
                         job_id="5", env={}, sampler_factory=lambda ids: None)
    assert rc == 128 + signal.SIGTERM
