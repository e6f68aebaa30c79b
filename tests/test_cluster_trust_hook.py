"""The job-submit hook's trust policy on the real local Slurm 22.05 cluster (tests/cluster/up;
source tests/cluster/env.sh): slurmctld loads etc/job_submit.lua and the shipped
etc/horus_policy.conf (raw_shards = whole, min_mem_mib = 512) through symlinks.

Every job is submitted held (--hold): the hook has decided by then, and a held job takes no GPU
from the other tests running on the cluster. Each test cancels only the jobs it submitted. The
shipped policy file and the site's claim record are never changed here (other tests run beside
these); refuse mode and the claim record are covered in Lua by tests/test_job_submit_trust.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from slurm_horus.slurm.hint import HookDecision, parse_decision
from slurm_horus.slurm.parse import parse_pipe_table

pytestmark = pytest.mark.cluster


def tres(s):
    """TresPerNode in 22.05's spelling: 23.11+ writes gres/shard:N where 22.05 wrote gres:shard:N."""
    return s.replace("gres/", "gres:") if s else s


def _cluster_ok():
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF unset: start the cluster (bash tests/cluster/up; source tests/cluster/env.sh)"
    if not shutil.which("sbatch"):
        return "sbatch not installed"
    try:
        cp = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except Exception as e:  # noqa: BLE001
        return f"scontrol ping failed: {e}"
    if cp.returncode != 0 or "UP" not in cp.stdout:
        return "slurmctld not up"
    return None


_why = _cluster_ok()
if _why:
    pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=_why)]

SHA = "c" * 64


@pytest.fixture()
def submit():
    mine: list[str] = []

    def sbatch(*args: str):
        # root's own account: tests/test_cluster_trust.py's sync flags account horus (bob's
        # forged jobs), which the hook applies to every job in it, root's default included
        cp = subprocess.run(["sbatch", "--hold", "--parsable", "-A", "root", "-J", "horus-trust-test", *args,
                             "--wrap", "true"], capture_output=True, text=True, timeout=60)
        if cp.returncode == 0:
            jid = cp.stdout.strip().split(";")[0]
            mine.append(jid)
            return jid, cp.stderr
        return None, cp.stderr

    yield sbatch
    if mine:
        subprocess.run(["scancel", *mine], capture_output=True, timeout=60)


