"""`horus-admin doctor`: check a site's Slurm and slurm-horus set-up against what slurm-horus needs.

Reads slurm.conf and gres.conf (the files, so a copy can be checked before it is installed), the
policy and hook next to them, the ledger's and the model registry's file modes, and the Slurm
version the tools on PATH report. Each problem comes with the change that fixes it; what each
check protects is said where it is made.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from slurm_horus.errors import HorusError
from slurm_horus.textfile import NOT_OWNER, WRITABLE, open_for_reading, read_text, untrusted

# Slurm versions the test suite runs on (tests/cluster/up); shards exist from 22.05.
TESTED = ("22.05", "25.11")
SLURM_CONF_MAX_BYTES = 64 << 20  # the largest sites' slurm.conf are a few MiB
MAX_INCLUDES = 1000  # files read through Include lines (a site's: a few)


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str


@dataclass
class SlurmConf:
    settings: dict[str, str]     # lower-case key -> value (last one wins, like slurmctld)
    nodes: list[dict[str, str]]  # one per NodeName line, NodeName=DEFAULT folded in, lower-case keys
    path: Path


def read_slurm_conf(path: Path) -> SlurmConf:
    from slurm_horus.slurm.parse import node_lines, parse_conf_lines

    # a stray byte (a name in a comment, in Latin-1) is Slurm's to ignore, and doctor's
    text = read_text(path, "slurm.conf", SLURM_CONF_MAX_BYTES, "replace")
    text = _with_includes(path, text, 0, [0, len(text)])
    if "\x00" in text or text.count("\ufffd") > max(16, len(text) // 100):
        raise HorusError(f"{path}: not a text file (binary bytes): not a slurm.conf")
    recs = parse_conf_lines(text)
    settings: dict[str, str] = {}
    for rec in recs:
        if "nodename" not in rec and "partitionname" not in rec:
            settings.update(rec)
    return SlurmConf(settings, node_lines(recs), path)


def _with_includes(path: Path, text: str, depth: int, read: list[int]) -> str:
    """slurm.conf with its ``Include`` files in place, as slurmctld reads it (paths relative to
    slurm.conf's folder, glob patterns allowed); a site that keeps its NodeName lines in
    nodes.conf had been told GresTypes lacked gpu,shard.  ``read``: [files, bytes] read so far,
    at most MAX_INCLUDES and SLURM_CONF_MAX_BYTES in all: files that include each other many
    times over (no loop, so within the depth) had doctor read millions of them."""
    out = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split(None, 1)
        if len(words) == 2 and words[0].lower() == "include":
            if depth >= 8:
                raise HorusError(f"{path}: Include nested more than 8 deep")
            pattern = words[1].split()[0]
            base = path.parent if not os.path.isabs(pattern) else Path("/")
            names = sorted(glob.glob(str(base / pattern)))
            if not names:
                raise HorusError(f"{path}: Include {pattern}: no such file (slurmctld would not "
                                 "start)")
            for name in names:
                sub = Path(name)
                sub_text = read_text(sub, "slurm.conf Include", SLURM_CONF_MAX_BYTES, "replace")
                read[0] += 1
                read[1] += len(sub_text)
                if read[0] > MAX_INCLUDES or read[1] > SLURM_CONF_MAX_BYTES:
                    raise HorusError(f"{path}: Include: more than {MAX_INCLUDES:,} files or "
                                     f"{SLURM_CONF_MAX_BYTES:,} bytes in all: not a slurm.conf to check")
                out.append(_with_includes(sub, sub_text, depth + 1, read))
            continue
        out.append(line)
    return "\n".join(out)


def _words(value: str | None) -> set[str]:
    return {w.strip().lower() for w in (value or "").split(",") if w.strip()}


def parse_version(text: str) -> tuple[int, int] | None:
    """``slurm 25.11.7`` / ``slurm-wlm 22.05.8`` -> (25, 11)."""
    m = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_version(text: str | None) -> list[Problem]:
    v = parse_version(text or "")
    if v is None:
        return [Problem("the Slurm version is unknown (sinfo --version failed)",
                        "put Slurm's client tools (sinfo, scontrol, sacct, sbatch) on PATH")]
    if v < (22, 5):
        return [Problem(f"Slurm {v[0]}.{v[1]:02d} has no gres/shard (needed to share GPUs)",
                        "upgrade Slurm to 22.05 or later (tested: " + ", ".join(TESTED) + ")")]
    return []


def check_slurm_conf(conf: SlurmConf) -> list[Problem]:
    """The settings that packing, the hook, sync and the probe rely on."""
    s, out = conf.settings, []
    if s.get("selecttype", "").lower() != "select/cons_tres":
        out.append(Problem(f"SelectType={s.get('selecttype', '(unset)')}: shards need cons_tres",
                           "set SelectType=select/cons_tres"))
    missing = {"gpu", "shard"} - _words(s.get("grestypes"))
    if missing:
        out.append(Problem(f"GresTypes lacks {','.join(sorted(missing))}",
                           "set GresTypes=gpu,shard"))
    if not _words(s.get("jobsubmitplugins")) & {"lua", "job_submit/lua"}:
        out.append(Problem("JobSubmitPlugins does not load lua: the hook never runs",
                           "add lua to JobSubmitPlugins (JobSubmitPlugins=lua)"))
    if s.get("accountingstoragetype", "").lower() != "accounting_storage/slurmdbd":
        out.append(Problem("AccountingStorageType is not accounting_storage/slurmdbd: "
                           "horus-admin sync reads sacct", "run slurmdbd and set "
                           "AccountingStorageType=accounting_storage/slurmdbd"))
    if "job_comment" not in _words(s.get("accountingstoreflags")):
        out.append(Problem("AccountingStoreFlags lacks job_comment: sync cannot read the hint "
                           "and workload from sacct", "add job_comment to AccountingStoreFlags"))
    missing = {"gres/gpu", "gres/shard"} - _words(s.get("accountingstoragetres"))
    if missing:
        out.append(Problem(f"AccountingStorageTRES lacks {','.join(sorted(missing))}: sacct "
                           "does not record the shards and GPUs jobs held",
                           "add gres/gpu,gres/shard to AccountingStorageTRES"))
    for key, script in (("prolog", "horus-prolog"), ("epilog", "horus-epilog")):
        if not _runs(s.get(key), script, conf.path.parent):
            out.append(Problem(f"{key.capitalize()} does not run {script}: no measured GPU "
                               "use, no GPU index", f"install {_packaged(script)} as "
                               f"/etc/slurm/{script} and set {key.capitalize()}=/etc/slurm/"
                               f"{script} (or call it from your {key})"))
    return out


def _runs(value: str | None, script: str, conf_dir: Path) -> bool:
    """Whether a Prolog/Epilog setting (a comma list of paths or globs, as slurmd takes them)
    is ``script`` or a file that calls it."""
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        pattern = item if os.path.isabs(item) else str(conf_dir / item)
        paths = [Path(p) for p in sorted(glob.glob(pattern))] if glob.has_magic(pattern) else [Path(pattern)]
        for path in paths:  # by its name: slurmd's nodes have it, the controller may not
            if path.name == script or script in (_small_text(path) or ""):
                return True
    return False


def _small_text(path: Path, limit: int = 4 * 2**20) -> str | None:
    """The first ``limit`` bytes of a regular file as text (odd bytes replaced); None for a
    FIFO, a device, a folder or a file that cannot be read (doctor must not wait on any)."""
    try:
        with open_for_reading(path, regular_only=True) as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def check_nodes(conf: SlurmConf, gres_conf: str | None, shards_per_gpu: int, type_via: str,
                gpu_mem_types: set[str], declared: set[str]) -> list[Problem]:
    """GPU node lines against the policy: shard counts, typing (the node features the policy
    declares in type_features must exist), the policy's GPU memory table."""
    from slurm_horus.slurm.parse import gres_count, parse_conf_lines, parse_gres

    out = []
    shard_lines: dict[str | None, int] = {}  # None: a line without NodeName, every node's
    for rec in parse_conf_lines(gres_conf or ""):
        if rec.get("name") == "shard" and rec.get("count") and "file" not in rec:
            count = gres_count(rec["count"])
            try:
                hosts = _hosts(rec["nodename"]) if rec.get("nodename") else [None]
            except HorusError as e:  # one line's finding, not the end of every other check
                out.append(Problem(f"gres.conf: NodeName={rec['nodename']}: {e}",
                                   "write the node names as a Slurm hostlist (gpu[01-04])"))
                continue
            for host in hosts:
                if count is not None:
                    shard_lines[host] = count
    for node in conf.nodes:
        try:
            gres, hosts = parse_gres(node.get("gres")), _hosts(node["nodename"])
        except HorusError as e:  # an odd line: its finding, the others still checked
            out.append(Problem(f"node {node['nodename']}: cannot read its NodeName= or Gres= "
                               f"({e})", "write NodeName= as a Slurm hostlist (gpu[01-04]) and "
                               "Gres= as gpu:<type>:<count>,shard:<count>"))
            continue
        gpus = [g for g in gres if g["name"] == "gpu"]
        if not gpus:
            continue
        name = node["nodename"]
        n_gpu = sum(g["count"] for g in gpus)
        shards = sum(g["count"] for g in gres if g["name"] == "shard")
        want = n_gpu * shards_per_gpu
        if shards != want:
            out.append(Problem(f"node {name}: {shards} shards for {n_gpu} GPUs, policy "
                               f"shards_per_gpu={shards_per_gpu} needs {want}",
                               f"set shard:{want} in {name}'s Gres= (and its gres.conf shard "
                               "Count)"))
        for host in hosts:
            line = shard_lines.get(host, shard_lines.get(None))
            if line is not None and line != want:
                out.append(Problem(f"gres.conf: Name=shard Count={line} on {host}, "
                                   f"expected {want}", f"set Count={want} on {host}'s shard line"))
        # as Slurm matches them: case and all (a job's --constraint=a100 fits no Features=A100)
        feats = {w.strip() for w in (node.get("features") or node.get("feature")  # both are Slurm's
                                     or node.get("availablefeatures") or "").split(",")}
        for g in gpus:
            if not g["type"]:
                out.append(Problem(f"node {name}: untyped GPUs (gpu:{g['count']}): no "
                                   "prediction can be placed there",
                                   f"give the type: Gres=gpu:<type>:{g['count']}, the "
                                   "type named as in the policy's gpu.<type>.mem_mib"))
                continue
            t = g["type"].lower()
            if t != g["type"]:
                out.append(Problem(f"node {name}: GPU type {g['type']} is not lower case: the "
                                   "hook and the policy name types in lower case, and Slurm "
                                   "matches types and features case and all",
                                   f"rename it {t} in {name}'s Gres=, Features= and gres.conf"))
                continue
            if type_via == "features" and t in declared and t not in feats:
                out.append(Problem(f"node {name}: no Features={t} while the policy declares "
                                   f"type_features {t}: the hook's constraint makes jobs "
                                   "invalid", f"add Features={t} to {name}'s line (or drop {t} "
                                   "from type_features)"))
            elif type_via == "features" and t not in declared:
                out.append(Problem(f"GPU type {t} (node {name}) is not in the policy's "
                                   "type_features: the hook pins no job to it (jobs stay as "
                                   "submitted)", f"add Features={t} to its nodes and {t} to "
                                   "type_features"))
            if t not in gpu_mem_types:
                out.append(Problem(f"GPU type {t} (node {name}) has no gpu.{t}.mem_mib in the "
                                   "policy: the hook cannot pack jobs there",
                                   f"add gpu.{t}.mem_mib = <MiB per GPU> to the policy"))
    return out


def _hosts(expr: str | None) -> list[str]:
    from slurm_horus.slurm.parse import expand_hostlist

    return expand_hostlist(expr) if expr else []


def _packaged(name: str) -> str:
    """Where the installed package keeps its copy of an etc/ file (for fix lines)."""
    from slurm_horus.shared_files import shared_path

    return str(shared_path("etc", name) or f"share/slurm-horus/etc/{name}")


def check_hook(conf_dir: Path) -> list[Problem]:
    """slurmctld loads job_submit.lua from slurm.conf's folder; it runs as root."""
    hook = conf_dir / "job_submit.lua"
    code = _small_text(hook)
    if code is None:
        return [Problem(f"{hook} is missing: no packing",
                        f"install slurm-horus's {_packaged('job_submit.lua')} as {hook}")]
    out = []
    packaged = _small_text(Path(_packaged("job_submit.lua")))
    if not _is_horus_hook(code):
        out.append(Problem(f"{hook} is not slurm-horus's hook",
                           f"install {_packaged('job_submit.lua')} as {hook}"))
    elif packaged is not None and code != packaged:
        out.append(Problem(f"{hook} differs from this package's hook (an older one, or edited): "
                           "the hook and the package must be of one version",
                           f"install {_packaged('job_submit.lua')} as {hook}"))
    luac = shutil.which("luac5.1") or shutil.which("luac")
    if luac and _is_horus_hook(code):
        try:  # slurmctld would keep its old script, or not start the plugin
            cp = subprocess.run([luac, "-p", str(hook)], capture_output=True, text=True, timeout=30)
            if cp.returncode:
                out.append(Problem(f"{hook} is not valid Lua: {(cp.stderr.strip().splitlines() or ['?'])[-1]}",
                                   f"install {_packaged('job_submit.lua')} as {hook}"))
        except (OSError, subprocess.TimeoutExpired):
            pass
    out += _trusted(hook.resolve(), "the hook") + _trusted(hook.resolve().parent, "the hook's folder")
    return out


def check_regular_files(paths: dict[str, str | Path | None]) -> list[Problem]:
    """slurmctld opens the hook's files at each submission (Lua cannot tell a FIFO from a file):
    one that is not a regular file makes every submission wait on whoever writes it."""
    out = []
    for what, p in paths.items():
        try:
            mode = os.stat(p).st_mode if p else None
        except OSError:
            continue  # missing: the checks of each say what that means
        if mode is not None and not stat.S_ISREG(mode):
            out.append(Problem(f"{what} {p} is not a regular file: slurmctld would wait on it at "
                               "every submission", f"replace {p} with a regular file on a local "
                               "file system"))
    return out


def check_hook_file_folder(path: str | Path, what: str) -> list[Problem]:
    """The folder of a file the hook opens at every submission (the policy, the claim record, the
    pressure file), where the path really leads: Lua cannot open a file without waiting, so
    whoever may make a name there could put a FIFO in the file's place while it is missing, and
    every submission would wait on it.  Root's, and writable by no one else, the sticky bit or not
    (it stops renames and deletions, not new names)."""
    folder = Path(os.path.realpath(path)).parent
    try:
        st = folder.stat()
    except OSError:
        return []  # no folder, no file: the checks of each say what that means
    out = []
    fifo = "a user could put a FIFO in the file's place, and slurmctld would wait on it at every submission"
    why = untrusted(st, (0,))  # no sticky_ok: a new name is the harm here
    if NOT_OWNER in why:
        out.append(Problem(f"the folder of {what} {folder} is owned by uid {st.st_uid}, not root: {fifo}",
                           f"chown root {folder}"))
    if WRITABLE in why:
        out.append(Problem(f"the folder of {what} {folder} is writable by group or others "
                           f"(mode {stat.S_IMODE(st.st_mode):04o}): {fifo}",
                           f"keep {what} in a folder only root can write (as /var/lib/slurm-horus)"
                           if st.st_mode & stat.S_ISVTX else f"chmod go-w {folder}"))
    return out


def _is_horus_hook(code: str) -> bool:
    return "slurm_job_submit" in code and "horus" in code


def _trusted(path: Path, what: str, sticky_ok: bool = False) -> list[Problem]:
    """A file or folder slurm-horus trusts must be root's and not writable by group or others.
    ``sticky_ok`` only for a folder above the one that holds it (as /tmp above a registry): in
    the holding folder itself the sticky bit stops no one making a name (a ledger's -wal
    journal, a registry's current.json, a gres.conf beside the hook)."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return []  # none there: what must exist is checked where it is needed
    except OSError as e:  # a folder on the way this user cannot search: unchecked, not sound
        return [Problem(f"{what} {path} was not checked: {e.strerror}", "run horus-admin doctor as root")]
    out = []
    why = untrusted(st, (0,), sticky_ok=sticky_ok)
    if NOT_OWNER in why:
        out.append(Problem(f"{what} {path} is owned by uid {st.st_uid}, not root",
                           f"chown root {path}"))
    if WRITABLE in why:
        out.append(Problem(f"{what} {path} is writable by group or others "
                           f"(mode {stat.S_IMODE(st.st_mode):04o})",
                           f"use a folder only root can write instead of {path} (as "
                           "/var/lib/slurm-horus)" if st.st_mode & stat.S_ISVTX  # /tmp: not to chmod
                           else f"chmod go-w {path}"))
    return out


def check_slurm_user_reads(conf: SlurmConf, paths: dict[str, str | Path | None]) -> list[Problem]:
    """slurmctld runs as SlurmUser and reads the hook's files as that user: one it cannot read
    makes the hook run on its built-in defaults (a policy with no GPU types shares nothing;
    no claim record, no pressure) while root's view of the files says nothing is wrong."""
    from slurm_horus.ledger.claims import may_read, owner_ids

    name = (conf.settings.get("slurmuser") or "root").strip()
    uid, gids = owner_ids(name)
    if uid is None:
        return [Problem(f"SlurmUser={name} is no user on this host", "set SlurmUser to slurmctld's user")]
    if uid == 0:
        return []

    def readable(p: Path) -> bool:
        try:
            p = p.resolve()
            return may_read(str(p), os.stat(p), uid, gids)
        except OSError:
            return True  # missing: the checks of each file say what that means
    return [Problem(f"{what} {p} cannot be read by SlurmUser {name}, whom slurmctld runs the "
                    "hook as", f"chmod o+r {p} (and o+x on its folders), or give it SlurmUser's group")
            for what, p in paths.items() if p and not readable(Path(p))]


def check_probe_reaches_ledger(conf: SlurmConf, url: str, gres_conf: str | None) -> list[Problem]:
    """The root probe in each GPU node's Prolog writes the ledger: a SQLite file serves only
    nodes on its own host (the controller's), and another node's records stay in its local
    spool, which no sync collects (where Slurm has no GPU accounting, AutoDetect=nvml, the
    only measurements)."""
    import socket

    from slurm_horus.ledger.db import sqlite_file
    from slurm_horus.slurm.parse import expand_hostlist

    if sqlite_file(url) is None or not _runs(conf.settings.get("prolog"), "horus-prolog", conf.path.parent) \
            or re.search(r"(?im)^[^#]*\bautodetect\s*=\s*nvml", gres_conf or ""):
        return []
    ctld = re.split(r"[(,\s]", (conf.settings.get("slurmctldhost") or conf.settings.get("controlmachine") or ""))[0]
    # the ledger's host: the controller's (the last SlurmctldHost line read may be a backup's),
    # where doctor runs (on the controller, as sync), and this host's own names
    here = {h.split(".")[0].lower() for h in (ctld, socket.gethostname(), "localhost", "127.0.0.1") if h}
    away = []
    for node in conf.nodes:
        if "gpu" not in (node.get("gres") or "") or (node.get("nodeaddr") or "").lower() in here:
            continue
        try:
            hosts = expand_hostlist(node.get("nodehostname") or node.get("nodename") or "")
        except HorusError:
            continue
        away += [h for h in hosts if h.split(".")[0].lower() not in here]
    if not ctld or not away:
        return []
    return [Problem(f"the ledger is a SQLite file, but the probe on GPU nodes away from the "
                    f"controller {ctld} ({', '.join(away[:3])}{', ...' if len(away) > 3 else ''}) "
                    "cannot write it: their measurements stay in each node's spool",
                    "use a MariaDB ledger the GPU nodes reach (HORUS_LEDGER_URL in their "
                    "/etc/slurm-horus/admin.env); docs/admin-guide.md, which host runs what")]


def check_ledger(url: str) -> list[Problem]:
    """The ledger opens and reads at this version (a SQLite file not made yet is not a problem:
    the first sync makes it); a SQLite ledger, its folder and the readers' copy beside it are
    written by root only (usage rows count as measured), and users cannot read the live file
    (one holding a read transaction on it stops every write)."""
    from slurm_horus.ledger.db import make_engine, mask_url, sqlite_file
    from slurm_horus.ledger.extracts import readers_copy
    from slurm_horus.ledger.migrate import check_readable

    out: list[Problem] = []
    db = sqlite_file(url)
    if db is not None and not db.is_absolute():
        return [Problem(f"the ledger {url} is a relative path: each command would find (or make) "
                        "its own under the folder it runs in",
                        f"give the absolute path: sqlite:////{str(db).lstrip('/')}")]
    if db is not None:
        out += _trusted(db.parent, "the ledger folder") if db.parent.exists() else []
        for d in db.parent.resolve().parents:  # whoever may rename one swaps the ledger for theirs
            out += _trusted(d, "a folder above the ledger", sticky_ok=True)
        out += _trusted(db, "the ledger")
        for side, what in _sqlite_side_files(db):  # a hot journal a user wrote is rolled into the ledger
            out += _trusted(side, what)
        out += _trusted(readers_copy(db), "the readers' copy of the ledger")
        if out or not db.exists():
            return out  # one problem at a time: who may write it first
        if os.geteuid() != 0 and not os.access(db, os.R_OK):
            # root's alone, as it should be, so unchecked: no answer must read as a sound ledger
            return [Problem(f"the ledger {db} was not checked (its schema, whether it opens): "
                            "this user cannot read it", "run horus-admin doctor as root")]
    try:
        engine = make_engine(url, busy_timeout=5.0, readonly=True)
        try:
            with engine.connect() as conn:
                check_readable(conn, url)
        finally:
            engine.dispose()
    except Exception as e:  # noqa: BLE001 - what is wrong is the finding, not a crash
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not isinstance(e, HorusError):
            msg = f"ledger {mask_url(url)}: {msg[:200]}"
        out.append(Problem(f"cannot read the ledger: {msg}",
                           "check ledger_url in /etc/slurm-horus/horus.conf or $HORUS_LEDGER_URL; "
                           "horus-admin sync (as root) creates and migrates it"))
    if not out and db is not None:
        out += check_ledger_readers(db)
    return out


def _sqlite_side_files(db: Path) -> list[tuple[Path, str]]:
    """The files SQLite keeps beside ``db`` (a rollback journal a killed write left; -wal and
    -shm where something opened it in WAL mode), each named as doctor says it: each holds pages
    of the ledger."""
    return [(db.with_name(db.name + suffix), f"SQLite's {suffix} file beside the ledger")
            for suffix in ("-journal", "-wal", "-shm")]


def check_ledger_readers(db: Path) -> list[Problem]:
    """Who may read a SQLite ledger (root's: checked before) and the files SQLite keeps beside
    it.  It holds every user's jobs, which users see only through what hacct reads (the readers'
    copy or their own extract), and a reader holding a read transaction on it stops every write:
    root:root 0640, as each sync sets it.  A group other than root's (gid 0) is taken as one of
    ordinary users, as for the folders users' files are written under; a -journal, -wal or -shm
    file may let no more read it than the ledger does (0640 at most)."""
    from slurm_horus.ledger.extracts import readers_copy

    st = db.stat()
    mode = stat.S_IMODE(st.st_mode)
    out = []
    if mode & 0o004:
        out.append(Problem(f"the ledger {db} is readable by others: a user holding a read "
                           "transaction on it stops every sync and probe write",
                           f"chmod 0640 {db} (horus-admin sync does, and publishes "
                           f"{readers_copy(db).name} or users' extracts for hacct)"))
    out += _group_readers(db, "the ledger", st, "every user's jobs, which users see only through "
                          "hacct's own copies, and one holding a read transaction stops every sync "
                          "and probe write", "horus-admin sync does")
    allowed = mode & 0o640
    for side, what in _sqlite_side_files(db):
        try:
            side_st = side.stat()
        except FileNotFoundError:
            continue
        side_mode = stat.S_IMODE(side_st.st_mode)
        if side_mode & 0o777 & ~allowed:
            out.append(Problem(f"{what} {side} is mode {side_mode:04o}, wider than {allowed:04o} (the "
                               "ledger's, at most 0640): it holds pages of the ledger, every user's jobs",
                               f"chmod {allowed:04o} {side}"))
        out += _group_readers(side, what, side_st, "pages of the ledger, every user's jobs",
                              "as the ledger's")
    return out


def _group_readers(path: Path, what: str, st: os.stat_result, holds: str, note: str) -> list[Problem]:
    """``path`` (of stat ``st``, which ``holds``) readable by a group other than root's."""
    import grp

    if not st.st_mode & 0o040 or st.st_gid == 0:
        return []
    try:
        group = f"{grp.getgrgid(st.st_gid).gr_name} (gid {st.st_gid})"
    except KeyError:
        group = f"gid {st.st_gid}"
    return [Problem(f"{what} {path} is readable by group {group}, not root's: its members read "
                    f"{holds}", f"chgrp root {path} ({note})")]


def _policy_bytes(pol: Path) -> bytes | None:
    """The policy file as the hook reads it: at most one byte past its limit (over it, the hook
    ignores the whole file); None when it cannot be read."""
    from slurm_horus.slurm.policy import POLICY_MAX_BYTES

    try:
        with open(pol, "rb") as f:
            return f.read(POLICY_MAX_BYTES + 1)
    except OSError:
        return None


def check_policy_known_to_hook(pol: Path, hook: Path) -> list[Problem]:
    """Policy keys the installed hook's code never names: check_policy_lines judges the policy
    by this package's rules, but slurmctld runs the hook that is installed, and an older one
    ignores a newer key (an upgrade that left the old hook in place). Keys the package's rules
    refuse are check_policy_lines' findings."""
    from slurm_horus.slurm.policy import accepted_policy_keys

    data, code = _policy_bytes(pol), _small_text(hook)
    if data is None or code is None or not _is_horus_hook(code):
        return []  # no hook, or not slurm-horus's: check_hook says so
    out = []
    for key in accepted_policy_keys(data.decode("utf-8", "surrogateescape")):
        name = "mem_mib" if re.fullmatch(r"gpu\.[^.]+\.mem_mib", key) else key
        if name not in code:
            out.append(Problem(f"policy key {key} is unknown to the installed hook {hook}: it "
                               "ignores that line (a hook older than this package?)",
                               f"install {_packaged('job_submit.lua')} as {hook}"))
    return out


# what the hook says of keys that contradict each other (its parse_policy), which no line alone shows
_CROSS_KEY = re.compile(r"policy: (\w+: larger than shards_per_gpu|type_(?:order|features): \S+ has no "
                        r"gpu\.\S+\.mem_mib)")


def check_policy_cross_keys(pol: Path, hook: Path) -> list[Problem]:
    """Keys the hook drops for what other keys say (a type_order type with no memory, shards
    beyond shards_per_gpu): the hook itself reads the policy, and only slurmctld's log said so."""
    from slurm_horus.slurm.policy import decide

    try:
        d = decide({"comment": "horus:v1;doctor=1/1/1", "tres_per_node": "gres:gpu:1"},
                   policy_path=pol, hook_path=hook if hook.is_file() else None, submit_uid=0)
    except (HorusError, OSError, ImportError):
        return []  # no hook to run: check_hook says so
    said = dict.fromkeys(m.group(1) for _, msg in d.log if (m := _CROSS_KEY.search(msg)))
    return [Problem(f"policy {pol}: {w}: the hook ignores it",
                    "give the type its gpu.<type>.mem_mib (or drop it), and keep pressure_shards and "
                    "min_shards within shards_per_gpu") for w in said]


def check_policy_lines(pol: Path) -> list[Problem]:
    """Lines of the policy the hook ignores (it logs them in slurmctld's log only), and a file
    too large for it to read at all."""
    from slurm_horus.slurm.policy import POLICY_MAX_BYTES, ignored_policy_lines, policy_fails_closed

    text = _policy_bytes(pol)
    if text is None:
        return []
    if len(text) > POLICY_MAX_BYTES:
        return [Problem(f"policy {pol} is over {POLICY_MAX_BYTES} bytes: the hook ignores all of it "
                        "(raw_shards = whole)", "shorten it (comments count)")]
    body = text.decode("utf-8", "surrogateescape")
    ignored = ignored_policy_lines(body)
    out = [Problem(f"policy {pol} line {n}: {key} = {value[:60]!r} is ignored by the hook (an "
                   "unknown key or a value it does not accept"
                   + ("; raw shard requests become whole GPUs" if key == "raw_shards" else "") + ")" if key else
                   f"policy {pol} line {n}: {value[:60]!r} is not a 'key = value' line: the hook "
                   "ignores it",
                   "correct it; docs/hint-and-policy.md lists each key's values")
           for n, key, value in ignored]
    if policy_fails_closed(body):
        out.append(Problem(f"policy {pol} has no raw_shards line and lines the hook cannot take: it "
                           "turns raw shard requests into whole GPUs (raw_shards = whole)",
                           "correct those lines, or set raw_shards"))
    return out


def check_pressure_keys(pol: Path) -> list[Problem]:
    """slowdown_bound, slowdown_tail and pack_heavy = always act only through horus-admin
    queue's pressure file."""
    from slurm_horus.slurm.policy import policy_value

    if policy_value("pressure_file", "", pol):
        return []
    bound = policy_value("slowdown_bound", None, pol)
    tail = policy_value("slowdown_tail", None, pol)
    keys = []
    if bound is not None or tail is not None:
        keys.append(f"slowdown_bound = {bound or '2'} ({tail or 'median'} job)")
    if policy_value("pack_heavy", "pressure", pol) == "always":
        keys.append("pack_heavy = always")
    if not keys:
        return []
    return [Problem(f"policy sets {' and '.join(keys)} but no pressure_file: they govern packing "
                    "under queue pressure, which horus-admin queue signals in that file (the hook "
                    "packs only while it is fresh)",
                    "set pressure_file = /var/lib/slurm-horus/pressure and run horus-admin "
                    "queue (etc/horus-queue.timer)")]


def check_slowdown_bound(pol: Path) -> list[Problem]:
    """A slowdown_bound below what the worst partner costs even an idle job packs nothing."""
    from slurm_horus.ledger.requeue import policy_util_limit
    from slurm_horus.slurm.policy import policy_value

    bound = policy_value("slowdown_bound", None, pol)
    tail = policy_value("slowdown_tail", None, pol)
    if (bound is None and tail is None) or not policy_value("pressure_file", "", pol):
        return []
    if policy_util_limit(policy_path=str(pol)) <= 0.0:
        return [Problem(f"slowdown_bound = {bound or '2'} for the {tail or 'median'} job lets no job "
                        "pack under queue pressure (a partner at 100 % slows even an idle job more)",
                        "raise slowdown_bound or take slowdown_tail nearer the median (1.5 for the "
                        "median job packs jobs up to 82 % predicted utilization; horus-admin queue "
                        "--dry-run prints the limit)")]
    return []


def check_pack_heavy(conf: SlurmConf, pol: Path, version: tuple[int, int] | None) -> list[Problem]:
    """pack_heavy = always gives heavy jobs shards on every type; only Slurm's least-loaded shard
    placement (23.11+) then keeps them on idle GPUs while there are some (first fit would pack
    them beside other jobs at once)."""
    from slurm_horus.slurm.policy import policy_value

    if policy_value("pack_heavy", "pressure", pol) != "always":
        return []
    old = version is not None and version < (23, 11)
    if "ll_shared_gres" in _words(conf.settings.get("selecttypeparameters")) and not old:
        return []
    why = ("LL_SHARED_GRES needs Slurm 23.11+" if old else "no LL_SHARED_GRES in SelectTypeParameters")
    return [Problem("policy sets pack_heavy = always but Slurm places shard jobs first fit "
                    f"({why}): heavy jobs share a GPU while others sit idle",
                    ("upgrade Slurm to 23.11+ for LL_SHARED_GRES, or " if old else
                     "add LL_SHARED_GRES to SelectTypeParameters, or ") + "set pack_heavy = pressure")]


def check_registry(root: Path) -> list[Problem]:
    """The model registry serves every user: root's, not group/other-writable, and its serving
    state readable (else every hsubmit warns and falls back to the cold start)."""
    from slurm_horus.predict.registry import Registry

    if root.exists() and not root.is_dir():
        return [Problem(f"the model registry {root} is not a folder",
                        "point $HORUS_MODEL_DIR at the registry folder (default /var/lib/slurm-horus/models)")]
    if not root.is_dir():
        return []
    out = _trusted(root, "the model registry")
    for d in root.resolve().parents:  # hsubmit trusts no file beneath a folder others may write
        out += _trusted(d, "a folder above the model registry", sticky_ok=True)
    for f in sorted(root.glob("*.json")):
        if f.is_symlink():  # hsubmit refuses it (it could serve a file no check covers)
            out.append(Problem(f"the model registry file {f} is a symlink: hsubmit refuses it",
                               f"replace {f} with the file itself (or retrain)"))
        else:
            out += _trusted(f, "the model registry file")
    if out:
        return out  # it refuses what others could write anyway
    try:
        Registry(root).state()
    except HorusError as e:
        out.append(Problem(f"the model registry cannot be served: {e}",
                           "horus-admin models rollback, or retrain (as root)"))
    return out


def diagnose(slurm_conf: str | os.PathLike, *, policy: str | os.PathLike | None = None,
             ledger_url: str | None = None, model_dir: str | os.PathLike | None = None,
             version_text: str | None = None) -> list[Problem]:
    """Every problem found. ``version_text``: the Slurm version (``25.11.7``; None: unknown)."""
    from slurm_horus.ledger import default_url
    from slurm_horus.slurm.policy import DEFAULT_RECORD, declared_type_features, policy_file, policy_value
    from slurm_horus.predict.registry import default_dir

    path = Path(slurm_conf)
    conf = read_slurm_conf(path)
    gres_path = path.parent / "gres.conf"
    gres_conf = _small_text(gres_path)
    pol = policy_file(policy, hook_path=path.parent / "job_submit.lua")
    out = check_version(version_text) + check_slurm_conf(conf)
    unreadable = check_regular_files({"the hook": path.parent / "job_submit.lua", "the policy": pol})
    if unreadable:
        return out + unreadable  # reading them would wait as slurmctld does
    out += check_hook(path.parent)
    if not pol.is_file():
        out.append(Problem(f"policy {pol} is missing: the hook uses its built-in defaults",
                           f"install {_packaged('horus_policy.conf')} as {pol}"))
    else:
        out += (_trusted(pol.resolve(), "the policy") + check_policy_lines(pol)
                + check_policy_known_to_hook(pol, path.parent / "job_submit.lua")
                + check_policy_cross_keys(pol, path.parent / "job_submit.lua"))
    out += check_hook_file_folder(pol, "the policy")
    spg = int(policy_value("shards_per_gpu", "100", pol))
    type_via = policy_value("type_via", "features", pol)
    mem_mib = {t: v for t in _policy_gpu_types(pol) if (v := policy_value(f"gpu.{t}.mem_mib", None, pol))}
    declared = declared_type_features(pol)
    out += check_nodes(conf, gres_conf, spg, type_via, set(mem_mib), declared)
    out += check_gpu_memory(mem_mib)
    hook_files = {"the claim record (record_file)":
                  policy_value("record_file", DEFAULT_RECORD, pol),
                  "the pressure file (pressure_file)": policy_value("pressure_file", "", pol)}
    out += check_regular_files(hook_files)
    for what, p in hook_files.items():  # the hook believes them: whoever writes them sets policy
        if p:
            out += _trusted(Path(p), what) + check_hook_file_folder(p, what)
    out += check_slurm_user_reads(conf, {"the hook": path.parent / "job_submit.lua", "the policy": pol,
                                         **hook_files})
    out += check_pressure_keys(pol) + check_slowdown_bound(pol)
    out += check_pack_heavy(conf, pol, parse_version(version_text or ""))
    out += check_ledger(ledger_url or default_url())
    out += check_probe_reaches_ledger(conf, ledger_url or default_url(), gres_conf)
    out += check_registry(Path(model_dir) if model_dir else default_dir())
    out += check_site_settings()
    return out


def check_site_settings(env: dict[str, str] | None = None) -> list[Problem]:
    """horus.conf's on_prediction_error is submit or refuse: a misspelt 'refuse' submits every
    job whose model cannot be read, while the admin believes they are refused (the users'
    environment variable is theirs, not the site's: not read here); its keys are ones a
    command reads; HORUS_SLURM_BACKEND, where set, names a backend that works; and only root
    may write it or make it in its folder: root's sync, probe and queue take their ledger from
    its ledger_url, so whoever writes it points them at a ledger of their own."""
    from slurm_horus.siteconf import CONF_PATH, ENV_CONF, SITE_KEYS, unknown_site_keys
    from slurm_horus.slurm.commands import BACKENDS, backend
    from slurm_horus.slurm.submit import on_prediction_error_problem

    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "HORUS_ON_PREDICTION_ERROR"}
    conf = env.get(ENV_CONF) or CONF_PATH
    problem = on_prediction_error_problem(env)
    out = [Problem(problem, f"write on_prediction_error = refuse (or submit) in {conf}")] if problem else []
    out += (_trusted(Path(conf), "the site settings")
            + _trusted(Path(conf).resolve().parent, "the folder of the site settings"))
    out += [Problem(f"{conf} line {n}: {key!r} is no setting: nothing reads it (a misspelt key leaves "
                    "its default in force)", f"the settings are {', '.join(SITE_KEYS)}")
            for n, key in unknown_site_keys(env)]
    want = (env.get("HORUS_SLURM_BACKEND") or "").strip().lower()
    if want and want != "cli":  # the admin's own choice (auto falls back to cli by itself)
        try:
            if want not in (*BACKENDS, "auto"):
                raise HorusError(f"HORUS_SLURM_BACKEND={want}: need cli, pyslurm or auto")
            if want == "pyslurm" and want == (os.environ.get("HORUS_SLURM_BACKEND") or "").strip().lower():
                backend()  # pyslurm built for another Slurm, or none
        except HorusError as e:
            out.append(Problem(f"{e}: every command run so fails, and hsubmit submits without a hint",
                               "unset HORUS_SLURM_BACKEND (or set it to cli)"))
    return out


