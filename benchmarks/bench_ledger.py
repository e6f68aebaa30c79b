"""Ledger benchmarks: hacct --summary over 1M rows, sync of 10k sacct jobs, retrain on 100k rows.

    python3 benchmarks/bench_ledger.py [--rows 1000000] [--sync-jobs 10000] [--train-rows 100000]
                                       [--repeat N] [--skip summary,sync,retrain]
Targets (2 cores): summary <= 2 s, sync <= 10 s, retrain <= 60 s. Results: BENCHMARKS.md, section 5.
"""

import argparse
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_horus.ledger import Ledger  # noqa: E402
from slurm_horus.ledger.jobs import merge_job  # noqa: E402


def fill(url_path: str, n: int) -> None:
    """n jobs (submission and sacct measurement) merged by the ledger's own rules
    (ledger.jobs.merge_job) and inserted straight into the jobs table (setup, not timed)."""
    Ledger(f"sqlite:///{url_path}").close()
    rng = random.Random(0)
    fams = ["resnet50", "bert", "gpt2", "vit", "unet", "lstm", "t5", "vgg16"]
    types = ["a100", "t4", "h100", "l4"]
    users = [f"user{i}" for i in range(60)]
    rows = []
    for i in range(n):
        pu, pm = rng.uniform(5, 95), rng.uniform(500, 40000)
        measured = rng.random() < 0.9
        au = min(100, max(0, pu + rng.gauss(0, 10))) if measured else None
        am = pm * rng.lognormvariate(0, 0.2) if measured else None
        t = 1700000000 + i * 3
        sub = {"user_name": users[i % 60], "account": "acct", "submit_time": t,
               "model_family": fams[i % 8], "predictor": "cold-start",
               "predictions": json.dumps({types[i % 4]: {
                   "util_pct": pu, "mem_mib": pm, "mem_mib_p90": pm * 1.15,
                   "predictor": "cold-start"}})}
        use = {"sacct": {"gpu_type": types[i % 4], "gpu_index": i % 4, "node": f"n{i % 50}",
                         "shards": 25, "state": "COMPLETED", "elapsed_s": 600, "start_time": t,
                         "end_time": t + 600, "util_mean": au, "util_max": au,
                         "mem_peak_mib": am}}
        row = merge_job(sub, use)
        row["cluster"], row["job_id"] = "c", i
        rows.append(row)
    cols = list(rows[0])
    con = sqlite3.connect(url_path)
    con.executemany(f"INSERT INTO jobs ({', '.join(cols)}) VALUES "
                    f"({', '.join(':' + c for c in cols)})", rows)
    con.commit()
    con.close()


def sacct_json(n: int) -> str:
    """n finished shard jobs in the layout real Slurm 25.11 prints (the recorded fixture's shard
    job, copied): no gres_detail, so the GPU index comes from probe rows (see probe_rows)."""
    fx = json.loads((Path(__file__).resolve().parent.parent / "tests/fixtures/slurm-25.11/"
                     "sacct_json_finished.stdout").read_text())
    proto = next(j for j in fx["jobs"] if any(t["name"] == "shard" for t in j["tres"]["allocated"]))
    jobs = []
    for i in range(n):
        j = json.loads(json.dumps(proto))
        j["job_id"] = 100000 + i
        j["nodes"] = f"node{i % 40}"
        j["time"]["start"] = 1760000000 + i * 30
        j["time"]["end"] = j["time"]["start"] + 3600  # overlaps 4 jobs on its node
        j["comment"]["job"] = "horus:v1;t4=50.0/8000/9000"
        jobs.append(j)
    fx["jobs"] = jobs
    return json.dumps(fx)


def probe_rows(n: int, cluster: str) -> list[dict]:
    """What the Prolog probe left for those jobs: node, GPU index and type; of the 4 jobs
    overlapping one on its node, 2 share its GPU."""
    return [{"job_id": 100000 + i, "cluster": cluster, "source": "probe", "util_mean": 40.0,
             "mem_peak_mib": 7000.0, "node": f"node{i % 40}", "gpu_index": (i // 40) % 2,
             "gpu_type": "t4"} for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--sync-jobs", type=int, default=10_000)
    ap.add_argument("--train-rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=1,
                    help="time the summary this many times (the best is reported; all are shown)")
    ap.add_argument("--skip", default="", help="comma-separated: summary, sync, retrain")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        run(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the 1M-row ledger alone is ~330 MB


def run(a, tmp: Path) -> None:
    out = {}
    if "summary" not in a.skip:
        fill(str(tmp / "big.db"), a.rows)
        from slurm_horus.ledger.report import summary

        L = Ledger(f"sqlite:///{tmp / 'big.db'}", readonly=True)
        times = []
        for _ in range(max(1, a.repeat)):
            t = time.perf_counter()
            s = summary(L)
            times.append(round(time.perf_counter() - t, 2))
        out["summary_s"] = min(times)
        out["summary_runs_s"] = times
        out["summary_jobs"] = s["all"]["jobs"]
        print(f"hacct --summary over {a.rows} rows: {out['summary_s']} s (runs: {times})",
              flush=True)
    if "sync" not in a.skip:
        from slurm_horus.ledger.sync import sync

        data = sacct_json(a.sync_jobs)
        L = Ledger(f"sqlite:///{tmp / 'sync.db'}", spool=str(tmp / "sp"))
        L.record_runs([], probe_rows(a.sync_jobs, json.loads(data)["jobs"][0]["cluster"]))
        t = time.perf_counter()
        res = sync(L, sacct_json=data, all_jobs=True)
        out["sync_s"] = round(time.perf_counter() - t, 2)
        con = sqlite3.connect(tmp / "sync.db")
        co = [len(c.split(",")) if c else 0 for (c,) in con.execute("SELECT colocated FROM jobs")]
        con.close()
        out["sync_colocated_mean"] = round(sum(co) / max(len(co), 1), 2)
        print(f"sync of {a.sync_jobs} sacct jobs (25.11 layout, GPU index from probe rows): "
              f"{out['sync_s']} s ({res['recorded']} recorded, "
              f"{out['sync_colocated_mean']} co-located jobs each)", flush=True)
    if "retrain" not in a.skip:
        from test_retrain import write_csv

        from slurm_horus.predict.registry import Registry
        from slurm_horus.ledger.history_export import export_history
        from slurm_horus.ledger.retrain import import_csv, retrain

        write_csv(tmp / "train.csv", n=a.train_rows)
        L = Ledger(f"sqlite:///{tmp / 'train.db'}")
        t = time.perf_counter()
        import_csv(L, str(tmp / "train.csv"))
        out["import_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        res = retrain(L, Registry(tmp / "models"))
        out["retrain_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        export_history(L, Registry(tmp / "models"))  # what retrain, import and sync add
        out["history_s"] = round(time.perf_counter() - t, 2)
        print(f"import of {a.train_rows} CSV rows: {out['import_s']} s; retrain (5-fold CV + "
              f"final fit, 200 rounds): {out['retrain_s']} s, promoted={res['promoted']}; "
              f"history export: {out['history_s']} s", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
