"""hsubmit's limits on what one part of its input may cost the rest: one GPU type's absurd
prediction costs that type's hint alone, the cold start reads a report once, and a history.json
of millions of tiny values is refused before it is parsed (the job goes with the cold start)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.predict import chain, coldstart
from slurm_horus.predict import registry as registry_mod
from slurm_horus.predict.chain import choose_predictor
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu
from slurm_horus.predict.history import HistoryPredictor
from slurm_horus.predict.registry import Registry
from slurm_horus.slurm import submit as sub
from slurm_horus.slurm.hint import parse_hint, parse_workload

ZOO = Path(__file__).resolve().parent / "data" / "zoo"
HOSTILE_HEAD = {"format": "slurm-horus-history", "format_version": 1, "graphs": {}, "families": {},
                "users": {}, "offsets": {}, "margins": {}}


def _with_absurd(monkeypatch, gpu_name: str, **absurd) -> None:
    """predict_for as it is, with ``absurd`` figures in GPU type ``gpu_name``'s prediction."""
    real = chain.predict_for

    def predict_for(report, gpus, workload, choice=None):
        return [dataclasses.replace(p, **absurd) if g.name == gpu_name else p
                for p, g in zip(real(report, gpus, workload, choice), gpus)]

    monkeypatch.setattr(chain, "predict_for", predict_for)


def _plan():
    return sub.prepare(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "4",
                        "--wrap", "true"], env={})


@pytest.mark.parametrize("absurd,why", [
    ({"util_pct": math.nan}, "a100 utilization: not a finite number"),
    ({"mem_mib": 2e8, "mem_mib_p90": 2.3e8}, "a100 memory 200000000.0 MiB above 99999999"),
])
def test_one_gpu_types_absurd_prediction_leaves_that_type_alone_out_of_the_hint(monkeypatch, absurd, why):
    # one such figure had made encode_hint refuse the whole hint: the T4's sane one was lost too
    _with_absurd(monkeypatch, get_gpu("a100").name, **absurd)
    plan = _plan()
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    assert set(parse_hint(plan.hint)) == {"t4"}
    assert plan.hint in plan.comment and parse_workload(plan.comment)["sha"]
    [warning] = [w for w in plan.warnings if "hint leaves a100 out" in w]
    assert why in warning and "\n" not in warning


def test_every_gpu_types_absurd_prediction_costs_the_hint_as_before(monkeypatch):
    _with_absurd(monkeypatch, get_gpu("a100").name, mem_mib=2e8, mem_mib_p90=2.3e8)
    plan = _plan()
    with pytest.raises(HorusError, match="a100 memory 200000000.0 MiB above 99999999"):
        sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
    assert not any("hint leaves" in w for w in plan.warnings)


def test_the_cold_start_reads_the_reports_values_once_a_prediction(monkeypatch):
    report = extract_features(ZOO / "small_cnn.onnx", batch_size=4)
    est, gpu = ColdStartEstimator(), get_gpu("a100")
    calls = []
    real = coldstart._read_values
    monkeypatch.setattr(coldstart, "_read_values", lambda r: calls.append(r) or real(r))
    for task in ("train", "infer"):
        w = Workload(batch_size=4, task=task)
        calls.clear()
        p = est.predict(report, gpu, w)
        assert calls == [report]
        # the figures are those of the two halves, each reading the values itself
        assert (p.mem_mib, p.util_pct) == (est.memory_mib(report, gpu, w)[0],
                                          est.utilization_pct(report, gpu, w)[0])


def _registry_with_history(root: Path, text: str) -> Path:
    root.mkdir(mode=0o755)
    (root / "history.json").write_text(text)
    return root


def _hostile(junk: str) -> str:
    return json.dumps(HOSTILE_HEAD)[:-1] + f', "junk": {junk}}}'


