"""History first: measured runs of a graph beat the models, weaker evidence counts less, site
offsets learned from other models, a history file that is not trusted is refused."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.predict.coldstart import ColdStartEstimator, Prediction, Workload
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.history import HistoryPredictor
from slurm_horus.predict.chain import choose_predictor, predict_for
from slurm_horus.predict.registry import Registry
from slurm_horus.predict.workload import dims_key

ZOO = Path(__file__).parent / "data" / "zoo"
A100 = get_gpu("a100-40gb")
COLD = ColdStartEstimator()


def _site(b: int) -> tuple[float, float]:
    """A site's measured peak (MiB, a 2 MiB allocator block rounding included) and
    utilization of ResNet-50 at batch b: not the cold start's figures."""
    return 2 * math.ceil((2350 + 97.5 * b) / 2), min(25 + 14 * math.log2(b), 97.0)


def _run(report, b, mem, util, family="resnet50", user="alice", sha=None, **workload):
    w = Workload(batch_size=b, **workload)
    c = COLD.predict(report, A100, w)
    return {"sha": sha or report.sha256, "gpu": A100.name, "bs": b, "task": w.task,
            "opt": w.optimizer, "prec": w.precision, "dims": dims_key(report.given_dims, b),
            "mem": mem, "util": util, "cold_mem": c.mem_mib, "cold_util": c.util_pct,
            "family": family, "user": user}


def test_exact_history_beats_cold_start_on_a_held_out_batch_size(resnet):
    runs = [_run(resnet[b], b, *_site(b)) for b in (8, 32, 64)]
    h = HistoryPredictor(user="bob").fit(runs)
    mem, util = _site(16)
    p = h.predict(resnet[16], A100, Workload(batch_size=16))
    cold = COLD.predict(resnet[16], A100, Workload(batch_size=16))
    assert p.predictor == "history:exact"
    assert abs(p.mem_mib - mem) / mem < 0.02 < abs(cold.mem_mib - mem) / mem
    assert abs(p.util_pct - util) < 2.0 < abs(cold.util_pct - util)
    # one measured point: the cold start's batch dependence, scaled to the measurement
    one = HistoryPredictor(user="bob").fit(runs[1:2]).predict(resnet[16], A100,
                                                             Workload(batch_size=16))
    assert one.predictor == "history:exact"
    assert abs(one.mem_mib - mem) < abs(cold.mem_mib - mem)


def test_other_precision_of_the_same_graph_answers_as_graph_history(resnet):
    runs = [_run(resnet[b], b, *_site(b)) for b in (8, 32)]
    p = HistoryPredictor(user="bob").fit(runs).predict(resnet[16], A100,
                                                       Workload(batch_size=16, precision="amp"))
    assert p.predictor == "history:graph"
    amp_cold = COLD.predict(resnet[16], A100, Workload(batch_size=16, precision="amp"))
    assert p.mem_mib < _site(16)[0] and p.mem_mib != pytest.approx(amp_cold.mem_mib, rel=0.05)


def test_family_evidence_weighs_less_than_exact(resnet):
    runs = [_run(resnet[b], b, *_site(b)) for b in (8, 32, 64)]
    # the same measurements, claimed by another graph of the family
    other = [dict(r, sha="f" * 64) for r in runs]
    w = Workload(batch_size=16)
    exact = HistoryPredictor(user="bob").fit(runs).predict(resnet[16], A100, w)
    family = HistoryPredictor(user="bob").fit(other).predict(resnet[16], A100, w)
    cold = COLD.predict(resnet[16], A100, w).mem_mib
    truth = _site(16)[0]
    assert family.predictor == "history:family"
    assert abs(exact.mem_mib - truth) < abs(family.mem_mib - truth) < abs(cold - truth)
    # family pulls only part of the way, and user evidence (weight 1) pulls less than family
    user = HistoryPredictor(user="alice").fit([dict(r, family=None) for r in other]).predict(
        resnet[16], A100, w)
    assert user.predictor == "history:user"
    assert abs(family.mem_mib - truth) < abs(user.mem_mib - truth) < abs(cold - truth)


def test_offsets_learned_from_other_models_correct_a_fixed_overhead():
    overhead, w = 1800.0, Workload(batch_size=16)
    runs = []
    for name in ("small_cnn", "mobilenet_v2", "efficientnet_b0"):
        for b in (4, 16):
            r = extract_features(ZOO / f"{name}.onnx", batch_size=b)
            c = COLD.predict(r, A100, Workload(batch_size=b))
            runs.append(_run(r, b, c.mem_mib + overhead, c.util_pct + 6.0, family=name))
    report = extract_features(ZOO / "resnet50.onnx", batch_size=16)  # never measured here
    truth = COLD.predict(report, A100, w).mem_mib + overhead
    h = HistoryPredictor(user="bob").fit(runs)
    p = h.predict(report, A100, w)
    assert p.predictor == "cold-start" and "site offsets" in p.confidence
    assert p.mem_mib == pytest.approx(truth, rel=0.01)
    assert p.util_pct == pytest.approx(COLD.predict(report, A100, w).util_pct + 6.0, abs=0.5)
    # one model's error is not the site's: no offset from a single graph
    single = HistoryPredictor(user="bob").fit([r for r in runs if r["family"] == "small_cnn"])
    assert single.offsets == {}


def test_scattered_residuals_give_no_offset():
    """Residuals that differ model to model (the predictor's own errors) mostly cancel."""
    h = HistoryPredictor()
    runs = [{"sha": f"{i:064x}", "gpu": "a100-40gb", "bs": 8, "task": "train", "opt": "adam",
             "prec": "fp32", "dims": "", "mem": 5000.0 + d, "util": None, "cold_mem": 5000.0,
             "cold_util": None} for i, d in enumerate((-2000, 1500, -900, 2500, 100, -1700))]
    off = h.fit(runs).offsets["a100-40gb"]["cold-start"]["mem_mib"]
    assert abs(off) < 250


def test_a_run_past_the_largest_batch_size_is_malformed():
    """A history run is held to the batch sizes a Workload takes (1..2**31-1): one of 2**31
    had passed the file's check and failed where the history builds its workload."""
    from slurm_horus.errors import HorusError
    from slurm_horus.predict.history_format import check_run
    run = {"sha": f"{1:064x}", "gpu": "a100-40gb", "bs": 2**31 - 1, "task": "train", "opt": "adam",
           "prec": "fp32", "dims": "", "mem": 5000.0, "util": None, "cold_mem": 5000.0, "cold_util": None}
    assert check_run(run, "run")["bs"] == 2**31 - 1
    with pytest.raises(HorusError, match="batch size 2147483648"):
        check_run({**run, "bs": 2**31}, "run")


def _saved(tmp_path, resnet) -> Path:
    root = tmp_path / "models"
    reg = Registry(root)
    reg.save_history(HistoryPredictor().fit([_run(resnet[b], b, *_site(b))
                                            for b in (8, 32, 64)]).to_dict())
    return root


