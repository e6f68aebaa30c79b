"""``horus-probe --prolog`` / ``--epilog``: the per-job probe slurmd starts and stops, as root.

``prolog`` (slurmd's ``Prolog``; not the TaskProlog, which runs as the user) reads the job from
``squeue --json`` (its node-local GPU indices and type, ``parse.squeue_json_records`` and
``parse.job_gpus_on_node``; never scontrol's text, in which the job's name and comment can forge
fields), detaches completely (double fork, setsid, every fd closed: slurmd
does not wait) and samples the job's processes (``scontrol listpids``, else the job's cgroup)
until ``epilog`` (slurmd's ``Epilog``) stops it through the pid file in a root-only run folder;
then it writes one usage row (source "probe") with ``ledger.record_usage_safely`` (ledger
timeouts; the root-only spool ``/var/spool/slurm-horus`` or $HORUS_SPOOL as fallback).
Nothing here ever prints or raises: a probe must never harm a job or slurmd.
"""

from __future__ import annotations

import glob
import math
import os
import signal
import stat
import subprocess
import time

from slurm_horus.ledger import record_usage_safely
from slurm_horus.ledger.nvml import Summary
from slurm_horus.ledger.probe import numeric_job_id, sampler_factory_from_env
from slurm_horus.proc import started
from slurm_horus.slurm import parse as sp
from slurm_horus.textfile import NOT_FILE, NOT_FOLDER, NOT_OWNER, untrusted

DEFAULT_RUN_DIR = "/run/slurm-horus"      # pid files of running probes (root, 0700)
DEFAULT_SPOOL = "/var/spool/slurm-horus"  # fallback when the ledger is unreachable (root, 0700)
DEFAULT_INTERVAL = 5.0
DEFAULT_EPILOG_WAIT = 10.0                # seconds the Epilog waits for the probe to record
EPILOG_WAIT_MAX_S = 300.0                 # ... at most: a longer Epilog holds the node
SLURM_TIMEOUT_S = 10.0
JOB_CHECK_EVERY_S = 60.0                  # a probe whose job is gone (Epilog missed) stops itself
UNANSWERED_LIMIT_S = 1800.0               # ... and one that Slurm stops answering about, after this
LIVE_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING", "STOPPED", "RESIZING",
               "SIGNALING", "STAGE_OUT", "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


class ProbeLog:
    """One-line messages to $HORUS_PROBE_LOG (appended; root's file), else nowhere: a detached
    probe has no terminal, and the Prolog/Epilog must print nothing. Only into a regular file of
    root's: a user's FIFO at that name had hung the probe at its first line (never to stop),
    a user's file had been handed every job's lines."""

    def __init__(self, path: str | None, job_id=None, node=None):
        self.path = path or None
        self.tag = f"job {job_id}" + (f" on {node}" if node else "")

    def __call__(self, msg: str) -> None:
        if not self.path:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NONBLOCK, 0o600)
            with os.fdopen(fd, "a") as f:
                st = os.fstat(fd)
                # a second name: a hard link a user made, in a world-writable folder, to a file
                # of root's (/etc/shadow) had been appended every job's lines
                if {NOT_FILE, NOT_OWNER} & set(untrusted(st, (os.geteuid(),), kind="file")) \
                        or st.st_nlink != 1:
                    return
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} horus-probe[{os.getpid()}] "
                        f"{self.tag}: {msg}\n")
        except Exception:
            pass


def _env_job(env: dict) -> tuple[str | None, str | None, str]:
    """(job id, node, cluster) slurmd gave the Prolog/Epilog; a job id that is not a number is
    none (nothing probed, nothing failed)."""
    job = numeric_job_id(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))
    node = (env.get("SLURMD_NODENAME") or "").strip() or None
    return job, node, (env.get("SLURM_CLUSTER_NAME") or "").strip()


def run_dir(env: dict) -> str:
    return env.get("HORUS_PROBE_RUN_DIR") or DEFAULT_RUN_DIR


def pid_file(env: dict, job_id: str, node: str | None) -> str:
    """``<run dir>/<jobid>.<node>.pid`` (two slurmd on one host run two Prologs per job)."""
    return os.path.join(run_dir(env), f"{int(job_id)}.{node or 'local'}.pid")


