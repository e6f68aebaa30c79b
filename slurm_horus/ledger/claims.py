"""What a finished job's comment claims, checked as the admin: its submission row.

The hint and the workload token are the user's words; the features (and the cold-start figures
retraining starts from) are recomputed here from the model file the job names, and only when
the job's owner could read that file and its sha256 is the one claimed: sync runs as root, and
must not read for a user what the user could not.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import stat
import time

from slurm_horus.graph.features import extract_features
from slurm_horus.graph.limits import confined
from slurm_horus.graph.load import MAX_PROTO_BYTES
from slurm_horus.predict.coldstart import ColdStartEstimator
from slurm_horus.predict.gpus import default_catalog
from slurm_horus.predict.workload import workload_from
from slurm_horus.slurm.hint import BOUND_NAMES

HASH_BUDGET_BYTES = 64 << 30  # what one sync may read of users' model files to check their sha256
# what one sync may spend analysing one user's graphs (each analysis: graph.limits' 60 s at most);
# a user who varies the batch size of a slow graph job after job must not hold the sync for hours
USER_ANALYSIS_BUDGET_S = 300.0


def submission_of(j: dict, hint_token: str | None, hint: dict | None, claim: dict | None,
                  models: "ModelFeatures") -> dict:
    """The submission row of a finished job: Slurm's facts, the comment's claims (predictor
    "hint"), the hook's decision, and features only where ``models`` could recompute them."""
    uid, gids = owner_ids(j["user"])
    preds = {g: {"util_pct": v[0], "mem_mib": v[1], "predictor": "hint",
                 **{f"mem_mib_{b}": x for b, x in zip(BOUND_NAMES, v[2:])}}
             for g, v in (hint or {}).items()}
    rec = {"job_id": j["job_id"], "cluster": j["cluster"], "user": j["user"], "uid": uid,
           "account": j["account"], "submit_time": j["submit_time"], "hint": hint_token,
           "policy_decision": j.get("admin_comment"), "gpu_types": sorted(preds) or None,
           "predictions": preds, "predictor": "hint" if preds else None,
           "model_path": None, "model_sha256": None, "workload": None, "features": None,
           "feature_version": None}
    if not claim:
        return rec
    # the CPUs and GPUs Slurm allocated (accounting's facts, not the user's claims; a job on
    # shards ran on one GPU, as it asked hsubmit for one): the learned model's CPUs-per-GPU
    # input is read from them (predict.workload.cpus_per_gpu)
    gpus = j.get("gpus") or (1 if j.get("shards") else None)
    workload = {"batch_size": claim.get("bs", 1), "task": claim.get("task", "train"),
                "optimizer": claim.get("opt", "adam"), "precision": claim.get("prec", "fp32"),
                "cpus": j.get("cpus"), "gpus": gpus, "dims": claim.get("dims", {})}
    rec.update(model_path=claim.get("model"), model_sha256=claim["sha"], workload=workload)
    report = models.get(claim, workload, uid, gids)
    if report is not None:
        rec.update(features=report.values, feature_version=report.version)
        for g, d in preds.items():
            cold = models.cold(report, workload, g)
            if cold:
                d["cold"] = cold
    return rec


def owner_ids(user: str | None) -> tuple[int | None, set[int]]:
    """(uid, group ids) of a user name, from the name service; (None, set()) if unknown."""
    try:
        pw = pwd.getpwnam(user or "")
    except KeyError:
        return None, set()
    try:
        gids = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        gids = {pw.pw_gid}
    return pw.pw_uid, gids


# file systems whose "files" a user can make answer slowly, never, or with an error on read: their
# own FUSE daemon, and the kernel's views (/proc, /sys, ...), whose regular files are not graphs
# (/sys/class/net/lo/speed fails every read with EINVAL)
NOT_FILES_MAGIC = frozenset({
    0x65735546,  # fuse
    0x9FA0,  # proc
    0x62656572,  # sysfs
    0x64626720,  # debugfs
    0x74726163,  # tracefs
    0x73636673,  # securityfs
    0x62656570,  # configfs
    0x63677270,  # cgroup2
    0x27E0EB,  # cgroup
    0xCAFE4A11,  # bpf
    0xDE5E81E4,  # efivarfs
    0x6165676C,  # pstore
})


