"""Predictor review 9: what the predictors promise, checked where they had broken it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.history import HistoryPredictor

A100 = get_gpu("a100-40gb")
COLD = ColdStartEstimator()


class _Learned:
    """A learned model that answers twice the cold start's memory, 20 points more utilization."""

    name = "learned:v0001"

    def predict_with_cold(self, report, gpu, workload):
        c = COLD.predict(report, gpu, workload)
        return dataclasses.replace(c, mem_mib=2 * c.mem_mib, mem_mib_p90=2.3 * c.mem_mib,
                                   util_pct=c.util_pct + 20, predictor=self.name), c


def _lone_users_family(resnet):
    """Two graphs of family resnet50 that one user alone ran, measured at half the cold start."""
    runs = []
    for sha in ("a" * 64, "b" * 64):
        for b in (8, 32):
            c = COLD.predict(resnet[b], A100, Workload(batch_size=b))
            runs.append({"sha": sha, "gpu": A100.name, "bs": b, "task": "train", "opt": "adam",
                         "prec": "fp32", "dims": "", "mem": 0.5 * c.mem_mib,
                         "util": c.util_pct - 20, "cold_mem": c.mem_mib, "cold_util": c.util_pct,
                         "family": "resnet50", "user": "mallory"})
    return json.loads(json.dumps(HistoryPredictor().fit(runs).to_dict()))


def test_a_lone_users_family_pool_never_lowers_a_learned_models_answer(resnet):
    """A pool of fewer than 3 users' graphs may raise predictions, never lower them: clamped at
    the cold start's figures, it had pulled a learned model's answer above them down (one user's
    runs took another user's ResNet-50 from 2x the cold start to 1.35x, 83 % to 72 %)."""
    h = HistoryPredictor.from_dict(_lone_users_family(resnet), base=_Learned(), user="bob")
    report = dataclasses.replace(resnet[16], model="/home/bob/resnet50.onnx", sha256="c" * 64)
    w = Workload(batch_size=16)
    base = _Learned().predict_with_cold(report, A100, w)[0]
    p = h.predict(report, A100, w)
    assert p.mem_mib >= base.mem_mib and p.util_pct >= base.util_pct
    # with the cold start serving, the pool is what it was: the cold start's figures
    cold = HistoryPredictor.from_dict(_lone_users_family(resnet), user="bob").predict(report, A100, w)
    assert cold.mem_mib == pytest.approx(COLD.predict(report, A100, w).mem_mib)


def test_a_pools_raise_only_flag_is_checked(resnet):
    d = _lone_users_family(resnet)
    assert d["families"][A100.name]["resnet50"]["raise_only"] is True
    d["families"][A100.name]["resnet50"]["raise_only"] = 1
    with pytest.raises(HorusError, match="raise_only"):
        HistoryPredictor.from_dict(d)


def test_memory_measured_on_a_shared_gpu_keeps_the_sites_utilization_offset(resnet):
    """A graph whose every run shared its GPU has measured memory but no utilization: its
    utilization is the base predictor's with the site's offset, as a graph never run gets (the
    raw cold start's had dropped a +15 point offset three users' graphs had taught)."""
    runs = []
    for user, sha in (("u1", "a" * 64), ("u2", "b" * 64), ("u3", "c" * 64)):
        for b in (8, 32):
            c = COLD.predict(resnet[b], A100, Workload(batch_size=b))
            runs.append({"sha": sha, "gpu": A100.name, "bs": b, "task": "train", "opt": "adam",
                         "prec": "fp32", "dims": "", "mem": c.mem_mib, "util": c.util_pct + 15,
                         "cold_mem": c.mem_mib, "cold_util": c.util_pct, "user": user})
    shared = dict(runs[0], sha=resnet[16].sha256, bs=16, util=None, user="u1",
                  cold_mem=COLD.predict(resnet[16], A100, Workload(batch_size=16)).mem_mib)
    h = HistoryPredictor(user="u1").fit([*runs, shared])
    w = Workload(batch_size=16)
    p = h.predict(resnet[16], A100, w)
    never_run = h.predict(dataclasses.replace(resnet[16], sha256="d" * 64), A100, w)
    assert p.predictor == "history:exact" and not never_run.predictor.endswith("exact")
    assert never_run.util_pct > COLD.predict(resnet[16], A100, w).util_pct + 10
    assert p.util_pct == pytest.approx(never_run.util_pct)


def test_hsubmits_chain_answers_a_job_at_other_cpus_per_gpu_as_history_graph(resnet, tmp_path):
    """history.json in the registry, its runs at 8 CPUs per GPU (95 %): hsubmit's chain gives a
    job at 8 the measurement (history:exact), a job at 1 no exact answer."""
    from slurm_horus.predict.chain import choose_predictor, predict_for
    from slurm_horus.predict.registry import Registry
    from slurm_horus.predict.workload import dims_key

    w = Workload(batch_size=16)
    c = COLD.predict(resnet[16], A100, w)
    run = {"sha": resnet[16].sha256, "gpu": A100.name, "bs": 16, "task": "train", "opt": "adam",
           "prec": "fp32", "dims": dims_key(resnet[16].given_dims, 16), "mem": 5000.0,
           "util": 95.0, "cold_mem": c.mem_mib, "cold_util": c.util_pct, "user": None,
           "cpus_per_gpu": 8}
    Registry(tmp_path).save_history(HistoryPredictor().fit([run]).to_dict())
    choice = choose_predictor(tmp_path)
    at = {cpus: predict_for(resnet[16], [A100], dataclasses.replace(w, cpus_per_gpu=cpus), choice)[0]
          for cpus in (1, 8)}
    assert (at[8].predictor, at[8].util_pct) == ("history:exact", 95.0)
    assert at[1].predictor == "history:graph" and at[1].util_pct < 95.0
    assert at[1].mem_mib == at[8].mem_mib == 5000.0
