"""How slurm-horus reads Slurm: two backends behind one set of functions.

* ``cli``: scontrol / squeue / sacct (what submitit, dask-jobqueue and parsl use); the parsing of
  what they print lives in ``parse`` and ``accounting``.
* ``pyslurm``: Slurm's C API through pyslurm (``pyslurm_backend``), no process per query.

``HORUS_SLURM_BACKEND=cli|pyslurm`` picks one; unset (or ``auto``), pyslurm is used when it is
installed, built for the Slurm the tools on PATH report (pyslurm X.Y pairs with Slurm X.Y and
fails in odd ways on any other) and loads, else the CLI. Both give nodes and partitions in scontrol's
record shape. Accounting is always sacct's (pyslurm has no GPU usage), running jobs squeue's
(``parse.squeue_json_records``: what root acts on) and submission sbatch's (every option exact).
"""

from __future__ import annotations

import math
import os
import pwd
import re
import shutil
import subprocess
import time
from importlib.util import find_spec
from typing import Iterable

from slurm_horus.errors import HorusError
from slurm_horus.slurm import parse as sp
from slurm_horus.slurm import pyslurm_backend
from slurm_horus.slurm.accounting import parse_sacct_json

__all__ = ["run", "scontrol_nodes", "scontrol_partitions", "partition_gpu_types",
           "default_partition", "node_gpu_types", "sbatch_plugin_options", "exec_sbatch", "private_jobs", "local_cluster", "slurm_config",
           "backend", "slurm_version", "run_sacct", "accounting_jobs", "array_task_job_ids",
           "het_component_job_ids", "het_job_component_ids"]

TIMEOUT_S = 30
HELP_TIMEOUT_S = 10  # sbatch --help, asked while the user waits for their submission
LOOKUP_TIMEOUT_S = 10  # hacct -j N's look for a heterogeneous job's components, an addition
# job names per sacct -j: Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN, E2BIG), and
# 20,000 array tasks named at once had made every lookup of them fail
SACCT_J_CHUNK = 1000
BACKENDS = ("cli", "pyslurm")
_chosen: dict[str, str] = {}
_version: list[str] = []
_plugin_options: list[dict[str, bool] | None] = []


def _cmd(name: str) -> str:
    exe = _real_sbatch() if name == "sbatch" else shutil.which(name)
    if exe is None:
        raise HorusError(f"{name} not found on PATH (is Slurm installed?)")
    return exe


# "PID START\tPATH" lines: the sbatch scripts (not Slurm's binary) hsubmit process PID, started
# at START (proc.started), ran as sbatch
REENTRY_VAR = "HORUS_SBATCH_VIA"


def _ran_by_us() -> set[str]:
    """The sbatch scripts this process, or its parent, ran as sbatch when it was hsubmit: a site
    wrapper named sbatch that runs hsubmit (``exec hsubmit "$@"``, or as a child) is such a
    script, and running it again from the hsubmit it started had looped for ever.  A process
    is known by its pid and start (an exec keeps both): a job's environment may carry the line
    of a wrapper that ran Slurm's sbatch itself, and a later process of that pid is another."""
    marks = os.environ.get(REENTRY_VAR)
    if not marks:  # the common case: no /proc read at hsubmit's start
        return set()
    from slurm_horus.proc import started

    us = {f"{p} {started(p)}" for p in (os.getpid(), os.getppid())}
    out = set()
    for line in marks.splitlines():
        who, _, path = line.partition("\t")
        if who in us and path:
            out.add(os.path.realpath(path))
    return out


def reentered() -> bool:
    """Whether this hsubmit was started by an sbatch script an hsubmit before it ran (see
    _ran_by_us): that one predicted already, so this one passes the call on as it is."""
    return bool(_ran_by_us())