def _root_folder(path: str) -> str | None:
    """Make ``path`` a folder that only root writes (0700 when created). The reason it is not, or
    None."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    why = untrusted(st, (0,), kind="folder")
    if NOT_FOLDER in why:
        return f"{path}: not a folder"
    return f"{path}: must be owned by root and not group/other-writable" if why else None


def _run(command: str, args: list[str], env: dict, timeout: float = SLURM_TIMEOUT_S):
    """The finished command (None when it could not run or timed out)."""
    try:
        return subprocess.run([command, *args], capture_output=True, text=True, errors="replace",
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None


def _slurm(command: str, args: list[str], env: dict, timeout: float = SLURM_TIMEOUT_S) -> str | None:
    cp = _run(command, args, env, timeout)
    return cp.stdout if cp is not None and cp.returncode == 0 else None


def job_record(job_id: str, env: dict, tries: int = 3) -> dict | None:
    """The job's record from ``squeue --json`` (retried: slurmctld may be busy)."""
    for k in range(tries):
        out = _slurm("squeue", ["--json", "--all", "--states=all", "--jobs", str(job_id)], env)
        try:
            recs = sp.squeue_json_records(out, job_id) if out else []
        except (ValueError, AttributeError, TypeError):
            recs = []
        if recs:
            return recs[0]
        if k + 1 < tries:
            time.sleep(1.0)
    return None


def job_state(job_id: str, env: dict) -> str | None:
    """The job's state, GONE when slurmctld no longer knows it (purged after MinJobAge), or None
    when Slurm does not answer: ``squeue -o "%A %T"`` prints the job id and state (server-side
    filtered, unlike 22.05's JSON), which nothing the user wrote can mimic. ``--jobs`` of an
    array's own id lists every task of the array (a hetjob leader's, every component): the line
    of this job id is the job's (a probe read several lines as no answer, and stopped after
    UNANSWERED_LIMIT_S while its job ran on)."""
    cp = _run("squeue", ["-h", "--states=all", "--jobs", str(job_id), "-o", "%A %T"], env)
    if cp is None:
        return None
    if cp.returncode != 0:
        return "GONE" if "invalid job id" in cp.stderr.lower() else None
    states = [w[1] for w in (line.split() for line in cp.stdout.splitlines())
              if len(w) == 2 and w[0] == str(job_id)]
    return states[0] if len(states) == 1 else None


def placement(job_id: str, node: str | None, env: dict) -> dict | None:
    """{indices, type, shards, gpus} of the job's GPUs on this node (None: none here), the type
    completed from the node's ``Gres=gpu:TYPE:N`` when the node has a single GPU type."""
    rec = job_record(job_id, env)
    if rec is None:
        return None
    place = sp.job_gpus_on_node(rec, node)
    if place and not place["type"] and node:
        out = _slurm("scontrol", ["show", "node", node], env)
        nodes = [n for n in (sp.parse_scontrol_records(out) if out else [])
                 if n.get("NodeName") == node]
        types = sp.gpu_types_of_node(nodes[0]) if nodes else {}
        if len(types) == 1:
            place["type"] = next(iter(types))
    return place


def job_pids(job_id: str, node: str | None, env: dict) -> set[int]:
    """The job's processes on this node: ``scontrol listpids`` (as root), else the job's cgroup."""
    out = _slurm("scontrol", ["listpids", str(job_id)] + ([node] if node else []), env, timeout=5.0)
    pids = set(sp.parse_listpids(out)) if out else set()
    if not pids:
        job = f"job_{int(job_id)}"
        for pattern in (f"/sys/fs/cgroup/system.slice/slurmstepd.scope/{job}/**/cgroup.procs",  # v2
                        f"/sys/fs/cgroup/*/slurm*/uid_*/{job}/**/cgroup.procs"):              # v1
            for f in glob.glob(pattern, recursive=True):
                try:
                    with open(f) as fh:
                        pids.update(int(x) for x in fh.read().split() if x.isdigit())
                except OSError:
                    pass
    return pids


