"""horus-probe with a fake sampler; quiet exit without NVML; NvmlSampler on a fake NVML."""

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_horus.cli.probe import main as probe_main
from slurm_horus.ledger import Ledger
from slurm_horus.ledger import probe as pr
from slurm_horus.ledger import prolog as pl
from slurm_horus.ledger.nvml import NvmlSampler, Summary
from slurm_horus.ledger.probe import job_gpu_ids, monitor, process_tree, run_probe


class FakeSampler:
    def __init__(self, gpu_ids, seq=((30.0, 1000.0), (None, 1500.0), (90.0, 1200.0))):
        self.seq = list(seq)
        self.index = int(gpu_ids[0]) if gpu_ids else None
        self.seen = []

    def sample(self, pids):
        self.seen.append(set(pids))
        return self.seq.pop(0) if self.seq else (60.0, 1100.0)

    def close(self):
        pass


def test_process_tree_has_children():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert {os.getpid(), p.pid} <= process_tree(os.getpid())
    finally:
        p.kill()
        p.wait()


def test_gpu_ids_from_env():
    assert job_gpu_ids({"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}) == ["1"]
    assert job_gpu_ids({"CUDA_VISIBLE_DEVICES": "GPU-abc,GPU-def"}) == ["GPU-abc", "GPU-def"]
    assert job_gpu_ids({}) == []


def test_monitor_summary():
    s = monitor(FakeSampler(["0"]), os.getpid(), interval=0, alive=lambda: True, max_samples=3,
                sleep=lambda _: None)
    r = s.result()
    assert r == {"util_mean": 60.0, "util_max": 90.0, "mem_peak_mib": 1500.0, "samples": 3}
    assert Summary().result()["util_mean"] is None


def test_run_probe_records_usage(tmp_path):
    url = f"sqlite:///{tmp_path}/l.db"
    env = {"SLURM_JOB_ID": "77", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_GPUS": "2",
           "SLURMD_NODENAME": "gpu-a100", "SLURM_SHARDS_ON_NODE": "30",
           "HORUS_SPOOL": str(tmp_path / "sp")}
    Ledger(url)  # the site's ledger (the probe never makes one: see test_ledger)
    rc = run_probe(command=[sys.executable, "-c", "import time; time.sleep(1.2); raise SystemExit(3)"],
                   interval=0.5, url=url, sampler_factory=FakeSampler, env=env)
    assert rc == 3  # the command's exit code
    u = Ledger(url).usage("c", 77)["probe"]
    assert u["mem_peak_mib"] >= 1000 and u["gpu_index"] == 2 and u["shards"] == 30
    assert u["node"] == "gpu-a100" and u["util_max"] is not None
    assert 1 <= u["end_time"] - u["start_time"] <= 30  # which run it measured (a requeue reruns)


def test_a_command_that_cannot_start_exits_127_and_records_nothing(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/l.db"
    for cmd in ([str(tmp_path / "missing")], [str(tmp_path)]):  # no such file; not executable
        assert run_probe(command=cmd, url=url, sampler_factory=FakeSampler,
                         env={"SLURM_JOB_ID": "78", "HORUS_SPOOL": str(tmp_path / "sp")}) == 127
    assert "horus-probe: " in capsys.readouterr().err and not (tmp_path / "l.db").exists()


def test_no_nvml_exits_zero_quietly(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID="5", HORUS_LEDGER_URL=f"sqlite:///{tmp_path}/l.db",
               HORUS_SPOOL=str(tmp_path / "sp"), PYTHONPATH=os.getcwd())
    code = ("import sys, slurm_horus.ledger.probe as p;"
            "sys.modules['pynvml'] = None;"  # import fails like a missing package
            "from slurm_horus.cli.probe import main; main(['--pid', '1', '--interval', '1'])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    r = subprocess.run([sys.executable, "-c", code.replace("'--pid', '1', ", "").replace(
        "'1'])", "'1', '--', 'sh', '-c', 'exit 4'])")], env=env, capture_output=True, text=True,
        timeout=60)
    assert r.returncode == 4


# --------------------------------------------------------------------------- NvmlSampler

def _fake_pynvml(procs, util_samples):
    """A stand-in for nvidia-ml-py (the only mock here: there is no GPU): two GPUs, with the
    per-process memory ``procs[gpu]`` and utilization samples ``util_samples[gpu]``."""
    class NVMLError(Exception):
        def __init__(self, value):  # pynvml's: the NVML return code
            super().__init__(value)
            self.value = value

    n = types.SimpleNamespace(NVMLError=NVMLError, NVML_ERROR_NOT_FOUND=6, shut=[], asked_since=[])
    n.nvmlInit = lambda: None
    n.nvmlShutdown = lambda: n.shut.append(True)
    n.nvmlDeviceGetCount = lambda: 2
    n.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    n.nvmlDeviceGetHandleByUUID = lambda u: ("gpu", int(u[-1]))
    n.nvmlDeviceGetIndex = lambda h: h[1]

    def process_utilization(h, since):
        n.asked_since.append((h[1], since))
        got = [s for s in util_samples[h[1]] if s.timeStamp > since]
        if not got:
            raise NVMLError(6)  # NVML_ERROR_NOT_FOUND: no process computed since
        return got
    n.nvmlDeviceGetProcessUtilization = process_utilization
    n.nvmlDeviceGetComputeRunningProcesses = lambda h: procs[h[1]]
    n.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=55)
    n.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * 2 ** 30)
    return n