def _real_sbatch() -> str | None:
    """The first sbatch on PATH that is not slurm-horus's own (hsubmit installed, linked or
    copied as ``sbatch`` to make it the drop-in) nor a script that led back to hsubmit
    (_ran_by_us): running either again had looped for ever."""
    skip = _ran_by_us()
    for d in os.get_exec_path():
        exe = shutil.which("sbatch", path=d)
        if exe is None or os.path.realpath(exe) in skip:
            continue
        try:
            with open(exe, "rb") as f:
                head = f.read(4096)
        except OSError:
            continue
        if b"slurm_horus" not in head:  # a console script names its package; Slurm's binary does not
            return exe
    return None


# the caller's defaults for Slurm's own displays (SQUEUE_USERS, SINFO_PARTITION,
# SACCT_FEDERATION...): an admin's SQUEUE_USERS had narrowed the queue loop's whole view
_DISPLAY_ENV = ("SQUEUE_", "SINFO_", "SACCT_", "SCONTROL_")
# scontrol, sinfo and squeue ask the cluster it names (pyslurm always this one): a user's
# SLURM_CLUSTERS=far had made scontrol show config give far's ClusterName as this cluster's
_OTHER_CLUSTER_ENV = "SLURM_CLUSTERS"


def run(args: list[str], timeout: float = TIMEOUT_S) -> str:
    """Run a Slurm query command on this cluster, without the caller's display defaults
    (_DISPLAY_ENV); its stdout, or HorusError with its stderr's last line (Slurm's summary of what failed)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_DISPLAY_ENV) and k != _OTHER_CLUSTER_ENV}
    try:
        cp = subprocess.run([_cmd(args[0]), *args[1:]], capture_output=True, text=True, env=env,
                            errors="replace", timeout=timeout)  # a node's Reason may be any bytes
    except subprocess.TimeoutExpired:
        raise HorusError(f"{' '.join(args[:3])} timed out after {timeout:.0f} s") from None
    except OSError as e:  # an argument past the system's limit (E2BIG), no such program, ...
        raise HorusError(f"{' '.join(args[:3])}: {e.strerror or e}") from None
    if cp.returncode != 0:
        msg = (cp.stderr.strip().splitlines() or [f"exit {cp.returncode}"])[-1]
        raise HorusError(f"{' '.join(args[:3])}: {msg}")
    return cp.stdout


def slurm_version(fresh: bool = False) -> str:
    """``X.Y.Z`` of the Slurm whose tools are on PATH (``sinfo --version``), once per process;
    ``fresh``: read again (a long-running loop must see an upgrade of Slurm under it)."""
    if fresh or not _version:
        m = re.search(r"(\d+\.\d+\.\d+)", run(["sinfo", "--version"]))
        if not m:
            raise HorusError("sinfo --version: no version in its output")
        _version[:] = [m.group(1)]
    return _version[0]


def _pyslurm_version() -> str | None:
    """The installed pyslurm's version, read from its version.py without importing it (an
    import initialises libslurm, which must not happen against another Slurm's slurm.conf; and
    find_spec is cheaper than importlib.metadata for hsubmit's start-up)."""
    spec = find_spec("pyslurm")
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            m = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def backend() -> str:
    """``cli`` or ``pyslurm`` (see the module docstring), decided once per process."""
    want = (os.environ.get("HORUS_SLURM_BACKEND") or "auto").strip().lower()
    if want in _chosen:
        return _chosen[want]
    if want not in (*BACKENDS, "auto"):
        raise HorusError(f"HORUS_SLURM_BACKEND={want}: need cli, pyslurm or auto")
    got = "cli"
    if want != "cli":
        have = _pyslurm_version()
        major = ".".join(slurm_version().split(".")[:2])
        if have and have.startswith(major + "."):
            got = "pyslurm"
            if want == "auto":
                try:
                    pyslurm_backend.load()
                except HorusError:  # built for this Slurm but will not load (libslurm gone)
                    got = "cli"
        elif want == "pyslurm":
            raise HorusError(f"HORUS_SLURM_BACKEND=pyslurm: "
                             f"{'pyslurm ' + have if have else 'no pyslurm'} installed, Slurm is "
                             f"{major} (install pyslurm=={major}.* built against it)")
    _chosen[want] = got
    return got


