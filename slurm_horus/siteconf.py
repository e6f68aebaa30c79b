"""The site's settings file, /etc/slurm-horus/horus.conf (or $HORUS_CONF): ``key = value`` lines,
``#`` comments, the last line of a key wins.  It exists so that users need no environment
variables: hsubmit reads ``on_prediction_error`` from it and every command that opens the ledger
reads ``ledger_url`` (each under its environment variable, which comes first)."""

from __future__ import annotations

import os
from typing import Mapping

from slurm_horus.textfile import open_for_reading

__all__ = ["CONF_PATH", "ENV_CONF", "site_setting"]

CONF_PATH = "/etc/slurm-horus/horus.conf"
ENV_CONF = "HORUS_CONF"
MAX_CONF_BYTES = 1 << 20  # a settings file, never a dump: read no more than this


def site_setting(key: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of ``key`` in the site's settings file; None when it is not set or the file
    cannot be read (a missing file means the defaults)."""
    env = os.environ if env is None else env
    try:
        with open_for_reading(env.get(ENV_CONF) or CONF_PATH) as f:
            text = f.read(MAX_CONF_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    value = None
    for line in text.splitlines():
        name, sep, val = line.split("#", 1)[0].partition("=")
        if sep and name.strip() == key:
            value = val.strip() or None
    return value
