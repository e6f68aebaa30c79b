"""horus-admin queue, review 8: a job purged under a pass on a Slurm that filters squeue --jobs,
a pack whose shards an admin changed since, and what a pass stopped by SIGTERM says it did."""

import json
import os

import pytest
from click.testing import CliRunner

from slurm_horus.cli.admin import main as admin
from slurm_horus.errors import HorusError
from slurm_horus.ledger import requeue
from slurm_horus.ledger.requeue import Action, JobMovedOn, apply, pressure_actions, tend

EXCL = "horus: exclusive a100 (util 95% >= 70%) horus-decision:v1;action=exclusive;type=a100;reason=util"
IDLE = [{"NodeName": "n1", "State": "IDLE", "Gres": "gpu:a100:4,shard:a100:400",
         "GresUsed": "gpu:a100:0(IDX:N/A),shard:a100:0(IDX:N/A)"}]
PACKED = EXCL + " horus-queue:v1;action=pack;from=gpu:1;to=shard:50"


def test_a_job_purged_before_its_reshape_is_no_failed_pass(monkeypatch):
    """23.02+ applies squeue's --jobs and fails on a job it no longer knows (25.11: "slurm_load_jobs
    error: Invalid job id specified", exit 1): the re-read before a pack or spread made a job
    purged meanwhile a warning and the pass exit 1, where a started or ended one is a note."""
    calls = []

    def run(args, timeout=30):
        calls.append(args)
        if args[0] == "squeue":
            raise HorusError("squeue --json --all: slurm_load_jobs error: Invalid job id specified")
        return ""

    monkeypatch.setattr(requeue, "run", run)
    seen = {"JobId": "1795", "JobState": "PENDING", "TresPerNode": "gres/gpu:a100:1", "AdminComment": EXCL}
    a = Action(1795, "pack", "gres/shard:50", "horus-queue:v1;action=pack;from=gpu:1")
    with pytest.raises(JobMovedOn):
        apply(a, EXCL, "gres/gpu:a100:1", seen=seen)
    assert [c[0] for c in calls] == ["squeue"]  # nothing changed
    monkeypatch.setattr(requeue, "run", lambda args, timeout=30: (_ for _ in ()).throw(
        HorusError("squeue --json --all: timed out after 30 s")))
    with pytest.raises(HorusError, match="timed out"):  # any other failure is still one
        apply(a, EXCL, "gres/gpu:a100:1", seen=seen)


def test_a_pack_whose_shards_another_admin_changed_is_not_spread():
    """A job the loop packed onto 50 shards, then set to 30 by an admin (or its owner, where
    raw_shards = allow): once GPUs were idle the loop gave it a whole GPU over their choice."""
    job = {"JobId": "7", "JobState": "PENDING", "TresPerNode": "gres/shard:30", "AdminComment": PACKED,
           "SubmitTime": "2026-01-01T00:00:00", "Reason": "Resources"}
    held = {**job, "Reason": "JobHeldUser", "Priority": "0"}
    for rec in (job, held):
        assert pressure_actions([rec], IDLE, 50, lambda *a: 1, 0, 1.9e9) == []
        still = {**rec, "TresPerNode": "gres/shard:50"}  # as the loop packed it: spread back
        assert [(a.kind, a.tres) for a in pressure_actions([still], IDLE, 50, lambda *a: 1, 0, 1.9e9)] == [
            ("spread", "gres/gpu:a100:1")]
    # its other GRES ride in the mark (to=shard:50,gres/nvme:1), in either order
    for tres in ("gres/shard:50,gres/nvme:1", "gres/nvme:1,gres/shard:50"):
        mark = EXCL + " horus-queue:v1;action=pack;from=gpu:1;to=" + requeue._short(tres)
        acts = pressure_actions([{**job, "TresPerNode": tres, "AdminComment": mark}], IDLE, 50,
                                lambda *a: 1, 0, 1.9e9)
        assert [a.kind for a in acts] == ["spread"], tres


