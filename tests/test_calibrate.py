"""horus-admin calibrate: orchestration with a fake runner and sampler (no torch, no GPU), the
import format and `horus-admin import` of the result, --resume, the real export + features on CPU
(skipped without torch), and the one-line no-GPU error."""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from slurm_horus.calibrate.export import OPSET, export_weightless
from slurm_horus.calibrate.models import ModelSpec, example_input, export_spec, model_specs, trusted_cache
from slurm_horus.calibrate.orchestrate import calibrate
from slurm_horus.calibrate.plan import Measurement, OutOfMemory, Run, plan, run_id
from slurm_horus.calibrate.rows import make_row
from slurm_horus.calibrate.sampler import BackgroundSampler
from slurm_horus.calibrate.torch_runner import TorchRunner, _step, gpu_type_of
from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FEATURE_NAMES, extract_features
from slurm_horus.ledger import Ledger
from slurm_horus.cli.admin import main
from slurm_horus.ledger.retrain import IMPORT_COLUMNS, import_csv

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
        self.specs = {"small_cnn": ModelSpec("small_cnn", "cnn", None, "image", 32),
                      "other_cnn": ModelSpec("other_cnn", "cnn", None, "image", 32)}

    def measure(self, run, sampler, seconds):
        if self.fail_after is not None and len(self.measured) >= self.fail_after:
            raise KeyboardInterrupt  # an interrupt in the middle of the plan
        if self.oom_from and run.batch_size >= self.oom_from:
            raise OutOfMemory("CUDA out of memory")
        sampler.start()
        summary = sampler.stop()
        self.measured.append(run)
        return Measurement(util_mean=summary["util_mean"], util_max=summary["util_max"],
                               mem_peak_mib=(summary["mem_peak_mib"] or 0) + run.batch_size,
                               torch_max_alloc_mib=1000.0 + run.batch_size,
                               torch_max_reserved_mib=1500.0, steps=10, seconds=seconds,
                               samples=summary["samples"],
                               util_source=summary.get("util_source", "process"))

    def export(self, model, cache_dir, training):
        self.exports.append(model)
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        dst = Path(cache_dir) / f"{model}{'.train' if training else ''}.onnx"
        if not dst.exists():
            shutil.copy(ZOO / "small_cnn.onnx", dst)
        return dst


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_orchestration_writes_import_rows(tmp_path):
    out = tmp_path / "calib.csv"
    runner, sampler = FakeRunner(), FakeSampler()
    runs = plan(["small_cnn", "other_cnn"], [32, 8], ["train", "infer"])
    assert len(runs) == 8 and [r.batch_size for r in runs[:2]] == [8, 32]
    res = calibrate(runner, runs, out, sampler_factory=lambda: sampler, seconds=1)
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
    assert r0["calib_id"] == run_id("small_cnn", 8, "train", "a100-40gb")
    assert r0["user"] == ""  # the admin's measurements: no user (the history lets them lower alone)
    # the learned model's CPU input: CPUs per GPU, here all the run had, for its one GPU
    assert float(r0["cpus_per_gpu"]) == len(os.sched_getaffinity(0)) and "cpus_per_task" not in r0
    # an existing file is not overwritten without --resume
    with pytest.raises(HorusError, match="--resume"):
        calibrate(runner, runs, out, sampler_factory=FakeSampler)


def test_csv_is_accepted_by_horus_admin_import(tmp_path):
    out = tmp_path / "calib.csv"
    calibrate(FakeRunner(), plan(["small_cnn"], [8, 32], ["train", "infer"]), out,
                  sampler_factory=FakeSampler)
    url = f"sqlite:///{tmp_path}/ledger.db"
    r = CliRunner().invoke(main, ["import", str(out), "--ledger", url])
    assert r.exit_code == 0 and "imported 4 rows" in r.output, r.output
    L = Ledger(url)
    assert L.count("usage") == 4 and L.count("submissions") == 4
    # no user: the admin's own measurements, which may lower the history's figures alone (as
    # 'calibrate' they were one user's, and could only raise them)
    assert {j["user_name"] for j in L.jobs()} == {None}
    CliRunner().invoke(main, ["import", str(out), "--ledger", url])  # idempotent
    assert L.count("usage") == 4



