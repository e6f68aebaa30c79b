"""horus-admin queue's decisions on scontrol records (the cluster test runs them for real)."""

import os

import pytest

from slurm_horus.ledger.requeue import (node_gpu_types, OOM_RE, marked, oom_actions, pack_util_limit, pressure_actions,
                                        pressure_types, shards_per_gpu, write_pressure,
                                        read_error_tail)
from slurm_horus.sim.interference import Interference, sensitivity_at
from slurm_horus.slurm.accounting import queue_tokens, scheduler_actions
from slurm_horus.slurm.hint import parse_decision

EXCL = "horus: exclusive a100 (util 95% >= 70%) horus-decision:v1;action=exclusive;type=a100;reason=util"
SHARED = "horus: shared a100 shards=30/100 horus-decision:v1;action=shared;type=a100;shards=30/100"


def rec(jid, state, tres, admin="", **kw):
    return {"JobId": str(jid), "JobState": state, "TresPerNode": tres, "AdminComment": admin,
            "SubmitTime": "2026-01-01T00:00:00", **kw}


def test_oom_patterns_of_the_frameworks():
    for line in ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
                 "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
                 "2024 W ... RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB",
                 "jaxlib.xla_extension.XlaRuntimeError: ... CUDA_ERROR_OUT_OF_MEMORY"):
        assert OOM_RE.search(line), line
    for line in ("MemoryError", "slurmstepd: error: Detected 1 oom_kill event", "ValueError: nan"):
        assert not OOM_RE.search(line), line


def test_only_failed_shared_jobs_with_a_gpu_oom_once():
    oom = "x\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    jobs = [rec(1, "FAILED", "gres:shard:a100:30", SHARED),
            rec(2, "FAILED", "gres:gpu:a100:1", SHARED),                  # whole GPU already
            rec(3, "FAILED", "gres:shard:30", SHARED),                    # other error text
            rec(4, "COMPLETED", "gres:shard:30", SHARED),
            rec(5, "FAILED", "gres/shard:30", SHARED + " horus-queue:v1;action=oom-requeue;from=shard:30"),
            rec(6, "FAILED", "gres/shard:30"),                            # raw shards: not horus's
            rec(7, "FAILED", "gres/shard:30", SHARED, _flags="COMPLETING"),  # not done yet
            rec(8, "FAILED", "gres/shard:30", SHARED, _het=8)]            # a hetjob component
    texts = {str(i): oom for i in range(1, 9)} | {"3": "ValueError"}
    acts = oom_actions(jobs, lambda r: texts[r["JobId"]], shards_per_gpu(_node("")))
    # written as Slurm writes the job's own TresPerNode (22.05: gres:), with every shard of one
    # GPU as the fallback where Slurm will not turn shards into a gpu
    assert [(a.job_id, a.kind, a.tres, a.fallback) for a in acts] == [
        (1, "oom-requeue", "gres:gpu:a100:1", "gres:shard:100")]
    assert queue_tokens(acts[0].token) == [{"action": "oom-requeue", "from": "shard:30"}]


def test_marks_keep_the_hooks_decision_readable_and_stay_in_order():
    """The loop appends its tokens after the hook's: the decision token stays a word of its own
    (a separator glued to it would make parse_decision refuse it), and sync reads both."""
    note = EXCL
    for token in ("horus-queue:v1;action=pack;from=gpu:1",
                  "horus-queue:v1;action=spread;from=shard:50",
                  "horus-queue:v1;action=oom-requeue;from=shard:50"):
        note = marked(note, token)
    assert parse_decision(note).action == "exclusive" and parse_decision(note).reason == "util"
    assert [t["action"] for t in queue_tokens(note)] == ["pack", "spread", "oom-requeue"]
    assert scheduler_actions(note) == {"hook_action": "exclusive", "hook_reason": "util",
                                       "queue_actions": "pack,spread,oom-requeue"}
    assert marked(None, "horus-queue:v1;action=pack;from=gpu:1") == \
        "horus-queue:v1;action=pack;from=gpu:1"
    # a queue that swings every pass: the newest MAX_QUEUE_MARKS pack and spread marks stay
    # (the comment grew ~50 characters a pass, past one scontrol argument in two days), the
    # hook's decision and the OOM mark always
    from slurm_horus.ledger.requeue import MAX_QUEUE_MARKS

    note = "user text horus-decision:v1;action=exclusive;type=a100;reason=util"
    note = marked(note, "horus-queue:v1;action=oom-requeue;from=shard:50;to=gpu:1")
    for i in range(40):
        note = marked(note, f"horus-queue:v1;action={'pack' if i % 2 else 'spread'};from=x;to=y{i}")
    assert parse_decision(note).reason == "util" and note.startswith("user text horus-decision")
    acts = [t["action"] for t in queue_tokens(note)]
    assert acts[0] == "oom-requeue" and len(acts) == MAX_QUEUE_MARKS + 1 and note.endswith("to=y39")
    assert len(note) < 1000
    # a job marked very often: the column keeps the latest actions that fit
    many = " ".join(["horus-queue:v1;action=pack;from=gpu:1",
                     "horus-queue:v1;action=spread;from=shard:50"] * 40)
    acts = scheduler_actions(many)["queue_actions"]
    assert len(acts) <= 255 and acts.endswith("pack,spread") and not acts.startswith(",")
    assert scheduler_actions("horus: a note a user cannot write") == dict.fromkeys(
        ("hook_action", "hook_reason", "queue_actions"))


def _node(used):
    return [{"NodeName": "n1", "State": "MIXED", "Gres": "gpu:a100:4,shard:a100:400",
             "GresUsed": used}]


def test_pack_only_under_pressure_only_hinted_exclusive_and_fitting():
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    jobs = [rec(1, "PENDING", "gres:gpu:a100:1", EXCL),
            rec(2, "PENDING", "gres:gpu:a100:1", "horus: exclusive any (no hint)"),  # raw request
            rec(3, "PENDING", "gres:gpu:a100:1", EXCL),                   # does not fit
            rec(4, "PENDING", "gres:gpu:a100:1", EXCL, SubmitTime="2999-01-01T00:00:00"),
            rec(5, "PENDING", "gres:gpu:a100:1", EXCL),                   # memory: 66 shards
            rec(6, "PENDING", "gres:gpu:a100:1", EXCL)]                   # memory: a whole GPU
    least = {"1": 1, "3": 101, "4": 1, "5": 66, "6": 100}  # its memory's shards
    acts = pressure_actions(jobs, busy, 50, lambda r, t: least.get(r["JobId"], 1), 60, now=1.9e9)
    assert [(a.job_id, a.kind, a.tres) for a in acts] == [(1, "pack", "gres:shard:50"),
                                                          (5, "pack", "gres:shard:66")]
    idle = _node("gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)")  # as many idle GPUs as jobs wait
    assert pressure_actions(jobs[:4], idle, 50, lambda *a: 1, 0, now=1.9e9) == []


def test_with_some_gpus_idle_only_the_jobs_they_leave_without_one_are_packed_oldest_first():
    three_idle = _node("gpu:a100:1(IDX:0),shard:a100:0(IDX:N/A)")
    jobs = [rec(i, "PENDING", "gres:gpu:a100:1", EXCL, SubmitTime=f"2026-01-01T00:00:0{9 - i}")
            for i in range(1, 6)]  # five wait, job 5 the longest
    acts = pressure_actions(jobs, three_idle, 50, lambda *a: 1, 0, now=1.9e9)
    assert sorted(a.job_id for a in acts) == [4, 5] and {a.kind for a in acts} == {"pack"}
    assert pressure_types(jobs, three_idle) == ["a100"] and pressure_types(jobs[:2], three_idle) == []
    assert pressure_types(jobs[:3], three_idle) == ["a100"]  # a fourth would find no idle GPU
    # a packed job stays packed while jobs still outnumber the idle GPUs
    packed = [rec(1, "PENDING", "gres:shard:50", EXCL + " horus-queue:v1;action=pack;from=gpu:1"),
              *jobs[1:4]]
    acts = pressure_actions(packed, three_idle, 50, lambda *a: 1, 0, now=1.9e9)
    assert [(a.job_id, a.kind) for a in acts] == [(4, "pack")]


def test_spread_back_only_what_the_loop_packed():
    idle = _node("gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)")
    packed = rec(1, "PENDING", "gres/shard:a100:50", EXCL + "; horus-queue:v1;action=pack;from=gpu:1")
    hook_shared = rec(2, "PENDING", "gres:shard:a100:30", "horus: shared a100 shards=30/100")
    acts = pressure_actions([packed, hook_shared], idle, 50, lambda *a: 1, 0, 1.9e9)
    assert [(a.job_id, a.kind, a.tres, a.fallback) for a in acts] == [
        (1, "spread", "gres/gpu:a100:1", "gres/shard:100")]


def test_shards_of_one_gpu_per_type_from_the_nodes():
    nodes = [{"Gres": "gpu:a100:4,shard:400"}, {"Gres": "gpu:t4:2,shard:t4:200"},
             {"Gres": "gpu:a100:2,gpu:t4:2,shard:400"}]  # mixed types: ambiguous, ignored
    assert shards_per_gpu(nodes) == {"a100": 100, "t4": 100}