def _busy_slurm(monkeypatch, tmp_path, signal_on_update=True):
    """requeue.run for one pass on 25.11: every A100 busy and a job the hook kept whole waiting;
    SIGTERM (systemd's stop) arrives during the pack's scontrol update."""
    import signal

    policy = tmp_path / "policy.conf"
    policy.write_text("gpu.a100.mem_mib = 40960\n")
    monkeypatch.setenv("HORUS_POLICY", str(policy))
    monkeypatch.setenv("HORUS_QUEUE_LOCK", str(tmp_path / "run" / "queue.lock"))
    monkeypatch.setenv("HORUS_QUEUE_JOURNAL", str(tmp_path / "oom-requeues.json"))
    monkeypatch.setattr(requeue, "slurm_version", lambda fresh=False: "25.11.7")
    job = {"job_id": 1795, "job_state": ["PENDING"], "state_reason": "Resources", "user_id": 0,
           "tres_per_node": "gres/gpu:a100:1", "admin_comment": EXCL, "submit_time": 1_700_000_000,
           "comment": "horus:v1;a100=30/6000/6900", "priority": 1}
    updates = []

    def run(args, timeout=30):
        if args[:2] == ["squeue", "--json"]:
            return json.dumps({"jobs": [job]})
        if args[:3] == ["scontrol", "-d", "show"]:
            return "NodeName=n1 State=MIXED Gres=gpu:a100:4,shard:a100:400 GresUsed=gpu:a100:4(IDX:0-3)\n"
        updates.append(args)
        tres = [x.split("=", 1)[1] for x in args if x.startswith("TresPerNode=")]
        if tres:
            job["tres_req_str"] = "{}={}".format(*tres[0].rsplit(":", 1))
            if signal_on_update:
                os.kill(os.getpid(), signal.SIGTERM)
        return ""

    monkeypatch.setattr(requeue, "run", run)
    return updates


@pytest.mark.skipif(os.geteuid() != 0, reason="a changing pass runs as root")
@pytest.mark.parametrize("as_json", [False, True])
def test_a_pass_stopped_by_sigterm_still_says_what_it_changed(monkeypatch, tmp_path, as_json):
    """The actions were printed once the whole pass was over: systemd's stop (or its
    TimeoutStartSec) during a pass ended it after the pack it waited for, and the log said
    nothing of the job it had reshaped and marked."""
    updates = _busy_slurm(monkeypatch, tmp_path)
    r = CliRunner().invoke(admin, ["queue", "--min-wait", "0", *(["--json"] if as_json else [])])
    assert r.exit_code == 143
    assert any(a[3].startswith("AdminComment=") for a in updates)  # packed and marked
    out = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if as_json:
        assert [json.loads(ln) for ln in out] == [{"job_id": 1795, "action": "pack", "tres": "gres/shard:50",
                                                   "dry_run": False}]
    else:
        assert out == ["pack job 1795 -> gres/shard:50"]


def test_tend_says_each_action_as_it_is_done(monkeypatch, tmp_path):
    updates = _busy_slurm(monkeypatch, tmp_path, signal_on_update=False)
    said = []
    done = tend(min_wait_s=0, on_action=said.append, journal=str(tmp_path / "j.json"))
    assert said == done and [a.kind for a in said] == ["pack"] and updates


@pytest.mark.parametrize("var", ["HORUS_QUEUE_LOCK", "HORUS_QUEUE_JOURNAL"])
def test_a_relative_lock_or_journal_path_is_one_clear_line(monkeypatch, tmp_path, var):
    """A relative HORUS_QUEUE_LOCK failed with 'No such file or directory' (its folder was '');
    either had named a file in whatever folder the pass ran from."""
    if os.geteuid() != 0:
        pytest.skip("a changing pass runs as root")
    monkeypatch.setenv("HORUS_QUEUE_LOCK", str(tmp_path / "run" / "queue.lock"))
    monkeypatch.setenv("HORUS_QUEUE_JOURNAL", str(tmp_path / "oom-requeues.json"))
    monkeypatch.setenv(var, "queue.state")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(admin, ["queue"])
    assert r.exit_code != 0 and f"{var}='queue.state': give an absolute path" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "queue.state").exists()
