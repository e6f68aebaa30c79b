"""Shared test set-up: no test touches the machine's own ledger, spool, model registry, policy
or hook record file."""

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