def _detach() -> bool:
    """Double fork + setsid. True in the detached grandchild (stdio on /dev/null, every other fd
    closed, cwd /, umask 077); False in the caller, once the first child has exited."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return False
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        os.chdir("/")
        os.umask(0o077)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            maxfd = os.sysconf("SC_OPEN_MAX")
        except (ValueError, OSError):
            maxfd = 65536
        os.closerange(3, min(maxfd, 1 << 20))
        for sig in (signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        return True
    except BaseException:
        os._exit(0)


def prolog(env: dict | None = None, *, detach: bool = True, sampler_factory=None,
           interval: float | None = None, url: str | None = None) -> int:
    """``horus-probe --prolog``: measure the job slurmd is starting here, until the Epilog.
    Returns at once in the caller (0) when ``detach``; the detached process exits when done."""
    env = dict(os.environ if env is None else env)
    job_id, node, cluster = _env_job(env)
    log = ProbeLog(env.get("HORUS_PROBE_LOG"), job_id, node)
    if job_id is None:
        log("no SLURM_JOB_ID: nothing to probe")
        return 0
    if detach and not _detach():
        return 0
    try:
        _measure(env, job_id, node, cluster, log, sampler_factory, interval, url)
    except Exception as e:  # noqa: BLE001 - a probe never harms anything
        log(f"error: {type(e).__name__}: {e}")
    if detach:
        os._exit(0)
    return 0


def env_seconds(env, name: str, default: float, low: float, high: float, log=None) -> float:
    """Seconds from ``env[name]``, kept within low..high; ``default`` when unset, not a number,
    nan or infinite. A value not used as written is one line in ``log`` (the probe log: the
    Prolog/Epilog print nothing), never an error: a setting must not stop a probe or an Epilog."""
    text = (env.get(name) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    used = min(max(value, low), high) if math.isfinite(value) else default
    if used != value and log is not None:
        log(f"{name}={text[:40]!r} is not a number of seconds from {low:g} to {high:g}: "
            f"using {used:g}")
    return used


def probe_interval(env, log=None) -> float:
    """HORUS_PROBE_INTERVAL, at least 0.2 s and at most an hour; DEFAULT_INTERVAL when unset or
    not a number (a value the command line refused had stopped every probe, silently)."""
    return env_seconds(env, "HORUS_PROBE_INTERVAL", DEFAULT_INTERVAL, 0.2, 3600.0, log)


def epilog_wait(env, log=None) -> float:
    """HORUS_PROBE_EPILOG_WAIT, 0 to EPILOG_WAIT_MAX_S; DEFAULT_EPILOG_WAIT when unset or not a
    number: a huge value (or inf), taken as it was, could hold the Epilog, and the node with
    it, until Slurm drained the node. A probe not waited for still records: the Epilog only
    stops waiting for it."""
    return env_seconds(env, "HORUS_PROBE_EPILOG_WAIT", DEFAULT_EPILOG_WAIT, 0.0,
                       EPILOG_WAIT_MAX_S, log)


def _measure(env, job_id, node, cluster, log, sampler_factory, interval, url) -> None:
    why = _root_folder(run_dir(env))
    if why:
        log(f"not probed: run folder {why}")
        return
    stopping = {"flag": False}

    def on_term(_signum, _frame):
        stopping["flag"] = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_term)
    # the pid file first: the Epilog of a short job can come while the placement is asked
    # (squeue, up to three tries), and finding no probe it stopped none, so the probe sampled a
    # finished job (no samples: no record; it had recorded 0 MiB over accounting's figure)
    pidf = pid_file(env, job_id, node)
    tmp = f"{pidf}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(f"{os.getpid()} {job_id} {started(os.getpid())}\n")
    os.replace(tmp, pidf)
    place = placement(job_id, node, env)
    sampler = None
    if not place or stopping["flag"]:
        log("no GPU or shard on this node (or no job record): not probed" if not place else
            "stopped before the first sample: not probed")
    else:
        try:
            factory = sampler_factory or sampler_factory_from_env(env, job_id)
            sampler = factory([str(i) for i in place["indices"]])
        except Exception as e:  # no NVML / no GPU: quietly no record
            log(f"no sampler ({type(e).__name__}: {e}): not probed")
    if sampler is None:
        _remove_own(pidf)
        return
    if interval is None:
        interval = probe_interval(env, log)
    log(f"probing GPU {place['indices']} type {place['type']} every {interval:g}s "
        f"({type(sampler).__name__})")
    start = time.time()
    last_check = {"t": start, "answered": start}

    def still_mine() -> bool:
        return _owner_pid(pidf) == os.getpid()

    def stop() -> bool:
        if stopping["flag"] or not still_mine():
            return True
        if time.time() - last_check["t"] >= JOB_CHECK_EVERY_S:
            last_check["t"] = time.time()
            state = job_state(job_id, env)
            if state is not None and state not in LIVE_STATES:
                log(f"job is {state} and no Epilog stopped the probe: stopping")
                return True
            if state is not None:
                last_check["answered"] = last_check["t"]
            elif last_check["t"] - last_check["answered"] >= UNANSWERED_LIMIT_S:
                log(f"Slurm has not said the job runs for {UNANSWERED_LIMIT_S:.0f} s: stopping")
                return True
        return False

    def sleep(seconds: float) -> None:
        end = time.time() + seconds
        while not stopping["flag"] and time.time() < end:
            time.sleep(min(0.2, max(0.0, end - time.time())))

    needs_pids = getattr(sampler, "needs_pids", True)
    summary = Summary()
    while not stop():
        try:
            pids = job_pids(job_id, node, env) if needs_pids else set()
            if pids or not needs_pids:  # none of the job's processes: no sample of the job
                util, mem = sampler.sample(pids)
                summary.add(util, mem)
        except Exception:
            pass
        sleep(interval)
    try:
        sampler.close()
    except Exception:
        pass
    r = summary.result()
    try:
        if not r["samples"]:
            log("no samples: nothing recorded")
            return
        index = place["indices"][0] if len(place["indices"]) == 1 else None
        spool = env.get("HORUS_SPOOL") or DEFAULT_SPOOL
        why = _root_folder(spool)
        if why:
            log(f"spool {why}: a record that cannot reach the ledger is lost")
        ok = record_usage_safely(
            url=url or env.get("HORUS_LEDGER_URL") or None, spool=spool, spool_ok=not why,
            job_id=int(job_id), source="probe", cluster=cluster, util_mean=r["util_mean"],
            util_max=r["util_max"], mem_peak_mib=r["mem_peak_mib"],
            elapsed_s=int(time.time() - start), node=node, gpu_index=index,
            gpu_type=place["type"], shards=place["shards"], gpus=place["gpus"],
            start_time=int(start), end_time=int(time.time()))  # which run of a requeued job
        log(("recorded" if ok else "ledger unreachable, spooled") +
            f": {r['samples']} samples, util mean {r['util_mean']} max {r['util_max']}, "
            f"peak {r['mem_peak_mib']} MiB")
    finally:
        _remove_own(pidf)


def _owner_pid(pidf: str) -> int | None:
    """The pid a probe pid file names (None: none, or unreadable)."""
    try:
        with open(pidf) as f:
            return int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def _remove_own(pidf: str) -> None:
    """Remove the pid file if it is still this process's (an Epilog may have taken it)."""
    if _owner_pid(pidf) == os.getpid():
        try:
            os.unlink(pidf)
        except OSError:
            pass