def test_imported_rows_keep_their_graph_when_the_export_cache_is_gone(tmp_path):
    """Imported rows had no sha: each export hashed the cached ONNX named in the row, so once
    the calibration's cache was cleaned the rows lost their graph and answered for no job."""
    import shutil

    from slurm_horus.ledger.history_export import build_history

    out = tmp_path / "calib.csv"
    calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train", "infer"]), out,
              sampler_factory=FakeSampler)
    L = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    import_csv(L, str(out))
    before = build_history(L)["graphs"]
    shutil.rmtree(tmp_path / "horus-calibrate-onnx")
    assert before and build_history(L)["graphs"] == before
    import_csv(L, str(out))  # again, the files gone: the shas read the first time stay
    assert build_history(L)["graphs"] == before


def test_ledger_rows_match_a_later_import(tmp_path):
    """--ledger imports each row as it is written; importing the CSV afterwards adds nothing."""
    out = tmp_path / "calib.csv"
    L = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train", "infer"]), out,
                  sampler_factory=FakeSampler, ledger=L)
    assert L.count("usage") == 2
    import_csv(L, str(out))
    assert L.count("usage") == 2


def test_resume_refuses_rows_another_user_could_write(tmp_path):
    """--resume takes the CSV's rows as measured and imports them: a file others can write (or
    a link) is refused, as the export cache is; forged rows had been imported and their runs
    skipped."""
    out = tmp_path / "calib.csv"
    calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), out, sampler_factory=FakeSampler)
    runs = plan(["small_cnn"], [8, 32], ["train"])
    for bad in ("mode", "link"):
        target = out
        if bad == "mode":
            out.chmod(0o666)
        else:
            out.chmod(0o644)
            target = tmp_path / "link.csv"
            target.symlink_to(out)
        with pytest.raises(HorusError, match="not a file of yours that only you can write"):
            calibrate(FakeRunner(), runs, target, sampler_factory=FakeSampler, resume=True)
    res = calibrate(FakeRunner(), runs, out, sampler_factory=FakeSampler, resume=True)
    assert len(res.skipped) == 1 and len(res.done) == 1
    # its own file, written under a umask that lets the group write (user-private groups)
    old = os.umask(0o002)
    try:
        own = tmp_path / "own.csv"
        calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), own, sampler_factory=FakeSampler)
        res = calibrate(FakeRunner(), runs, own, sampler_factory=FakeSampler, resume=True)
    finally:
        os.umask(old)
    assert len(res.skipped) == 1 and len(res.done) == 1 and own.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("damage,want", [
    (lambda line: line + ",extra", "has more fields than the header"),
    (lambda line: line.replace(",3008.0,", ",abc,", 1), "mem_mib 'abc' is not a number")])
def test_resume_refuses_rows_calibrate_did_not_write(tmp_path, damage, want):
    """A resumed row with a field too many was an internal error; one whose memory is not a
    number was counted done (its run never measured) or failed naming a deleted temporary
    file."""
    out = tmp_path / "calib.csv"
    calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), out, sampler_factory=FakeSampler)
    head, row = out.read_text().splitlines()
    assert ",3008.0," in row
    out.write_text(f"{head}\n{damage(row)}\n")
    for ledger in (None, Ledger(f"sqlite:///{tmp_path}/l.db")):
        with pytest.raises(HorusError, match=want):
            calibrate(FakeRunner(), plan(["small_cnn"], [8, 32], ["train"]), out,
                      sampler_factory=FakeSampler, resume=True, ledger=ledger)


