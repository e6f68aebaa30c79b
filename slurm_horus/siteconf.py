"""The site's settings file, /etc/slurm-horus/horus.conf (or $HORUS_CONF): ``key = value`` lines,
``#`` comments, the last line of a key wins.  It exists so that users need no environment
variables: hsubmit reads ``on_prediction_error`` from it and every command that opens the ledger
reads ``ledger_url`` (each under its environment variable, which comes first)."""

from __future__ import annotations

import os
from typing import Mapping

from slurm_horus.textfile import open_for_reading

__all__ = ["CONF_PATH", "ENV_CONF", "SITE_KEYS", "site_setting", "unknown_site_keys"]

CONF_PATH = "/etc/slurm-horus/horus.conf"
ENV_CONF = "HORUS_CONF"
MAX_CONF_BYTES = 1 << 20  # a settings file, never a dump: read no more than this


SITE_KEYS = ("ledger_url", "on_prediction_error")  # what the commands read of it


def _lines(env: Mapping[str, str]) -> list[tuple[int, str, str]]:
    """(line number from 1, key, value) of each ``key = value`` line; none when the file
    cannot be read (a missing file means the defaults)."""
    try:
        with open_for_reading(env.get(ENV_CONF) or CONF_PATH) as f:
            text = f.read(MAX_CONF_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        name, sep, val = line.split("#", 1)[0].partition("=")
        if sep:
            out.append((n, name.strip(), val.strip()))
    return out


def site_setting(key: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of ``key`` in the site's settings file; None when it is not set or the file
    cannot be read."""
    value = None
    for _, name, val in _lines(os.environ if env is None else env):
        if name == key:
            value = val or None
    return value


def unknown_site_keys(env: Mapping[str, str] | None = None) -> list[tuple[int, str]]:
    """(line, key) of the settings file's keys no command reads: a misspelt ``ledgerurl`` leaves
    every command on the default ledger without a word."""
    return [(n, name) for n, name, _ in _lines(os.environ if env is None else env) if name not in SITE_KEYS]
