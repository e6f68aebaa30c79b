"""horus-admin queue on the real local cluster: a shared job that dies of a CUDA out-of-memory
error is requeued once on a whole GPU and succeeds, and `horus-admin sync` + hacct then show the
requeue; a job failing for another reason is left alone; a pending job the hook kept whole is
packed into shards under queue pressure and spread back to a whole GPU when GPUs are idle. Each test cancels only the jobs it submitted."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from slurm_horus.slurm import commands as slurm
from slurm_horus.slurm import parse as sp

pytestmark = pytest.mark.cluster
ADMIN = [sys.executable, "-m", "slurm_horus.cli.admin"]
HACCT = [sys.executable, "-m", "slurm_horus.cli.hacct"]
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 39.39 GiB of which 1.06 GiB is free.")


def _why_not():
    if not os.environ.get("SLURM_CONF") or not shutil.which("scontrol"):
        return "no local cluster (bash tests/cluster/up; source tests/cluster/env.sh)"
    cp = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    return None if cp.returncode == 0 and "UP" in cp.stdout else "slurmctld not up"


_why = _why_not()
if _why:
    pytestmark = [pytest.mark.cluster, pytest.mark.skip(reason=_why)]


@pytest.fixture()
def mine():
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def submit(mine, *args):
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True,
                         check=True).stdout
    mine.append(out.strip().split(";")[0])
    return mine[-1]


def job(jid):
    recs = sp.parse_scontrol_records(subprocess.run(["scontrol", "show", "job", jid],
                                                    capture_output=True, text=True).stdout)
    return recs[0] if recs else {}


def req_tres(jid):
    """What Slurm will allocate a pending job: squeue's (22.05's scontrol shows no ReqTRES)."""
    text = subprocess.run(["squeue", "--json", "--all", "--states=all", "--jobs", jid],
                          capture_output=True, text=True).stdout
    recs = sp.squeue_json_records(text, jid)
    return recs[0]["ReqTRES"] if recs else ""


def wait(jid, states, timeout=90):
    end = time.time() + timeout
    while time.time() < end:
        rec = job(jid)
        if rec.get("JobState") in states:
            return rec
        time.sleep(1)
    raise AssertionError(f"job {jid} not in {states}: {job(jid).get('JobState')}")


JOURNAL = f"/tmp/horus-test-queue-{os.getpid()}/oom-requeues.json"  # this run's, not the site's


def queue_cp(*args, path=None):
    """A pass, with ``path`` first on PATH (a stand-in scontrol) when given."""
    env = {**os.environ, "HORUS_QUEUE_JOURNAL": JOURNAL}
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run([*ADMIN, "queue", "--json", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def queue(*args):
    cp = queue_cp(*args)
    assert cp.returncode == 0, cp.stderr
    return [json.loads(x) for x in cp.stdout.splitlines() if x.strip()]


def ledger_env(tmp_path):
    """A private ledger (and the claim record sync writes) for this test's sync and hacct."""
    policy = tmp_path / "policy.conf"
    policy.write_text(f"record_file = {tmp_path / 'record'}\n")
    return {**os.environ, "HORUS_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}",
            "HORUS_SPOOL": str(tmp_path / "spool"), "HORUS_POLICY": str(policy)}


def sacct_finished(jid, state, timeout=90):
    """slurmdbd records a job's end a moment after scontrol shows it: wait for sacct."""
    from slurm_horus.slurm.accounting import parse_sacct_json
    from slurm_horus.slurm.commands import run_sacct

    end = time.time() + timeout
    while not [j for j in parse_sacct_json(run_sacct(time.time() - 3600, time.time()))
               if str(j["job_id"]) == jid and j["state"] == state and j["end_time"]]:
        assert time.time() < end, f"job {jid} never showed up {state} in sacct"
        time.sleep(1)


def hint(util, mem):
    return f"horus:v1;a100={util}/{mem}/{int(mem * 1.15)}"


