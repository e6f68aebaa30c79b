"""calibrate's Sampler: the ledger's NVML sampler, read on a background thread while the model
steps in this process.

The figures (SM utilization, memory held) are the one ``NvmlSampler`` of slurm_horus/ledger/nvml.py
and its ``Summary``, so calibrate and horus-probe measure the same thing. Where NVML cannot see
this process (a container with its own PID namespace) each sample falls back to the whole
device's utilization and used memory, and ``util_source`` says so; that is why calibrate should
have its GPU to itself: a run during which NVML saw another process computing on it (beside
this one; any second one where this one is invisible) says ``util_source`` "shared", and gives
no row.
"""

from __future__ import annotations

import os
import threading

from slurm_horus.errors import HorusError
from slurm_horus.ledger.nvml import NvmlSampler, Summary

STOP_WAIT_S = 30.0


class BackgroundSampler:
    """start() begins sampling every `interval` s on a thread; stop() returns the summary."""

    def __init__(self, nvml: NvmlSampler, interval: float = 0.2, pid: int | None = None):
        self.nvml, self.interval, self.pid = nvml, interval, pid or os.getpid()
        self._thread = None
        self._stop = threading.Event()
        self.summary, self.source = Summary(), "process"

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                util, mem = self.nvml.sample({self.pid})
                others = self.nvml.processes() - {self.pid}
                if not mem:  # this PID is invisible to NVML: use the device's figures
                    util, mem = self.nvml.device_use()
                    self.source = "device" if self.source != "shared" else "shared"
                    others = others if len(others) > 1 else set()  # the one may be this process
                if others:
                    self.source = "shared"
                self.summary.add(util, mem)
            except Exception:
                pass  # one failed read is one sample fewer; no samples at all is reported
            self._stop.wait(self.interval)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():  # one stuck in NVML before
            raise HorusError("NVML stopped answering in an earlier run")
        self.summary, self.source = Summary(), "process"
        self.nvml.from_now()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join(STOP_WAIT_S)
            if self._thread.is_alive():  # an NVML call that never returns: no figures, no hang
                raise HorusError(f"NVML stopped answering (the sampler did not stop within {STOP_WAIT_S:g} s)")
        return {**self.summary.result(), "util_source": self.source}

    def close(self) -> None:
        self.nvml.close()