def check_gpu_memory(mem_mib: dict[str, str]) -> list[Problem]:
    """The policy's gpu.TYPE.mem_mib against the GPU catalog: more than a GPU of that name has
    packs jobs into memory it lacks (a T4 given an A100's 80 GiB)."""
    from slurm_horus.predict.gpus import default_catalog

    try:
        cat, out = default_catalog(), []
    except HorusError as e:  # every prediction and sync stops on it: the finding, not a crash
        return [Problem(f"the GPU catalog cannot be read: {e}",
                        "correct or remove /etc/slurm-horus/gpus.json (or $HORUS_GPU_CATALOG)")]
    for t, value in sorted(mem_mib.items()):
        # every model the name may stand for (a100: 40 and 80 GB): the largest of them
        models = [g for g in cat if g.name == t or g.name.startswith(t + "-") or t in g.aliases]
        most = max((g.mem_mib for g in models), default=None)
        # twice the most: a model the catalog lacks (a GH200 of 144 GB) is no problem, a T4
        # given an A100's 80 GiB is
        if most and int(value) > 2 * most:
            out.append(Problem(f"policy gpu.{t}.mem_mib = {value} is over twice what a {t} has "
                               f"({most} MiB in the GPU catalog): jobs would be packed into "
                               "memory it lacks", f"set gpu.{t}.mem_mib to what nvidia-smi "
                               "reports (a model the catalog lacks: add it, $HORUS_GPU_CATALOG)"))
    return out


def _policy_gpu_types(pol: Path) -> set[str]:
    data = _policy_bytes(pol)
    if data is None:
        return set()
    text = data.decode("utf-8", "replace")
    return set(re.findall(r"^\s*gpu\.([a-z0-9_\-]{1,32})\.mem_mib\s*=", text, re.M))


def slurm_version_text() -> str | None:
    """The running Slurm's ``X.Y.Z`` (None when its tools are not on PATH)."""
    from slurm_horus.slurm import commands as slurm

    try:
        return slurm.slurm_version()
    except HorusError:
        return None
