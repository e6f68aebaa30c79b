"""History review 10: the site's utilization offsets and pooled corrections are taken per
CPUs-per-GPU bucket, so runs fed by 2 CPUs per GPU (input-bound) no longer move the prediction
of a job asking for 16; memory offsets, which no CPU count changes, as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.history import HistoryPredictor
from slurm_horus.predict.workload import dims_key

ZOO = Path(__file__).parent / "data" / "zoo"
A100 = get_gpu("a100-40gb")
COLD = ColdStartEstimator()
OTHERS = ("small_cnn", "mobilenet_v2", "efficientnet_b0")


@pytest.fixture(scope="module")
def others():
    """Three graphs other than ResNet-50, at batch sizes 4 and 16."""
    return {(n, b): extract_features(ZOO / f"{n}.onnx", batch_size=b) for n in OTHERS for b in (4, 16)}


def _run(report, b, cpus, util_off, user, family, mem_off=500.0):
    """A run measured ``mem_off`` MiB and ``util_off`` points from the cold start."""
    c = COLD.predict(report, A100, Workload(batch_size=b))
    return {"sha": report.sha256, "gpu": A100.name, "bs": b, "task": "train", "opt": "adam",
            "prec": "fp32", "dims": dims_key(report.given_dims, b), "mem": c.mem_mib + mem_off,
            "util": c.util_pct + util_off, "cold_mem": c.mem_mib, "cold_util": c.util_pct,
            "base": "learned:v0001", "base_mem": c.mem_mib, "base_util": c.util_pct,
            "family": family, "user": user, "cpus_per_gpu": cpus}


def _site(others, cpus=2, users=("u1", "u2", "u3"), util_off=-20.0):
    """Each of the three other graphs run by its own user at ``cpus`` CPUs per GPU, 20 points
    below the cold start's utilization (input-bound), 500 MiB above its memory."""
    return [_run(others[(n, b)], b, cpus, util_off, u, n) for n, u in zip(OTHERS, users) for b in (4, 16)]


def _reread(h: HistoryPredictor, user: str = "bob") -> HistoryPredictor:
    """The history as hsubmit reads it: through its JSON file."""
    return HistoryPredictor.from_dict(json.loads(json.dumps(h.to_dict())), user=user)


def test_a_utilization_offset_measured_at_2_cpus_per_gpu_leaves_a_job_asking_for_16(resnet, others):
    """Three users' graphs at 2 CPUs per GPU, 20 points below the cold start: a new graph's job
    asking for 16 got the cold start's utilization minus 20 (43 % for ResNet-50's 63 %); it
    gets the cold start's own, with the memory offset (+500 MiB) kept. At 2 (and 2.5, in its
    bucket) and at unknown CPUs, the offset as measured."""
    h = _reread(HistoryPredictor().fit(_site(others)))
    r = resnet[16]
    for cpus, util_off in ((16, 0.0), (12, 0.0), (2, -20.0), (2.5, -20.0), (None, -20.0)):
        w = Workload(batch_size=16, cpus_per_gpu=cpus)
        c, p = COLD.predict(r, A100, w), h.predict(r, A100, w)
        assert p.predictor == "cold-start"
        assert p.mem_mib == pytest.approx(c.mem_mib + 500.0)
        assert p.util_pct == pytest.approx(c.util_pct + util_off), cpus
    off = h.offsets["a100-40gb"]["cold-start"]
    assert (off["mem_mib"], off["util_pp"], off["util_cpus"]) == (500.0, -20.0, {"2": -20.0})
    # the learned model's offsets alike (its figures were each run's at its own CPUs)
    assert h.offsets["a100-40gb"]["learned:v0001"]["util_cpus"] == {"2": -20.0}


def test_a_family_run_at_2_cpus_per_gpu_pulls_no_job_asking_for_16(resnet, others):
    """One imported graph of the family (two jobs: no site offset) at 2 CPUs per GPU, 30 points
    below the cold start: its pool pulled a family member's job asking for 16 halfway down
    (-15 points); now its utilization pull answers jobs at 2 alone, its memory pull all."""
    fam = [_run(others[("mobilenet_v2", b)], b, 2, -30.0, None, "resnet50") for b in (4, 16)]
    h = _reread(HistoryPredictor().fit(fam))
    assert h.offsets == {}
    r = resnet[16]
    mems = set()
    for cpus, util_off in ((16, 0.0), (2, -15.0), (None, -15.0)):
        w = Workload(batch_size=16, cpus_per_gpu=cpus)
        p = h.predict(r, A100, w)
        assert p.predictor == "history:family"
        assert p.util_pct == pytest.approx(COLD.predict(r, A100, w).util_pct + util_off), cpus
        mems.add(round(p.mem_mib, 6))
    assert len(mems) == 1
    assert h.families["a100-40gb"]["resnet50"]["util_cpus"] == {"2": {"util_shift": -30.0, "n": 1}}


