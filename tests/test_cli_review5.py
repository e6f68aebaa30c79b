"""The command-line tools against hostile values (a fifth review's findings, kept as cases):
a file, folder or URL option given empty is an error, never the site's default; hacct's
names that are no UTF-8; queue's --interval bound and empty --jobs; doctor's slurm.conf a
FIFO; calibrate's --out, --cache-dir, --models and --batch-sizes judged before the GPU."""

from __future__ import annotations

import os
import time

import pytest
from click.testing import CliRunner

from slurm_horus.cli.admin import main as admin
from slurm_horus.cli.hacct import main as hacct
from slurm_horus.cli.horus import main as horus
from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger

EMPTY = "empty (an unset variable?)"


def one_line_usage_error(r, prog: str, says: str):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and says in lines[0], r.output
    assert "Traceback" not in r.output and "internal error" not in r.output


@pytest.fixture
def ledger(tmp_path):
    u = f"sqlite:///{tmp_path}/l.db"
    L = Ledger(u, spool=str(tmp_path / "sp"))
    now = int(time.time())
    L.record_submission(job_id=7, cluster="c", user="ann", account="ml", submit_time=now - 60,
                        predictions={"a100": {"util_pct": 30, "mem_mib": 3000}})
    L.record_usage(job_id=7, cluster="c", source="sacct", util_mean=40, mem_peak_mib=3500,
                   state="COMPLETED", elapsed_s=60, gpus=1, start_time=now - 50, end_time=now - 5)
    return u


# each: where '' had been taken as "not given" and the site's default (or nothing) used instead
ADMIN_EMPTY = [
    ["sync", "--from-file", ""],            # ran sacct instead of reading the file
    ["sync", "--ledger", ""],               # the site's ledger
    ["retrain", "--import", ""],            # trained without the import
    ["retrain", "--model-dir", ""],         # trained (and promoted) into the site's registry
    ["models", "promote", "v0001", "--model-dir", ""],
    ["models", "rollback", "--model-dir", ""],
    ["import", "no-such.csv", "--model-dir", ""],
    ["doctor", "--policy", ""],
    ["doctor", "--ledger", ""],
    ["simulate", "--jobs", "10", "--cluster", ""],   # a homogeneous cluster instead
    ["simulate", "--jobs", "10", "--ledger", ""],    # a generated trace instead of the replay
    ["simulate", "--jobs", "10", "--sacct", ""],
    ["simulate", "--jobs", "10", "--residuals-from", ""],
    ["simulate", "--jobs", "10", "--interference", ""],
    ["calibrate", "--out", "c.csv", "--models", ""],  # the default model set
    ["calibrate", "--out", "c.csv", "--ledger", ""],
]