def test_a_job_that_forges_scontrols_text_moves_no_other_job(mine, tmp_path):
    """A held job whose name and comment read, in scontrol's text, as a FAILED shard job with a
    CUDA OOM in its error file, and as another job (the victim, running): the loop reads
    squeue's JSON, so it neither requeues the victim nor marks it."""
    err = tmp_path / "err"
    err.write_text(OOM + "\n")
    victim = submit(mine, "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null",
                    "--wrap", "sleep 300")
    wait(victim, {"RUNNING"})
    forged = (f"x\nJobId={victim} JobState=FAILED TresPerNode=gres:shard:10\n   StdErr={err}\n"
              "AdminComment=forged")
    attacker = submit(mine, "-H", "--gres=gpu:1", "-J", "y\nJobState=FAILED TresPerNode=gres:shard:10",
                      f"--comment={forged}", "-o", "/dev/null", "--wrap", "true")
    text = subprocess.run(["scontrol", "show", "job", attacker], capture_output=True, text=True).stdout
    assert f"JobId={victim} JobState=FAILED" in text  # what a text reader would have believed
    from slurm_horus.ledger import prolog  # the probe's check of a job's state is not fooled
    assert prolog.job_state(attacker, dict(os.environ)) == "PENDING"
    assert prolog.job_record(victim, dict(os.environ))["JobState"] == "RUNNING"
    acts = queue("--min-wait", "100000", "--jobs", f"{victim},{attacker}")
    assert [a for a in acts if str(a["job_id"]) in (victim, attacker)] == []
    rec = job(victim)
    assert rec.get("JobState") == "RUNNING" and rec.get("Restarts") == "0"
    assert "horus-queue" not in rec.get("AdminComment", "") and "forged" not in rec.get("AdminComment", "")


def test_an_oom_requeue_of_an_array_task_moves_that_task_only(mine, tmp_path):
    """The array's last task keeps the array's own id, which scontrol takes for the whole array:
    the loop names it ArrayJobId_2, so task 1 (done) is neither rerun nor marked."""
    script = tmp_path / "arr.sh"
    script.write_text("#!/bin/bash\n"
                      f'if [ "$SLURM_ARRAY_TASK_ID" = 2 ] && [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then echo "{OOM}" >&2; exit 1; fi\n'
                      "exit 0\n")
    aid = submit(mine, "-a", "1-2", "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null",
                 "-e", str(tmp_path / "e-%A_%a"), str(script))
    t1, t2 = f"{aid}_1", f"{aid}_2"
    wait(t1, {"COMPLETED"})
    wait(t2, {"FAILED"})
    raw = job(t2).get("JobId")
    assert raw == aid  # the task whose own id names the array too
    acts = queue("--min-wait", "100000", "--jobs", raw)
    assert [a["action"] for a in acts if str(a["job_id"]) == raw] == ["oom-requeue"]
    done = job(t1)
    assert done.get("Restarts") == "0" and "horus-queue" not in done.get("AdminComment", "")
    assert done.get("JobState") == "COMPLETED" and job(t2).get("Restarts") == "1"