def scontrol_nodes() -> list[dict]:
    """Nodes as ``scontrol show node`` records (NodeName, Gres, Partitions, AvailableFeatures,
    ActiveFeatures, ...), from the chosen backend."""
    return _records(pyslurm_backend.nodes, "node")


def scontrol_partitions() -> list[dict]:
    """Partitions as ``scontrol show partition`` records (PartitionName, Default, Nodes)."""
    return _records(pyslurm_backend.partitions, "partition")


def _records(read_with_pyslurm, kind: str) -> list[dict]:
    """``scontrol show KIND`` records from the chosen backend; in auto mode those pyslurm's
    parsers cannot read are read with scontrol (HORUS_SLURM_BACKEND=pyslurm: no fallback).
    ``--all``, as pyslurm's SHOW_ALL: without it a user's scontrol leaves out Hidden partitions
    (and those their AllowGroups exclude), their names in a node's Partitions and nodes in no
    other, and hsubmit -p of a hidden partition found "no node" on the CLI backend alone.
    The options go before ``show``: under POSIXLY_CORRECT getopt stops at the first word, and
    scontrol had refused ``show node -o --all`` ("too many arguments for keyword:show")."""
    if backend() == "pyslurm":
        try:
            return read_with_pyslurm()
        except pyslurm_backend.UnreadableRecord:
            if (os.environ.get("HORUS_SLURM_BACKEND") or "").strip().lower() == "pyslurm":
                raise
    return sp.parse_scontrol_records(run(["scontrol", "-o", "--all", "show", kind]))


def run_sacct(since: float, until: float, extra: Iterable[str] = ()) -> str:
    """``sacct --json`` of every user's jobs between ``since`` and ``until`` (epoch seconds),
    given to sacct as seconds before its now: a local clock time is ambiguous in the hour the
    clocks go back (sacct read 02:30 as the later one, and windows ended before they began)."""
    now = time.time()
    args = ["sacct", "--json", "--allusers", "-S", f"now-{max(0, math.ceil(now - since))}",
            "-E", f"now-{max(0, math.floor(now - until))}", *extra]
    return run(args, timeout=300)


def accounting_jobs(since: float, until: float) -> list[dict]:
    """Jobs in Slurm accounting between ``since`` and ``until`` (epoch seconds), every user's,
    as ``accounting.parse_job`` flat dicts: from sacct on either backend, since pyslurm's
    db.Job carries no usage TRES (gres/gpuutil, gres/gpumem), the GPU use sync records."""
    return parse_sacct_json(run_sacct(since, until))


def accounting_jobs_by_id(job_ids: list[int]) -> list[dict]:
    """These jobs from Slurm accounting, whenever they ran (sacct -j has no time window)."""
    return _named_jobs([str(int(x)) for x in job_ids], None, timeout=300)


def array_task_job_ids(tasks: list[tuple[int, int]], cluster: str | None = None
                       ) -> dict[tuple[int, int], int]:
    """{(ArrayJobId, TaskId): the task's own job id} from accounting (``cluster``'s, else the
    local one's), for those it knows."""
    return _member_job_ids(tasks, "_", "array", cluster)


def het_component_job_ids(comps: list[tuple[int, int]], cluster: str | None = None
                          ) -> dict[tuple[int, int], int]:
    """{(HetJobId, Offset): the component's own job id} from accounting, as array_task_job_ids."""
    return _member_job_ids(comps, "+", "het", cluster)


def het_job_component_ids(job_ids: list[int], cluster: str | None = None) -> dict[int, list[int]]:
    """{HetJobId: its components' own job ids, the leader's too} of those of ``job_ids`` that
    lead a heterogeneous job, as sacct -j HetJobId lists them (the ledger keeps no HetJobId);
    from accounting as array_task_job_ids (SACCT_J_CHUNK ids per sacct)."""
    if not job_ids:
        return {}
    named, out = set(job_ids), {}
    # an addition to what the ledger lists: a user waits for it, so not a minute
    for r in _named_jobs([str(int(x)) for x in job_ids], cluster, timeout=LOOKUP_TIMEOUT_S):
        if r["het"] and r["het"][0] in named:
            out.setdefault(r["het"][0], set()).add(r["job_id"])
    return {h: sorted(ids) for h, ids in out.items()}


