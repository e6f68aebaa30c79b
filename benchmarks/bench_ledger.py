"""Ledger benchmarks: hacct --summary over 1M rows, sync of 10k sacct jobs, retrain on 100k rows.

    python3 benchmarks/bench_ledger.py [--rows 1000000] [--sync-jobs 10000] [--train-rows 100000]
Targets (2 cores): summary <= 2 s, sync <= 10 s, retrain <= 60 s. Results: BENCHMARKS.md, section 5.
"""

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_horus.ledger import Ledger, mem_err_bucket, under_claim  # noqa: E402


def fill(url_path: str, n: int) -> None:
    """n jobs (submissions + sacct usage + jobs rows) straight into SQLite (setup, not timed)."""
    Ledger(f"sqlite:///{url_path}")
    con = sqlite3.connect(url_path)
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
        rows.append(("c", i, 1, users[i % 60], "acct", 1700000000 + i * 3, fams[i % 8], "cold-start",
                     types[i % 4], i % 4, f"n{i % 50}", 25, "COMPLETED", 600, 1700000000 + i * 3,
                     1700000600 + i * 3, pu, pm, au, au, am, None, "sacct",
                     mem_err_bucket(pm, am), None, pm * 1.15,
                     under_claim(pu, pm * 1.15, au, am)[0]))
    cols = ("cluster, job_id, has_submission, user_name, account, submit_time, model_family, "
            "predictor, gpu_type, gpu_index, node, shards, state, elapsed_s, start_time, end_time, "
            "pred_util_pct, pred_mem_mib, act_util_pct, act_util_max, act_mem_mib, colocated, "
            "sources, mem_err_bucket, gpus, pred_mem_p90_mib, under_claim")
    con.executemany(f"INSERT INTO jobs ({cols}) VALUES (" + ",".join("?" * 27) + ")", rows)
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
    ap.add_argument("--skip", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    out = {}
    if "summary" not in a.skip:
        fill(str(tmp / "big.db"), a.rows)
        from slurm_horus.ledger.report import summary

        L = Ledger(f"sqlite:///{tmp / 'big.db'}")
        t = time.perf_counter()
        s = summary(L)
        out["summary_s"] = round(time.perf_counter() - t, 2)
        out["summary_jobs"] = s["all"]["jobs"]
        print(f"hacct --summary over {a.rows} rows: {out['summary_s']} s", flush=True)
    if "sync" not in a.skip:
        from slurm_horus.ledger.sync import sync

        data = sacct_json(a.sync_jobs)
        L = Ledger(f"sqlite:///{tmp / 'sync.db'}", spool=str(tmp / "sp"))
        L.record_usages(probe_rows(a.sync_jobs, json.loads(data)["jobs"][0]["cluster"]))
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
        from slurm_horus.ledger.retrain import import_csv, retrain

        write_csv(tmp / "train.csv", n=a.train_rows)
        L = Ledger(f"sqlite:///{tmp / 'train.db'}")
        t = time.perf_counter()
        import_csv(L, str(tmp / "train.csv"))
        out["import_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        res = retrain(L, Registry(tmp / "models"))
        out["retrain_s"] = round(time.perf_counter() - t, 2)
        print(f"import of {a.train_rows} CSV rows: {out['import_s']} s; retrain (5-fold CV + "
              f"final fit, 200 rounds): {out['retrain_s']} s, promoted={res['promoted']}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