def test_saved_history_serves_through_choose_predictor(tmp_path, resnet):
    root = _saved(tmp_path, resnet)
    assert oct((root / "history.json").stat().st_mode & 0o777) == "0o644"
    choice = choose_predictor(root)
    assert choice.warning is None and "site history" in choice.note
    (p,) = predict_for(resnet[16], [A100], Workload(batch_size=16), choice)
    assert p.predictor == "history:exact"


@pytest.mark.parametrize("damage", [
    lambda d: d["graphs"][next(iter(d["graphs"]))][0].update(mem=-5),
    lambda d: d["graphs"][next(iter(d["graphs"]))][0].update(util="high"),
    lambda d: d["graphs"][next(iter(d["graphs"]))][0].update(prec="fp8"),
    lambda d: d["graphs"].update({"not-a-sha": []}),
    lambda d: d["offsets"].update({"a100-40gb": {"cold-start": {"mem_mib": 1e30, "util_pp": 0,
                                                                "n": 3}}}),
    lambda d: d.update(format="slurm-horus-learned"),
    # a count no site has: its weight overflowed a float inside the prediction (internal error)
    lambda d: d["offsets"].update({"a100-40gb": {"cold-start": {"mem_mib": 0, "util_pp": 0,
                                                                "n": 10 ** 400}}}),
    lambda d: d.setdefault("families", {}).update({"a100-40gb": {"resnet": {
        "mem_log_ratio": 0, "util_shift": 0, "n": 10 ** 400}}}),
])
def test_tampered_history_is_refused_and_prediction_still_works(tmp_path, resnet, damage):
    root = _saved(tmp_path, resnet)
    doc = json.loads((root / "history.json").read_text())
    damage(doc)
    (root / "history.json").write_text(json.dumps(doc))
    choice = choose_predictor(root)
    assert choice.warning and "history" in choice.warning and "\n" not in choice.warning
    (p,) = predict_for(resnet[16], [A100], Workload(batch_size=16), choice)
    assert p.predictor == "cold-start"


def test_group_writable_history_is_refused(tmp_path, resnet):
    root = _saved(tmp_path, resnet)
    os.chmod(root / "history.json", 0o664)
    choice = choose_predictor(root)
    assert "writable by group or others" in choice.warning
    (p,) = predict_for(resnet[16], [A100], Workload(batch_size=16), choice)
    assert p.predictor == "cold-start"


def test_import_retrain_then_predict_answers_from_history(tmp_path):
    """The interface checks use: retrain --import CSV, then `horus predict --json`."""
    site = {"small_cnn": (1500, 3), "mobilenet_v2": (2000, 60), "resnet50": (2600, 95),
            "efficientnet_b0": (2300, 80), "unet": (2500, 70)}
    src = tmp_path / "m.csv"
    with open(src, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=["model", "gpu_type", "util_pct", "mem_mib",
                                            "batch_size", "task", "optimizer", "precision",
                                            "model_family"])
        out.writeheader()
        for i, (name, (fixed, per)) in enumerate(site.items()):
            for b in (2, 4, 8, 32, 64, 128):
                out.writerow({"model": ZOO / f"{name}.onnx", "gpu_type": "a100-40gb",
                              "util_pct": min(95, 20 + 10 * i + 8 * b ** 0.5),
                              "mem_mib": fixed + per * b, "batch_size": b, "task": "train",
                              "optimizer": "adam", "precision": "fp32", "model_family": name})
    models = tmp_path / "models"
    env = {**os.environ, "HORUS_LEDGER_URL": f"sqlite:///{tmp_path}/l.db"}
    bin_dir = Path(sys.executable).parent
    subprocess.run([bin_dir / "horus-admin", "retrain", "--import", src, "--model-dir", models,
                    "--force", "--max-iter", "20"], check=True, capture_output=True, env=env)
    assert (models / "history.json").exists() and (models / "calibration.json").exists()
    r = subprocess.run([bin_dir / "horus", "predict", ZOO / "resnet50.onnx", "--batch-size", "16",
                        "--task", "train", "--optimizer", "adam", "--precision", "fp32",
                        "--gpu", "a100-40gb", "--model-dir", models, "--json"],
                       check=True, capture_output=True, text=True, env=env)
    out = json.loads(r.stdout)
    assert out["predictor"] == "history:exact"
    assert out["mem_mib"] == pytest.approx(2600 + 95 * 16, rel=0.01)
    assert out["mem_mib_p90"] >= out["mem_mib"] and 0 <= out["util_pct"] <= 100