def _not_files(fd: int) -> bool:
    """Whether the fd's file system is one of NOT_FILES_MAGIC (statfs's f_type; False where it
    cannot be told)."""
    import ctypes
    import struct

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first word
        if libc.fstatfs(fd, buf) != 0:
            return False
        return struct.unpack_from("l", buf.raw)[0] in NOT_FILES_MAGIC
    except (OSError, AttributeError):
        return False


def _open_regular(path: str) -> int | None:
    """An fd on ``path`` if it is a regular file on a file system of files (_not_files: never
    FUSE, /proc or /sys; never waiting on a FIFO, never making a terminal ours), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode) and not _not_files(fd):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def open_as_owner(path: str, uid: int | None, gids: set[int]) -> int | None:
    """An fd on the regular file ``path`` if ``uid`` (in ``gids``) could open it, else None.

    As root: opened with the user's effective uid and groups for the one call, so the kernel
    judges (mode bits, ACLs, every folder's search bit, /proc's links into other users'
    processes and mounts); the process is single-threaded where this runs (sync, the queue
    loop).  Not root (the loop as SlurmUser): opened as ourselves, and kept only if the user's
    mode bits on the file and its folders allow it too."""
    if uid is None or not os.path.isabs(path):
        return None
    if os.geteuid() != 0:
        return _open_checked(path, uid, gids)
    if uid == 0:
        return _open_regular(path)
    groups, egid = os.getgroups(), os.getegid()
    primary, owner_groups = _credentials(gids)
    try:
        os.setgroups(owner_groups)
        os.setegid(primary)
        os.seteuid(uid)
        try:
            return _open_regular(path)
        finally:
            os.seteuid(0)
    except OSError:
        return None
    finally:
        os.setegid(egid)
        os.setgroups(groups)


def _credentials(gids: set[int]) -> tuple[int, list[int]]:
    """(gid, groups) that act for a user in ``gids``: each of them grants alike (the kernel's
    group checks look at the effective gid and the groups both), nobody's where none."""
    return (min(gids) if gids else 65534), (sorted(gids) or [65534])


def _may(st: os.stat_result, uid: int, gids: set[int], bit: int) -> bool:
    """Would ``uid`` (in ``gids``) get permission ``bit`` (4 read, 1 search) by mode bits?"""
    if st.st_uid == uid:
        return bool(st.st_mode & (bit << 6))
    if st.st_gid in gids:
        return bool(st.st_mode & (bit << 3))
    return bool(st.st_mode & bit)


def may_read(path: str, st: os.stat_result, uid: int, gids: set[int]) -> bool:
    """Would ``uid`` read the file at the resolved ``path`` (its stat ``st``) by mode bits: read
    on it, search on every folder above it.  OSError where a folder cannot be looked at."""
    if not _may(st, uid, gids, 4):
        return False
    parent = os.path.dirname(path)
    while True:
        if not _may(os.stat(parent), uid, gids, 1):
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


def _open_checked(path: str, uid: int, gids: set[int]) -> int | None:
    """Opened as ourselves, kept if ``uid``'s mode bits allow it (the file, each folder)."""
    fd = _open_regular(path)
    if fd is None or uid == os.geteuid():
        return fd
    try:
        ok = may_read(os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd), uid, gids)
    except OSError:
        ok = False
    if not ok:
        os.close(fd)
        return None
    return fd