def show(jid: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", jid], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    fields = {}
    for key in ("TresPerNode", "AdminComment", "Comment"):  # alone on their line
        m = re.search(rf"(?:^|\s){key}=(.*?)\s*$", out, re.M)
        fields[key] = m.group(1) if m else None
    m = re.search(r"(?:^|\s)Features=(\S*)", out, re.M)
    fields["Features"] = m.group(1) if m else None
    return fields


# said, not passed, when the costing a test checks cannot be seen
RECORDED = "the site's claim record (other tests' syncs) lists this user: the hook gave a whole GPU"


def _record_says_whole(admin: str | None) -> bool:
    """The site's claim record (written by other tests' horus-admin sync) may list this uid."""
    return bool(admin) and "claim record:" in admin


@pytest.mark.parametrize("gres,whole", [("shard:3", "gres:gpu:1"), ("shard:a100:30", "gres:gpu:a100:1"),
                                        ("shard:250", "gres:gpu:3")])
def test_raw_shard_request_gets_whole_gpus(submit, gres, whole):
    jid, err = submit(f"--gres={gres}")
    assert jid, err
    f = show(jid)
    assert tres(f["TresPerNode"]) == whole
    assert "whole GPU, no shards" in f["AdminComment"]
    assert "horus: exclusive" in err  # the user is told


def test_forged_tiny_hint_is_costed_at_the_memory_floor(submit):
    jid, err = submit("--gres=gpu:1", "--comment", "horus:v1;t4=1/1/1")
    assert jid, err
    f = show(jid)
    if _record_says_whole(f["AdminComment"]):
        assert tres(f["TresPerNode"]) == "gres:gpu:1"
        pytest.skip(RECORDED)
    # 512 MiB on a 15360 MiB t4 at a 90 % pack limit: 4 shards (1 MiB alone would give 2)
    assert tres(f["TresPerNode"]) == "gres:shard:4", f
    assert "mem 512 MiB" in f["AdminComment"]


def test_workload_token_is_kept_and_ignored(submit):
    comment = f"my run horus:v1;t4=1/1/1 horus-job:v1;sha={SHA};bs=8;task=train;model=/x/horus:v1%3Bt4=9/9/9"
    jid, err = submit("--gres=gpu:1", "--comment", comment)
    assert jid, err
    f = show(jid)
    assert f["Comment"] == comment
    assert "ignored hint" not in (f["AdminComment"] or "")
    if _record_says_whole(f["AdminComment"]):
        pytest.skip(RECORDED)
    assert tres(f["TresPerNode"]) == "gres:shard:4"


def test_valid_hint_beside_own_shard_request_is_costed_from_the_hint(submit):
    jid, err = submit("--gres=shard:1", "--comment", "horus:v1;t4=20/3000/3500")
    assert jid, err
    f = show(jid)
    if _record_says_whole(f["AdminComment"]):
        assert tres(f["TresPerNode"]) == "gres:gpu:1"
        pytest.skip(RECORDED)
    assert tres(f["TresPerNode"]) == "gres:shard:26" and f["Features"] == "t4"


def test_decision_token_reaches_scontrol_and_sacct(submit):
    """The token slurmctld stores is the one Python reads, in scontrol and (once the job ended) sacct."""
    jobs = {"light": ("--gres=gpu:1", "--comment", "horus:v1;t4=20/3000/3500"),
            "heavy": ("--gres=gpu:1", "--comment", "horus:v1;t4=85/3000/3500"),
            "two": ("--gres=gpu:2", "--comment", "horus:v1;t4=20/3000/3500")}
    want = {"light": HookDecision("shared", "t4", 26, 100), "heavy": HookDecision("exclusive", "t4", reason="util"),
            "two": HookDecision("unchanged", reason="not_handled")}
    ids = {}
    for name, args in jobs.items():
        jid, err = submit(*args)
        assert jid, err
        ids[name] = jid
        admin = show(jid)["AdminComment"]
        if name == "light" and _record_says_whole(admin):
            want[name] = HookDecision("exclusive", "any", reason="record")
        assert parse_decision(admin) == want[name], admin
        assert "horus-decision" not in err  # the user is told the note only
    subprocess.run(["scancel", *ids.values()], capture_output=True, timeout=60)
    deadline = time.time() + 30
    while True:
        out = subprocess.run(["sacct", "-P", "-X", "-j", ",".join(ids.values()), "-o", "JobID,AdminComment"],
                             capture_output=True, text=True, timeout=30).stdout
        by = {r["JobID"]: r["AdminComment"] for r in parse_pipe_table(out)}
        if all(by.get(j) for j in ids.values()) or time.time() > deadline:
            break
        time.sleep(1)
    for name, jid in ids.items():
        assert parse_decision(by.get(jid)) == want[name], (name, by.get(jid))


def test_a_user_cannot_change_the_hint_or_move_a_shared_job_to_another_gpu_type(tmp_path):
    """slurmctld runs the hook's job_modify on a user's scontrol update: once a job is on shards,
    its hint and the features that pin its GPU type stay as the hook costed them."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root: submits and updates as the test user horus-alice")
    try:
        pwd.getpwnam("horus-alice")
    except KeyError:
        pytest.skip("no test user horus-alice (tests/cluster/up makes it)")
    work = tmp_path / "alice"
    work.mkdir()
    shutil.chown(work, "horus-alice")

    def alice(*cmd):
        return subprocess.run(["runuser", "-u", "horus-alice", "--", "env",
                               f"SLURM_CONF={os.environ['SLURM_CONF']}", f"PATH={os.environ['PATH']}",
                               *cmd], capture_output=True, text=True, timeout=60, cwd=work)

    hint = "horus:v1;a100=30/4000/12000"  # its own account: the claim record may flag "horus"
    cp = alice("sbatch", "--hold", "--parsable", "-A", "horus-lab", "-J", "horus-trust-test",
               "--gres=gpu:1", f"--comment=note {hint}", "--wrap", "true")
    assert cp.returncode == 0, cp.stderr
    jid = cp.stdout.strip().split(";")[0]
    try:
        before = show(jid)
        assert tres(before["TresPerNode"]).startswith("gres:shard:") and before["Features"] == "a100"
        for update in ("Features=t4", "Partition=t4", "Comment=horus:v1;a100=30/600/600", "Comment=note"):
            cp = alice("scontrol", "update", f"JobId={jid}", update)
            assert cp.returncode != 0, (update, cp.stdout, cp.stderr)
        assert alice("scontrol", "update", f"JobId={jid}", f"Comment=other note {hint}").returncode == 0
        after = show(jid)
        assert (after["Features"], after["TresPerNode"]) == (before["Features"], before["TresPerNode"])
        assert after["Comment"] == f"other note {hint}"
    finally:
        subprocess.run(["scancel", jid], capture_output=True, timeout=60)


def test_a_job_without_an_account_is_judged_under_its_default_account(tmp_path):
    """A review: slurmctld fills in a job's default account only after the hook, so horus-alice's
    job without -A was shared while the same job with -A horus (her default account, which the
    claim record flags) got a whole GPU.  Both are judged under that account now."""
    import pwd

    from slurm_horus.slurm.policy import policy_value

    if os.geteuid() != 0:
        pytest.skip("needs root: submits as the test user horus-alice")
    try:
        uid = pwd.getpwnam("horus-alice").pw_uid
    except KeyError:
        pytest.skip("no test user horus-alice (tests/cluster/up makes it)")
    out = subprocess.run(["sacctmgr", "-n", "-P", "show", "user", "horus-alice", "format=defaultaccount"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    if not out:
        pytest.skip("horus-alice has no default account")
    account = out[0]
    policy = os.path.join(os.path.dirname(os.environ["SLURM_CONF"]), "horus_policy.conf")
    limit = int(policy_value("underclaim_limit", "3", path=policy))
    try:  # read only: other tests' syncs write it
        lines = [ln.split() for ln in open(policy_value("record_file", path=policy)).read().splitlines()]
    except OSError:
        lines = []
    counts = {(w[0], w[1] if w[0] == "user" else w[2].lower()): int(w[3]) for w in lines if len(w) == 5}
    if counts.get(("user", str(uid)), 0) >= limit:
        pytest.skip("the site's claim record flags horus-alice herself: her account's record is not looked at")
    if counts.get(("account", account.lower()), 0) < limit:
        pytest.skip(f"the site's claim record does not flag account {account} (tests/test_cluster_trust.py's sync does)")
    work = tmp_path / "alice"
    work.mkdir()
    shutil.chown(work, "horus-alice")
    hint = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"
    ids = []
    try:
        for extra in (["-A", account], []):
            cp = subprocess.run(["runuser", "-u", "horus-alice", "--", "env", f"SLURM_CONF={os.environ['SLURM_CONF']}",
                                 f"PATH={os.environ['PATH']}", "sbatch", "--hold", "--parsable", *extra,
                                 "-J", "horus-trust-test", "--gres=gpu:1", f"--comment={hint}", "--wrap", "true"],
                                capture_output=True, text=True, timeout=60, cwd=work)
            assert cp.returncode == 0, cp.stderr
            ids.append(cp.stdout.strip().split(";")[0])
            f = show(ids[-1])
            assert tres(f["TresPerNode"]) == "gres:gpu:1", (extra, f)
            assert f"claim record: account {account} has" in f["AdminComment"], (extra, f["AdminComment"])
            assert parse_decision(f["AdminComment"]).reason == "record"
    finally:
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
