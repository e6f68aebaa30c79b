"""horus-admin queue, review 9: a failed job's error file on a hung mount, and a pass killed
between a pack's reshape and its mark."""

import json
import os
import time

import pytest

from slurm_horus.ledger import requeue
from slurm_horus.ledger.requeue import journal_read, oom_actions, pressure_actions, read_error_tail, tend
from slurm_horus.slurm.accounting import scheduler_actions
from slurm_horus.slurm.parse import parse_gres

EXCL = "horus: exclusive a100 (util 95% >= 70%) horus-decision:v1;action=exclusive;type=a100;reason=util"
SHARED = "horus: shared a100 shards=30/100 horus-decision:v1;action=shared;type=a100;shards=30/100"
BUSY = "NodeName=n1 State=MIXED Gres=gpu:a100:4,shard:a100:400 GresUsed=gpu:a100:4(IDX:0-3)\n"
IDLE = "NodeName=n1 State=IDLE Gres=gpu:a100:4,shard:a100:400 GresUsed=\n"
START = 1_796_071_199


class _Cluster:
    """requeue.run over one job, kept as Slurm 25.11 would: squeue --json from ``job``, its
    scontrol updates applied to it (TresPerNode also to what it will be allocated), the node
    ``nodes`` (BUSY or IDLE); ``crash_on(args)`` True raises _Killed there, as SIGKILL would
    end the pass (no cleanup of the pass's own runs)."""

    def __init__(self, job, nodes, err=None):
        self.job, self.nodes, self.err, self.crash_on = job, nodes, err, lambda args: False

    def __call__(self, args, timeout=30):
        if args[0] == "squeue":
            return json.dumps({"jobs": [self.job]})
        if args[:3] == ["scontrol", "-d", "show"]:
            return self.nodes
        if args[:3] == ["scontrol", "show", "job"]:
            return f"JobId={args[3]} StdErr={self.err}\n"
        if self.crash_on(args):
            raise _Killed
        if args[:2] == ["scontrol", "update"]:
            for field in args[3:]:
                key, value = field.split("=", 1)
                if key == "TresPerNode":
                    self.job["tres_per_node"] = value
                    self.job["tres_req_str"] = ",".join(f"gres/{g['name']}={g['count']}" for g in parse_gres(value))
                elif key == "AdminComment":
                    self.job["admin_comment"] = value
        return ""


class _Killed(BaseException):
    """The pass ends here, as under SIGKILL: no handler of the pass's runs."""


def _setup(monkeypatch, tmp_path, job, nodes, err=None):
    (tmp_path / "policy.conf").write_text("gpu.a100.mem_mib = 40960\n")
    monkeypatch.setenv("HORUS_POLICY", str(tmp_path / "policy.conf"))
    monkeypatch.setattr(requeue, "slurm_version", lambda fresh=False: "25.11.7")
    cluster = _Cluster(job, nodes, err)
    monkeypatch.setattr(requeue, "run", cluster)
    return cluster


def _failed_oom_job():
    return {"job_id": 1795, "job_state": ["FAILED"], "user_name": "root", "user_id": 0,
            "tres_per_node": "gres/shard:30", "admin_comment": SHARED, "requeue": True, "batch_flag": True,
            "start_time": {"set": True, "infinite": False, "number": START}}


def test_an_error_file_on_a_hung_mount_costs_one_bounded_wait(monkeypatch, tmp_path):
    """A failed job's error file on a hung NFS mount blocked the pass until systemd's
    TimeoutStartSec killed it, and the next pass met the same file and hung again: the read is
    waited for ERROR_READ_TIMEOUT_S, the job taken as no evidence of an OOM, said once, and its
    file not read again while the job is in the queue."""
    monkeypatch.setattr(requeue, "ERROR_READ_TIMEOUT_S", 0.25, raising=False)  # the old code had none
    err = tmp_path / "err"
    err.write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    os.utime(err, (START + 5, START + 5))
    tried = tmp_path / "tried"

    def hung_open(path, uid, gids):  # as open() on a hard NFS mount whose server is away
        tried.touch()
        time.sleep(40 * requeue.ERROR_READ_TIMEOUT_S)
        return None

    monkeypatch.setattr(requeue, "open_as_owner", hung_open)
    cluster = _setup(monkeypatch, tmp_path, _failed_oom_job(), IDLE, err)
    journal = str(tmp_path / "oom-requeues.json")
    errors = []
    began = time.monotonic()
    assert tend(on_error=errors.append, journal=journal) == []
    assert time.monotonic() - began < 20 * requeue.ERROR_READ_TIMEOUT_S  # a hang guard, no speed test
    assert len(errors) == 1 and "job 1795" in errors[0] and str(err) in errors[0], errors
    assert "not read again" in errors[0]
    assert tried.exists() and [e.get("hung") for e in journal_read(journal).values()] == [str(err)]
    # the next pass reads it no more, and says nothing more
    tried.unlink()
    errors.clear()
    assert tend(on_error=errors.append, journal=journal) == [] and errors == [] and not tried.exists()
    # a dry run (anyone's) waits on it no more either
    assert tend(dry_run=True, on_error=errors.append, journal=journal) == [] and not tried.exists()
    # the job gone from the queue: so is its memo
    cluster.job = {**cluster.job, "job_id": 1796, "job_state": ["COMPLETED"]}
    tend(on_error=errors.append, journal=journal)
    assert journal_read(journal) == {}


