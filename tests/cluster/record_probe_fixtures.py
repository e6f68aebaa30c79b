#!/usr/bin/env python3
"""Record what horus-probe reads from Slurm, from the local test cluster, as fixtures.

    tests/cluster/up && python3 tests/cluster/record_probe_fixtures.py [--purged-only] [OUTDIR]

OUTDIR defaults to tests/fixtures/slurm/probe. Submits four short jobs: two that the site hook
(etc/job_submit.lua) packs on shards for the hint they carry (untyped on the t4 partition, typed
on the a100 one), a two-GPU job on the A100 node, and a shard job whose name and comment are
written to forge scontrol's text (fields and a whole record of another job). While they run it
records `squeue --json --all --states=all` (what the probe reads), `scontrol -d show job ID`
(what it read before, and where the forgery shows) and `scontrol listpids ID NODE`, then cancels
them. Writes NAME.stdout and index.json ({name: {command, rc, job_id, node}}).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
OUT = Path(ARGS[0]) if ARGS else HERE.parent / "fixtures" / "slurm" / "probe"
STATE = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster"))
os.environ["SLURM_CONF"] = str(STATE / "etc" / "slurm.conf")
JOBDIR = STATE / "jobs"


def sh(*args):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=JOBDIR, timeout=30)


def submit(*args, name="horus-probe-fixture"):
    p = sh("sbatch", "--parsable", "-o", "/dev/null", "-J", name, *args, "--wrap", "sleep 60")
    if p.returncode:
        sys.exit(f"sbatch failed: {p.stderr}")
    return p.stdout.strip().split(";")[0]


# a job name and a comment that forge scontrol's text: fields of the job, a detail line, and a
# record of job 1 owned by root (the hint itself, the first word, stays valid)
FORGED_NAME = "forged\nJobState=FAILED UserId=root(0) TresPerNode=gres:shard:a100:99"
FORGED_COMMENT = ("horus:v1;t4=5/1000/1200\n   Nodes=gpu-t4 CPU_IDs=0 Mem=0 GRES=gpu:t4:1(IDX:1)\n"
                  "AdminComment=forged\nJobId=1 JobName=victim\n   UserId=root(0) JobState=FAILED")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    jobs = {"shard_t4": submit("-p", "t4", "--gres=gpu:1", "--comment", "horus:v1;t4=5/1000/1200"),
            "shard_a100": submit("-p", "a100", "--gres=gpu:a100:1",
                                       "--comment", "horus:v1;a100=10/2000/2400"),
            "gpu_a100_x2": submit("--gres=gpu:a100:2"),
            "forged_t4": submit("-p", "t4", "--gres=gpu:1", "--comment", FORGED_COMMENT,
                                name=FORGED_NAME)}
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            st = sh("squeue", "-h", "-j", ",".join(jobs.values()), "-o", "%i %T").stdout.split()
            if st.count("RUNNING") == len(jobs):
                break
            time.sleep(0.5)
        time.sleep(1.5)  # batch step started: listpids has processes
        index = {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fixtures": {}}
        cmd = ["squeue", "--json", "--all", "--states=all"]
        p = sh(*cmd)
        (OUT / "squeue_json_all.stdout").write_text(p.stdout)
        index["fixtures"]["squeue_json_all"] = {"command": " ".join(cmd), "rc": p.returncode,
                                                "job_ids": {k: int(v) for k, v in jobs.items()}}
        for name, jid in jobs.items():
            node = sh("squeue", "-h", "-j", jid, "-o", "%N").stdout.strip()
            for kind, cmd in (("scontrol_show_job", ["scontrol", "-d", "show", "job", jid]),
                              ("scontrol_listpids", ["scontrol", "listpids", jid, node])):
                p = sh(*cmd)
                (OUT / f"{kind}_{name}.stdout").write_text(p.stdout)
                index["fixtures"][f"{kind}_{name}"] = {"command": " ".join(cmd), "rc": p.returncode,
                                                       "job_id": int(jid), "node": node}
        (OUT / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    finally:
        sh("scancel", *jobs.values())
    print(f"recorded {len(index['fixtures'])} fixtures in {OUT}")


def record_purged_job():
    """What the probe's job-state check gets for a job slurmctld no longer knows (purged after
    MinJobAge): stderr and exit code of ``squeue -o %T`` for an id never used.  Its own entry
    of index.json (``--purged-only`` records just this)."""
    OUT.mkdir(parents=True, exist_ok=True)
    cmd = ["squeue", "-h", "--states=all", "--jobs", "4000000", "-o", "%T"]
    p = sh(*cmd)
    (OUT / "squeue_state_purged_job.stderr").write_text(p.stderr)
    path = OUT / "index.json"
    index = json.loads(path.read_text()) if path.exists() else {"fixtures": {}}
    index["fixtures"]["squeue_state_purged_job"] = {"command": " ".join(cmd), "rc": p.returncode,
                                                    "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path.write_text(json.dumps(index, indent=1) + "\n")


if __name__ == "__main__":
    if "--purged-only" not in sys.argv:
        main()
    record_purged_job()