def test_resume_skips_done_runs(tmp_path):
    out = tmp_path / "calib.csv"
    runs = plan(["small_cnn", "other_cnn"], [8, 32], ["train"])
    interrupted = FakeRunner(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        calibrate(interrupted, runs, out, sampler_factory=FakeSampler)
    assert len(rows(out)) == 2  # what finished before the interrupt is on disk
    # a row cut in the middle by a crash: the partial line has no mem_mib, is not "done"
    with open(out, "a") as f:
        f.write("x,{}")
    again = FakeRunner()
    res = calibrate(again, runs, out, sampler_factory=FakeSampler, resume=True)
    assert len(res.skipped) == 2 and len(res.done) == 2
    assert [(r.model, r.batch_size) for r in again.measured] == [("other_cnn", 8),
                                                                 ("other_cnn", 32)]
    ids = [r["calib_id"] for r in rows(out) if r.get("mem_mib")]
    assert len(ids) == 4 and len(set(ids)) == 4
    res = calibrate(FakeRunner(), runs, out, sampler_factory=FakeSampler, resume=True)
    assert not res.done and len(res.skipped) == 4


def test_oom_skips_larger_batches(tmp_path):
    out = tmp_path / "calib.csv"
    runner = FakeRunner(oom_from=32)
    res = calibrate(runner, plan(["small_cnn"], [8, 32, 128], ["train"]), out,
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
    res = calibrate(FakeRunner(), plan(["small_cnn"], [8], ["infer"]), out,
                        sampler_factory=Blind)
    assert not res.done and "no utilization" in res.failed[0][1] and rows(out) == []


def test_a_failed_measurement_costs_its_run_only(tmp_path):
    # a cuDNN or CUDA error (not torch's OutOfMemoryError) had ended the whole calibration
    class Flaky(FakeRunner):
        def measure(self, run, sampler, seconds):
            if run.model == "other_cnn":
                raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
            return super().measure(run, sampler, seconds)

    res = calibrate(Flaky(), plan(["other_cnn", "small_cnn"], [8], ["train"]), tmp_path / "c.csv",
                    sampler_factory=FakeSampler)
    assert [r["calib_id"] for r in rows(tmp_path / "c.csv")] == res.done and len(res.done) == 1
    assert res.failed[0][1] == "measure: RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_run_another_process_shared_the_gpu_with_gives_no_row(tmp_path):
    class Shared(FakeSampler):
        def stop(self):
            return {**super().stop(), "util_source": "shared"}

    res = calibrate(FakeRunner(), plan(["small_cnn"], [8], ["infer"]), tmp_path / "c.csv",
                    sampler_factory=Shared)
    assert not res.done and "another process" in res.failed[0][1] and rows(tmp_path / "c.csv") == []


def test_resume_with_a_ledger_imports_rows_written_before(tmp_path):
    # a row is on disk before its import: an import that failed (or an interrupt between the
    # two) left it out of the ledger for good, --resume counting it done
    out, runs = tmp_path / "c.csv", plan(["small_cnn"], [8, 32], ["train"])
    calibrate(FakeRunner(fail_after=1), runs[:1], out, sampler_factory=FakeSampler)
    L = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    res = calibrate(FakeRunner(), runs, out, sampler_factory=FakeSampler, resume=True, ledger=L)
    assert len(res.skipped) == 1 and len(res.done) == 1 and L.count("usage") == 2


def test_a_row_cut_inside_its_features_is_measured_again_and_keeps_the_next(tmp_path):
    out, runs = tmp_path / "c.csv", plan(["small_cnn"], [8, 32], ["train"])
    calibrate(FakeRunner(), runs, out, sampler_factory=FakeSampler)
    text = out.read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    cut = text[:len(text) - len(last) - 1 + last.index('"batch_size"') + 3]  # inside the quote
    out.write_text(cut)
    again = FakeRunner()
    res = calibrate(again, runs, out, sampler_factory=FakeSampler, resume=True)
    assert [r.batch_size for r in again.measured] == [32] and len(res.skipped) == 1
    assert sorted(r["batch_size"] for r in rows(out)) == ["32", "8"]
    L = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    import_csv(L, str(out))
    assert L.count("usage") == 2


def test_nvml_that_cannot_start_leaves_no_csv(tmp_path):
    def broken():
        raise OSError("NVML Shared Library Not Found")

    with pytest.raises(HorusError, match="NVML cannot sample the GPU .OSError: NVML Shared"):
        calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), tmp_path / "c.csv",
                  sampler_factory=broken)
    assert not (tmp_path / "c.csv").exists()


