"""Predictors against hostile and edge inputs (review 6): report values that are not finite
sizes, GPU catalog figures past any GPU's, batch sizes past any dimension, and a history whose
offsets and pools, each within its format, add up past what a hint can carry."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.chain import PredictorChoice, predict_for
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import Catalog, get_gpu
from slurm_horus.predict.history import MAX_ANSWER_MIB, HistoryPredictor
from slurm_horus.slurm.submit import _hint_of

ZOO = Path(__file__).parent / "data" / "zoo"
PACKAGED = json.loads((Path(__file__).parent.parent / "slurm_horus" / "data" / "gpus.json").read_text())
A100_ENTRY = next(e for e in (PACKAGED["gpus"] if isinstance(PACKAGED, dict) else PACKAGED)
                  if e["name"] == "a100-40gb")


@pytest.fixture(scope="module")
def resnet():
    return extract_features(ZOO / "resnet50.onnx", batch_size=32)


def _with(report, **values):
    return dataclasses.replace(report, values={**report.values, **values})


@pytest.mark.parametrize("name", ["params", "saved_activation_bytes", "max_activation_bytes",
                                  "peak_live_bytes", "input_bytes", "quantized_params"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0,
                                   pytest.param(10**400, id="10**400")])
def test_the_cold_start_refuses_a_value_that_is_no_size_never_answers_nan(resnet, name, value):
    """A stored report (a ledger row) with NaN, infinity, a negative size or an integer past a
    float's range had given NaN or negative memory (which the hint cannot carry and the
    learned model's log refused with a ValueError) or an OverflowError: a one-line HorusError."""
    if name == "quantized_params" and value == -1.0:
        pytest.skip("a quantized count out of range is clamped, as it always was")
    for task in ("train", "infer"):
        with pytest.raises(HorusError, match=f"feature {name} = "):
            ColdStartEstimator().predict(_with(resnet, **{name: value}), get_gpu("a100"),
                                         Workload(batch_size=32, task=task))


def test_valid_reports_predict_as_before(resnet):
    """The checks change no valid prediction (the figures of resnet50, batch 32, A100)."""
    p = ColdStartEstimator().predict(resnet, get_gpu("a100"), Workload(batch_size=32))
    ints = _with(resnet, **{k: int(v) for k, v in resnet.values.items()
                            if isinstance(v, float) and v.is_integer()})
    q = ColdStartEstimator().predict(ints, get_gpu("a100"), Workload(batch_size=32))
    assert (p.mem_mib, p.util_pct) == (q.mem_mib, q.util_pct)
    assert 0 < p.util_pct <= 99 and p.mem_mib > 1535


@pytest.mark.parametrize("field,value", [
    ("fp32_tflops", 5e-324),   # every utilization NaN
    ("mem_bw_gbs", 1e-300),
    ("fp16_tflops", 1e300),
    ("mem_bw_gbs", 1.7e308),
    pytest.param("sm_count", 10**308, id="sm_count-10**308"),  # OverflowError: a traceback
    pytest.param("sm_count", 10**30, id="sm_count-10**30"),    # a 2e30 MiB context
    pytest.param("mem_mib", 10**300, id="mem_mib-10**300"),
])
def test_a_catalog_figure_past_any_gpus_is_refused_when_read(field, value):
    entry = dict(A100_ENTRY, name="odd", aliases=[], **{field: value})
    with pytest.raises(HorusError, match=f"odd: '{field}' must be at"):
        Catalog.from_entries([entry])


def test_the_packaged_catalog_is_within_the_ranges():
    assert len(Catalog.load(site_file=None, environ={})) >= 30


def test_a_gpu_whose_figures_give_no_finite_answer_is_an_error_not_nan(resnet):
    """Past the catalog's checks (a GPU made in code): the cold start says so instead of a
    NaN utilization."""
    odd = dataclasses.replace(get_gpu("a100"), fp32_tflops=5e-324, tf32_tflops=5e-324)
    with pytest.raises(HorusError, match="no finite prediction"):
        ColdStartEstimator().predict(resnet, odd, Workload(batch_size=32))


@pytest.mark.parametrize("batch", [2**31, pytest.param(10**400, id="10**400"), True])
def test_a_batch_size_past_any_dimension_is_refused(batch):
    with pytest.raises(HorusError, match="batch size must be an integer from 1 to"):
        Workload(batch_size=batch)


