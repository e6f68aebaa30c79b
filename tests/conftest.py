"""Shared test set-up: no test touches the machine's own ledger, spool, model registry, policy
or hook record file."""

import os
from pathlib import Path

import pytest

SHIPPED_POLICY = Path(__file__).resolve().parent.parent / "etc" / "horus_policy.conf"


@pytest.fixture(autouse=True)
def _isolated_site(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("site")
    monkeypatch.setenv("HORUS_LEDGER_URL", f"sqlite:///{root}/ledger.db")
    monkeypatch.setenv("HORUS_SPOOL", str(root / "spool"))
    monkeypatch.setenv("HORUS_MODEL_DIR", str(root / "models"))
    # The shipped policy, with the record file that sync writes moved under the test's folder.
    policy = root / "horus_policy.conf"
    policy.write_text(SHIPPED_POLICY.read_text() + f"\nrecord_file = {root / 'record'}\n")
    monkeypatch.setenv("HORUS_POLICY", str(policy))


@pytest.fixture(autouse=True)
def _own_signal_handlers():
    """Each test leaves SIGTERM and SIGINT as it found them: code run in-process (a probe, a
    command) installs its own, and a forked pool worker that inherits one that does not exit
    hangs the pool's terminate (a CI run hung there)."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture(scope="session")
def python_for_others():
    """Skip a test whose code runs as another user (sync's analysis as the job's owner, a user's
    own hacct) where that user cannot run this Python: an interpreter under a private home
    (/root 0700).  A site installs slurm-horus where its users can (they run hsubmit)."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv")
    try:
        ok = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                             "-c", "import slurm_horus, onnx, numpy, sqlalchemy, lupa"], capture_output=True,
                            timeout=120, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                              "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
                            ).returncode == 0
    except OSError:
        ok = False
    if not ok:
        pytest.skip(f"{sys.executable} and its packages cannot be run by other users here")


@pytest.fixture()
def simulate_cli():
    """`horus-admin simulate` alone in a click group, for CliRunner."""
    import click

    from slurm_horus.cli.admin_simulate import register

    @click.group()
    def main():
        pass

    register(main)
    return main


@pytest.fixture()
def slurm_bin(tmp_path):
    """Slurm's commands stood in for by scripts that record (there is no cluster in these
    cases; the real-cluster path is tests/test_cluster_submit.py)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.args"
    scripts = {
        "scontrol": "printf 'NodeName=n1 Partitions=gpu Gres=gpu:a100:4 State=IDLE Reason=caf\\351\\n'",
        "sinfo": "echo 'slurm 22.05.11'",
        "sbatch": f'printf "%s\\n" "$@" > {log}; cat > /dev/null; '
                  'if [ -n "$SBATCH_DIE" ]; then kill -TERM $$; fi; echo "Submitted batch job 42"',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HORUS_SLURM_BACKEND": "cli",
           "HORUS_CONF": str(tmp_path / "no.conf")}
    env.pop("SLURM_CONF", None)
    return env, log


@pytest.fixture(scope="session")
def resnet():
    """ResNet-50's features at the batch sizes the history tests measure, by batch (the graph
    analysed once per session: each is a forked child's work)."""
    from slurm_horus.graph.features import extract_features

    zoo = Path(__file__).parent / "data" / "zoo"
    return {b: extract_features(zoo / "resnet50.onnx", batch_size=b) for b in (8, 16, 32, 64)}
