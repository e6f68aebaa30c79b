"""horus-probe with a fake sampler; quiet exit without NVML."""

import os
import subprocess
import sys

from slurm_horus.ledger import Ledger
from slurm_horus.probe import Summary, job_gpu_ids, monitor, process_tree, run_probe


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
    rc = run_probe(command=[sys.executable, "-c", "import time; time.sleep(1.2); raise SystemExit(3)"],
                   interval=0.5, url=url, sampler_factory=FakeSampler, env=env)
    assert rc == 3  # the command's exit code
    u = Ledger(url).usage("c", 77)["probe"]
    assert u["mem_peak_mib"] >= 1000 and u["gpu_index"] == 2 and u["shards"] == 30
    assert u["node"] == "gpu-a100" and u["util_max"] is not None


def test_no_nvml_exits_zero_quietly(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID="5", HORUS_LEDGER_URL=f"sqlite:///{tmp_path}/l.db",
               HORUS_SPOOL=str(tmp_path / "sp"), PYTHONPATH=os.getcwd())
    code = ("import sys, slurm_horus.probe as p;"
            "sys.modules['pynvml'] = None;"  # import fails like a missing package
            "from slurm_horus.cli.probe import main; main(['--pid', '1', '--interval', '1'])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    r = subprocess.run([sys.executable, "-c", code.replace("'--pid', '1', ", "").replace(
        "'1'])", "'1', '--', 'sh', '-c', 'exit 4'])")], env=env, capture_output=True, text=True,
        timeout=60)
    assert r.returncode == 4
