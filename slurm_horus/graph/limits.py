"""Bounds on analysing a graph a user names.

ONNX's shape inference materialises the values it propagates, so a 200-byte graph
(``Range(0, 3e8)``) or a huge ``--dim`` can ask for tens of GB, and a pathological graph can
take minutes.  hsubmit must still submit the job and ``horus-admin sync`` must go on, so the
analysis runs under an address-space limit (its growth over what the process already maps) and
a timer; both are restored on exit.  The timer needs the main thread (it is a signal); off it,
only the memory is bounded.
"""

from __future__ import annotations

import resource
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from slurm_horus.errors import ModelError

__all__ = ["ANALYSIS_FILE_FACTOR", "ANALYSIS_MEM_MIB", "ANALYSIS_TIMEOUT_S", "analysis_limits"]

# growth allowed: this much, plus a few times the file (parsed, then copied by inference); real
# graphs need tens of MB beyond their own size
ANALYSIS_MEM_MIB = 1024
ANALYSIS_FILE_FACTOR = 3
ANALYSIS_TIMEOUT_S = 60.0


class _Timeout(BaseException):
    """Raised by the timer; a BaseException so that no ``except Exception`` on the way swallows it."""


def _mapped_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@contextmanager
def analysis_limits(what: str, mem_mib: int = ANALYSIS_MEM_MIB,
                    timeout_s: float = ANALYSIS_TIMEOUT_S) -> Iterator[None]:
    """Run the body with at most ``mem_mib`` more address space and ``timeout_s`` seconds;
    running out of either raises ModelError naming ``what``.  The timer is checked between
    Python steps: one call into ONNX's C++ shape inference runs to its end first.  Import the
    libraries the body needs before (their import maps memory too)."""
    old_limit = resource.getrlimit(resource.RLIMIT_AS)
    timed = timeout_s > 0 and threading.current_thread() is threading.main_thread()
    active = [True]  # a timer firing after the body is done raises nothing
    old_handler, old_timer, t0 = None, (0.0, 0.0), time.monotonic()
    try:
        mapped = _mapped_bytes()
        if mapped is not None:
            want = mapped + mem_mib * 1024 * 1024
            soft, hard = old_limit
            if hard != resource.RLIM_INFINITY:
                want = min(want, hard)
            if soft == resource.RLIM_INFINITY or want < soft:
                resource.setrlimit(resource.RLIMIT_AS, (want, hard))
        if timed:
            def on_alarm(signum, frame):
                if active[0]:
                    raise _Timeout()
            old_handler = signal.signal(signal.SIGALRM, on_alarm)
            old_timer = signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            yield
        finally:
            active[0] = False
    except MemoryError:
        raise ModelError(f"{what}: analysing the graph needs more than {mem_mib} MiB of memory "
                         "(a dimension too large, or an op that builds huge values)") from None
    except _Timeout:
        raise ModelError(f"{what}: analysing the graph took more than {timeout_s:g} s") from None
    finally:
        if old_handler is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
            if old_timer[0] > 0:  # a caller's timer: what was left of it, less our time
                left = old_timer[0] - (time.monotonic() - t0)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), old_timer[1])
        resource.setrlimit(resource.RLIMIT_AS, old_limit)
