"""The cluster simulator: hand-worked schedules, the hook in the loop, traces, CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_horus.errors import HorusError
from slurm_horus.slurm.hint import encode_hint
from slurm_horus.slurm.policy import decide
from slurm_horus.sim.interference import LUCID_POINTS, Interference, parse_points
from slurm_horus.sim.cluster import (Backfill, ClusterSpec, NodeSpec, backfill_from_slurm_conf, cluster_from_json,
                                     cluster_from_slurm_conf, homogeneous_cluster)
from slurm_horus.sim.engine import Simulator, run_policies
from slurm_horus.sim.mix import ModelMix
from slurm_horus.sim.placement import UTIL_SIGMA
from slurm_horus.sim.policies import HorusDecider, Request, build_requests, job_table
from slurm_horus.sim.replay import from_rows, from_sacct_json, rows_from_ledger_jobs, site_residuals
from slurm_horus.sim.traces import TRACES, SimJob, generate_trace, lognormal_params

A100 = 40960.0
REPO = Path(__file__).resolve().parents[1]


def job(i, submit, duration, util=10.0, mem=2000.0, gpus=1, limit=None, p90=None, true=None):
    tu, tm = true if true is not None else (util, mem)
    return SimJob(i, submit, duration, gpus, limit if limit is not None else 2 * duration, "test",
                  {"a100": (util, mem, p90 if p90 is not None else mem)}, {"a100": (tu, tm)})


def one_node(gpus):
    return ClusterSpec((NodeSpec("n0", "a100", gpus),))


def by_id(sim, jobs):
    return {j.id: (sim.start[j.id], sim.end[j.id]) for j in jobs}


def run(cluster, jobs, reqs, **kw):
    """A hand-worked schedule: backfill at every event unless a test spaces it (the
    simulator's default is Slurm's bf_interval, 30 s)."""
    kw.setdefault("bf_interval", 0.0)
    sim = Simulator(cluster, jobs, reqs, 100, **kw)
    return sim, sim.run()


# -- hand-worked schedules --------------------------------------------------------------------

def test_three_jobs_one_gpu_exclusive_run_one_after_another():
    jobs = [job(0, 0, 100), job(1, 0, 200), job(2, 0, 300)]
    sim, m = run(one_node(1), jobs, [Request((0,), 100, 1)] * 3)
    assert by_id(sim, jobs) == {0: (0, 100), 1: (100, 300), 2: (300, 600)}
    assert m["makespan_s"] == pytest.approx(600)
    assert m["mean_jct_s"] == pytest.approx((100 + 300 + 600) / 3)
    assert m["mean_wait_s"] == pytest.approx((0 + 100 + 300) / 3)
    assert m["gpu_util"] == pytest.approx(0.10)  # 10 % util, GPU busy the whole time
    assert m["gpus_busy_frac"] == pytest.approx(1.0)
    assert m["mean_slowdown"] == pytest.approx(1.0)
    # the same through the policy layer
    r = run_policies(one_node(1), jobs, ["exclusive"])["exclusive"]
    assert r["makespan_s"] == pytest.approx(600) and r["oom_failures"] == 0


def test_two_light_jobs_share_a_gpu_under_horus_with_lucid_slowdown():
    jobs = [job(0, 0, 1000, util=40, mem=2000), job(1, 0, 1000, util=40, mem=2000)]
    res = run_policies(one_node(1), jobs, ["exclusive", "horus", "oracle"])
    speed = Interference().speed(80.0, 2)
    assert speed == pytest.approx(1.0 - 0.03 * 5 / 12.5)  # between 75 % (1.00) and 87.5 % (0.97)
    h = res["horus"]
    assert h["decisions"]["shared"] == 2 and h["shared_starts"] == 2
    assert h["makespan_s"] == pytest.approx(1000 / speed)
    assert h["mean_jct_s"] == pytest.approx(1000 / speed)
    assert h["mean_wait_s"] == 0
    assert h["mean_slowdown"] == pytest.approx(1 / speed)
    assert h["gpu_util"] == pytest.approx(min(1.0, 0.8 * speed))
    e = res["exclusive"]
    assert e["makespan_s"] == pytest.approx(2000) and e["mean_jct_s"] == pytest.approx(1500)
    assert res["oracle"]["makespan_s"] == pytest.approx(1000 / speed)


def test_slowdown_changes_when_a_co_located_job_leaves():
    # 60 + 60 = 120 % -> speed s while both run; the short one leaves, the long one speeds up.
    jobs = [job(0, 0, 100, util=60), job(1, 0, 1000, util=60)]
    sim, m = run(one_node(1), jobs, [Request((0,), 40, 1)] * 2)
    s = Interference().speed(120, 2)
    t0 = 100 / s
    assert sim.end[0] == pytest.approx(t0)
    assert sim.end[1] == pytest.approx(t0 + (1000 - 100))


def test_backfill_short_job_jumps_ahead_without_delaying_the_reservation():
    # 2 GPUs on one node.  A holds GPU 0 (limit 2000).  B needs both GPUs: reserved at 2000 on
    # GPUs {0, 1}.  D (long) would run past 2000 on GPU 1: not backfilled.  C ends (by its limit)
    # before 2000: backfilled at once on GPU 1.
    jobs = [job(0, 0, 1000, limit=2000), job(1, 1, 100, gpus=2, limit=200),
            job(2, 2, 5000, limit=10000), job(3, 3, 500, limit=1000)]
    reqs = [Request((0,), 100, 1), Request((0,), 100, 2), Request((0,), 100, 1), Request((0,), 100, 1)]
    sim, m = run(one_node(2), jobs, reqs)
    assert by_id(sim, jobs) == {0: (0, 1000), 1: (1000, 1100), 2: (1100, 6100), 3: (3, 503)}
    assert m["backfilled"] == 1
    # without backfill, C waits behind B and D
    sim2, _ = run(one_node(2), jobs, reqs, backfill=False)
    assert by_id(sim2, jobs)[3] == (1100, 1600)


def test_backfill_window_bounds_the_jobs_looked_at():
    jobs = [job(0, 0, 1000, limit=2000), job(1, 1, 100, gpus=2), job(2, 2, 5000, limit=10000),
            job(3, 3, 500, limit=1000)]
    reqs = [Request((0,), 100, 1), Request((0,), 100, 2), Request((0,), 100, 1), Request((0,), 100, 1)]
    sim, _ = run(one_node(2), jobs, reqs, bf_window=1)  # only D is looked at: C is not backfilled
    assert sim.start[3] == 1100


def test_oom_counted_and_job_requeued_once_on_a_whole_gpu():
    jobs = [job(0, 0, 1000, mem=25000), job(1, 0, 1000, mem=25000)]
    sim, m = run(one_node(1), jobs, [Request((0,), 50, 1)] * 2, oom_delay_s=60)
    assert m["oom_failures"] == 1 and m["failed_jobs"] == 0
    assert by_id(sim, jobs) == {0: (0, 1000), 1: (1000, 2000)}
    assert sim.cur_req[1].shards == 100  # requeued exclusively
    r = run_policies(one_node(1), jobs, ["naive"])["naive"]
    assert r["oom_failures"] == 1


def test_oom_requeue_keeps_the_types_the_job_asked_for():
    """Requeued on a whole GPU of any type its request allows, as Slurm keeps a reshaped job's
    type choices: pinned to the T4 it failed on, it had waited for its partner to end there
    while the A100 it also asked for was free."""
    c = ClusterSpec((NodeSpec("n0", "a100", 1), NodeSpec("n1", "t4", 1)))
    both = {"a100": 1.0, "t4": 1.0}

    def two(i, submit, duration, mem):
        fig = {"a100": (10.0, mem, mem), "t4": (10.0, mem, mem)}
        return SimJob(i, submit, duration, 1, 2 * duration, "test", fig,
                      {t: (10.0, mem) for t in fig}, runtime_x=both)

    jobs = [two(0, 0, 1000, 2000), two(1, 1, 5000, 9000), two(2, 2, 1000, 9000)]
    reqs = [Request((0,), 100, 1), Request((1,), 50, 1), Request((0, 1), 50, 1)]
    sim, m = run(c, jobs, reqs, oom_delay_s=60)
    assert m["oom_failures"] == 1 and m["failed_jobs"] == 0
    assert sim.cur_req[2] == Request((0, 1), 100, 1)
    assert (sim.start[2], sim.end[2]) == (1000, 2000)  # on the A100 once job 0 freed it


def test_job_larger_than_the_gpu_fails_twice_then_is_lost():
    jobs = [job(0, 0, 100, mem=50000, true=(10, 50000))]
    sim, m = run(one_node(1), jobs, [Request((0,), 100, 1)])
    assert m["oom_failures"] == 2 and m["failed_jobs"] == 1 and m["completed"] == 0


def test_true_memory_above_prediction_ooms_under_horus_but_not_oracle():
    # predicted 8 GB each (packed), truly 24 GB each: the second one OOMs under horus.
    jobs = [job(i, 0, 1000, util=20, mem=8000, true=(20, 24000)) for i in range(2)]
    res = run_policies(one_node(1), jobs, ["horus", "oracle"])
    assert res["horus"]["oom_failures"] == 1
    assert res["oracle"]["oom_failures"] == 0


def test_timeout_when_interference_pushes_a_job_past_its_limit():
    itf = Interference(((0, 1.0), (100, 0.4)))
    jobs = [job(0, 0, 1000, util=90, limit=1200), job(1, 0, 1000, util=90, limit=1200)]
    sim, m = run(one_node(1), jobs, [Request((0,), 50, 1)] * 2, interference=itf)
    # killed at 1200 s, submitted again by their users, paired again and killed again: a kill
    # costs the run (it had ended the job's life at the kill, its JCT 1200 s)
    assert (m["timeouts"], m["resubmitted"], m["ended"], m["completed"]) == (4, 2, 2, 0)
    assert sim.end[0] == pytest.approx(2400) and m["mean_jct_s"] == pytest.approx(2400)
    # each did 480 s of its 1000 s in 1200 s, twice: it ran at slowdown 2.5, beyond a bound of
    # 2 (at its kill time, 1.2, it had counted as within it)
    assert m["p95_slowdown"] == pytest.approx(2.5) and m["beyond_bound"] == 2



def test_a_job_killed_at_its_limit_costs_its_lost_run_and_the_rerun():
    """A job killed at its time limit had ended there, its JCT the kill time: killing looked
    cheaper than finishing (naive pairs that time out were never rerun).  Its user submits it
    again, behind the jobs already waiting; it then runs alone and completes."""
    itf = Interference(((0, 1.0), (100, 0.4)))
    jobs = [job(0, 0, 1000, util=90, limit=1200), job(1, 0, 300, util=90, limit=1200),
            job(2, 100, 500, util=90, limit=1200)]
    reqs = [Request((0,), 50, 1), Request((0,), 50, 1), Request((0,), 100, 1)]
    sim, m = run(one_node(1), jobs, reqs, interference=itf)
    # 0 and 1 share (speed 0.4): 1 ends at 750; 0, alone from 750 (300 s done), is killed at
    # 1200 (750 s done); job 2 (waiting since 100) runs 1200-1700; then 0's rerun, alone
    assert (m["timeouts"], m["resubmitted"], m["completed"]) == (1, 1, 3)
    assert sim.end[1] == pytest.approx(750) and sim.end[2] == pytest.approx(1700)
    assert sim.end[0] == pytest.approx(2700) and sim.start[0] == pytest.approx(1700)
    assert m["mean_jct_s"] == pytest.approx((2700 + 750 + 1600) / 3)
    # slowdowns 1.6 (job 0: its killed run's, 1200 s for 750 s of work, not its rerun's 1.0),
    # 2.5 (job 1: 750 s for 300 s), 1.0 (job 2)
    assert m["p50_slowdown"] == pytest.approx(1.6) and m["p95_slowdown"] == pytest.approx(2.41)


def test_a_timed_out_shared_job_settles_its_tail_charge_at_one():
    itf = Interference(((0, 1.0), (75, 1.0), (100, 0.4)))
    # predicted 10 % each (a free pair), truly 90 %: they slow each other past their limits
    jobs = [job(i, 0, 1000, util=10, limit=1200, true=(90, 2000)) for i in range(2)]
    share = (10.0, 2000.0, (1.0,), 1200.0)
    sim, m = run(one_node(1), jobs, [Request((0,), 1, 1, share)] * 2, interference=itf, max_group=2)
    assert m["timeouts"] == 4 and sim.jrisk == [1.0, 1.0] and m["expected_beyond"] == pytest.approx(2.0)


def test_cluster_file_refuses_what_no_gpu_has():
    for text, words in [('{"nodes": [{"gpu_type": "a100", "gpus": 8, "mem_mib": NaN}]}', "NaN"),
                        ('{"nodes": [{"gpu_type": "a100", "gpus": 8, "mem_mib": Infinity}]}', "Infinity"),
                        ('{"nodes": [{"gpu_type": "a100", "gpus": 8, "mem_mib": true}]}', "mem_mib"),
                        ("[" * 100000, "not JSON"),
                        ('{"nodes": [{"gpu_type": "a100", "gpus": 8, "mem_mib": 40960},'
                         ' {"gpu_type": "a100", "gpus": 8, "mem_mib": 81920}]}', "one size per type")]:
        with pytest.raises(HorusError, match=words):
            cluster_from_json(text)


def test_max_group_is_bounded_by_the_shards_per_gpu():
    with pytest.raises(HorusError, match="max-group in 1..100"):
        Simulator(one_node(1), [job(0, 0, 10)], [Request((0,), 100, 1)], 100, max_group=100_000_000)


# -- the hook in the loop -----------------------------------------------------------------------

def test_simulator_decisions_equal_the_lua_hook():
    preds = [(5, 1500, 1800), (20, 3000, 3500), (40, 9000, 12000), (69.9, 2000, 2500), (70, 2000, 2500),
             (85, 30000, 36000), (10, 38000, 39000), (33.3, 17000, 20000), (0.5, 100, 200)]
    jobs = [job(i, 0, 100, util=u, mem=m, p90=p) for i, (u, m, p) in enumerate(preds)]
    with HorusDecider(["a100"], [A100]) as d:
        reqs, stats = build_requests(jobs, "horus", ["a100"], [A100], d.shards_per_gpu, decider=d,
                                     pack=False)
        assert d.calls <= len(preds) + 1
    for j, r in zip(jobs, reqs):
        hint = encode_hint({"a100": j.pred["a100"]})
        ref = decide({"comment": hint, "tres_per_node": "gres:gpu:1"})
        if ref.action == "shared":
            assert (r.types, r.shards) == ((0,), ref.shards)
        else:
            assert r.shards == 100, (j.pred, ref.action)
    assert stats["shared"] >= 4 and stats["exclusive"] >= 2


POLICY = """shards_per_gpu = 100
pack_limit_pct = 90
exclusive_util_pct = 70
memory = p90
gpu.a100.mem_mib = 40960
gpu.t4.mem_mib = 15360
type_order = t4, a100
"""


def test_decider_adds_cluster_types_the_policy_does_not_know(tmp_path):
    base = tmp_path / "horus_policy.conf"
    base.write_text(POLICY)
    c = ClusterSpec((NodeSpec("n0", "h100", 4), NodeSpec("n1", "t4", 4)))
    types = c.gpu_types
    mem = [c.mem_mib(t) for t in types]
    with HorusDecider(types, mem, policy_path=base) as d:
        text = d.policy_path.read_text()
        assert "gpu.h100.mem_mib" in text and "\ntype_order = t4, h100\n" in text
        # neither the site's claim record nor its live queue pressure decide simulated jobs
        assert text.splitlines()[-2:] == ["underclaim_limit = 0", "pressure_file = "]
        a, t, s = d.decide({"h100": (20, 3000, 3500), "t4": (20, 3000, 3500)})
        assert (a, t, s) == ("shared", "t4", 26)  # the documented t4 example
        a, t, s = d.decide({"h100": (20, 30000, 35000), "t4": (20, 30000, 35000)})
        assert a == "shared" and t == "h100"


def test_type_choice_any_lets_a_shard_job_run_on_every_type(tmp_path):
    base = tmp_path / "horus_policy.conf"
    base.write_text(POLICY + "type_choice = any\n")
    types, mem = ["a100", "t4"], [A100, 15360.0]
    light = SimJob(0, 0, 100, 1, 200, "x", {"a100": (10, 2000, 2500), "t4": (20, 2000, 2500)},
                   {"a100": (10, 2000), "t4": (20, 2000)})
    with HorusDecider(types, mem, policy_path=base) as d:
        assert d.decide(light.pred) == ("shared", "any", 23)  # max(a100 12, t4 23)
        reqs, _ = build_requests([light], "horus", types, mem, 100, decider=d, pack=False)
    assert reqs[0] == Request((0, 1), 23, 1)


def test_multi_gpu_jobs_keep_whole_gpus_under_every_policy():
    jobs = [job(0, 0, 100, util=5, gpus=4)]
    c = homogeneous_cluster(8, per_node=8)
    for p, r in run_policies(c, jobs).items():
        assert r["shared_starts"] == 0 and r["makespan_s"] == pytest.approx(100), p


# -- traces, determinism -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def mix():
    return ModelMix()


def test_lognormal_fit_matches_the_quantiles():
    mu, s = lognormal_params(1124, 39630)
    assert math.exp(mu) == pytest.approx(1124)
    assert math.exp(mu + 1.6448536 * s) == pytest.approx(39630, rel=1e-6)


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_generated_trace_statistics(trace, mix):
    jobs = generate_trace(trace, 3000, ["a100"], 64, seed=3, mix=mix)
    single = sum(j.gpus == 1 for j in jobs) / len(jobs)
    assert single == pytest.approx(TRACES[trace].single_gpu_share, abs=0.03)
    assert all(j.limit >= 1.2 * j.duration for j in jobs)
    assert all(0 <= j.true["a100"][0] <= 100 and j.true["a100"][1] <= 0.97 * A100 + 1e-6 for j in jobs)
    assert len({j.model for j in jobs}) >= 5
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)


def test_limit_noise_loosens_only_the_limits(mix):
    """Users' limits: over-requested, in whole hours, never below the exact multiple; the rest
    of the trace is the same job for job, so the two runs compare the limits alone."""
    exact = generate_trace("philly", 500, ["a100", "t4"], 64, seed=5, mix=mix)
    loose = generate_trace("philly", 500, ["a100", "t4"], 64, seed=5, mix=mix, limit_noise=1.0)
    assert [replace(j, limit=0) for j in exact] == [replace(j, limit=0) for j in loose]
    assert all(b.limit >= a.limit for a, b in zip(exact, loose))
    hours = [b for a, b in zip(exact, loose) if b.limit != a.limit]
    assert len(hours) > 400 and all(b.limit % 3600 == 0 and b.limit <= 7 * 86400 for b in hours)
    assert sum(b.limit >= 2 * a.limit for a, b in zip(exact, loose)) > 50
    with pytest.raises(HorusError, match="--limit-noise"):
        generate_trace("philly", 10, ["a100"], 8, seed=5, mix=mix, limit_noise=-1)


def test_pai_mix_is_lighter_than_philly(mix):
    mean = lambda js: sum(j.true["a100"][0] for j in js) / len(js)
    assert mean(generate_trace("pai", 2000, ["a100"], 64, seed=1, mix=mix)) < \
        mean(generate_trace("philly", 2000, ["a100"], 64, seed=1, mix=mix)) - 10


def test_deterministic_for_a_seed(mix):
    c = homogeneous_cluster(16)
    a = generate_trace("helios", 400, c.gpu_types, c.total_gpus, seed=7, mix=mix)
    b = generate_trace("helios", 400, c.gpu_types, c.total_gpus, seed=7, mix=mix)
    assert a == b
    assert a != generate_trace("helios", 400, c.gpu_types, c.total_gpus, seed=8, mix=mix)
    strip = lambda r: {p: {k: v for k, v in m.items() if not k.endswith(("wall_s", "cpu_s"))} for p, m in r.items()}
    assert strip(run_policies(c, a)) == strip(run_policies(c, b))


def test_a_shared_job_table_gives_each_policy_what_its_own_would(mix):
    c = homogeneous_cluster(16)
    jobs = generate_trace("philly", 300, c.gpu_types, c.total_gpus, seed=3, load=2, mix=mix)
    table = job_table(jobs, c.gpu_types, [c.mem_mib(t) for t in c.gpu_types])
    strip = lambda r: {p: {k: v for k, v in m.items() if not k.endswith(("wall_s", "cpu_s"))} for p, m in r.items()}
    assert strip(run_policies(c, jobs, table=table)) == strip(run_policies(c, jobs))
    with pytest.raises(HorusError, match="another trace"):
        run_policies(c, jobs[:-1], ["exclusive"], table=table)


def test_from_rows_ledger_interface():
    rows = [{"submit_time": 100, "elapsed_s": 50, "gpus": 1, "pred_util": 30, "pred_mem": 4000,
             "true_util": 35, "true_mem": 4500},
            {"submit_time": 90, "elapsed_s": 20, "gpus": 2, "pred_util": 80, "pred_mem": 9000,
             "true_util": 70, "true_mem": 8000, "pred_mem_p90": 10000, "limit_s": 600}]
    jobs = from_rows(rows, ["a100", "t4"])
    assert [j.submit for j in jobs] == [0, 10]
    assert jobs[0].gpus == 2 and jobs[0].limit == 600 and jobs[0].pred["t4"] == (80, 9000, 10000)
    assert jobs[1].true["a100"] == (35, 4500) and jobs[1].limit == 100
    with pytest.raises(HorusError, match="row 1: missing true_mem"):
        from_rows([{k: 1 for k in ("submit_time", "elapsed_s", "gpus", "pred_util", "pred_mem",
                                   "true_util")}], ["a100"])


def _site_rows(model, n, pred_util, true_util, pred_mem=4000.0, true_mem=4000.0, colocated=False, t0=0):
    return [{"submit_time": t0 + i, "elapsed_s": 100, "gpus": 1, "pred_util": pred_util,
             "pred_mem": pred_mem, "true_util": true_util, "true_mem": true_mem, "model": model,
             "colocated": colocated} for i in range(n)]


def test_site_residuals_use_solo_runs_for_utilization():
    rows = (_site_rows("resnet50", 6, 60, 30, 4000, 5200)       # solo: util / 2, memory x 1.3
            + _site_rows("resnet50", 3, 60, 15, 4000, 5200, colocated=True)  # its share: not its need
            + _site_rows("vgg16", 4, 80, 80))                  # too few runs of its own
    res = site_residuals(rows)
    assert res["util"]["resnet50"] == [round(math.log(0.5), 4)] * 6
    assert res["mem"]["resnet50"] == [round(math.log(1.3), 4)] * 9  # memory from every run
    assert "vgg16" not in res["util"] and "vgg16" not in res["mem"]
    assert sorted(res["util"]["*"]) == sorted([round(math.log(0.5), 4)] * 6 + [0.0] * 4)
    with pytest.raises(HorusError, match="row 1: colocated must be true or false"):
        site_residuals([dict(rows[0], colocated="yes")])


def test_mix_draws_the_sites_residuals_first(mix):
    site = {"util": {"resnet50": [-0.7], "*": [-0.2, -0.1]}, "mem": {"resnet50": [0.26]}}
    smix = ModelMix(site=site)
    assert list(smix.util_residuals("resnet50")) == [-0.7]
    assert list(smix.util_residuals("vgg16")) == [-0.2, -0.1]      # the site's pool
    assert list(smix.mem_residuals("resnet50")) == [0.26]
    assert list(smix.mem_residuals("vgg16")) == list(mix.mem_residuals("vgg16"))  # GPUMemNet's
    no_pool = ModelMix(site={"util": {"resnet50": [-0.7]}, "mem": {}})
    assert list(no_pool.util_residuals("vgg16")) == list(mix.util_residuals())
    for bad in ({"util": {}}, {"util": {"m": ["x"]}, "mem": {}}, {"util": {"m": []}, "mem": {}},
                {"util": {"m": [float("nan")]}, "mem": {}}):
        with pytest.raises(HorusError, match="site residuals"):
            ModelMix(site=bad)


def test_generated_truth_follows_the_sites_errors(mix):
    """Every model of the mix measured by the site at half its predicted utilization and 1.3x
    its memory: the truth of every generated job is exactly that (no jitter)."""
    models = sorted({m for m, _, _ in mix.entries("philly")[0]})
    site = {"util": {m: [math.log(0.5)] for m in models}, "mem": {m: [math.log(1.3)] for m in models}}
    kw = dict(seed=3, sigma_util=0.0, sigma_mem=0.0, mem_cap_mib=1e9)
    jobs = generate_trace("philly", 200, ["a100", "t4"], 16, mix=ModelMix(site=site), **kw)
    for j in jobs:
        for t in ("a100", "t4"):
            assert j.true[t][0] == pytest.approx(min(100.0, j.pred[t][0] * 0.5))
            assert j.true[t][1] == pytest.approx(j.pred[t][1] * 1.3)
    shipped = generate_trace("philly", 200, ["a100", "t4"], 16, mix=mix, **kw)
    assert sum(abs(j.true["a100"][0] - j.pred["a100"][0] * 0.5) > 1 for j in shipped) > 50


def test_site_residuals_per_gpu_type_drive_that_types_truth(mix):
    """The site ran resnet50 at a quarter of its predicted utilization on its T4s and as
    predicted on its A100s: generated resnet50 jobs are true to that per type; other models
    keep one residual for every type."""
    rows = ([dict(r, gpu_type="t4") for r in _site_rows("resnet50", 5, 80, 20, 4000, 6000)]
            + [dict(r, gpu_type="a100") for r in _site_rows("resnet50", 5, 80, 80, 4000, 4000)]
            + [dict(r, gpu_type="a100") for r in _site_rows("vgg16", 2, 80, 80)])
    res = site_residuals(rows)
    assert res["by_type"]["t4"]["util"]["resnet50"] == [round(math.log(0.25), 4)] * 5
    assert res["by_type"]["a100"]["mem"]["resnet50"] == [0.0] * 5
    assert "vgg16" not in res["by_type"]["a100"]["util"] and len(res["util"]["resnet50"]) == 10
    smix = ModelMix(site=res)
    jobs = generate_trace("philly", 300, ["a100", "t4"], 16, mix=smix, seed=5, sigma_util=0.0,
                          sigma_mem=0.0, mem_cap_mib=1e9)
    rn = [j for j in jobs if j.model.startswith("resnet50/")]
    other = [j for j in jobs if not j.model.startswith("resnet50/")]
    assert rn and other
    for j in rn:
        assert j.true["t4"][0] == pytest.approx(j.pred["t4"][0] * 0.25, rel=1e-3)
        assert j.true["t4"][1] == pytest.approx(j.pred["t4"][1] * 1.5, rel=1e-3)
        assert j.true["a100"] == pytest.approx((min(100.0, j.pred["a100"][0]), j.pred["a100"][1]), rel=1e-3)
    for j in other:  # one residual: the same true/predicted ratio on both types (below the cap)
        ra, rt = (j.true[t][1] / j.pred[t][1] for t in ("a100", "t4"))
        assert ra == pytest.approx(rt)
    with pytest.raises(HorusError, match="util of 'm' on t4"):
        ModelMix(site={"util": {}, "mem": {}, "by_type": {"t4": {"util": {"m": []}, "mem": {}}}})
    with pytest.raises(HorusError, match="row 1: gpu_type must be a string"):
        site_residuals([dict(rows[0], gpu_type=4)])


def test_site_residuals_reach_the_mix_by_the_ledgers_family(mix):
    """The ledger names a model by its family (family_of: mobilenet_v2.onnx -> mobilenet), the
    mix by its zoo name: every model of the mix draws the site's residuals of its family, not
    GPUMemNet's in their place; a model the site has no rows of keeps GPUMemNet's."""
    from slurm_horus.graph.names import family_of
    from slurm_horus.sim.mix import MIX

    models = sorted({m for m, *_ in MIX})
    renamed = [m for m in models if family_of(m) != m]
    assert {"mobilenet_v2", "efficientnet_b0", "inception_v3", "xception_224", "vit_b_16"} <= set(renamed)
    rows = [dict(r, gpu_type="t4") for m in models
            for r in _site_rows(family_of(m), 5, 80, 40, 4000, 4000 * math.e ** 1.1)]
    smix = ModelMix(site=site_residuals(rows))
    for m in models:
        assert list(smix.mem_residuals(m)) == [1.1] * 5, m  # the site's, not GPUMemNet's
        assert list(smix.util_residuals(m)) == [round(math.log(0.5), 4)] * 5, m
        tu, tm = smix.type_residuals(m, "t4")
        assert list(tu) == [round(math.log(0.5), 4)] * 5 and list(tm) == [1.1] * 5, m
    # rows that give the mix's own name still match it; a model the site never ran: GPUMemNet's
    own = ModelMix(site=site_residuals(_site_rows("mobilenet_v2", 5, 80, 80, 4000, 8000)))
    assert list(own.mem_residuals("mobilenet_v2")) == [round(math.log(2), 4)] * 5
    assert list(own.mem_residuals("efficientnet_b0")) == list(mix.mem_residuals("efficientnet_b0"))
    assert own.type_residuals("mobilenet_v2", "t4") == (None, None)


def test_residuals_from_a_real_ledger_reach_every_generated_model(tmp_path):
    """--residuals-from URL end to end: a site ledger whose jobs ran the mix's graphs (named by
    file, as the hook records them) at half their predicted utilization and 1.5x their memory
    makes every generated job's truth exactly that."""
    from slurm_horus.cli.admin_simulate import build_trace
    from slurm_horus.ledger import Ledger
    from slurm_horus.sim.cluster import homogeneous_cluster

    models = sorted({m for m, _, _ in ModelMix().entries("philly")[0]})
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    led = Ledger(url, spool=str(tmp_path / "spool"))
    n = 0
    for m in models:
        for _ in range(5):
            _measured_a100_job(led, n, 60.0, 30.0, 6000.0, model_path=f"/zoo/{m}.onnx")
            n += 1
    cluster = homogeneous_cluster(16, "a100")
    jobs = build_trace(cluster, "philly", 300, 3, 1.0, 0.0, 0.0, None, None, None,
                       residuals_from=url)
    cap = 0.97 * cluster.mem_mib("a100")
    assert {j.model.split("/")[0] for j in jobs} == set(models)
    for j in jobs:
        u, m, _ = j.pred["a100"]
        assert j.true["a100"] == pytest.approx((min(100.0, u * 0.5), min(cap, m * 1.5)), rel=1e-3), j.model


