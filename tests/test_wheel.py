"""The package as users get it: a wheel built by `python -m build --wheel`, installed into a fresh
virtual environment, every command run from a folder outside the checkout.

A file the code finds only through the checkout (tests/data, sql/, etc/) fails here."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests" / "data" / "zoo"

pytestmark = pytest.mark.slow


def _run(args, cwd, env, ok=True, timeout=300):
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok and p.returncode != 0:
        raise AssertionError(f"{args} -> rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def _build_wheel(base: Path, env: dict) -> Path:
    """The wheel `python -m build --wheel` makes of a copy of the checkout under ``base``."""
    dist = base / "dist"
    src = base / "src"  # build from a copy: nothing of the checkout's build/ or egg-info leaks in
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info",
                                                                "__pycache__", ".pytest_cache", "*.so"))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
          str(src)], cwd=base, env=env, timeout=600)
    wheels = list(dist.glob("slurm_horus-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _install(base: Path, wheel: Path) -> tuple[Path, dict, Path]:
    """(bin folder, env, a work folder outside the checkout) of a venv under ``base`` holding
    only ``wheel`` on top of the system's dependencies."""
    env_dir = base / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
          "--disable-pip-version-check", str(wheel)], cwd=base, env=os.environ.copy())
    work = base / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HORUS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{env_dir / 'bin'}:{env['PATH']}", HORUS_LEDGER_URL=f"sqlite:///{work}/ledger.db",
               HORUS_SPOOL=str(work / "spool"), HORUS_MODEL_DIR=str(work / "models"))
    where = _run([str(py), "-c", "import slurm_horus; print(slurm_horus.__file__)"], work, env)
    assert where.stdout.strip().startswith(str(env_dir)), where.stdout  # the wheel, not the checkout
    return env_dir / "bin", env, work


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel as users get it: pure Python."""
    pytest.importorskip("build")
    env = {k: v for k, v in os.environ.items() if k != "HORUS_COMPILE"}
    return _build_wheel(tmp_path_factory.mktemp("build"), env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    """(bin folder, env, a work folder outside the checkout) of a venv holding only the wheel
    on top of the system's dependencies."""
    return _install(tmp_path_factory.mktemp("wheel"), wheel)


def test_wheel_holds_data_and_no_tests(installed):
    bin_, env, work = installed
    py = str(bin_ / "python")
    out = _run([py, "-c", "import slurm_horus, sys, pathlib; "
                "p = pathlib.Path(slurm_horus.__file__).parent; "
                "print(sorted(x.name for x in (p / 'data').iterdir())); "
                "print((pathlib.Path(sys.prefix) / 'share/slurm-horus/sql/schema.sql').is_file()); "
                "print((pathlib.Path(sys.prefix) / 'share/slurm-horus/etc/job_submit.lua').is_file())"],
               work, env).stdout.splitlines()
    assert "gpus.json" in out[0] and "sim_mix.json" in out[0]
    assert out[1:] == ["True", "True"]


def test_every_command_answers_help_from_any_folder(installed):
    bin_, env, work = installed
    for cmd in (["horus"], ["horus", "features"], ["horus", "predict"], ["hacct"], ["horus-probe"],
                ["horus-admin"], *(["horus-admin", c] for c in
                                   ("calibrate", "doctor", "import", "models", "retrain",
                                    "simulate", "sync"))):
        p = _run([str(bin_ / cmd[0]), *cmd[1:], "--help"], work, env)
        assert "Usage:" in p.stdout, cmd
    # hsubmit is sbatch's drop-in: its own flags pass through to sbatch
    if shutil.which("sbatch") and os.environ.get("SLURM_CONF"):  # sbatch needs a configuration
        assert "slurm" in _run([str(bin_ / "hsubmit"), "--version"], work, env).stdout.lower()


def test_predict_import_retrain_report_simulate_from_the_wheel(installed):
    bin_, env, work = installed
    model = str(ZOO / "resnet50.onnx")
    feats = json.loads(_run([str(bin_ / "horus"), "features", model, "--batch-size", "32",
                             "--json"], work, env).stdout)
    assert feats["params"] > 20e6 and feats["features"]["batch_size"] == 32
    cold = json.loads(_run([str(bin_ / "horus"), "predict", model, "--batch-size", "32",
                            "--gpu", "a100", "--json"], work, env).stdout)
    assert cold["mem_mib"] > 1000 and cold["predictor"] == "cold-start"

    # the site's measured runs of this graph at other batch sizes -> history answers
    rows = [{"model": model, "gpu_type": "a100", "util_pct": u, "mem_mib": m, "batch_size": b,
             "task": "train", "optimizer": "adam", "precision": "fp32", "model_family": "resnet"}
            for b, u, m in ((16, 70, 3500), (64, 88, 9300), (128, 93, 17100))]
    path = work / "runs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    models = work / "models"
    models.mkdir(exist_ok=True)  # import refreshes the history of an existing registry
    _run([str(bin_ / "horus-admin"), "import", str(path), "--model-dir", str(models)], work, env)
    warm = json.loads(_run([str(bin_ / "horus"), "predict", model, "--batch-size", "32", "--gpu",
                            "a100", "--model-dir", str(models), "--json"], work, env).stdout)
    assert warm["predictor"].startswith("history"), warm
    assert 4500 < warm["mem_mib"] < 6500  # between the measured 16 and 64 points, near affine

    summary = _run([str(bin_ / "hacct"), "--summary"], work, env)
    assert "jobs" in summary.stdout.lower() or summary.stdout.strip()
    sim = json.loads(_run([str(bin_ / "horus-admin"), "simulate", "--jobs", "40", "--gpus", "8",
                           "--json"], work, env, timeout=600).stdout)
    assert set(sim) >= {"exclusive", "naive", "horus", "oracle"}
    assert all(r["jobs"] == 40 and r["completed"] + r["failed_jobs"] + r["rejected"]
               + r["unschedulable"] + r["timeouts"] >= 40 for r in sim.values())