class ModelFeatures:
    """Features and cold-start figures of the model a job claims, computed as the admin from
    the file only when the job's owner can read it and its sha256 is the claimed one; cached
    by (sha, workload) for one sync.  A user names the file, so what is read is bounded: no
    file larger than an ONNX graph can be, and per user and sync at most ``hash_budget`` bytes
    read and ``user_budget_s`` seconds of reading and analysis: what one user's files cost
    spends their own budget, never another user's."""
    def __init__(self, hash_budget: int = HASH_BUDGET_BYTES,
                 user_budget_s: float = USER_ANALYSIS_BUDGET_S):
        self.hash_budget = hash_budget
        self.user_budget_s = user_budget_s
        self._read: dict[int | None, int] = {}
        self._spent: dict[int | None, float] = {}
        self._sha: dict[tuple, str | None] = {}
        self._found: dict[tuple, object] = {}
        self._cold: dict[tuple, dict | None] = {}

    def get(self, claim: dict, workload: dict, uid: int | None, gids: set[int]):
        """The FeatureReport, or None."""
        fd = open_as_owner(claim.get("model") or "", uid, gids)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if ident not in self._sha:
                read = self._read.get(uid, 0) + st.st_size
                if st.st_size > MAX_PROTO_BYTES or read > self.hash_budget \
                        or self._spent.get(uid, 0.0) >= self.user_budget_s:
                    return None  # not a graph, or this user's share of the sync is spent
                self._read[uid] = read
                t0 = time.monotonic()
                try:
                    self._sha[ident] = _sha256(fd, st.st_size)
                except OSError:  # a file whose read fails is no graph: that job's features only
                    self._sha[ident] = None
                self._spent[uid] = self._spent.get(uid, 0.0) + time.monotonic() - t0
            if self._sha[ident] != claim["sha"]:
                return None
            key = (claim["sha"], json.dumps(workload, sort_keys=True))
            if key not in self._found:
                if self._spent.get(uid, 0.0) >= self.user_budget_s:
                    return None  # this user's share of the sync is spent (not cached: theirs only)
                t0 = time.monotonic()
                # the analysis child keeps the file's fd alone and runs as the job's user (who
                # opened it): ONNX's parser meets the user's bytes with their rights, never root's
                with confined([fd], uid, *_credentials(gids)):
                    self._found[key] = _features(f"/proc/self/fd/{fd}", claim["sha"], workload)
                self._spent[uid] = self._spent.get(uid, 0.0) + time.monotonic() - t0
            return self._found[key]
        finally:
            os.close(fd)

    def cold(self, report, workload: dict, gtype: str) -> dict | None:
        """The cold-start figures retraining takes as inputs, for a GPU type the catalog knows."""

        key = (report.sha256, json.dumps(workload, sort_keys=True), gtype)
        if key not in self._cold:
            gpu = default_catalog().find(gtype)
            try:  # the workload is the user's claim (bf16 on a T4 ...): none, never a failed sync
                c = ColdStartEstimator().predict(report, gpu, workload_from(workload)) if gpu else None
            except Exception:
                c = None
            self._cold[key] = c and {
                "util_pct": c.util_pct, "mem_mib": c.mem_mib,
                "gpu_ms_per_step": c.breakdown.get("gpu_ms_per_step", 0.0),
                "host_ms_per_step": c.breakdown.get("host_ms_per_step", 0.0)}
        return self._cold[key]


def _sha256(fd: int, size: int) -> str | None:
    """The sha256 of the file's first ``size`` bytes (its size when checked); None when it has
    more by now (it grew under us: a user can make it endless)."""
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    left = size
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        h.update(chunk)
        left -= len(chunk)
    return None if left or os.read(fd, 1) else h.hexdigest()


def _features(path: str, sha: str, workload: dict):
    """The model's FeatureReport; None if it does not load, has unbound dimensions, or
    changed under us."""
    try:
        report = extract_features(path, batch_size=workload_from(workload).batch_size,
                                  dims=workload["dims"])
    except Exception:  # any file the user names: a bad one gives no features, never a failure
        return None
    return report if report.sha256 == sha and not report.unknown_dims else None