def test_replayed_colocated_runs_take_a_solo_residual():
    """A co-located run's measured utilization is its share: the replay gives it its prediction
    times a residual of the same model's solo runs, not the share."""
    rows = _site_rows("m", 5, 50, 40) + _site_rows("m", 1, 60, 20, colocated=True, t0=10)
    jobs = from_rows(rows, ["a100"])
    assert [j.true["a100"][0] for j in jobs] == pytest.approx([40] * 5 + [48], rel=1e-3)  # residuals: 4 places
    lone = from_rows(_site_rows("m", 1, 60, 20, colocated=True), ["a100"])
    assert lone[0].true["a100"][0] == 60  # no solo run to learn from: the prediction


def test_from_sacct_json(mix):
    doc = {"jobs": [
        {"job_id": 1, "time": {"submission": 1000, "elapsed": 300, "limit": 60, "end": 1400},
         "tres": {"allocated": [{"type": "cpu", "count": 4}, {"type": "gres", "name": "gpu", "count": 2}]}},
        {"job_id": 2, "time": {"submission": {"set": True, "infinite": False, "number": 1010},
                               "elapsed": 100, "limit": {"set": True, "infinite": False, "number": 5},
                               "end": {"set": True, "infinite": False, "number": 1200}},
         "tres": {"allocated": [{"type": "gres", "name": "shard", "count": 30}]}},
        {"job_id": 3, "time": {"submission": 1020, "elapsed": 100, "end": 1300}, "tres": {"allocated": []}},
        # still running: its elapsed time is only so far (it was replayed as a finished job)
        {"job_id": 4, "state": {"current": ["RUNNING"]}, "time": {"submission": 1030, "elapsed": 50},
         "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]}},
    ]}
    jobs = from_sacct_json(json.dumps(doc), ["a100"], seed=1, mix=mix)
    assert [(j.submit, j.duration, j.gpus, j.limit) for j in jobs] == [(0, 300, 2, 3600), (10, 100, 1, 300)]
    with pytest.raises(HorusError):
        from_sacct_json("{}", ["a100"], mix=mix)


# -- cluster specs, interference, png ----------------------------------------------------------

def test_cluster_from_slurm_conf_and_gres_conf():
    conf = """
NodeName=DEFAULT CPUs=32 RealMemory=256000
NodeName=gpu[01-03] Gres=gpu:a100:4,shard:400 Feature=a100
NodeName=t4n[1-2],t4x Gres=gpu:4  # untyped
NodeName=login CPUs=4
"""
    gres = "NodeName=t4n[1-2],t4x Name=gpu Type=t4 File=/dev/nvidia[0-3]\n"
    c = cluster_from_slurm_conf(conf, gres)
    assert c.gpu_types == ["a100", "t4"] and c.total_gpus == 24 and len(c.nodes) == 6
    with pytest.raises(HorusError, match="untyped"):
        cluster_from_slurm_conf(conf)
    from slurm_horus.slurm.parse import expand_hostlist

    assert expand_hostlist("g[08-10,2],x") == ["g08", "g09", "g10", "g2", "x"]


def test_cluster_from_json():
    c = cluster_from_json('{"nodes": [{"name": "a", "gpu_type": "a100", "gpus": 8, "count": 2},'
                          ' {"name": "t", "gpu_type": "t4", "gpus": 4, "mem_mib": 15000}]}')
    assert c.total_gpus == 20 and c.mem_mib("t4") == 15000
    with pytest.raises(HorusError):
        cluster_from_json('{"nodes": [{"name": "a", "gpus": 8}]}')


def test_interference_curve_through_lucid_medians():
    f = Interference()
    assert f.speed(190, 1) == 1.0  # alone: full speed
    for x, y in LUCID_POINTS:
        assert f.speed(x, 2) == pytest.approx(y)
    assert Interference(beyond_pairs=0).speed(1000, 4) == pytest.approx(1 / 3.2)
    # beyond pairs: 5 % per job beyond the second; a sensitive job loses more than the median
    assert f.speed(1000, 4) == pytest.approx(0.95 ** 2 / 3.2)
    assert f.speed(137.5, 2, sens=2.0) == pytest.approx(1 - 2 * (1 - 0.846))
    assert f.speed(137.5, 2, sens=0.5) > f.speed(137.5, 2)
    assert parse_points("0:1, 100:0.5") == ((0, 1), (100, 0.5))
    with pytest.raises(HorusError):
        parse_points("0:1,50:1.5")
    with pytest.raises(HorusError, match="must not rise"):  # its last speed had been taken as the floor
        parse_points("0:1,100:0.5,200:0.9")


def test_png_is_a_valid_image(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from slurm_horus.plot import save
    from slurm_horus.sim.plot import figure

    res = {"exclusive": {"makespan_s": 7200, "mean_jct_s": 3600}, "horus": {"makespan_s": 3600}}
    fig = figure(res, "two policies")
    assert [b.get_height() for b in fig.axes[0].patches] == [2.0, 1.0]  # hours; missing -> 0
    save(fig, str(tmp_path / "x.png"))
    assert imread(tmp_path / "x.png").shape[2] in (3, 4)


# -- CLI ----------------------------------------------------------------------------------------

def test_cli_json_keys(simulate_cli, tmp_path):
    r = CliRunner().invoke(simulate_cli, ["simulate", "--jobs", "200", "--gpus", "16", "--seed", "1", "--json",
                                 "--plot", str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert list(out) == ["exclusive", "naive", "horus", "oracle"]
    for m in out.values():
        for k in ("makespan_s", "mean_jct_s", "mean_wait_s", "gpu_util", "oom_failures", "median_jct_s",
                  "p95_jct_s", "gpus_busy", "mean_slowdown"):
            assert k in m
        assert 0 <= m["gpu_util"] <= 1
    assert (tmp_path / "p.png").stat().st_size > 100


def test_cli_table_and_errors(simulate_cli, tmp_path):
    r = CliRunner().invoke(simulate_cli, ["simulate", "--jobs", "50", "--gpus", "8", "--trace", "pai"])
    assert r.exit_code == 0 and "makespan" in r.output and "horus" in r.output
    for args, msg in ((["--policies", "bogus"], "unknown policy"),
                      (["--cluster", str(tmp_path / "none.json")], "cluster file"),
                      (["--gpus", "0"], "must be positive"),
                      (["--interference", "x"], "interference")):
        r = CliRunner().invoke(simulate_cli, ["simulate", "--jobs", "10", *args])
        assert r.exit_code == 2, (args, r.output)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and msg in lines[0], r.output


def test_cli_replays_ledger_and_sacct_on_a_slurm_conf_cluster(simulate_cli, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=g[1-2] Gres=gpu:t4:4,shard:400 Features=t4\n")
    rows = [{"submit_time": i * 10, "elapsed_s": 100, "gpus": 1, "pred_util": 30, "pred_mem": 3000,
             "true_util": 30, "true_mem": 3000} for i in range(12)]
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps(rows))
    r = CliRunner().invoke(simulate_cli, ["simulate", "--slurm-conf", str(conf), "--ledger", str(ledger), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["exclusive"]["jobs"] == 12 and out["horus"]["shared_starts"] == 12
    # 12 jobs of 100 s, 10 s apart, 8 GPUs: jobs 8-11 wait for jobs 0-3 (ends 100..130) -> 230
    assert out["exclusive"]["makespan_s"] == pytest.approx(230)
    assert out["horus"]["makespan_s"] == pytest.approx(210) and out["horus"]["mean_wait_s"] == 0
    sacct = tmp_path / "sacct.json"
    sacct.write_text(json.dumps({"jobs": [
        {"job_id": i + 1, "time": {"submission": 100 + i, "elapsed": 60},
         "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]}} for i in range(5)]}))
    r = CliRunner().invoke(simulate_cli, ["simulate", "--slurm-conf", str(conf), "--sacct", str(sacct), "--json",
                                 "--policies", "exclusive,horus"])
    assert r.exit_code == 0, r.output
    assert list(json.loads(r.output)) == ["exclusive", "horus"]
    r = CliRunner().invoke(simulate_cli, ["simulate", "--sacct", str(sacct), "--ledger", str(ledger)])
    assert r.exit_code == 2 and "not both" in r.output


def test_backfill_settings_read_from_slurm_conf_as_slurmctld_reads_them():
    b = backfill_from_slurm_conf
    assert b("NodeName=n1 Gres=gpu:a100:1\n") == Backfill(True, 30.0, 500)  # sched/backfill's defaults
    # keys in any case, found as substrings (xstrcasestr), numbers by C's atoi
    assert b("SchedulerParameters=bf_continue,BF_Interval=120x,bf_max_job_test=20\n") == Backfill(True, 120.0, 20)
    assert b("SchedulerParameters=foo=bf_interval=60\n").interval_s == 60.0
    assert b("SchedulerParameters=bf_interval=4294967356\n").interval_s == 60.0  # cut to 32 bits
    assert b("SchedulerParameters=bf_interval=99999999999999999999\n").enabled is False  # saturated: -1
    assert b("SchedulerParameters=bf_interval=\u0666\u0660\n").interval_s == 30.0  # ASCII digits only
    # the latest line wins ("specified more than once, latest value used"), the first key in it
    assert b("SchedulerParameters=bf_interval=5\nSchedulerParameters=bf_interval=60,bf_interval=7\n"
             ) == Backfill(True, 60.0, 500)
    # out of range: the default, as slurmctld (which logs an error); -1: no backfill loop
    assert b("SchedulerParameters=bf_interval=0,bf_max_job_test=0\n") == Backfill(True, 30.0, 500)
    assert b("SchedulerParameters=bf_interval=10801,bf_max_job_test=1000001\n") == Backfill(True, 30.0, 500)
    assert b("SchedulerParameters=bf_interval=-1\n").enabled is False
    assert b("SchedulerType=sched/builtin\nSchedulerParameters=bf_interval=60\n").enabled is False


def test_cli_schedules_as_the_slurm_conf_says(simulate_cli, tmp_path):
    """--slurm-conf brings its backfill settings; a flag given still wins."""
    nodes = "NodeName=g[1-2] Gres=gpu:a100:4\n"
    plain, tuned, builtin = (tmp_path / f"{n}.conf" for n in ("plain", "tuned", "builtin"))
    plain.write_text(nodes)
    tuned.write_text(nodes + "SchedulerParameters=bf_interval=600,bf_max_job_test=3\n")
    builtin.write_text(nodes + "SchedulerType=sched/builtin\n")
    base = ["simulate", "--jobs", "150", "--load", "3", "--seed", "4", "--policies", "exclusive", "--json"]

    def run(conf, *flags):
        r = CliRunner().invoke(simulate_cli, base + ["--slurm-conf", str(conf), *flags])
        assert r.exit_code == 0, r.output
        m = json.loads(r.output)["exclusive"]
        return {k: v for k, v in m.items() if "cpu" not in k and "wall" not in k}

    default = run(plain)
    assert (default["bf_interval_s"], default["bf_window"]) == (30.0, 500)
    assert run(plain, "--bf-interval", "30", "--bf-window", "500") == default
    assert run(tuned) == run(plain, "--bf-interval", "600", "--bf-window", "3") != default
    assert run(tuned, "--bf-interval", "30", "--bf-window", "500") == default
    off = run(builtin)
    assert default["backfilled"] > 0 and off["backfilled"] == 0 and off["bf_interval_s"] is None
    # a flag still wins: -1 turns backfill off as in slurm.conf, an interval turns it back on
    assert run(plain, "--bf-interval", "-1") == off
    assert run(builtin, "--bf-interval", "30", "--bf-window", "500") == default
    r = CliRunner().invoke(simulate_cli, base + ["--slurm-conf", str(plain), "--bf-interval", "-2"])
    assert r.exit_code == 2 and "-1: no backfill" in r.output
    r = CliRunner().invoke(simulate_cli, base + ["--cluster", str(plain), "--slurm-conf", str(tmp_path / "none")])
    assert r.exit_code == 2 and "not both" in r.output  # before reading either file


def test_cli_draws_errors_from_the_sites_rows(simulate_cli, tmp_path):
    mix = ModelMix()
    models = sorted({m for m, _, _ in mix.entries("philly")[0]})
    rows = [r for m in models for r in _site_rows(m, 5, 80, 20, 4000, 4000)]  # a site 4x over
    site = tmp_path / "site.json"
    site.write_text(json.dumps(rows))
    base = ["simulate", "--jobs", "150", "--gpus", "8", "--seed", "2", "--json", "--policies", "naive,oracle"]
    plain = CliRunner().invoke(simulate_cli, base)
    own = CliRunner().invoke(simulate_cli, base + ["--residuals-from", str(site)])
    assert plain.exit_code == 0 and own.exit_code == 0, own.output
    # the truth is a quarter of the prediction: naive's pairs slow each other down less
    assert json.loads(own.output)["naive"]["mean_slowdown"] < json.loads(plain.output)["naive"]["mean_slowdown"]
    for args, msg in (([ "--ledger", str(site)], "takes its truth from its own rows"),
                      ([], "row 1: missing true_mem")):
        if not args:
            site.write_text(json.dumps([{k: v for k, v in rows[0].items() if k != "true_mem"}]))
        generated = base if not args else [a for a in base if a not in ("--jobs", "150")]  # a replay: no --jobs
        r = CliRunner().invoke(simulate_cli, generated + ["--residuals-from", str(site)] + args)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code != 0 and len(lines) == 1 and msg in lines[0], r.output


def test_bf_interval_spaces_backfill_passes():
    # as the backfill test above, but backfill runs every 30 s: C waits for the pass at t=30
    jobs = [job(0, 0, 1000, limit=2000), job(1, 1, 100, gpus=2, limit=200),
            job(2, 2, 5000, limit=10000), job(3, 3, 500, limit=1000)]
    reqs = [Request((0,), 100, 1), Request((0,), 100, 2), Request((0,), 100, 1), Request((0,), 100, 1)]
    sim, m = run(one_node(2), jobs, reqs, bf_interval=30)
    assert by_id(sim, jobs)[3] == (30, 530) and by_id(sim, jobs)[1] == (1000, 1100)


def _measured_a100_job(led, job_id: int, pred_util: float, util: float, mem_mib: float,
                       model_path: str | None = None) -> None:
    """A job a site's ledger holds: hinted at ``pred_util`` % and 4,000 MiB (p90 4,500) on an
    A100, then measured there alone by sacct, 600 s from 1000 + 60 x ``job_id``."""
    start = 1000 + 60 * job_id
    led.record_submission(job_id=job_id, cluster="c", user="u", submit_time=start, model_path=model_path,
                          predictions={"a100": {"util_pct": pred_util, "mem_mib": 4000.0, "mem_mib_p90": 4500.0}},
                          hint=f"horus:v1;a100={pred_util:g}/4000/4500")
    led.record_usage(job_id=job_id, cluster="c", source="sacct", util_mean=util, mem_peak_mib=mem_mib,
                     elapsed_s=600, state="COMPLETED", gpu_type="a100", start_time=start, end_time=start + 600)


def test_replays_a_real_ledger(tmp_path):
    """--ledger URL: the measured jobs of the site's own ledger become the trace."""
    import json as _json

    from click.testing import CliRunner

    from slurm_horus.cli.admin import main as admin
    from slurm_horus.ledger import Ledger

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    led = Ledger(url, spool=str(tmp_path / "spool"))
    for i in range(12):
        _measured_a100_job(led, i, 30.0, 35.0, 4200.0)
    res = CliRunner().invoke(admin, ["simulate", "--ledger", url, "--gpus", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = _json.loads(res.output)
    assert set(out) >= {"exclusive", "horus"}
    assert out["horus"]["mean_wait_s"] <= out["exclusive"]["mean_wait_s"]
    # Slurm's placement says which runs shared their GPU: their utilization is not a solo one
    led.record_usage(job_id=3, cluster="c", source="sacct", util_mean=12.0, mem_peak_mib=4200.0,
                     elapsed_s=600, state="COMPLETED", gpu_type="a100", colocated=[4],
                     start_time=1180, end_time=1780)
    rows = rows_from_ledger_jobs(led.jobs(submitted_only=True))
    assert [r["colocated"] for r in rows] == [False] * 3 + [True] + [False] * 8
    # no model file, no family of its own: the pool only
    assert site_residuals(rows) == {"util": {"*": [round(math.log(35 / 30), 4)] * 11}, "mem": {},
                                    "by_type": {}}


def test_shipped_mix_needs_no_onnx_and_carries_biased_residuals():
    mix = ModelMix()
    assert mix.zoo_dir is None
    assert mix.predict("bert_base_mlm", 16, "train", "t4")[1] > 0
    # per model, biased where the cold start is (18 named runs): VGG-16 under-predicted,
    # GPT-2 large over-predicted; an unmeasured model draws from all of them
    assert mix.mem_residuals("vgg16").mean() > 0.1
    assert mix.mem_residuals("gpt2_large").mean() < -0.1
    assert len(mix.mem_residuals("unet")) == 18
    # utilization: hundreds of held-out MLP runs, spread about as the cold start's RMSLE (0.24)
    ures = mix.util_residuals()
    assert len(ures) > 500 and 0.15 < ures.std() < 0.35
    with pytest.raises(HorusError):
        mix.predict("bert_base_mlm", 16, "train", "h200")


def test_horus_spreads_while_idle_and_packs_under_pressure():
    jobs = [job(i, 0, 1000, util=40, mem=4000) for i in range(4)]
    reqs = [Request((0,), 1, 1, (40, 4000, (1.0,), 2000))] * 4
    sim, m = run(one_node(2), jobs, reqs)
    assert m["shared_starts"] == 4 and m["mean_jct_s"] < 2000  # all four start at once
    assert len({sim.start[j.id] for j in jobs}) == 1
    # heavy jobs whose predicted pair slowdown breaks the bound wait instead
    heavy = [job(i, 0, 1000, util=99, mem=4000) for i in range(3)]
    reqs = [Request((0,), 1, 1, (99, 4000, (1.0,), 2000))] * 3
    sim, m = run(one_node(2), heavy, reqs, slowdown_bound=1.2)
    assert sorted(sim.start[j.id] for j in heavy) == [0, 0, 1000]


def test_exceed_share_matches_the_sensitivity_spread_jobs_are_drawn_from():
    import numpy as np
    from slurm_horus.sim.interference import SENSITIVITY_SIGMA
    itf = Interference()
    k = np.exp(np.random.default_rng(0).normal(0.0, SENSITIVITY_SIGMA, 200_000))
    for su, n in ((150, 2), (198, 2), (140, 3), (250, 4)):
        slow = np.array([1.0 / itf.speed(su, n, x) for x in k[:20_000]])
        assert itf.exceed_share(su, n, 2.0) == pytest.approx((slow > 2.0).mean(), abs=0.01)
    assert itf.exceed_share(70, 2, 2.0) == 0.0 and itf.exceed_share(300, 1, 2.0) == 0.0


def test_mean_exceed_shares_is_the_weighted_mean_of_each_points_shares():
    """The tail budget reads shares over a predicted sum's error in one call; it must be the
    weighted mean of reading each point alone, bound by bound (known sensitivities too)."""
    itf = Interference()
    points = ((0.2, 120.0), (0.5, 175.0), (0.3, 260.0))
    bounds, sens = (1.5, 2.0, 3.0), (0.4, 1.0, 2.5)
    for n in (1, 2, 3):
        for k in (None, sens):
            want = [sum(w * itf.exceed_shares(s, n, bounds, sens=k)[i] for w, s in points)
                    for i in range(len(bounds))]
            assert itf.mean_exceed_shares(points, n, bounds, sens=k) == pytest.approx(want, abs=1e-12)
    assert any(itf.mean_exceed_shares(points, 2, bounds))  # the case is not all zeros


def test_the_sensitivity_spread_gives_the_pair_speeds_lucid_measured():
    """The figures docs/simulator.md quotes for the spread: over Lucid's mix of sums (its six bins'
    pair counts, shared/notes/colocation.md; sums uniform within a bin) the simulated pair speeds
    have p10 0.78 (Lucid: 0.78) and reach the curve's floor (Lucid's minimum: 0.44)."""
    import numpy as np
    from slurm_horus.sim.interference import SENSITIVITY_SIGMA
    itf = Interference()
    rng = np.random.default_rng(0)
    bins = ((0, 75, 479), (75, 100, 322), (100, 125, 287), (125, 150, 185), (150, 175, 83), (175, 200, 32))
    sums = np.concatenate([rng.uniform(lo, hi, 100 * n) for lo, hi, n in bins])
    k = np.exp(rng.normal(0.0, SENSITIVITY_SIGMA, len(sums)))
    speeds = np.array([itf.speed(su, 2, x) for su, x in zip(sums, k)])
    assert round(float(np.percentile(speeds, 10)), 2) == 0.78
    assert speeds.min() == pytest.approx(1 / 3.2) and float(np.median(speeds)) > 0.95  # Lucid: 0.955


def test_the_utilization_residuals_are_the_held_out_runs_quoted():
    """docs/simulator.md: 596 held-out MLP runs, median -0.04, p5 -0.37, p95 +0.36."""
    import numpy as np
    r = ModelMix().util_residuals()
    assert len(r) == 596
    assert [round(float(x), 2) for x in np.percentile(r, [5, 50, 95])] == [-0.37, -0.04, 0.36]


def test_horus_keeps_the_predicted_tail_within_the_bounds_share():
    # two heavy jobs on one GPU: the median pair (198 %: speed 0.63) is within a 2.0 bound, but
    # 30 % of jobs (by sensitivity) would be beyond it: with 5 % allowed the second waits, and
    # with 90 % allowed too (0.60 jobs expected beyond it, but with 99 % confidence, 2.326
    # standard deviations of that count, sqrt(2 x 0.30 x 0.70), up to 2.10, above the 1.8
    # allowed to two jobs)
    heavy = [job(i, 0, 1000, util=99, mem=4000) for i in range(2)]
    reqs = [Request((0,), 1, 1, (99, 4000, (1.0,), 2000))] * 2
    sim, m = run(one_node(1), heavy, reqs)
    assert sorted(sim.start[j.id] for j in heavy) == [0, 1000] and m["shared_starts"] == 2
    sim, m = run(one_node(1), heavy, reqs, slowdown_quantile=0.1)
    assert sorted(sim.start[j.id] for j in heavy) == [0, 1000]
    # two 86 % jobs (172 %: 20 % beyond the bound, up to 1.71 with 99 % confidence): not within
    # 80 % allowed (1.6), within 90 % (1.8), where they share at once
    heavy = [job(i, 0, 1000, util=86, mem=4000) for i in range(2)]
    reqs = [Request((0,), 1, 1, (86, 4000, (1.0,), 2000))] * 2
    sim, m = run(one_node(1), heavy, reqs, slowdown_quantile=0.2)
    assert sorted(sim.start[j.id] for j in heavy) == [0, 1000]
    sim, m = run(one_node(1), heavy, reqs, slowdown_quantile=0.1)
    assert [sim.start[j.id] for j in heavy] == [0, 0]
    share = Interference().exceed_share(172, 2, 2.0)
    assert sim.risk == pytest.approx(2 * share) and sim.risk_var == pytest.approx(2 * share * (1 - share))
    with pytest.raises(HorusError):
        run(one_node(1), heavy, reqs, slowdown_quantile=1.0)


def test_the_tail_budget_settles_on_the_time_jobs_really_spent_together():
    """Charged from time limits when they pair (both 2000 s: together for their whole lives),
    two heavy jobs that overlap for 15 % of their runs (A ends at 1059 s, B started at 900 s)
    cannot be beyond 2x (under 45 % of a life even the worst speed cannot): the charge is
    settled to nothing when they end."""
    heavy = [job(0, 0, 1000, util=86, mem=4000, limit=2000), job(1, 900, 1000, util=86, mem=4000, limit=2000)]
    reqs = [Request((0,), 1, 1, (86, 4000, (1.0,), 2000))] * 2
    sim, m = run(one_node(1), heavy, reqs, slowdown_quantile=0.1)
    assert [sim.start[j.id] for j in heavy] == [0, 900] and m["shared_starts"] == 2
    assert sim.end[0] == pytest.approx(900 + 100 / Interference().speed(172, 2))
    assert sim.risk == pytest.approx(0.0) and sim.jrisk == [0.0, 0.0] and sim.risk_var == pytest.approx(0.0)



def test_the_settled_charge_integrates_the_loss_over_the_run_not_its_wall_share():
    """A (1,000 s) and B (600 s), both 86 %, start together: B runs its whole life in the pair
    and is charged the pair's share; A is with B for 68 % of its run (858 of 1,258 s), yet
    even at the curve's floor it would do 400 + 858 x 0.3125 = 668 s of work in 1,258 s, more
    than half: it cannot end beyond 2x.  (Taking the 68 % as the share of its work done in
    the pair had charged it.)"""
    itf = Interference()
    pair = itf.speed(172, 2)
    jobs = [job(0, 0, 1000, util=86, mem=4000, limit=2000), job(1, 0, 600, util=86, mem=4000, limit=2000)]
    reqs = [Request((0,), 1, 1, (86, 4000, (1.0,), 2000))] * 2
    sim, m = run(one_node(1), jobs, reqs, slowdown_quantile=0.1)
    assert [sim.start[j.id] for j in jobs] == [0, 0]
    assert sim.end[1] == pytest.approx(600 / pair) and sim.end[0] == pytest.approx(600 / pair + 400)
    assert sim.jrisk[1] == pytest.approx(itf.exceed_share(172, 2, 2.0)) and sim.jrisk[0] == 0.0
    assert sim.risk == pytest.approx(sim.jrisk[1])


def test_bf_interval_tick_whose_float_difference_rounds_down_does_not_loop_forever():
    # (2.3000000000000003 + 30) - 2.3000000000000003 < 30 in floats: the tick at last pass + 30
    # must still count as the next backfill pass (it used to re-arm itself at the same time)
    a = 2.3000000000000003
    assert (a + 30.0) - a < 30.0
    jobs = [job(0, a, 1000, limit=2000), job(1, a, 100, gpus=2), job(2, a + 1, 50, limit=100)]
    reqs = [Request((0,), 100, 1), Request((0,), 100, 2), Request((0,), 100, 1)]
    sim, m = run(one_node(2), jobs, reqs, bf_interval=30)
    assert m["completed"] == 3
    assert sim.start[2] == pytest.approx(a + 30)  # backfilled at the tick, beside job 0


def test_horus_packs_jobs_a_partner_would_not_slow_down_keeping_a_gpu_whole():
    # two light jobs (30 % + 30 %: no predicted loss) on 2 GPUs share one, so the whole-GPU job
    # arriving next starts at once instead of waiting for one of them
    whole = Request((0,), 100, 1)
    light = Request((0,), 1, 1, (30, 2000, (1.0,), 2000))
    jobs = [job(0, 0, 1000, util=30), job(1, 1, 1000, util=30), job(2, 2, 500)]
    sim, m = run(one_node(2), jobs, [light, light, whole])
    assert by_id(sim, jobs) == {0: (0, 1000), 1: (1, 1001), 2: (2, 502)}  # 60 %: full speed
    # heavier ones (60 % + 60 %) spread over the idle GPUs instead
    heavy = Request((0,), 1, 1, (60, 2000, (1.0,), 2000))
    jobs = [job(0, 0, 1000, util=60), job(1, 1, 1000, util=60), job(2, 2, 500)]
    sim, m = run(one_node(2), jobs, [heavy, heavy, whole])
    assert by_id(sim, jobs)[2] == (1000, 1500)


def test_under_queue_pressure_a_shareable_job_joins_a_group_rather_than_take_the_last_idle_gpu():
    # a 40 % job runs on GPU 0; a second 40 % job and a whole-GPU job arrive together.  Two jobs
    # wait and one GPU is idle: the shareable one pairs (80 %, within the bound) and the whole
    # one starts at once on the idle GPU instead of waiting 1,000 s for a GPU
    share = Request((0,), 1, 1, (40.0, 2000.0, (1.0,), 2000.0))
    jobs = [job(0, 0, 1000, util=40), job(1, 1, 1000, util=40), job(2, 1, 500)]
    sim, _ = run(one_node(2), jobs, [share, share, Request((0,), 100, 1)])
    assert sim.start[1] == 1.0 and sim.start[2] == 1.0


# -- the site's history in the simulation --------------------------------------------------------

def graph_job(i, submit, duration, graph, pred_util=90.0, true_util=20.0, mem=3000.0, true_mem=3300.0,
              model="test"):
    """A job of ``graph`` that the cold start predicts at pred_util, p90 1.25 x its mean memory."""
    return SimJob(i, submit, duration, 1, 2 * duration, model,
                  {"a100": (pred_util, mem, 1.25 * mem)}, {"a100": (true_util, true_mem)}, graph=graph)


def share_req(j):
    u, _, p90 = j.pred["a100"]
    return Request((0,), 1, 1, (u, p90, (1.0,), j.limit))


def test_a_rerun_of_a_measured_graph_is_predicted_from_its_run_once_synced():
    jobs = [graph_job(0, 0, 100, "g"),     # runs alone 0..100: measured at 100, synced at 150
            graph_job(1, 120, 100, "g"),   # arrives before the sync: the cold start's prediction
            graph_job(2, 400, 100, "g"),   # after it: the measured run's
            graph_job(3, 400, 100, "other", model="bert/b8/train")]
    sim, m = run(one_node(2), jobs, [share_req(j) for j in jobs], history_lag_s=50.0)
    assert sim.cur_req[1].share[:2] == (90.0, 3750.0)
    assert sim.cur_req[2].share[:2] == pytest.approx((20.0, 3300.0 * 1.25))
    assert sim.cur_req[3].share[:2] == (90.0, 3750.0)  # a graph of another family learns nothing
    assert m["history_hits"] == 1 and m["site_hits"] == 0
    sim, m = run(one_node(2), jobs, [share_req(j) for j in jobs])  # no history
    assert m["history_hits"] == 0 and sim.cur_req[2].share[0] == 90.0


def test_a_new_graph_is_predicted_as_hsubmit_would_from_the_sites_other_graphs():
    # three graphs measured alone (two of the family gpt2, one of bert), then a new gpt2 graph
    # and a new graph of a family never measured: the simulator's horus gives each the answer
    # of hsubmit's history predictor fitted on the same runs (site offsets, family pooling)
    from slurm_horus.predict.history import HistoryPredictor
    from slurm_horus.predict.coldstart import Workload

    measured = [graph_job(0, 0, 100, "g0", pred_util=90.0, true_util=60.0, mem=3000.0, true_mem=4000.0,
                          model="gpt2/b8/train"),
                graph_job(1, 0, 100, "g1", pred_util=80.0, true_util=70.0, mem=5000.0, true_mem=5600.0,
                          model="gpt2/b16/train"),
                graph_job(2, 0, 100, "g2", pred_util=50.0, true_util=45.0, mem=2000.0, true_mem=2100.0,
                          model="bert/b8/train")]
    new = [graph_job(3, 1000, 100, "g3", pred_util=95.0, mem=4000.0, model="gpt2/b32/train"),
           graph_job(4, 1000, 100, "g4", pred_util=70.0, mem=6000.0, model="vgg16/b8/train")]
    jobs = measured + new
    sim, m = run(one_node(4), jobs, [share_req(j) for j in jobs], history_lag_s=50.0)
    assert m["history_hits"] == 0 and m["site_hits"] == 2
    runs = [{"sha": f"{i:064x}", "gpu": "a100", "bs": 8, "task": "train", "opt": "adam", "prec": "fp32",
             "mem": j.true["a100"][1], "util": j.true["a100"][0], "cold_mem": j.pred["a100"][1],
             "cold_util": j.pred["a100"][0], "family": j.model.split("/")[0], "user": None}
            for i, j in enumerate(measured)]
    h = HistoryPredictor().fit(runs)
    for j in new:
        cu, cm, cp90 = j.pred["a100"]
        a = h.estimate("f" * 64, "a100", Workload(batch_size=8), "", cm, cu, j.model.split("/")[0],
                       None, cm, cu, "cold-start")
        assert sim.cur_req[j.id].share[:2] == pytest.approx((a.util_pct, a.mem_mib * cp90 / cm))
    # the offsets moved both; the family pulled the gpt2 graph further (towards its measured
    # siblings: more memory, less utilization than the cold start said)
    u3, p3 = sim.cur_req[3].share[:2]
    u4, p4 = sim.cur_req[4].share[:2]
    assert (u4, p4) != (70.0, 7500.0) and u3 < 95.0 - (70.0 - u4) and p3 > 5000.0 * (p4 / 7500.0)
    sim, m = run(one_node(4), jobs, [share_req(j) for j in jobs])  # no history: the cold start
    assert m["site_hits"] == 0 and sim.cur_req[3].share[:2] == (95.0, 5000.0)


def test_a_run_that_shared_its_gpu_gives_memory_but_not_utilization():
    # 0 and 1 share the one GPU (their predicted sum is within the no-loss range); 2 reruns 0's graph
    jobs = [graph_job(0, 0, 100, "g", pred_util=30.0, true_util=60.0),
            graph_job(1, 0, 100, "h", pred_util=30.0, true_util=60.0),
            graph_job(2, 500, 100, "g", pred_util=30.0, true_util=60.0)]
    sim, m = run(one_node(1), jobs, [share_req(j) for j in jobs], history_lag_s=0.0)
    assert sim.start[1] == 0.0  # co-located
    assert sim.cur_req[2].share[:2] == pytest.approx((30.0, 3300.0 * 1.25))


def test_a_reruns_error_is_the_measured_spread_of_reruns_not_zero():
    # graph g runs alone twice, at 20 % and 30 % (synced by 300), graph h once; a rerun of each
    # then: its util is its graph's mean, its error the spread of g's two runs (log 30/20 over
    # sqrt 2), pooled, widened by its mean's own error (1 + 1 / n runs); never 0 (it had been:
    # a rerun's tail priced as certain)
    jobs = [graph_job(0, 0, 100, "g", true_util=20.0), graph_job(1, 0, 100, "g", true_util=30.0),
            graph_job(2, 0, 100, "h", true_util=40.0),
            graph_job(3, 400, 100, "g"), graph_job(4, 400, 100, "h")]
    sim, m = run(one_node(3), jobs, [share_req(j) for j in jobs], history_lag_s=50.0,
                 util_sigma=UTIL_SIGMA)
    assert m["history_hits"] == 2
    spread2 = math.log(30.0 / 20.0) ** 2 / 2  # the sample variance of two logs, one degree of freedom
    assert sim.cur_req[3].share[0] == pytest.approx(25.0)
    assert sim.jsig[3] == pytest.approx(math.sqrt(spread2 * (1 + 1 / 2)))
    assert sim.jsig[4] == pytest.approx(math.sqrt(spread2 * (1 + 1 / 1)))
    # before any graph ran twice there is no measured spread: the cold start's error stands
    sim, _ = run(one_node(3), [jobs[0], jobs[2], graph_job(2, 400, 100, "h")],
                 [share_req(j) for j in jobs[:3]], history_lag_s=50.0, util_sigma=UTIL_SIGMA)
    assert sim.jsig[2] == UTIL_SIGMA


def test_only_horus_reads_the_history():
    jobs = [graph_job(0, 0, 100, "g"), graph_job(1, 1000, 100, "g")]
    r = run_policies(one_node(1), jobs, ["naive", "horus", "oracle"])
    assert r["horus"]["history_hits"] == 1
    assert r["oracle"]["history_hits"] == r["naive"]["history_hits"] == 0
    assert run_policies(one_node(1), jobs, ["horus"], history_lag_s=None)["horus"]["history_hits"] == 0


def test_repeated_graphs_share_their_residuals(mix):
    jobs = generate_trace("philly", 2000, ["a100"], 64, seed=5, mix=mix, sigma_util=0.0, sigma_mem=0.0)
    graphs = {}
    for j in jobs:
        (pu, pm, _), (tu, tm) = j.pred["a100"], j.true["a100"]
        if tu < 100 and tm < 0.97 * A100:  # not capped
            graphs.setdefault(j.graph, set()).add((round(tu / pu, 9), round(tm / pm, 9)))
        graphs.setdefault(j.graph, set())
    assert all(len(r) <= 1 for r in graphs.values())  # one graph, one error (no jitter here)
    assert 0.4 < 1 - len(graphs) / len(jobs) < 0.6  # about half the jobs rerun a graph (REPEAT_SHARE)
    fresh = generate_trace("philly", 500, ["a100"], 64, seed=5, mix=mix, repeat_share=0.0)
    assert len({j.graph for j in fresh}) == 500
    with pytest.raises(HorusError, match="repeat-share"):
        generate_trace("philly", 10, ["a100"], 64, repeat_share=1.0, mix=mix)


def test_the_truths_sensitivity_spread_is_a_choice_the_rest_of_the_trace_is_not(mix):
    """--sensitivity-sigma widens or narrows the jobs' true interference sensitivity (the
    scheduler keeps assuming SENSITIVITY_SIGMA); every other draw of the trace stays the same,
    so a run against it differs by the spread alone."""
    base = generate_trace("philly", 400, ["a100"], 64, seed=4, mix=mix)
    spreads = {sg: generate_trace("philly", 400, ["a100"], 64, seed=4, mix=mix, sensitivity_sigma=sg)
               for sg in (0.0, 0.3, 0.9)}
    for jobs in spreads.values():
        assert [(j.submit, j.duration, j.limit, j.pred, j.true, j.graph) for j in jobs] == \
            [(j.submit, j.duration, j.limit, j.pred, j.true, j.graph) for j in base]
    assert {j.sens for j in spreads[0.0]} == {1.0}
    std = {sg: float(np.std(np.log([j.sens for j in jobs]))) for sg, jobs in spreads.items()}
    assert std[0.3] == pytest.approx(0.3, abs=0.04) and std[0.9] == pytest.approx(0.9, abs=0.1)
    assert float(np.std(np.log([j.sens for j in base]))) == pytest.approx(0.6, abs=0.07)
    with pytest.raises(HorusError, match="sensitivity-sigma"):
        generate_trace("philly", 10, ["a100"], 64, mix=mix, sensitivity_sigma=-0.1)


def test_simulate_runs_against_the_spread_it_is_given():
    """horus-admin simulate --sensitivity-sigma: the same trace with every job at the median
    sensitivity and with a wide spread; only the spread differs, and the wide one slows the
    tail the scheduler could not see coming."""
    from slurm_horus.cli.admin import main
    base = ["simulate", "--jobs", "400", "--gpus", "16", "--load", "4", "--seed", "2",
            "--trace", "llm", "--policies", "naive", "--json"]
    out = {sg: json.loads(CliRunner().invoke(main, base + ["--sensitivity-sigma", sg]).output)["naive"]
           for sg in ("0", "1.2")}
    assert out["0"]["p95_slowdown"] < out["1.2"]["p95_slowdown"]


def test_the_tail_budget_never_reads_a_jobs_own_sensitivity():
    """What lets a wrong spread show: two heavy jobs that may share (a 90 % share beyond the
    bound allowed) pair whatever their true sensitivity, since the budget knows only the
    assumed spread; far more sensitive than assumed, both end beyond the 2.0 bound."""
    heavy = [job(i, 0, 1000, util=86, mem=4000) for i in range(2)]
    reqs = [Request((0,), 1, 1, (86, 4000, (1.0,), 2000))] * 2
    _, calm = run(one_node(1), heavy, reqs, slowdown_quantile=0.1)
    touchy = [replace(j, sens=3.0) for j in heavy]
    _, m = run(one_node(1), touchy, reqs, slowdown_quantile=0.1)
    assert calm["shared_starts"] == 2 and calm["resubmitted"] == 0  # paired
    assert m["shared_starts"] == 2 + m["resubmitted"]  # paired, and again when submitted again
    assert calm["p95_slowdown"] < 2.0 < m["p95_slowdown"]


@pytest.mark.parametrize("penalty", [0.0, 0.1])
def test_a_known_sensitivity_is_beyond_the_bound_exactly_where_its_speed_is(penalty):
    """Also with a memory-bandwidth penalty, which the median loss once counted twice."""
    itf = Interference(mem_bw_penalty=penalty)
    for su in (90.0, 150.0, 198.0, 260.0):
        for n in (2, 3):
            for k in [x / 20 for x in range(1, 120)]:
                beyond = 1.0 / itf.speed(su, n, k) > 2.0
                assert itf.exceed_share(su, n, 2.0, sens=k) == float(beyond), (su, n, k)
    assert itf.exceed_shares(198, 2, (2.0, 2.0), sens=(0.5, 3.0)) == [0.0, 1.0]


def test_known_sensitivity_pairs_the_jobs_a_partner_cannot_push_past_the_bound():
    """The what-if --known-sensitivity: two heavy jobs that the blind budget keeps apart (21 % of
    such jobs would end beyond 2x) pair when both are known to be insensitive, and still wait
    when one is known to be sensitive; the charge is then exact (0 or 1 per job)."""
    heavy = [job(i, 0, 1000, util=99, mem=4000) for i in range(2)]
    reqs = [Request((0,), 1, 1, (99, 4000, (1.0,), 2000))] * 2
    calm = [replace(j, sens=0.5) for j in heavy]
    sim, _ = run(one_node(1), calm, reqs)
    assert sorted(sim.start[j.id] for j in calm) == [0, 1000]  # blind: the second waits
    sim, m = run(one_node(1), calm, reqs, known_sensitivity=True)
    assert [sim.start[j.id] for j in calm] == [0, 0] and m["p95_slowdown"] < 2.0
    assert sim.risk == 0.0 and sim.risk_var == 0.0
    for touchy in ([calm[0], replace(heavy[1], sens=3.0)], [replace(heavy[0], sens=3.0), calm[1]]):
        # the sensitive one arriving, or already there: the calm one waits either way
        sim, _ = run(one_node(1), touchy, reqs, known_sensitivity=True)
        assert sorted(sim.start[j.id] for j in touchy) == [0, 1000]


def test_simulate_known_sensitivity_is_a_what_if_for_generated_traces_only(tmp_path):
    from slurm_horus.cli.admin import main
    base = ["simulate", "--jobs", "300", "--gpus", "16", "--load", "4", "--seed", "1",
            "--trace", "llm", "--policies", "horus", "--json"]
    blind = json.loads(CliRunner().invoke(main, base).output)["horus"]
    known = json.loads(CliRunner().invoke(main, base + ["--known-sensitivity"]).output)["horus"]
    # it pairs more (a higher mean slowdown), sooner (a lower mean JCT), within the bound
    assert known["mean_slowdown"] > blind["mean_slowdown"] and known["mean_jct_s"] < blind["mean_jct_s"]
    assert known["p95_slowdown"] <= 2.0
    assert known["what_if"] == "known_sensitivity" and "what_if" not in blind
    r = CliRunner().invoke(main, ["simulate", "--ledger", str(tmp_path / "l.db"), "--known-sensitivity"])
    assert r.exit_code == 2 and "applies to generated traces" in r.output


def test_a_configurations_share_of_the_sensitivity_is_drawn_and_the_rest_stays(mix):
    """sensitivity_config_share: that share of log k's variance belongs to the job's
    configuration (its mix entry), the rest to the job; log k keeps its spread, the jobs of a
    configuration share its median, and at share 0 the trace is the one without it."""
    base = generate_trace("philly", 2000, ["a100"], 64, seed=4, mix=mix)
    zero = generate_trace("philly", 2000, ["a100"], 64, seed=4, mix=mix, sensitivity_config_share=0.0)
    assert [j.sens for j in zero] == [j.sens for j in base] and {j.sens_config for j in zero} == {1.0}
    half = generate_trace("philly", 2000, ["a100"], 64, seed=4, mix=mix, sensitivity_config_share=0.5)
    assert [(j.submit, j.duration, j.limit, j.pred, j.true, j.graph) for j in half] == \
        [(j.submit, j.duration, j.limit, j.pred, j.true, j.graph) for j in base]
    medians: dict[str, set] = {}
    for j in half:
        medians.setdefault(j.model, set()).add(j.sens_config)
    assert len(medians) > 10 and all(len(m) == 1 for m in medians.values())
    assert float(np.std(np.log([j.sens for j in half]))) == pytest.approx(0.6, abs=0.1)
    own = np.log([j.sens / j.sens_config for j in half])
    assert float(np.std(own)) == pytest.approx(0.6 * 0.5 ** 0.5, abs=0.04)
    with pytest.raises(HorusError, match="configuration share"):
        generate_trace("philly", 10, ["a100"], 64, mix=mix, sensitivity_config_share=1.5)


def test_a_known_median_leaves_the_rest_of_the_spread():
    """What a history of k would know: a job's median with a spread left around it.  Known at
    the population's median with the population's spread it is the blind share; a more
    sensitive median gives a larger share, a narrower spread a share nearer the exact one."""
    itf = Interference()
    for su in (110.0, 150.0, 198.0):
        blind = itf.exceed_shares(su, 2, (2.0,))[0]
        assert itf.exceed_shares(su, 2, (2.0,), sens=(1.0,), known_sigma=0.6)[0] == pytest.approx(blind)
        touchy = itf.exceed_shares(su, 2, (2.0,), sens=(2.0,), known_sigma=0.6)[0]
        exact = itf.exceed_shares(su, 2, (2.0,), sens=(2.0,))[0]
        narrow = itf.exceed_shares(su, 2, (2.0,), sens=(2.0,), known_sigma=0.05)[0]
        assert touchy >= blind and abs(narrow - exact) <= abs(touchy - exact)
    assert 0.0 < itf.exceed_shares(198.0, 2, (2.0,))[0] < itf.exceed_shares(198.0, 2, (2.0,), sens=(2.0,),
                                                                             known_sigma=0.6)[0]


def test_knowing_a_configuration_that_sets_none_of_k_is_knowing_nothing(mix):
    """The what-if known_config_share: on a trace where the configuration sets no part of k,
    its median (1) with the whole spread left is what the blind budget assumes, run for run;
    knowing each job's own k is not."""
    c = homogeneous_cluster(16)
    jobs = generate_trace("llm", 300, ["a100"], 16, seed=1, load=4.0, mix=mix, max_gpus_per_job=8)
    kw = {"history_lag_s": None}
    blind = run_policies(c, jobs, ["horus"], **kw)["horus"]
    nothing = run_policies(c, jobs, ["horus"], known_sensitivity=True, known_config_share=0.0, **kw)["horus"]
    own = run_policies(c, jobs, ["horus"], known_sensitivity=True, **kw)["horus"]
    for k in ("mean_jct_s", "p95_slowdown", "makespan_s", "shared_starts"):
        assert nothing[k] == blind[k], k
    assert own["mean_jct_s"] != blind["mean_jct_s"]
    with pytest.raises(HorusError, match="known configuration share"):
        run_policies(c, jobs[:5], ["horus"], known_sensitivity=True, known_config_share=1.0)


@pytest.mark.parametrize("trace,seed,policy,known", [("llm", 1, "horus", False), ("philly", 2, "horus", False),
                                                    ("llm", 7, "oracle", True), ("pai", 1, "oracle", False)])
def test_the_backfill_memo_skips_no_job_that_would_start(trace, seed, policy, known, mix, monkeypatch):
    """The memo of shareable jobs that found no room is a proof, not a heuristic: the same
    run with it switched off (every job of the window tried) starts every job at the same time.
    (A memo of every refused job skipped jobs a longer or shorter time limit let in; one kept
    across starts skipped jobs a grown group's util limit let in.)"""
    from slurm_horus.sim import engine
    c = homogeneous_cluster(8)
    jobs = generate_trace(trace, 250, ["a100"], 8, seed=seed, load=6.0, mix=mix, max_gpus_per_job=8)
    kw = {"history_lag_s": None, "known_sensitivity": known}
    with_memo = run_policies(c, jobs, [policy], **kw)[policy]
    monkeypatch.setattr(engine, "_add_failure", lambda fails, u, m: None)
    without = run_policies(c, jobs, [policy], **kw)[policy]
    for k in ("mean_jct_s", "p95_slowdown", "makespan_s", "backfilled"):
        assert with_memo[k] == without[k], k


def test_a_spread_job_goes_where_it_delays_no_node_drain():
    # node a: a 50 s job and an idle GPU; node b: a 1,000 s 2-GPU job and an idle GPU.  A 400 s
    # job spread onto a would keep it busy, and the 2-GPU job behind it would wait for that
    c = ClusterSpec((NodeSpec("a", "a100", 2), NodeSpec("b", "a100", 3)))
    jobs = [job(0, 0, 50, util=90), job(1, 0, 1000, util=90, gpus=2),
            job(2, 1, 400, util=90), job(3, 2, 100, util=90, gpus=2)]
    reqs = [Request((0,), 100, 1), Request((0,), 100, 2),
            Request((0,), 1, 1, (90.0, 2000.0, (1.0,), jobs[2].limit)), Request((0,), 100, 2)]
    sim, _ = run(c, jobs, reqs)
    assert sim.start[2] == 1.0 and sim.start[3] == pytest.approx(50.0)  # a drained at 50


def test_cli_rejects_bad_history_options():
    from slurm_horus.cli.admin import main

    r = CliRunner().invoke(main, ["simulate", "--jobs", "20", "--repeat-share", "1.5"])
    assert r.exit_code != 0 and "--repeat-share must be in [0, 1)" in r.output
    r = CliRunner().invoke(main, ["simulate", "--jobs", "20", "--sensitivity-sigma", "-1"])
    assert r.exit_code != 0 and "--sensitivity-sigma must be in [0, 3]" in r.output
    r = CliRunner().invoke(main, ["simulate", "--jobs", "20", "--sensitivity-sigma", "0.3",
                                  "--ledger", "/nonexistent.json"])
    assert r.exit_code != 0 and "--sensitivity-sigma applies to generated traces" in r.output
    r = CliRunner().invoke(main, ["simulate", "--jobs", "20", "--limit-noise", "4"])
    assert r.exit_code != 0 and "--limit-noise must be in [0, 3]" in r.output
    r = CliRunner().invoke(main, ["simulate", "--jobs", "20", "--history-lag", "-1"])
    assert r.exit_code != 0 and "--history-lag must be >= 0" in r.output
    r = CliRunner().invoke(main, ["simulate", "--jobs", "50", "--no-history", "--policies", "horus",
                                  "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["horus"]["history_hits"] == 0


def test_simulate_takes_the_slowdown_bound_from_the_policy_file(tmp_path):
    """The what-if runs under the site's own bound (the policy's slowdown_bound, which
    horus-admin queue applies) unless --slowdown-bound says otherwise."""
    from slurm_horus.cli.admin import main as admin

    pol = tmp_path / "horus_policy.conf"
    pol.write_text((REPO / "etc" / "horus_policy.conf").read_text() + "\nslowdown_bound = 1.1\n")
    base = ["simulate", "--jobs", "150", "--gpus", "8", "--load", "4", "--seed", "3",
            "--policies", "horus", "--json", "--policy-file", str(pol)]

    def horus(*extra):
        r = CliRunner().invoke(admin, [*base, *extra])
        assert r.exit_code == 0, r.output
        return {k: v for k, v in json.loads(r.output)["horus"].items() if not k.endswith(("_wall_s", "_cpu_s"))}

    strict, loose = horus(), horus("--slowdown-bound", "3")
    assert strict == horus("--slowdown-bound", "1.1")
    assert strict["p95_slowdown"] <= 1.1 < loose["p95_slowdown"]


def test_budget_shortcut_never_refuses_a_join_the_exact_test_takes():
    # _over_budget refuses a join from the newcomer's share alone; it must never refuse one the
    # full test (_fails_budget: risk + added + z x sd <= budget, over any partners) would take
    from slurm_horus.sim.placement import Placement
    rng = np.random.default_rng(7)
    p = Placement.__new__(Placement)
    refused = 0
    for _ in range(20000):
        p.risk = float(rng.uniform(0, 50))
        p.risk_var = float(rng.choice([0.0, rng.uniform(0, 1), rng.uniform(0, 40)]))
        budget = float(rng.uniform(0, 60))
        r = float(rng.choice([0.0, rng.uniform(0, 1), 1.0]))
        added, var = r, r * (1 - r)
        for _ in range(int(rng.integers(0, 4))):
            new, old = sorted(rng.uniform(0, 1, 2))[::-1] if rng.random() < 0.5 else rng.uniform(0, 1, 2)
            if new > old:
                added += new - old
                var += new * (1 - new) - old * (1 - old)
        exact_refuses = p._fails_budget(added, var, budget)
        if p._over_budget(r, budget):
            refused += 1
            assert exact_refuses
    assert refused > 1000  # the shortcut does refuse (it is what saves the time)


def test_the_utilization_error_the_budget_assumes_is_the_cold_starts_measured_one(mix):
    from slurm_horus.sim.placement import UTIL_SIGMA
    assert UTIL_SIGMA == pytest.approx(float(np.std(mix.util_residuals())), abs=0.01)


def test_a_predicted_sum_is_read_over_its_error():
    # where pairs begin to lose, the share of jobs beyond the bound is convex in the summed
    # utilization: read at the point of a median-unbiased prediction it understates the tail.
    # Near two jobs of 100 % the truth can only be lower than the sum (no job uses more than a
    # whole GPU), so the error lowers it there; no error reads it at the point, as before
    from slurm_horus.sim.placement import Placement
    p = Placement.__new__(Placement)
    p.itf, p.known_sigma = Interference(), 0.0
    for su in (110.0, 130.0, 150.0, 195.0):
        at_point = p.itf.exceed_shares(su, 2, (2.0,))[0]
        assert p._tail(su, 0.0, 2, (2.0,), None)[0] == at_point
        over_error = p._tail(su, 0.25 * su / math.sqrt(2), 2, (2.0,), None)[0]
        assert over_error > at_point if su < 160 else over_error < at_point


def test_a_settled_charge_averages_its_groups_loss_over_the_error():
    # a job that ran 100 s, 80 of them in a group whose predicted sum put its loss integral at
    # 20 / 28 / 36 (c x L at the three QUAD points): its charge is the weighted chance over them
    from slurm_horus.sim.interference import share_above
    from slurm_horus.sim.placement import QUAD, Placement
    p = Placement.__new__(Placement)
    p.itf, p.bound, p.known_sensitivity = Interference(), 2.0, False
    p.timed_out, p.resubmitted, p.jsens, p.jrisk, p.risk, p.risk_var = [False], [False], [1.0], [0.0], 0.0, 0.0
    p.rate, p.rate_since = [(1.0, (0.0, 0.0, 0.0))], [100.0]
    p.lost_c, p.lossy, p.lost_k = [0.0], [80.0], [(20.0, 28.0, 36.0)]
    p._settle_risk(0, 100.0, 100.0)
    spare = 100.0 - 100.0 / 2.0
    want = sum(w * share_above(spare / lk) for (_, w), lk in zip(QUAD, (20.0, 28.0, 36.0)))
    assert p.jrisk[0] == pytest.approx(want) and p.jrisk[0] != pytest.approx(share_above(spare / 28.0))
    p.lost_k, p.jrisk = [(28.0, 28.0, 28.0)], [0.0]  # no error: the one point, exactly as before
    p._settle_risk(0, 100.0, 100.0)
    assert p.jrisk[0] == share_above(spare / 28.0)


def test_horus_reads_its_tail_over_the_prediction_error_and_the_oracle_does_not():
    cl = homogeneous_cluster(16)
    timing = ("_wall_s", "_cpu_s")
    beyond, beyond_exact = 0, 0
    for seed in range(1, 9):  # one small trace's count is a few jobs: the total over eight
        jobs = generate_trace("philly", 300, ["a100"], 16, seed=seed, load=4)
        r = run_policies(cl, jobs, ["horus", "oracle"])
        exact = run_policies(cl, jobs, ["horus", "oracle"], util_sigma=0.0)
        assert {k: v for k, v in r["oracle"].items() if not k.endswith(timing)} == \
            {k: v for k, v in exact["oracle"].items() if not k.endswith(timing)}
        assert r["horus"]["expected_beyond"] != exact["horus"]["expected_beyond"]
        beyond += r["horus"]["beyond_bound"]
        beyond_exact += exact["horus"]["beyond_bound"]
    assert beyond < beyond_exact


def test_under_pressure_a_job_joins_the_group_where_it_runs_fastest_not_the_lightest():
    # GPU 0 (A100) runs a 70 % job, GPU 1 (T4, 3.42x slower) a 20 % one; a 40 % job arrives and
    # none is idle.  Beside the T4 job it would lose nothing to interference but run 3.42x
    # longer; beside the A100 job (110 %: median speed 0.94) it finishes far sooner, so it pairs there
    c = ClusterSpec((NodeSpec("a", "a100", 1), NodeSpec("t", "t4", 1)))
    rx = {"a100": 1.0, "t4": 3.42}

    def two_type_job(i, submit, util):
        return SimJob(i, submit, 1000, 1, 10000, "test", {t: (util, 2000, 2000) for t in rx},
                      {t: (util, 2000) for t in rx}, runtime_x=rx)

    jobs = [two_type_job(0, 0, 70), two_type_job(1, 1, 20), two_type_job(2, 2, 40)]
    reqs = [Request((0, 1), 1, 1, (70, 2000, (1.0, 3.42), 10000)),
            Request((1,), 1, 1, (20, 2000, (1.0, 3.42), 10000)),  # a T4-only job
            Request((0, 1), 1, 1, (40, 2000, (1.0, 3.42), 10000))]
    sim, _ = run(c, jobs, reqs)
    assert sim.start[2] == 2 and sim.end[0] > 1000  # beside job 0, which it slows
    assert sim.end[2] - sim.start[2] < 1100  # about 1,000 / 0.94 on the A100, not 3,420 on the T4


def test_a_join_is_priced_with_the_slowdown_it_gives_its_partners():
    # GPU 0 holds two 10 % jobs, GPU 1 one 70 % job; a 40 % job arrives and none is idle.  In
    # the trio (60 %, speed 0.95 beyond pairs) it would itself run faster than beside the 70 %
    # job (110 %: 0.94), but it would slow two partners instead of one: 1/0.95 + 2 (1/0.95 - 1)
    # = 1.16 runtimes against 1/0.94 + (1/0.94 - 1) = 1.13, so it pairs with the 70 % job
    light, mid, new = ((u, 2000, (1.0,), 2000) for u in (10, 70, 40))
    jobs = [job(0, 0, 1000, util=10), job(1, 1, 1000, util=10), job(2, 2, 1000, util=70), job(3, 3, 1000, util=40)]
    sim, _ = run(one_node(2), jobs, [Request((0,), 1, 1, s) for s in (light, light, mid, new)])
    assert sim.start == [0, 1, 2, 3]
    assert (sim.end[0], sim.end[1]) == (1000, 1001)  # the light pair was left alone
    assert sim.end[2] > 1030 and sim.end[3] > 1030


def test_speed_table_is_speed_for_arrays_of_groups():
    """The horus scheduler prices every candidate group at once from speed_table."""
    rng = np.random.default_rng(3)
    sums, ns = rng.uniform(0, 500, 400), rng.integers(2, 7, 400)
    for itf in (Interference(), Interference(mem_bw_penalty=0.1), Interference(beyond_pairs=0.0)):
        xs, ys, crowd = itf.speed_table(int(ns.max()))
        assert np.interp(sums, xs, ys) * crowd[ns] == pytest.approx([itf.speed(x, int(n)) for x, n in zip(sums, ns)])
    xs, ys, crowd = Interference().speed_table(3000)  # more jobs than the table held before
    assert np.interp(150.0, xs, ys) * crowd[3000] == pytest.approx(Interference().speed(150.0, 3000))


def test_a_group_read_at_once_is_each_job_read_alone():
    """speeds and loss_rates_at (the simulator reads a group's curve once) give, bit for bit,
    what speed and loss_rates give job by job."""
    for itf in (Interference(), Interference(mem_bw_penalty=0.1), Interference(beyond_pairs=0.0)):
        for su in (0.0, 80.0, 150.0, 450.0):
            for n in (1, 2, 3, 5):
                sens = [1.0, 0.3, 2.5, 9.0]
                assert itf.speeds(su, n, sens) == [itf.speed(su, n, k) for k in sens]
                sums = (su, su + 20.0, su + 40.0)
                c, cks = itf.loss_rates_at(sums, n)
                assert (c, cks) == (itf.loss_rates(su, n)[0], tuple(itf.loss_rates(x, n)[1] for x in sums))


def test_pooled_means_is_the_pool_of_one_run_per_graph():
    from slurm_horus.predict.history import pooled_correction, pooled_means
    rng = np.random.default_rng(5)
    graphs = [(float(rng.uniform(1000, 30000)), float(rng.uniform(800, 30000)) if i % 7 else 0.0,
               None if i % 5 == 0 else float(rng.uniform(0, 100)), float(rng.uniform(0, 100)))
              for i in range(60)]
    for off in ({"mem_mib": 0.0, "util_pp": 0.0}, {"mem_mib": -900.0, "util_pp": 4.5}):
        runs = [[{"mem": m, "cold_mem": cm, "util": u, "cold_util": cu}] for m, cm, u, cu in graphs]
        assert pooled_means(graphs, off) == pooled_correction(runs, [None] * len(runs), off)


def test_simulate_decides_and_bounds_by_one_policy_file(tmp_path, monkeypatch):
    """Without --policy-file the bound came from the site's policy while the hook's decisions
    came from the shipped one beside the packaged hook: the what-if mixed two policies."""
    from slurm_horus.cli.admin import main as admin

    site = tmp_path / "etc"
    site.mkdir()
    (site / "slurm.conf").write_text("ClusterName=x\n")
    (site / "job_submit.lua").write_text((REPO / "etc" / "job_submit.lua").read_text())
    pol = site / "horus_policy.conf"
    pol.write_text((REPO / "etc" / "horus_policy.conf").read_text()
                   + "\nexclusive_util_pct = 20\nslowdown_bound = 1.5\n")
    monkeypatch.delenv("HORUS_POLICY", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(site / "slurm.conf"))
    base = ["simulate", "--jobs", "150", "--gpus", "8", "--load", "4", "--seed", "3",
            "--policies", "horus", "--json"]

    def horus(*extra):
        r = CliRunner().invoke(admin, [*base, *extra])
        assert r.exit_code == 0, r.output
        return {k: v for k, v in json.loads(r.output)["horus"].items() if not k.endswith(("_wall_s", "_cpu_s"))}

    site_run = horus()
    assert site_run == horus("--policy-file", str(pol))
    assert site_run != horus("--policy-file", str(REPO / "etc" / "horus_policy.conf"),
                             "--slowdown-bound", "1.5")


def test_a_job_killed_at_its_limit_ended_but_did_not_complete():
    # it counted in `completed` and in the window's throughput, which flattered naive
    jobs = [job(0, 0, 1000, limit=500), job(1, 0, 100), job(2, 600, 10)]
    sim, m = run(one_node(2), jobs, [Request((0,), 100, 1)] * 3)
    # killed at 500 s, submitted again and killed again at 1000 s
    assert (m["timeouts"], m["resubmitted"], m["ended"], m["completed"]) == (2, 1, 3, 2)
    assert sim.end[0] == pytest.approx(1000)
    assert m["window_s"] == 600 and m["throughput_per_h"] == pytest.approx(3600.0 / 600)  # job 1 alone


def test_a_job_that_runs_out_of_memory_holds_its_gpu_no_longer_than_its_limit():
    # Slurm kills it at its limit: with a limit under the OOM delay it held the GPU past it; and
    # killed so, it is a TIMEOUT (no OOM message for the queue loop), never requeued
    jobs = [job(0, 0, 10, limit=20, mem=50000, true=(10, 50000))]
    sim, m = run(one_node(1), jobs, [Request((0,), 100, 1)], oom_delay_s=60)
    # killed at 20 s, submitted again by its user, killed again at 40 s
    assert sim.end[0] == pytest.approx(40) and (m["timeouts"], m["oom_failures"], m["failed_jobs"]) == (2, 0, 0)


# -- replay input and the CLI's options, from a sceptical admin's review ---------------------------

def _sacct_job(i, submit=1_796_000_000, elapsed=300, gpus=1, **extra):
    time = {"submission": submit + 10 * i, "elapsed": elapsed}
    time.update(extra.pop("time", {}))
    return {"job_id": i + 1, "state": {"current": ["COMPLETED"]}, "time": time,
            "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": gpus}]}, **extra}


def _replayed(doc, mix, **kw):
    return [(j.submit, j.duration, j.gpus, j.limit)
            for j in from_sacct_json(json.dumps(doc), ["a100"], seed=1, mix=mix, **kw)]


@pytest.mark.parametrize("unset", [4294967295, 4294967294, {"set": True, "infinite": True, "number": 0},
                                   {"set": False, "infinite": False, "number": 0}, 0, None])
def test_slurms_unset_time_limit_is_none_given_in_either_form(mix, unset):
    # INFINITE as a plain number (22.05, or a dump's own) had replayed as an 8,000-year limit
    doc = {"jobs": [_sacct_job(i, elapsed=300 + i, time={"limit": unset}) for i in range(3)]}
    plain = {"jobs": [_sacct_job(i, elapsed=300 + i) for i in range(3)]}  # no limit at all
    assert _replayed(doc, mix) == _replayed(plain, mix) == [(10.0 * i, 300.0 + i, 1, 2 * (300.0 + i)) for i in range(3)]
    # a limit set replays as it is (minutes), in either form
    for lim in (60, {"set": True, "infinite": False, "number": 60}):
        assert _replayed({"jobs": [_sacct_job(0, time={"limit": lim})]}, mix)[0][3] == 3600


@pytest.mark.parametrize("field,value", [("submission", 4294967294), ("submission", 4294967295),
                                         ("elapsed", 4294967294), ("elapsed", {"set": False, "number": 5}),
                                         ("submission", {"set": True, "infinite": True, "number": 0})])
def test_slurms_unset_submit_and_elapsed_times_leave_the_job_out(mix, field, value):
    doc = {"jobs": [_sacct_job(0), _sacct_job(1, time={field: value})]}
    report = {}
    assert len(_replayed(doc, mix, report=report)) == 1
    assert report["skipped"] == {"without times": 1}


@pytest.mark.parametrize("field,value", [("submission", 9_000_000_000_000_000_000), ("submission", -5),
                                         ("submission", 4_102_444_801), ("elapsed", 9_000_000_000_000_000_000),
                                         ("elapsed", 1e308), ("elapsed", -5), ("elapsed", 366 * 86400 + 1)])
def test_times_no_job_had_leave_the_job_out(mix, field, value):
    # a submit time of 9e18 gave a makespan of 9e18 s; an elapsed time of 9e18 a p95 slowdown of 0.90
    doc = {"jobs": [_sacct_job(0), _sacct_job(1), _sacct_job(2, time={field: value})]}
    report = {}
    jobs = _replayed(doc, mix, report=report)
    assert [j[:2] for j in jobs] == [(0.0, 300.0), (10.0, 300.0)]
    assert report["skipped"] == {"impossible times": 1} and report["examples"] == {"impossible times": "3"}
    # the bounds themselves are times a job can have
    edge = {"jobs": [_sacct_job(0, submit=4_102_444_800 - 10, elapsed=366 * 86400)]}
    assert _replayed(edge, mix)[0][1] == 366 * 86400


def test_the_sacct_replay_counts_what_it_leaves_out_per_reason(mix):
    jobs = [_sacct_job(i) for i in range(4)]
    jobs[1]["tres"]["allocated"][0]["count"] = 1e30  # more GPUs than any node: clipped, counted
    jobs[2]["tres"]["allocated"][0]["count"] = 64
    step = dict(_sacct_job(5), job_id="123.batch")
    running = _sacct_job(6)
    running["state"] = {"current": ["RUNNING"]}
    cpu = _sacct_job(7)
    cpu["tres"]["allocated"] = [{"type": "cpu", "count": 4}]
    report = {}
    out = _replayed({"jobs": [*jobs, step, step, running, cpu, _sacct_job(8, time={"elapsed": None}),
                              "garbage", None, dict(_sacct_job(9), job_id="x")]}, mix, report=report)
    assert [g for _, _, g, _ in out] == [1, 8, 8, 1]
    assert report["rows"] == 12 and report["jobs"] == 4 and report["clipped"] == 2
    assert list(report["skipped"].items()) == [("not job records", 2), ("steps", 2), ("unreadable", 1),
                                               ("without GPUs", 1), ("not ended", 1), ("without times", 1)]
    assert report["examples"]["steps"] == "123.batch" and report["examples"]["without times"] == "9"
    with pytest.raises(HorusError, match=r"of 2 rows: 1 steps \(123.batch\), 1 without times"):
        from_sacct_json(json.dumps({"jobs": [step, _sacct_job(8, time={"elapsed": 0})]}), ["a100"], mix=mix)


def test_cli_says_in_one_line_and_in_the_json_what_the_sacct_replay_left_out(simulate_cli, tmp_path):
    dump = [_sacct_job(i) for i in range(5)]
    dump[0]["tres"]["allocated"][0]["count"] = 64
    dump += [dict(_sacct_job(5), job_id="7.batch"), _sacct_job(6, time={"submission": 9e18})]
    (tmp_path / "s.json").write_text(json.dumps({"jobs": dump}))
    r = CliRunner().invoke(simulate_cli, ["simulate", "--sacct", str(tmp_path / "s.json"), "--gpus", "8",
                                          "--policies", "exclusive", "--json"])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == [
        "horus-admin simulate: warning: 2 of 7 sacct rows skipped: 1 steps (7.batch), 1 impossible times (7); "
        "1 jobs clipped to the largest node (they asked for more GPUs than it has)"]
    res = json.loads(r.stdout)["exclusive"]
    assert res["jobs"] == 5 and res["makespan_s"] < 3600
    assert res["sacct_rows"] == {"rows": 7, "jobs": 5, "skipped": {"steps": 1, "impossible times": 1},
                                 "examples": {"steps": "7.batch", "impossible times": "7"}, "clipped": 1}
    # every row replayed as it is: no warning, and no word of it
    (tmp_path / "s.json").write_text(json.dumps({"jobs": dump[1:5]}))
    r = CliRunner().invoke(simulate_cli, ["simulate", "--sacct", str(tmp_path / "s.json"), "--gpus", "8",
                                          "--policies", "exclusive", "--json"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert json.loads(r.stdout)["exclusive"]["sacct_rows"]["skipped"] == {}


def test_ledger_rows_with_times_no_job_had_are_refused_or_left_out():
    row = {"submit_time": 0, "elapsed_s": 100, "gpus": 1, "pred_util": 50, "pred_mem": 1000,
           "true_util": 50, "true_mem": 1000}
    for bad in ({"elapsed_s": 1e308}, {"elapsed_s": 366 * 86400 + 1}, {"submit_time": 9e18}):
        with pytest.raises(HorusError, match="row 2: need submit_time up to 4102444800"):
            from_rows([row, {**row, **bad}], ["a100"])
    # NO_VAL minutes or above as a limit: none given, as in sacct's
    assert from_rows([{**row, "limit_s": 4294967295 * 60.0}], ["a100"])[0].limit == 200
    led = {"submit_time": 1_796_000_000, "elapsed_s": 3600, "pred_util_pct": 50, "pred_mem_mib": 1000,
           "act_util_pct": 60, "act_mem_mib": 1200, "gpus": 1}
    rows = rows_from_ledger_jobs([led, {**led, "elapsed_s": 9_000_000_000_000_000_000},
                                  {**led, "submit_time": 4294967295 * 2}])
    assert len(rows) == 1


def test_bf_window_is_capped_as_slurm_conf_caps_it(simulate_cli):
    # 10^20 had been an internal error (islice's stop argument); the cap is
    # cluster.MAX_BF_MAX_JOB_TEST, the one backfill_from_slurm_conf applies
    for n in ("99999999999999999999", "1000001", "-1"):
        r = CliRunner().invoke(simulate_cli, ["simulate", "--jobs", "10", "--bf-window", n])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert "--bf-window must be 0..1,000,000" in r.output and "internal" not in r.output


def test_the_policy_file_named_must_be_there_and_is_named_in_the_output(simulate_cli, tmp_path, monkeypatch):
    base = ["simulate", "--jobs", "20", "--gpus", "8", "--policies", "exclusive,horus"]
    monkeypatch.setenv("HORUS_POLICY", str(tmp_path / "typo.conf"))  # had run the shipped policy
    r = CliRunner().invoke(simulate_cli, base)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"policy file (HORUS_POLICY) {tmp_path / 'typo.conf'}: No such file" in r.output
    r = CliRunner().invoke(simulate_cli, [*base, "--policy-file", str(tmp_path / "none.conf")])
    assert r.exit_code == 2 and "none.conf: No such file" in r.output
    # before the trace is built: a ledger that is not there is not what it says first
    r = CliRunner().invoke(simulate_cli, ["simulate", "--ledger", f"sqlite:///{tmp_path}/none.db",
                                          "--policy-file", str(tmp_path / "none.conf")])
    assert r.exit_code == 2 and "none.conf: No such file" in r.output, r.output
    # a file that is no policy (/etc/passwd) runs, with the lines the hook ignores said once
    junk = tmp_path / "passwd"
    junk.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n")
    monkeypatch.delenv("HORUS_POLICY")
    r = CliRunner().invoke(simulate_cli, [*base, "--policy-file", str(junk), "--json"])
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == [
        f"horus-admin simulate: warning: the hook ignores 2 lines of policy file {junk} (line 1: "
        "'root:x:0:0:root:/root:/bin/bash'; an unknown key, a value it does not take or no 'key = value' line)"]
    out = json.loads(r.stdout)
    assert {(m["policy_file"], m["slowdown_bound"]) for m in out.values()} == {(str(junk), 2.0)}
    pol = tmp_path / "site.conf"
    pol.write_text((REPO / "etc" / "horus_policy.conf").read_text() + "\nslowdown_bound = 1.5\n")
    r = CliRunner().invoke(simulate_cli, [*base, "--policy-file", str(pol)])
    assert r.exit_code == 0 and r.stderr == "", r.output
    title = "".join(r.stdout.split("┏")[0].split())  # rich wraps the title to the table's width
    assert "".join(f"policy {pol}, slowdown bound 1.5".split()) in title, r.stdout


@pytest.mark.parametrize("args,says", [
    (["--gres-conf", "gres.conf"], "--gres-conf applies with --slurm-conf"),
    (["--cluster", "c.json", "--gpus", "16"], "--gpus applies to the homogeneous cluster, not to --cluster"),
    (["--cluster", "c.json", "--gpu-type", "t4"], "--gpu-type applies to the homogeneous cluster"),
    (["--slurm-conf", "slurm.conf", "--gpus-per-node", "4"], "--gpus-per-node applies to the homogeneous "
                                                               "cluster, not to --slurm-conf"),
    (["--sacct", "s.json", "--jobs", "10"], "--jobs applies to generated traces, not to --sacct or --ledger"),
    (["--ledger", "l.json", "--load", "2"], "--load applies to generated traces"),
    (["--sacct", "s.json", "--limit-noise", "1"], "--limit-noise applies to generated traces"),
    (["--plot", "x.txt"], "--plot x.txt: .txt is no image format matplotlib writes"),
    (["--plot", "nowhere/x.png"], "no folder"),
])
def test_options_that_would_be_ignored_or_fail_late_are_usage_errors(simulate_cli, tmp_path, monkeypatch,
                                                                       args, says):
    if "--plot" in args:
        pytest.importorskip("matplotlib")
    (tmp_path / "gres.conf").write_text("Name=gpu Type=a100 File=/dev/nvidia0\n")
    (tmp_path / "c.json").write_text('{"nodes": [{"name": "a", "gpu_type": "a100", "gpus": 8}]}')
    (tmp_path / "slurm.conf").write_text("NodeName=g1 Gres=gpu:a100:8\n")
    (tmp_path / "s.json").write_text(json.dumps({"jobs": [_sacct_job(0)]}))
    (tmp_path / "l.json").write_text(json.dumps([{"submit_time": 0, "elapsed_s": 100, "gpus": 1, "pred_util": 50,
                                                  "pred_mem": 1000, "true_util": 50, "true_mem": 1000}]))
    from slurm_horus.sim import engine

    real = engine.run_policies
    monkeypatch.setattr(engine, "run_policies", lambda *a, **k: pytest.fail("simulated before refusing"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(simulate_cli, ["simulate", *args])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and says in r.output, r.output
    # the file alone is taken
    if args[0] in ("--cluster", "--sacct"):
        monkeypatch.setattr(engine, "run_policies", real)
        r = CliRunner().invoke(simulate_cli, ["simulate", *args[:2], "--policies", "exclusive"])
        assert r.exit_code == 0, r.output


def test_the_docs_quote_the_figures_benchmarks_md_prints():
    """simulator.md quoted tail-budget counts no current output printed, and said runtimes were
    truncated where traces.py clips them."""
    doc = (REPO / "docs" / "simulator.md").read_text()
    bench = (REPO / "BENCHMARKS.md").read_text()
    sec6 = bench[bench.index("## 6."):bench.index("## 7.")]
    import re

    counts = re.findall(r"#### (\w+): 2,000 jobs on 32 A100 \+ 32 T4, means of seeds 1, 2, 3.*?"
                        r"horus expected (\d+), were (\d+)", sec6, re.S)
    assert [m for m, _, _ in counts] == ["philly", "llm", "pai"]
    quoted = ", ".join(f"{m} {int(e):,} against {int(w):,}" for m, e, w in counts)
    assert f"({quoted}:" in " ".join(doc.split()), quoted
    assert "clipped to [30 s, 2 days]" in doc and "truncated" not in doc
    assert "np.clip(rng.lognormal" in (REPO / "slurm_horus" / "sim" / "traces.py").read_text()


def test_a_resubmitted_job_keeps_the_tail_charge_of_its_killed_run():
    """The rerun's settling had set the job's charge to its rerun's own chance (often 0), while
    the metrics count it at its killed run: the budget forgot it and admitted more pairs."""
    itf = Interference(((0, 1.0), (75, 1.0), (100, 0.4)))
    # predicted 10 % each (a free pair), truly 90 %: job 1 ends at 750 s, job 0 is killed at
    # 1200 s (750 s of its 1000 s done) and its rerun runs alone, at no loss
    jobs = [job(0, 0, 1000, util=10, limit=1200, true=(90, 2000)),
            job(1, 0, 300, util=10, limit=1200, true=(90, 2000))]
    share = (10.0, 2000.0, (1.0,), 1200.0)
    sim, m = run(one_node(1), jobs, [Request((0,), 1, 1, share)] * 2, interference=itf, max_group=2)
    assert (m["resubmitted"], m["completed"]) == (1, 2) and sim.end[0] == pytest.approx(2200)
    assert sim.jrisk[0] == 1.0  # its killed run's charge (a TIMEOUT: 1), not its lone rerun's 0


def test_a_trace_of_numpy_numbers_runs_as_one_of_python_numbers():
    """A trace built with numpy's numbers (np.int64 GPUs, float32 k and utilizations) is the
    same trace: it had run in float32 where its values were, and the compiled core (setup.py)
    had refused an np.int64."""
    rng = np.random.default_rng(5)
    rows = [(float(rng.uniform(0, 3000)), float(rng.uniform(300, 4000)), float(rng.uniform(10, 95)),
             float(rng.uniform(1000, 30000)), float(rng.lognormal(0, 0.6))) for _ in range(60)]
    f32 = np.float32
    numpy_made = [SimJob(i, np.float64(s), np.float64(d), np.int64(1), np.float64(2 * d), "m",
                         {"a100": (f32(u), f32(m), f32(m))}, {"a100": (f32(u), f32(m))}, sens=f32(k))
                  for i, (s, d, u, m, k) in enumerate(rows)]
    for j in numpy_made:
        assert type(j.gpus) is int and type(j.sens) is float and type(j.true["a100"][0]) is float
    # the float32 values, read as doubles, are the trace: run the plain one with the same values
    same = [SimJob(i, s, d, 1, 2 * d, "m", {"a100": (float(f32(u)), float(f32(m)), float(f32(m)))},
                   {"a100": (float(f32(u)), float(f32(m)))}, sens=float(f32(k)))
            for i, (s, d, u, m, k) in enumerate(rows)]
    cluster = one_node(4)
    got = run_policies(cluster, numpy_made, ["naive", "oracle"])
    want = run_policies(cluster, same, ["naive", "oracle"])
    for p in got:
        for key in ("mean_jct_s", "p95_slowdown", "timeouts", "oom_failures"):
            assert got[p][key] == want[p][key], (p, key)