def test_an_export_cache_others_can_write_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(HorusError, match="only you can write"):
        calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), tmp_path / "c.csv",
                  sampler_factory=FakeSampler, cache_dir=cache)


def test_links_planted_at_out_or_the_cache_are_not_followed(tmp_path):
    """Root had created (and chmodded) the file a dangling link at --out named, written to one
    it named that was empty, and exported graphs into the folder a link named as the cache."""
    runs = plan(["small_cnn"], [8], ["train"])
    victim, empty = tmp_path / "victim", tmp_path / "empty"
    empty.write_text("")
    empty.chmod(0o600)
    for name, target in (("dangling.csv", victim), ("to_empty.csv", empty)):
        (tmp_path / name).symlink_to(target)
        with pytest.raises(HorusError, match="symbolic link"):
            calibrate(FakeRunner(), runs, tmp_path / name, sampler_factory=FakeSampler,
                      cache_dir=tmp_path / "cache")
    assert not victim.exists() and empty.read_text() == "" and empty.stat().st_mode & 0o777 == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "horus-calibrate-onnx").symlink_to(elsewhere)
    with pytest.raises(HorusError, match="not a folder of yours"):
        calibrate(FakeRunner(), runs, tmp_path / "linked" / "c.csv", sampler_factory=FakeSampler)
    assert not list(elsewhere.iterdir())


