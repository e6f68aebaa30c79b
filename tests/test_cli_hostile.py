"""horus, calibrate and import against odd input (a review's findings, kept as cases): horus
predict agrees with hsubmit on the CPU count and the hint's memory bounds; names are not markup;
a fixed-batch graph says the batch size was not applied; calibrate's output is a regular file,
its rows name the model absolutely and its plan has no repeats; an import refuses rows that
would break every later retrain."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import click
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.predict.coldstart import Prediction

ZOO = Path(__file__).resolve().parent / "data" / "zoo"


def test_horus_predict_assumes_one_cpu_per_gpu_as_hsubmit_does_for_a_one_gpu_job():
    from slurm_horus.cli.horus import main
    from slurm_horus.slurm import submit as sub

    r = CliRunner().invoke(main, ["predict", str(ZOO / "resnet50.onnx"), "-b", "8", "--gpu", "a100",
                                  "--json"])
    assert r.exit_code == 0, r.output
    workload = json.loads(r.stdout)["workload"]
    assert workload["cpus_per_gpu"] == 1 and "cpus_per_task" not in workload
    one_gpu = sub.prepare(["--gres=gpu:1", "--wrap", "x"], env={})
    assert sub.check_options(one_gpu)[0].cpus_per_gpu == 1
    r = CliRunner().invoke(main, ["predict", str(ZOO / "resnet50.onnx"), "-b", "8", "--gpu", "a100",
                                  "--cpus-per-gpu", "8", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["workload"]["cpus_per_gpu"] == 8, r.output


@pytest.mark.parametrize("value", ["0", "-2", "nan", "inf", "x"])
def test_horus_predict_refuses_a_cpu_count_per_gpu_that_is_none_in_one_line(value):
    from slurm_horus.cli.horus import main

    r = CliRunner().invoke(main, ["predict", str(ZOO / "resnet50.onnx"), "-b", "8", "--gpu", "a100",
                                  f"--cpus-per-gpu={value}"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "No such option" not in r.output and len(r.output.strip().splitlines()) == 1
    assert "cpus-per-gpu" in r.output.lower().replace("cpus per gpu", "cpus-per-gpu")


def test_a_p95_calibrated_without_a_p99_travels_in_the_hint():
    """The fit column charges the p95 where it exists (memory = p95): so must the hint."""
    from slurm_horus.slurm.hint import parse_hint
    from slurm_horus.slurm.submit import _hint_of

    p = Prediction("a100-40gb", 30.0, 4000.0, 4500.0, "learned", mem_mib_p95=5200.0)
    assert parse_hint(_hint_of({"a100": p}))["a100"][3] == 5200
    both = Prediction("a100-40gb", 30.0, 4000.0, 4500.0, "learned", mem_mib_p95=5200.0, mem_mib_p99=6000.0)
    assert parse_hint(_hint_of({"a100": both}))["a100"][3:] == (5200, 6000)


def test_names_in_horus_tables_are_not_markup(tmp_path):
    from slurm_horus.cli.horus import main

    path = tmp_path / "[red]net.onnx"
    shutil.copy(ZOO / "small_cnn.onnx", path)
    for args in (["features", str(path), "-b", "2"], ["predict", str(path), "-b", "2", "--gpu", "a100"]):
        r = CliRunner().invoke(main, args, terminal_width=200)
        assert r.exit_code == 0 and "[red]net.onnx" in r.output, r.output


def _static(path: Path) -> Path:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_batch_size_a_fixed_graph_cannot_take_is_said(tmp_path):
    path = _static(tmp_path / "static.onnx")
    r = extract_features(path, batch_size=32)
    assert r.fixed_batch == [1] and any("batch size 32 not applied" in w for w in r.warnings())
    assert not extract_features(path, batch_size=1).warnings()
    assert not extract_features(ZOO / "resnet50.onnx", batch_size=32).fixed_batch


def test_without_a_batch_size_a_sequence_length_is_no_batch():
    seq = next(p for p in ("bert_base.onnx", "gpt2.onnx", "t5_small.onnx") if (ZOO / p).exists())
    r = extract_features(ZOO / seq, dims={"seq": 128})
    assert r.values["batch_size"] == 1


def test_calibrate_output_must_be_a_regular_file(tmp_path):
    from slurm_horus.calibrate.rows import CsvAppender, complete_rows

    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    with pytest.raises(HorusError, match="not a regular file"):
        complete_rows(fifo)
    with pytest.raises(HorusError, match="not a regular file"):
        CsvAppender(fifo)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"calib_id,mem_mib\n\xff\xfe,1\n")
    with pytest.raises(HorusError, match="not a calibrate CSV"):
        complete_rows(bad)


def test_calibrate_plans_each_run_once():
    from slurm_horus.calibrate.plan import plan

    runs = plan(["mlp", "mlp"], [8, 8, 4], ["train", "train"])
    assert [(r.model, r.batch_size, r.task) for r in runs] == [("mlp", 4, "train"), ("mlp", 8, "train")]


@pytest.mark.parametrize("field,value,why", [
    ("features", "nan", "not a finite number"),
    ("features", '"=cmd|x"', "not a finite number"),
    ("cold_mem_mib", "nan", "cold_"),
    ("mem_mib", "inf", "mem_mib"),
    ("util_max_pct", "1e308", "util_max_pct"),
    ("batch_size", "99999999999999999999999", "batch size must be an integer from 1 to"),
])
def test_an_import_refuses_rows_that_would_break_every_retrain(tmp_path, field, value, why):
    import csv

    from slurm_horus.graph.features import FEATURE_NAMES
    from slurm_horus.ledger import Ledger
    from slurm_horus.ledger.retrain import import_csv

    feats = {n: 1.0 for n in FEATURE_NAMES}
    row = {"gpu_type": "a100", "util_pct": "40", "mem_mib": "5000", "batch_size": "8",
           "cold_util_pct": "30", "cold_mem_mib": "4000", "util_max_pct": "90"}
    if field == "features":
        feats["flops"] = float("nan") if value == "nan" else "=cmd|x"
    else:
        row[field] = value
    row["features"] = json.dumps(feats)
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    with pytest.raises(HorusError, match=why):
        import_csv(Ledger(f"sqlite:///{tmp_path}/l.db"), str(path))


def test_a_refused_registry_file_is_quoted_in_one_short_printable_line(tmp_path):
    """A model file whose refusal quotes megabytes of escape codes: hsubmit and horus print a
    short line (the whole text took minutes to lay out)."""
    from slurm_horus.predict.chain import MAX_WARNING, choose_predictor

    reg = tmp_path / "reg"
    reg.mkdir()
    (reg / "v0001.json").write_text(json.dumps({"format_version": "\x1b[2J" + "x" * 3_000_000}))
    (reg / "current.json").write_text(json.dumps({"serving": "v0001"}))
    choice = choose_predictor(str(reg))
    for text in (choice.warning, choice.note):
        assert text and len(text) <= MAX_WARNING and "\x1b" not in text


@pytest.mark.parametrize("cmd", [
    "slurm_horus.cli.horus predict tests/data/zoo/mobilenet_v2.onnx --batch-size 8",
    "slurm_horus.cli.horus features tests/data/zoo/mobilenet_v2.onnx --batch-size 8",
    "slurm_horus.cli.hacct -a -M all",
    "slurm_horus.cli.admin models list",
])
def test_a_command_whose_answer_is_its_output_fails_with_stdout_closed(cmd, tmp_path):
    """Started with standard output closed (>&-), as cat does: one line and exit 1 (horus
    predict printed nothing and exited 0)."""
    import subprocess
    import sys

    env = {**os.environ, "HORUS_LEDGER_URL": f"sqlite:///{tmp_path}/l.db", "HORUS_MODEL_DIR": str(tmp_path)}
    env.pop("SLURM_CONF", None)
    cp = subprocess.run(f"{sys.executable} -m {cmd} >&-", shell=True, capture_output=True, text=True,
                        timeout=120, env=env, cwd=Path(__file__).resolve().parent.parent)
    assert cp.returncode == 1 and cp.stderr.endswith(": error: standard output is closed\n"), cp.stderr


def test_hacct_plot_to_a_file_needs_no_stdout(tmp_path):
    """--plot FILE.png: the file is the answer, written with standard output closed."""
    import subprocess
    import sys

    pytest.importorskip("matplotlib")
    from slurm_horus.ledger import Ledger

    url = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(url)
    L.record_submission(job_id=1, cluster="c", user="root", submit_time=1700000000,
                        predictions={"a100": {"util_pct": 30, "mem_mib": 3000}})
    L.record_usage(job_id=1, cluster="c", source="sacct", util_mean=40, mem_peak_mib=3500,
                   state="COMPLETED", gpu_type="a100", end_time=1700000600)
    L.close()
    env = {**os.environ, "HORUS_LEDGER_URL": url}
    env.pop("SLURM_CONF", None)
    png = tmp_path / "p.png"
    cp = subprocess.run(f"{sys.executable} -m slurm_horus.cli.hacct -a -M all --plot {png} >&-", shell=True,
                        capture_output=True, text=True, timeout=120, env=env)
    assert cp.returncode == 0 and png.stat().st_size > 0, cp.stderr


def test_click_usage_errors_one_line_help_whole_and_prefixes_where_getopt_takes_them(tmp_path):
    """One-line usage errors must not squash a group's help (click 8.2 raises it as a usage
    error), nor reach into a command's own arguments (horus-probe CMD --job x), and errors a
    command's body raises are one line too."""
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)
    bare = run("slurm_horus.cli.admin")
    help_text = bare.stdout + bare.stderr
    assert help_text.startswith("Usage: ") and "\n  Administer slurm-horus.\n" in help_text
    assert ", version " in run("slurm_horus.cli.admin", "--vers").stdout  # the group's own options
    body = run("slurm_horus.cli.admin", "sync", "--ledger", f"sqlite:///{tmp_path}/l.db", "-S", "now",
               "-E", "now-1hour")
    (line,) = body.stderr.strip().splitlines()
    assert body.returncode == 2 and line.endswith(" sync: error: --since is after --until (see "
                                                  "python -m slurm_horus.cli.admin sync --help)")
    from slurm_horus.cli import probe
    from slurm_horus.cli.common import _expand_prefixes

    # horus-probe CMD: CMD's options are CMD's, whole or in part (--interval had been the probe's)
    for argv in (["python", "t.py", "--job", "x"], ["python", "t.py", "--interval", "5", "--prolog"]):
        ctx = probe.main.make_context("horus-probe", ["--int", "3", *argv])
        assert ctx.params["command"] == tuple(argv) and ctx.params["interval"] == 3.0, ctx.params
        assert ctx.params["mode"] is None
    from slurm_horus.cli.hacct import main as hacct

    params = hacct.get_params(click.Context(hacct))
    assert _expand_prefixes(params, ["-Xo", "--allus", "--allus"]) == ["-Xo", "--allus", "--allusers"]
    # an option whose value is optional (--plot [FILE]) leaves the next option to be spelled out
    assert _expand_prefixes(params, ["--plot", "--sum"]) == ["--plot", "--summary"]
