"""Review 10: one fork-a-child-with-a-timeout (proc_child.run_in_child) for the graph analysis
and the queue's error-file read; the analysis had waited on a child it killed."""

import os
import signal
import time

import pytest

from slurm_horus.errors import ModelError
from slurm_horus.graph import limits
from slurm_horus.ledger import requeue


class _InTheKernel:
    """The children forked while it is on, once killed, as a child stuck in the kernel (D state:
    a read on a hard NFS mount whose server is away) is to waitpid: WNOHANG says it is still
    there, and a waitpid without it never returns; here it raises instead, so that a caller
    that would hang fails.  Making a real process unkillable needs root and a hung mount; what
    the caller can see of one is exactly this.  ``release()``: the kernel lets them go."""

    def __init__(self, monkeypatch):
        self.pids, self.held = [], True
        self._fork, self._waitpid = os.fork, os.waitpid
        monkeypatch.setattr(os, "fork", self.fork)
        monkeypatch.setattr(os, "waitpid", self.waitpid)

    def fork(self):
        pid = self._fork()
        if pid:
            self.pids.append(pid)
        return pid

    def waitpid(self, pid, flags):
        if self.held and pid in self.pids:
            if not flags & os.WNOHANG:
                raise AssertionError(f"waited on child {pid}, killed but held by the kernel: the caller hangs here")
            return 0, 0
        return self._waitpid(pid, flags)

    def release(self):
        for pid in self.pids:  # dead (not reaped): a killed child's teardown takes a moment
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        self.held = False

    @staticmethod
    def reaped(pid):
        """No child ``pid`` is left to wait for (asked without reaping it: WNOWAIT)."""
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return False
        except ChildProcessError:
            return True

    def cleanup(self):
        self.held = False
        for pid in self.pids:
            if not self.reaped(pid):
                os.kill(pid, signal.SIGKILL)
                self._waitpid(pid, 0)


@pytest.fixture
def in_the_kernel(monkeypatch):
    k = _InTheKernel(monkeypatch)
    yield k
    k.cleanup()


def _same(x):
    return x


def _stuck():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # past its own timer too
    time.sleep(60)


def test_an_analysis_killed_in_the_kernel_does_not_hang_its_caller(monkeypatch, in_the_kernel):
    """run_bounded killed a child past its time, then waited for it without WNOHANG: a child
    stuck in the kernel outlives SIGKILL, and hsubmit (or sync, as root) hung on it.  The child
    is now left to a later reap, which takes it once the kernel lets it go."""
    monkeypatch.setattr(limits, "KILL_GRACE_S", 0.1)
    with pytest.raises(ModelError, match="took more than 0.2 s"):
        limits.run_bounded("m.onnx", _stuck, _same, _same, timeout_s=0.2)
    (pid,) = in_the_kernel.pids
    assert not in_the_kernel.reaped(pid)  # killed, not waited for
    in_the_kernel.release()
    assert limits.run_bounded("m.onnx", lambda: 7, _same, _same) == 7
    assert in_the_kernel.reaped(pid)  # by that next start, not left a zombie


def test_the_queue_read_and_the_analysis_share_one_reaper(monkeypatch, tmp_path, in_the_kernel):
    """The error-file read's child killed on a hung mount is reaped by the next child started,
    an analysis's as well as a read's: one set of killed children, one reaper."""
    monkeypatch.setattr(requeue, "ERROR_READ_TIMEOUT_S", 0.2)
    monkeypatch.setattr(requeue, "open_as_owner", lambda path, uid, gids: time.sleep(60))
    err = tmp_path / "err"
    err.write_text("CUDA out of memory\n")
    rec = {"UserId": "root(0)", "StdErr": str(err), "_start": err.stat().st_mtime - 60}
    with pytest.raises(requeue.ErrorFileHung):
        requeue.read_error_tail(rec)
    (pid,) = in_the_kernel.pids
    assert not in_the_kernel.reaped(pid)
    in_the_kernel.release()
    assert limits.run_bounded("m.onnx", lambda: 7, _same, _same) == 7
    assert in_the_kernel.reaped(pid)


def test_an_analysis_by_a_caller_started_without_stdout_and_stderr_gets_its_result():
    """hsubmit started with fds 1 and 2 closed (``>&- 2>&-``, a daemon's child) had its result
    pipe on them: the child's dup2 of /dev/null onto 2 closed the pipe, and every analysis
    failed ("exit status 0"), its timeout lost while the parent waited for the child."""
    import subprocess
    import sys

    script = (
        "import os\n"
        "from slurm_horus.graph import limits\n"
        "out = os.fdopen(os.dup(1), 'w')\n"
        "os.close(1)\n"
        "os.close(2)\n"
        "try:\n"
        "    out.write(repr(limits.run_bounded('m.onnx', lambda: 7, int, int)))\n"
        "except Exception as e:\n"
        "    out.write(str(e))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.stdout == "7"