def _same_probe(pid: int, start: str | None) -> bool:
    """Whether pid is still the probe that wrote the pid file: the process that started then,
    not exited (a zombie has recorded). A killed probe's pid, reused by a user's process that
    named itself a probe, took root's SIGTERM and held the Epilog its full wait; reused by
    another job's probe, that job's measurement ended early."""
    return start is not None and started(pid, running=True) == start


def epilog(env: dict | None = None, *, wait: float | None = None) -> int:
    """``horus-probe --epilog``: stop this job's probe (SIGTERM) and wait, at most ``wait``
    seconds (``epilog_wait``: $HORUS_PROBE_EPILOG_WAIT, 0-300, default 10), for it to record.
    Always 0."""
    env = dict(os.environ if env is None else env)
    job_id, node, _ = _env_job(env)
    log = ProbeLog(env.get("HORUS_PROBE_LOG"), job_id, node)
    if job_id is None:
        return 0
    if wait is None:
        wait = epilog_wait(env, log)
    pidf = pid_file(env, job_id, node)
    try:
        st = os.lstat(pidf)
        with open(pidf) as f:
            fields = f.read().split()
        pid, start = int(fields[0]), (fields[2] if len(fields) > 2 else None)
    except (OSError, ValueError, IndexError):
        return 0  # not probed (no GPU here, no NVML), or already done
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or not _same_probe(pid, start):
        log(f"stale pid file {pidf}: removed")
        try:
            os.unlink(pidf)
        except OSError:
            pass
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return 0
    end = time.time() + wait
    while time.time() < end and _same_probe(pid, start):
        time.sleep(0.05)
    if _same_probe(pid, start):
        log(f"probe {pid} still writing after {wait:g}s; left to finish")
    return 0
