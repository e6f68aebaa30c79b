#!/usr/bin/env python3
"""Record real Slurm interactions from the local test cluster as fixtures.

    tests/cluster/up && source tests/cluster/env.sh && python3 tests/cluster/record_fixtures.py [OUTDIR]
    HORUS_SLURM=25.11 tests/cluster/up && HORUS_SLURM=25.11 source tests/cluster/env.sh \
        && python3 tests/cluster/record_fixtures.py

With a second argument `het` (OUTDIR het) only the heterogeneous job is recorded, into OUTDIR's
existing index.  OUTDIR defaults to tests/fixtures/slurm (22.05) or tests/fixtures/slurm-25.11 (the cluster env.sh
pointed at: $HORUS_SLURM). For each interaction it writes NAME.stdout (exact bytes),
NAME.stderr (only when non-empty) and an entry in index.json (command, exit code, notes).
Job ids, times and host names are whatever the cluster gave: tests must not hard-code them
except by reading index.json.
"""
import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VERSION = os.environ.get("HORUS_SLURM", "22.05")
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / (
    "slurm" if VERSION == "22.05" else f"slurm-{VERSION}")
STATE = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster"))
os.environ["SLURM_CONF"] = str(STATE / "etc" / "slurm.conf")

index = {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fixtures": []}


# A light job's hint (util %, memory MiB, p90 MiB per GPU type): the hook packs it into shards.
HINT = "horus:v1;a100=20/2000/2500;t4=20/2000/2500"
JOBDIR = STATE / "jobs"  # cwd of every command: jobs' slurm-N.out land here, not in the repo


def sh(args, env=None):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=JOBDIR, env=env)


OWN_JOBS: list[str] = []  # every job this recorder submitted: the only ones it cancels


def record(name, args, notes, env=None, **extra):
    p = sh(args, env)
    if args[0] == "sbatch" and p.returncode == 0:
        m = re.search(rb"(\d+)", p.stdout)
        if m:
            OWN_JOBS.append(m.group(1).decode())
    (OUT / f"{name}.stdout").write_bytes(p.stdout)
    err = OUT / f"{name}.stderr"
    if p.stderr:
        err.write_bytes(p.stderr)
    elif err.exists():
        err.unlink()
    entry = {
        "name": name,
        "command": args,
        "exit_code": p.returncode,
        "stdout": f"{name}.stdout",
        "stderr": f"{name}.stderr" if p.stderr else None,
        "notes": notes,
    }
    entry.update(extra)
    index["fixtures"].append(entry)
    print(f"{name}: rc={p.returncode} stdout={len(p.stdout)}B stderr={len(p.stderr)}B", file=sys.stderr)
    return p


def submit(args) -> str:
    """The id of the job ``sbatch --parsable ARGS`` submitted (a fixture's job, not recorded
    itself), among the recorder's own jobs; exits where sbatch refused it."""
    p = sh(["sbatch", "--parsable", *args])
    if p.returncode:
        raise SystemExit(f"sbatch {' '.join(args)}: {p.stderr.decode().strip()}")
    jid = p.stdout.decode().strip().split(";")[0]
    OWN_JOBS.append(jid)
    return jid


def record_requeue_held():
    """A job that failed, then root's scontrol requeuehold: what the queue loop's journal must
    recognise as its own hold (JobHeldUser, "job requeued in held state")."""
    jid = submit(["-o", "/dev/null", "--wrap", "exit 1"])
    deadline = time.time() + 30
    while job_state(jid) not in ("FAILED", "") and time.time() < deadline:
        time.sleep(1)
    sh(["scontrol", "requeuehold", jid])
    time.sleep(1)
    record("squeue_json_requeue_held", ["squeue", "--json", "--jobs", jid],
           "a failed job after root's scontrol requeuehold", job_id=int(jid))


