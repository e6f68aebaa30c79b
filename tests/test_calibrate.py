"""horus-admin calibrate: orchestration with a fake runner and sampler (no torch, no GPU), the
import format and `horus-admin import` of the result, --resume, the real export + features on CPU
(skipped without torch), and the one-line no-GPU error."""

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_horus.calibrate import measure as cal
from slurm_horus.graph.features import FEATURE_NAMES
from slurm_horus.ledger import Ledger
from slurm_horus.ledger.retrain import IMPORT_COLUMNS

ZOO = Path(__file__).parent / "data" / "zoo"
HAS_TORCH = importlib.util.find_spec("torch") is not None


class FakeSampler:
    """The Sampler protocol: start() / stop() -> summary."""

    def __init__(self):
        self.started = self.stopped = 0
        self.closed = False

    def start(self):
        assert self.started == self.stopped, "start twice without stop"
        self.started += 1

    def stop(self):
        self.stopped += 1
        return {"util_mean": 55.5, "util_max": 90.0, "mem_peak_mib": 3000.0, "samples": 7,
                "util_source": "process"}

    def close(self):
        self.closed = True


class FakeRunner:
    """Measures nothing; 'exports' a committed zoo graph (small_cnn) for every model."""

    gpu_type = "a100-40gb"

    def __init__(self, oom_from=None, fail_after=None):
        self.measured, self.exports = [], []
        self.oom_from, self.fail_after = oom_from, fail_after
        self.specs = {"small_cnn": cal.ModelSpec("small_cnn", "cnn", None, "image", 32),
                      "other_cnn": cal.ModelSpec("other_cnn", "cnn", None, "image", 32)}

    def measure(self, run, sampler, seconds):
        if self.fail_after is not None and len(self.measured) >= self.fail_after:
            raise KeyboardInterrupt  # an interrupt in the middle of the plan
        if self.oom_from and run.batch_size >= self.oom_from:
            raise cal.OutOfMemory("CUDA out of memory")
        sampler.start()
        summary = sampler.stop()
        self.measured.append(run)
        return cal.Measurement(util_mean=summary["util_mean"], util_max=summary["util_max"],
                               mem_peak_mib=(summary["mem_peak_mib"] or 0) + run.batch_size,
                               torch_max_alloc_mib=1000.0 + run.batch_size,
                               torch_max_reserved_mib=1500.0, steps=10, seconds=seconds,
                               samples=summary["samples"])

    def export(self, model, cache_dir):
        self.exports.append(model)
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        dst = Path(cache_dir) / f"{model}.onnx"
        if not dst.exists():
            shutil.copy(ZOO / "small_cnn.onnx", dst)
        return dst


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_orchestration_writes_import_rows(tmp_path):
    out = tmp_path / "calib.csv"
    runner, sampler = FakeRunner(), FakeSampler()
    runs = cal.plan(["small_cnn", "other_cnn"], [32, 8], ["train", "infer"])
    assert len(runs) == 8 and [r.batch_size for r in runs[:2]] == [8, 32]
    res = cal.calibrate(runner, runs, out, sampler_factory=lambda: sampler, seconds=1)
    assert len(res.done) == 8 and not res.failed and not res.skipped
    assert sampler.started == sampler.stopped == 8 and sampler.closed
    got = rows(out)
    with open(out, newline="") as f:
        header = next(csv.reader(f))
    assert header[:len(IMPORT_COLUMNS)] == list(IMPORT_COLUMNS)  # the import format, then extras
    assert len(got) == 8 and len({r["calib_id"] for r in got}) == 8
    r0 = got[0]
    feats = json.loads(r0["features"])
    assert set(FEATURE_NAMES) <= set(feats) and feats["batch_size"] == 8
    assert r0["gpu_type"] == "a100-40gb" and r0["task"] == "train" and r0["optimizer"] == "adam"
    assert float(r0["util_pct"]) == 55.5 and float(r0["mem_mib"]) == 3008.0
    assert float(r0["torch_max_alloc_mib"]) == 1008.0 and r0["model_family"] == "cnn"
    assert float(r0["cold_mem_mib"]) > 0 and r0["cold_util_pct"]
    assert r0["calib_id"] == cal.run_id("small_cnn", 8, "train", "a100-40gb")
    # an existing file is not overwritten without --resume
    with pytest.raises(cal.HorusError, match="--resume"):
        cal.calibrate(runner, runs, out, sampler_factory=FakeSampler)


def test_csv_is_accepted_by_horus_admin_import(tmp_path):
    from slurm_horus.cli.admin import main

    out = tmp_path / "calib.csv"
    cal.calibrate(FakeRunner(), cal.plan(["small_cnn"], [8, 32], ["train", "infer"]), out,
                  sampler_factory=FakeSampler)
    url = f"sqlite:///{tmp_path}/ledger.db"
    r = CliRunner().invoke(main, ["import", str(out), "--ledger", url])
    assert r.exit_code == 0 and "imported 4 rows" in r.output, r.output
    L = Ledger(url)
    assert L.count("usage") == 4 and L.count("submissions") == 4
    CliRunner().invoke(main, ["import", str(out), "--ledger", url])  # idempotent
    assert L.count("usage") == 4


def test_ledger_rows_match_a_later_import(tmp_path):
    """--ledger imports each row as it is written; importing the CSV afterwards adds nothing."""
    from slurm_horus.ledger.retrain import import_csv

    out = tmp_path / "calib.csv"
    L = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    cal.calibrate(FakeRunner(), cal.plan(["small_cnn"], [8], ["train", "infer"]), out,
                  sampler_factory=FakeSampler, ledger=L)
    assert L.count("usage") == 2
    import_csv(L, str(out))
    assert L.count("usage") == 2


