"""The one place that talks to NVML (nvidia-ml-py, the ``[probe]`` extra): a job's
(or a process's) GPU use, per process, and the summary of a run of samples.

horus-probe's loops and calibrate's background sampler both call ``NvmlSampler.sample(pids)``
and add the result to a ``Summary``, so the ledger's measurements and calibration's rows are the
same quantity: SM utilization from nvmlDeviceGetProcessUtilization and memory from
nvmlDeviceGetComputeRunningProcesses, summed over the given processes on the sampler's GPUs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

MAX_SAMPLE_PERIOD_US = 1_000_000  # NVML samples every 1/6 s to 1 s, by product


class NvmlSampler:
    """Per-process use on the GPUs ``gpu_ids`` (physical indices or UUIDs; empty: every GPU).
    Raises ImportError (no nvidia-ml-py) or an NVMLError (no driver, no such GPU) from __init__.
    ``index`` is the GPU's index when it samples exactly one GPU, else None."""

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
        # per GPU: the job's utilization in the newest sample period and when NVML took it (a
        # call within the period after it finds no newer sample, NOT_FOUND, though the job
        # still runs; None: no sample yet since sampling began then), and the shortest gap
        # seen between samples: that GPU's period
        self.period = {id(h): MAX_SAMPLE_PERIOD_US for h in self.handles}
        self.from_now(keep_ts=True)
        self.index = None
        if len(self.handles) == 1:
            try:
                self.index = int(pynvml.nvmlDeviceGetIndex(self.handles[0]))
            except Exception:
                self.index = int(ids[0]) if ids[0].isdigit() else None

    def sample(self, pids: set[int]) -> tuple[float | None, float]:
        """(SM utilization % of ``pids`` since the last call, or None where NVML has no samples;
        the MiB they hold now), summed over the GPUs."""
        n = self.nvml
        util = None
        mem = 0.0
        for h in self.handles:
            try:
                running = [p for p in n.nvmlDeviceGetComputeRunningProcesses(h) if p.pid in pids]
            except n.NVMLError:
                running = []
            mem += sum(p.usedGpuMemory / 2 ** 20 for p in running if p.usedGpuMemory)
            k = id(h)
            try:
                samples = n.nvmlDeviceGetProcessUtilization(h, self.last_ts[k])
                mine = 0.0
                for s in samples:
                    self.last_ts[k] = max(self.last_ts[k], int(s.timeStamp))
                    if s.pid in pids:
                        mine += float(s.smUtil)
                before, at = self.held[k]
                if before is not None and self.last_ts[k] > at:
                    self.period[k] = min(self.period[k], self.last_ts[k] - at)
                self.held[k] = (mine, self.last_ts[k])
                util = (util or 0.0) + mine
            except n.NVMLError as e:
                # NOT_FOUND: no process computed on the GPU since the newest sample.  Within a
                # sample period of it NVML has taken no newer one: the job's use is still that
                # sample's (a job busy throughout read 20 % when polled 5 times a period).  Past
                # it, the job's processes holding the GPU were idle: 0 %, as beside a busy
                # neighbour (a job alone and idle read 80 % for 8 %).  Else (not supported, no
                # process of the job here): unknown
                if running and getattr(e, "value", None) == getattr(n, "NVML_ERROR_NOT_FOUND", 6):
                    mine, at = self.held[k]
                    if time.time() * 1e6 - at >= self.period[k]:
                        util = util or 0.0
                    elif mine is not None:
                        util = (util or 0.0) + mine
        return (min(util, 100.0 * len(self.handles)) if util is not None else None), mem

    def from_now(self, keep_ts: bool = False) -> None:
        """Utilization only from now on: NVML returns samples newer than this time stamp (unless
        ``keep_ts``), and the first sample period is unknown until its sample comes."""
        now = int(time.time() * 1e6)
        if not keep_ts:
            self.last_ts = {k: now for k in self.last_ts}
        self.held = {k: (None, now) for k in self.last_ts}

    def processes(self) -> set[int]:
        """The pids NVML lists as computing on the sampler's GPUs now (those it can see)."""
        out: set[int] = set()
        for h in self.handles:
            try:
                out.update(p.pid for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(h))
            except self.nvml.NVMLError:
                pass
        return out

    def device_use(self) -> tuple[float, float]:
        """(utilization %, used MiB) of the whole first GPU, every process's: for a caller whose
        processes NVML cannot see (a container with its own PID namespace)."""
        n, h = self.nvml, self.handles[0]
        return (float(n.nvmlDeviceGetUtilizationRates(h).gpu),
                n.nvmlDeviceGetMemoryInfo(h).used / 2 ** 20)

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


@dataclass
class Summary:
    """Samples of one run reduced to what the ledger stores: mean and max utilization (over the
    samples that had one) and peak memory."""

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