def test_shards_are_asked_untyped():
    """Slurm refuses (22.05) or ignores (25.11) a request for shard:a100:N."""
    jobs = [rec(1, "PENDING", "gres/gpu:a100:1", EXCL)]
    busy = [{"NodeName": "n1", "State": "MIXED", "Gres": "gpu:a100:4,shard:a100:400",
             "GresUsed": "gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)"}]
    acts = pressure_actions(jobs, busy, 50, lambda *a: 1, 0, now=1.9e9)
    assert [a.tres for a in acts] == ["gres/shard:50"]


def test_error_file_read_with_the_owners_rights(tmp_path):
    f = tmp_path / "err"
    f.write_bytes(b"x" * 300_000 + b"CUDA out of memory")
    os.chmod(f, 0o600)
    r = {"UserId": "root(0)", "GroupId": "root(0)", "StdErr": str(f), "_start": f.stat().st_mtime - 60}
    tail = read_error_tail(r)
    assert tail.endswith("CUDA out of memory") and len(tail) <= 256 * 1024
    nobody = {"UserId": "nobody(65534)", "GroupId": "nogroup(65534)", "StdErr": str(f)}
    assert read_error_tail(nobody) is None  # 0600 root file: not the owner's to read
    assert read_error_tail({**r, "StdErr": "relative/path"}) is None


def test_only_text_written_since_the_run_started_is_evidence(tmp_path):
    """The tail was read whatever wrote it: an earlier run's OOM (before a requeue, with
    --open-mode=append, or in a file two jobs share) made this run's other failure an OOM."""
    old, new = tmp_path / "old-err", tmp_path / "out"
    old.write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    new.write_text("ValueError: bad learning rate\n")
    start = 1_800_000_000
    os.utime(old, (start - 3600, start - 3600))  # the last run's, an hour before this one
    os.utime(new, (start + 5, start + 5))
    r = {"UserId": "root(0)", "StdErr": str(old), "StdOut": str(new), "_start": start}
    assert read_error_tail(r) == "ValueError: bad learning rate\n"  # StdErr is stale: StdOut
    assert read_error_tail({**r, "StdOut": ""}) is None
    os.utime(old, (start, start))  # written in the second the run started
    assert "CUDA out of memory" in read_error_tail(r)
    assert read_error_tail({**r, "_start": None}) is None  # no run start known: no evidence


def test_pressure_is_a_type_where_a_new_job_would_find_no_idle_gpu(tmp_path):
    jobs = [rec(1, "PENDING", "gres:gpu:a100:1", EXCL), rec(2, "RUNNING", "gres:gpu:a100:1", EXCL)]
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    idle = _node("gpu:a100:2(IDX:0-1),shard:a100:0(IDX:N/A)")  # one for the waiting job, one more
    assert pressure_types(jobs, busy) == ["a100"]
    assert pressure_types(jobs, idle) == []
    assert pressure_types(jobs[1:], busy) == ["a100"]  # none waits, but a new job would
    path = tmp_path / "pressure"
    write_pressure(path, ["a100"], now=1_800_000_000, util_limit_pct=82.25)
    assert path.read_text() == "written 1800000000\nutil_limit_milli 82250\npressure a100\n"
    assert oct(path.stat().st_mode & 0o777) == "0o644" and not list(tmp_path.glob("*.tmp"))


PRESSED = "horus: shared a100 shards=50/100 (queue pressure on a100) " \
    "horus-decision:v1;action=shared;type=a100;shards=50/100;reason=pressure"


def test_a_job_the_hook_shared_for_pressure_gets_back_what_it_would_have_had():
    """The hook tags two jobs reason=pressure: one it would have kept whole for its utilization
    (unpressed=gpu) and one it would have shared on more shards, capped (unpressed=67).  Every
    such job was spread to a whole GPU when the queue drained: a 60 % job the policy shares
    held a whole A100 the hook never gave it.  A token of an older hook does not say which
    (left as it is), nor is a pack_heavy job, or one whose request changed since, reshaped."""
    idle = [{"NodeName": "n1", "State": "IDLE", "Gres": "gpu:a100:8,shard:a100:800", "GresUsed": ""}]
    whole = rec(1, "PENDING", "gres/shard:50", PRESSED + ";unpressed=gpu", Features="a100")
    capped = rec(2, "PENDING", "gres/shard:50", PRESSED + ";unpressed=67", Features="a100")
    old = rec(3, "PENDING", "gres/shard:50", PRESSED, Features="a100")  # which one? unknown
    heavy = rec(4, "PENDING", "gres/shard:50", PRESSED.replace("pressure", "pack_heavy") + ";unpressed=gpu")
    changed = rec(5, "PENDING", "gres/shard:30", PRESSED + ";unpressed=gpu")  # not the hook's 50 now
    acts = pressure_actions([whole, capped, old, heavy, changed], idle, 50, lambda *a: 1, 0, 1.9e9)
    assert [(a.job_id, a.kind, a.tres, a.fallback, a.features) for a in acts] == [
        (1, "spread", "gres/gpu:a100:1", "gres/shard:100", None),
        (2, "spread", "gres/shard:67", None, "a100")]
    assert queue_tokens(acts[1].token) == [{"action": "spread", "from": "shard:50"}]
    # while jobs still wait for every A100, each keeps its shards
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    assert pressure_actions([whole, capped], busy, 50, lambda *a: 1, 0, 1.9e9) == []
    # spread once: its mark says so
    again = {**capped, "TresPerNode": "gres/shard:67",
             "AdminComment": capped["AdminComment"] + " horus-queue:v1;action=spread;from=shard:50;to=shard:67"}
    assert pressure_actions([again], idle, 50, lambda *a: 1, 0, 1.9e9) == []
    # on nodes of several types its untyped shards must stay on its type: pinned by its
    # Features where they name it, else left as it is
    t4 = {"NodeName": "t", "State": "IDLE", "Gres": "gpu:t4:2,shard:t4:200", "GresUsed": ""}
    typed = {**capped, "TresPerNode": "gres/shard:a100:50", "Features": ""}
    acts = pressure_actions([capped, typed], idle + [t4], 50, lambda *a: 1, 0, 1.9e9, type_features=set())
    assert [(a.job_id, a.tres, a.features) for a in acts] == [(2, "gres/shard:67", "a100")]


def test_the_unpressed_part_of_the_hooks_token():
    assert parse_decision(PRESSED + ";unpressed=67").unpressed_shards == 67
    assert parse_decision(PRESSED + ";unpressed=gpu").unpressed_whole
    d = parse_decision(PRESSED)
    assert (d.reason, d.unpressed_whole, d.unpressed_shards) == ("pressure", False, None)
    for bad in (PRESSED + ";unpressed=50", PRESSED + ";unpressed=101", PRESSED + ";unpressed=0",
                PRESSED + ";unpressed=whole", SHARED + ";unpressed=67",  # no pressure, no count
                EXCL + ";unpressed=gpu"):
        assert parse_decision(bad) is None, bad


def test_the_slowdown_bound_limits_which_jobs_pack_under_pressure():
    """A job packed under pressure may meet partners at 100 %: it packs only while the median
    job of that group keeps within the admin's bound on the measured curve."""
    itf = Interference()
    assert pack_util_limit(2.0, 2) == 100.0  # a pair of two 100 % jobs: speed 0.63 >= 0.5
    lim = pack_util_limit(1.5, 2)
    assert 60 < lim < 100 and abs(itf.speed(100 + lim, 2) - 1 / 1.5) < 1e-6
    assert pack_util_limit(1.5, 3) < lim  # three packed: two 100 % partners and a crowd
    assert pack_util_limit(1.02, 2) == 0.0  # the curve loses 3 % beside any 100 % job
    assert pack_util_limit(1.1, 1) == 100.0  # one job per GPU: never co-located
    # for the 95th-percentile job of the measured spread (2.68 x the median loss) instead of
    # the median one: the pair of 100 % jobs no longer passes a 2.0 bound
    k95 = sensitivity_at(0.95)
    assert 2.6 < k95 < 2.75
    p95 = pack_util_limit(2.0, 2, tail="p95")
    assert 30 < p95 < 100 and abs(itf.speed(100 + p95, 2, k95) - 0.5) < 1e-6
    assert pack_util_limit(2.0, 2, tail="p99") < p95 < pack_util_limit(2.0, 2, tail="p90")
    assert pack_util_limit(1.5, 2, tail="median") == lim
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    jobs = [rec(1, "PENDING", "gres:gpu:a100:1", EXCL, Comment="horus:v1;a100=95/3000/3500"),
            rec(2, "PENDING", "gres:gpu:a100:1", EXCL, Comment="horus:v1;a100=75/3000/3500")]
    acts = pressure_actions(jobs, busy, 50, lambda *a: 1, 0, 1.9e9, util_limit_pct=lim)
    assert [(a.job_id, a.kind) for a in acts] == [(2, "pack")]
    acts = pressure_actions(jobs, busy, 50, lambda *a: 1, 0, 1.9e9, util_limit_pct=100.0)
    assert [a.job_id for a in acts] == [1, 2]