def record_array():
    """A finished two-task array job in accounting: each task's own job id beside its
    array.job_id and array.task_id (what sync keeps so that hacct -j ARRAYID lists the tasks)."""
    aid = submit(["-a", "1-2", "--gres=gpu:1", f"--comment=fixture-array {HINT}", "-o", "/dev/null",
                  "--wrap", "sleep 1"])
    for t in (1, 2):
        wait_sacct_done(f"{aid}_{t}")
    record("sacct_json_finished_array", ["sacct", "--json", "-j", aid],
           "a finished array of two tasks (gpu:1 each, packed into shards by the hook), asked for "
           "by the array's id", array_job_id=int(aid))


def record_het():
    """A finished heterogeneous job of two components (one on a GPU, packed into shards by the
    hook; one on CPUs) in accounting, asked for by its leader's id: each component's own job id
    beside its het.job_id and het.job_offset (what hacct -j HETJOBID and -j N+K look up)."""
    script = JOBDIR / "fixture-het.sh"
    script.write_text("#!/bin/sh\n#SBATCH -o /dev/null\n#SBATCH --gres=gpu:1\n"
                      f'#SBATCH --comment="fixture-het {HINT}"\n#SBATCH hetjob\n#SBATCH -c 1\nsleep 1\n')
    hid = submit([str(script)])
    for k in (0, 1):
        wait_sacct_done(f"{hid}+{k}")
    record("sacct_json_finished_het", ["sacct", "--json", "-j", hid],
           "a finished heterogeneous job of two components (gpu:1 packed into shards by the "
           "hook, and one CPU), asked for by the leader's id", het_job_id=int(hid))


def job_state(jobid):
    p = sh(["squeue", "-h", "-j", str(jobid), "-o", "%T"])
    return p.stdout.decode().strip()


