"""horus-probe: sample the GPU use of a job's own processes and record a summary in the ledger.

Measured use must be something users cannot forge, so only a probe running as **root** records:

- ``horus-probe --prolog`` from slurmd's ``Prolog`` (root; not the TaskProlog, which runs as the
  user): reads the job from ``scontrol -d show job $SLURM_JOB_ID`` (its node-local GPU indices and
  type, ``slurm_parse.job_gpus_on_node``), detaches completely (double fork, setsid, every fd
  closed: slurmd does not wait) and samples the job's processes (``scontrol listpids``) until
  ``horus-probe --epilog`` (slurmd's ``Epilog``) stops it through the pid file in a root-only run
  folder; then writes one usage row (source "probe") with ``ledger.record_usage_safely`` (ledger
  timeouts; the root-only spool ``/var/spool/slurm-horus`` or $HORUS_SPOOL as fallback).
- ``horus-probe [--pid PID | -- CMD]``: the older in-job form; it records only when run as root.

NVML (nvidia-ml-py, ``pip install slurm-horus[probe]``) is reached only through ``NvmlSampler``;
the loop talks to a sampler with one method, ``sample(pids) -> (util_pct | None, mem_mib)``.
Per-process SM utilization comes from nvmlDeviceGetProcessUtilization, memory from
nvmlDeviceGetComputeRunningProcesses, both summed over the job's processes on the job's GPUs.
Without NVML (or a GPU) nothing is recorded, quietly. ``FakeSampler`` (``HORUS_PROBE_SAMPLER=
fake:DIR``) exists for the local test cluster only: a test job writes what it "used" in
``DIR/<jobid>.json``; it is never chosen unless that variable is set in the Prolog's environment.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field

DEFAULT_RUN_DIR = "/run/slurm-horus"      # pid files of running probes (root, 0700)
DEFAULT_SPOOL = "/var/spool/slurm-horus"  # fallback when the ledger is unreachable (root, 0700)
DEFAULT_INTERVAL = 5.0
SCONTROL_TIMEOUT_S = 10.0
JOB_CHECK_EVERY_S = 60.0                  # a probe whose job is gone (Epilog missed) stops itself
LIVE_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING", "STOPPED", "RESIZING",
               "SIGNALING", "STAGE_OUT", "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


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
        factory = sampler_factory or sampler_factory_from_env(
            env, job_id or env.get("SLURM_JOB_ID"))
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
        from slurm_horus.ledger import record_usage_safely

        record_usage_safely(url=url, job_id=int(job), source="probe",
                            cluster=cluster or env.get("SLURM_CLUSTER_NAME", ""),
                            util_mean=r["util_mean"], util_max=r["util_max"],
                            mem_peak_mib=r["mem_peak_mib"], elapsed_s=int(time.time() - start),
                            node=env.get("SLURMD_NODENAME"),
                            gpu_index=getattr(sampler, "index", None),
                            shards=int(env["SLURM_SHARDS_ON_NODE"])
                            if env.get("SLURM_SHARDS_ON_NODE", "").isdigit() else None)
    return rc


# --------------------------------------------------------------------------- Prolog / Epilog

class ProbeLog:
    """One-line messages to $HORUS_PROBE_LOG (appended; root's file), else nowhere: a detached
    probe has no terminal, and the Prolog/Epilog must print nothing."""

    def __init__(self, path: str | None, job_id=None, node=None):
        self.path = path or None
        self.tag = f"job {job_id}" + (f" on {node}" if node else "")

    def __call__(self, msg: str) -> None:
        if not self.path:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} horus-probe[{os.getpid()}] "
                        f"{self.tag}: {msg}\n")
        except Exception:
            pass


def _env_job(env: dict) -> tuple[str | None, str | None, str]:
    job = (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip()
    node = (env.get("SLURMD_NODENAME") or "").strip() or None
    return (job if job.isdigit() else None), node, (env.get("SLURM_CLUSTER_NAME") or "").strip()


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
    if not stat.S_ISDIR(st.st_mode):
        return f"{path}: not a folder"
    if st.st_uid != 0 or st.st_mode & 0o022:
        return f"{path}: must be owned by root and not group/other-writable"
    return None


def _scontrol(args: list[str], env: dict, timeout: float = SCONTROL_TIMEOUT_S) -> str | None:
    try:
        cp = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout,
                            env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return cp.stdout if cp.returncode == 0 else None


def job_record(job_id: str, env: dict, tries: int = 3) -> dict | None:
    """The job's ``scontrol -d show job`` record (retried: slurmctld may be busy)."""
    from slurm_horus.slurm import parse as sp

    for k in range(tries):
        out = _scontrol(["-d", "show", "job", str(job_id)], env)
        recs = sp.parse_scontrol_records(out) if out else []
        if recs:
            return recs[0]
        if k + 1 < tries:
            time.sleep(1.0)
    return None


def placement(job_id: str, node: str | None, env: dict) -> dict | None:
    """{indices, type, shards, gpus} of the job's GPUs on this node (None: none here), the type
    completed from the node's ``Gres=gpu:TYPE:N`` when the node has a single GPU type."""
    from slurm_horus.slurm import parse as sp

    rec = job_record(job_id, env)
    if rec is None:
        return None
    place = sp.job_gpus_on_node(rec, node)
    if place and not place["type"] and node:
        out = _scontrol(["show", "node", node], env)
        nodes = [n for n in (sp.parse_scontrol_records(out) if out else [])
                 if n.get("NodeName") == node]
        types = sp.gpu_types_of_node(nodes[0]) if nodes else {}
        if len(types) == 1:
            place["type"] = next(iter(types))
    return place


def job_pids(job_id: str, node: str | None, env: dict) -> set[int]:
    """The job's processes on this node: ``scontrol listpids`` (as root), else the job's cgroup."""
    from slurm_horus.slurm import parse as sp

    out = _scontrol(["listpids", str(job_id)] + ([node] if node else []), env, timeout=5.0)
    pids = set(sp.parse_listpids(out)) if out else set()
    if not pids:
        import glob

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


def _usage_kwargs(**kw) -> dict:
    """Only the fields this version's ledger.usage_record takes (e.g. ``gpus`` from schema 4)."""
    import inspect

    from slurm_horus.ledger import usage_record

    names = set(inspect.signature(usage_record).parameters)
    return {k: v for k, v in kw.items() if k in names}


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


def _measure(env, job_id, node, cluster, log, sampler_factory, interval, url) -> None:
    place = placement(job_id, node, env)
    if not place:
        log("no GPU or shard on this node (or no job record): not probed")
        return
    why = _root_folder(run_dir(env))
    if why:
        log(f"not probed: run folder {why}")
        return
    try:
        factory = sampler_factory or sampler_factory_from_env(env, job_id)
        sampler = factory([str(i) for i in place["indices"]])
    except Exception as e:  # no NVML / no GPU: quietly no record
        log(f"no sampler ({type(e).__name__}: {e}): not probed")
        return
    stopping = {"flag": False}

    def on_term(_signum, _frame):
        stopping["flag"] = True
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_term)
    pidf = pid_file(env, job_id, node)
    tmp = f"{pidf}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(f"{os.getpid()} {job_id}\n")
    os.replace(tmp, pidf)
    if interval is None:
        try:
            interval = max(0.2, float(env.get("HORUS_PROBE_INTERVAL") or DEFAULT_INTERVAL))
        except ValueError:
            interval = DEFAULT_INTERVAL
    log(f"probing GPU {place['indices']} type {place['type']} every {interval:g}s "
        f"({type(sampler).__name__})")
    start = time.time()
    last_check = {"t": start}

    def still_mine() -> bool:
        try:
            with open(pidf) as f:
                return f.read().split()[0] == str(os.getpid())
        except (OSError, IndexError):
            return False

    def stop() -> bool:
        if stopping["flag"] or not still_mine():
            return True
        if time.time() - last_check["t"] >= JOB_CHECK_EVERY_S:
            last_check["t"] = time.time()
            rec = job_record(job_id, env, tries=1)
            from slurm_horus.slurm.parse import job_state

            if rec is not None and job_state(rec) not in LIVE_STATES:
                log(f"job is {job_state(rec)} and no Epilog stopped the probe: stopping")
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
        from slurm_horus.ledger import record_usage_safely

        index = place["indices"][0] if len(place["indices"]) == 1 else None
        spool = env.get("HORUS_SPOOL") or DEFAULT_SPOOL
        why = _root_folder(spool)
        if why:
            log(f"spool {why}: a record that cannot reach the ledger is lost")
        ok = record_usage_safely(
            url=url or env.get("HORUS_LEDGER_URL") or None, spool=spool,
            **_usage_kwargs(job_id=int(job_id), source="probe", cluster=cluster,
                            util_mean=r["util_mean"], util_max=r["util_max"],
                            mem_peak_mib=r["mem_peak_mib"], elapsed_s=int(time.time() - start),
                            node=node, gpu_index=index, gpu_type=place["type"],
                            shards=place["shards"], gpus=place["gpus"]))
        log(("recorded" if ok else "ledger unreachable, spooled") +
            f": {r['samples']} samples, util mean {r['util_mean']} max {r['util_max']}, "
            f"peak {r['mem_peak_mib']} MiB")
    finally:
        if still_mine():
            try:
                os.unlink(pidf)
            except OSError:
                pass


def _is_probe(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"--prolog" in cmd and b"probe" in cmd


def epilog(env: dict | None = None, *, wait: float | None = None) -> int:
    """``horus-probe --epilog``: stop this job's probe (SIGTERM) and wait, at most ``wait``
    seconds ($HORUS_PROBE_EPILOG_WAIT, default 10), for it to record. Always 0."""
    env = dict(os.environ if env is None else env)
    job_id, node, _ = _env_job(env)
    log = ProbeLog(env.get("HORUS_PROBE_LOG"), job_id, node)
    if job_id is None:
        return 0
    if wait is None:
        try:
            wait = float(env.get("HORUS_PROBE_EPILOG_WAIT") or 10)
        except ValueError:
            wait = 10.0
    pidf = pid_file(env, job_id, node)
    try:
        st = os.lstat(pidf)
        with open(pidf) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # not probed (no GPU here, no NVML), or already done
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or not _is_probe(pid):
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
    while time.time() < end and _alive(pid) and _is_probe(pid):
        time.sleep(0.05)
    if _alive(pid) and _is_probe(pid):
        log(f"probe {pid} still writing after {wait:g}s; left to finish")
    return 0