def test_a_read_in_its_child_answers_as_before_and_leaks_no_fd(tmp_path):
    f = tmp_path / "err"
    f.write_bytes(b"x" * 300_000 + "CUDA out of memory \u00e9".encode())
    r = {"UserId": "root(0)", "StdErr": str(f), "_start": f.stat().st_mtime - 60}
    fds = sorted(os.listdir("/proc/self/fd"))
    for _ in range(20):
        tail = read_error_tail(r)
        assert tail.endswith("CUDA out of memory \u00e9") and len(tail.encode()) <= requeue.TAIL_BYTES
    f.write_bytes(b"")
    assert read_error_tail(r) == ""  # written since the run started, and empty: found, no OOM
    assert sorted(os.listdir("/proc/self/fd")) == fds


def _pressed_job():
    return {"job_id": 1795, "job_state": ["PENDING"], "state_reason": "Resources", "user_id": 0,
            "tres_per_node": "gres/gpu:a100:1", "admin_comment": EXCL, "submit_time": 1_700_000_000,
            "comment": "horus:v1;a100=30/6000/6900", "priority": 1}


def test_a_pass_killed_between_a_pack_and_its_mark_leaves_a_mark_the_next_pass_keeps(monkeypatch, tmp_path):
    """A pass killed (SIGKILL, power loss) after the pack's reshape and before its mark left the
    job on shards, unmarked: valid, but never spread back once GPUs were idle.  The intent mark
    written first is settled by the next pass into the pack's mark, which sync and hacct read."""
    cluster = _setup(monkeypatch, tmp_path, _pressed_job(), BUSY)
    cluster.crash_on = lambda args: any(a.startswith("AdminComment=") and ";action=pack" in a for a in args)
    journal = str(tmp_path / "j.json")
    with pytest.raises(_Killed):
        tend(min_wait_s=0, journal=journal)
    assert cluster.job["tres_per_node"] == "gres/shard:50"  # reshaped, its mark never written
    cluster.crash_on = lambda args: False
    cluster.nodes = IDLE
    errors = []
    done = tend(min_wait_s=0, on_error=errors.append, journal=journal)
    assert [(a.kind, a.tres) for a in done] == [("spread", "gres/gpu:a100:1")] and errors == []
    assert cluster.job["tres_per_node"] == "gres/gpu:a100:1"
    assert scheduler_actions(cluster.job["admin_comment"])["queue_actions"] == "pack,spread"


def test_a_pass_killed_before_the_reshape_leaves_the_old_request_as_it_was(monkeypatch, tmp_path):
    """Killed after the intent mark, before the reshape: the job keeps its request, is spread to
    nothing, and is packed again under pressure; its intent, dropped, is no action of hacct's."""
    cluster = _setup(monkeypatch, tmp_path, _pressed_job(), BUSY)
    cluster.crash_on = lambda args: any(a.startswith("TresPerNode=") for a in args)
    journal = str(tmp_path / "j.json")
    with pytest.raises(_Killed):
        tend(min_wait_s=0, journal=journal)
    assert cluster.job["tres_per_node"] == "gres/gpu:a100:1" and ";intent=pack" in cluster.job["admin_comment"]
    assert scheduler_actions(cluster.job["admin_comment"])["queue_actions"] is None
    cluster.crash_on = lambda args: False
    cluster.nodes = IDLE
    assert tend(min_wait_s=0, journal=journal) == []
    assert cluster.job["tres_per_node"] == "gres/gpu:a100:1" and cluster.job["admin_comment"] == EXCL
    cluster.nodes = BUSY
    assert [a.kind for a in tend(min_wait_s=0, journal=journal)] == ["pack"]
    assert scheduler_actions(cluster.job["admin_comment"])["queue_actions"] == "pack"