def wait_running(jobid, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if job_state(jobid) == "RUNNING":
            return
        time.sleep(0.3)
    raise SystemExit(f"job {jobid} not RUNNING after {timeout}s")


def wait_sacct_done(jobid, timeout=60):
    """COMPLETED in sacct, with its start and end stored (slurmdbd fills them in a moment later)."""
    end = time.time() + timeout
    while time.time() < end:
        p = sh(["sacct", "-n", "-X", "-P", "-j", str(jobid), "-o", "State,Start,End"])
        f = p.stdout.decode().strip().split("|")
        if f[0] == "COMPLETED" and len(f) == 3 and "Unknown" not in f[1:]:
            return
        time.sleep(0.5)
    raise SystemExit(f"job {jobid} not COMPLETED in sacct after {timeout}s")


def main():
    if sys.argv[2:3] == ["het"]:  # OUTDIR het: record the heterogeneous job alone, into its index
        return record_only(record_het)
    OUT.mkdir(parents=True, exist_ok=True)
    JOBDIR.mkdir(parents=True, exist_ok=True)
    hook = STATE / "etc" / "job_submit.lua"
    index["job_submit_lua"] = (os.path.relpath(os.readlink(hook), REPO) if hook.is_symlink()
                              else "pass-through placeholder")
    index["slurm_version"] = sh(["sinfo", "--version"]).stdout.decode().strip()
    index["note"] = ("the shard jobs ask for gpu:1 with a light 'horus:' hint in their comment: the "
                     "repo's job_submit.lua packs them into shards (as for any user); raw shard "
                     "requests without a hint become whole GPUs (policy raw_shards = whole)")
    index["horus_slurm"] = VERSION
    index["cluster"] = "tests/cluster/up: nodes gpu-a100 (gpu:a100:4,shard:400) and gpu-t4 (gpu:t4:2,shard:200)"

    # --- sbatch: normal, --parsable, errors
    p = record("sbatch_submit", ["sbatch", "--gres=gpu:1", f"--comment=fixture-running {HINT}",
                                 "--job-name=horus-shard", "--wrap", "sleep 120"],
               "normal submission; stdout 'Submitted batch job N\\n'; the hook packs it into shards")
    running = int(p.stdout.split()[-1])
    p = record("sbatch_parsable", ["sbatch", "--parsable", "--gres=gpu:1", f"--comment=fixture-done {HINT}",
                                   "--job-name=horus-done", "--wrap", "sleep 2"],
               "--parsable: stdout 'N\\n' (no ';cluster' suffix on a single cluster)")
    done = int(p.stdout.decode().split(";")[0])
    p = record("sbatch_parsable_gpu", ["sbatch", "--parsable", "--gres=gpu:1", "--partition=a100",
                                       "--job-name=horus-wholegpu", "--wrap", "sleep 120"],
               "a whole-GPU job running next to the shard job (shows in node/partition views)")
    whole = int(p.stdout.decode().split(";")[0])
    p = record("sbatch_parsable_gpu_done", ["sbatch", "--parsable", "--gres=gpu:2", "--partition=a100",
                                            "--comment=fixture-gpu-done", "--job-name=horus-gpu-done",
                                            "--wrap", "sleep 2"],
               "a two-GPU job that finishes (accounting of whole GPUs)")
    gpu_done = int(p.stdout.decode().split(";")[0])
    record("sbatch_invalid_partition", ["sbatch", "--partition=nosuch", "--gres=shard:30", "--wrap", "true"],
           "invalid partition: exit 1, message on stderr, nothing on stdout")
    record("sbatch_invalid_gres_type", ["sbatch", "--gres=shard:v100:30", "--wrap", "true"],
           "shard type no node has: exit 1; still consumes a job id, which squeue --json then lists as FAILED")
    record("sbatch_gpu_and_shard", ["sbatch", "--gres=gpu:1,shard:10", "--wrap", "true"],
           "gpu and shard in one request: rejected")
    record("sbatch_shard_too_big", ["sbatch", "--gres=shard:150", "--partition=a100", "--wrap", "true"],
           "more shards than one GPU holds (100 per A100 here): accepted, then pending forever (shards of a job come from one GPU)")
    record("sbatch_typed_shard", ["sbatch", "--parsable", "--gres=shard:t4:10", "--wrap", "sleep 1"],
           "typed shard request (type copied from the gpu lines) is accepted and lands on gpu-t4")

    # Two jobs of 60 shards on the T4 node: they cannot share one GPU (100 shards each), so the
    # scontrol/squeue views show a shard job on each of its GPUs.
    packed = []
    for name in ("sbatch_packed_a", "sbatch_packed_b"):
        p = record(name, ["sbatch", "--parsable", "-p", "t4", "--gres=gpu:1", "-o", "/dev/null",
                          "--comment=horus:v1;t4=55/8000/9000", "--job-name=horus-packed",
                          "--wrap", "sleep 120"],
                   "light job pinned to the T4 node: packed into about 60 shards")
        packed.append(int(p.stdout.decode().split(";")[0]))

    wait_running(running)
    wait_running(whole)
    for jid in packed:
        wait_running(jid)
    idx = {"running_shard_job": running, "finished_shard_job": done, "running_gpu_job": whole,
           "finished_gpu_job": gpu_done, "packed_jobs": packed}
    index["job_ids"] = idx

    # --- running job views
    record("scontrol_show_job_running_shard", ["scontrol", "-d", "show", "job", str(running)],
           "running shard job; detail line has GRES=shard:N(IDX:k)", job_id=running)
    record("scontrol_show_job_running_gpu", ["scontrol", "-d", "show", "job", str(whole)],
           "running whole-GPU job; detail line has GRES=gpu:a100:1(IDX:k)", job_id=whole)
    for k, jid in enumerate(packed):
        record(f"scontrol_show_job_packed_{'ab'[k]}", ["scontrol", "-d", "show", "job", str(jid)],
               "shard job on the T4 node (one of two that cannot share a GPU)", job_id=jid)
    record("squeue_json", ["squeue", "--json"],
           "squeue --json: 22.05 lists all jobs the controller remembers (also finished ones, filters "
           "ignored), 25.11 the pending and running ones; running shard job has gres_detail", job_id=running)
    record("squeue_text", ["squeue", "-o", "%i|%T|%P|%N|%b|%f|%r|%k"],
           "squeue with format id|state|partition|nodes|tres_per_node|features|reason|comment")
    # the same query with slurmctld unreachable: a copy of slurm.conf whose port has no listener
    away = STATE / "unreachable"
    away.mkdir(exist_ok=True)
    conf = (STATE / "etc" / "slurm.conf").read_text()
    (away / "slurm.conf").write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=6999", conf))
    record("squeue_json_unreachable", ["squeue", "--json"],
           "squeue --json with slurmctld unreachable (SLURM_CONF a copy of the cluster's whose "
           "SlurmctldPort has no listener): exit 0, no jobs, the failure in errors",
           env={**os.environ, "SLURM_CONF": str(away / "slurm.conf")})

    # --- node / partition views (while the two jobs run)
    record("sinfo_json", ["sinfo", "--json"], "both nodes; one shard job and one gpu:1 job running")
    record("scontrol_show_node", ["scontrol", "show", "node", "gpu-a100,gpu-t4"],
           "both nodes (GresUsed for shards is wrong on 22.05)")
    record("scontrol_show_node_detail", ["scontrol", "-d", "show", "node"], "all nodes, -d")
    record("scontrol_show_partition", ["scontrol", "show", "partition"], "partitions gpu (default), a100, t4")
    record("scontrol_show_config", ["scontrol", "show", "config"],
           "the controller's configuration (SlurmUser, PrivateData unset)")
    record("sacctmgr_show_configuration", ["sacctmgr", "show", "configuration"],
           "slurm.conf's and, after 'SlurmDBD configuration:', slurmdbd.conf's settings (PrivateData unset)")
    record("sinfo_text", ["sinfo", "-N", "-o", "%N|%P|%T|%G|%f|%C"], "node|partition|state|gres|features|cpus A/I/O/T")
    record_requeue_held()
    record_array()
    record_het()

    # --- finished job in accounting
    wait_sacct_done(done)
    record("sacct_json_finished_shard", ["sacct", "--json", "-j", str(done)],
           "finished shard job; tres.allocated has {type: gres, name: shard, count: N}; comment.job",
           job_id=done)
    record("sacct_text_finished_shard",
           ["sacct", "-P", "-j", str(done), "-o",
            "JobID,JobName,State,ExitCode,Partition,NodeList,AllocTRES,ReqTRES,Comment,AdminComment,Elapsed"],
           "sacct -P (pipe-separated) for the finished shard job", job_id=done)
    wait_sacct_done(gpu_done)
    record("sacct_json_finished_gpu", ["sacct", "--json", "-j", str(gpu_done)],
           "finished two-GPU job on gpu-a100; tres.allocated has {type: gres, name: gpu, count: 2}",
           job_id=gpu_done)
    record("sacct_json_finished", ["sacct", "--json", "-j", f"{done},{gpu_done}"],
           "both finished jobs (shard and whole-GPU) in one sacct --json", job_ids=[done, gpu_done])
    record("sacct_json_empty_window", ["sacct", "--json", "--allusers", "-S", "2000-01-01T00:00:00",
                                       "-E", "2000-01-01T00:01:00"],
           "a window without jobs: exit 0, no jobs, and 'Nothing found' (9003) in errors")

    if OWN_JOBS:
        subprocess.run(["scancel", *OWN_JOBS], cwd=JOBDIR)
    (OUT / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {len(index['fixtures'])} fixtures to {OUT}", file=sys.stderr)


def record_only(recorder):
    """One recorder's fixtures added to OUT's index (an entry of the same name replaced), the
    others kept as recorded: a new fixture without recording (and renumbering) every other."""
    JOBDIR.mkdir(parents=True, exist_ok=True)
    old = json.loads((OUT / "index.json").read_text())
    recorder()
    if OWN_JOBS:
        subprocess.run(["scancel", *OWN_JOBS], cwd=JOBDIR)
    names = {f["name"] for f in index["fixtures"]}
    for f in index["fixtures"]:
        f["recorded_at"], f["slurm_version"] = index["recorded_at"], sh(["sinfo", "--version"]).stdout.decode().strip()
    old["fixtures"] = [f for f in old["fixtures"] if f["name"] not in names] + index["fixtures"]
    (OUT / "index.json").write_text(json.dumps(old, indent=2) + "\n")
    print(f"added {len(names)} fixtures to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