def _member_job_ids(pairs: list[tuple[int, int]], sep: str, field: str, cluster: str | None
                    ) -> dict[tuple[int, int], int]:
    """The own job ids of the jobs sacct -j names PARENT<sep>PLACE (parse_job's ``field``)."""
    if not pairs:
        return {}
    wanted = set(pairs)
    recs = _named_jobs([f"{a}{sep}{t}" for a, t in pairs], cluster)
    return {r[field]: r["job_id"] for r in recs if r.get(field) in wanted}


def _named_jobs(names: list[str], cluster: str | None, timeout: float = 60) -> list[dict]:
    """parse_job's records of the jobs ``sacct -j NAME,...`` lists, on ``cluster`` (else the
    local one), SACCT_J_CHUNK names per sacct: a short query, so a minute each at most, not
    run_sacct's five."""
    where = ["-M", cluster] if cluster else []
    out: list[dict] = []
    for i in range(0, len(names), SACCT_J_CHUNK):
        spec = ",".join(names[i:i + SACCT_J_CHUNK])
        out += parse_sacct_json(run(["sacct", "--json", "--allusers", *where, "-j", spec], timeout=timeout))
    return out


def default_account() -> str | None:
    """This user's default account as slurmdbd has it (what slurmctld gives a job without -A,
    after the job-submit hook), or None when sacctmgr cannot say."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
        out = run(["sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount"], timeout=10)
    except (KeyError, HorusError):
        return None
    return next(iter(out.split()), None)


def default_partition() -> str:
    name = sp.default_partition(scontrol_partitions())
    if not name:
        raise HorusError("no default partition (pass -p/--partition)")
    return name


def partition_gpu_types(partition: str | None) -> tuple[str, dict[str, int]]:
    """(partition, {gres type: GPU count}) of ``partition`` (None: the default partition)."""
    if not partition:
        partition = default_partition()
    nodes = sp.partition_nodes(scontrol_nodes(), partition)
    if not nodes:  # a typo: say so, rather than that its (no) nodes have no typed GPUs
        raise HorusError(f"partition {partition}: no node of Slurm's is in it (no such partition?)")
    return partition, sp.partition_gpu_types(nodes, partition)


def node_gpu_types() -> dict[str, str]:
    """{node: gpu type} from the nodes' Gres (gpu:a100:4,...); a node with several types maps to
    none of them (its jobs' type is not the node's). {} when Slurm cannot be asked."""
    try:
        nodes = scontrol_nodes()
    except HorusError:
        return {}
    out = {}
    for n in nodes:
        types = sp.gpu_types_of_node(n)
        if len(types) == 1 and n.get("NodeName"):
            out[n["NodeName"]] = next(iter(types))
    return out


_ASK = object()  # a parameter not given: ask Slurm


def private_jobs(unknown, conf=_ASK):
    """Whether Slurm's PrivateData hides other users' jobs: slurm.conf's (squeue, scontrol) or
    slurmdbd.conf's, which is what hides them from sacct (sacctmgr shows it); ``unknown`` when
    Slurm cannot say (hacct assumes private: never a leak; sync changes no file mode on a
    guess).  A site that set it in slurmdbd.conf alone had its ledger treated as public.
    ``conf``: slurm_config()'s answer, where the caller has it."""
    conf = slurm_config() if conf is _ASK else conf
    if conf is None:
        return unknown
    if _has_jobs(conf):
        return True
    if conf.get("AccountingStorageType") != "accounting_storage/slurmdbd":
        return False  # no slurmdbd: nothing else decides
    try:
        dbd = sp.parse_slurmdbd_config(run(["sacctmgr", "show", "configuration"]))
    except HorusError:
        return unknown
    return unknown if dbd is None else _has_jobs(dbd)