def test_an_array_task_is_named_as_slurm_names_it():
    """scontrol takes an array task's own id, when it is the array's, for the whole array: the
    loop names a task ArrayJobId_ArrayTaskId (squeue's JSON, 22.05 and 23.02+ forms)."""
    import json as _json

    from slurm_horus.ledger.requeue import job_ref
    from slurm_horus.slurm.parse import squeue_json_records

    jobs = [{"job_id": 1792, "array_job_id": 1792, "array_task_id": 3, "job_state": "FAILED"},
            {"job_id": 1793, "array_job_id": {"set": True, "infinite": False, "number": 1792},
             "array_task_id": {"set": True, "infinite": False, "number": 1}, "job_state": ["FAILED"]},
            {"job_id": 1800, "array_job_id": 0, "array_task_id": 4294967294, "job_state": "FAILED"},
            {"job_id": 1801, "array_job_id": {"set": False, "infinite": False, "number": 0},
             "array_task_id": {"set": False, "infinite": False, "number": 0}, "job_state": ["FAILED"]}]
    recs = squeue_json_records(_json.dumps({"jobs": jobs}))
    assert [job_ref(r) for r in recs] == ["1792_3", "1792_1", "1800", "1801"]


def test_one_changing_pass_at_a_time(tmp_path, monkeypatch):
    from slurm_horus.cli.admin_queue import pass_lock
    from slurm_horus.errors import HorusError

    monkeypatch.setenv("HORUS_QUEUE_LOCK", str(tmp_path / "run" / "queue.lock"))
    with pass_lock(dry_run=False):
        with pytest.raises(HorusError, match="another horus-admin queue pass"):
            with pass_lock(dry_run=False):
                pass
        with pass_lock(dry_run=True):  # a dry run changes nothing: no lock
            pass
    with pass_lock(dry_run=False):  # released
        pass
    assert oct((tmp_path / "run").stat().st_mode & 0o777) == "0o700"


def test_the_requeue_journal_outlives_a_reboot(monkeypatch):
    """It lay beside the lock in /run: a reboot mid-requeue lost it, and the job waited held."""
    from slurm_horus.cli.admin_queue import _journal_path, _lock_path

    monkeypatch.delenv("HORUS_QUEUE_JOURNAL", raising=False)
    monkeypatch.delenv("HORUS_QUEUE_LOCK", raising=False)
    assert _lock_path().startswith("/run/") and _journal_path() == "/var/lib/slurm-horus/oom-requeues.json"
    monkeypatch.setenv("HORUS_QUEUE_JOURNAL", "/srv/horus/j.json")
    assert _journal_path() == "/srv/horus/j.json"


def test_a_journal_left_in_run_by_the_version_before_is_adopted(tmp_path, monkeypatch):
    """After the upgrade a pass reads the new journal: the requeues the old one named would
    have waited held."""
    from slurm_horus.cli.admin_queue import _adopt_legacy_journal
    from slurm_horus.ledger.requeue import journal_read, journal_set

    monkeypatch.setenv("HORUS_QUEUE_LOCK", str(tmp_path / "run" / "queue.lock"))
    legacy, new = tmp_path / "run" / "oom-requeues.json", tmp_path / "lib" / "oom-requeues.json"
    entry = {"job_id": 1795, "tres": "gres/gpu:a100:1", "token": "t", "at": 1.0}
    journal_set(str(legacy), "1795", entry)
    warned = []
    _adopt_legacy_journal(str(new), warned.append)
    assert journal_read(str(new)) == {"1795": entry} and not legacy.exists() and not warned
    _adopt_legacy_journal(str(new), warned.append)  # nothing left to adopt
    assert journal_read(str(new)) == {"1795": entry} and not warned
    # one it cannot read is set aside with a warning: it had stopped every pass
    legacy.write_text('{"12": {"job_id": 12')
    _adopt_legacy_journal(str(new), warned.append)
    assert not legacy.exists() and list(legacy.parent.glob("oom-requeues.json.unreadable-*"))
    assert len(warned) == 1 and "release any still held" in warned[0]
    # a job both name keeps the new journal's entry; a new journal that cannot be read leaves
    # the old one where it is, for a later pass (heal() sets the new one aside)
    journal_set(str(legacy), "1795", dict(entry, token="older"))
    journal_set(str(legacy), "1800", dict(entry, job_id=1800))
    _adopt_legacy_journal(str(new), warned.append)
    got = journal_read(str(new))
    assert got["1795"] == entry and got["1800"]["job_id"] == 1800 and not legacy.exists()
    journal_set(str(legacy), "1801", dict(entry, job_id=1801))
    new.write_text('{"1795": ')
    _adopt_legacy_journal(str(new), warned.append)
    assert legacy.exists() and "not taken over yet" in warned[-1]


def test_held_or_waiting_jobs_are_no_load_and_are_left_alone():
    """Four A100s idle and a user's four held jobs: they had made a100 look pressed, so the
    hook packed new heavy jobs and the loop packed another user's waiting job and an
    admin-held one, while every GPU sat idle."""
    idle = _node("gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)")
    held = [rec(10 + i, "PENDING", "gres:gpu:a100:1", EXCL, Reason="JobHeldUser", Priority="0")
            for i in range(4)]
    waiting = rec(1, "PENDING", "gres:gpu:a100:1", EXCL, Reason="Resources", Priority="100")
    admin_held = rec(2, "PENDING", "gres:gpu:a100:1", EXCL, Reason="JobHeldAdmin", Priority="0")
    later = rec(3, "PENDING", "gres:gpu:a100:1", EXCL, Reason="BeginTime", Priority="100")
    dep = rec(4, "PENDING", "gres:gpu:a100:1", EXCL, Reason="Dependency", Priority="100")
    jobs = [*held, waiting, admin_held, later, dep]
    assert pressure_types(jobs, idle) == [] and pressure_actions(jobs, idle, 50, lambda *a: 1, 0, 1.9e9) == []
    # what does wait for GPUs still counts: five such jobs on four idle GPUs
    five = [rec(20 + i, "PENDING", "gres:gpu:a100:1", EXCL, Reason="Priority", Priority="9")
            for i in range(5)]
    assert pressure_types(five + held, idle) == ["a100"]
    acts = pressure_actions(five + held + [admin_held], idle, 50, lambda *a: 1, 0, 1.9e9)
    assert [a.job_id for a in acts] == [20]  # one job left without a GPU; never a held one
    # a job this loop packed, then held: its own request back, pressure or not
    packed = rec(30, "PENDING", "gres/shard:50", EXCL + " horus-queue:v1;action=pack;from=gpu:1",
                 Reason="JobHeldAdmin", Priority="0")
    acts = pressure_actions(five + [packed], idle, 50, lambda *a: 1, 0, 1.9e9)
    assert [(a.job_id, a.kind, a.tres) for a in acts] == [(30, "spread", "gres/gpu:a100:1"), (20, "pack", "gres:shard:50")]


def test_jobs_the_loop_must_not_reshape():
    """A hetjob component (scontrol would reach the whole hetjob), an array record of tasks not
    split yet (every task), a job whose state carries flags (REQUEUE_HOLD, SPECIAL_EXIT)."""
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    jobs = [rec(1, "PENDING", "gres:gpu:a100:1", EXCL, _het=1),
            rec(2, "PENDING", "gres:gpu:a100:1", EXCL, _tasks="3-9"),
            rec(3, "PENDING", "gres:gpu:a100:1", EXCL, _flags="REQUEUE_HOLD"),
            rec(4, "PENDING", "gres:gpu:a100:1", EXCL)]
    acts = pressure_actions(jobs, busy, 50, lambda *a: 1, 0, now=1.9e9)
    assert [a.job_id for a in acts] == [4]


def test_the_submit_time_is_squeues_number_not_local_time():
    # 01:30 on the night clocks go back is two instants: read from the local ISO text, a job
    # could seem to have waited an hour longer than it had
    from slurm_horus.ledger.requeue import _submitted

    assert _submitted(rec(1, "PENDING", "", SubmitTime="2026-11-01T01:30:00", _submit=1793511000)) == 1793511000
    assert _submitted(rec(1, "PENDING", "", SubmitTime="garbage")) == float("inf")


class _Slurm:
    """A stand-in for requeue.run: records each command, answers squeue from ``tres``, fails
    where ``fail`` says (an argument prefix; with Slurm's ``refusal``), and can send a signal
    during one command."""

    def __init__(self, tres="gres/shard=50", fail=(), signal_on=None, refusal="refused"):
        self.calls, self.tres, self.fail, self.signal_on = [], tres, fail, signal_on
        self.refusal = refusal

    def __call__(self, args, timeout=30):
        import json as _json
        import signal as _signal

        from slurm_horus.errors import HorusError

        self.calls.append(args)
        if self.signal_on and args[:2] == self.signal_on:
            os.kill(os.getpid(), _signal.SIGTERM)
        if any(" ".join(args).startswith(f) for f in self.fail):
            raise HorusError(f"{' '.join(args[:3])}: {self.refusal}")
        if args[0] == "squeue":
            return _json.dumps({"jobs": [{"job_id": 1795, "tres_req_str": self.tres, "user_id": 5,
                                          "array_job_id": 1792, "array_task_id": 3}]})
        return ""


@pytest.mark.parametrize("failing", [f"scontrol update JobId=1795 AdminComment={EXCL} horus-queue:v1;action=",
                                     "squeue"])
