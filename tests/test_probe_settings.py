"""The probe's settings and job ids: a bad value never stalls an Epilog nor fails a job; a bad
--job-id typed by hand is a one-line usage error."""

import os
import subprocess
import time
import types

import pytest
from click.testing import CliRunner

from slurm_horus.cli.probe import main as probe_main
from slurm_horus.ledger import prolog as pl
from slurm_horus.ledger.probe import run_probe

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the Epilog reads only root's pid files")


class _Clock:
    """time for prolog.py: sleeping advances it; past 400 s the Epilog is stuck."""

    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        if self.now > 1400.0:
            raise AssertionError("the Epilog waited past 400 s")


@root_only
@pytest.mark.parametrize("value,waited,logged", [
    ("1e9", 300.0, True), ("inf", 10.0, True), ("600", 300.0, True), ("-5", 0.0, True),
    ("nan", 10.0, True), ("soon", 10.0, True), ("2.5", 2.5, False), ("", 10.0, False),
])
def test_the_epilog_waits_within_0_to_300_s_whatever_it_is_told(value, waited, logged, tmp_path,
                                                                 monkeypatch):
    """HORUS_PROBE_EPILOG_WAIT=1e9 (or inf) had been waited for as written, a probe slow to
    record holding the Epilog, and the node, until Slurm drained it."""
    clock = _Clock()
    monkeypatch.setattr(pl, "time", types.SimpleNamespace(time=clock.time, sleep=clock.sleep,
                                                          strftime=time.strftime))
    monkeypatch.setattr(pl, "_same_probe", lambda pid, start: True)  # a probe that never ends
    busy = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "run").mkdir(mode=0o700)
        (tmp_path / "run" / "41.gpu-t4.pid").write_text(f"{busy.pid} 41 1\n")
        log = tmp_path / "probe.log"
        env = {"SLURM_JOB_ID": "41", "SLURMD_NODENAME": "gpu-t4", "HORUS_PROBE_EPILOG_WAIT": value,
               "HORUS_PROBE_RUN_DIR": str(tmp_path / "run"), "HORUS_PROBE_LOG": str(log)}
        assert pl.epilog(env) == 0
    finally:
        busy.kill()
        busy.wait()
    assert clock.now - 1000.0 == pytest.approx(waited, abs=0.1)
    said = [line for line in log.read_text().splitlines() if "HORUS_PROBE_EPILOG_WAIT" in line]
    assert len(said) == logged and (not said or f"using {waited:g}" in said[0])


def test_a_job_id_typed_by_hand_must_be_a_number(tmp_path):
    """--job-id abc had been measured, dropped at the record, and exited 0."""
    ran = tmp_path / "ran"
    r = CliRunner().invoke(probe_main, ["--job-id", "abc", "--", "touch", str(ran)],
                           prog_name="horus-probe")
    assert r.exit_code == 2 and "--job-id" in r.output and "'abc'" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not ran.exists()


def test_a_job_id_from_the_environment_never_fails_the_job(tmp_path):
    """$SLURM_JOB_ID is the job's (or slurmd's): one that is no number is no error, CMD runs and
    its code is returned; the Prolog and Epilog probe nothing and exit 0."""
    env = {"SLURM_JOB_ID": "abc", "HORUS_PROBE_RUN_DIR": str(tmp_path / "run")}
    r = CliRunner().invoke(probe_main, ["--", "sh", "-c", "exit 3"], env=env)
    assert r.exit_code == 3, r.output
    for mode in ("--prolog", "--epilog"):
        r = CliRunner().invoke(probe_main, [mode], env=env)
        assert r.exit_code == 0 and r.output == ""


class _Sampler:
    index = 0

    def sample(self, pids):
        return 50.0, 1000.0

    def close(self):
        pass


def test_a_job_id_that_is_no_number_records_nothing_and_keeps_the_commands_code(tmp_path):
    """Its record had raised (int('abc')) after the command ran: the command's exit code was
    lost (0)."""
    url = f"sqlite:///{tmp_path}/l.db"
    rc = run_probe(command=["sh", "-c", "sleep 0.3; exit 3"], interval=0.05, job_id="abc",
                   url=url, sampler_factory=lambda ids: _Sampler(), env={})
    assert rc == 3 and not (tmp_path / "l.db").exists()


def test_a_job_id_of_other_digits_is_no_job():
    """'²' is a digit to str.isdigit, not to int(): the Epilog had raised on it."""
    assert pl.epilog({"SLURM_JOB_ID": "²"}) == 0
    assert pl.prolog({"SLURM_JOB_ID": "٣"}, detach=False) == 0
