"""What every command shares: one-line errors, sacct-like times, output helpers."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time

import click

from slurm_horus.errors import HorusError, one_line


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that refuses nan and inf (FloatRange lets nan through every bound)."""

    def convert(self, value, param, ctx):
        import math

        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


def one_line_errors(prog: str):
    """Turn HorusError (and any unexpected failure) into `prog: error: ...` and an exit code.

    Set HORUS_DEBUG=1 to see the traceback of an unexpected failure.
    """
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except HorusError as e:
                click.echo(f"{prog}: error: {one_line(str(e))}", err=True)
                sys.exit(e.exit_code)
            except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
                raise
            except BrokenPipeError:  # output piped into `head` and the like: stop quietly
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(141)
            except KeyboardInterrupt:
                click.echo(f"{prog}: interrupted", err=True)
                sys.exit(130)
            except MemoryError:
                click.echo(f"{prog}: error: out of memory", err=True)
                sys.exit(1)
            except Exception as e:  # never a traceback for users
                if os.environ.get("HORUS_DEBUG"):
                    raise
                msg = one_line(str(e).strip().splitlines()[0]) if str(e).strip() else ""
                if type(e).__module__.startswith("sqlalchemy"):  # the database said no
                    why = "" if "readonly" not in msg else (
                        " (the ledger's file or folder is read-only)" if os.geteuid() == 0
                        else " (the ledger is root's: run this as root)")
                    click.echo(f"{prog}: error: ledger: {msg[:300]}{why}", err=True)
                    sys.exit(1)
                click.echo(f"{prog}: internal error: {type(e).__name__}: {msg[:300]} "
                           "(set HORUS_DEBUG=1 for details)", err=True)
                sys.exit(1)
        return inner
    return wrap


def print_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes; bytes use binary ones)."""
    if unit == "B":
        for prefix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(n) < 1024 or prefix == "TiB":
                return f"{n:.0f} {prefix}" if prefix == "B" else f"{n:.1f} {prefix}"
            n /= 1024
    for prefix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000 or prefix == "P":
            return f"{n:.0f}" if prefix == "" else f"{n:.2f} {prefix}"
        n /= 1000
    return str(n)


_REL_RE = re.compile(r"^now(?:-(\d+)(days?|hours?|minutes?|seconds?|[dhms])?)?$")


def parse_time(s: str | None, what: str) -> int | None:
    """sacct-like times: YYYY-MM-DD[THH:MM[:SS]], epoch seconds, now, now-2days, now-3hours."""
    if s is None:
        return None
    s = s.strip()
    m = _REL_RE.match(s.lower())
    if m:
        n = int(m.group(1) or 0)
        unit = (m.group(2) or "s")[0]
        return _in_range(int(time.time()) - n * {"d": 86400, "h": 3600, "m": 60, "s": 1}[unit], what, s)
    if s.isdigit() and len(s) >= 9:
        t = int(s)
    else:
        t = None
        for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d", "%Y-%m-%d %H:%M:%S"):
            try:
                t = int(time.mktime(time.strptime(s, fmt)))
                break
            except ValueError:
                continue
    if t is None:
        raise HorusError(f"{what}: bad time '{s}' (YYYY-MM-DD[THH:MM[:SS]], now, now-2days)")
    return _in_range(t, what, s)


def _in_range(t: int, what: str, s: str) -> int:
    """Times a database column can hold (epoch seconds; sacct's years 1970-9999)."""
    if not 0 <= t < 253402300800:
        raise HorusError(f"{what}: time '{s}' out of range")
    return t
