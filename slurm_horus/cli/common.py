"""What every command shares: one-line errors, --dim parsing, output helpers."""

from __future__ import annotations

import functools
import json
import os
import sys

import click

from slurm_horus.errors import HorusError


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
                click.echo(f"{prog}: error: {e}", err=True)
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
                msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
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
