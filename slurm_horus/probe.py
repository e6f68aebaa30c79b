"""horus-probe: sample the GPU use of a job's own processes and record a summary in the ledger.

NVML (nvidia-ml-py, ``pip install slurm-horus[probe]``) is reached only through ``NvmlSampler``;
the loop talks to a sampler with one method, ``sample(pids) -> (util_pct | None, mem_mib)``, so
tests use a fake. Per-process SM utilization comes from nvmlDeviceGetProcessUtilization, memory
from nvmlDeviceGetComputeRunningProcesses, both summed over the job's process tree on the job's
GPUs (SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES). Without NVML the probe exits 0 quietly.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field


def process_tree(root: int) -> set[int]:
    """root and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {root}
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo += children.get(p, [])
    return out


def job_gpu_ids(env: dict | None = None) -> list[str]:
    """The job's GPUs as NVML can find them: physical indices (SLURM_JOB_GPUS) or UUIDs/indices
    from CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    for var in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        v = env.get(var)
        if v and v.strip() not in ("", "NoDevFiles"):
            return [x.strip() for x in v.split(",") if x.strip()]
    return []


class NvmlSampler:
    """The real sampler. Raises ImportError/RuntimeError from __init__ when NVML is unusable."""

    def __init__(self, gpu_ids: list[str]):
        import pynvml  # nvidia-ml-py

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = []
        ids = gpu_ids or [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        for g in ids:
            if g.isdigit():
                self.handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(g)))
            else:
                self.handles.append(pynvml.nvmlDeviceGetHandleByUUID(g))
        self.last_ts = {id(h): 0 for h in self.handles}
        self.index = None
        if len(self.handles) == 1:
            try:
                self.index = int(pynvml.nvmlDeviceGetIndex(self.handles[0]))
            except Exception:
                self.index = int(ids[0]) if ids[0].isdigit() else None

    def sample(self, pids: set[int]) -> tuple[float | None, float]:
        n = self.nvml
        util = None
        mem = 0.0
        for h in self.handles:
            try:
                samples = n.nvmlDeviceGetProcessUtilization(h, self.last_ts[id(h)])
                for s in samples:
                    self.last_ts[id(h)] = max(self.last_ts[id(h)], int(s.timeStamp))
                    if s.pid in pids:
                        util = (util or 0.0) + float(s.smUtil)
                if util is None:
                    util = 0.0
            except n.NVMLError:
                pass  # no samples since last time / not supported: utilization unknown
            try:
                for p in n.nvmlDeviceGetComputeRunningProcesses(h):
                    if p.pid in pids and p.usedGpuMemory:
                        mem += p.usedGpuMemory / 2 ** 20
            except n.NVMLError:
                pass
        return (min(util, 100.0 * len(self.handles)) if util is not None else None), mem

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


@dataclass
class Summary:
    samples: int = 0
    util_samples: list = field(default_factory=list)
    mem_peak_mib: float = 0.0

    def add(self, util: float | None, mem: float) -> None:
        self.samples += 1
        if util is not None:
            self.util_samples.append(util)
        self.mem_peak_mib = max(self.mem_peak_mib, mem)

    def result(self) -> dict:
        u = self.util_samples
        return {"util_mean": sum(u) / len(u) if u else None, "util_max": max(u) if u else None,
                "mem_peak_mib": self.mem_peak_mib if self.samples else None,
                "samples": self.samples}


def monitor(sampler, root_pid: int, interval: float = 5.0, alive=None, max_samples=None,
            sleep=time.sleep, stop=None) -> Summary:
    """Sample until root_pid exits (or stop() is true). Returns the summary."""
    s = Summary()
    alive = alive or (lambda: _alive(root_pid))
    while alive() and not (stop and stop()):
        pids = process_tree(root_pid)
        try:
            util, mem = sampler.sample(pids)
            s.add(util, mem)
        except Exception:
            pass
        if max_samples and s.samples >= max_samples:
            break
        sleep(interval)
    return s


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def run_probe(*, pid: int | None = None, command: list[str] | None = None, interval: float = 5.0,
              job_id: str | None = None, cluster: str | None = None, url: str | None = None,
              sampler_factory=None, env: dict | None = None) -> int:
    """The whole probe. Returns the exit code: the command's, else 0. Never raises."""
    import subprocess

    env = dict(os.environ if env is None else env)
    proc = None
    if command:
        proc = subprocess.Popen(command)
        pid = proc.pid
    pid = pid or os.getppid()
    try:
        factory = sampler_factory or NvmlSampler
        sampler = factory(job_gpu_ids(env))
    except Exception:
        sampler = None  # no NVML / no GPU: never harm the job
    stopping = {"flag": False}

    def on_term(signum, _frame):
        stopping["flag"] = True
        if proc is not None:
            try:
                proc.send_signal(signum)
            except Exception:
                pass
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, on_term)
        except ValueError:
            pass
    if sampler is None:
        return proc.wait() if proc is not None else 0
    start = time.time()
    alive = (lambda: proc.poll() is None) if proc is not None else None
    summary = monitor(sampler, pid, interval=interval, alive=alive,
                      stop=lambda: stopping["flag"])
    try:
        sampler.close()
    except Exception:
        pass
    rc = proc.wait() if proc is not None else 0
    job = job_id or env.get("SLURM_JOB_ID")
    r = summary.result()
    if job and r["samples"]:
        from .ledger import record_usage_safely

        record_usage_safely(url=url, job_id=int(job), source="probe",
                            cluster=cluster or env.get("SLURM_CLUSTER_NAME", ""),
                            util_mean=r["util_mean"], util_max=r["util_max"],
                            mem_peak_mib=r["mem_peak_mib"], elapsed_s=int(time.time() - start),
                            node=env.get("SLURMD_NODENAME"),
                            gpu_index=getattr(sampler, "index", None),
                            shards=int(env["SLURM_SHARDS_ON_NODE"])
                            if env.get("SLURM_SHARDS_ON_NODE", "").isdigit() else None)
    return rc
