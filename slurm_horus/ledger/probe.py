"""horus-probe: sample the GPU use of a job's own processes and record a summary in the ledger.

Measured use must be something users cannot forge, so only a probe running as **root** records:
slurmd's Prolog/Epilog run it (``prolog``: the detached per-job probe); ``horus-probe [--pid PID
| -- CMD]`` (``run_probe`` here) is the older in-job form and records only when run as root.

The loops talk to a sampler with one method, ``sample(pids) -> (util_pct | None, mem_mib)``:
``nvml.NvmlSampler`` (the default; without NVML or a GPU nothing is recorded, quietly) or
``FakeSampler`` (``HORUS_PROBE_SAMPLER=fake:DIR``), which exists for the local test cluster only:
a test job writes what it "used" in ``DIR/<jobid>.json``; it is never chosen unless that
variable is set in the Prolog's environment.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

from slurm_horus.ledger import record_usage_safely
from slurm_horus.ledger.nvml import NvmlSampler, Summary


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
                line = f.read()
            ppid = int(line[line.rindex(b")") + 2:].split()[1])
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


def numeric_job_id(value) -> str | None:
    """``value`` as a job id: Slurm's, ASCII digits (spaces about them dropped), else None.
    (``str.isdigit`` alone takes '²', which ``int`` refuses.)"""
    text = str(value or "").strip()
    return text if text.isascii() and text.isdigit() else None


def job_gpu_ids(env: dict | None = None) -> list[str]:
    """The job's GPUs as NVML can find them: physical indices (SLURM_JOB_GPUS) or UUIDs/indices
    from CUDA_VISIBLE_DEVICES."""
    env = os.environ if env is None else env
    for var in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        v = env.get(var)
        if v and v.strip() not in ("", "NoDevFiles"):
            return [x.strip() for x in v.split(",") if x.strip()]
    return []


class FakeSampler:
    """TESTS ONLY (the local cluster's Prolog sets HORUS_PROBE_SAMPLER=fake:DIR): what a test job
    says it used, read from ``DIR/<jobid>.json`` = ``{"util_pct": 42, "mem_mib": 3000}`` at each
    sample. No file yet: no sample (LookupError). Read without following links, at most 4 KiB,
    regular files only (the folder is world-writable and the reader is root)."""

    needs_pids = False

    def __init__(self, directory: str, job_id, gpu_ids=()):
        self.path = os.path.join(directory, f"{int(job_id)}.json")
        ids = [g for g in gpu_ids if str(g).isdigit()]
        self.index = int(ids[0]) if len(ids) == 1 else None

    def sample(self, pids) -> tuple[float | None, float]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise LookupError(f"no {self.path}") from e
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LookupError(f"{self.path}: not a regular file")
            data = json.loads(os.read(fd, 4096) or b"{}")
        finally:
            os.close(fd)
        util = data.get("util_pct")
        util = None if util is None else min(max(float(util), 0.0), 100.0)
        return util, max(float(data.get("mem_mib") or 0.0), 0.0)

    def close(self):
        pass


def sampler_factory_from_env(env: dict, job_id=None):
    """The sampler class (called with the job's GPU ids) that HORUS_PROBE_SAMPLER names: unset or
    ``nvml``: NvmlSampler (the default); ``fake:DIR``: FakeSampler (tests only)."""
    spec = (env.get("HORUS_PROBE_SAMPLER") or "").strip()
    if spec in ("", "nvml"):
        return NvmlSampler
    if spec.startswith("fake:") and spec[5:]:
        directory = spec[5:]
        return lambda gpu_ids: FakeSampler(directory, job_id, gpu_ids)
    raise ValueError(f"HORUS_PROBE_SAMPLER={spec!r}: expected nvml or fake:DIR")


def monitor(sampler, root_pid: int, interval: float = 5.0, alive=None, max_samples=None,
            sleep=time.sleep, stop=None) -> Summary:
    """Sample until root_pid exits (or stop() is true). Returns the summary."""
    s = Summary()
    alive = alive or (lambda: pid_alive(root_pid))
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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def exit_status(rc: int) -> int:
    """A child's status as a shell gives it: 128+N where signal N ended it (Popen's -N had
    been exit status 256-N)."""
    return 128 - rc if rc < 0 else rc


# what Python sets LC_CTYPE to at start where the locale is C or POSIX (PEP 538)
_COERCED_LOCALES = ("C.UTF-8", "C.utf8", "UTF-8")


def command_environ() -> dict:
    """The environment for CMD: the probe's, less the LC_CTYPE that Python's start set (PEP
    538: LANG=C or no locale at all gives LC_CTYPE=C.UTF-8), which CMD would not have had
    without the probe (`wc -m` counts characters, not bytes). The value at start comes from
    /proc/self/environ, which setenv leaves as exec gave it."""
    env = dict(os.environ)
    if env.get("LC_CTYPE") not in _COERCED_LOCALES:
        return env
    try:
        with open("/proc/self/environ", "rb") as f:
            start = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return env
    was = start.get(b"LC_CTYPE")
    if was is None:
        del env["LC_CTYPE"]
    else:
        env["LC_CTYPE"] = os.fsdecode(was)
    return env


def run_unmeasured(command: list[str]) -> int:
    """CMD in the probe's place (exec), for a probe that may not record: every signal (a
    terminal's Ctrl-C or hangup, scancel's, --signal=USR1@60's), the exit status and the pid
    are then CMD's own, as without the probe. A probe waiting on CMD had to choose which
    signals to pass on, and died of those it had no handler for (SIGHUP, SIGUSR1), ending an
    srun step. Returns only where CMD cannot be started: 127, or 126 where it is found but
    cannot be run, as a shell says."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None where the caller closed it (`>&-`): CMD had never run
            stream.flush()
    # Python ignores these for itself; CMD gets the defaults, as a shell's child (and Popen's) does
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(command[0], command, command_environ())
    except OSError as e:
        if sys.stderr is not None:
            sys.stderr.write(f"horus-probe: {command[0]}: {e.strerror or e}\n")
        return 127 if isinstance(e, FileNotFoundError) else 126


def _install(handlers: dict, keep_ignored=None) -> dict:
    """Install ``handlers``; the handlers they replace. A signal ignored on entry stays ignored
    where CMD inherits it (``keep_ignored``: those signals; default all), as a shell leaves it:
    sh starts a script's background job (`horus-probe -- CMD &`) with SIGINT and SIGQUIT
    ignored, and a handler of ours had made exec give CMD the default, which a Ctrl-C of the
    script kills (SIGQUIT: with a core dump); nohup ignores SIGHUP."""
    keep = handlers if keep_ignored is None else keep_ignored
    old = {}
    for sig, handler in handlers.items():
        try:
            if not (sig in keep and signal.getsignal(sig) == signal.SIG_IGN):
                old[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    return old


def _signal_handlers(with_command: bool, env: dict, stopping: dict, child) -> dict:
    """The probe's handlers: none of these signals kills it, for a dead probe records nothing
    (and under srun its death ends the step). Watching a --pid: SIGTERM, SIGINT and SIGHUP end
    the sampling (the summary is then recorded); SIGUSR1 and SIGUSR2 are not the probe's.
    Running CMD: a signal is forwarded only where CMD did not get it too, for a second one
    (Python's second SIGINT) kills CMD in the middle of its handler. SIGINT and SIGQUIT of a
    terminal reach its whole foreground process group, CMD's too, and srun's reach every
    process of the step (slurmstepd signals its whole container): both are CMD's to answer,
    and sampling goes on while CMD runs. SIGHUP ends the sampling and is never forwarded: a
    hangup reaches CMD's process group itself (the shell's SIGHUP to each of its jobs, the
    kernel's to the foreground group), as slurmstepd's reaches the step. SIGTERM ends the
    sampling; slurmstepd (scancel, a time limit, preemption) sends it, and SIGUSR1/SIGUSR2
    (--signal=USR1@60, scancel --signal), to every process of the step, so they are forwarded
    only outside one (no SLURMD_NODENAME, which slurmstepd gives every task and batch
    script): there a `kill` of the probe reaches it alone. SIGUSR1/SIGUSR2 leave sampling on."""
    def stop(_signum, _frame):
        stopping["flag"] = True

    def ignore(_signum, _frame):
        pass

    if not with_command:
        return {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: stop,
                signal.SIGUSR1: ignore, signal.SIGUSR2: ignore}

    def forward(signum, _frame):
        proc = child("proc")
        if proc is None:  # CMD not started yet: _probe sends it once started, or it had never
            child("pending").append(signum)  # known of a SIGTERM that ended the sampling
        else:
            try:
                proc.send_signal(signum)
            except Exception:
                pass

    def stop_and_forward(signum, frame):
        stop(signum, frame)
        forward(signum, frame)

    in_step = bool(env.get("SLURMD_NODENAME"))
    return {signal.SIGTERM: stop if in_step else stop_and_forward, signal.SIGHUP: stop,
            signal.SIGUSR1: ignore if in_step else forward,
            signal.SIGUSR2: ignore if in_step else forward,
            signal.SIGINT: ignore, signal.SIGQUIT: ignore}


def run_probe(*, pid: int | None = None, command: list[str] | None = None, interval: float = 5.0,
              job_id: str | None = None, cluster: str | None = None, url: str | None = None,
              sampler_factory=None, env: dict | None = None) -> int:
    """The whole probe. Returns the exit code: the command's (exit_status; 127 when it cannot
    be started, as a shell says), else 0. Never raises. A job id that is not a number is no job: nothing is
    recorded (its record had raised after the command ran, and its exit code was lost)."""
    env = dict(os.environ if env is None else env)
    job = numeric_job_id(job_id or env.get("SLURM_JOB_ID"))
    stopping = {"flag": False}
    child: dict = {"pending": []}
    # before CMD starts, so that no signal finds the probe without its handlers (exec gives
    # CMD the default ones); put back at the end, for a caller that goes on (tests)
    handlers = _signal_handlers(bool(command), env, stopping, child.get)
    # watching a --pid no CMD inherits them, but one run under nohup goes on after a hangup
    old = _install(handlers, keep_ignored=None if command else {signal.SIGHUP})
    try:
        return _probe(pid, command, interval, job, cluster, url, sampler_factory, env, stopping, child)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _probe(pid, command, interval, job, cluster, url, sampler_factory, env, stopping, child) -> int:
    """run_probe's work, under its signal handlers: CMD started goes in child["proc"], and
    gets the signals forwarded before (child["pending"])."""
    proc = None
    if command:
        try:
            proc = child["proc"] = subprocess.Popen(command, env=command_environ(), close_fds=False)
        except OSError as e:
            sys.stderr.write(f"horus-probe: {command[0]}: {e.strerror or e}\n")
            return 127
        for sig in child["pending"]:
            proc.send_signal(sig)
        pid = proc.pid
    pid = pid or os.getppid()
    try:
        factory = sampler_factory or sampler_factory_from_env(env, job)
        sampler = factory(job_gpu_ids(env))
    except Exception:
        sampler = None  # no NVML / no GPU: never harm the job
    if sampler is None:
        return exit_status(proc.wait()) if proc is not None else 0
    start = time.time()
    alive = (lambda: proc.poll() is None) if proc is not None else None
    summary = monitor(sampler, pid, interval=interval, alive=alive,
                      stop=lambda: stopping["flag"])
    try:
        sampler.close()
    except Exception:
        pass
    rc = exit_status(proc.wait()) if proc is not None else 0
    r = summary.result()
    if job and r["samples"]:
        record_usage_safely(url=url, job_id=int(job), source="probe",
                            cluster=cluster or env.get("SLURM_CLUSTER_NAME", ""),
                            util_mean=r["util_mean"], util_max=r["util_max"],
                            mem_peak_mib=r["mem_peak_mib"], elapsed_s=int(time.time() - start),
                            node=env.get("SLURMD_NODENAME"),
                            gpu_index=getattr(sampler, "index", None),
                            shards=int(env["SLURM_SHARDS_ON_NODE"])
                            if env.get("SLURM_SHARDS_ON_NODE", "").isdigit() else None,
                            start_time=int(start), end_time=int(time.time()))  # which run
    return rc