def _history(resnet, **extra):
    est = ColdStartEstimator()
    runs = []
    for user in ("alice", "bob", "carol"):
        for bs in (16, 32):
            c = est.predict(resnet, get_gpu("a100"), Workload(batch_size=bs))
            runs.append(dict(sha=resnet.sha256, gpu="a100-40gb", bs=bs, task="train", opt="adam",
                             prec="fp32", dims="", mem=c.mem_mib * 1.2, util=80.0,
                             cold_mem=c.mem_mib, cold_util=c.util_pct, family="resnet50",
                             user=user))
    d = json.loads(json.dumps(HistoryPredictor().fit(runs).to_dict()))
    d.update(extra)
    return HistoryPredictor.from_dict(d, base=est, user="alice")


def test_the_largest_batch_size_reaches_the_history_and_gets_a_bounded_answer(resnet):
    p = _history(resnet).predict(resnet, get_gpu("a100"), Workload(batch_size=2**31 - 1))
    assert math.isfinite(p.mem_mib) and 0 < p.mem_mib <= MAX_ANSWER_MIB
    assert 0 <= p.util_pct <= 100


def test_offsets_and_pools_past_what_a_hint_carries_leave_the_base_predictor(resnet):
    """A history within its format (a memory offset of 16 TiB, a family pool at 20x) had put
    124 million MiB in the A100's prediction: no hint carries that, and hsubmit dropped the
    hint of every GPU type, the T4's sane figures too."""
    h = _history(resnet, graphs={},
                 offsets={"a100-40gb": {"cold-start": {"mem_mib": 2.0**24, "util_pp": 0, "n": 5}}},
                 families={"a100-40gb": {"resnet50": {"mem_log_ratio": math.log(20),
                                                      "util_shift": 0, "n": 1000}}})
    report = dataclasses.replace(resnet, model=str(ZOO / "resnet50.onnx"))
    a100, t4 = predict_for(report, [get_gpu("a100"), get_gpu("t4")], Workload(batch_size=32),
                           PredictorChoice(h, ""))
    cold = ColdStartEstimator().predict(report, get_gpu("a100"), Workload(batch_size=32))
    assert a100.predictor == "cold-start" and a100.mem_mib == pytest.approx(cold.mem_mib)
    assert _hint_of({"a100": a100, "t4": t4}).startswith("horus:v1;a100=")


def test_an_offset_within_reach_still_corrects(resnet):
    h = _history(resnet, graphs={}, families={}, users={},
                 offsets={"a100-40gb": {"cold-start": {"mem_mib": 1000.0, "util_pp": 0, "n": 5}}})
    p = h.predict(resnet, get_gpu("a100"), Workload(batch_size=32))
    cold = ColdStartEstimator().predict(resnet, get_gpu("a100"), Workload(batch_size=32))
    assert p.mem_mib == pytest.approx(cold.mem_mib + 1000.0)


def test_a_site_catalog_that_cannot_be_looked_at_is_a_one_line_error(tmp_path):
    """Path.is_file() raises for errors other than a missing file (a folder the user may not
    search, EACCES; a name too long): that had escaped as an OSError (hsubmit: "internal
    error: PermissionError")."""
    with pytest.raises(HorusError, match="GPU catalog .*: File name too long"):
        Catalog.load(site_file=tmp_path / ("x" * 300) / "gpus.json", environ={})
    assert len(Catalog.load(site_file=tmp_path / "none.json", environ={})) >= 30


def test_a_feature_past_a_float_gets_the_cold_start_from_the_learned_estimator(resnet):
    """A value the cold start does not read (flops) as an integer past a float's range had
    raised OverflowError out of the learned estimator (hsubmit: "internal error")."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_predict import _training_set
    from slurm_horus.predict.learned import LearnedEstimator, train_holdout

    rows, mem, util, cold, _ = _training_set()
    model, _ = train_holdout(rows, mem, util, cold, test_fraction=0.25, seed=0, max_iter=30)
    est = LearnedEstimator(model, "v0001")
    p = est.predict(_with(resnet, flops=10**400), get_gpu("a100"), Workload(batch_size=32))
    cold_p = ColdStartEstimator().predict(resnet, get_gpu("a100"), Workload(batch_size=32))
    assert p.predictor == "cold-start" and p.mem_mib == cold_p.mem_mib
    assert "unlike the training data" in p.confidence