def test_resume_skips_done_runs(tmp_path):
    out = tmp_path / "calib.csv"
    runs = cal.plan(["small_cnn", "other_cnn"], [8, 32], ["train"])
    interrupted = FakeRunner(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        cal.calibrate(interrupted, runs, out, sampler_factory=FakeSampler)
    assert len(rows(out)) == 2  # what finished before the interrupt is on disk
    # a row cut in the middle by a crash: the partial line has no mem_mib, is not "done"
    with open(out, "a") as f:
        f.write("x,{}")
    again = FakeRunner()
    res = cal.calibrate(again, runs, out, sampler_factory=FakeSampler, resume=True)
    assert len(res.skipped) == 2 and len(res.done) == 2
    assert [(r.model, r.batch_size) for r in again.measured] == [("other_cnn", 8), ("other_cnn", 32)]
    ids = [r["calib_id"] for r in rows(out) if r.get("mem_mib")]
    assert len(ids) == 4 and len(set(ids)) == 4
    res = cal.calibrate(FakeRunner(), runs, out, sampler_factory=FakeSampler, resume=True)
    assert not res.done and len(res.skipped) == 4


def test_oom_skips_larger_batches(tmp_path):
    out = tmp_path / "calib.csv"
    runner = FakeRunner(oom_from=32)
    res = cal.calibrate(runner, cal.plan(["small_cnn"], [8, 32, 128], ["train"]), out,
                        sampler_factory=FakeSampler)
    assert len(res.done) == 1 and len(res.failed) == 2
    assert "out of memory" in res.failed[0][1] and "batch 32" in res.failed[1][1]
    assert [r.batch_size for r in runner.measured] == [8]


def test_no_utilization_samples_is_not_written(tmp_path):
    class Blind(FakeSampler):
        def stop(self):
            super().stop()
            return {"util_mean": None, "util_max": None, "mem_peak_mib": None, "samples": 0}

    out = tmp_path / "calib.csv"
    res = cal.calibrate(FakeRunner(), cal.plan(["small_cnn"], [8], ["infer"]), out,
                        sampler_factory=Blind)
    assert not res.done and "no utilization" in res.failed[0][1] and rows(out) == []


def test_gpu_type_from_device_name():
    assert cal.gpu_type_of("NVIDIA A100-SXM4-40GB", "a100-40gb") == "a100-40gb"
    assert cal.gpu_type_of("NVIDIA H200") == "h200"
    with pytest.raises(cal.HorusError, match="--gpu-type"):
        cal.gpu_type_of("Imaginary GPU 9000")


def test_cli_errors_are_one_line(tmp_path, monkeypatch):
    from slurm_horus.cli.admin import main

    out = str(tmp_path / "c.csv")
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--tasks", "train,fly"])
    assert r.exit_code == 2 and "horus-admin calibrate: error: --tasks" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--batch-sizes", "8,x"])
    assert r.exit_code == 2 and "--batch-sizes" in r.output
    # without torch: the install hint
    import builtins

    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    r = CliRunner().invoke(main, ["calibrate", "--out", out])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines == ["horus-admin calibrate: error: calibrate needs PyTorch: "
                     "pip install 'slurm-horus[calibrate]' (torch with CUDA)"]


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_no_gpu_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from slurm_horus.cli.admin import main

    r = CliRunner().invoke(main, ["calibrate", "--out", str(tmp_path / "c.csv")])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("horus-admin calibrate: error: no CUDA GPU")
    assert not (tmp_path / "c.csv").exists()


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_real_export_and_feature_row_on_cpu(tmp_path):
    """The real export (legacy exporter, weights stripped) of one tiny model + the graph stage."""
    import onnx

    specs = cal.model_specs()
    assert {"small_cnn", "resnet_mini", "mlp", "lstm_lm", "transformer_encoder"} <= set(specs)
    spec = specs["small_cnn"]
    path = cal.export_onnx(spec, tmp_path / "cache")
    assert path.exists() and not list((tmp_path / "cache").glob("*.data"))
    assert path.stat().st_size < 20_000  # weights stripped
    g = onnx.load(str(path), load_external_data=False)
    assert g.opset_import[0].version == cal.OPSET
    dims = [d.dim_param for d in g.graph.input[0].type.tensor_type.shape.dim]
    assert dims[0] == "batch"
    assert cal.export_onnx(spec, tmp_path / "cache") == path  # cached
    m = cal.Measurement(util_mean=40.0, util_max=80.0, mem_peak_mib=600.0,
                        torch_max_alloc_mib=20.0, steps=5, seconds=1.0)
    row = cal.make_row(cal.Run("small_cnn", 16, "train"), "t4", m, path, "cnn")
    feats = json.loads(row["features"])
    assert feats["batch_size"] == 16 and feats["params"] == 62006  # the tutorial net's count
    assert feats["flops"] > 0 and row["mem_mib"] == "600.0"
    # the zoo's graph of the same net has the same features: calibrate builds the same families
    from slurm_horus.graph.features import extract_features

    zoo = extract_features(ZOO / "small_cnn.onnx", batch_size=16)
    assert zoo.values["params"] == feats["params"] and zoo.values["flops"] == feats["flops"]


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_token_model_export_binds_seq(tmp_path):
    spec = cal.model_specs()["lstm_lm"]
    path = cal.export_onnx(spec, tmp_path)
    from slurm_horus.graph.features import extract_features

    r = extract_features(path, batch_size=4, dims=spec.dims)
    assert not r.unknown_dims and r.values["params"] > 19e6
