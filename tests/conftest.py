"""Shared test set-up: no test touches the machine's own ledger, spool or model registry."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_site(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("site")
    monkeypatch.setenv("HORUS_LEDGER_URL", f"sqlite:///{root}/ledger.db")
    monkeypatch.setenv("HORUS_SPOOL", str(root / "spool"))
    monkeypatch.setenv("HORUS_MODEL_DIR", str(root / "models"))