@pytest.mark.parametrize("args", ADMIN_EMPTY, ids=lambda a: " ".join(x or "''" for x in a))
def test_an_option_given_empty_is_an_error_not_the_default(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = ["--ledger", f"sqlite:///{tmp_path}/own.db"] if args[0] in ("sync", "retrain") and "--ledger" not in args else []
    r = CliRunner().invoke(admin, [*args, *url], prog_name="horus-admin")
    prog = "horus-admin " + (" ".join(args[:2]) if args[0] == "models" else args[0])
    one_line_usage_error(r, prog, EMPTY)


def test_hacct_and_horus_refuse_an_empty_ledger_or_registry(ledger):
    one_line_usage_error(CliRunner().invoke(hacct, ["--ledger", ""], prog_name="hacct"), "hacct", EMPTY)
    r = CliRunner().invoke(horus, ["predict", "m.onnx", "-b", "1", "--model-dir", ""], prog_name="horus")
    one_line_usage_error(r, "horus predict", EMPTY)


def test_an_empty_environment_variable_is_still_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HORUS_MODEL_DIR", "")  # click takes it as unset, as before
    r = CliRunner().invoke(admin, ["models", "list", "--model-dir", str(tmp_path)], prog_name="horus-admin")
    assert r.exit_code == 0 and "no models" in r.output, r.output


@pytest.mark.parametrize("opt", ["-u", "-A", "-M"])
def test_hacct_names_that_are_no_utf8_are_a_one_line_error(opt, ledger):
    # the shell's $'\xff' reaches Python as a lone surrogate: sqlite's driver failed on it after
    # the header was printed, "internal error: UnicodeEncodeError"
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", opt, "ok,b\udcffd"], prog_name="hacct")
    assert r.exit_code == 2, r.output
    assert r.output.splitlines() == [f"hacct: error: {opt}/--{ {'-u': 'user', '-A': 'account', '-M': 'clusters'}[opt]}: "
                                     "'b\\xffd' is not UTF-8 text"], r.output


def test_hacct_utf8_names_still_match(ledger):
    r = CliRunner().invoke(hacct, ["--ledger", ledger, "-P", "-n", "-o", "JobID", "-u", "ann",
                                   "-A", "ML", "-M", "all"], prog_name="hacct")
    assert r.exit_code == 0 and r.output.split() == ["7"], r.output


def test_queue_interval_is_bounded_where_sleep_overflowed(monkeypatch):
    from slurm_horus.ledger import requeue

    monkeypatch.setattr(requeue, "tend", lambda **kw: iter(()))  # no queue: a pass does nothing
    r = CliRunner().invoke(admin, ["queue", "--dry-run", "--interval", "1e308"], prog_name="horus-admin")
    one_line_usage_error(r, "horus-admin queue", "--interval")


def test_queue_with_an_empty_job_list_acts_on_no_job(monkeypatch):
    # `-j "$IDS"` with IDS unset had acted on the whole queue, the opposite of "these jobs only"
    from slurm_horus.ledger import requeue

    called = []
    monkeypatch.setattr(requeue, "tend", lambda **kw: called.append(kw) or iter(()))
    r = CliRunner().invoke(admin, ["queue", "--dry-run", "-j", ""], prog_name="horus-admin")
    assert r.exit_code == 2 and "--jobs '': expected job ids" in r.output, r.output
    assert not called


@pytest.mark.parametrize("kind", ["fifo", "/dev/null"])
def test_doctor_refuses_a_slurm_conf_that_is_no_regular_file(kind, tmp_path):
    # a FIFO (or /dev/null) had been checked as an empty slurm.conf: a list of made-up problems
    path = kind
    if kind == "fifo":
        path = str(tmp_path / "slurm.conf")
        os.mkfifo(path)
    r = CliRunner().invoke(admin, ["doctor", "--slurm-conf", path], prog_name="horus-admin")
    one_line_usage_error(r, "horus-admin doctor", "not a regular file")


@pytest.fixture
def no_gpu(monkeypatch):
    """Calibrate on a node without a GPU, whatever this machine has: the GPU is asked last."""
    from slurm_horus.cli import admin_calibrate

    def refuse(device):
        raise HorusError("no CUDA GPU (test)")
    monkeypatch.setattr(admin_calibrate, "require_torch_gpu", refuse)
    monkeypatch.setattr(admin_calibrate, "import_torch", lambda: None)
    monkeypatch.setattr(admin_calibrate, "model_specs", lambda: {"mlp": None})
    return refuse


@pytest.mark.parametrize("case,says", [
    ("fifo", "not a regular file"),
    ("full", "exists: pass --resume"),
    ("nofolder", "no folder"),
    ("cachefifo", "--cache-dir"),
    ("hugebatch", "--batch-sizes: must be integers from 1 to 2,147,483,647"),
])
def test_calibrate_judges_its_paths_and_sizes_before_the_gpu(case, says, tmp_path, no_gpu):
    # they had been reported only on a GPU node: elsewhere "no CUDA GPU" said the options were right
    out = tmp_path / "c.csv"
    args = ["calibrate", "--out", str(out), "--models", "mlp"]
    if case == "fifo":
        os.mkfifo(out)
    elif case == "full":
        out.write_text("calib_id,mem_mib\n")
    elif case == "nofolder":
        args[2] = str(tmp_path / "none" / "c.csv")
    elif case == "cachefifo":
        os.mkfifo(tmp_path / "cache")
        args += ["--cache-dir", str(tmp_path / "cache")]
    elif case == "hugebatch":
        args += ["--batch-sizes", "8,99999999999999999999"]
    r = CliRunner().invoke(admin, args, prog_name="horus-admin")
    assert r.exit_code == 2 and says in r.output and "no CUDA GPU" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_calibrate_with_good_options_reaches_the_gpu_question(tmp_path, no_gpu):
    full = tmp_path / "c.csv"
    full.write_text("calib_id,mem_mib\n")
    for args in (["--out", str(tmp_path / "new.csv")], ["--out", str(full), "--resume"]):
        r = CliRunner().invoke(admin, ["calibrate", *args, "--models", "mlp"], prog_name="horus-admin")
        # (where this machine lacks nvidia-ml-py, calibrate says so just before the GPU)
        assert r.exit_code == 2 and ("no CUDA GPU (test)" in r.output or "NVML" in r.output), r.output


def test_simulate_plot_given_empty_is_refused_as_hacct_refuses_it(tmp_path, monkeypatch):
    # `--plot ''` had run the whole simulation and drawn nothing, where hacct says "name a FILE.png"
    import slurm_horus.sim.engine as engine

    monkeypatch.setattr(engine, "run_policies", lambda *a, **kw: pytest.fail("simulated"))
    r = CliRunner().invoke(admin, ["simulate", "--jobs", "10", "--plot", ""], prog_name="horus-admin")
    assert r.exit_code == 2 and r.output.strip() == "horus-admin simulate: error: --plot '': name a FILE.png", r.output


@pytest.mark.parametrize("err", [OSError(28, "No space left on device", "/var/lib/slurm-horus/x"),
                                 OSError(30, "Read-only file system", "/x"), ConnectionRefusedError(111, "Connection refused")])
def test_a_full_disk_or_a_refused_connection_is_the_systems_reason_not_an_internal_error(err):
    """ENOSPC, EROFS and the like had read 'internal error: OSError: [Errno 28] ...'."""
    import click

    from slurm_horus.cli.common import one_line_errors

    @click.command()
    @one_line_errors("horus-x")
    def cmd():
        raise err

    r = CliRunner().invoke(cmd, [])
    assert r.exit_code == 1 and "internal error" not in r.output, r.output
    assert r.output.startswith(f"horus-x: error: {err.strerror}") and len(r.output.splitlines()) == 1
    assert (err.filename or "") in r.output