def _util(pid, sm, ts):
    return types.SimpleNamespace(pid=pid, smUtil=sm, timeStamp=ts)


def _mem(pid, mib):
    return types.SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * 2 ** 20)


def test_nvml_sampler_sums_the_jobs_processes_only(monkeypatch):
    procs = {0: [_mem(10, 1000), _mem(11, 500), _mem(99, 7000)], 1: [_mem(12, 250), _mem(13, None)]}
    util = {0: [_util(10, 30, 5), _util(99, 60, 6)], 1: [_util(12, 90, 7), _util(11, 40, 8)]}
    fake = _fake_pynvml(procs, util)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = NvmlSampler(["0", "GPU-uuid-1"])
    assert s.index is None  # two GPUs: no single index
    # 99 is another job's process; 11 holds memory on GPU 0 but its utilization sample is on GPU 1
    u, mem = s.sample({10, 11, 12, 13})
    assert (u, mem) == (30 + 90 + 40, 1750.0)
    # the next call asks only for samples newer than those seen; none while the job holds the
    # GPUs: its processes were idle, 0 % (as beside a busy neighbour), not unknown
    u, mem = s.sample({10, 11, 12, 13})
    assert u == 0.0 and mem == 1750.0
    assert s.sample({77}) == (None, 0.0)  # no process of this job on the GPUs: unknown
    assert fake.asked_since[-2:] == [(0, 6), (1, 8)]
    util[0].append(_util(10, 250, 9))  # NVML can report > 100 for one GPU: clamped per GPU count
    assert s.sample({10})[0] == 200.0
    assert s.device_use() == (55.0, 3072.0)
    s.close()
    assert fake.shut == [True]
    one = NvmlSampler(["1"])
    assert one.index == 1 and one.sample({12}) == (90.0, 250.0)
    assert one.sample({12}) == (0.0, 250.0)  # no new samples while it holds the GPU: idle