def test_an_empty_out_file_another_user_owns_is_refused(tmp_path):
    """Its owner could add forged rows to what root wrote there before `horus-admin import`."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file away")
    out = tmp_path / "c.csv"
    out.write_text("")
    out.chmod(0o666)
    os.chown(out, 65534, 65534)
    with pytest.raises(HorusError, match="not a file of yours"):
        calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), out, sampler_factory=FakeSampler)
    assert out.read_text() == ""


def test_gpu_type_from_device_name():
    assert gpu_type_of("NVIDIA A100-SXM4-40GB", "a100-40gb") == "a100-40gb"
    assert gpu_type_of("NVIDIA H200") == "h200"
    with pytest.raises(HorusError, match="--gpu-type"):
        gpu_type_of("Imaginary GPU 9000")
    assert gpu_type_of("Imaginary GPU 9000", "a100-40gb") == "a100-40gb"  # the only way to name it
    # --gpu-type names what the device is, never another GPU: an H200's runs had been filed
    # as an A100's, and the A100 predictions learned from them
    with pytest.raises(HorusError, match=r"--gpu-type a100-40gb: this device, 'NVIDIA H200' \(hopper"):
        gpu_type_of("NVIDIA H200", "a100-40gb", 143771)
    with pytest.raises(HorusError, match="not a100-40gb"):  # same architecture, twice the memory
        gpu_type_of("NVIDIA A100-SXM4-80GB", "a100-40gb", 81050)
    # by memory where the catalog knows the name in part, or not at all
    with pytest.raises(HorusError, match=r"GPU type: .*\(65536 MiB\), is not a100-40gb.*--gpu-type"):
        gpu_type_of("NVIDIA A100-SXM-64GB", None, 65536)
    for name, override, mib in (("NVIDIA A100-SXM-64GB", "a100", 65536), ("NVIDIA H20", "a100-40gb", 97871)):
        with pytest.raises(HorusError, match="is not a100-40gb"):
            gpu_type_of(name, override, mib)
    assert gpu_type_of("Tesla T4", None, 15109) == "t4"  # ECC on: a little less
    assert gpu_type_of("NVIDIA A100-SXM4-80GB", "a100-pcie-80gb", 81050) == "a100-pcie-80gb"


def test_cli_errors_are_one_line(tmp_path):
    out = str(tmp_path / "c.csv")
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--tasks", "train,fly"])
    assert r.exit_code == 2 and "horus-admin calibrate: error: --tasks" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--batch-sizes", "8,x"])
    assert r.exit_code == 2 and "--batch-sizes" in r.output
    r = CliRunner().invoke(main, ["calibrate"])
    assert r.exit_code == 2 and "error: --out CSV is required" in r.output


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_list_models_needs_no_gpu_and_no_out():
    r = CliRunner().invoke(main, ["calibrate", "--list-models"])
    assert r.exit_code == 0, r.output
    listed = {line.split()[0] for line in r.output.splitlines()}
    assert {"small_cnn", "mlp", "lstm_lm", "transformer_encoder"} <= listed


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_no_gpu_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = CliRunner().invoke(main, ["calibrate", "--out", str(tmp_path / "c.csv")])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("horus-admin calibrate: error: no CUDA GPU")
    assert not (tmp_path / "c.csv").exists()


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_options_are_checked_before_the_gpu(tmp_path):
    # on a node without a GPU, a wrong model name or GPU type was reported only as "no CUDA
    # GPU": fixed that, the run on a GPU node then failed on the option
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = str(tmp_path / "c.csv")
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--models", "mlp,resnet9000"])
    assert r.exit_code == 2 and "error: --models: unknown or not buildable here: resnet9000" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--gpu-type", "h9000"])
    assert r.exit_code == 2 and "error: --gpu-type: unknown GPU type 'h9000'" in r.output
    for dev in ("cpu", "cudax", "cuda:abc", "cuda:0,1"):  # torch.device's own error was internal
        r = CliRunner().invoke(main, ["calibrate", "--out", out, "--models", "mlp", "--device", dev])
        assert r.exit_code == 2 and f"error: --device {dev}: calibrate measures GPUs" in r.output, r.output
    ledger = tmp_path / "new" / "l.db"  # opened (created, migrated) only once a GPU is there
    r = CliRunner().invoke(main, ["calibrate", "--out", out, "--models", "mlp", "--gpu-type", "h200",
                                  "--ledger", f"sqlite:///{ledger}"])
    assert r.exit_code == 2 and "error: no CUDA GPU" in r.output, r.output
    assert not (tmp_path / "c.csv").exists() and not ledger.exists()


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_real_export_and_feature_row_on_cpu(tmp_path):
    """The real export (legacy exporter, weights stripped) of one tiny model + the graph stage."""
    specs = model_specs()
    assert {"small_cnn", "resnet_mini", "mlp", "lstm_lm", "transformer_encoder"} <= set(specs)
    spec = specs["small_cnn"]
    old = os.umask(0o002)  # a user-private-group umask: a 0775 cache was then refused as untrusted
    try:
        path = export_spec(spec, tmp_path / "cache")
    finally:
        os.umask(old)
    trusted_cache(tmp_path / "cache")
    assert path.exists() and not list((tmp_path / "cache").glob("*.data"))
    assert path.stat().st_size < 20_000  # weights stripped
    g = onnx.load(str(path), load_external_data=False)
    assert g.opset_import[0].version == OPSET
    dims = [d.dim_param for d in g.graph.input[0].type.tensor_type.shape.dim]
    assert dims[0] == "batch"
    assert export_spec(spec, tmp_path / "cache") == path  # cached
    m = Measurement(util_mean=40.0, util_max=80.0, mem_peak_mib=600.0,
                        torch_max_alloc_mib=20.0, steps=5, seconds=1.0)
    row = make_row(Run("small_cnn", 16, "train"), "t4", m, path, "cnn")
    feats = json.loads(row["features"])
    assert feats["batch_size"] == 16 and feats["params"] == 62006  # the tutorial net's count
    assert feats["flops"] > 0 and row["mem_mib"] == "600.0"
    # the zoo's graph of the same net has the same features: calibrate builds the same families
    zoo = extract_features(ZOO / "small_cnn.onnx", batch_size=16)
    assert zoo.values["params"] == feats["params"] and zoo.values["flops"] == feats["flops"]


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_training_rows_use_a_training_mode_export(tmp_path):
    """Training rows were measured with model.train() but described by the eval export, which
    has no Dropout (nor its masks' memory): graph features and memory came from different jobs."""
    from torch import nn

    spec = ModelSpec("drop_mlp", "mlp", lambda: nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4)), "vector", 16)

    class CpuTorchRunner(TorchRunner):
        """TorchRunner's own export; a measurement needs no GPU."""

        gpu_type = "a100-40gb"

        def __init__(self):
            self.specs = {"drop_mlp": spec}

        def measure(self, run, sampler, seconds):
            return FakeRunner().measure(run, sampler, seconds)

    out = tmp_path / "c.csv"
    res = calibrate(CpuTorchRunner(), plan(["drop_mlp"], [8], ["train", "infer"]), out,
                    sampler_factory=FakeSampler, cache_dir=tmp_path / "cache")
    assert not res.failed and len(res.done) == 2
    graphs = {r["task"]: Path(r["model"]) for r in rows(out)}
    assert {t: g.name for t, g in graphs.items()} == {"train": "drop_mlp.train.onnx",
                                                      "infer": "drop_mlp.onnx"}

    def ops(path):
        return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]

    assert "Dropout" in ops(graphs["train"]) and "Dropout" not in ops(graphs["infer"])


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_token_model_export_binds_seq(tmp_path):
    spec = model_specs()["lstm_lm"]
    path = export_spec(spec, tmp_path)
    r = extract_features(path, batch_size=4, dims=spec.dims)
    assert not r.unknown_dims and r.values["params"] > 19e6