def test_each_cpu_bucket_keeps_the_offset_rules(others):
    """Per bucket, as for the whole offset: MIN_OFFSET_JOBS and graphs (one graph at 8 gives
    none), raise-only unless three users ran it there (at 16, two users ran the three graphs
    that three others ran at 2: their -20 may not lower), each user weighing one; the pools'
    count and raise-only rule per bucket too (the family's pool as a whole may lower)."""
    runs = (_site(others, 2) + _site(others, 16, users=("v1", "v1", "v2"))
            + [_run(others[("small_cnn", b)], b, 8, -20.0, "w1", "small_cnn") for b in (4, 16)])
    h = _reread(HistoryPredictor().fit([dict(r, family="f") for r in runs]))
    assert h.offsets["a100-40gb"]["cold-start"]["util_cpus"] == {"2": -20.0, "16": 0.0}
    pool = h.families["a100-40gb"]["f"]
    assert "raise_only" not in pool
    assert pool["util_cpus"] == {"2": {"util_shift": 0.0, "n": 3},
                                 "8": {"util_shift": 0.0, "n": 1, "raise_only": True},
                                 "16": {"util_shift": 0.0, "n": 3, "raise_only": True}}


def test_a_history_file_without_offsets_per_cpu_bucket_reads_as_before(resnet, others):
    """A file from before (offsets and pools of no bucket, or runs whose CPUs were unknown):
    its utilization offset moves every job alike, as it did; a malformed bucket is refused."""
    d = HistoryPredictor().fit(_site(others)).to_dict()
    for off in d["offsets"]["a100-40gb"].values():
        del off["util_cpus"]
    h = HistoryPredictor.from_dict(json.loads(json.dumps(d)), user="bob")
    w = Workload(batch_size=16, cpus_per_gpu=16)
    assert h.predict(resnet[16], A100, w).util_pct == pytest.approx(
        COLD.predict(resnet[16], A100, w).util_pct - 20.0)
    unknown = HistoryPredictor().fit([dict(r, cpus_per_gpu=None) for r in _site(others)])
    assert "util_cpus" not in unknown.offsets["a100-40gb"]["cold-start"]
    d["offsets"]["a100-40gb"]["cold-start"]["util_cpus"] = {"3": -20.0}
    with pytest.raises(HorusError, match="bucket"):
        HistoryPredictor.from_dict(d)


def _bare(g, util, cold_util, user, family, bs):
    """A run of graph number ``g`` at 1 CPU per GPU, 500 MiB above the cold start."""
    return {"sha": f"{g:064x}", "gpu": A100.name, "bs": bs, "task": "train", "opt": "adam",
            "prec": "fp32", "dims": "", "mem": 2000.0, "util": util, "cold_mem": 1500.0,
            "cold_util": cold_util, "family": family, "user": user, "cpus_per_gpu": 1}


def test_a_pool_shift_past_100_points_from_the_site_offset_is_read_back():
    """Three users' graphs ran 80 points below the cold start (offset -80); a family's graph 30
    above it: its shift from the offset is 110 points, which fit wrote and the reader refused
    (the range of a utilization, not of a residual less an offset), dropping the whole history.
    Read back, it answers as fitted."""
    runs = [_bare(g, 10.0, 90.0, u, "x", bs) for g, u in ((1, "a"), (2, "b"), (3, "c")) for bs in (4, 8)]
    runs += [_bare(4, 40.0, 10.0, "d", "fam", bs) for bs in (4, 8)]
    h = HistoryPredictor().fit(runs)
    assert h.families["a100-40gb"]["fam"]["util_cpus"]["1"]["util_shift"] == 110.0
    back = _reread(h)
    assert back.families == h.families
    for cpus in (1, None):
        args = (f"{5:064x}", A100.name, Workload(batch_size=4, cpus_per_gpu=cpus), "", 1500.0, 10.0,
                "fam", "bob", 1500.0, 10.0, "cold-start")
        assert back.estimate(*args) == h.estimate(*args)
        assert h.estimate(*args).util_pct == pytest.approx(20.0)  # halfway from 0 to 40


def test_one_run_at_a_new_bucket_keeps_a_sites_raising_offset(resnet, others):
    """A review: three users' graphs of unknown CPUs (older imports) 20 points above the cold
    start, then one run by anyone at 16 CPUs per GPU: the offsets were kept per bucket from then
    on, and a job at 16, a bucket too few runs had measured, lost the site's +20.  The all-runs
    offset still answers there where it raises the answer; one that lowers it does not (the
    test above)."""
    site = _site(others, cpus=None, util_off=20.0)
    x = _run(others[("small_cnn", 4)], 4, 16, 0.0, "x", "small_cnn")
    h = _reread(HistoryPredictor().fit([*site, x]))
    assert "util_cpus" in h.offsets["a100-40gb"]["cold-start"]
    r = resnet[16]
    for cpus in (16, 2, None):
        w = Workload(batch_size=16, cpus_per_gpu=cpus)
        c, p = COLD.predict(r, A100, w), h.predict(r, A100, w)
        assert p.util_pct == pytest.approx(min(100.0, c.util_pct + 20.0), abs=0.5), cpus
