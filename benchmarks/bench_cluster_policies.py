"""exclusive / naive / horus on the real local Slurm cluster: a small measured run (issue 12).

    bash tests/cluster/up; source tests/cluster/env.sh
    python3 benchmarks/bench_cluster_policies.py --out /tmp/bench_cluster_policies.md

The same handful of short jobs (a seeded mix of light and heavy deep-learning jobs, Poisson
arrivals at --load) is submitted once per policy to the `a100` partition (one node, 4 A100s):

- exclusive: `sbatch --gres=gpu:1` (a whole GPU each, Slurm's default);
- naive: every job carries the same fixed claim (`horus:v1;a100=45/1024/1024`), which the site's
  hook turns into 50 of 100 shards: any two jobs share a GPU, whatever they are. (A raw
  `--gres=shard:50` would not do: this site's `raw_shards = whole` gives it a whole GPU, and
  22.05 refuses to turn a pending job's gpu request into shards with `scontrol update`.)
- horus: `hsubmit --model <the job's ONNX graph> ...`: hsubmit predicts, the real
  etc/job_submit.lua in slurmctld decides shards or a whole GPU by the cluster's policy file.
- horus+queue: the same, with `horus-admin queue`'s pass every 1.5 s: the queue-pressure file
  the cluster's hook reads (policy pressure_file, written by tests/cluster/up's policy), so a
  heavy job submitted when it would find no idle GPU gets 50 shards, and a mid-size one at most
  50 (every Slurm); and
  ledger.requeue.tend on this run's jobs only: a job the hook kept whole is packed into 50
  shards once it has waited --min-wait seconds while more jobs wait than GPUs are idle, spread
  back when as many GPUs are idle as jobs wait (Slurm 23.02+: 22.05 refuses to reshape a
  pending job between gpu and shard);
- horus+always: horus+queue with the policy's `pack_heavy = always` (added to the cluster's
  policy file for this run only): a heavy job takes 50 shards on every type while the loop's
  pressure file is fresh, and Slurm's least-loaded shard placement (LL_SHARED_GRES, set by
  tests/cluster/up on Slurm 25.11) puts it on an idle GPU while there is one.

Scheduling, queueing and placement are real Slurm; the co-location slowdown is emulated from the
measured curve. Real: slurmctld, backfill, GRES/shard selection, slurmd, Prolog/Epilog, and every
time comes from Slurm's own accounting (sacct Submit/Start/End). Emulated: there is no GPU here,
so a job cannot really slow down when co-located. Each job runs `work / speed` seconds of
emulated GPU work, where speed is re-evaluated every second from the jobs Slurm actually placed
on the same GPU at that moment (the GPU index Slurm gave the job in SLURM_JOB_GPUS, registered in
a shared state folder) through the simulator's interference model
(slurm_horus.sim.interference.Interference: the Lucid pair curve, median sensitivity) at the
jobs' true utilizations (hsubmit's predicted util x a seeded lognormal(0, 0.25), the same truth
under every policy). That truth is an assumption, unbiased and without the sensitivity spread
(the simulator draws biased, measured residuals and the measured spread): both favour the
policy, so this run shows Slurm placing and packing the jobs as the policy means, not that the
policy wins under measured errors. The GPU each job registered is checked against
`scontrol -d show job`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_horus.ledger.publish import write_atomically
from slurm_horus.ledger.requeue import signal_pressure, tend
from slurm_horus.slurm.policy import policy_value
from slurm_horus.sim.interference import Interference
from slurm_horus.slurm import parse as sp
from slurm_horus.slurm.hint import parse_hint

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "tests" / "data" / "zoo"
PARTITION, NODE, GPUS, GPU_TYPE = "a100", "gpu-a100", 4, "a100"
POLICIES = ("exclusive", "naive", "horus", "horus+queue", "horus+always")
LOOPED = ("horus+queue", "horus+always")  # the policies run with horus-admin queue's passes
# naive's one claim for every job: util 45 % -> ceil(100 * 45 / pack_limit 90) = 50 shards
NAIVE_HINT = "horus:v1;a100=45/1024/1024"
TICK_S = 1.0      # the emulation re-evaluates its GPU's group this often
STALE_S = 5.0     # a registration not refreshed for this long is a job that died
# (ONNX graph, batch, task, symbolic dims): light inference, mid-size and heavy training
MIX = [("small_cnn", 16, "infer", ""), ("mobilenet_v2", 16, "infer", ""),
       ("resnet50", 16, "infer", ""), ("small_cnn", 16, "infer", ""),
       ("mobilenet_v2", 32, "train", ""), ("efficientnet_b0", 32, "train", ""),
       ("resnet50", 32, "train", ""), ("lstm_lm", 32, "train", "seq=128"),
       ("t5_small", 16, "train", "seq=128,dec_seq=128"), ("mobilenet_v2", 16, "infer", ""),
       ("vgg16", 128, "train", ""), ("unet", 8, "train", ""),
       ("bert_base", 16, "train", "seq=128"), ("vgg16", 128, "train", "")]


# --------------------------------------------------------------------------- inside each job
def emulate(state: Path, work: float, util: float, result: Path) -> None:
    """The job's body: `work` seconds of solo GPU work, run at the speed the interference model
    gives the group of jobs registered on the GPU Slurm gave this job, re-read every second."""
    jid, node = os.environ["SLURM_JOB_ID"], os.environ["SLURMD_NODENAME"]
    gpu = os.environ.get("SLURM_JOB_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    if not gpu.isdigit():
        sys.exit(f"bench job {jid}: expected one GPU index in SLURM_JOB_GPUS, got {gpu!r}")
    gdir = state / node / gpu
    gdir.mkdir(parents=True, exist_ok=True)
    me = gdir / jid
    me.write_text(f"{util}\n")
    model = Interference()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    done, t0, max_n, speeds = 0.0, time.time(), 1, []
    last = t0
    try:
        while done < work - 1e-6:
            utils = _group(gdir, me)
            speed = model.speed(sum(utils), len(utils))
            max_n = max(max_n, len(utils))
            time.sleep(min(TICK_S, (work - done) / speed))
            now = time.time()
            done += speed * (now - last)
            speeds.append((now - last, speed))
            last = now
            os.utime(me)  # heartbeat: the others count this job while it is fresh
    finally:
        me.unlink(missing_ok=True)
    run_s = time.time() - t0
    result.write_text(json.dumps({"job_id": jid, "node": node, "gpu": int(gpu), "work_s": work,
                                  "util": util, "run_s": run_s, "slowdown": run_s / work,
                                  "max_group": max_n}))


def _group(gdir: Path, me: Path) -> list[float]:
    """True utils of the jobs registered on this GPU now (this job's included)."""
    now, utils = time.time(), []
    for f in gdir.iterdir():
        try:
            fresh = f == me or now - f.stat().st_mtime <= STALE_S
            if fresh:
                utils.append(float(f.read_text()))
        except (OSError, ValueError):
            continue  # a job that just left
    return utils


# --------------------------------------------------------------------------- the run
def sh(*args: str, check: bool = True, cwd=None) -> subprocess.CompletedProcess:
    cp = subprocess.run(list(args), capture_output=True, text=True, cwd=cwd)
    if check and cp.returncode != 0:
        sys.exit(f"bench: {' '.join(args[:3])} ...: {(cp.stderr or cp.stdout).strip()[:300]}")
    return cp


def model_args(model: str, batch: int, task: str, dims: str) -> list[str]:
    """hsubmit's model options for one mix entry."""
    out = [str(ZOO / f"{model}.onnx"), "--batch-size", str(batch), "--task", task]
    for d in filter(None, dims.split(",")):
        out += ["--dim", d]
    return out


def predicted_util(model: str, batch: int, task: str, dims: str) -> float:
    """The utilization hsubmit claims for the job (`hsubmit --explain`: its hint, and the hook's
    decision, which must exist: a graph hsubmit cannot read would be submitted unchanged)."""
    cp = sh(sys.executable, "-m", "slurm_horus.cli.hsubmit", "--model",
            *model_args(model, batch, task, dims), "-p", PARTITION, "--gres=gpu:1", "--explain",
            "--wrap", "true")
    hint = next((ln[len("hint: "):] for ln in cp.stdout.splitlines() if ln.startswith("hint: ")), "")
    parsed = parse_hint(hint) or {}
    if GPU_TYPE not in parsed or "horus-decision:v1" not in cp.stdout:
        sys.exit(f"bench: hsubmit --explain {model}: no hint or decision: {cp.stderr.strip()[:200]}")
    return float(parsed[GPU_TYPE][0])


def plan(n_jobs: int, load: float, seed: int, work_range: tuple[float, float]) -> list[dict]:
    """The jobs every policy gets: model, solo work, true util and arrival offset, seeded."""
    rng = random.Random(seed)
    entries = [MIX[i % len(MIX)] for i in range(n_jobs)]
    rng.shuffle(entries)  # light and heavy jobs arrive interleaved
    preds = {m: predicted_util(*m) for m in set(entries)}
    jobs = []
    for i, m in enumerate(entries):
        jobs.append({"i": i, "model": m[0], "batch": m[1], "task": m[2], "dims": m[3],
                     "work_s": round(rng.uniform(*work_range), 1), "pred_util": preds[m],
                     "true_util": round(min(100.0, preds[m] * rng.lognormvariate(0, 0.25)), 1)})
    # Poisson arrivals offering `load` x the GPUs' capacity in solo work
    rate = load * GPUS / statistics.mean(j["work_s"] for j in jobs)
    t = 0.0
    for j in jobs:
        j["offset_s"] = round(t, 1)
        t += rng.expovariate(rate)
    return jobs


def submit(policy: str, job: dict, run: Path, tag: str, mine: list[str]) -> str:
    """Submit one job as the policy expresses it; its id joins ``mine`` (what the run may cancel)."""
    body = (f"exec {sys.executable} {Path(__file__).resolve()} _job --state {run / 'state'} "
            f"--work {job['work_s']} --util {job['true_util']} "
            f"--result {run / 'results' / policy}/$SLURM_JOB_ID.json")
    common = ["-p", PARTITION, "--gres=gpu:1", "-c", "1", "-t", "10", "-J", f"{tag}-{policy}-{job['i']}",
              "-o", str(run / "out" / f"{policy}-%j.out"), "--wrap", body]
    if policy == "exclusive":
        cmd = ["sbatch", "--parsable", *common]
    elif policy == "naive":
        cmd = ["sbatch", "--parsable", f"--comment={NAIVE_HINT}", *common]
    else:
        cmd = [sys.executable, "-m", "slurm_horus.cli.hsubmit", "--parsable", "--model",
               *model_args(job["model"], job["batch"], job["task"], job["dims"]), *common]
    cp = sh(*cmd, cwd=run)
    jid = sp.parse_sbatch_stdout(cp.stdout)
    if jid:
        mine.append(jid)
    if not jid or "hsubmit: warning" in cp.stderr:
        sys.exit(f"bench: {policy} job {job['i']} ({jid}): {cp.stderr.strip()[:300]}")
    return jid


def snapshot(mine: set[str]) -> tuple[dict[str, dict], set[str]]:
    """My jobs' scontrol records, and the other jobs running on the benchmark's node."""
    recs = sp.parse_scontrol_records(sh("scontrol", "-d", "show", "job", check=False).stdout)
    ours, foreign = {}, set()
    for r in recs:
        jid = r.get("JobId", "")
        if jid in mine:
            ours[jid] = r
        elif r.get("JobState") == "RUNNING" and NODE in (r.get("NodeList") or ""):
            foreign.add(jid)
    return ours, foreign


def wait_node_free(timeout_s: float) -> None:
    """Start a policy on a node no one else uses, if it frees within the timeout."""
    end = time.time() + timeout_s
    while snapshot(set())[1] and time.time() < end:
        time.sleep(2)


def cluster_policy() -> str:
    """The policy file the cluster's hook reads (tests/cluster/up writes it beside slurm.conf)."""
    return str(Path(os.environ["SLURM_CONF"]).parent / "horus_policy.conf")


def whole_queue_pressure() -> None:
    """What a whole `horus-admin queue` pass tells the hook (tend does it only on an
    unrestricted pass, and this run acts on its own jobs only)."""
    def recs(what: str) -> list[dict]:
        return sp.parse_scontrol_records(sh("scontrol", "-d", "show", what).stdout)

    signal_pressure(recs("job"), recs("node"), cluster_policy())


def run_policy(policy: str, jobs: list[dict], run: Path, tag: str, mine: list[str],
               min_wait_s: float) -> dict:
    (run / "results" / policy).mkdir(parents=True)
    t0, ids = time.time(), {}
    placed: dict[str, tuple[str, int]] = {}
    decisions: dict[str, str] = {}
    foreign: set[str] = set()
    reshaped: list[str] = []

    def look() -> dict[str, dict]:
        if policy in LOOPED:
            whole_queue_pressure()
            if ids:
                reshaped.extend(f"{a.kind} {a.job_id}" for a in
                                tend(min_wait_s=min_wait_s, job_ids={int(i) for i in ids}))
        recs, others = snapshot(set(ids))
        foreign.update(others)
        for jid, r in recs.items():
            decisions.setdefault(jid, (r.get("AdminComment") or "").strip())
            for d in sp.job_gres_detail(r):
                for g in d["gres"]:
                    if g["idx"]:
                        placed[jid] = (d["node"], g["idx"][0])
        return recs

    policy_text = Path(cluster_policy()).read_text()
    if policy == "horus+always":  # slurmctld's hook rereads it at every submission: one rename
        write_atomically(cluster_policy(), policy_text + "\npack_heavy = always\n")
    try:
        for j in jobs:  # arrivals
            while time.time() < t0 + j["offset_s"]:
                look()
                time.sleep(min(1.0, max(0.0, t0 + j["offset_s"] - time.time())))
            ids[submit(policy, j, run, tag, mine)] = j
        while True:
            recs = look()
            if not any(r.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
                       for r in recs.values()):
                break
            time.sleep(1.5)
    finally:  # no pressure nor policy change left behind for the next policy or anyone else
        where = policy_value("pressure_file", path=cluster_policy())
        if policy in LOOPED and where and os.path.exists(where):
            os.unlink(where)
        if policy == "horus+always":
            write_atomically(cluster_policy(), policy_text)
    res = summarize(policy, ids, sacct(list(ids)), run / "results" / policy, placed, decisions)
    res["foreign_jobs"] = sorted(foreign)
    res["queue_actions"] = reshaped
    packed = {a.split()[1] for a in reshaped if a.startswith("pack ")}  # shard jobs since
    res["whole_but_shared"] = [j for j in res["whole_but_shared"] if j not in packed]
    res["foreign_gpu_s"] = foreign_gpu_s(sorted(foreign), res["window"]) if foreign else 0.0
    return res


def foreign_gpu_s(ids: list[str], window: tuple[float, float]) -> float:
    """GPU-seconds other users' jobs held on the node inside this policy's window (shards as
    fractions of a GPU): how much the measurement was disturbed."""
    total = 0.0
    for r in sp.parse_pipe_table(sh("sacct", "-X", "-P", "-j", ",".join(ids),
                                    "-o", "JobID,Start,End,AllocTRES", check=False).stdout):
        tres = dict(kv.split("=", 1) for kv in r["AllocTRES"].split(",") if "=" in kv)
        gpus = float(tres.get("gres/gpu", 0)) + float(tres.get("gres/shard", 0)) / 100
        try:
            start, end = _epoch(r["Start"]), _epoch(r["End"])
        except ValueError:
            continue
        total += gpus * max(0.0, min(end, window[1]) - max(start, window[0]))
    return total


def sacct(ids: list[str], timeout_s: float = 90) -> dict[str, dict]:
    """Submit/Start/End from slurmdbd, once every job has its end recorded."""
    end = time.time() + timeout_s
    while True:
        rows = {r["JobID"]: r for r in sp.parse_pipe_table(sh(
            "sacct", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State,Submit,Start,End").stdout)}
        if all(i in rows and rows[i]["End"] not in ("", "Unknown") for i in ids):
            return rows
        if time.time() > end:
            sys.exit(f"bench: sacct has no end time for {[i for i in ids if i not in rows]} after {timeout_s:.0f} s")
        time.sleep(2)


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def summarize(policy, ids, rows, results: Path, placed, decisions) -> dict:
    jcts, waits, slow, submits, ends, per_job = [], [], [], [], [], []
    for jid, j in ids.items():
        r = rows[jid]
        if r["State"] != "COMPLETED":
            sys.exit(f"bench: {policy} job {jid} ended {r['State']} (see its output in the run folder)")
        res = json.loads((results / f"{jid}.json").read_text())
        if placed.get(jid) != (res["node"], res["gpu"]):
            sys.exit(f"bench: job {jid} ran on GPU {res['node']}:{res['gpu']}, scontrol said {placed.get(jid)}")
        sub, start, end = _epoch(r["Submit"]), _epoch(r["Start"]), _epoch(r["End"])
        jcts.append(end - sub)
        waits.append(start - sub)
        slow.append(res["slowdown"])
        submits.append(sub)
        ends.append(end)
        per_job.append({"job_id": jid, **j, "gpu": res["gpu"], "max_group": res["max_group"],
                        "wait_s": start - sub, "jct_s": end - sub, "slowdown": round(res["slowdown"], 3),
                        "decision": decisions.get(jid, "")})
    return {"policy": policy, "jobs": len(ids), "mean_jct_s": statistics.mean(jcts),
            "p95_jct_s": _p95(jcts), "mean_wait_s": statistics.mean(waits),
            "makespan_s": max(ends) - min(submits), "mean_slowdown": statistics.mean(slow),
            "window": (min(submits), max(ends)), "per_job": per_job,
            "whole_but_shared": [j["job_id"] for j in per_job
                                 if "shards=" not in j["decision"] and j["max_group"] > 1]}


def _p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile (with a handful of jobs: the second-worst or the worst)."""
    s = sorted(xs)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def check_decisions(res: dict) -> None:
    """The hook did what the policy means: naive jobs on 50 shards, horus jobs decided."""
    for j in res["per_job"]:
        d = j["decision"]
        if res["policy"] == "naive" and "shards=50/100" not in d:
            sys.exit(f"bench: naive job {j['job_id']} was not given 50 shards: {d!r}")
        if res["policy"].startswith("horus") and "horus-decision:v1;action=" not in d:
            sys.exit(f"bench: horus job {j['job_id']} has no hook decision: {d!r}")
        if res["policy"].startswith("horus") and "reason=record" in d:
            sys.exit(f"bench: job {j['job_id']} kept whole by the under-claim record: {d!r}")


def table(results: list[dict]) -> str:
    out = ["| policy | jobs | mean JCT s | p95 JCT s | mean wait s | makespan s | mean emulated slowdown |",
           "|---|---|---|---|---|---|---|"]
    notes = []
    for r in results:
        out.append(f"| {r['policy']} | {r['jobs']} | {r['mean_jct_s']:.1f} | {r['p95_jct_s']:.1f} | "
                   f"{r['mean_wait_s']:.1f} | {r['makespan_s']:.1f} | {r['mean_slowdown']:.2f} |")
        if r.get("queue_actions"):
            notes.append(f"{r['policy']}: horus-admin queue: {', '.join(r['queue_actions'])}.")
        if r["foreign_jobs"]:
            notes.append(f"{r['policy']}: {len(r['foreign_jobs'])} other jobs ran on the node during "
                         f"the run, {r['foreign_gpu_s']:.0f} GPU-s in all.")
        if r["whole_but_shared"]:
            notes.append(f"{r['policy']}: whole-GPU job(s) {', '.join(r['whole_but_shared'])} found a "
                         "shard job still running on their GPU (Slurm gave them that GPU).")
    return "\n".join(out + ([""] + notes if notes else []))


def machine_line() -> str:
    ver = sh("sinfo", "-V", check=False).stdout.strip()
    return (f"Machine: {os.cpu_count()} cores (shared with other work), Python {sys.version.split()[0]}, "
            f"{ver}, partition {PARTITION}: {GPUS} fake A100 on {NODE} (shards 100 per GPU).")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    jp = sub.add_parser("_job", help="the body of one benchmark job (run by Slurm)")
    jp.add_argument("--state", type=Path, required=True)
    jp.add_argument("--work", type=float, required=True)
    jp.add_argument("--util", type=float, required=True)
    jp.add_argument("--result", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=14, help="jobs per policy (default 14)")
    ap.add_argument("--load", type=float, default=2.0, help="offered load on the 4 GPUs (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work-range", default="20,45", help="solo work per job, seconds (default 20,45)")
    ap.add_argument("--policies", default=",".join(POLICIES[:3]),
                    help=f"among {','.join(POLICIES)} (default the first three)")
    ap.add_argument("--min-wait", type=float, default=5.0,
                    help="horus+queue: seconds a job waits before the loop may pack it (default 5)")
    ap.add_argument("--out", type=Path, help="write the markdown table here")
    ap.add_argument("--json", type=Path, help="write every job's figures here")
    args = ap.parse_args(argv)
    if args.cmd == "_job":
        emulate(args.state, args.work, args.util, args.result)
        return 0
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    try:
        lo, hi = (float(x) for x in args.work_range.split(","))
    except ValueError:
        lo = hi = -1.0
    if bad or not 1 <= args.jobs <= 40 or args.load <= 0 or not 0 < lo <= hi:
        sys.exit(f"bench: need policies among {','.join(POLICIES)}, 1-40 jobs, a load > 0 and "
                 "--work-range LO,HI seconds")
    if not os.environ.get("SLURM_CONF") or sh("scontrol", "ping", check=False).returncode:
        sys.exit("bench: no cluster: bash tests/cluster/up; source tests/cluster/env.sh")

    jobs = plan(args.jobs, args.load, args.seed, (lo, hi))
    jobs_dir = Path(os.environ.get("HORUS_CLUSTER_DIR", "/tmp/horus-cluster")) / "jobs"
    run = Path(tempfile.mkdtemp(prefix="bench-policies-", dir=jobs_dir if jobs_dir.is_dir() else None))
    os.chmod(run, 0o755)
    for d in ("state", "out"):
        (run / d).mkdir()
    print(f"run folder (job output; removed after a complete run): {run}", file=sys.stderr)
    tag, mine, results, t_start = f"hb{os.getpid()}", [], [], time.time()
    try:
        for p in policies:
            wait_node_free(120)
            t = time.time()
            res = run_policy(p, jobs, run, tag, mine, args.min_wait)
            check_decisions(res)
            res["wall_s"] = time.time() - t
            results.append(res)
            print(f"{p}: {res['wall_s']:.0f} s wall", file=sys.stderr)
    finally:  # only this run's jobs, and only those still queued or running
        left = [j for j in mine if sh("squeue", "-h", "-j", j, check=False).stdout.strip()]
        if left:
            sh("scancel", *left, check=False)
    text = (f"{table(results)}\n\n{machine_line()} {len(jobs)} jobs per policy, load {args.load}, "
            f"seed {args.seed}; whole run {time.time() - t_start:.0f} s wall.\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"jobs": jobs, "results": results}, indent=1))
    shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
