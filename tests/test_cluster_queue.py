"""horus-admin queue on the real local cluster: a shared job that dies of a CUDA out-of-memory
error is requeued once on a whole GPU and succeeds; a job failing for another reason is left
alone; a pending job the hook kept whole is packed into shards under queue pressure and spread
back to a whole GPU when GPUs are idle. Each test cancels only the jobs it submitted."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from slurm_horus.slurm import parse as sp

pytestmark = pytest.mark.cluster
ADMIN = [sys.executable, "-m", "slurm_horus.cli.admin"]
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


def wait(jid, states, timeout=90):
    end = time.time() + timeout
    while time.time() < end:
        rec = job(jid)
        if rec.get("JobState") in states:
            return rec
        time.sleep(1)
    raise AssertionError(f"job {jid} not in {states}: {job(jid).get('JobState')}")


def queue(*args):
    cp = subprocess.run([*ADMIN, "queue", "--json", *args], capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    return [json.loads(x) for x in cp.stdout.splitlines() if x.strip()]


def hint(util, mem):
    return f"horus:v1;a100={util}/{mem}/{int(mem * 1.15)}"


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

    acts = queue("--min-wait", "100000")
    mine_acts = [a for a in acts if str(a["job_id"]) in (jid, bad)]
    assert [(a["job_id"], a["action"]) for a in mine_acts] == [(int(jid), "oom-requeue")]
    assert re.fullmatch(r"gres/gpu(:a100|:t4)?:1", mine_acts[0]["tres"])
    again = job(jid)
    assert again.get("Restarts") == "1" and re.search(r"gpu(:a100)?:1$", again.get("TresPerNode", ""))
    assert "horus-queue:v1;action=oom-requeue;from=shard:" in again.get("AdminComment", "")
    done = wait(jid, {"COMPLETED"}, timeout=150)
    assert re.search(r"gpu(:a100)?:1$", done.get("TresPerNode", ""))
    assert "ran on" in (tmp_path / f"o-{jid}").read_text()
    # at most once, and the other failure is never requeued
    assert not [a for a in queue("--min-wait", "100000") if str(a["job_id"]) in (jid, bad)]
    assert job(bad).get("Restarts") == "0"


def test_pack_under_pressure_then_spread(mine, tmp_path):
    fillers = [submit(mine, "--gres=gpu:a100:1", "-C", "a100", "--wrap", "sleep 300")
               for _ in range(4)]
    for f in fillers:
        wait(f, {"RUNNING", "PENDING"})
    heavy = submit(mine, "--gres=gpu:1", f"--comment={hint(95, 6000)}", "--wrap", "sleep 1")
    rec = wait(heavy, {"PENDING"})
    assert re.search(r"gpu(:a100)?:1$", rec.get("TresPerNode", "")), rec.get("TresPerNode")
    assert "action=exclusive" in rec.get("AdminComment", "")
    end = time.time() + 60  # every A100 busy (ours, or other tests')
    while time.time() < end and not [a for a in queue("--dry-run", "--min-wait", "0")
                                     if str(a["job_id"]) == heavy]:
        time.sleep(2)
    subprocess.run(["scontrol", "hold", heavy], check=True, capture_output=True)
    packed = [a for a in queue("--min-wait", "0") if str(a["job_id"]) == heavy]
    assert packed and packed[0]["action"] == "pack", packed
    assert re.search(r"shard:a100:50$", job(heavy).get("TresPerNode", ""))
    subprocess.run(["scancel", *fillers], check=True)
    end = time.time() + 60
    spread = []
    while time.time() < end and not spread:
        time.sleep(2)
        spread = [a for a in queue("--min-wait", "0") if str(a["job_id"]) == heavy]
    assert spread and spread[0]["action"] == "spread", spread
    rec = job(heavy)
    assert re.search(r"gpu:a100:1$", rec.get("TresPerNode", ""))
    assert [t.split(";")[1] for t in re.findall(r"horus-queue:v1;[^ ]*", rec["AdminComment"])] \
        == ["action=pack", "action=spread"]
