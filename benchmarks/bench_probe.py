"""CPU cost of horus-probe's sampling loop (target: under 1 % of one CPU).

    python benchmarks/bench_probe.py [--seconds 30] [--interval 5]

Runs the probe's real loop (`probe.monitor`: a /proc scan for the job's process tree every
interval) over a live process tree, for a fixed wall time, and reports the CPU time it used.
This machine has no GPU, so the NVML query itself is replaced by a sampler that returns a
constant; on a GPU node each sample adds two NVML calls (microseconds to a millisecond).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_horus.ledger.probe import monitor  # noqa: E402


class ConstantSampler:
    def sample(self, pids):
        return 50.0, 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    job = subprocess.Popen(["bash", "-c", "sleep 600 & sleep 600 & wait"])
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        summary = monitor(ConstantSampler(), job.pid, interval=args.interval,
                          stop=lambda: time.monotonic() - start > args.seconds)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        job.kill()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    procs = len(os.listdir("/proc"))
    print(f"{summary.samples} samples in {wall:.1f} s over a {procs}-entry /proc: "
          f"{cpu * 1e3:.1f} ms CPU = {100 * cpu / wall:.3f} % of one CPU "
          f"(interval {args.interval} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
