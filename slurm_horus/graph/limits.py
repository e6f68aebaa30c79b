"""Bounds on analysing a graph a user names.

ONNX's shape inference materialises the values it propagates, so a 200-byte graph
(``Range(0, 3e8)``) or a huge ``--dim`` can ask for tens of GB, and a pathological graph can
take minutes.  hsubmit must still submit the job and ``horus-admin sync`` must go on, so the
analysis runs in a child process (run_bounded) under an address-space limit (its growth over
what the process already maps) and a timer (analysis_limits), and the child is killed when it
outlives the timer: one call into ONNX's C++ runs on past a Python timer, and native code that
meets the address-space limit may abort the whole process (glibc's thread-local storage does),
which had taken hsubmit, and the user's job, with it.

``horus-admin sync`` runs as root and analyses graphs users name: under ``confined`` the child
keeps only the fds it needs and, before it parses a byte, takes the job's user's ids.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import resource
import signal
import threading
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Iterator, TypeVar

from slurm_horus.errors import HorusError, ModelError
from slurm_horus.proc_child import run_in_child

__all__ = ["ANALYSIS_FILE_FACTOR", "ANALYSIS_MEM_MIB", "ANALYSIS_TIMEOUT_S", "analysis_limits",
           "confined", "run_bounded"]

T = TypeVar("T")

# growth allowed: this much, plus a few times the file (parsed, then copied by inference); real
# graphs need tens of MB beyond their own size
ANALYSIS_MEM_MIB = 1024
ANALYSIS_FILE_FACTOR = 3
ANALYSIS_TIMEOUT_S = 60.0
# the child's own timer reports first; past it by this much the child is killed
KILL_GRACE_S = 5.0
# what the caller reads of the child's answer: GPT-2 XL's 10,096 nodes are 2.2 MB; a graph of
# 50 kB names had the caller decode 100 MB into 909 MB of objects, outside the child's limits
MAX_RESULT_BYTES = 64 << 20
# set by confined(): (fds the child keeps, uid, gid, groups) or None
_CONFINEMENT: ContextVar[tuple | None] = ContextVar("horus_analysis_confinement", default=None)


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


@contextmanager
def confined(keep_fds: Iterable[int], uid: int | None = None, gid: int | None = None,
             groups: Iterable[int] = ()) -> Iterator[None]:
    """run_bounded's children started in the body close every fd but the standard ones, their
    result pipe and ``keep_fds`` (the sync's ledger connection, spool ... are no graph parser's
    business) and, where we are root and ``uid`` is given, take ``uid``, ``gid`` and ``groups``
    before ``fn`` runs: ONNX's parser meets a user's bytes with that user's rights alone.  A kept
    fd reads as before; reopening it as /proc/self/fd/N (what load_graph does) checks the file's
    mode against those ids, so the caller opens it as them (claims.open_as_owner)."""
    token = _CONFINEMENT.set((frozenset(keep_fds), uid, gid, tuple(groups)))
    try:
        yield
    finally:
        _CONFINEMENT.reset(token)


def run_bounded(what: str, fn: Callable[[], T], encode: Callable[[T], Any], decode: Callable[[Any], T],
                mem_mib: int = ANALYSIS_MEM_MIB, timeout_s: float = ANALYSIS_TIMEOUT_S) -> T:
    """``fn()`` in a forked child (proc_child.run_in_child) under analysis_limits(what, mem_mib,
    timeout_s), its result crossing back as JSON (``encode`` there, ``decode`` here: never
    pickle).  A HorusError of fn's is raised here as itself (a ModelError or a HorusError, its
    message); the child's crash, abort, hang past the timer or any other error is a ModelError.
    Import what fn needs before: the child then starts warm, and imports map memory outside the
    limit."""
    confinement = _CONFINEMENT.get()

    def produce() -> bytes:
        try:
            _child_setup(confinement)
            with analysis_limits(what, mem_mib, timeout_s):
                return _dumps({"ok": encode(fn())})
        except HorusError as e:
            return _dumps({"error": _text(e), "model": isinstance(e, ModelError)})
        except BaseException as e:  # noqa: BLE001 - a bug's or a library's error: one line
            return _dumps({"error": f"{what}: the analysis failed ({type(e).__name__}: {_text(e)[:200]})",
                           "model": True})
    try:
        data, status = run_in_child(produce, timeout_s + KILL_GRACE_S,
                                    keep_fds={0, 1, 2, *confinement[0]} if confinement else None,
                                    max_bytes=MAX_RESULT_BYTES)
    except TimeoutError:  # (an OSError: before it)
        raise ModelError(f"{what}: analysing the graph took more than {timeout_s:g} s") from None
    except OSError as e:
        raise ModelError(f"{what}: cannot start the analysis ({e.strerror or e})") from None
    if len(data) > MAX_RESULT_BYTES:
        raise ModelError(f"{what}: the analysis's result is larger than {MAX_RESULT_BYTES >> 20} MiB "
                         "(names or nodes no real model has); not analysed")
    try:
        out = json.loads(data) if data else None
    except ValueError:
        out = None
    if not isinstance(out, dict):
        raise ModelError(f"{what}: analysing the graph failed ({_how(status)}); it may need more "
                         f"than {mem_mib} MiB of memory")
    if "ok" in out:
        return decode(out["ok"])
    raise (ModelError if out.get("model", True) else HorusError)(str(out.get("error")))


def _child_setup(confinement: tuple | None) -> None:
    """The child confined (see confined(): run_in_child has closed the fds it does not keep; a
    failure is the analysis's, never an analysis as root), dies with its parent (a killed
    hsubmit leaves no analysis running), writes no core file (one per crafted graph, per sync),
    and keeps native libraries' own messages (an abort's) off the caller's terminal unless
    HORUS_DEBUG: the caller says what failed, in one line."""
    if confinement is not None:
        _, uid, gid, groups = confinement
        if uid is not None and os.geteuid() == 0:
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)  # real, effective and saved: no way back
    try:  # after the ids change, which clears the parent-death signal
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not os.environ.get("HORUS_DEBUG"):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        faulthandler.disable()


def _dumps(value) -> bytes:
    return json.dumps(value, default=_plain).encode()


def _plain(value):
    """JSON for numpy scalars (their Python value) and bytes (protobuf's non-UTF-8 strings)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - an error whose message itself fails
        return type(e).__name__


def _how(status: int | None) -> str:
    if status is None:
        return "no result"
    if os.WIFSIGNALED(status):
        n = os.WTERMSIG(status)
        try:
            return f"signal {signal.Signals(n).name}"
        except ValueError:  # a real-time signal
            return f"signal {n}"
    return f"exit status {os.WEXITSTATUS(status)}"
