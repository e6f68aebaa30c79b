"""hsubmit review 6: empty values of hsubmit's own options, and sbatch's grammar around them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.predict.workload import workload_from
from slurm_horus.slurm import submit as sub

ZOO = Path(__file__).resolve().parent / "data" / "zoo"
MODEL = str(ZOO / "resnet50.onnx")


def hsubmit(args, env):
    return subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("opts,msg", [
    (["--task", ""], "--task is empty"), (["--optimizer", ""], "--optimizer is empty"),
    (["--precision", ""], "--precision is empty"), (["--precision", "  "], "--precision is empty"),
    (["--task="], "--task is empty"), (["--batch-size="], "--batch-size '': need an integer"),
])
def test_an_empty_value_of_hsubmits_own_options_is_an_error(tmp_path, slurm_bin, opts, msg):
    """--task '' (an unset variable) became train silently, while --batch-size '' was an error;
    --batch-size= was batch 1.  An empty value is refused as a bad one is, from the command line
    and from #HORUS lines alike: exit 2, one line, nothing submitted."""
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", MODEL, *opts, "--wrap", "true"], env)
    assert cp.returncode == 2 and not log.exists() and cp.stdout == "", cp.stderr
    assert cp.stderr.count("\n") == 1 and msg in cp.stderr and "hsubmit: error: " in cp.stderr
    name = opts[0].partition("=")[0]
    script = tmp_path / "job.sh"
    value = "".join(opts[1:])
    script.write_text(f"#!/bin/sh\n#SBATCH --gres=gpu:1\n#HORUS --model={MODEL}\n#HORUS {name}='{value}'\ntrue\n")
    plan = sub.prepare(["-p", "gpu", str(script)], env={})
    with pytest.raises(HorusError, match=re.escape(msg)):
        sub.check_options(plan)


@pytest.mark.parametrize("stored", ["", "  ", None])
def test_a_stored_workload_field_that_is_blank_is_the_default(stored):
    """workload_from read whitespace alone as a task named '' (an error costing the row),
    while an empty one, and a blank batch size, meant the default."""
    w = workload_from({"task": stored, "optimizer": stored, "precision": stored, "batch_size": stored})
    assert (w.task, w.optimizer, w.precision, w.batch_size) == ("train", "adam", "fp32", 1)
    assert workload_from({"task": " infer "}).task == "infer"


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_model_dir_is_warned_of_as_an_empty_model_is(slurm_bin, value):
    """--horus-model-dir '' (an unset variable) silently meant the site's registry: the user
    asked for another one.  As with --model '': a warning and the job unchanged, or refused
    where the site refuses jobs whose prediction fails."""
    env, log = slurm_bin
    argv = ["-p", "gpu", "--gres=gpu:1", "--model", MODEL, "--batch-size", "8", "--horus-model-dir", value,
            "--wrap", "true"]
    cp = hsubmit(argv, env)
    assert cp.returncode == 0 and "--horus-model-dir is empty" in cp.stderr, cp.stderr
    assert cp.stderr.count("\n") == 1
    assert log.read_text().splitlines() == ["-p", "gpu", "--gres=gpu:1", "--wrap", "true"]
    log.unlink()
    cp = hsubmit(argv, {**env, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert cp.returncode == 1 and "--horus-model-dir is empty" in cp.stderr and not log.exists()