def test_doctor_runs_from_the_wheel(installed):
    bin_, env, work = installed
    p = _run([str(bin_ / "horus-admin"), "doctor"], work, env, ok=False)
    assert "Traceback" not in p.stderr
    if not os.environ.get("SLURM_CONF"):  # no Slurm to read: one clear line, exit 2
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        return
    assert p.returncode in (0, 1), p.stderr[-500:]
    assert "checked " in p.stdout and "slurm.conf" in p.stdout


def test_installed_under_another_scheme_finds_its_sql_and_hook(wheel, tmp_path):
    """Debian's python3 installs data files under /usr/local while sys.prefix is /usr, and
    `pip install --user` under ~/.local: the SQL and the hook are found from the install record,
    not from sys.prefix (a root install with --prefix /usr/local, here under --root)."""
    root = tmp_path / "root"
    # --ignore-installed: pip would otherwise remove the running environment's own install
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
          "--ignore-installed", "--root", str(root), "--prefix", "/usr/local", str(wheel)],
         cwd=tmp_path, env=os.environ.copy())
    site = next(root.glob("usr/local/lib/python3*/site-packages"))
    share = root / "usr/local/share/slurm-horus"
    assert (share / "sql/schema.sql").is_file()  # not under sys.prefix: found from the record
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORUS_")}
    env.update(PYTHONPATH=str(site), HORUS_LEDGER_URL=f"sqlite:///{tmp_path}/l.db")
    code = ("import slurm_horus, json; from slurm_horus.shared_files import shared_path; "
            "from slurm_horus.slurm.policy import find_hook; from slurm_horus.ledger import Ledger; "
            "Ledger().record_usage(job_id=1, source='sacct', elapsed_s=1); "
            "print(json.dumps([slurm_horus.__file__, str(shared_path('sql', 'schema.sql')), str(find_hook())]))")
    where, sql, hook = json.loads(_run([sys.executable, "-c", code], tmp_path, env).stdout)
    assert where.startswith(str(site)) and sql == str(share / "sql/schema.sql")
    assert hook == str(share / "etc/job_submit.lua")


MIXED_CLUSTER = {"nodes": [{"name": "a", "gpu_type": "a100", "gpus": 8, "count": 2},
                           {"name": "t", "gpu_type": "t4", "gpus": 4, "count": 4}]}


def test_the_compiled_simulator_gives_the_pure_ones_figures(tmp_path_factory):
    """HORUS_COMPILE=1 builds the simulator's core with mypyc (setup.py) from the same sources:
    its every figure must be the pure Python's, bit for bit, on runs that take each path (two
    GPU types and their OOMs, the LLM mix's multi-GPU jobs, the what-if of a known k, backfill at
    every event); only the CPU and wall times may differ, and where the policy file is."""
    pytest.importorskip("build")
    pytest.importorskip("mypyc")
    base = tmp_path_factory.mktemp("compiled")
    wheel = _build_wheel(base, dict(os.environ, HORUS_COMPILE="1"))
    assert not wheel.name.endswith("-none-any.whl"), wheel.name  # a platform wheel
    bin_, env, work = _install(base, wheel)
    engine = _run([str(bin_ / "python"), "-c", "import slurm_horus.sim.engine as e; print(e.__file__)"],
                  work, env).stdout.strip()
    assert engine.endswith(".so"), engine
    (work / "cluster.json").write_text(json.dumps(MIXED_CLUSTER))
    runs = [["--trace", "philly", "--jobs", "700", "--load", "4", "--cluster", "cluster.json", "--seed", "3"],
            ["--trace", "llm", "--jobs", "400", "--load", "2", "--gpus", "32", "--seed", "1"],
            ["--trace", "pai", "--jobs", "500", "--load", "1", "--gpus", "16", "--known-sensitivity",
             "--bf-interval", "0", "--seed", "2"]]
    pure_env = {k: v for k, v in env.items() if k != "PATH"}
    pure_env.update(PATH=os.environ["PATH"], PYTHONPATH=str(ROOT))
    pure = _run([sys.executable, "-c", "import slurm_horus.sim.engine as e; print(e.__file__)"],
                work, pure_env).stdout.strip()
    assert pure.endswith(".py"), pure  # a checkout with in-place compiled modules compares nothing
    for args in runs:
        got = [json.loads(_run([py, "-m", "slurm_horus.cli.admin", "simulate", "--json", *args],
                               work, e, timeout=600).stdout)
               for py, e in ((str(bin_ / "python"), env), (sys.executable, pure_env))]
        for res in got:
            for m in res.values():
                for key in [k for k in m if k.endswith(("_cpu_s", "_wall_s")) or k == "policy_file"]:
                    del m[key]
        assert got[0] == got[1], args