def test_a_history_of_millions_of_tiny_lists_is_refused_and_hsubmit_goes_with_the_cold_start(tmp_path, slurm_bin):
    # 32 MiB of "[]," had cost every hsubmit 5 s and 870 MB: 600,000 are 1.8 MiB, past the cap
    env, log = slurm_bin
    assert registry_mod.MAX_HISTORY_CONTAINERS < 600_000
    root = _registry_with_history(tmp_path / "models", _hostile("[" + ",".join(["[]"] * 600_000) + "]"))
    cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", "-p", "gpu", "--gres=gpu:1",
                         "--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "4", "--wrap", "true"],
                        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                        env={**env, "HORUS_MODEL_DIR": str(root)})
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    [warning] = cp.stderr.strip().splitlines()
    assert "site history refused" in warning and "objects and lists, more than readers take" in warning
    comment = next(a for a in log.read_text().split("\n") if a.startswith("--comment="))
    assert parse_hint(comment.removeprefix("--comment="))["a100"]  # the cold start's


@pytest.mark.parametrize("junk,what", [
    ('["ab", "ab", "ab", "ab"]', "values"),  # a value a comma, in a list
    ('{"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}', "values"),  # and in an object
    ("[[[[]]], [[]], [{}]]", "objects and lists"),  # each, however nested
])
def test_a_history_past_the_value_caps_is_refused_before_parsing_and_not_written(
        tmp_path, monkeypatch, junk, what):
    text = _hostile(junk)
    containers = text.count("{") + text.count("[")
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_CONTAINERS", containers - 1 if "lists" in what else 10**6)
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_VALUES", containers + text.count(",") - 1)
    root = _registry_with_history(tmp_path / "models", text)
    history = json.loads(text)
    monkeypatch.setattr(registry_mod.json, "loads", lambda *a, **k: pytest.fail("parsed"))
    choice = choose_predictor(str(root))
    assert isinstance(choice.estimator, ColdStartEstimator)
    assert "site history refused" in choice.warning and what in choice.warning
    with pytest.raises(HorusError, match=f"{what}, more than readers take .*; not replaced"):
        Registry(root).save_history(history)  # what every reader would refuse: the old one serves


@pytest.mark.parametrize("graphs", [1000, 1])
def test_the_densest_export_at_the_byte_cap_is_within_the_value_caps(graphs):
    """fit's smallest entries (no utilization, no cold start, the shortest GPU name; a graph a
    run, or one graph of many): the caps refuse no export that the byte cap lets through."""
    runs = [{"sha": f"{i % graphs:064x}", "gpu": "t4", "bs": i + 1, "task": "train", "opt": "sgd",
             "prec": "fp32", "dims": "", "mem": 1.0, "util": None, "cold_mem": None,
             "cold_util": None, "user": None} for i in range(1000)]
    history = HistoryPredictor().fit(runs).to_dict()
    for r in (r for rs in history["graphs"].values() for r in rs):
        r.pop("family")  # as a pseudonymous export writes it
    text = json.dumps(history, separators=(",", ":"))
    containers = text.count("{") + text.count("[")
    at_the_cap = registry_mod.MAX_HISTORY_BYTES / len(text)
    assert containers * at_the_cap <= registry_mod.MAX_HISTORY_CONTAINERS
    assert (containers + text.count(",")) * at_the_cap <= registry_mod.MAX_HISTORY_VALUES


def _json_counts(obj) -> tuple[int, int]:
    """(objects and lists, values) of a parsed JSON value, as the caps count them (a container
    and each comma between its members)."""
    if not isinstance(obj, (dict, list)):
        return 0, 0
    members = list(obj.values()) if isinstance(obj, dict) else obj
    containers, values = 1, 1 + max(len(members) - 1, 0)
    for m in members:
        c, v = _json_counts(m)
        containers, values = containers + c, values + v
    return containers, values


