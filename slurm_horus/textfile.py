"""Text files a command is pointed at (a cluster description, a policy, slurm.conf, a GPU
catalog, an export), read as one-line HorusErrors: missing, a folder, larger than the caller
allows, or not UTF-8 -- never a traceback, and never an endless read of /dev/zero or a pipe."""

from __future__ import annotations

import os

from slurm_horus.errors import HorusError

__all__ = ["read_text"]


def read_text(path: str | os.PathLike, what: str, max_bytes: int) -> str:
    """The file's text; HorusError("<what> <path>: ...") when it cannot be had."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise HorusError(f"{what} {path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise HorusError(f"{what} {path}: larger than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise HorusError(f"{what} {path}: not UTF-8 text") from None