def test_nvml_sampler_holds_a_sample_for_its_period(monkeypatch):
    """NVML takes a sample every 1/6 s to 1 s and answers NOT_FOUND until the next: a job busy
    throughout, polled five times a period, read 20 % (each poll between samples counted as
    idle); idle past a period it reads 0 %, and a job busy half the time reads half."""
    from slurm_horus.ledger import nvml as nv

    clock = [0.0]
    monkeypatch.setattr(nv.time, "time", lambda: clock[0])

    def run(period_s, busy, seconds=20.0, poll_s=0.2):
        util = {0: [], 1: []}
        fake = _fake_pynvml({0: [_mem(10, 1000)], 1: []}, util)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        s, got, t = NvmlSampler(["0"]), Summary(), 0.0
        clock[0] = 1000.0
        s.from_now()
        k = 1
        while t < seconds:
            t += poll_s
            clock[0] = 1000.0 + t
            while k * period_s <= t + 1e-9:  # NVML's samples taken by now: a job busy in that period
                at = 1000.0 + k * period_s
                if busy(k * period_s - period_s / 2):
                    util[0].append(_util(10, 100, int(at * 1e6)))
                k += 1
            u, mem = s.sample({10})
            got.add(u, mem)
        return got.result()["util_mean"]
    for period in (1.0, 0.5, 1 / 6):
        assert run(period, lambda t: True) == pytest.approx(100.0, abs=2), period
        assert run(period, lambda t: False) == 0.0
        half = run(period, lambda t: int(t) % 2 == 0)  # busy one second in two
        assert half == pytest.approx(50.0, abs=8), (period, half)


# --------------------------------------------------------------------------- root-only probe

FIX = Path(__file__).parent / "fixtures" / "slurm"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the Prolog probe runs as root")


def test_fake_sampler_reads_the_jobs_file(tmp_path):
    s = pr.FakeSampler(str(tmp_path), 12, ["3"])
    assert s.index == 3 and s.needs_pids is False
    with pytest.raises(LookupError):
        s.sample(set())  # no file yet: no sample
    (tmp_path / "12.json").write_text('{"util_pct": 140, "mem_mib": 2048}')
    assert s.sample(set()) == (100.0, 2048.0)  # clamped to one GPU
    (tmp_path / "12.json").write_text('{"mem_mib": 10}')
    assert s.sample(set()) == (None, 10.0)


def test_fake_sampler_refuses_links_and_fifos(tmp_path):
    (tmp_path / "secret").write_text('{"util_pct": 1, "mem_mib": 1}')
    (tmp_path / "5.json").symlink_to(tmp_path / "secret")
    with pytest.raises(LookupError):
        pr.FakeSampler(str(tmp_path), 5).sample(set())
    os.mkfifo(tmp_path / "6.json")
    with pytest.raises(LookupError):  # does not block on a FIFO
        pr.FakeSampler(str(tmp_path), 6).sample(set())


def test_sampler_choice_nvml_by_default():
    assert pr.sampler_factory_from_env({}) is NvmlSampler
    assert pr.sampler_factory_from_env({"HORUS_PROBE_SAMPLER": "nvml"}) is NvmlSampler
    s = pr.sampler_factory_from_env({"HORUS_PROBE_SAMPLER": "fake:/x"}, 9)(["1"])
    assert isinstance(s, pr.FakeSampler) and s.path == "/x/9.json"
    with pytest.raises(ValueError):
        pr.sampler_factory_from_env({"HORUS_PROBE_SAMPLER": "fake:"})


def test_not_root_refuses_to_record(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    for args in (["--prolog"], ["--epilog"], ["--pid", "1"], []):
        r = CliRunner().invoke(probe_main, args, env={"SLURM_JOB_ID": "5"})
        assert r.exit_code == 2, args
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
        assert "refusing to record as uid 1234" in r.stderr
    # an in-job `horus-probe -- CMD` still runs the command, unmeasured, with its exit code (in
    # a process of its own: CMD takes the probe's place)
    code = "import os; os.geteuid = lambda: 1234; from slurm_horus.cli.probe import main; main()"
    cp = subprocess.run([sys.executable, "-c", code, "--", "sh", "-c", "exit 4"], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 4 and "refusing" in cp.stderr


def _fake_slurm(tmp_path, listpids_fixture):
    """scontrol and squeue answering with what the cluster answered (tests/fixtures/slurm/probe)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(f"""#!/bin/sh
case "$1 $2" in
  "show node") cat '{FIX / "scontrol_show_node.stdout"}' ;;
  listpids*) cat '{listpids_fixture}' ;;
  *) exit 1 ;;
