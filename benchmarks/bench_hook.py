"""In-process cost of the job-submit hook: the real etc/job_submit.lua in a Lua 5.1 runtime
(hook_runtime.HookRuntime, as slurmctld keeps it loaded), for a job without a hint and for a hinted
job that the hook rewrites into shards. Includes the Python-Lua marshalling of the job table.
Then the hinted job with the worst batch scripts for the hook's srun scan (4 MiB each: sbatch's
default limit), which must stay bounded: slurmctld waits for the hook.

    python3 benchmarks/bench_hook.py [--calls 20000] [--rounds 5] [--script-calls 20]

Prints the median per-call time of each kind over alternating rounds and their difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from slurm_horus.slurm.hook_runtime import HookRuntime  # noqa: E402

HINT = "horus:v1;a100=6.0/1301/1752;t4=6.0/1301/1752"


def per_call_us(rt: HookRuntime, job: dict, policy: str, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        rt.submit(job, policy_path=policy, submit_uid=54321)
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--script-calls", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # the shipped policy, with the claim record pointed at an empty file of this run
        policy = Path(tmp) / "horus_policy.conf"
        (Path(tmp) / "record").write_text("# empty claim record\n")
        policy.write_text((REPO / "etc" / "horus_policy.conf").read_text()
                          + f"\nrecord_file = {Path(tmp) / 'record'}\n")
        rt = HookRuntime(REPO / "etc" / "job_submit.lua")
        plain = {"tres_per_node": "gres:gpu:1", "partition": "gpu"}
        hinted = dict(plain, comment=HINT)
        assert "shard" in (rt.submit(hinted, policy_path=str(policy), submit_uid=54321)
                           .job_desc.get("tres_per_node") or ""), "the hinted job was not rewritten"
        times = {"no hint": [], "hint": []}
        for _ in range(a.rounds):
            times["no hint"].append(per_call_us(rt, plain, str(policy), a.calls))
            times["hint"].append(per_call_us(rt, hinted, str(policy), a.calls))
        size = 4 << 20
        scripts = {"one line of srun words": "srun " * (size // 5),
                   "srun -x srun -x ... lines": ("srun -x " * 4096 + "\n") * (size // (8 * 4096 + 1)),
                   "blanks, then srun --gpus=1": " " * (size - 32) + "srun --gpus=1 x\n"}
        worst = {k: statistics.median(per_call_us(rt, dict(hinted, script=v), str(policy), a.script_calls)
                                      for _ in range(a.rounds)) for k, v in scripts.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"hook per call, median of {a.rounds} alternating rounds of {a.calls}: "
          f"no hint {med['no hint']:.1f} us, hint {med['hint']:.1f} us, "
          f"difference {med['hint'] - med['no hint']:+.1f} us")
    print(f"hinted job with a 4 MiB script, median of {a.rounds} rounds of {a.script_calls}: "
          + "; ".join(f"{k} {v / 1000:.1f} ms" for k, v in worst.items()))


if __name__ == "__main__":
    main()