def test_a_run_that_shared_its_gpu_teaches_memory_but_not_utilization(tmp_path):
    """NVML measured a co-located run's share of the GPU, not its need: the history takes
    that run's memory and leaves its utilization out."""
    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger.history_export import ledger_runs

    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    for jid, util, coloc in ((1, 90.0, []), (2, 45.0, [3]), (3, 40.0, [2])):
        L.record_submission(job_id=jid, cluster="c", user="alice", model_sha256="ab" * 32,
                            model_path="/m/resnet50.onnx", model_family="resnet50",
                            features={n: 1.0 for n in FEATURE_NAMES}, feature_version=FEATURE_VERSION,
                            workload={"batch_size": 32, "task": "train"},
                            predictions={"a100-40gb": {"util_pct": 80.0, "mem_mib": 5000.0}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=util, util_max=99,
                       mem_peak_mib=5200.0 + jid, gpu_index=0, shards=50 if coloc else None,
                       colocated=coloc, state="COMPLETED", elapsed_s=600, node="n1",
                       gpu_type="a100-40gb", start_time=1700000000, end_time=1700000600)
    runs = sorted(ledger_runs(L), key=lambda r: r["mem"])
    assert [r["mem"] for r in runs] == [5201.0, 5202.0, 5203.0]
    assert [r["util"] for r in runs] == [90.0, None, None]


def test_only_completed_runs_of_a_graph_sync_verified_teach(tmp_path):
    """A sha the user's comment claims (sync could not hash the file: no features) and a run
    Slurm did not see complete (cancelled after seconds, before its peak) teach nothing: the
    first let one user set another user's graph's history, the second answered a rerun with
    a fraction of its need."""
    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION
    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger.history_export import ledger_runs
    from slurm_horus.ledger.training import training_set

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    feats = {n: 1.0 for n in FEATURE_NAMES}
    for jid, user, verified, state in ((1, "alice", True, "COMPLETED"), (2, "mallory", False, "COMPLETED"),
                                       (3, "alice", True, "CANCELLED by 0"), (4, "alice", True, "FAILED")):
        L.record_submission(job_id=jid, cluster="c", user=user, model_sha256="ab" * 32,
                            model_path="/m/resnet50.onnx", features=feats if verified else None,
                            feature_version=FEATURE_VERSION, workload={"batch_size": 32, "task": "train"},
                            predictions={"a100-40gb": {"util_pct": 80.0, "mem_mib": 5000.0, "cold": {
                                "util_pct": 80.0, "mem_mib": 5000.0}}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=50.0, util_max=99,
                       mem_peak_mib=5000.0 + jid, gpu_index=0, state=state, elapsed_s=600,
                       node="n1", gpu_type="a100-40gb", start_time=1700000000, end_time=1700000600)
    assert [r["mem"] for r in ledger_runs(L)] == [5001.0]
    assert training_set(L).keys == ["c/1"]


def test_one_user_with_many_graphs_counts_as_one_user_in_the_site_offset():
    """Six users' graphs measure 300 MiB over the cold start; one user runs twenty graphs that
    measure 8 GB under it.  Counted per graph, that user set everyone's offset."""
    def run(i, user, d):
        return {"sha": f"{i:064x}", "gpu": "a100-40gb", "bs": 8, "task": "train", "opt": "adam",
                "prec": "fp32", "dims": "", "mem": 12000.0 + d, "util": None,
                "cold_mem": 12000.0, "cold_util": None, "user": user, "family": "resnet50"}
    honest = [run(i, f"u{i}", 300.0 + 10 * i) for i in range(6)]
    mallory = [run(100 + i, "mallory", -8000.0) for i in range(20)]
    h = HistoryPredictor().fit(honest + mallory)
    assert h.offsets["a100-40gb"]["cold-start"]["mem_mib"] == pytest.approx(325, abs=30)
    fam = h.families["a100-40gb"]["resnet50"]["mem_log_ratio"]
    assert fam > 0  # the family pool too: the honest users' graphs ran above the cold start


def test_an_estimate_extrapolated_to_nothing_is_no_estimate():
    # a site offset below the cold start's context made the context 0: a line through two batch
    # sizes then reached 0 MiB below them, which had put 0 MiB in a hint and divided by zero
    from slurm_horus.predict.history import exact_estimate

    runs = [{"bs": 32, "mem": 1000.0, "util": 50.0}, {"bs": 64, "mem": 3000.0, "util": 60.0}]
    assert exact_estimate(runs, 1, None, None, 0.0, 0.0) is None
    assert exact_estimate(runs, 48, None, None, 0.0, 0.0)[0] == pytest.approx(2000.0)


def test_a_stale_cold_figure_is_read_in_proportion_alone():
    """A run's cold figure stored from an older release's features (a quantized graph's before
    its integer weights counted: the context and little else) set against today's: the part
    above the fixed cost had grown by (1951.7 - 1751) / 0.6, a measured 1,960 MiB at batch 8
    put at 70 GB for batch 64 (exact) or for batch 8 under another optimizer (the graph's
    tier).  A run of a graph whose cold figure is its own keeps the fixed-amount reading, one
    whose activations grow faster than its batch (an in-batch similarity matrix) included."""
    from slurm_horus.predict.history import _scaled, exact_estimate

    ctx = cold_ctx = 1751.0
    assert _scaled(1960.0, 1751.6, 1951.7, ctx, cold_ctx) == pytest.approx(1960.0 * 1951.7 / 1751.6)
    stale = [{"bs": 8, "mem": 1960.0, "util": 50.0, "cold_mem": 1751.6}]
    assert exact_estimate(stale, 64, 1951.7, None, ctx, cold_ctx)[0] < 2500.0
    fresh = [{"bs": 4096, "mem": 2182.0, "util": 50.0, "cold_mem": 2182.0}]  # 431 MiB above: 8x the batch, 55x
    m, _ = exact_estimate(fresh, 32768, 25955.0, None, ctx, cold_ctx)
    assert m == pytest.approx(25955.0)


def test_calibrated_bounds_start_from_the_base_figure_where_site_offsets_moved_it():
    # a site 1 GB below the cold start: the calibration's q90 (of measured / cold start) is
    # below 1; applied to the offset estimate it gave p90 = the estimate (52 % covered)
    from slurm_horus.predict.chain import Calibration
    from slurm_horus.predict.coldstart import Prediction

    cal = Calibration({"version": 1, "quantiles": {"*": {"cold-start": {
        "mem_log_q": {"0.9": -0.12}, "util_q": {"0.9": 5.0}}}}}, None)
    moved = Prediction(gpu="a100-40gb", util_pct=40.0, mem_mib=6000.0, mem_mib_p90=6000.0,
                       predictor="cold-start", breakdown={"base_mem_mib": 7000.0, "base_util_pct": 50.0})
    p = cal.apply(moved)
    assert p.mem_mib_p90 == pytest.approx(7000.0 * math.exp(-0.12)) and p.mem_mib_p90 > 6000.0
    assert p.util_pct_p90 == pytest.approx(55.0)
    plain = cal.apply(Prediction(gpu="a100-40gb", util_pct=40.0, mem_mib=6000.0, mem_mib_p90=6000.0,
                                 predictor="cold-start"))
    assert plain.mem_mib_p90 == 6000.0  # no offset: the estimate itself, as before


def test_a_graph_counts_for_the_user_who_ran_it_most_in_both_pooled_medians():
    # families/users pools and site offsets weigh graphs by one owner, chosen the same way
    from slurm_horus.predict.history import _owner
    assert _owner(["bob", "alice", "alice"]) == "alice"  # not the first run's user
    assert _owner(iter(["bob", "alice"])) == "bob"       # a tie: the earliest


def test_runs_another_user_claims_for_a_graph_cannot_lower_its_figures(resnet):
    """Anyone may name a shared model file: three cheap runs mallory claims for ResNet-50 do
    not pull alice's measured batch-32 figures down (each user's median; the highest counts)."""
    mem, util = _site(32)
    alice = [_run(resnet[32], 32, mem, util, user="alice")]
    mallory = [_run(resnet[32], 32, 600.0, 2.0, user="mallory") for _ in range(3)]
    p = HistoryPredictor(user="alice").fit(alice + mallory).predict(resnet[32], A100,
                                                                   Workload(batch_size=32))
    assert p.predictor == "history:exact"
    assert p.mem_mib >= mem * 0.98 and p.util_pct >= util - 1.0


def test_a_users_own_runs_answer_for_them_whatever_others_claim(resnet):
    """Cells only mallory filled (other batch sizes, another precision) neither bend alice's
    line nor stand in for her own graph tier."""
    own = [_run(resnet[b], b, *_site(b), user="alice") for b in (8, 64)]
    cheap = [_run(resnet[b], b, 600.0, 2.0, user="mallory") for b in (16, 32)]
    cheap += [_run(resnet[32], 32, 600.0, 2.0, user="mallory", precision="amp")]
    for w in (Workload(batch_size=32), Workload(batch_size=32, precision="amp")):
        alone = HistoryPredictor(user="alice").fit(own).predict(resnet[32], A100, w)
        mixed = HistoryPredictor(user="alice").fit(own + cheap).predict(resnet[32], A100, w)
        assert (mixed.mem_mib, mixed.util_pct, mixed.predictor) == (alone.mem_mib, alone.util_pct,
                                                                    alone.predictor), w
    # a user with no runs of the graph gets the site's evidence, guarded: mallory's cheap runs
    # (one user's) pull the line below the cold start, so the cold start answers, named so
    bob = HistoryPredictor(user="bob").fit(own + cheap).predict(resnet[32], A100, Workload(batch_size=32))
    cold = COLD.predict(resnet[32], A100, Workload(batch_size=32))
    assert (bob.predictor, bob.mem_mib, bob.util_pct) == ("cold-start", cold.mem_mib, cold.util_pct)
    fair = HistoryPredictor(user="bob").fit(own).predict(resnet[32], A100, Workload(batch_size=32))
    assert fair.predictor == "history:exact" and fair.mem_mib > cold.mem_mib  # alice's runs raise it


def test_sync_refreshes_the_history_hsubmit_reads(tmp_path, monkeypatch):
    """history.json had been written by retrain and import only (weekly as shipped), so a
    graph's runs served its reruns a week later, not a sync (15 min) after they ended."""
    from click.testing import CliRunner

    from slurm_horus.cli.admin import main as admin

    sacct = Path(__file__).resolve().parent / "fixtures" / "slurm-25.11" / "sacct_json_finished_gpu.stdout"
    models = tmp_path / "models"
    base = ["sync", "--all", "--from-file", str(sacct), "--json", "--model-dir", str(models)]

    def run(url, *extra):
        r = CliRunner().invoke(admin, [*base, "--ledger", f"sqlite:///{tmp_path}/{url}", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    assert run("a.db")["history"] is None and not models.exists()  # no registry: nothing made
    models.mkdir(mode=0o755)
    assert run("b.db", "--no-history")["history"] is None and not (models / "history.json").exists()
    res = run("c.db")
    assert res["recorded"] == 1 and res["history"]["path"] == str(models / "history.json")
    assert json.loads((models / "history.json").read_text())["graphs"] == {}
    from slurm_horus.cli import admin_ledger

    def broken(*a):
        raise RuntimeError("server gone away")

    monkeypatch.setattr(admin_ledger, "export_history", broken)
    res = run("d.db")  # the sync is recorded and reported; the history is a warning
    assert res["recorded"] == 1 and res["problems"] == ["history not refreshed: RuntimeError"]


def test_the_history_is_read_in_short_transactions(tmp_path):
    """sync rebuilds the history every period: one cursor over the whole ledger held SQLite's
    shared lock (writers such as the probe waited) for the whole build. Chunks return every row
    once, in order, across clusters."""
    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION
    from slurm_horus.ledger import Ledger, tables
    from slurm_horus.ledger.history_export import _in_chunks, ledger_runs

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    for cluster in ("b", "a"):
        for jid in range(1, 8):
            L.record_submission(job_id=jid, cluster=cluster, user="alice", model_sha256="ab" * 32,
                                features={n: 1.0 for n in FEATURE_NAMES}, feature_version=FEATURE_VERSION,
                                workload={"batch_size": 32, "task": "train"},
                                predictions={"a100-40gb": {"util_pct": 80.0, "mem_mib": 5000.0}})
            L.record_usage(job_id=jid, cluster=cluster, source="sacct", util_mean=50.0,
                           mem_peak_mib=5000.0 + jid + (100 if cluster == "b" else 0), gpu_index=0,
                           state="COMPLETED", elapsed_s=600, node="n1", gpu_type="a100-40gb")
    from sqlalchemy import select

    j = tables()["jobs"]
    stmt = select(j.c.cluster, j.c.job_id)
    for size in (1, 3, 7, 100):
        assert [tuple(r) for r in _in_chunks(L, stmt, j, size)] == \
            [(c, i) for c in ("a", "b") for i in range(1, 8)]
    assert sorted(r["mem"] for r in ledger_runs(L)) == [5000.0 + i + o for o in (0, 100) for i in range(1, 8)]


def test_one_other_users_runs_may_raise_a_newcomers_figures_never_lower_them(resnet):
    """A graph file is anyone's to name: its sole runner could run it starved (5 %, little
    memory) so that the next user's job is predicted light and packed tight.  One other user's
    runs can only raise a newcomer's figures; the runner's own reruns, two users' runs, or an
    admin's import (no user) answer as measured."""
    w = Workload(batch_size=32)
    cold = COLD.predict(resnet[32], A100, w)
    starved = _run(resnet[32], 32, 0.5 * cold.mem_mib, 5.0, user="mallory")
    heavy = _run(resnet[32], 32, 1.5 * cold.mem_mib, 99.0, user="mallory")

    def predict(runs, user, served="history:exact"):
        p = HistoryPredictor(user=user).fit(runs).predict(resnet[32], A100, w)
        assert p.predictor == served
        return p.mem_mib, p.util_pct

    # the guard leaves the cold start's figures, and says the cold start served (it had said
    # history:exact over them)
    assert predict([starved], "alice", "cold-start") == pytest.approx((cold.mem_mib, cold.util_pct))
    assert predict([starved], "mallory") == pytest.approx((0.5 * cold.mem_mib, 5.0))
    assert predict([heavy], "alice") == pytest.approx((1.5 * cold.mem_mib, 99.0))  # raising: kept
    both = [starved, dict(starved, user="bob")]
    assert predict(both, "alice") == pytest.approx((0.5 * cold.mem_mib, 5.0))
    assert predict([dict(starved, user=None)], "alice") == pytest.approx((0.5 * cold.mem_mib, 5.0))
    # honest runs of other settings (two users at batch 8, an import at 64) leave the setting
    # mallory alone ran guarded, in the exact and in the graph tier
    honest = [_run(resnet[8], 8, 2000.0, 40.0, user=u) for u in ("bob", "cy")] + \
        [_run(resnet[64], 64, 9000.0, 90.0, user=None)]
    assert predict([starved, *honest], "alice", "cold-start") == pytest.approx((cold.mem_mib, cold.util_pct))
    amp = dict(starved, prec="amp")
    p = HistoryPredictor(user="alice").fit([amp, *[dict(r, prec="amp") for r in honest]]).predict(
        resnet[32], A100, w)
    assert p.predictor == "cold-start" and p.mem_mib >= cold.mem_mib and p.util_pct >= cold.util_pct
    # where the site's offsets put the graph above the cold start, the floor is that answer
    site = [_run(resnet[b], b, COLD.predict(resnet[b], A100, Workload(batch_size=b)).mem_mib + 3000.0,
                 None, user=f"u{b}", family="other", sha=f"{b:064x}") for b in (8, 16, 64)]
    offset = HistoryPredictor(user="alice").fit(site).predict(resnet[32], A100, w).mem_mib
    assert offset > cold.mem_mib + 2000.0
    assert predict([starved, *site], "alice", "cold-start")[0] == pytest.approx(offset)
    # the count of users travels in history.json and is checked there
    h = HistoryPredictor(user="alice").fit(both)
    again = HistoryPredictor.from_dict(json.loads(json.dumps(h.to_dict())), user="alice")
    assert again.predict(resnet[32], A100, w).util_pct == pytest.approx(5.0)
    bad = h.to_dict()
    next(iter(bad["graphs"].values()))[0]["users"] = 0
    from slurm_horus.errors import HorusError
    with pytest.raises(HorusError, match="users"):
        HistoryPredictor.from_dict(bad)


def test_a_sequence_as_long_as_the_batch_is_no_batch_dimension():
    """The batch dimension was told by its value: runs of BERT at (64, 64) and (128, 128) shared
    the key of "no other dimension", and a job at (512, 512) was answered as their exact
    history, at a third of its memory."""
    bert = ZOO / "bert_base.onnx"
    gpu = get_gpu("a100-80gb")

    def run(b, s):
        r = extract_features(bert, batch_size=b, dims={"seq": s})
        c = COLD.predict(r, gpu, Workload(batch_size=b))
        return {"sha": r.sha256, "gpu": gpu.name, "bs": b, "task": "train", "opt": "adam",
                "prec": "fp32", "dims": dims_key({"seq": s}, b), "mem": c.mem_mib,
                "util": c.util_pct, "cold_mem": c.mem_mib, "cold_util": c.util_pct,
                "family": "bert", "user": "alice"}
    h = HistoryPredictor(user="alice").fit([run(64, 64), run(128, 128)])
    big = extract_features(bert, batch_size=512, dims={"seq": 512})
    p = h.predict(big, gpu, Workload(batch_size=512))
    cold = COLD.predict(big, gpu, Workload(batch_size=512))
    assert p.predictor != "history:exact" and p.mem_mib >= 0.9 * cold.mem_mib
    assert dims_key({"batch": 64, "seq": 64}, 64) == "seq=64" and dims_key({"x[0]": 8, "seq": 8}, 8) == "seq=8"
    # a name an exporter made up, bound by position to the batch size, is the batch dimension
    assert dims_key({"s0": 64, "s1": 128}, 64) == "s1=128" == dims_key({"s0": 32, "s1": 128}, 32)
    assert dims_key({"unk__12": 32}, 32) == "" == dims_key({"input_dynamic_axes_1": 8}, 8)
    # the same sequence length is the same setting: an exact answer
    again = extract_features(bert, batch_size=128, dims={"seq": 128})
    assert h.predict(again, gpu, Workload(batch_size=128)).predictor == "history:exact"


def test_two_noisy_runs_do_not_flatten_the_extrapolation(resnet):
    """The larger batch measured lower (GPUMemNet has 119 such pairs): the line through them was
    drawn flat, and four times their batch was given the smaller batch's memory."""
    noisy = [_run(resnet[8], 8, _site(8)[0] + 2000, _site(8)[1], user="bob"),
             _run(resnet[16], 16, *_site(16), user="bob")]  # bob's own runs: his exact history
    p = HistoryPredictor(user="bob").fit(noisy).predict(resnet[64], A100, Workload(batch_size=64))
    truth = _site(64)[0]
    assert p.predictor == "history:exact" and abs(p.mem_mib - truth) / truth < 0.25
    assert p.mem_mib > _site(8)[0] + 2000 + 1000  # well above the flat line


def test_a_correction_from_too_few_users_may_raise_figures_never_lower_them():
    """One user's two graphs run at 0.3x the cold start (inference submitted as training) had set
    an a100 offset of -21 GB: every other user's prediction halved.  Two users' files named
    resnet50_* had pulled every resnet50 down.  Three users' evidence may lower."""
    def run(i, user, mem, family="other"):
        return {"sha": f"{i:064x}", "gpu": "a100-40gb", "bs": 8, "task": "train", "opt": "adam",
                "prec": "fp32", "dims": "", "mem": mem, "util": 30.0, "cold_mem": 12000.0,
                "cold_util": 60.0, "user": user, "family": family}
    low = [run(i // 2, "mallory", 3600.0, "resnet50") for i in range(4)]
    h = HistoryPredictor().fit(low)
    off = h.offsets["a100-40gb"]["cold-start"]
    assert off["mem_mib"] == 0.0 and off["util_pp"] == 0.0
    fam = h.families["a100-40gb"]["resnet50"]
    assert fam["mem_log_ratio"] == 0.0 and fam["util_shift"] == 0.0
    # raising needs no quorum: one user's graphs above the cold start still raise
    high = HistoryPredictor().fit([run(i // 2, "alice", 15000.0) for i in range(4)])
    assert high.offsets["a100-40gb"]["cold-start"]["mem_mib"] > 2000
    # three users' graphs alike may lower
    three = HistoryPredictor().fit([run(i, f"u{i % 3}", 9000.0 + 10 * i, "resnet50") for i in range(6)])
    assert three.offsets["a100-40gb"]["cold-start"]["mem_mib"] < -2000
    assert three.families["a100-40gb"]["resnet50"]["mem_log_ratio"] < 0
    # the admin's imports (no user: calibration runs) are trusted alone, but not beside one user
    admin = HistoryPredictor().fit([run(i // 2, None, 3600.0) for i in range(4)])
    assert admin.offsets["a100-40gb"]["cold-start"]["mem_mib"] < -2000
    mixed = HistoryPredictor().fit([run(10 + i // 2, None, 11000.0) for i in range(4)] + low)
    assert mixed.offsets["a100-40gb"]["cold-start"]["mem_mib"] == 0.0
    # nor do the admin's imports count as a third user beside two
    eve = [run(20 + i // 2, "eve", 3600.0, "resnet50") for i in range(4)]
    two = HistoryPredictor().fit([run(10 + i // 2, None, 12000.0) for i in range(4)] + low + eve)
    assert two.offsets["a100-40gb"]["cold-start"]["mem_mib"] == 0.0
    assert two.families["a100-40gb"]["resnet50"]["mem_log_ratio"] == 0.0


def test_no_offset_and_no_pool_is_no_site_correction():
    """exp(log(x)) is not always x: a history with nothing for this GPU type labelled the base
    predictor's own figures "+ site offsets"."""
    h = HistoryPredictor(user="bob").fit([])
    for name in ("resnet50", "mobilenet_v2", "small_cnn"):
        for b in (1, 3, 7, 32, 100):
            report = extract_features(ZOO / f"{name}.onnx", batch_size=b)
            p = h.predict(report, A100, Workload(batch_size=b))
            c = COLD.predict(report, A100, Workload(batch_size=b))
            assert "site offsets" not in p.confidence and p.mem_mib == pytest.approx(c.mem_mib, rel=1e-9)


def test_a_registry_folder_named_on_purpose_that_is_missing_is_said(tmp_path, monkeypatch):
    # --horus-model-dir /nonexistent had gone unnoticed: the cold start served in silence
    from slurm_horus.predict import registry
    from slurm_horus.predict.chain import choose_predictor

    monkeypatch.delenv("HORUS_MODEL_DIR", raising=False)
    assert "no such folder" in choose_predictor(tmp_path / "typo").warning
    monkeypatch.setattr(registry, "DEFAULT_DIR", tmp_path / "not-made-yet")  # the site's, before a retrain
    assert "no such folder" not in (choose_predictor().warning or "")
    monkeypatch.setenv("HORUS_MODEL_DIR", str(tmp_path / "not-made-either"))
    assert "no such folder" not in (choose_predictor().warning or "")
    assert choose_predictor(tmp_path).warning is None  # a folder, empty: the cold start, no warning
    assert "no such folder" not in (choose_predictor("").warning or "")  # an unset variable: the site's
    # a name that cannot even be looked at is no folder either: a warning, never an OSError
    assert choose_predictor(tmp_path / ("a" * 300)).warning


def _sweep(batches, noise: int = 0) -> list[dict]:
    """One graph's runs at each batch size, one job each, memory a line (plus some noise)."""
    return [{"sha": "ab" * 32, "gpu": A100.name, "bs": b, "task": "train", "opt": "adam",
             "prec": "fp32", "dims": "", "mem": 2000.0 + 10 * b + (b * 37 % noise if noise else 0),
             "util": 50.0, "cold_mem": 2100.0 + 10 * b, "cold_util": 55.0, "user": "u", "family": "f"}
            for b in batches]


def test_the_margins_of_a_graph_of_thousands_of_batch_sizes_take_no_time(monkeypatch):
    """Leaving each run of a graph out compared it with all the others: a graph measured at 2000
    batch sizes (one user's sweep) took every export 12 s, 10,000 of them minutes; the margins
    of a graph of no more than MAX_MARGIN_RUNS runs are what they were."""
    import time

    from slurm_horus.predict import history

    t0 = time.monotonic()
    h = HistoryPredictor().fit(_sweep(range(1, 2001)))
    # (one user's runs: a margin that may raise the base predictor's p90, never lower it)
    assert time.monotonic() - t0 < 3 and h.raise_margins["exact"] == pytest.approx(0.0, abs=1e-9)
    normal = _sweep(range(1, 61), noise=50)
    bounded = HistoryPredictor().fit(normal).raise_margins
    monkeypatch.setattr(history, "MAX_MARGIN_RUNS", 10**9)
    assert HistoryPredictor().fit(normal).raise_margins == bounded and bounded["exact"] > 0
    # beyond it, the settings most run are the ones left out, in their order
    runs = [dict(r, n=3 if r["bs"] % 10 == 0 else 1) for r in _sweep(range(1, 21))]
    assert [r["bs"] for r in history._most_run(runs, 4)] == [1, 2, 10, 20]


def test_a_history_answer_is_never_below_a_bare_cuda_context():
    """The history format takes a run of 0.001 MiB: its history:exact answer was 0 MiB (a hint
    of 0 MiB); no GPU job peaks below a bare CUDA context (BARE_CONTEXT_MIB)."""
    h = HistoryPredictor(user="u").fit([dict(r, mem=0.001) for r in _sweep([8])])
    a = h.estimate("ab" * 32, A100.name, Workload(batch_size=8), "", 2180.0, 55.0, None, "u",
                   2180.0, 55.0, "cold-start")
    assert a.tier == "exact" and a.mem_mib == 512.0


@pytest.mark.parametrize("offset", [-300.0, 900.0])
def test_a_graphs_runs_are_moved_on_the_sites_own_baseline(resnet, offset):
    """A site whose jobs all peak ``offset`` MiB from the cold start: a graph measured at one
    setting is predicted at another as the cold start there + offset. The cold start's figures
    had been scaled over the site's fixed cost (the cold start's + offset): at -300 MiB a job
    the site runs at 10 GB was predicted at 4 GB, and packed as one."""
    def measured(report, b, sha=None, **workload):
        run = _run(report, b, 0.0, 50.0, user=None, sha=sha, **workload)
        return dict(run, mem=run["cold_mem"] + offset)

    runs = [measured(resnet[8], 8)] + [measured(resnet[b], b, sha="f" * 64) for b in (8, 16, 32)]
    h = HistoryPredictor(user="bob").fit(runs)
    assert h.offsets["a100-40gb"]["cold-start"]["mem_mib"] == pytest.approx(offset)
    # (the settings an answer may be scaled from: graph one's run at 8, graph two's at 8-32)
    for b, workload, tier, froms in ((64, {}, "exact", (8,)), (32, {"precision": "amp"}, "graph", (8, 16, 32))):
        w = Workload(batch_size=b, **workload)
        p = h.predict(resnet[b], A100, w)
        assert p.predictor == f"history:{tier}"
        # the site's figure, or above it by what reading the offset as a proportion adds (the
        # larger of the two readings is taken: which one a site's offset is its runs do not say)
        cq = COLD.predict(resnet[b], A100, w).mem_mib
        truth = cq + offset
        c0s = [COLD.predict(resnet[b0], A100, Workload(batch_size=b0)).mem_mib for b0 in froms]
        most = max([truth] + [(c0 + offset) * cq / c0 for c0 in c0s])
        assert truth * (1 - 1e-6) <= p.mem_mib <= most * (1 + 1e-6), (offset, tier)


@pytest.mark.parametrize("factor", [0.75, 0.88, 1.2])
def test_a_site_that_differs_from_the_cold_start_in_proportion_is_not_predicted_short(resnet, factor):
    """A regression review: a site whose jobs all peak at ``factor`` x the cold start (an offset
    that is a proportion, not a fixed amount) had a graph measured at batch 32 predicted at
    batch 8 up to 37 % short of what it uses, by the fixed-amount reading alone."""
    def measured(report, b, sha=None):
        run = _run(report, b, 0.0, 50.0, user=None, sha=sha)
        return dict(run, mem=run["cold_mem"] * factor)

    runs = [measured(resnet[32], 32)] + [measured(resnet[b], b, sha="e" * 64) for b in (8, 16, 32)]
    h = HistoryPredictor(user="bob").fit(runs)
    for b in (8, 16, 64):
        w = Workload(batch_size=b)
        p = h.predict(resnet[b], A100, w)
        assert p.predictor == "history:exact"
        assert p.mem_mib >= COLD.predict(resnet[b], A100, w).mem_mib * factor * (1 - 1e-6), (b, p.mem_mib)


def test_a_cold_start_figure_below_a_bare_cuda_context_is_refused(tmp_path):
    """The format took a run's cold-start memory down to 0.001 MiB: one run at 16 TiB scaled by
    it made history:exact 8.5e13 MiB, past what a hint carries, and hsubmit dropped the hint."""
    from slurm_horus.errors import HorusError

    run = dict(_sweep([16])[0], mem=2.0**24, cold_mem=0.001)
    with pytest.raises(HorusError, match="cold-start memory"):
        HistoryPredictor().fit([run])
    stored = HistoryPredictor().fit(_sweep([16])).to_dict()
    stored["graphs"]["ab" * 32][0]["cold_mem"] = 511.0
    with pytest.raises(HorusError, match="cold-start memory 511.0"):
        HistoryPredictor.from_dict(stored)
    stored["graphs"]["ab" * 32][0]["cold_mem"] = 512.0
    assert HistoryPredictor.from_dict(stored).graphs


def test_a_tier_answer_past_what_the_hint_carries_is_no_answer():
    """A line through two runs (the second at 16 TiB) reached 10^12 MiB at a large batch: the
    next tier answers (here the graph's amp run), else the base predictor."""
    from slurm_horus.predict.history_format import MAX_LOG_RATIO
    from slurm_horus.slurm.hint import MAX_MEM_MIB

    line = [dict(r, user=None) for r in _sweep([8, 16])]
    line[1]["mem"] = 2.0**24
    amp = dict(line[0], prec="amp")
    w = Workload(batch_size=2**20)
    for runs, tier in ((line + [amp], "graph"), (line, None)):
        a = HistoryPredictor(user="u").fit(runs).estimate(
            "ab" * 32, A100.name, w, "", 2e6, 55.0, None, "u", 4e4, 55.0, "cold-start")
        assert a.tier == tier and a.mem_mib * math.exp(MAX_LOG_RATIO) < MAX_MEM_MIB
    assert a.mem_mib == pytest.approx(4e4)  # the base predictor's figure
    from slurm_horus.predict.history import MAX_ANSWER_MIB

    assert MAX_ANSWER_MIB * math.exp(MAX_LOG_RATIO) < MAX_MEM_MIB  # the widest p90 a tier takes


def _measured_job(jid: int, user: str, sha: str, bs: int, end: float, mem: float) -> tuple[dict, dict]:
    """(submission, usage) of a finished job of graph ``sha`` measured on an A100 by sacct."""
    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION

    sub = {"job_id": jid, "cluster": "c", "user": user, "model_sha256": sha,
           "features": {f: 1.0 for f in FEATURE_NAMES}, "feature_version": FEATURE_VERSION,
           "workload": {"batch_size": bs, "task": "train"}, "gpu_types": ["a100-40gb"],
           "predictions": {"a100-40gb": {"util_pct": 50.0, "mem_mib": 5000.0, "cold": {
               "util_pct": 50.0, "mem_mib": 5000.0}}}}
    use = {"job_id": jid, "cluster": "c", "source": "sacct", "util_mean": 50.0,
           "mem_peak_mib": mem, "gpu_type": "a100-40gb", "state": "COMPLETED",
           "elapsed_s": 600, "start_time": end - 600, "end_time": end}
    return sub, use


def _export_at_half_size(L, tmp_path, monkeypatch):
    """(export_history's result, the registry, the cap): the ledger's history exported under a
    size cap of half its whole export."""
    from slurm_horus.ledger.history_export import build_history, export_history
    from slurm_horus.predict import registry as registry_mod

    cap = len(json.dumps(build_history(L), separators=(",", ":"))) // 2
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_BYTES", cap)
    reg = Registry(tmp_path / "models")
    return export_history(L, reg), reg, cap


def test_a_history_over_the_size_cap_keeps_the_newest_runs(tmp_path, monkeypatch):
    """A site whose export outgrew the 32 MiB readers take had its history.json refused at
    every sync, for good (the ledger only grows): the export now leaves out the oldest runs
    (by when the job ended, not by job id) until it fits, and says how many."""
    from slurm_horus.ledger import Ledger

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    n = 60
    jobs = [_measured_job(jid, f"user{jid % 7}", f"{jid:064x}", 32,  # a graph of its own each
                          1700000000 + 1000 * (n - jid), 5000.0 + jid)  # the highest ids ended first
            for jid in range(1, n + 1)]
    L.record_runs([sub for sub, _ in jobs], [use for _, use in jobs])
    res, reg, cap = _export_at_half_size(L, tmp_path, monkeypatch)
    path = tmp_path / "models" / "history.json"
    assert path.stat().st_size <= cap
    shas = set(json.loads(path.read_text())["graphs"])
    assert res["runs_dropped"] > 0 and res["runs"] == len(shas) == n - res["runs_dropped"]
    assert res["measured_runs"] == n
    newest = {f"{jid:064x}" for jid in range(1, len(shas) + 1)}
    assert shas == newest  # the newest runs, none of the oldest
    assert f"{n:064x}" not in shas
    assert reg.load_history()["graphs"].keys() == shas


def _margin_run(graph: str, user: str | None, bs: int, mem: float) -> dict:
    import hashlib

    return {"sha": hashlib.sha256(graph.encode()).hexdigest(), "gpu": A100.name, "bs": bs,
            "task": "train", "opt": "adam", "prec": "fp32", "dims": "", "mem": mem,
            "util": 50.0, "cold_mem": 1000.0 + 100 * bs, "cold_util": 50.0, "family": graph,
            "user": user}


def _noisy(users, graphs: int = 4) -> list[dict]:
    """Honest users' graphs, each measured at 4 batch sizes with -20..+30 % noise."""
    import random

    rng = random.Random(1)
    return [_margin_run(f"{u}{g}", u, bs, (1500 + 120 * bs) * rng.uniform(0.8, 1.3))
            for u in users for g in range(graphs) for bs in (8, 16, 32, 64)]


def _exact(user, graphs: int = 30, prefix: str = "m") -> list[dict]:
    """One user's graphs of memory exactly linear in batch size (her own process sets it)."""
    return [_margin_run(f"{prefix}{g}", user, bs, 1500 + 120 * bs)
            for g in range(graphs) for bs in (8, 16, 32, 64)]


class _Base:
    """A base predictor whose p90 is 1.3x its memory."""
    name = "cold-start"

    def predict(self, report, gpu, workload):
        mem = 1000.0 + 100 * workload.batch_size
        return Prediction(gpu=gpu.name, util_pct=50.0, mem_mib=mem, mem_mib_p90=1.3 * mem,
                          predictor="cold-start")


def _p90_ratio(h: HistoryPredictor, graph: str, user: str) -> float:
    import hashlib
    from types import SimpleNamespace

    h.base, h.user = _Base(), user
    report = SimpleNamespace(sha256=hashlib.sha256(graph.encode()).hexdigest(), given_dims={},
                             model=None)
    p = h.predict(report, A100, Workload(batch_size=16))
    assert p.predictor == "history:exact"
    return p.mem_mib_p90 / p.mem_mib


def test_one_users_runs_cannot_narrow_everyones_p90_margin():
    """The leave-one-out residuals behind each tier's p90 were pooled over every graph: one
    user's 30 graphs of memory exactly linear in batch size took the exact tier's margin of
    three honest users' graphs from +17.8 % to +2.4 %, every history prediction's p90 (the
    honest users' own reruns included), and the hook packed tighter. Each user's residuals
    now weigh one user, and a margin from fewer than MIN_LOWERING_USERS users may raise the
    base predictor's p90 ratio, never lower it."""
    honest = _noisy(("alice", "bob", "carol"))
    fair = HistoryPredictor().fit(honest).margins["exact"]
    assert fair > 0.12
    flooded = HistoryPredictor().fit(honest + _exact("mallory")).margins["exact"]
    assert flooded > 0.85 * fair  # one user of four: her share, not the whole quantile
    assert _p90_ratio(HistoryPredictor().fit(honest + _exact("mallory")), "alice0", "alice") \
        == pytest.approx(math.exp(flooded))

    # fewer than three users: the base predictor's p90 ratio (1.3) stands, or a wider one
    for runs in (_exact("mallory"), _noisy(("alice",)) + _exact("mallory")):
        h = HistoryPredictor().fit(runs)
        assert "exact" not in h.margins and "exact" in h.raise_margins
        assert _p90_ratio(h, "m0", "mallory") == pytest.approx(1.3)
        again = HistoryPredictor.from_dict(json.loads(json.dumps(h.to_dict())))
        assert again.raise_margins == h.raise_margins and not again.margins
    wide = [dict(r, mem=r["mem"] * (1.6 if r["bs"] == 32 else 1.0)) for r in _exact("mallory")]
    h = HistoryPredictor().fit(wide)
    assert math.exp(h.raise_margins["exact"]) > 1.3
    assert _p90_ratio(h, "m0", "mallory") == pytest.approx(math.exp(h.raise_margins["exact"]))
    # the admin's imports (calibration, no user) are trusted to narrow it alone
    h = HistoryPredictor().fit(_exact(None))
    assert h.margins["exact"] == pytest.approx(0.0, abs=1e-9)

    # runs of her own at batch sizes around another user's only run of a graph, matching it,
    # make that run's residual hers to set: such residuals may raise a margin, never lower it
    lone = [_margin_run(f"d{g}", "dave", 16, 3420.0 * (1.3 if g % 2 else 0.9)) for g in range(20)]
    inject = [_margin_run(f"d{g}", "mallory", bs, r["mem"] - 3420.0 + 1500 + 120 * bs)
              for g, r in enumerate(lone) for bs in (8, 32)]
    base = HistoryPredictor().fit(honest + _exact("mallory") + lone).margins["exact"]
    assert HistoryPredictor().fit(honest + _exact("mallory") + lone + inject).margins["exact"] \
        >= base - 1e-12


def test_one_users_flood_of_new_settings_cannot_push_the_others_out_of_the_history(tmp_path, monkeypatch):
    """An export over the size cap kept the newest runs of the site: one user's array jobs of
    new batch sizes, the newest, pushed every other user's runs out of history.json (their
    reruns lost their history:exact answers). Each user's newest runs are kept; the users with
    the most settings lose their oldest first; the admin's imports (no user) go last."""
    from slurm_horus.ledger import Ledger

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    jobs = []

    def job(jid, user, sha, bs, end):
        jobs.append(_measured_job(jid, user, sha, bs, end, 5000.0 + bs))

    honest = {}
    for k, user in enumerate(("alice", "bob", "carol", "dave")):
        for g in range(3):  # three graphs each, run long ago
            sha = f"{k:032x}{g:032x}"
            honest[sha] = user
            job(100 * k + g + 1, user, sha, 32, 1_600_000_000 + 10 * (100 * k + g))
    flood = 120  # then one user's sweep: a batch size of its own each, every job the newest
    for b in range(1, flood + 1):
        job(10_000 + b, "mallory", "ee" * 32, b, 1_700_000_000 + b)
    L.record_runs([sub for sub, _ in jobs], [use for _, use in jobs])
    res, reg, cap = _export_at_half_size(L, tmp_path, monkeypatch)
    assert (tmp_path / "models" / "history.json").stat().st_size <= cap
    graphs = reg.load_history()["graphs"]
    assert res["runs_dropped"] > 0 and set(honest) <= set(graphs)  # every other user's runs
    kept = sorted(r["bs"] for r in graphs["ee" * 32])
    assert 0 < len(kept) == flood - res["runs_dropped"]
    assert kept == list(range(flood - len(kept) + 1, flood + 1))  # hers: her newest

    # the order runs are kept in: the admin's imports, then the users' turns, newest first
    from slurm_horus.ledger.history_export import _fair_order

    runs = [{"sha": "ab" * 32, "gpu": "g", "task": "train", "opt": "adam", "prec": "fp32",
             "dims": "", "bs": b, "user": u} for b, u in
            [(1, None), (2, "m"), (3, "m"), (4, "m"), (5, "a"), (6, "m"), (7, "b"), (8, None)]]
    times = [0, 9, 8, 7, 1, 6, 2, 0]
    assert [runs[i]["bs"] for i in _fair_order(runs, times)] == [8, 1, 2, 7, 5, 3, 4, 6]


def test_a_graph_whose_batch_dimension_has_an_authors_name_is_found_by_its_exact_runs(tmp_path):
    """An input [images, 16]: the batch size binds `images` by position, and bound_dims says
    images=32.  The prediction had keyed the runs by it, the history export by what the job's
    record stores (its --dim bindings: none), so the job's own measured runs never answered
    as history:exact."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parent))
    from graphs import mlp

    path = mlp(tmp_path / "m.onnx", batch="images")
    reports = {b: extract_features(path, batch_size=b) for b in (8, 32, 128)}
    assert reports[32].bound_dims == {"images": 32}
    runs = []
    for b in (8, 32, 128):
        w = Workload(batch_size=b)
        c = COLD.predict(reports[b], A100, w)
        runs.append({"sha": reports[b].sha256, "gpu": A100.name, "bs": b, "task": w.task,
                     "opt": w.optimizer, "prec": w.precision,
                     "dims": dims_key({}, b),  # as history_export keys it: the stored --dims
                     "mem": 3000.0 + b, "util": 40.0, "cold_mem": c.mem_mib,
                     "cold_util": c.util_pct, "family": "mlp", "user": "alice"})
    p = HistoryPredictor(user="bob").fit(runs).predict(reports[32], A100, Workload(batch_size=32))
    assert p.predictor == "history:exact" and abs(p.mem_mib - 3032.0) < 0.02 * 3032.0