def test_a_pack_whose_mark_or_check_fails_is_put_back(monkeypatch, failing):
    """Unmarked, no later pass would undo it: a mark that fails, or a verifying squeue (or a
    timed-out update Slurm applied) that fails, had left the job on shards.  Its request is put
    back, then its comment (the intent mark written before the reshape goes)."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply

    slurm = _Slurm(fail=(failing,))
    monkeypatch.setattr(requeue, "run", slurm)
    a = Action(1795, "pack", "gres/shard:50", "horus-queue:v1;action=pack;from=gpu:1")
    with pytest.raises(HorusError):
        apply(a, EXCL, "gres/gpu:a100:1")
    assert slurm.calls[-2:] == [["scontrol", "update", "JobId=1795", "TresPerNode=gres/gpu:a100:1"],
                                ["scontrol", "update", "JobId=1795", f"AdminComment={EXCL}"]]
    if failing == "squeue":  # never marked: the check failed before the mark
        assert not any(len(c) > 3 and ";action=pack" in c[3] for c in slurm.calls)
    # an intent Slurm does not take: nothing changed, nothing tried
    slurm = _Slurm(fail=("scontrol update JobId=1795 AdminComment",))
    monkeypatch.setattr(requeue, "run", slurm)
    with pytest.raises(HorusError):
        apply(a, EXCL, "gres/gpu:a100:1")
    assert not any(len(c) > 3 and c[3] == "TresPerNode=gres/shard:50" for c in slurm.calls)


def test_an_array_tasks_reshape_is_checked_on_its_own_record(monkeypatch):
    # squeue's record of task 1792_3 has its own id (1795): looked up as "1792_3" it was never
    # found, and an applied pack was reported as refused (and left unmarked)
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply

    slurm = _Slurm()
    monkeypatch.setattr(requeue, "run", slurm)
    a = Action(1795, "pack", "gres/shard:50", "horus-queue:v1;action=pack;from=gpu:1", ref="1792_3")
    assert apply(a, EXCL, "gres/gpu:a100:1") == "gres/shard:50"
    assert ["scontrol", "update", "JobId=1792_3", "TresPerNode=gres/shard:50"] in slurm.calls
    assert any(c[0] == "scontrol" and c[3].startswith("AdminComment=") for c in slurm.calls)


def test_a_stop_during_an_oom_requeue_waits_until_the_job_is_released(monkeypatch):
    """systemd's SIGTERM between requeuehold and release left the job held for good."""
    import signal as _signal

    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply

    stopped = []
    old = _signal.signal(_signal.SIGTERM, lambda *a: stopped.append(len(slurm.calls)))
    try:
        slurm = _Slurm(tres="gres/gpu=1", signal_on=["scontrol", "requeuehold"])
        monkeypatch.setattr(requeue, "run", slurm)
        a = Action(1795, "oom-requeue", "gres/gpu:a100:1", "horus-queue:v1;action=oom-requeue;from=shard:30",
                   "gres/shard:100")
        apply(a, SHARED)
    finally:
        _signal.signal(_signal.SIGTERM, old)
    assert slurm.calls[-1] == ["scontrol", "release", "1795"]
    assert stopped == [len(slurm.calls)]  # the signal arrived once the job was released


def test_a_pack_keeps_the_jobs_gpu_type_on_a_cluster_of_several():
    """Shards are asked untyped, and the hook types a whole-GPU job in its GRES (gpu:a100:1),
    not in its Features: a pack had dropped the type, and the job could start on a T4's shards
    costed for an A100's memory."""
    two = [{"NodeName": "a", "State": "MIXED", "Gres": "gpu:a100:4,shard:a100:400",
            "GresUsed": "gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)"},
           {"NodeName": "t", "State": "IDLE", "Gres": "gpu:t4:2,shard:t4:200",
            "GresUsed": "gpu:t4:0(IDX:N/A),shard:t4:0(IDX:N/A)"}]
    jobs = [rec(1, "PENDING", "gres/gpu:a100:1", EXCL), rec(2, "PENDING", "gres/gpu:a100:1", EXCL, Features="ib")]
    acts = pressure_actions(jobs, two, 50, lambda *a: 1, 0, 1.9e9, type_features={"a100", "t4"})
    assert [(a.job_id, a.tres, a.features) for a in acts] == [(1, "gres/shard:50", "a100"),
                                                               (2, "gres/shard:50", "ib&a100")]
    # the type's node feature not declared: nothing keeps it on its type, so no pack
    assert pressure_actions(jobs, two, 50, lambda *a: 1, 0, 1.9e9, type_features={"t4"}) == []
    # the user's own constraint names the type already: kept as it is
    own = [rec(3, "PENDING", "gres/gpu:a100:1", EXCL, Features="a100&ib")]
    assert [a.features for a in pressure_actions(own, two, 50, lambda *a: 1, 0, 1.9e9)] == ["a100&ib"]
    # a trailing "&", which Slurm takes, is not doubled into the "&&" it refuses (as the hook)
    trailing = [rec(4, "PENDING", "gres/gpu:a100:1", EXCL, Features="ib&")]
    acts = pressure_actions(trailing, two, 50, lambda *a: 1, 0, 1.9e9, type_features={"a100", "t4"})
    assert [a.features for a in acts] == ["ib&a100"]


def test_real_ooms_are_recognised_wherever_the_tail_names_them():
    """A rule that read only the last exception missed torchrun's ChildFailedError after the
    worker's OOM, chained exceptions and [rankN]: prefixes; the CUDA runtime's and
    TensorFlow's own wordings were never matched."""
    oom = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    texts = [
        oom + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n  train.py FAILED\n",
        oom + "\nDuring handling of the above exception, another exception occurred:\n"
              "RuntimeError: No executable batch size found, reached zero.\n",
        oom + "Exception ignored in: <function X.__del__>\nAttributeError: 'NoneType'\n" + "DEBUG:filelock x\n" * 25,
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor "
        "with shape[64,512,512] on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n",
    ]
    jobs = [rec(i, "FAILED", "gres:shard:a100:30", SHARED) for i in range(1, len(texts) + 1)]
    acts = oom_actions(jobs, lambda r: texts[int(r["JobId"]) - 1], shards_per_gpu(_node("")))
    assert [a.job_id for a in acts] == list(range(1, len(texts) + 1))
    # host memory is no GPU's: TensorFlow's CPU allocator, the JVM's heap
    for line in ("ResourceExhaustedError: OOM when allocating tensor with shape[9] on "
                 "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
                 "java.lang.OutOfMemoryError: Java heap space"):
        assert not OOM_RE.search(line), line


def test_a_node_feature_is_no_gpu_type():
    """With type_choice = any the hook names no type; --constraint=ib was read as GPU type ib,
    and the OOM rerun asked for gpu:ib (refused) and ran again on its shards."""
    shared_any = "horus: shared any shards=23/100 horus-decision:v1;action=shared;type=any;shards=23/100"
    jobs = [rec(1, "FAILED", "gres:shard:23", shared_any, Features="ib"),
            rec(2, "FAILED", "gres:shard:23", shared_any, Features="a100")]
    nodes = _node("") + [{"NodeName": "t", "State": "IDLE", "Gres": "gpu:t4:1,shard:t4:100", "GresUsed": ""}]
    acts = oom_actions(jobs, lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n",
                       shards_per_gpu(nodes), node_gpu_types(nodes))
    assert [(a.job_id, a.tres) for a in acts] == [(1, "gres:gpu:1"), (2, "gres:gpu:a100:1")]
    # where the nodes have one GPU type, that is every job's
    acts = oom_actions(jobs, lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n",
                       shards_per_gpu(_node("")), node_gpu_types(_node("")))
    assert [(a.job_id, a.tres) for a in acts] == [(1, "gres:gpu:a100:1"), (2, "gres:gpu:a100:1")]


def test_idle_gpus_are_counted_per_type_and_never_on_reserved_nodes():
    from slurm_horus.ledger.requeue import _node_type_free

    mixed = [{"NodeName": "m", "State": "MIXED", "Gres": "gpu:a100:2,gpu:t4:2",
              "GresUsed": "gpu:a100:0(IDX:N/A),gpu:t4:2(IDX:2-3)"}]
    assert _node_type_free(mixed) == {"a100": 2, "t4": 0}  # the busy T4s hid the idle A100s
    held = [{"NodeName": "r", "State": "IDLE+MAINTENANCE+RESERVED", "Gres": "gpu:a100:4",
             "GresUsed": "gpu:a100:0(IDX:N/A)"}]
    assert _node_type_free(held) == {}
    single = _node("gpu:a100:1(IDX:0),shard:a100:30(IDX:1)")
    assert _node_type_free(single) == {"a100": 2}