def test_every_reader_takes_an_intent_by_what_the_job_asks_for():
    """Before a pass settles it (a dry run; a job that ran and failed since): an intent whose
    reshape took reads as its action, one whose reshape never took as nothing."""
    intent = "horus-queue:v1;intent=pack;from=gpu:1;to=shard:50"
    idle = [{"NodeName": "n1", "State": "IDLE", "Gres": "gpu:a100:4,shard:a100:400", "GresUsed": ""}]
    busy = [{**idle[0], "State": "MIXED", "GresUsed": "gpu:a100:4(IDX:0-3)"}]

    def job(tres, state="PENDING"):
        return {"JobId": "7", "JobState": state, "TresPerNode": tres, "AdminComment": f"{EXCL} {intent}",
                "SubmitTime": "2026-01-01T00:00:00", "Reason": "Resources",
                "Comment": "horus:v1;a100=30/6000/6900"}

    assert [(a.kind, a.tres) for a in pressure_actions([job("gres/shard:50")], idle, 50, lambda *a: 1, 0,
                                                         1.9e9)] == [("spread", "gres/gpu:a100:1")]
    assert pressure_actions([job("gres/gpu:a100:1")], idle, 50, lambda *a: 1, 0, 1.9e9) == []
    assert [a.kind for a in pressure_actions([job("gres/gpu:a100:1")], busy, 50, lambda *a: 1, 0, 1.9e9)] == ["pack"]
    oom = lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n"  # noqa: E731
    assert [a.kind for a in oom_actions([job("gres/shard:50", "FAILED")], oom, {"a100": 100})] == ["oom-requeue"]
    assert requeue._settled(f"{EXCL} {intent}", "gres/shard:50") == \
        f"{EXCL} horus-queue:v1;action=pack;from=gpu:1;to=shard:50"
    # the fallback of a spread counts as what it gives; a request someone else set, as nothing
    spread = "horus-queue:v1;intent=spread;from=shard:50;to=gpu:1;or=shard:100"
    assert requeue._settled(f"{EXCL} {spread}", "gres/shard:100").endswith("action=spread;from=shard:50;to=shard:100")
    assert requeue._settled(f"{EXCL} {spread}", "gres/shard:80") == EXCL


def test_an_intent_settled_in_the_pass_that_heals_its_oom_requeue_keeps_the_requeues_mark(monkeypatch, tmp_path):
    """A job packed by a pass killed before its mark, failed of an OOM before the next pass
    settled the intent, and held for its rerun by a pass killed before the mark: the next pass
    heals it (its mark written) and settles its intent.  Settled from the queue as read before
    heal, the intent had overwritten the requeue's mark: the job could be requeued again, and
    sync saw no oom-requeue."""
    intent = "horus-queue:v1;intent=pack;from=gpu:1;to=shard:50"
    pack = "horus-queue:v1;action=pack;from=gpu:1;to=shard:50"
    held = {"job_id": 1795, "job_state": ["PENDING"], "state_reason": "JobHeldUser",
            "state_description": "job requeued in held state", "priority": 0, "user_id": 0,
            "tres_per_node": "gres/shard:50", "admin_comment": f"{EXCL} {intent}",
            "submit_time": 1_700_000_000, "comment": "horus:v1;a100=30/6000/6900"}
    cluster = _setup(monkeypatch, tmp_path, held, IDLE)
    journal = str(tmp_path / "j.json")
    with open(journal, "w") as f:
        json.dump({"1795": {"job_id": 1795, "tres": "gres/gpu:a100:1", "fallback": "gres/shard:100",
                            "token": "horus-queue:v1;action=oom-requeue;from=shard:50", "features": None,
                            "admin": f"{EXCL} {pack}", "at": time.time()}}, f)
    os.chmod(journal, 0o600)
    errors = []
    tend(min_wait_s=0, on_error=errors.append, journal=journal)
    assert errors == [] and journal_read(journal) == {}
    assert cluster.job["tres_per_node"] == "gres/gpu:a100:1"
    assert scheduler_actions(cluster.job["admin_comment"])["queue_actions"] == "pack,oom-requeue"


def test_a_fork_that_fails_leaks_no_pipe(monkeypatch):
    """fork() fails at a pids limit (EAGAIN) or without memory: its pipe had stayed open, two
    fds more for every such read of a --interval loop."""
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(requeue.os, "fork", no_fork)
    fds = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(OSError):
            requeue._in_child(lambda: b"", 1.0)
    assert sorted(os.listdir("/proc/self/fd")) == fds


def test_a_read_under_an_ignored_sigchld_is_no_internal_error(tmp_path):
    """A pass started with SIGCHLD ignored (a disposition exec keeps from whatever started it)
    has its children reaped by the kernel: waitpid's ECHILD had failed the pass ("internal
    error: ChildProcessError") at every failed job's read."""
    import signal

    f = tmp_path / "err"
    f.write_text("CUDA out of memory\n")
    r = {"UserId": "root(0)", "StdErr": str(f), "_start": f.stat().st_mtime - 60}
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert read_error_tail(r) == "CUDA out of memory\n"
    finally:
        signal.signal(signal.SIGCHLD, old)