esac
""")
    (bin_ / "squeue").write_text(f"""#!/bin/sh
[ "$1" = --json ] && exec cat '{FIX / "probe" / "squeue_json_all.stdout"}'
exit 1
""")
    for cmd in ("scontrol", "squeue"):
        (bin_ / cmd).chmod(0o755)
    return str(bin_)


def _prolog_env(tmp_path, job_id, node):
    return dict(os.environ, SLURM_JOB_ID=str(job_id), SLURMD_NODENAME=node,
                SLURM_CLUSTER_NAME="horus", HORUS_PROBE_SAMPLER=f"fake:{tmp_path}/fake",
                HORUS_PROBE_RUN_DIR=str(tmp_path / "run"), HORUS_PROBE_INTERVAL="0.3",
                HORUS_PROBE_LOG=str(tmp_path / "probe.log"),
                HORUS_LEDGER_URL=f"sqlite:///{tmp_path}/ledger.db",
                HORUS_SPOOL=str(tmp_path / "spool"), PYTHONPATH=os.getcwd())


@root_only
def test_prolog_detaches_and_epilog_makes_it_record(tmp_path):
    """The recorded shard job on gpu-t4 (untyped: its type comes from the node's Gres)."""
    meta = json.loads((FIX / "probe" / "index.json").read_text())["fixtures"]
    job_id = meta["scontrol_show_job_shard_t4"]["job_id"]
    env = _prolog_env(tmp_path, job_id, "gpu-t4")
    env["PATH"] = _fake_slurm(tmp_path, FIX / "probe" / "scontrol_listpids_shard_t4.stdout") \
        + ":" + env["PATH"]
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / f"{job_id}.json").write_text('{"util_pct": 37.5, "mem_mib": 4100}')
    Ledger(env["HORUS_LEDGER_URL"])  # the site's ledger, made by its admin
    t0 = time.time()
    # stdout/stderr are pipes: returning means the detached probe holds none of them
    r = subprocess.run([sys.executable, "-m", "slurm_horus.cli.probe", "--prolog"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    assert time.time() - t0 < 10
    pidf = tmp_path / "run" / f"{job_id}.gpu-t4.pid"
    for _ in range(100):
        if pidf.exists():
            break
        time.sleep(0.1)
    assert pidf.exists(), (tmp_path / "probe.log").read_text()
    assert oct((tmp_path / "run").stat().st_mode & 0o777) == "0o700"
    pid = int(pidf.read_text().split()[0])
    with open(f"/proc/{pid}/stat") as f:  # a new session (not slurmd's), and not its leader
        sid = int(f.read().rsplit(")", 1)[1].split()[3])
    assert sid not in (pid, os.getsid(0))
    # /dev/null, nothing else: an fd it inherited stays, one it opens to sample (squeue's pipe)
    # closes, so it is looked at until a moment between samples (under load it had been mid-sample)
    for _ in range(50):
        fds = sorted(os.listdir(f"/proc/{pid}/fd"))
        if fds == ["0", "1", "2"]:
            break
        time.sleep(0.1)
    assert fds == ["0", "1", "2"]
    assert {os.readlink(f"/proc/{pid}/fd/{k}") for k in "012"} == {os.devnull}
    time.sleep(1.2)
    r = subprocess.run([sys.executable, "-m", "slurm_horus.cli.probe", "--epilog"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    assert not pidf.exists()
    u = Ledger(env["HORUS_LEDGER_URL"]).usage("horus", job_id)["probe"]
    assert u["util_mean"] == 37.5 and u["mem_peak_mib"] == 4100
    assert (u["gpu_index"], u["gpu_type"], u["node"], u["shards"]) == (0, "t4", "gpu-t4", 9)


@root_only
def test_prolog_without_gpu_or_without_fake_file_records_nothing(tmp_path):
    env = _prolog_env(tmp_path, 424242, "gpu-a100")
    job = (FIX / "probe" / "scontrol_show_job_gpu_a100_x2.stdout").read_text()
    meta = json.loads((FIX / "probe" / "index.json").read_text())["fixtures"]
    job_id = meta["scontrol_show_job_gpu_a100_x2"]["job_id"]
    env["SLURM_JOB_ID"] = str(job_id)
    env["PATH"] = _fake_slurm(tmp_path, FIX / "probe" / "scontrol_listpids_gpu_a100_x2.stdout") \
        + ":" + env["PATH"]
    assert "IDX:1-2" in job
    # no fake file: the probe runs but samples nothing, and records nothing
    rc = pl.prolog(env, detach=False, interval=0.1,
                   sampler_factory=lambda ids: _Stopper(ids, env, job_id))
    assert rc == 0
    assert "no samples: nothing recorded" in (tmp_path / "probe.log").read_text()
    assert not (tmp_path / "ledger.db").exists()
    # the same job seen from a node where it has nothing: not probed at all
    env["SLURMD_NODENAME"] = "gpu-t4"
    pl.prolog(env, detach=False)
    assert "not probed" in (tmp_path / "probe.log").read_text()
    # its pid file, written before the placement was asked, goes with it
    assert not list((tmp_path / "run").glob("*.pid"))


def test_the_probe_records_what_slurm_holds_not_what_the_job_wrote(tmp_path):
    """The recorded job whose name and comment forge scontrol's text (a FAILED job of root's on
    99 a100 shards, a second GPU index): the probe reads squeue's JSON and sees 9 shards of the
    t4's GPU 0, running."""
    meta = json.loads((FIX / "probe" / "index.json").read_text())["fixtures"]
    job_id = meta["scontrol_show_job_forged_t4"]["job_id"]
    env = _prolog_env(tmp_path, job_id, "gpu-t4")
    env["PATH"] = _fake_slurm(tmp_path, FIX / "probe" / "scontrol_listpids_forged_t4.stdout") \
        + ":" + env["PATH"]
    assert "gres:shard:a100:99" in (FIX / "probe" / "scontrol_show_job_forged_t4.stdout").read_text()
    assert pl.placement(str(job_id), "gpu-t4", env) == {"indices": [0], "type": "t4", "shards": 9,
                                                        "gpus": None}
    assert pl.job_record(str(job_id), env)["JobState"] == "RUNNING"


class _Stopper(pr.FakeSampler):
    """No file: every sample fails; removes the pid file (as the Epilog would) after 3 tries."""

    def __init__(self, ids, env, job_id):
        super().__init__(env["HORUS_PROBE_SAMPLER"][5:], job_id, ids)
        assert ids == ["1", "2"] and self.index is None  # two GPUs: no single index
        self.n, self.pidf = 0, pl.pid_file(env, str(job_id), env["SLURMD_NODENAME"])

    def sample(self, pids):
        self.n += 1
        if self.n == 3:
            os.unlink(self.pidf)
        return super().sample(pids)


def test_epilog_without_probe_waits_for_nothing_and_is_quiet(tmp_path, monkeypatch):
    env = _prolog_env(tmp_path, 99, "gpu-t4")

    def no_wait(*a):
        raise AssertionError("the Epilog waited for a probe that is not there")
    monkeypatch.setattr(pl.time, "sleep", no_wait)
    assert pl.epilog(dict(env, HORUS_PROBE_EPILOG_WAIT="600")) == 0
    monkeypatch.undo()
    assert pl.prolog(dict(env, SLURM_JOB_ID=""), detach=False) == 0


@root_only
def test_the_epilog_signals_no_process_of_a_user_that_calls_itself_a_probe(tmp_path):
    """A dead probe's pid reused by a user's process named "... probe --prolog" that ignores
    SIGTERM: root signalled it and the Epilog waited its full 10 s."""
    import pwd

    env = _prolog_env(tmp_path, 98, "gpu-t4")
    nobody = pwd.getpwnam("nobody")
    fake = subprocess.Popen(["bash", "-c", "trap '' TERM; exec -a 'horus-probe --prolog' sleep 30"],
                            user=nobody.pw_uid, group=nobody.pw_gid)
    try:
        time.sleep(0.3)
        pidf = tmp_path / "run" / "98.gpu-t4.pid"
        pidf.parent.mkdir(mode=0o700, exist_ok=True)
        pidf.write_text(f"{fake.pid} 98\n")
        t0 = time.time()
        assert pl.epilog(dict(env, HORUS_PROBE_EPILOG_WAIT="5")) == 0
        assert time.time() - t0 < 2 and fake.poll() is None and not pidf.exists()
    finally:
        fake.kill()
        fake.wait()


def test_shipped_prolog_epilog_always_exit_zero(tmp_path):
    for name in ("horus-prolog", "horus-epilog"):
        script = Path(__file__).parent.parent / "etc" / name
        assert os.access(script, os.X_OK)
        r = subprocess.run([str(script)], env={"PATH": "/usr/bin:/bin",
                                                "HORUS_PROBE": "false",
                                                "HORUS_PROBE_EPILOG_WAIT": "x"},
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout == r.stderr == ""
        r = subprocess.run([str(script)], env={"PATH": "/usr/bin:/bin",
                                                "HORUS_PROBE": str(tmp_path / "missing")},
                           capture_output=True, timeout=30)
        assert r.returncode == 0
        # the writing account's URL from admin.env reaches the probe; a broken file fails the
        # probe alone, never the job
        probe, seen = tmp_path / "probe", tmp_path / f"seen-{name}"
        probe.write_text(f"#!/bin/sh\necho \"$HORUS_LEDGER_URL $1\" > '{seen}'\n")
        probe.chmod(0o755)
        # taken literally, as systemd's EnvironmentFile= takes it: never run as shell code (a
        # URL's & had emptied it, a ( had stopped the probe)
        env_file = tmp_path / "admin.env"
        env_file.write_text(f"# the writing account\nif then (\ntouch {tmp_path}/ran\n"
                            "HORUS_LEDGER_URL='mysql+pymysql://w:p&s$1(x@db/horus'\n")
        r = subprocess.run([str(script)], env={"PATH": "/usr/bin:/bin", "HORUS_PROBE": str(probe),
                                                "HORUS_ADMIN_ENV": str(env_file)},
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout == r.stderr == ""
        flag = "--prolog" if name == "horus-prolog" else "--epilog"
        assert seen.read_text() == f"mysql+pymysql://w:p&s$1(x@db/horus {flag}\n"
        assert not (tmp_path / "ran").exists()


def test_a_job_slurmctld_has_purged_is_gone_not_unanswered(tmp_path):
    """The probe's job check: squeue's recorded answer for a job slurmctld no longer knows is
    GONE (the probe stops); no answer at all is None (it waits, up to UNANSWERED_LIMIT_S)."""
    rec = json.loads((FIX / "probe" / "index.json").read_text())["fixtures"]["squeue_state_purged_job"]
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "squeue").write_text(f"#!/bin/sh\ncat '{FIX / 'probe' / 'squeue_state_purged_job.stderr'}' >&2\n"
                                 f"exit {rec['rc']}\n")
    (bin_ / "squeue").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}")
    assert pl.job_state("4000000", env) == "GONE" and "GONE" not in pl.LIVE_STATES
    (bin_ / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    assert pl.job_state("4000000", env) is None


def test_a_record_is_not_spooled_into_a_folder_that_failed_its_check(tmp_path):
    from slurm_horus.ledger.store import record_usage_safely

    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "spool"
    link.symlink_to(target)
    assert pl._root_folder(str(link))  # a link is no root-only folder
    (tmp_path / "file").write_text("")
    bad_url = f"sqlite:///{tmp_path}/file/l.db"  # under a file: the ledger cannot be reached
    ok = record_usage_safely(url=bad_url, spool=str(link), spool_ok=False,
                             job_id=1, source="probe", util_mean=10.0)
    assert not ok and list(target.iterdir()) == []
    ok = record_usage_safely(url=bad_url, spool=str(target),
                             job_id=1, source="probe", util_mean=10.0)
    assert not ok and list(target.iterdir())  # with a good folder it is spooled


def test_a_probe_interval_out_of_range_is_kept_in_range_not_a_silent_stop():
    """The command line refused HORUS_PROBE_INTERVAL=0.05 (exit 2, which the Prolog hides), so no
    job was probed, while the Prolog's own reading would have taken 0.2."""
    from slurm_horus.cli.probe import main as probe_main
    from slurm_horus.ledger.prolog import probe_interval

    assert [probe_interval({"HORUS_PROBE_INTERVAL": v}) for v in ("0.05", "abc", "1e9", "nan", "", "7")] \
        == [0.2, 5.0, 3600.0, 5.0, 5.0, 7.0]
    interval = next(p for p in probe_main.params if p.name == "interval")
    assert interval.envvar is None  # the variable is read, clamped, above: not refused by click


@root_only
def test_the_probe_log_writes_only_into_a_regular_file_of_roots(tmp_path):
    """HORUS_PROBE_LOG in a folder users write to: a user's FIFO at its name had hung the probe
    at its first line (never to stop itself), a user's own file had been handed every line."""
    import pwd

    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    code = f"from slurm_horus.ledger.prolog import ProbeLog; ProbeLog({str(fifo)!r}, 7)('hello')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert r.returncode == 0 and r.stderr == ""
    users = tmp_path / "users.log"
    users.write_text("")
    os.chown(users, pwd.getpwnam("nobody").pw_uid, -1)
    pl.ProbeLog(str(users), 7)("hello")
    assert users.read_text() == ""
    pl.ProbeLog(str(tmp_path / "root.log"), 7)("hello")
    assert (tmp_path / "root.log").read_text().endswith("job 7: hello\n")


@root_only
def test_the_epilog_stops_no_other_probe_that_took_a_dead_probes_pid(tmp_path):
    """A probe killed (OOM, SIGKILL) leaves its pid file; the pid, reused by root's probe of
    another job, took this job's SIGTERM: that job's measurement ended early, its own Epilog
    found nothing to stop. The pid file names the process by its start too."""
    from slurm_horus.proc import started

    env = _prolog_env(tmp_path, 97, "gpu-t4")
    other = subprocess.Popen(["bash", "-c", "exec -a 'horus-probe --prolog' sleep 30"])
    try:
        time.sleep(0.3)
        pidf = tmp_path / "run" / "97.gpu-t4.pid"
        pidf.parent.mkdir(mode=0o700, exist_ok=True)
        dead_start = int(started(other.pid)) - 1  # the dead probe's: it started earlier
        pidf.write_text(f"{other.pid} 97 {dead_start}\n")
        assert pl.epilog(dict(env, HORUS_PROBE_EPILOG_WAIT="5")) == 0
        time.sleep(0.2)
        assert other.poll() is None and not pidf.exists()
        # the probe itself, exited but not yet reaped: nothing to wait for
        zombie = subprocess.Popen(["true"])
        time.sleep(0.3)
        pidf.write_text(f"{zombie.pid} 97 {started(zombie.pid)}\n")
        t0 = time.time()
        assert pl.epilog(dict(env, HORUS_PROBE_EPILOG_WAIT="5")) == 0
        assert time.time() - t0 < 2
        zombie.wait()
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("name,setting,value,limit", [
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "30", "30"),
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "0", "1"),  # 0: no limit at all to timeout(1)
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "007", "7"),
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "61", "60"),
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "9" * 30, "60"),
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "-5", "10"),
    ("horus-prolog", "HORUS_PROBE_PROLOG_TIMEOUT", "1e9", "10"),
    ("horus-epilog", "HORUS_PROBE_EPILOG_WAIT", "7", "12"),
    ("horus-epilog", "HORUS_PROBE_EPILOG_WAIT", "0", "5"),
    ("horus-epilog", "HORUS_PROBE_EPILOG_WAIT", "301", "305"),
    ("horus-epilog", "HORUS_PROBE_EPILOG_WAIT", "9" * 30, "305"),  # had overflowed $((W + 5))
    ("horus-epilog", "HORUS_PROBE_EPILOG_WAIT", "x", "15"),
])
def test_the_scripts_bound_their_time_whatever_they_are_told(tmp_path, name, setting, value, limit):
    """slurmd waits for its Prolog and Epilog: each script's limit stays within its range."""
    bin_, seen = tmp_path / "bin", tmp_path / "seen"
    bin_.mkdir()
    (bin_ / "timeout").write_text(f"#!/bin/sh\necho \"$@\" > '{seen}'\n")
    (bin_ / "timeout").chmod(0o755)
    script = Path(__file__).parent.parent / "etc" / name
    r = subprocess.run([str(script)], env={"PATH": f"{bin_}:/usr/bin:/bin", "HORUS_PROBE": "true",
                                           "HORUS_ADMIN_ENV": str(tmp_path / "none"), setting: value},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    flag = "--prolog" if name == "horus-prolog" else "--epilog"
    assert seen.read_text() == f"-k 2 {limit} true {flag}\n"


@pytest.mark.parametrize("value,limit,wait", [
    ("1e2", "15", 10.0),      # the probe had waited 100 s, killed by timeout(1) at 15
    (" 300", "305", 300.0),   # blanks about it: the probe had read it, the script had not
    ("250.5", "256", 251.0),  # a fraction: its next whole second, within the script's limit
    (".5", "6", 1.0),
    ("7", "12", 7.0),
    ("0400", "305", 300.0),
    ("-5", "15", 10.0),
])
def test_the_epilog_script_gives_the_probe_the_wait_it_bounds(tmp_path, value, limit, wait):
    """timeout(1)'s limit is the wait + 5 s: the probe must read the same wait, else it is killed
    while it waits for its probe to record (the Epilog's log then says nothing)."""
    bin_, seen = tmp_path / "bin", tmp_path / "seen"
    bin_.mkdir()
    (bin_ / "timeout").write_text(f"#!/bin/sh\necho \"$3\" > '{seen}'\nshift 3\nexec \"$@\"\n")
    (bin_ / "timeout").chmod(0o755)
    (bin_ / "probe").write_text(f"#!/bin/sh\necho \"$HORUS_PROBE_EPILOG_WAIT\" >> '{seen}'\n")
    (bin_ / "probe").chmod(0o755)
    script = Path(__file__).parent.parent / "etc" / "horus-epilog"
    r = subprocess.run([str(script)], env={"PATH": f"{bin_}:/usr/bin:/bin", "HORUS_PROBE": "probe",
                                           "HORUS_ADMIN_ENV": str(tmp_path / "none"),
                                           "HORUS_PROBE_EPILOG_WAIT": value},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    got_limit, got_wait = seen.read_text().split("\n")[:2]
    assert got_limit == limit
    assert pl.epilog_wait({"HORUS_PROBE_EPILOG_WAIT": got_wait}) == wait <= int(limit) - 5