def test_hacct_names_an_array_and_its_tasks_as_sacct_does(mine, tmp_path):
    """`hacct -j A_T`: the ledger keys the task by its own id (JobIDRaw), found in Slurm's
    accounting (it was refused; int() had read 224_5 as 2245), and shows it as sacct, A_T."""
    aid = submit(mine, "-a", "1-2", "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null",
                 "--wrap", "true")
    for t in (1, 2):
        wait(f"{aid}_{t}", {"COMPLETED"})
    own = {t: job(f"{aid}_{t}").get("JobId") for t in (1, 2)}
    assert own[1] != own[2]
    env = ledger_env(tmp_path)
    for t in (1, 2):
        sacct_finished(own[t], "COMPLETED")
    cp = subprocess.run([*ADMIN, "sync", "-S", "now-1hours"], capture_output=True, text=True, env=env, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = subprocess.run([*HACCT, "-j", f"{aid}_1,{aid}_2", "-P", "-n", "-o", "JobID,JobIDRaw"], capture_output=True,
                        text=True, env=env)
    assert sorted(cp.stdout.split()) == [f"{aid}_1|{own[1]}", f"{aid}_2|{own[2]}"], cp.stdout + cp.stderr
    # the array's own id names every task, as in sacct -j (one task keeps that id as its own)
    cp = subprocess.run([*HACCT, "-j", aid, "-P", "-n", "-o", "JobIDRaw,ArrayJobID"], capture_output=True,
                        text=True, env=env)
    assert sorted(cp.stdout.split()) == sorted([f"{own[1]}|{aid}", f"{own[2]}|{aid}"]), cp.stdout + cp.stderr
    # a task Slurm does not know names no job, as in sacct (it had been an error): alone, none
    # is listed (not every job since midnight); beside a known one, that one
    cp = subprocess.run([*HACCT, "-j", f"{aid}_7", "-P", "-n", "-o", "JobID"], capture_output=True, text=True, env=env)
    assert cp.returncode == 0 and cp.stdout == "" and cp.stderr == "", cp.stdout + cp.stderr
    cp = subprocess.run([*HACCT, "-j", f"{aid}_7,{aid}_2", "-P", "-n", "-o", "JobIDRaw"], capture_output=True,
                        text=True, env=env)
    assert cp.returncode == 0 and cp.stdout.split() == [own[2]], cp.stdout + cp.stderr


def test_an_oom_in_an_error_file_named_by_node_and_task_is_found(mine, tmp_path):
    """22.05's scontrol leaves %N, %n and %t of an output pattern as they are (slurmstepd
    expands them: the batch host's hostname, 0, 0): the loop read a file that does not exist and
    missed the OOM. 25.11's scontrol shows the expanded name."""
    script = tmp_path / "t.sh"
    script.write_text("#!/bin/bash\n"
                      f'if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then echo "{OOM}" >&2; exit 1; fi\nexit 0\n')
    jid = submit(mine, "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null",
                 "-e", str(tmp_path / "e-%N-%t-%n-%%-%j"), str(script))
    wait(jid, {"FAILED"})
    if slurm.slurm_version().startswith("22."):  # 25.11's scontrol expands them itself
        assert "%N" in job(jid).get("StdErr", "")
    acts = queue("--min-wait", "100000", "--jobs", jid)
    assert [a["action"] for a in acts if str(a["job_id"]) == jid] == ["oom-requeue"]


def test_oom_requeue_once_on_a_whole_gpu(mine, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n"
                      'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then echo "ran on $SLURM_JOB_GPUS"; exit 0; fi\n'
                      f'echo "{OOM}" >&2\nexit 1\n')
    other = tmp_path / "bad.sh"
    other.write_text("#!/bin/bash\necho 'ValueError: bad learning rate' >&2\nexit 1\n")
    jid = submit(mine, "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", str(tmp_path / "o-%j"),
                 "-e", str(tmp_path / "e-%j"), str(script))
    bad = submit(mine, "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", str(tmp_path / "b-%j"),
                 str(other))
    first = wait(jid, {"FAILED"})
    assert re.search(r"shard", first.get("TresPerNode", "")), first.get("TresPerNode")
    wait(bad, {"FAILED"})

    acts = queue("--min-wait", "100000", "--jobs", f"{jid},{bad}")  # only this test's jobs
    assert {str(a["job_id"]) for a in acts} <= {jid, bad}
    mine_acts = [a for a in acts if str(a["job_id"]) in (jid, bad)]
    assert [(a["job_id"], a["action"]) for a in mine_acts] == [(int(jid), "oom-requeue")]
    # a whole GPU: gres/gpu (23.02+), or on 22.05, which refuses to turn shards into a gpu,
    # every shard of one A100 (Slurm takes a job's shards from one GPU)
    assert re.fullmatch(r"gres[:/](gpu:a100:1|shard:100)", mine_acts[0]["tres"]), mine_acts
    again = job(jid)
    assert again.get("Restarts") == "1"
    assert re.search(r"action=oom-requeue;from=shard:\d+;to=(gpu:1|shard:100)",
                     again.get("AdminComment", ""))
    done = wait(jid, {"COMPLETED"}, timeout=150)
    # what Slurm allocated to the rerun, not the TresPerNode text (22.05 changes the text of
    # an update it does not apply)
    alloc = done.get("AllocTRES") or done.get("TRES") or ""
    assert re.search(r"gres/gpu(:a100)?=1\b|gres/shard(:a100)?=100\b", alloc), alloc
    assert "ran on" in (tmp_path / f"o-{jid}").read_text()
    # at most once, and the other failure is never requeued
    assert not [a for a in queue("--min-wait", "100000", "--jobs", f"{jid},{bad}") if str(a["job_id"]) in (jid, bad)]
    assert job(bad).get("Restarts") == "0"
    # the ledger records the requeue from the AdminComment sacct returns, and hacct shows it
    env = ledger_env(tmp_path)
    sacct_finished(jid, "COMPLETED")
    cp = subprocess.run([*ADMIN, "sync", "-S", "now-1hours"], capture_output=True, text=True,
                        env=env, timeout=120)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    cp = subprocess.run([*HACCT, "-j", jid, "-P", "-o", "JobID,State,HookAct,QueueAct"],
                        capture_output=True, text=True, env=env)
    print(subprocess.run([*HACCT, "-j", jid], capture_output=True, text=True, env=env).stdout)
    assert cp.stdout.splitlines() == ["JobID|State|HookAct|QueueAct",
                                      f"{jid}|COMPLETED|shared|oom-requeue"], cp.stdout + cp.stderr
    cp = subprocess.run([*HACCT, "-j", jid, "--summary", "--json"], capture_output=True,
                        text=True, env=env)
    q = json.loads(cp.stdout)["queue_actions"]
    assert (q["oom_requeues"], q["oom_requeues_completed"]) == (1, 1), q


def test_an_oom_rerun_of_a_job_of_no_type_gets_a_whole_gpu(mine, tmp_path):
    """type_choice = any (the cluster's policy) gives a job that may share both types untyped
    shards; its OOM rerun had kept them (22.05 refuses shard -> gpu and there was no fallback)
    and failed again."""
    script = tmp_path / "any.sh"
    script.write_text("#!/bin/bash\n"
                      'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then exit 0; fi\n'
                      f'echo "{OOM}" >&2\nexit 1\n')
    jid = submit(mine, "--gres=gpu:1", "--comment=horus:v1;a100=30/3000/3450;t4=30/3000/3450",
                 "-o", "/dev/null", "-e", str(tmp_path / "e-%j"), str(script))
    first = wait(jid, {"FAILED"})
    assert re.fullmatch(r"gres[:/]shard:\d+", first.get("TresPerNode", "")), first.get("TresPerNode")
    gtype = {"gpu-a100": "a100", "gpu-t4": "t4"}[first["NodeList"]]
    acts = [a for a in queue("--min-wait", "100000", "--jobs", jid) if str(a["job_id"]) == jid]
    assert [a["action"] for a in acts] == ["oom-requeue"]
    # kept on the type it ran out of memory on (its node's): 22.05's every shard of one GPU,
    # untyped and unpinned, could have started on the other type
    assert re.fullmatch(rf"gres[:/](gpu:{gtype}:1|shard:100)", acts[0]["tres"]), acts
    assert job(jid)["Features"] == gtype
    done = wait(jid, {"COMPLETED"}, timeout=150)
    assert done["NodeList"] == first["NodeList"]
    alloc = done.get("AllocTRES") or done.get("TRES") or ""
    assert re.search(r"gres/gpu(:\w+)?=1\b|gres/shard(:\w+)?=100\b", alloc), alloc


def test_pack_under_pressure_then_spread(mine, tmp_path):
    out = ["-o", os.devnull]  # no slurm-N.out in the working tree
    fillers = [submit(mine, "--gres=gpu:a100:1", "-C", "a100", *out, "--wrap", "sleep 300")
               for _ in range(4)]
    for f in fillers:
        wait(f, {"RUNNING", "PENDING"})
    heavy = submit(mine, "--gres=gpu:1", f"--comment={hint(95, 6000)}", *out, "--wrap",
                   "sleep 1")
    rec = wait(heavy, {"PENDING"})
    assert re.search(r"gpu(:a100)?:1$", rec.get("TresPerNode", "")), rec.get("TresPerNode")
    assert "action=exclusive" in rec.get("AdminComment", "")
    if slurm.slurm_version().startswith("22."):
        # 22.05 refuses every pack (scontrol update: Invalid generic resource): every pass
        # under pressure had tried, failed and exited 1 (the timer's unit failed every
        # minute); no pack is tried there, and a dry run says the same
        from slurm_horus.ledger.requeue import pressure_actions

        for f in fillers:
            wait(f, {"RUNNING"})
        recs = sp.squeue_json_records(slurm.run(["squeue", "--json", "--all", "--states=all"]))
        nodes = sp.parse_scontrol_records(slurm.run(["scontrol", "-d", "show", "node"]))
        assert [a.kind for a in pressure_actions(recs, nodes, 50, lambda *a: 1, 0, time.time(), type_features={"a100", "t4"})
                if str(a.job_id) == heavy] == ["pack"]  # what the loop had tried
        assert [a for a in queue("--dry-run", "--min-wait", "0", "--jobs", heavy)] == []
        assert [a for a in queue("--min-wait", "0", "--jobs", heavy)] == []  # exit status 0
        assert re.search(r"gpu(:a100)?:1$", job(heavy)["TresPerNode"]) and "horus-queue" not in job(heavy)["AdminComment"]
        return
    end = time.time() + 60  # every A100 busy (ours, or other tests')
    while time.time() < end and not [a for a in queue("--dry-run", "--min-wait", "0", "--jobs", heavy)
                                     if str(a["job_id"]) == heavy]:
        time.sleep(2)
    # (a held job is no load and is not packed: it waits while every A100 is the fillers')
    packed = [a for a in queue("--min-wait", "0", "--jobs", heavy) if str(a["job_id"]) == heavy]
    assert packed and packed[0]["action"] == "pack", packed
    assert re.search(r"shard:50$", job(heavy).get("TresPerNode", ""))
    assert "gres/shard=50" in job(heavy).get("ReqTRES", "")  # applied, not only written
    assert job(heavy).get("Features") == "a100"  # untyped shards kept on the A100s
    # held now, it would not start on its shards once the fillers go; a packed job held gets
    # its own request back, as does one whose pressure is gone
    subprocess.run(["scontrol", "hold", heavy], check=True, capture_output=True)
    subprocess.run(["scancel", *fillers], check=True)
    end = time.time() + 60
    spread = []
    while time.time() < end and not spread:
        time.sleep(2)
        spread = [a for a in queue("--min-wait", "0", "--jobs", heavy) if str(a["job_id"]) == heavy]
    assert spread and spread[0]["action"] == "spread", spread
    rec = job(heavy)
    assert re.search(r"gpu:a100:1$", rec.get("TresPerNode", "")) and "gres/gpu=1" in rec["ReqTRES"]
    assert [t.split(";")[1] for t in re.findall(r"horus-queue:v1;[^ ]*", rec["AdminComment"])] \
        == ["action=pack", "action=spread"]


def test_queue_pressure_packs_at_submission_on_every_slurm(mine, monkeypatch):
    """Slurm 22.05 cannot reshape a pending job, so the loop also tells the hook: a pass writes
    the policy's pressure_file (types where a new job would find no idle GPU), and a job the hook
    would keep whole for its utilization on such a type is submitted onto shards instead, if
    its utilization is within the limit the loop derives from the policy's slowdown_bound."""
    from slurm_horus.slurm.policy import policy_value

    site = os.path.join(os.path.dirname(os.environ["SLURM_CONF"]), "horus_policy.conf")
    monkeypatch.setenv("HORUS_POLICY", site)  # the loop reads the policy slurmctld's hook reads
    pressure = policy_value("pressure_file")
    assert pressure, "tests/cluster/up sets pressure_file in the cluster's policy"
    strict = os.path.join(os.path.dirname(pressure), "horus_policy_strict.conf")
    out = ["-o", os.devnull]
    try:
        fillers = [submit(mine, "--gres=gpu:a100:1", "-C", "a100", *out, "--wrap", "sleep 300")
                   for _ in range(5)]  # four run, one waits: an A100 queue, no A100 idle
        wait(fillers[-1], {"PENDING"})
        for f in fillers[:-1]:
            wait(f, {"RUNNING"})
        heavy = f"--comment={hint(95, 6000)}"
        before = submit(mine, "--gres=gpu:1", heavy, *out, "--wrap", "sleep 1")
        assert "action=exclusive;type=a100;reason=util" in job(before)["AdminComment"]
        queue("--min-wait", "100000")  # a whole pass: it writes the pressure file
        assert open(pressure).read().splitlines()[1:] == ["util_limit_milli 100000", "pressure a100"]
        during = submit(mine, "--gres=gpu:1", heavy, *out, "--wrap", "sleep 1")
        rec = job(during)
        assert rec["AdminComment"].endswith(
            "horus-decision:v1;action=shared;type=a100;shards=50/100;reason=pressure;unpressed=gpu"), rec
        assert re.search(r"shard:50$", rec.get("TresPerNode", "")), rec.get("TresPerNode")
        # an admin's slowdown bound of 1.5 (the loop's policy): the limit the loop writes keeps
        # the 95 % job whole, while an 80 % one still packs
        with open(site) as src, open(strict, "w") as dst:
            dst.write(src.read() + "\nslowdown_bound = 1.5\n")
        monkeypatch.setenv("HORUS_POLICY", strict)
        queue("--min-wait", "100000")
        limit = int(open(pressure).read().splitlines()[1].split()[1])
        assert 80000 < limit < 85000, limit
        said = subprocess.run([*ADMIN, "queue", "--dry-run", "--jobs", before], capture_output=True,
                              text=True, timeout=120).stdout.splitlines()[0]
        assert said == f"slowdown_bound 1.5 for the median job: under queue pressure, jobs up to " \
            f"{limit / 1000:.1f} % predicted utilization pack", said
        strict_heavy = submit(mine, "--gres=gpu:1", heavy, *out, "--wrap", "sleep 1")
        assert "action=exclusive;type=a100;reason=util" in job(strict_heavy)["AdminComment"]
        mid = submit(mine, "--gres=gpu:1", f"--comment={hint(80, 6000)}", *out, "--wrap", "sleep 1")
        assert job(mid)["AdminComment"].endswith("shards=50/100;reason=pressure;unpressed=gpu"), job(mid)
        # the default bound of 2 for the 95th-percentile job of the spread: up to 44 %, so the
        # 80 % job now stays whole
        with open(site) as src, open(strict, "w") as dst:
            dst.write(src.read() + "\nslowdown_tail = p95\n")
        queue("--min-wait", "100000")
        limit = int(open(pressure).read().splitlines()[1].split()[1])
        assert 42000 < limit < 47000, limit
        tail_mid = submit(mine, "--gres=gpu:1", f"--comment={hint(80, 6000)}", *out, "--wrap", "sleep 1")
        assert "action=exclusive;type=a100;reason=util" in job(tail_mid)["AdminComment"], job(tail_mid)
        monkeypatch.setenv("HORUS_POLICY", site)
        subprocess.run(["scancel", *fillers], check=True)
        end = time.time() + 60
        while time.time() < end and "pressure a100" in open(pressure).read():
            time.sleep(2)
            queue("--min-wait", "100000")  # GPUs idle again: the next pass clears it
        assert open(pressure).read().splitlines()[2:] == []
    finally:
        for f in (pressure, strict):
            os.unlink(f) if os.path.exists(f) else None


def test_jobs_shared_for_pressure_get_back_what_the_hook_would_have_given(mine, monkeypatch):
    """The hook packs a 95 % job it would keep whole (unpressed=gpu) and caps a 60 % job's 67
    shards at 50 (unpressed=67) under pressure; once the A100s are idle and the two still wait
    (here for memory a CPU job holds), the loop gives the first a whole GPU (every shard of
    one on 22.05) and the second its 67 shards, not a whole GPU, on either Slurm."""
    from slurm_horus.slurm.policy import policy_value

    site = os.path.join(os.path.dirname(os.environ["SLURM_CONF"]), "horus_policy.conf")
    monkeypatch.setenv("HORUS_POLICY", site)
    pressure = policy_value("pressure_file")
    out = ["-o", os.devnull]
    try:
        fillers = [submit(mine, "--gres=gpu:a100:1", "-C", "a100", *out, "--wrap", "sleep 300")
                   for _ in range(5)]  # four run, one waits: no A100 idle
        wait(fillers[-1], {"PENDING"})
        queue("--min-wait", "100000")  # writes the pressure file
        assert "pressure a100" in open(pressure).read()
        # -H: they wait for a CPU job's memory, not for a GPU, once released below
        big = ["-H", "--mem=40G", *out, "--wrap", "sleep 1"]
        heavy = submit(mine, "--gres=gpu:1", f"--comment={hint(95, 6000)}", *big)
        capped = submit(mine, "--gres=gpu:1", f"--comment={hint(60, 6000)}", *big)
        for jid, unpressed in ((heavy, "gpu"), (capped, "67")):
            rec = job(jid)
            assert rec["AdminComment"].endswith(f"shards=50/100;reason=pressure;unpressed={unpressed}"), rec
            assert re.search(r"shard:50$", rec["TresPerNode"]), rec
        hog = submit(mine, "-p", "a100", "--mem=30G", *out, "--wrap", "sleep 300")
        wait(hog, {"RUNNING"})
        subprocess.run(["scancel", *fillers], check=True)
        subprocess.run(["scontrol", "release", heavy, capped], check=True)
        end = time.time() + 60
        acts = []
        while time.time() < end and len(acts) < 2:
            time.sleep(2)
            acts += [a for a in queue("--min-wait", "100000", "--jobs", f"{heavy},{capped}")
                     if a["action"] == "spread"]
        got = {str(a["job_id"]): a["tres"] for a in acts}
        assert set(got) == {heavy, capped}, acts
        assert re.fullmatch(r"gres[:/](gpu:a100:1|shard:100)", got[heavy]), acts
        assert re.fullmatch(r"gres[:/]shard:67", got[capped]), acts
        assert re.search(r"gres/(gpu=1|shard=100)\b", req_tres(heavy)), req_tres(heavy)
        rec = job(capped)
        assert "gres/shard=67" in req_tres(capped) and rec["Features"] == "a100", rec
        assert rec["AdminComment"].endswith("horus-queue:v1;action=spread;from=shard:50;to=shard:67"), rec
        # once: the next pass leaves both as they are
        assert not [a for a in queue("--min-wait", "100000", "--jobs", f"{heavy},{capped}")]
    finally:
        if pressure and os.path.exists(pressure):
            os.unlink(pressure)


def test_an_oom_of_a_job_slurm_will_not_requeue_is_left_alone(mine, tmp_path):
    """--no-requeue: scontrol refuses its requeue ("Requested operation is presently disabled"),
    so every pass had journaled it, failed and exited 1 for the job's whole MinJobAge."""
    jid = submit(mine, "--no-requeue", "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null",
                 "-e", str(tmp_path / "e-%j"), "--wrap", f"echo '{OOM}' >&2; exit 1")
    wait(jid, {"FAILED"})
    assert "shard" in job(jid)["TresPerNode"] and job(jid)["Requeue"] == "0"
    for _ in range(2):
        assert not [a for a in queue("--min-wait", "100000", "--jobs", jid)]  # exit status 0
        assert not os.path.exists(JOURNAL) or jid not in open(JOURNAL).read()


def _gpu_of(jid):
    """The GPU index Slurm gave a running job (scontrol -d: GRES=shard:50(IDX:1) on 22.05,
    shard:50(0/100,50/100,...) on 25.11)."""
    recs = sp.parse_scontrol_records(subprocess.run(["scontrol", "-d", "show", "job", jid],
                                                    capture_output=True, text=True).stdout)
    idx = [g["idx"] for d in sp.job_gres_detail(recs[0]) for g in d["gres"] if g["idx"]]
    return idx[0][0] if idx else None


def test_pack_heavy_always_spreads_while_idle_and_packs_when_full(mine, monkeypatch):
    """Policy pack_heavy = always on Slurm's least-loaded shard placement (LL_SHARED_GRES, set
    by tests/cluster/up on 25.11): heavy jobs take shards at submission, Slurm puts each on an
    idle GPU while there is one, and the next joins a GPU once none is idle."""
    conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    if "LL_SHARED_GRES" not in conf:
        pytest.skip("this Slurm places shard jobs first fit (LL_SHARED_GRES: Slurm 23.11+)")
    from slurm_horus.ledger.publish import write_atomically
    from slurm_horus.slurm.policy import policy_value

    site = os.path.join(os.path.dirname(os.environ["SLURM_CONF"]), "horus_policy.conf")
    monkeypatch.setenv("HORUS_POLICY", site)
    pressure = policy_value("pressure_file")
    text = open(site).read()
    out = ["-o", os.devnull]
    try:
        write_atomically(site, text + "\npack_heavy = always\n")  # reread at every submission
        queue("--min-wait", "100000")  # the loop is alive: a fresh pressure file, no type pressed
        assert open(pressure).read().splitlines()[2:] == []
        heavy = f"--comment={hint(95, 6000)}"
        first = [submit(mine, "--gres=gpu:1", heavy, *out, "--wrap", "sleep 300") for _ in range(4)]
        for jid in first:
            assert job(jid)["AdminComment"].endswith(
                "horus-decision:v1;action=shared;type=a100;shards=50/100;reason=pack_heavy;unpressed=gpu"), job(jid)
            wait(jid, {"RUNNING"})
        gpus = [_gpu_of(jid) for jid in first]
        assert sorted(gpus) == [0, 1, 2, 3], gpus  # spread: one per idle GPU
        fifth = submit(mine, "--gres=gpu:1", heavy, *out, "--wrap", "sleep 300")
        wait(fifth, {"RUNNING"})  # packed beside one of them, not waiting for a whole GPU
        assert _gpu_of(fifth) in gpus
        # the loop does not spread a pack_heavy job back (it never waits for an idle GPU here)
        assert not [a for a in queue("--min-wait", "0", "--jobs", ",".join(first + [fifth]))
                    if a.get("action") == "spread"]
    finally:
        write_atomically(site, text)
        if pressure and os.path.exists(pressure):
            os.unlink(pressure)


def _failing_scontrol(tmp_path, *fields):
    """A stand-in scontrol on PATH that fails an update of ``fields`` as a slurmctld too busy
    to answer does, and runs the real one otherwise."""
    where = tmp_path / "bin"
    where.mkdir(exist_ok=True)
    cases = "|".join(f"{f}=*" for f in fields)
    (where / "scontrol").write_text(
        "#!/bin/bash\n"
        f'for a in "$@"; do case "$a" in {cases}) '
        'echo "slurm_update error: Socket timed out on send/recv operation" >&2; exit 1;; esac; done\n'
        f'exec {shutil.which("scontrol")} "$@"\n')
    os.chmod(where / "scontrol", 0o755)
    return str(where)


def test_an_oom_requeue_happens_once_even_when_its_mark_fails(mine, tmp_path):
    """A first mark that timed out released the job unmarked (on its whole GPU, or after
    GIVE_UP_S on its shards), and its next OOM was requeued again (Restarts=2): the pass said
    nothing and exited 0.  The job stays held until its mark is written; given up on, it is
    released unmarked and the journal keeps it from a second requeue."""
    script = tmp_path / "oom.sh"
    script.write_text(f'#!/bin/bash\necho "{OOM}" >&2\nexit 1\n')  # runs out every time
    jid = submit(mine, "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null",
                 "-e", str(tmp_path / "e-%j"), str(script))
    wait(jid, {"FAILED"})
    no_mark = _failing_scontrol(tmp_path, "AdminComment")
    for _ in range(2):  # requeued and held; the next pass tries its mark again
        cp = queue_cp("--min-wait", "100000", "--jobs", jid, path=no_mark)
        assert cp.returncode == 1 and "did not take its mark" in cp.stderr, cp.stderr
        rec = job(jid)
        assert (rec["JobState"], rec["Restarts"]) == ("PENDING", "1") and "held" in rec["Reason"], rec
        assert "horus-queue" not in rec["AdminComment"]
    # GIVE_UP_S later, with neither a mark nor a whole GPU taken: released on its shards, said
    with open(JOURNAL) as f:
        entries = json.load(f)
    for e in entries.values():
        e["at"] -= 3600
    with open(JOURNAL, "w") as f:
        json.dump(entries, f)
    cp = queue_cp("--min-wait", "100000", "--jobs", jid, path=_failing_scontrol(tmp_path, "AdminComment", "TresPerNode"))
    assert cp.returncode == 1 and "released unmarked" in cp.stderr, cp.stderr
    again = wait(jid, {"FAILED"}, timeout=150)  # out of memory on its shards again
    assert "shard" in again["TresPerNode"] and "horus-queue" not in again["AdminComment"]
    # never requeued a second time, the pass a quiet one
    assert not [a for a in queue("--min-wait", "100000", "--jobs", jid)]
    assert job(jid)["Restarts"] == "1"
    with open(JOURNAL) as f:
        assert json.load(f)[jid]["given_up"]


def test_an_earlier_runs_oom_is_no_evidence(mine, tmp_path):
    """The loop read the error file's tail whatever wrote it: a job appending to a file
    (--open-mode=append) that holds an earlier job's OOM, failing for another reason and
    writing nothing there, was requeued onto a whole GPU."""
    err = tmp_path / "shared-err"
    first = submit(mine, "-o", "/dev/null", "-e", str(err), "--wrap", f"echo '{OOM}' >&2")
    wait(first, {"COMPLETED"})
    time.sleep(2)  # a later second: StartTime is whole seconds
    jid = submit(mine, "--gres=gpu:1", f"--comment={hint(30, 6000)}", "-o", "/dev/null", "-e", str(err),
                 "--open-mode=append", "--wrap", "exit 3")
    wait(jid, {"FAILED"})
    assert OOM in err.read_text()
    assert not [a for a in queue("--min-wait", "100000", "--jobs", jid)]
    assert job(jid)["Restarts"] == "0"
