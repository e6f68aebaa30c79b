#!/usr/bin/env python3
"""Record what horus-probe reads from Slurm, from the local test cluster, as fixtures.

    tests/cluster/up && python3 tests/cluster/record_probe_fixtures.py [OUTDIR]

OUTDIR defaults to tests/fixtures/slurm/probe. Submits three short jobs (an untyped shard job, a
typed shard job, a two-GPU job on the A100 node), records `scontrol -d show job ID` and
`scontrol listpids ID NODE` while they run (what the Prolog's probe reads), then cancels them.
Writes NAME.stdout and index.json ({name: {command, rc, job_id, node}}). Run as root: the site
hook (etc/job_submit.lua) leaves root's raw shard requests alone.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "fixtures" / "slurm" / "probe"
STATE = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster"))
os.environ["SLURM_CONF"] = str(STATE / "etc" / "slurm.conf")
JOBDIR = STATE / "jobs"


def sh(*args):
    return subprocess.run(list(args), capture_output=True, text=True, cwd=JOBDIR, timeout=30)


def submit(*args):
    p = sh("sbatch", "--parsable", "-o", "/dev/null", "-J", "horus-probe-fixture", *args,
           "--wrap", "sleep 60")
    if p.returncode:
        sys.exit(f"sbatch failed: {p.stderr}")
    return p.stdout.strip().split(";")[0]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    jobs = {"shard_t4": submit("--gres=shard:7", "-p", "t4"),
            "shard_typed_a100": submit("--gres=shard:a100:20"),
            "gpu_a100_x2": submit("--gres=gpu:a100:2")}
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            st = sh("squeue", "-h", "-j", ",".join(jobs.values()), "-o", "%i %T").stdout.split()
            if st.count("RUNNING") == len(jobs):
                break
            time.sleep(0.5)
        time.sleep(1.5)  # batch step started: listpids has processes
        index = {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fixtures": {}}
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


if __name__ == "__main__":
    main()