def _bert_history(runs: int = 1000) -> dict:
    # a graph whose sequence dimensions have no name: each is keyed by its input's position
    dims = "attention_mask[1]=512,input_ids[1]=512,token_type_ids[1]=512"
    history = HistoryPredictor().fit([
        {"sha": f"{i % 50:064x}", "gpu": "t4", "bs": i // 50 + 1, "task": "train", "opt": "sgd",
         "prec": "fp32", "dims": dims, "mem": 1.0, "util": None, "cold_mem": None,
         "cold_util": None, "user": None} for i in range(runs)]).to_dict()
    for r in (r for rs in history["graphs"].values() for r in rs):
        r.pop("family")
    return history


def test_an_export_whose_dims_keys_hold_commas_and_brackets_is_not_refused(tmp_path, monkeypatch):
    """A dims key's commas and brackets are in a string: counted, a real export of 31 MiB (a
    BERT's settings at the byte cap) had been refused by every reader, and by save_json, so
    that the site's history was never replaced again."""
    history = _bert_history()
    text = json.dumps(history, separators=(",", ":"))
    containers, values = _json_counts(history)
    assert text.count("[") + text.count("{") > 1.5 * containers  # its strings hold more
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_CONTAINERS", containers)
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_VALUES", values)
    reg = Registry(tmp_path / "models")
    reg.save_history(history)
    assert reg.load_history() == history
    # one object more than the caps is still refused, before parsing
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_CONTAINERS", containers - 1)
    monkeypatch.setattr(registry_mod.json, "loads", lambda *a, **k: pytest.fail("parsed"))
    with pytest.raises(HorusError, match=f"{containers:,} objects and lists, more than readers"):
        reg.load_history()


def test_the_densest_export_with_positional_dims_at_the_byte_cap_is_within_the_caps():
    history = _bert_history()
    containers, values = _json_counts(history)
    at_the_cap = registry_mod.MAX_HISTORY_BYTES / len(json.dumps(history, separators=(",", ":")))
    assert containers * at_the_cap <= registry_mod.MAX_HISTORY_CONTAINERS
    assert values * at_the_cap <= registry_mod.MAX_HISTORY_VALUES


@pytest.mark.parametrize("text", [
    '{"a": ["x\\\\", "[,{", 1], "b\\"[,": {"c": "\\\\\\"]{,,"}}',
    '["\\u005b,", "\\\\\\\\", [[], {}], ",,,"]',
])
def test_the_caps_count_what_the_parser_builds_escapes_too(text, monkeypatch):
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_CONTAINERS", 0)  # counted outside strings
    monkeypatch.setattr(registry_mod, "_COUNT_CHUNK", 3)  # strings across chunks
    containers, values = _json_counts(json.loads(text))
    why = registry_mod._history_shape_problem(text.encode())
    assert why.startswith(f"{containers:,} objects and lists")
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_CONTAINERS", containers)
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_VALUES", values - 1)
    assert registry_mod._history_shape_problem(text.encode()).startswith(f"{values:,} values")
    monkeypatch.setattr(registry_mod, "MAX_HISTORY_VALUES", values)
    assert registry_mod._history_shape_problem(text.encode()) is None


def test_one_gpu_types_absurd_bounds_cost_that_type_alone_its_bounds(monkeypatch):
    """An a100 p95 past what a hint carries had dropped every type's p95 and p99."""
    real = chain.predict_for
    a100 = get_gpu("a100").name

    def predict_for(report, gpus, workload, choice=None):
        return [dataclasses.replace(p, mem_mib_p95=2e8 if g.name == a100 else p.mem_mib_p90 + 10,
                                    mem_mib_p99=p.mem_mib_p90 + 20)
                for p, g in zip(real(report, gpus, workload, choice), gpus)]

    monkeypatch.setattr(chain, "predict_for", predict_for)
    plan = _plan()
    sub.predict(plan, gpu_types={"a100": 4, "t4": 2}, partition="gpu")
    hint = parse_hint(plan.hint)
    assert len(hint["a100"]) == 3 and len(hint["t4"]) == 5
    assert hint["t4"][3] >= plan.predictions["t4"].mem_mib_p90 + 10