def local_cluster(conf=_ASK) -> str | None:
    """This host's ClusterName (what sacct shows by default), or None when Slurm cannot say.
    ``conf``: slurm_config()'s answer, where the caller has it."""
    return ((slurm_config() if conf is _ASK else conf) or {}).get("ClusterName") or None


def _has_jobs(conf: dict) -> bool:
    return "jobs" in conf.get("PrivateData", "").lower().replace(" ", "").split(",")


def slurm_user_gid() -> int | None:
    """The primary group of SlurmUser (slurmctld's, which runs the job-submit hook), or None."""
    uid = sp.config_user_id((slurm_config() or {}).get("SlurmUser", ""))
    try:
        return None if uid is None else pwd.getpwuid(uid).pw_gid
    except KeyError:
        return None


def slurm_config() -> dict | None:
    """``scontrol show config`` as a dict; None when Slurm cannot answer."""
    try:
        return sp.parse_scontrol_config(run(["scontrol", "show", "config"]))
    except HorusError:
        return None


def _undo_locale_coercion() -> None:
    """Give LC_CTYPE back the value this process started with.  Python run in the C locale sets
    LC_CTYPE=C.UTF-8 in its own environment (PEP 538), and sbatch copies its environment into
    the job: a job sent through hsubmit ran in another locale than one sent by sbatch.  The
    starting environment is /proc/self/environ; without it nothing is changed."""
    try:
        with open("/proc/self/environ", "rb") as f:
            start = f.read()
    except OSError:
        return
    was = next((kv[9:] for kv in start.split(b"\0") if kv.startswith(b"LC_CTYPE=")), None)
    if os.environb.get(b"LC_CTYPE") == was:
        return
    if was is None:
        os.environb.pop(b"LC_CTYPE", None)
    else:
        os.environb[b"LC_CTYPE"] = was


def sbatch_plugin_options() -> dict[str, bool] | None:
    """{name: takes a value} of the options sbatch's SPANK plugins add (``sbatch --help``),
    asked once per process; None when sbatch cannot say within HELP_TIMEOUT_S.  COLUMNS is
    left out: spank.c cuts an option's name to fit it."""
    if not _plugin_options:
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        try:
            cp = subprocess.run([_cmd("sbatch"), "--help"], stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, errors="replace", timeout=HELP_TIMEOUT_S, env=env)
            _plugin_options.append(sp.sbatch_plugin_options(cp.stdout) if cp.returncode == 0 else None)
        except (HorusError, OSError, subprocess.TimeoutExpired):
            _plugin_options.append(None)
    return _plugin_options[0]


def exec_sbatch(argv: list[str], stdin: bytes | None = None) -> None:
    """Replace this process with sbatch: its stdin (``stdin``'s bytes instead where given: the
    script hsubmit read, in a memory file), stdout, stderr and every other open file the user
    gave, its signals and its exit code, as when run directly.  No timeout of ours: sbatch
    bounds its own waits, and killing it after it sent the job would leave the user not
    knowing whether the job went in."""
    exe = _cmd("sbatch")
    import signal

    if stdin is not None:
        try:
            fd = os.memfd_create("sbatch-script")
        except (AttributeError, OSError):  # no memfd (a Python built on glibc < 2.27): a file
            import tempfile

            fd, path = tempfile.mkstemp(prefix="hsubmit-")
            os.unlink(path)
        view = memoryview(stdin)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(fd, 0)
        os.close(fd)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores these; sbatch must not
        signal.signal(sig, signal.SIG_DFL)
    _undo_locale_coercion()
    try:
        with open(exe, "rb") as f:
            script = f.read(2) == b"#!"
    except OSError:
        script = False
    if script:  # a site's wrapper: it may lead back to hsubmit (reentered), which then skips it
        from slurm_horus.proc import started

        me = os.getpid()
        os.environ[REENTRY_VAR] = os.environ.get(REENTRY_VAR, "") + f"{me} {started(me)}\t{exe}\n"
    else:  # Slurm's own: nothing to mark, and nothing of ours in the job's environment
        os.environ.pop(REENTRY_VAR, None)
    os.execv(exe, ["sbatch", *argv])

