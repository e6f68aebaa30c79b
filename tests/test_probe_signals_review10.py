"""Review 10: SIGHUP, SIGUSR1 and SIGUSR2 no longer kill the root probe (a dead probe records
nothing, and under srun its death ends the step). Around CMD: SIGHUP ends the sampling and the
summary is recorded, never forwarded (a hangup, like slurmstepd, signals CMD's process group
itself); SIGUSR1/SIGUSR2 (a job's --signal=USR1@60, scancel --signal) leave sampling on and are
forwarded only outside a step. Watching a --pid: SIGHUP ends the sampling, SIGUSR1/2 do not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.ledger import Ledger
# the signal-counting CMD and its helpers, as the Ctrl-C tests use them
from test_review10_submit_probe import _probe_and_signal, _recorded, root_only

ROOT = Path(__file__).resolve().parent.parent


@root_only
@pytest.mark.parametrize("signame", ["SIGUSR1", "SIGUSR2"])
def test_slurmstepds_usr_signal_reaches_cmd_once_and_the_probe_records(tmp_path, signame):
    """--signal=USR1@60 (or scancel --signal=USR1) signals every process of the step: the probe
    had died of it, so the job's measure was lost (and srun's step ended with the probe)."""
    assert _probe_and_signal(tmp_path, signame, {"SLURMD_NODENAME": "n1"}, group=True) == (0, "1")
    assert _recorded(tmp_path)["util_max"] == 10


@root_only
@pytest.mark.parametrize("signame", ["SIGUSR1", "SIGUSR2"])
def test_a_usr_signal_of_the_probe_alone_outside_a_step_reaches_cmd(tmp_path, signame):
    """Outside a Slurm step a `kill -USR1` of the probe reaches the probe alone: it is CMD's."""
    assert _probe_and_signal(tmp_path, signame, {}, group=False) == (0, "1")
    assert _recorded(tmp_path) is not None


@root_only
@pytest.mark.parametrize("extra_env", [{"SLURMD_NODENAME": "n1"}, {}], ids=["in-step", "terminal"])
def test_a_hangup_reaches_cmd_once_and_the_probe_records(tmp_path, extra_env):
    """A hangup signals CMD's process group itself (the shell's SIGHUP to its jobs, the kernel's
    to the foreground group; slurmstepd's to the step): the probe had died at once, recording
    nothing; a copy forwarded as well would reach CMD twice."""
    assert _probe_and_signal(tmp_path, "SIGHUP", extra_env, group=True) == (0, "1")
    assert _recorded(tmp_path)["util_max"] == 10


# watching a --pid, in a process of its own (the old probe died of these signals): the sampler
# sends the probe SIGUSR1 at its first sample, SIGUSR2 at its second, SIGHUP at its third (and
# SIGTERM at its sixth, for nohup's), while the watched process lives on; prints the probe's
# status, the number of samples taken and whether SIGHUP is still ignored
WATCH = r"""
import json, os, signal, subprocess, sys
from slurm_horus.ledger.probe import run_probe
SENDS = {1: signal.SIGUSR1, 2: signal.SIGUSR2, 3: signal.SIGHUP, 6: signal.SIGTERM}
class Sampler:
    index = 0
    calls = 0
    def __init__(self, gpu_ids):
        pass
    def sample(self, pids):
        Sampler.calls += 1
        if Sampler.calls in SENDS:
            os.kill(os.getpid(), SENDS[Sampler.calls])
        return 50.0, 700.0
    def close(self):
        pass
# as nohup leaves it, or not ignored (whatever this test's own runner had: CI under nohup)
signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv[2] == "nohup" else signal.SIG_DFL)
# until its stdin closes: this process's end, which its death closes too (no leak, no pipe held)
watched = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    rc = run_probe(pid=watched.pid, interval=0.01, job_id="5", url=sys.argv[1],
                   sampler_factory=Sampler, env={"SLURM_CLUSTER_NAME": "c"})
finally:
    watched.kill()
print(json.dumps([rc, Sampler.calls, signal.getsignal(signal.SIGHUP) == signal.SIG_IGN]))
"""


@pytest.mark.parametrize("mode,samples", [("", 3), ("nohup", 6)])
def test_watching_a_pid_sighup_ends_the_sampling_and_usr_signals_do_not(tmp_path, mode, samples):
    """SIGUSR1/SIGUSR2 are not the probe's: sampling goes on. SIGHUP ends it, and the summary is
    recorded; under nohup (SIGHUP ignored on entry) it stays ignored, and sampling goes on to
    the SIGTERM."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Ledger(url)
    cp = subprocess.run([sys.executable, "-c", WATCH, url, mode], capture_output=True, text=True,
                        timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT),
                                          "HORUS_SPOOL": str(tmp_path / "spool")})
    assert cp.returncode == 0, (cp.returncode, cp.stderr)
    assert json.loads(cp.stdout) == [0, samples, mode == "nohup"]
    u = _recorded(tmp_path)
    assert (u["util_max"], u["mem_peak_mib"]) == (50, 700)


# CMD's exit status: a bit for each of SIGHUP, SIGUSR1, SIGUSR2 it inherited ignored
IGNORED = ("import signal, sys; sys.exit(sum(1 << i for i, s in enumerate((signal.SIGHUP,"
           " signal.SIGUSR1, signal.SIGUSR2)) if signal.getsignal(s) == signal.SIG_IGN))")


@pytest.mark.parametrize("in_step", [True, False])
def test_signals_ignored_on_entry_stay_ignored_for_cmd(in_step):
    """nohup's SIGHUP (and a SIGUSR1/SIGUSR2 ignored on entry) stay ignored for CMD, whose
    handlers of ours would have made exec give it the default ones; not ignored, CMD gets the
    default ones, and the caller's handlers are put back."""
    from slurm_horus.ledger import probe

    env = {"SLURMD_NODENAME": "n1"} if in_step else {}
    cmd = [sys.executable, "-c", IGNORED]
    sigs = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    try:
        assert probe.run_probe(command=cmd, job_id="5", env=env, sampler_factory=lambda ids: None) == 7
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in sigs)
        for sig in sigs:
            signal.signal(sig, signal.SIG_DFL)
        assert probe.run_probe(command=cmd, job_id="5", env=env, sampler_factory=lambda ids: None) == 0
        assert all(signal.getsignal(sig) == signal.SIG_DFL for sig in sigs)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