def test_a_requeue_that_half_fails_is_finished_by_the_next_pass(monkeypatch, tmp_path):
    """A requeuehold that timed out after Slurm acted, or a release that failed, left the job
    held for good (no later pass looked at a PENDING job); a first mark that failed released it
    unmarked on its old shards.  The journal lets the next pass finish each."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply, heal, journal_read

    journal = str(tmp_path / "oom-requeues.json")
    a = Action(1795, "oom-requeue", "gres/gpu:a100:1", "horus-queue:v1;action=oom-requeue;from=shard:30",
               "gres/shard:100")
    # what root's requeuehold leaves (squeue --json on the 22.05 test cluster: JobHeldUser,
    # "job requeued in held state", priority 0)
    held = rec(1795, "PENDING", "gres/shard:30", SHARED, Priority="0", Reason="JobHeldUser",
               StateDesc="job requeued in held state")

    # requeuehold times out (Slurm held the job anyway), or the release fails: journaled, and
    # finished by the next pass
    for failing in ("scontrol requeuehold", "scontrol release"):
        slurm = _Slurm(tres="gres/gpu=1", fail=(failing,))
        monkeypatch.setattr(requeue, "run", slurm)
        with pytest.raises(HorusError):
            apply(a, SHARED, journal=journal)
        assert list(journal_read(journal)) == ["1795"], failing
        slurm.fail = ()
        got = heal(journal, [held])
        assert [x.tres for x in got] == ["gres/gpu:a100:1"] and journal_read(journal) == {}
        assert slurm.calls[-1] == ["scontrol", "release", "1795"]
        assert any(c[3].startswith("AdminComment=") and "oom-requeue" in c[3] for c in slurm.calls if len(c) > 3)

    # an entry whose job is not held (the requeuehold never took: FAILED still) leaves the journal
    requeue.journal_set(journal, "1795", {"job_id": 1795, "tres": a.tres, "token": a.token, "at": 0.0})
    assert heal(journal, [rec(1795, "FAILED", "gres/shard:30", SHARED)]) == [] and journal_read(journal) == {}


def test_a_job_is_released_from_its_oom_requeue_only_once_marked(monkeypatch, tmp_path):
    """The mark is the commit.  A first mark that timed out while the whole GPU took had
    released the job unmarked: its next OOM was requeued again (seen on 22.05: Restarts=2,
    from=shard:100;to=shard:100), and a job Slurm would neither mark nor reshape was released
    on its shards every GIVE_UP_S, for good; the pass said nothing and exited 0."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply, heal, journal_read

    journal = str(tmp_path / "oom-requeues.json")
    a = Action(1795, "oom-requeue", "gres/gpu:a100:1", "horus-queue:v1;action=oom-requeue;from=shard:30",
               "gres/shard:100")
    held = rec(1795, "PENDING", "gres/shard:30", SHARED, Priority="0", Reason="JobHeldUser",
               StateDesc="job requeued in held state", _submit=1_796_000_000)
    marks = lambda calls: [c for c in calls if len(c) > 3 and c[3].startswith("AdminComment=")]  # noqa: E731

    # the mark times out, the whole GPU would take: held, journaled, said (the pass exits 1)
    slurm = _Slurm(tres="gres/gpu=1", fail=("scontrol update JobId=1795 AdminComment",),
                   refusal="timed out after 30 s")
    monkeypatch.setattr(requeue, "run", slurm)
    with pytest.raises(HorusError, match="did not take its mark.*next pass tries again"):
        apply(a, SHARED, journal=journal)
    assert ["scontrol", "release", "1795"] not in slurm.calls and list(journal_read(journal)) == ["1795"]
    errors = []
    assert heal(journal, [held], errors.append) == [] and "did not take its mark" in errors[0]
    assert ["scontrol", "release", "1795"] not in slurm.calls
    # the next pass whose mark takes finishes it: marked, on its whole GPU, released
    slurm.fail = ()
    assert [x.tres for x in heal(journal, [held])] == ["gres/gpu:a100:1"] and journal_read(journal) == {}
    assert slurm.calls[-1] == ["scontrol", "release", "1795"]
    assert marks(slurm.calls)[-1][3].endswith("action=oom-requeue;from=shard:30;to=gpu:1")

    # Slurm takes no mark for GIVE_UP_S: released anyway (on its whole GPU where that takes),
    # said, and the journal keeps the job from a second requeue while it is in the queue
    slurm = _Slurm(tres="gres/gpu=1", fail=("scontrol update JobId=1795 AdminComment",))
    monkeypatch.setattr(requeue, "run", slurm)
    with pytest.raises(HorusError):
        apply(a, SHARED, journal=journal)
    real = requeue.time.time
    monkeypatch.setattr(requeue.time, "time", lambda: real() + requeue.GIVE_UP_S + 1)
    errors = []
    assert heal(journal, [held], errors.append) == []
    assert "released unmarked" in errors[0] and "gpu:1" in errors[0]
    assert slurm.calls[-1] == ["scontrol", "release", "1795"]
    assert ["scontrol", "update", "JobId=1795", "TresPerNode=gres/gpu:a100:1"] in slurm.calls
    monkeypatch.setattr(requeue.time, "time", real)
    failed_again = rec(1795, "FAILED", "gres/gpu:a100:1", SHARED, _submit=1_796_000_000)
    on_shards = rec(1795, "FAILED", "gres/shard:30", SHARED, _submit=1_796_000_000)
    oom = lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n"  # noqa: E731
    keys = requeue.given_up_keys(journal)
    assert oom_actions([failed_again, on_shards], oom, shards_per_gpu(_node("")), given_up=keys) == []
    # requeued since by someone else (a node failure, its owner), with the new SubmitTime Slurm
    # gives a requeued job: the same job, still never requeued again (keyed by submit time too,
    # it had been)
    later = {**on_shards, "_submit": 1_797_000_000}
    assert oom_actions([later], oom, shards_per_gpu(_node("")), given_up=keys) == []
    # kept while the job is in the queue (heal finishes nothing of it), dropped once it is not
    slurm.calls.clear()
    assert heal(journal, [on_shards]) == [] and slurm.calls == [] and list(journal_read(journal)) == ["1795"]
    assert heal(journal, []) == [] and journal_read(journal) == {}
    assert oom_actions([later], oom, shards_per_gpu(_node("")), given_up=requeue.given_up_keys(journal)) != []


