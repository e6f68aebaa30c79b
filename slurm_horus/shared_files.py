"""Where the files installed beside the package are: the hook, the policy file, the ledger's
SQL, the units (pyproject's data-files, ``share/slurm-horus/{etc,sql}`` under the install
scheme's data folder: the venv, ``/usr/local`` for Debian's python3, ``~/.local`` with
``--user``), or a source checkout's ``etc/`` and ``sql/``.  The install record says where pip
put them, so no scheme is guessed."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["shared_candidates", "shared_path"]


def shared_candidates(kind: str, name: str) -> list[Path]:
    """Where ``<kind>/<name>`` (kind: etc or sql) may be, in the order looked at."""
    out = [Path(__file__).resolve().parents[1] / kind / name]  # a source checkout
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("slurm-horus")
        tail = f"share/slurm-horus/{kind}/{name}"
        out += [Path(dist.locate_file(f)) for f in (dist.files or ()) if f.as_posix().endswith(tail)]
    except PackageNotFoundError:
        pass
    out.append(Path(sys.prefix) / "share" / "slurm-horus" / kind / name)
    return out


def shared_path(kind: str, name: str) -> Path | None:
    """The first of shared_candidates that is a file, resolved; None when there is none."""
    for c in shared_candidates(kind, name):
        if c.is_file():
            return c.resolve()
    return None