@pytest.mark.parametrize("extra", [["--out", "c.csv"], ["--list-models"]])
def test_package_and_cli_import_without_torch(tmp_path, extra):
    """torch is an optional extra: every calibrate module imports, and the CLI says what to install,
    when torch cannot be imported at all."""
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('No module named torch')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import slurm_horus.calibrate.export, slurm_horus.calibrate.models\n"
        "import slurm_horus.calibrate.orchestrate, slurm_horus.calibrate.sampler\n"
        "import slurm_horus.calibrate.torch_runner\n"
        "from slurm_horus.cli.admin import main\n"
        f"main(['calibrate', *{extra!r}])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "horus-admin calibrate: error: calibrate needs PyTorch with CUDA: "
        "pip install torch (the [calibrate] extra)"]


class FakeNvml:
    """A GPU stand-in (no GPU here) for the ledger's NvmlSampler: this process's figures are
    `process`, the whole device's (77 %, 5000 MiB)."""

    def __init__(self, process, others=()):
        self.process, self.restarted = process, 0
        self.pids, self.closed, self.others = [], False, set(others)

    def from_now(self):
        self.restarted += 1

    def sample(self, pids):
        self.pids.append(pids)
        return self.process

    def processes(self):
        return self.others | ({os.getpid()} if self.process[1] else set())

    def device_use(self):
        return 77.0, 5000.0

    def close(self):
        self.closed = True


@pytest.mark.parametrize("process,others,want", [
    ((40.0, 1200.0), (), (40.0, 1200.0, "process")),
    ((None, 0.0), (), (77.0, 5000.0, "device")),
    ((None, 0.0), (4242,), (77.0, 5000.0, "device")),  # the one process may be this one
    # another process on the GPU: its figures are not this run's alone (no row is written)
    ((40.0, 1200.0), (4242,), (40.0, 1200.0, "shared")),
    ((None, 0.0), (4242, 4343), (77.0, 5000.0, "shared"))])