def test_a_held_job_its_owner_releases_unmarked_is_never_requeued_again(monkeypatch, tmp_path):
    """While its mark fails the job waits held as JobHeldUser, which its owner may release: heal
    then dropped its journal entry, and its next OOM on its old shards was requeued a second
    time.  One never requeued (FAILED still) or marked leaves the journal as before."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply, heal, journal_read, journal_set

    journal = str(tmp_path / "oom-requeues.json")
    a = Action(1795, "oom-requeue", "gres/gpu:a100:1", "horus-queue:v1;action=oom-requeue;from=shard:30",
               "gres/shard:100")
    slurm = _Slurm(tres="gres/gpu=1", fail=("scontrol update JobId=1795 AdminComment",))
    monkeypatch.setattr(requeue, "run", slurm)
    with pytest.raises(HorusError):
        apply(a, SHARED, journal=journal)
    released = rec(1795, "RUNNING", "gres/shard:30", SHARED)
    assert heal(journal, [released]) == [] and journal_read(journal)["1795"]["given_up"]
    oom = lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n"  # noqa: E731
    again = rec(1795, "FAILED", "gres/shard:30", SHARED)
    assert oom_actions([again], oom, shards_per_gpu(_node("")), given_up=requeue.given_up_keys(journal)) == []
    # released, run and out of memory again before the next pass: FAILED, but started since
    with pytest.raises(HorusError):
        apply(a, SHARED, journal=journal)
    failed_since = rec(1795, "FAILED", "gres/shard:30", SHARED, _start=journal_read(journal)["1795"]["at"] + 5)
    assert heal(journal, [failed_since]) == [] and journal_read(journal)["1795"]["given_up"]
    journal_set(journal, "1795", None)
    for state, note in (("FAILED", SHARED), ("RUNNING", SHARED + " " + a.token)):
        with pytest.raises(HorusError):
            apply(a, SHARED, journal=journal)
        assert heal(journal, [rec(1795, state, "gres/shard:30", note)]) == [] and journal_read(journal) == {}


def test_an_oom_rerun_is_never_given_what_the_job_has(monkeypatch, tmp_path):
    """A job on every shard of one GPU (a rerun released unmarked on 22.05) was requeued again
    onto the same shard:100: a whole GPU is all a requeue gives."""
    oom = lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n"  # noqa: E731
    jobs = [rec(1, "FAILED", "gres:shard:100", SHARED), rec(2, "FAILED", "gres:shard:99", SHARED)]
    acts = oom_actions(jobs, oom, shards_per_gpu(_node("")))
    assert [a.job_id for a in acts] == [2]
    # of no type: what the largest GPU's shards are
    any_type = "horus: shared any horus-decision:v1;action=shared;type=any;shards=26/100"
    nodes = [{"NodeName": "a", "Gres": "gpu:a100:1,shard:a100:200"}, {"NodeName": "t", "Gres": "gpu:t4:1,shard:t4:100"}]
    jobs = [rec(3, "FAILED", "gres:shard:150", any_type), rec(4, "FAILED", "gres:shard:200", any_type)]
    assert [a.job_id for a in oom_actions(jobs, oom, shards_per_gpu(nodes), node_gpu_types(nodes))] == [3]


def test_heal_keeps_a_users_own_hold_and_moves_an_unreadable_journal_aside(monkeypatch, tmp_path):
    """A journaled requeue whose requeuehold Slurm refused, of a job its owner then held
    (JobHeldUser), was released by the next pass; a corrupt journal stopped every pass."""
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import heal, journal_read, journal_set

    journal = str(tmp_path / "oom-requeues.json")
    slurm = _Slurm(tres="gres/gpu=1")
    monkeypatch.setattr(requeue, "run", slurm)
    journal_set(journal, "1795", {"job_id": 1795, "tres": "gres/gpu:a100:1",
                                  "token": "horus-queue:v1;action=oom-requeue;from=shard:30", "at": 0.0})
    user_held = rec(1795, "PENDING", "gres/shard:30", SHARED, Priority="0", Reason="JobHeldUser")
    # left held, and kept from an OOM requeue of ours while it is in the queue: it may have
    # been requeued, unmarked
    assert heal(journal, [user_held]) == [] and slurm.calls == [] and journal_read(journal)["1795"]["given_up"]
    # nor an admin's hold placed on a requeued job (the description stays, the reason changes)
    journal_set(journal, "1795", {"job_id": 1795, "tres": "gres/gpu:a100:1",
                                  "token": "horus-queue:v1;action=oom-requeue;from=shard:30", "at": 0.0})
    admin_held = rec(1795, "PENDING", "gres/shard:30", SHARED, Priority="0", Reason="JobHeldAdmin",
                     StateDesc="job requeued in held state")
    assert heal(journal, [admin_held]) == [] and slurm.calls == [] and journal_read(journal)["1795"]["given_up"]
    (tmp_path / "oom-requeues.json").write_text('{"1795": {"job_id": 1795}}')
    errors = []
    assert heal(journal, [user_held], errors.append) == []
    assert "moved to" in errors[0] and not (tmp_path / "oom-requeues.json").exists()
    assert journal_read(journal) == {}  # the next pass goes on


def test_untyped_shards_on_a_node_of_several_types_count_for_each():
    from slurm_horus.ledger.requeue import _node_type_free

    node = [{"NodeName": "m", "State": "MIXED", "Gres": "gpu:a100:2,gpu:t4:2,shard:400",
             "GresUsed": "gpu:a100:0(IDX:N/A),gpu:t4:0(IDX:N/A),shard:60(IDX:0-1)"}]
    assert _node_type_free(node) == {"a100": 0, "t4": 0}


ANY_SHARED = "horus: shared any shards=26/100 horus-decision:v1;action=shared;type=any;shards=26/100"


def test_an_untyped_oom_rerun_asks_for_a_whole_gpus_shards():
    """type_choice = any leaves a shared job with no type: 22.05 refuses its shards -> gpu:1
    and the fallback had been None, so it reran on the same 26 shards and failed again."""
    nodes = [{"NodeName": "a", "State": "IDLE", "Gres": "gpu:a100:1,shard:a100:100", "GresUsed": ""},
             {"NodeName": "t", "State": "IDLE", "Gres": "gpu:t4:1,shard:t4:100", "GresUsed": ""}]
    jobs = [rec(1, "FAILED", "gres:shard:26", ANY_SHARED)]
    acts = oom_actions(jobs, lambda r: "torch.OutOfMemoryError: CUDA out of memory.",
                       shards_per_gpu(nodes), node_gpu_types(nodes))
    assert [(a.tres, a.fallback) for a in acts] == [("gres:gpu:1", "gres:shard:100")]


def test_a_reshape_keeps_the_jobs_other_gres():
    """Every reshape had replaced the whole TresPerNode: gres:shard:26,gres:nvme:1 lost its nvme."""
    oom = oom_actions([rec(1, "FAILED", "gres:shard:30,gres:nvme:1", SHARED)],
                      lambda r: "CUDA out of memory", shards_per_gpu(_node("")))
    assert (oom[0].tres, oom[0].fallback) == ("gres:gpu:a100:1,gres:nvme:1", "gres:shard:100,gres:nvme:1")
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    acts = pressure_actions([rec(2, "PENDING", "gres:nvme:1,gres:gpu:a100:1", EXCL)], busy, 50,
                            lambda *a: 1, 0, now=1.9e9)
    assert [a.tres for a in acts] == ["gres:nvme:1,gres:shard:50"]


def test_a_pending_array_is_as_much_load_as_its_tasks():
    """An array record not split yet stands for all its tasks: counted as one, 100 waiting
    tasks beside 2 idle GPUs were no pressure, and the loop spread a packed job back."""
    two_idle = _node("gpu:a100:2(IDX:0-1),shard:a100:0(IDX:N/A)")
    array = rec(7, "PENDING", "gres:gpu:a100:1", EXCL, _tasks="1-100")
    packed = rec(8, "PENDING", "gres:shard:50", EXCL + " horus-queue:v1;action=pack;from=gpu:1",
                 SubmitTime="2026-01-01T00:00:01")
    assert pressure_types([array], two_idle) == ["a100"]
    assert pressure_types([{**array, "_tasks": "1-3%1"}], two_idle) == []  # one at a time
    assert pressure_actions([array, packed], two_idle, 50, lambda *a: 1, 0, now=1.9e9) == []


def test_jobs_of_no_type_are_load_and_packed_where_the_nodes_have_one_type():
    """type_choice = any types no job: such jobs were no load and never packed, so on a site of
    one GPU type the loop did nothing; on nodes of several types they are load on each."""
    any_excl = ("horus: exclusive any (util 85% >= 70%) "
                "horus-decision:v1;action=exclusive;type=any;reason=util")
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    jobs = [rec(1, "PENDING", "gres:gpu:1", any_excl, Comment="horus:v1;a100=85/3000/3500")]
    assert pressure_types(jobs, busy) == ["a100"]
    acts = pressure_actions(jobs, busy, 50, lambda *a: 1, 0, now=1.9e9)
    assert [(a.job_id, a.kind, a.tres, a.features) for a in acts] == [(1, "pack", "gres:shard:50", None)]
    t4_idle = {"NodeName": "t", "State": "IDLE", "Gres": "gpu:t4:2,shard:t4:200", "GresUsed": ""}
    typed = rec(2, "PENDING", "gres:gpu:t4:1", EXCL.replace("a100", "t4"))
    # one t4 job and one of no type wait beside two idle T4s: a new job would find none
    assert pressure_types([typed, *jobs], busy + [t4_idle]) == ["a100", "t4"]
    assert pressure_types([typed], busy + [t4_idle]) == ["a100"]  # the A100s are all busy
    cpu_only = rec(3, "PENDING", "", "")
    assert pressure_types([typed, cpu_only], busy + [t4_idle]) == ["a100"]


def test_only_jobs_the_hook_left_untyped_are_load_on_the_types_their_partition_has():
    """A plain --gres=gpu:1 job in an A100 partition had made the idle T4s look pressed (so the
    hook packed T4 jobs beside idle T4s); and with the A100 node drained, the site looked like
    T4s only, so untyped jobs were packed onto T4 shards and spread back as gpu:t4:1."""
    a100 = {"NodeName": "a", "State": "MIXED", "Partitions": "a100", "Gres": "gpu:a100:4,shard:a100:400",
            "GresUsed": "gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)"}
    t4 = {"NodeName": "t", "State": "IDLE", "Partitions": "t4,all", "Gres": "gpu:t4:2,shard:t4:200", "GresUsed": ""}
    plain = [rec(i, "PENDING", "gres:gpu:1", "", Partition="a100") for i in (1, 2)]
    assert pressure_types(plain, [a100, t4]) == ["a100"]
    any_excl = "horus: exclusive any horus-decision:v1;action=exclusive;type=any;reason=util"
    left = [rec(i, "PENDING", "gres:gpu:1", any_excl, Partition="all") for i in (3, 4)]
    assert pressure_types(left, [a100, t4]) == ["a100", "t4"]  # partition all: the T4s
    assert pressure_types([{**r, "Partition": "a100"} for r in left], [a100, t4]) == ["a100"]
    drained = {**a100, "State": "IDLE+DRAIN", "GresUsed": ""}
    busy_t4 = {**t4, "State": "MIXED", "GresUsed": "gpu:t4:2(IDX:0-1),shard:t4:0(IDX:N/A)"}
    acts = pressure_actions([{**r, "Comment": "horus:v1;a100=85/3000/3450;t4=85/3000/3450"} for r in left],
                            [drained, busy_t4], 50, lambda *a: 1, 0, now=1.9e9)
    assert acts == []  # still of no type: left as they are


def test_a_cpu_job_is_no_gpu_load_and_a_drained_type_still_pins_a_pack():
    """The one-type rule had typed CPU jobs too: a CPU backlog kept a one-type site under GPU
    pressure for good; and a drained T4 node had made the A100 a lone type, so a pack got no
    feature pin and could start on T4 shards costed for A100 memory."""
    two_idle = _node("gpu:a100:2(IDX:0-1),shard:a100:0(IDX:N/A)")
    cpu = [rec(i, "PENDING", "", "", Reason="Resources") for i in range(1, 6)]
    assert pressure_types(cpu, two_idle) == []
    assert pressure_actions([*cpu, rec(9, "PENDING", "gres:gpu:a100:1", EXCL)], two_idle, 50,
                            lambda *a: 1, 0, now=1.9e9) == []
    busy = _node("gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)")
    t4 = {"NodeName": "t", "State": "IDLE+DRAIN", "Gres": "gpu:t4:2,shard:t4:200", "GresUsed": ""}
    acts = pressure_actions([rec(9, "PENDING", "gres:gpu:a100:1", EXCL)], busy + [t4], 50, lambda *a: 1, 0,
                            now=1.9e9, type_features={"a100", "t4"})
    assert [(a.kind, a.features) for a in acts] == [("pack", "a100")]


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _failed_oom_job(**json_fields):
    """A FAILED job of the hook's shards as 25.11's squeue --json gives it (a recorded job,
    made this one)."""
    import json as _json

    with open(os.path.join(FIXTURES, "slurm-25.11", "squeue_json.stdout")) as f:
        j = _json.load(f)["jobs"][0]
    return {**j, "job_id": 1795, "job_state": ["FAILED"], "tres_per_node": "gres/shard:30",
            "admin_comment": SHARED, "user_name": "root", "user_id": 0, **json_fields}


def test_squeue_says_whether_slurm_may_requeue_a_job():
    """squeue --json's requeue and batch_flag (true/false in 22.05's and 25.11's, as recorded;
    false seen on both clusters for --no-requeue and for an salloc job) as scontrol's 1/0."""
    import json as _json

    from slurm_horus.slurm.parse import squeue_json_records

    for version in ("slurm", "slurm-25.11"):
        with open(os.path.join(FIXTURES, version, "squeue_json.stdout")) as f:
            recs = squeue_json_records(f.read())
        assert recs and {(r["Requeue"], r["BatchFlag"]) for r in recs} == {("1", "1")}, version
    jobs = [_failed_oom_job(requeue=False), _failed_oom_job(batch_flag=False)]
    jobs[1].pop("requeue")  # a JSON without the field says nothing
    recs = squeue_json_records(_json.dumps({"jobs": jobs}))
    assert [(r["Requeue"], r["BatchFlag"]) for r in recs] == [("0", "1"), ("", "0")]


