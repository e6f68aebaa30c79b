"""What every command shares: one-line errors, --dim parsing, output helpers."""

from __future__ import annotations

import functools
import json
import os
import sys

import click

from ..errors import HorusError


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


def parse_dims(values: tuple[str, ...]) -> dict[str, int]:
    """`--dim name=value` pairs -> dict; values must be positive integers."""
    dims = {}
    for item in values:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise HorusError(f"--dim expects name=value, got '{item}'")
        try:
            dims[name] = int(value)
        except ValueError:
            try:
                as_float = float(value)
            except ValueError:
                raise HorusError(f"--dim {name}: '{value}' is not an integer") from None
            if not as_float.is_integer():
                raise HorusError(f"--dim {name}: '{value}' is not an integer") from None
            dims[name] = int(as_float) if abs(as_float) < 2**62 else 2**62
    return dims


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
