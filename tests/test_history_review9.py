"""History review 9: a utilization measured with one CPUs per GPU answers a job with another
only as weaker evidence; memory, which no CPU count changes, as before."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from slurm_horus.errors import HorusError
from slurm_horus.predict.chain import choose_predictor, predict_for
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.history import HistoryPredictor
from slurm_horus.predict.learned import input_names
from slurm_horus.predict.registry import Registry
from slurm_horus.predict.workload import dims_key

A100 = get_gpu("a100-40gb")
COLD = ColdStartEstimator()


def _run(report, b, mem, util, cpus, user="alice"):
    w = Workload(batch_size=b)
    c = COLD.predict(report, A100, w)
    return {"sha": report.sha256, "gpu": A100.name, "bs": b, "task": "train", "opt": "adam",
            "prec": "fp32", "dims": dims_key(report.given_dims, b), "mem": mem, "util": util,
            "cold_mem": c.mem_mib, "cold_util": c.util_pct, "family": "resnet50", "user": user,
            "cpus_per_gpu": cpus}


def _job(b, cpus=None):
    return Workload(batch_size=b, cpus_per_gpu=cpus)


class _Learned:
    """A learned model whose utilization grows with the CPUs per GPU (5 points a CPU, at most
    8), its trees splitting on them (``split``) or not."""

    name = "learned:v0001"

    def __init__(self, split: bool = True):
        col = input_names().index("cpus_per_gpu" if split else "task_train")
        self.model = SimpleNamespace(util=SimpleNamespace(flat=SimpleNamespace(
            feature=np.array([col, 0, 0]), leaf=np.array([False, True, True]))))

    def predict_with_cold(self, report, gpu, workload):
        c = COLD.predict(report, gpu, workload)
        util = 20.0 + 5.0 * min(workload.cpus_per_gpu or 8.0, 8.0)
        return dataclasses.replace(c, util_pct=util, predictor=self.name), c


def test_a_utilization_measured_with_8_cpus_per_gpu_is_no_exact_answer_for_1(resnet):
    """Runs at 8 CPUs per GPU (90 %): a job asking for 1 gets history:graph and the base's
    utilization (the cold start's, which no CPU count moves); 6 (bucket 8) and a job of unknown
    CPUs get the measurement, history:exact. Memory alike for all."""
    h = HistoryPredictor(user="alice").fit([_run(resnet[16], 16, 5000.0, 90.0, 8)])
    one, six, unknown = (h.predict(resnet[16], A100, _job(16, c)) for c in (1, 6, None))
    assert (six.predictor, six.util_pct) == ("history:exact", 90.0)
    assert (unknown.predictor, unknown.util_pct) == ("history:exact", 90.0)
    assert one.predictor == "history:graph"
    assert one.util_pct == pytest.approx(COLD.predict(resnet[16], A100, _job(16, 1)).util_pct)
    assert one.mem_mib == six.mem_mib == unknown.mem_mib == 5000.0


def test_each_cpu_count_answers_its_own_utilization(resnet):
    """One user's runs at 1 CPU per GPU (30 %) and at 8 (90 %) of one setting: each answers
    its own (their median, 60 %, had answered both); memory the highest, as before."""
    r = resnet[16]
    h = HistoryPredictor(user="alice").fit([_run(r, 16, 5000.0, 30.0, 1), _run(r, 16, 5100.0, 90.0, 8),
                                            _run(r, 16, 5050.0, 32.0, 1)])
    (entry,) = h.graphs[r.sha256]
    assert entry["util_cpus"] == {"1": 31.0, "8": 90.0}
    for cpus, util in ((1, 31.0), (8, 90.0), (16, None)):
        p = h.predict(r, A100, _job(16, cpus))
        assert p.mem_mib == 5050.0
        if util is not None:
            assert (p.predictor, p.util_pct) == ("history:exact", util)
    assert h.predict(r, A100, _job(16, 16)).predictor == "history:graph"  # 16 never measured
    # between measured batch sizes, at the job's CPUs alone
    h = HistoryPredictor(user="alice").fit([_run(resnet[8], 8, 4000.0, 20.0, 1), _run(resnet[32], 32, 7000.0, 40.0, 1),
                                            _run(resnet[8], 8, 4000.0, 80.0, 8), _run(resnet[32], 32, 7000.0, 95.0, 8)])
    assert h.predict(resnet[16], A100, _job(16, 1)).util_pct == pytest.approx(30.0)


def test_a_learned_model_that_learned_cpus_moves_a_measurement_to_the_jobs(resnet):
    """Measured at 8 CPUs (90 %); the learned model puts 1 CPU at 25 %, 8 at 60 %: the job at
    1 gets 90 x 25 / 60 = 37.5 %, history:graph. A learned model whose trees never split on
    the CPUs gives no ratio: its own utilization answers."""
    r = resnet[16]
    h = HistoryPredictor(base=_Learned(), user="alice").fit([_run(r, 16, 5000.0, 90.0, 8)])
    p = h.predict(r, A100, _job(16, 1))
    assert (p.predictor, p.util_pct, p.mem_mib) == ("history:graph", pytest.approx(37.5), 5000.0)
    assert h.predict(r, A100, _job(16, 8)).util_pct == 90.0
    h.base = _Learned(split=False)
    assert h.predict(r, A100, _job(16, 1)).util_pct == pytest.approx(25.0)


def test_an_old_history_without_cpus_reads_as_before(resnet, tmp_path):
    """A file from before the CPUs were kept (no util_cpus) answers any job's CPUs with its
    runs' utilization, history:exact; the export writes no util_cpus for runs of unknown CPUs."""
    runs = [_run(resnet[16], 16, 5000.0, 90.0, None)]
    d = HistoryPredictor().fit(runs).to_dict()
    assert "util_cpus" not in json.dumps(d)
    h = HistoryPredictor.from_dict(json.loads(json.dumps(d)), user="alice")
    p = h.predict(resnet[16], A100, _job(16, 1))
    assert (p.predictor, p.util_pct) == ("history:exact", 90.0)


@pytest.mark.parametrize("entry, why", [
    ({"util_cpus": {"3": 50.0}}, "bucket '3'"), ({"util_cpus": {"nan": 50.0}}, "bucket 'nan'"),
    ({"util_cpus": {"1e400": 50.0}}, "bucket"), ({"util_cpus": {"-8": 50.0}}, "bucket"),
    ({"util_cpus": {"0": 50.0}}, "bucket"), ({"util_cpus": {"8.0": 50.0}}, "bucket"),
    ({"util_cpus": {"8": 150.0}}, "utilization"), ({"util_cpus": {"8": "x"}}, "utilization"),
    ({"util_cpus": {"8": None}}, "utilization"), ({"util_cpus": [1]}, "object expected"),
    ({"util_cpus": {}}, "util_cpus"), ({"util_cpus": {str(2 ** k): 1.0 for k in range(65)}}, "util_cpus"),
    ({"util_cpus": None}, "object expected"),
])
def test_a_hostile_cpu_record_refuses_the_file_in_one_line(resnet, tmp_path, entry, why):
    d = HistoryPredictor().fit([_run(resnet[16], 16, 5000.0, 90.0, 8)]).to_dict()
    d["graphs"][resnet[16].sha256][0].update(entry)
    with pytest.raises(HorusError, match=why) as e:
        HistoryPredictor.from_dict(json.loads(json.dumps(d)))
    assert "\n" not in str(e.value)
    # hsubmit's chain: the file refused with one warning, the base predictor answers
    Registry(tmp_path).save_history(d)
    choice = choose_predictor(tmp_path)
    assert "site history refused" in choice.warning and "\n" not in choice.warning
    (p,) = predict_for(resnet[16], [A100], _job(16, 1), choice)
    assert p.predictor == "cold-start"


@pytest.mark.parametrize("cpus", [-1, 2.0 ** 21, "8", True, float("inf")])
def test_a_runs_cpus_per_gpu_is_checked(resnet, cpus):
    with pytest.raises(HorusError, match="CPUs per GPU"):
        HistoryPredictor().fit([_run(resnet[16], 16, 5000.0, 90.0, cpus)])


def test_the_export_keeps_the_cpus_per_gpu_slurm_allocated(tmp_path):
    """The ledger's CPUs and GPUs (sync's, from AllocCPUS and AllocTRES) become each run's
    CPUs per GPU, as the learned model trains on them: 16 CPUs on 2 GPUs is 8; a row synced
    before, its CPUs as cpus_per_task, is read with its job's GPUs; one without CPUs is
    unknown. The history keeps each bucket's utilization."""
    from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION
    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger.history_export import build_history, ledger_runs

    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    for jid, cpus, gpus, util in ((1, {"cpus": 16, "gpus": 2}, 2, 90.0),
                                  (2, {"cpus_per_task": 2}, 2, 30.0), (3, {}, 1, 60.0)):
        L.record_submission(job_id=jid, cluster="c", user="alice", model_sha256="ab" * 32,
                            model_path="/m/resnet50.onnx", model_family="resnet50",
                            features={n: 1.0 for n in FEATURE_NAMES}, feature_version=FEATURE_VERSION,
                            workload={"batch_size": 32, "task": "train", **cpus},
                            predictions={"a100-40gb": {"util_pct": 80.0, "mem_mib": 5000.0}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=util, util_max=99,
                       mem_peak_mib=5200.0, gpu_index=0, gpus=gpus, state="COMPLETED",
                       elapsed_s=600, node="n1", gpu_type="a100-40gb", start_time=1700000000,
                       end_time=1700000600)
    runs = sorted(ledger_runs(L), key=lambda r: r["util"])  # (two GPUs' utilization: per GPU)
    assert [(r["util"], r["cpus_per_gpu"]) for r in runs] == [(15.0, 1.0), (45.0, 8.0), (60.0, None)]
    (entry,) = build_history(L)["graphs"]["ab" * 32]
    assert (entry["util"], entry["util_cpus"]) == (45.0, {"1": 15.0, "8": 45.0})


def test_other_settings_answer_utilization_only_at_the_jobs_cpus(resnet):
    """history:graph (the setting itself never measured) moves other settings' utilization by
    the cold start only where they ran at the job's CPUs per GPU; measured at 8 alone, a job at
    1 gets the cold start's (no pool: the family's holds those very runs)."""
    r = resnet[16]
    runs = [dict(_run(r, 16, 5000.0, 90.0, 8), prec="amp")]
    p = HistoryPredictor(user="alice").fit(runs).predict(r, A100, _job(16, 1))
    assert p.predictor == "history:graph"
    assert p.util_pct == pytest.approx(COLD.predict(r, A100, _job(16, 1)).util_pct)
    p = HistoryPredictor(user="alice").fit(runs).predict(r, A100, _job(16, 8))
    assert p.util_pct > COLD.predict(r, A100, _job(16, 8)).util_pct + 10


def test_the_smallest_bucket_the_file_takes_answers_without_raising(resnet):
    """A bucket at the bottom of the floats (2**-1074, which the reader takes as any bucket in
    0..MAX_CPUS_PER_GPU) against a job's 8 CPUs: their quotient is 0, and log(0) had raised
    ValueError in every hsubmit of the graph (one warning, its hint lost); now the nearest
    count is told by logs apart, and the learned model's ratio moves it as any other's."""
    r = resnet[16]
    d = HistoryPredictor().fit([_run(r, 16, 5000.0, 30.0, 5e-324)]).to_dict()
    assert list(d["graphs"][r.sha256][0]["util_cpus"]) == ["4.9406564584124654e-324"]
    h = HistoryPredictor.from_dict(json.loads(json.dumps(d)), base=_Learned(), user="alice")
    for cpus in (8, 2.0 ** 20):
        p = h.predict(r, A100, _job(16, cpus))
        assert (p.predictor, p.mem_mib) == ("history:graph", 5000.0)
        assert p.util_pct == pytest.approx(30.0 * 60.0 / 20.0)