def test_background_sampler_process_or_device_figures(process, others, want):
    nvml = FakeNvml(process, others)
    s = BackgroundSampler(nvml, interval=0.01)
    s.start()
    assert nvml.restarted == 1  # utilization samples from before start() are not counted
    time.sleep(0.1)
    got = s.stop()
    assert got["samples"] >= 2 and nvml.pids[0] == {os.getpid()}
    assert (got["util_mean"], got["mem_peak_mib"], got["util_source"]) == want
    n = got["samples"]
    time.sleep(0.05)
    assert s.summary.samples == n  # stopped means stopped
    s.close()
    assert nvml.closed


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_failed_export_leaves_nothing_behind(tmp_path):
    import torch

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("cannot trace this")

    out = tmp_path / "broken.onnx"
    with pytest.raises(RuntimeError, match="cannot trace"):
        export_weightless(Broken(), (torch.randn(1, 4),), out, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}},
                          dynamo_fallback=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("name", ["mlp", "lstm_lm"])
def test_train_step_updates_weights_and_infer_does_not(name):
    """The step TorchRunner times on the GPU, run here on the CPU on a small input."""
    import torch

    spec = model_specs()[name]
    torch.manual_seed(0)
    model = spec.build()
    x = example_input(spec, 2)
    before = [p.detach().clone() for p in model.parameters()]
    infer, opt = _step(torch, model, x, train=False)
    infer()
    assert opt is None and not model.training
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    train, opt = _step(torch, model, x, train=True)
    train()
    assert isinstance(opt, torch.optim.Adam) and model.training
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_sampler_stuck_in_nvml_ends_its_run_not_the_calibration(monkeypatch):
    import slurm_horus.calibrate.sampler as sm

    class Stuck(FakeNvml):
        def sample(self, pids):
            time.sleep(0.5)  # an NVML call that does not come back in time
            return super().sample(pids)

    monkeypatch.setattr(sm, "STOP_WAIT_S", 0.05)
    s = BackgroundSampler(Stuck((40.0, 1200.0)), interval=0.01)
    s.start()
    time.sleep(0.02)
    with pytest.raises(HorusError, match="NVML stopped answering"):
        s.stop()
    with pytest.raises(HorusError, match="stopped answering in an earlier run"):
        s.start()  # the stuck thread would sample into the next run's figures


def test_resume_on_a_file_that_is_not_calibrates_changes_nothing(tmp_path):
    # its last line was cut, and with --ledger its rows imported, before the header was checked
    notes = tmp_path / "notes.txt"
    notes.write_text("l1\nimportant last line")
    L = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    with pytest.raises(HorusError, match="other columns"):
        calibrate(FakeRunner(), plan(["small_cnn"], [8], ["train"]), notes, sampler_factory=FakeSampler,
                  resume=True, ledger=L)
    assert notes.read_text() == "l1\nimportant last line" and L.count("usage") == 0


def test_calibrate_and_its_command_judge_the_paths_with_one_check(tmp_path):
    """The command had its own copy of the library's "exists: pass --resume" check, and more
    checks the library lacked: a missing folder was a bare FileNotFoundError there, after the
    GPU had been opened."""
    from slurm_horus.calibrate import orchestrate
    from slurm_horus.cli import admin_calibrate

    assert admin_calibrate.check_paths is orchestrate.check_paths
    opened = []

    def sampler():
        opened.append(1)
        return FakeSampler()
    runs = plan(["small_cnn"], [8], ["train"])
    full = tmp_path / "full.csv"
    full.write_text("calib_id,mem_mib\n")
    fifo = tmp_path / "cache"
    os.mkfifo(fifo)
    for out, cache, says in ((tmp_path / "none" / "c.csv", None, "no folder"),
                             (full, None, "exists: pass --resume"),
                             (tmp_path / "c.csv", fifo, "--cache-dir .*: not a folder")):
        with pytest.raises(HorusError, match=says):
            calibrate(FakeRunner(), runs, out, sampler_factory=sampler, cache_dir=cache)
    assert not opened and not (tmp_path / "c.csv").exists()
