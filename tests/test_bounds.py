"""Calibrated bounds: the registry's calibration.json (written by retrain) sets the p90/p95/p99
memory and the utilization upper bound of whatever predictor answered, and reaches the hint."""

import json
import math
from pathlib import Path

import pytest

from slurm_horus.predict.coldstart import Workload
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.gpus import default_catalog
from slurm_horus.slurm.hint import parse_hint
from slurm_horus.predict.chain import choose_predictor, predict_for
from slurm_horus.slurm.submit import _hint_of

ZOO = Path(__file__).resolve().parent / "data" / "zoo"
Q = {"mem_log_q": {"0.9": 0.2, "0.95": 0.3, "0.99": 0.5}, "util_q": {"0.9": 12.0}, "n": 200}


def predict(models, gpu="a100"):
    report = extract_features(ZOO / "resnet50.onnx", batch_size=32)
    choice = choose_predictor(models)
    return choice, predict_for(report, [default_catalog().find(gpu)],
                               Workload(batch_size=32), choice)[0]


def write(models, quantiles):
    models.mkdir(exist_ok=True)
    (models / "calibration.json").write_text(json.dumps(
        {"version": 1, "model": None, "quantiles": quantiles}))


def test_calibration_sets_the_bounds_and_the_hint_carries_them(tmp_path):
    models = tmp_path / "models"
    _, own = predict(models)  # no calibration yet: the cold start's own p90
    write(models, {"*": {"cold-start": Q}})
    choice, p = predict(models)
    assert choice.warning is None and p.predictor == "cold-start"
    assert p.mem_mib == own.mem_mib
    assert p.mem_mib_p90 == pytest.approx(own.mem_mib * math.exp(0.2))
    assert p.mem_mib_p99 == pytest.approx(own.mem_mib * math.exp(0.5))
    assert p.util_pct_p90 == pytest.approx(min(own.util_pct + 12, 100))
    u, m, p90, p95, p99 = parse_hint(_hint_of({"a100": p}))["a100"]
    assert m < p90 < p95 < p99 and p99 >= p.mem_mib_p99 - 1


def test_the_gpu_types_own_entry_wins_over_the_pooled_one(tmp_path):
    models = tmp_path / "models"
    _, own = predict(models)
    tight = {**Q, "mem_log_q": {"0.9": 0.05}}
    write(models, {"*": {"cold-start": Q}, "a100-40gb": {"cold-start": tight}})
    _, p = predict(models)
    assert p.mem_mib_p90 == pytest.approx(own.mem_mib * math.exp(0.05))
    assert p.mem_mib_p95 is None  # that type's entry has no p95: none is claimed


@pytest.mark.parametrize("bad", [
    {"*": {"cold-start": {**Q, "mem_log_q": {"0.9": 50}}}},
    {"*": {"cold-start": {**Q, "mem_log_q": {"0.5": 0.1}}}},
    {"*": {"cold-start": {"util_q": {}}}},
    {"*": ["cold-start"]},
])
def test_a_bad_calibration_is_refused_and_the_predictors_own_bounds_serve(tmp_path, bad):
    models = tmp_path / "models"
    _, own = predict(models)
    write(models, bad)
    choice, p = predict(models)
    assert "calibration refused" in choice.warning
    assert p.mem_mib_p90 == own.mem_mib_p90 and p.mem_mib_p95 is None


def test_learned_entries_apply_only_to_the_version_they_were_measured_on(tmp_path):
    from slurm_horus.predict.coldstart import Prediction
    from slurm_horus.predict.chain import Calibration

    cal = Calibration({"version": 1, "model": "v0002",
                       "quantiles": {"*": {"learned": Q}}}, serving="v0003")
    p = Prediction(gpu="a100-40gb", util_pct=40, mem_mib=1000, mem_mib_p90=1100,
                   predictor="learned:v0003")
    assert cal.apply(p) is p
    q = cal.apply(Prediction(**{**p.__dict__, "predictor": "learned:v0002"}))
    assert q.mem_mib_p90 == pytest.approx(1000 * math.exp(0.2))


@pytest.mark.parametrize("mem_q", [
    {"0.9": 0.1, "0.95": 0.9, "0.99": 0.5},   # out of order
    {"0.95": 0.0, "0.99": 0.01},              # no p90: the predictor's own (x1.15) is above
    {"0.9": 0.2, "0.99": 0.1},                # a p99 with no p95: the hint carries neither
])
def test_bounds_are_in_order_and_as_the_hint_carries_them(tmp_path, mem_q):
    """Quantiles out of order had horus predict say a p99 of 10,677 MiB fits where the hint,
    which keeps its bounds in order, carried 15,928; a p95 without a p90 fell below the p90."""
    models = tmp_path / "models"
    write(models, {"*": {"cold-start": {**Q, "mem_log_q": mem_q}}})
    choice, p = predict(models)
    assert choice.warning is None
    bounds = [b for b in (p.mem_mib_p90, p.mem_mib_p95, p.mem_mib_p99) if b is not None]
    assert bounds == sorted(bounds) and (p.mem_mib_p99 is None or p.mem_mib_p95 is not None)
    _, m, *carried = parse_hint(_hint_of({"a100": p}))["a100"]
    assert carried == [math.ceil(b) for b in bounds]