def _tend_slurm(monkeypatch, tmp_path, jobs):
    """requeue.run answering one pass of tend(): squeue from ``jobs``, one idle A100 node,
    each job's StdErr a file with a CUDA OOM in it; requeuehold refused as Slurm refuses a
    --no-requeue job."""
    import json as _json

    from slurm_horus.ledger import requeue

    err = tmp_path / "err"
    err.write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    (tmp_path / "policy.conf").write_text("")
    monkeypatch.setenv("HORUS_POLICY", str(tmp_path / "policy.conf"))
    monkeypatch.setattr(requeue, "slurm_version", lambda fresh=False: "25.11.7")
    slurm = _Slurm(fail=("scontrol requeuehold",), refusal="Requested operation is presently disabled")

    def run(args, timeout=30):
        if args[:2] == ["squeue", "--json"]:
            slurm.calls.append(args)
            return _json.dumps({"jobs": jobs})
        if args[:3] == ["scontrol", "-d", "show"]:
            return "NodeName=n1 State=IDLE Gres=gpu:a100:4,shard:a100:400 GresUsed=\n"
        if args[:3] == ["scontrol", "show", "job"]:
            return f"JobId={args[3]} StdErr={err}\n"
        return slurm(args, timeout)

    monkeypatch.setattr(requeue, "run", run)
    return slurm


def test_a_job_slurm_will_not_requeue_is_left_alone(monkeypatch, tmp_path):
    """--no-requeue (or an salloc/srun job) that died of an OOM: every pass journaled a
    requeue, scontrol refused it ("Requested operation is presently disabled"), heal dropped
    the entry, and the next pass did it all again, exiting 1 for the job's whole MinJobAge."""
    from slurm_horus.ledger.requeue import journal_read, tend

    journal = str(tmp_path / "oom-requeues.json")
    jobs = [_failed_oom_job(requeue=False), {**_failed_oom_job(batch_flag=False), "job_id": 1796}]
    slurm = _tend_slurm(monkeypatch, tmp_path, jobs)
    for _ in range(2):
        errors = []
        assert tend(on_error=errors.append, journal=journal) == []
        assert errors == [] and journal_read(journal) == {}
    assert not [c for c in slurm.calls if c[:2] == ["scontrol", "requeuehold"]]


def test_a_requeue_slurm_refuses_for_good_is_final(monkeypatch, tmp_path):
    """Where squeue does not say (a JSON without the flags), Slurm's refusal is final: no
    journal entry left for heal to drop and the next pass to write again, no failed pass."""
    from slurm_horus.ledger.requeue import journal_read, tend

    journal = str(tmp_path / "oom-requeues.json")
    job = _failed_oom_job()
    job.pop("requeue")
    slurm = _tend_slurm(monkeypatch, tmp_path, [job])
    errors, notes = [], []
    assert tend(on_error=errors.append, journal=journal) == []
    assert errors == [] and journal_read(journal) == {}
    assert [c[:2] for c in slurm.calls if c[0] == "scontrol"] == [["scontrol", "requeuehold"]]
    # said once a pass, as a note, not as a failure (the pass exits 0)
    assert tend(on_error=errors.append, journal=journal, on_note=notes.append) == []
    assert errors == [] and journal_read(journal) == {}
    assert len(notes) == 1 and "presently disabled" in notes[0] and "1795" in notes[0]
    # any other failure of requeuehold (a timeout, maybe after Slurm acted) stays journaled
    slurm.refusal = "timed out after 30 s"
    assert tend(on_error=errors.append, journal=journal, on_note=notes.append) == []
    assert len(errors) == 1 and list(journal_read(journal)) == ["1795"]


