"""Work done in a forked child under a timeout, its bytes back through a pipe: what may hang in
the kernel (a read on a hung NFS mount) or in native code (ONNX's shape inference) cannot stall
its caller, a loop run as root or hsubmit.

A child killed past its time is never waited for: one stuck in the kernel (D state, a hard
mount whose server is away) is not reaped even after SIGKILL, and a waitpid without WNOHANG on
it had hung the caller as surely as the read itself.  It is kept in _killed and reaped, without
waiting, when the next child starts."""

from __future__ import annotations

import fcntl
import math
import os
import select
import signal
import time
from typing import Callable, Iterable

_killed: set[int] = set()  # killed children not reaped yet


def run_in_child(produce: Callable[[], bytes | None], timeout_s: float, keep_fds: Iterable[int] | None = None,
                 max_bytes: int | None = None) -> tuple[bytes, int | None]:
    """``produce()`` in a forked child: (the bytes it returned, b"" for None; the child's wait
    status, None where an ignored SIGCHLD had it reaped already).  TimeoutError where the child
    has not closed its pipe in ``timeout_s``; past ``max_bytes`` reading stops, the bytes returned
    are longer than ``max_bytes`` and the status None: in both cases, and on any exception here,
    the child is killed.  OSError (the pipe closed) where fork fails.  With ``keep_fds`` the
    child closes every fd but those and its pipe before ``produce`` runs.  The child leaves only
    by os._exit: no cleanup or buffered output of the caller's runs twice."""
    _reap_killed()
    r, w = _pipe()
    try:
        pid = os.fork()
    except OSError:  # EAGAIN at a pids limit, ENOMEM: the pipe had leaked, each pass of a loop
        os.close(r)
        os.close(w)
        raise
    if pid == 0:
        try:
            os.close(r)
            if keep_fds is not None:
                close_fds_except({*keep_fds, w})
            data = produce()
            view = memoryview(data or b"")
            while view:
                view = view[os.write(w, view):]
        finally:
            os._exit(0)
    os.close(w)
    data, done = bytearray(), False
    try:
        poller = select.poll()  # not select(): a caller may hold fds past 1024
        poller.register(r, select.POLLIN)
        deadline = time.monotonic() + timeout_s
        while not done and (max_bytes is None or len(data) <= max_bytes):
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(math.ceil(left * 1000)):
                raise TimeoutError
            chunk = os.read(r, 1 << 20)
            data += chunk
            done = not chunk
    finally:
        os.close(r)
        if not done:
            _kill(pid)
    # the pipe closed: the child has exited (or been killed) and released its files, so its
    # status follows at once
    return bytes(data), _reap(pid) if done else None


def _pipe() -> tuple[int, int]:
    """os.pipe() with both ends past 0, 1 and 2: a caller started with those closed got them as
    its pipe, and a child's stderr (run_bounded's dup2 of /dev/null onto 2) had closed its
    result pipe early, every analysis failing ("exit status 0") and its timeout lost."""
    fds = list(os.pipe())
    try:
        for i, fd in enumerate(fds):
            if fd < 3:
                fds[i] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
                os.close(fd)
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], fds[1]


def _kill(pid: int) -> None:
    """SIGKILL, and the child kept for a later reap (not where SIGCHLD is ignored: the kernel
    reaps it, and its pid may come back as another child's)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # reaped already (SIGCHLD ignored)
        return
    if signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN:
        _killed.add(pid)


def _reap_killed() -> None:
    """Reap the killed children the kernel has let go; never wait for one."""
    for pid in list(_killed):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue  # still in the kernel
        except ChildProcessError:
            pass
        _killed.discard(pid)


def _reap(pid: int) -> int | None:
    """The exit status of a child that has closed its pipe; None where an ignored SIGCHLD
    reaped it already (waitpid itself retries when a signal interrupts it)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None


def close_fds_except(keep: set[int]) -> None:
    """Close every fd below the fd limit but ``keep``'s (an empty range is skipped:
    os.closerange(0, 0) asks close_range(2) for 0..UINT_MAX, every fd)."""
    lo = 0
    for hi in [*sorted(keep), os.sysconf("SC_OPEN_MAX")]:
        if lo < hi:
            os.closerange(lo, hi)
        lo = max(lo, hi + 1)