@pytest.mark.parametrize("answer,failed", [
    ("scontrol update JobId=1795: Job is no longer pending execution for job 1795", False),  # started
    ("scontrol update JobId=1795: Job has already finished for job 1795", False),  # 25.11, ended
    ("scontrol update JobId=1795: Invalid job id specified for job 1795", False),  # purged
    ("scontrol update JobId=1795: timed out after 30 s", True),
])
def test_a_job_that_started_before_its_reshape_is_no_failed_pass(monkeypatch, tmp_path, answer, failed):
    """A job Slurm started between the pass's read of the queue and its scontrol update (the
    answers recorded from 25.11) had made the pass exit 1, noisy under cron: it is a note."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger import requeue

    _tend_slurm(monkeypatch, tmp_path, [{**_failed_oom_job(), "job_state": ["PENDING"]}])
    monkeypatch.setattr(requeue, "oom_actions", lambda *a, **k: [])
    monkeypatch.setattr(requeue, "pressure_actions", lambda *a, **k: [
        requeue.Action(1795, "spread", "gres/gpu:1", "horus-queue:v1;action=spread")])

    def reshape(*a, **k):
        raise HorusError(answer)

    monkeypatch.setattr(requeue, "reshape", reshape)
    errors, notes = [], []
    assert requeue.tend(on_error=errors.append, on_note=notes.append, journal=str(tmp_path / "j.json")) == []
    assert (len(errors), len(notes)) == ((1, 0) if failed else (0, 1)), (errors, notes)


def _pressed_slurm(monkeypatch, tmp_path, version):
    """requeue.run answering one pass of tend() on Slurm ``version``: every A100 busy and a job
    the hook kept whole for its utilization waiting for one; records the scontrol updates."""
    import json as _json

    from slurm_horus.ledger import requeue

    (tmp_path / "policy.conf").write_text("")
    monkeypatch.setenv("HORUS_POLICY", str(tmp_path / "policy.conf"))
    monkeypatch.setattr(requeue, "slurm_version", lambda fresh=False: version)
    job = {**_failed_oom_job(), "job_state": ["PENDING"], "state_reason": "Resources",
           "tres_per_node": "gres/gpu:a100:1", "admin_comment": EXCL, "submit_time": 1_700_000_000}
    updates = []

    def run(args, timeout=30):
        if args[:2] == ["squeue", "--json"]:
            return _json.dumps({"jobs": [job]})
        if args[:3] == ["scontrol", "-d", "show"]:
            return "NodeName=n1 State=MIXED Gres=gpu:a100:4,shard:a100:400 GresUsed=gpu:a100:4(IDX:0-3)\n"
        updates.append(args)
        tres = [x.split("=", 1)[1] for x in args if x.startswith("TresPerNode=")]
        if tres:  # as Slurm 23.02+ applies it: what the job will be allocated
            job["tres_req_str"] = "{}={}".format(*tres[0].rsplit(":", 1))
        return ""

    monkeypatch.setattr(requeue, "run", run)
    return updates


@pytest.mark.parametrize("dry_run", [True, False])
def test_no_pack_is_tried_where_slurm_refuses_every_one(monkeypatch, tmp_path, dry_run):
    """22.05 refuses a pending job's gpu -> shard ("Invalid generic resource"): every pass under
    pressure tried, failed and exited 1, and the timer's unit failed every minute; a dry run
    said it would pack."""
    from slurm_horus.ledger.requeue import tend

    for version, packs in (("22.05.8", []), ("25.11.7", ["pack"])):
        updates = _pressed_slurm(monkeypatch, tmp_path, version)
        errors = []
        done = tend(mem_shards=lambda *a: 1, min_wait_s=0, dry_run=dry_run, job_ids={1795},
                    on_error=errors.append, journal=str(tmp_path / "j.json"))
        assert [a.kind for a in done] == packs and errors == [], (version, errors)
        if not packs:
            assert updates == []


def test_a_loop_sees_slurm_upgraded_under_it(monkeypatch, tmp_path):
    """`horus-admin queue --interval` is one process for every pass: the version was read once,
    so a loop started on 22.05 never packed after an upgrade to 25.11 (and would have gone on
    packing after a downgrade)."""
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import tend
    from slurm_horus.slurm import commands

    versions = iter(["slurm-wlm 22.05.8\n", "slurm 25.11.7\n"])
    monkeypatch.setattr(commands, "_version", [])
    monkeypatch.setattr(commands, "run", lambda args, timeout=30: next(versions))
    kinds = []
    for _ in range(2):
        _pressed_slurm(monkeypatch, tmp_path, None)
        monkeypatch.setattr(requeue, "slurm_version", commands.slurm_version)
        kinds.append([a.kind for a in tend(mem_shards=lambda *a: 1, min_wait_s=0, dry_run=True,
                                          job_ids={1795}, journal=str(tmp_path / "j.json"))])
    assert kinds == [[], ["pack"]]


def test_an_oom_rerun_of_a_whole_gpus_shards_stays_on_its_type():
    """Where Slurm will not turn shards into a gpu (22.05) the rerun gets every shard of one
    GPU, untyped and with no Features: it could start on a T4 and, marked, never be recovered
    if it ran out there.  Its type is pinned as a pack's is; for a job the hook left untyped,
    the type of the node it ran out of memory on."""
    oom = lambda r: "torch.OutOfMemoryError: CUDA out of memory.\n"  # noqa: E731
    nodes = [{"NodeName": "gpu-a100", "State": "IDLE", "Gres": "gpu:a100:4,shard:a100:400", "GresUsed": ""},
             {"NodeName": "gpu-t4", "State": "IDLE", "Gres": "gpu:t4:2,shard:t4:200", "GresUsed": ""}]
    jobs = [rec(1, "FAILED", "gres:shard:26", ANY_SHARED, NodeList="gpu-a100"),
            rec(2, "FAILED", "gres:shard:26", ANY_SHARED, NodeList="gpu-t4", Features="ib"),
            rec(3, "FAILED", "gres:shard:a100:30", SHARED),  # type_via = gres: no Features
            rec(4, "FAILED", "gres:shard:26", ANY_SHARED, NodeList="gpu-a100,gpu-t4")]  # which one?
    acts = oom_actions(jobs, oom, shards_per_gpu(nodes), node_gpu_types(nodes), nodes, {"a100", "t4"})
    assert [(a.job_id, a.tres, a.fallback, a.features) for a in acts] == [
        (1, "gres:gpu:a100:1", "gres:shard:100", "a100"),
        (2, "gres:gpu:t4:1", "gres:shard:100", "ib&t4"),
        (3, "gres:gpu:a100:1", "gres:shard:100", "a100"),
        (4, "gres:gpu:1", "gres:shard:100", None)]


def test_a_fallback_keeps_the_features_that_pin_its_type(monkeypatch, tmp_path):
    """The OOM rerun's Features went with the refused gpu update only: its fallback shards
    were asked bare."""
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, apply

    slurm = _Slurm(tres="gres/shard=100", fail=("scontrol update JobId=1795 TresPerNode=gres/gpu",),
                   refusal="Invalid generic resource (gres) specification")
    monkeypatch.setattr(requeue, "run", slurm)
    a = Action(1795, "oom-requeue", "gres/gpu:a100:1", "horus-queue:v1;action=oom-requeue;from=shard:30",
               "gres/shard:100", features="a100")
    assert apply(a, SHARED, journal=str(tmp_path / "j.json")) == "gres/shard:100"
    assert ["scontrol", "update", "JobId=1795", "TresPerNode=gres/shard:100", "Features=a100"] in slurm.calls


def test_a_pack_or_spread_leaves_a_job_changed_since_the_pass_read_it(monkeypatch):
    """The update was computed from the pass's read: a user's scontrol update of the job's
    GRES or constraint in between was overwritten; the node count squeue shows a pending job,
    Slurm's own estimate, is no change of the user's."""
    import json as _json

    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import Action, JobChanged, JobMovedOn, apply

    seen = rec(1795, "PENDING", "gres/gpu:a100:1", EXCL, Features="")
    now = {"job_id": 1795, "job_state": "PENDING", "tres_per_node": "gres/gpu:a100:1",
           "admin_comment": EXCL, "features": "", "node_count": 1, "tres_req_str": "gres/shard=50"}
    calls = []

    def run(args, timeout=30):
        calls.append(args)
        return _json.dumps({"jobs": [now]}) if args[0] == "squeue" else ""

    monkeypatch.setattr(requeue, "run", run)
    a = Action(1795, "pack", "gres/shard:50", "horus-queue:v1;action=pack;from=gpu:1", features="a100")
    for field, value in (("tres_per_node", "gres/gpu:a100:2"), ("features", "ib"),
                         ("admin_comment", EXCL + " noted")):
        now.update({field: value})
        calls.clear()
        with pytest.raises(JobChanged):
            apply(a, EXCL, "gres/gpu:a100:1", "", seen=seen)
        assert [c[0] for c in calls] == ["squeue"], field  # nothing changed
        now.update({"tres_per_node": "gres/gpu:a100:1", "features": "", "node_count": 1, "admin_comment": EXCL})
    now["job_state"] = "RUNNING"
    with pytest.raises(JobMovedOn):
        apply(a, EXCL, "gres/gpu:a100:1", "", seen=seen)
    now.update({"job_state": "PENDING", "node_count": 2})  # the scheduler's estimate moved
    assert apply(a, EXCL, "gres/gpu:a100:1", "", seen=seen) == "gres/shard:50"
    assert ["scontrol", "update", "JobId=1795", "TresPerNode=gres/shard:50", "Features=a100"] in calls


def test_pressure_counts_the_idle_gpus_of_the_jobs_own_partitions():
    """Idle A100s of another partition are none of a job's: summed over the cluster, they had
    kept three jobs waiting for a full partition whole (and spread a packed one back) while
    its own A100s were all busy."""
    full = {"NodeName": "a", "State": "MIXED", "Partitions": "lab-a", "Gres": "gpu:a100:4,shard:a100:400",
            "GresUsed": "gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)"}
    idle = {"NodeName": "b", "State": "IDLE", "Partitions": "lab-b", "Gres": "gpu:a100:4,shard:a100:400",
            "GresUsed": ""}
    waiting = [rec(i, "PENDING", "gres:gpu:a100:1", EXCL, Partition="lab-a") for i in (1, 2, 3)]
    acts = pressure_actions(waiting, [full, idle], 50, lambda *a: 1, 0, now=1.9e9)
    assert sorted((a.job_id, a.kind) for a in acts) == [(1, "pack"), (2, "pack"), (3, "pack")]
    packed = rec(4, "PENDING", "gres/shard:a100:50", EXCL + " horus-queue:v1;action=pack;from=gpu:1",
                 Partition="lab-a")
    assert [a.kind for a in pressure_actions([packed], [full, idle], 50, lambda *a: 1, 0, now=1.9e9)] == []
    # in the partition of the idle node, or in both, the idle A100s are theirs
    assert pressure_actions([{**r, "Partition": "lab-b"} for r in waiting], [full, idle], 50,
                            lambda *a: 1, 0, now=1.9e9) == []
    assert [a.kind for a in pressure_actions([{**packed, "Partition": "lab-a,lab-b"}], [full, idle], 50,
                                             lambda *a: 1, 0, now=1.9e9)] == ["spread"]
    # the hook's pressure file is per type over the cluster, as the hook reads it
    assert pressure_types(waiting, [full, idle]) == []


def test_an_unknown_slurm_version_stops_packing_not_the_oom_requeues(monkeypatch, tmp_path):
    """The version decides only whether a pack may be tried: a `sinfo --version` that failed had
    stopped the whole pass, the OOM requeues (which need no version) with it."""
    from slurm_horus.errors import HorusError
    from slurm_horus.ledger import requeue
    from slurm_horus.ledger.requeue import tend

    slurm = _tend_slurm(monkeypatch, tmp_path, [_failed_oom_job()])

    def no_version(fresh=False):
        raise HorusError("sinfo --version: timed out after 30 s")

    monkeypatch.setattr(requeue, "slurm_version", no_version)
    errors = []
    tend(on_error=errors.append, journal=str(tmp_path / "oom-requeues.json"))
    assert any(c[:2] == ["scontrol", "requeuehold"] for c in slurm.calls)
    assert any(e.startswith("no pack this pass: sinfo --version") for e in errors), errors


def test_overlapping_partitions_share_one_pool_of_idle_gpus():
    """A scavenger partition over a lab's nodes: counted apart, each partition took the one idle
    A100 they share as its own (one job waiting in each: no pressure), so two of three waiting
    jobs stayed whole where only one can start, and a packed one was spread back."""
    a = {"NodeName": "a", "State": "MIXED", "Partitions": "short,all", "Gres": "gpu:a100:4,shard:a100:400",
         "GresUsed": "gpu:a100:3(IDX:0-2),shard:a100:0(IDX:N/A)"}
    b = {"NodeName": "b", "State": "MIXED", "Partitions": "all", "Gres": "gpu:a100:4,shard:a100:400",
         "GresUsed": "gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)"}
    jobs = [rec(1, "PENDING", "gres:gpu:a100:1", EXCL, Partition="short", SubmitTime="2026-01-01T00:00:01"),
            rec(2, "PENDING", "gres:gpu:a100:1", EXCL, Partition="all", SubmitTime="2026-01-01T00:00:02"),
            rec(3, "PENDING", "gres:gpu:a100:1", EXCL, Partition="all", SubmitTime="2026-01-01T00:00:03")]
    acts = pressure_actions(jobs, [a, b], 50, lambda *z: 1, 0, now=1.9e9)
    assert sorted((x.job_id, x.kind) for x in acts) == [(1, "pack"), (2, "pack")]
    packed = rec(4, "PENDING", "gres/shard:a100:50", EXCL + " horus-queue:v1;action=pack;from=gpu:1",
                 Partition="short")
    acts = pressure_actions([packed, *jobs[1:]], [a, b], 50, lambda *z: 1, 0, now=1.9e9)
    assert 4 not in [x.job_id for x in acts]  # still three waiting for the one idle GPU: kept packed
