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


class OneLineUsageError(click.UsageError):
    """A usage error as ``prog: error: ...``, one line (click's own takes four: usage, a hint,
    a blank line, the error)."""

    def show(self, file=None):
        prog = self.ctx.command_path if self.ctx else "error"
        click.echo(f"{prog}: error: {one_line(self.format_message())} (see {prog} --help)", err=True)


# where the registry is when --model-dir is not given: predict/registry.py's default_dir() (not
# imported here: it brings numpy into every command's start; tests/test_usage.py checks the help)
MODEL_DIR_DEFAULT = "default $HORUS_MODEL_DIR, else /var/lib/slurm-horus/models"


def not_empty(ctx, param, value):
    """click callback: a file, folder or URL option given as '' (``--model-dir "$DIR"`` with DIR
    unset) is a usage error.  The code behind each took '' as "not given" and went on with the
    site's default: a retrain or promote acted on the site's registry, sync ran sacct instead of
    reading the file, simulate ran a generated trace instead of the replay.  (An empty
    environment variable is no value to click: the default, as before.)"""
    if value == "":
        raise click.BadParameter("empty (an unset variable?): give a value or leave the option out",
                                 ctx, param)
    return value


def model_dir_option(what: str = "Registry folder"):
    """--model-dir as every command takes it, with the one help text of its default."""
    return click.option("--model-dir", envvar="HORUS_MODEL_DIR", callback=not_empty,
                        help=f"{what} ({MODEL_DIR_DEFAULT}).")


# click 8.2+ raises its help for a group run bare as a UsageError: that one is shown whole
_HELP_ERRORS = tuple(e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if e)


def _one_line_usage(fn, ctx, *args):
    """fn(ctx, *args) with its usage errors one line."""
    try:
        return fn(ctx, *args)
    except (OneLineUsageError, *_HELP_ERRORS):
        raise
    except click.UsageError as e:
        raise OneLineUsageError(e.format_message(), e.ctx or ctx) from None


class Command(click.Command):
    """click.Command with one-line usage errors (parsing, and those its body raises) and, as
    getopt_long (sacct, sbatch), long options abbreviated to any unambiguous prefix (hacct
    --start, --end, --form)."""

    def parse_args(self, ctx, args):
        # a command that passes unknown options on (horus-probe CMD ...) stops at the first
        # argument, as its own parser does: the rest is the command's
        stop = ctx.ignore_unknown_options or not ctx.allow_interspersed_args
        args = _expand_prefixes(self.get_params(ctx), args, stop_at_argument=stop)
        return _one_line_usage(super().parse_args, ctx, args)

    def invoke(self, ctx):
        return _one_line_usage(super().invoke, ctx)

    def make_parser(self, ctx):
        """The parser, noting every option's uses in command-line order (last_given): click
        itself keeps only each option's first."""
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_args(args):
            opts, largs, order = parse(args=args)
            ctx.meta[_OPTION_ORDER] = [p.name for p in order]
            return opts, largs, order
        parser.parse_args = parse_args
        return parser


_OPTION_ORDER = "slurm_horus.option_order"


def given_order(ctx, *names: str) -> list[str]:
    """Each use of these options (parameter names) on the command line, in order (repeats too),
    as getopt reads repeated and opposing options."""
    return [n for n in ctx.meta.get(_OPTION_ORDER, ()) if n in names]


def last_given(ctx, *names: str) -> str | None:
    """Which of these options (parameter names) was used last on the command line (sacct -P
    ... -p); None: none of them."""
    used = given_order(ctx, *names)
    return used[-1] if used else None


class Group(click.Group):
    """click.Group with the same one-line usage errors and prefixes (its own options, before
    the command's name), whose commands and groups are these."""

    command_class = Command
    group_class = type  # subgroups: this class

    def parse_args(self, ctx, args):
        args = _expand_prefixes(self.get_params(ctx), args, stop_at_argument=True)
        return _one_line_usage(super().parse_args, ctx, args)

    def resolve_command(self, ctx, args):
        return _one_line_usage(super().resolve_command, ctx, args)


def _expand_prefixes(params, args: list[str], stop_at_argument: bool = False) -> list[str]:
    """``args`` with each long option written as an unambiguous prefix of one option's name
    spelled out; a value (the token after an option that takes one, also at the end of a
    cluster of short options: -Xo VALUE) is left as it is, and with ``stop_at_argument`` so is
    everything from the first argument on."""
    takes_value, owner = {}, {}  # takes_value: True, False, or "optional" (--plot [FILE])
    for p in params:
        for o in (*p.opts, *p.secondary_opts):
            owner[o] = p
            takes_value[o] = (isinstance(p, click.Option) and not p.is_flag and not p.count
                              and ("optional" if p._flag_needs_value else True))
    out, value_next = [], False
    for i, a in enumerate(args):
        if value_next is True or (value_next == "optional" and not a.startswith("-")):
            out.append(a)
            value_next = False
            continue
        if a == "--" or (stop_at_argument and not a.startswith("-")):
            return out + args[i:]
        name, eq, val = a.partition("=")
        if name.startswith("--") and len(name) > 2 and name not in owner:
            hits = sorted(o for o in owner if o.startswith(name))
            if hits and len({id(owner[o]) for o in hits}) == 1:  # --clu: --cluster, --clusters
                name = hits[0]
                a = name + eq + val
        if not name.startswith("--") and len(a) > 2 and a.startswith("-"):
            value_next = False  # -Xo VALUE: the first short option that takes one ends the cluster
            for k, c in enumerate(a[1:], 1):
                if takes_value.get("-" + c):
                    value_next = takes_value["-" + c] if k == len(a) - 1 else False
                    break
        else:
            value_next = False if eq else takes_value.get(name, False)
        out.append(a)
    return out


def one_line_errors(prog: str, needs_stdout=False):
    """Turn HorusError (and any unexpected failure) into `prog: error: ...` and an exit code.
    ``needs_stdout`` (True, or a test of the command's options): a command whose answer is its
    output fails when started with standard output closed (>&-), as cat does, rather than
    print nothing and exit 0.

    Set HORUS_DEBUG=1 to see the traceback of an unexpected failure.
    """
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            if sys.stdout is None and (needs_stdout(kwargs) if callable(needs_stdout) else needs_stdout):
                click.echo(f"{prog}: error: standard output is closed", err=True)
                sys.exit(1)
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
            except OSError as e:
                # a file the command may not write or read, a folder where a file goes, a full
                # or read-only disk, a refused connection: the system's own reason and the path,
                # not an "internal error"
                if os.environ.get("HORUS_DEBUG"):
                    raise
                where = f": {e.filename}" if e.filename else ""
                click.echo(f"{prog}: error: {one_line(e.strerror or str(e))}{where}"
                           f"{' (run this as root?)' if isinstance(e, PermissionError) and os.geteuid() else ''}",
                           err=True)
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


def finite(obj):
    """``obj`` with every float that is not finite as None: JSON has no Infinity or NaN (a
    damaged ledger can hold them; json.dumps would write literals no parser takes)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def print_json(obj) -> None:
    click.echo(json.dumps(finite(obj), indent=2, sort_keys=False, default=str))


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


_REL_RE = re.compile(r"^now(?:\s*([+-])\s*(\d+)\s*(seconds?|minutes?|hours?|days?|weeks?|[smhdw])?)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NAMED = {"today": 0, "midnight": 0, "noon": 12, "fika": 15, "teatime": 16}
_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*([ap]m)?$")
_DAY_RE = re.compile(r"^(\d{1,2})([/.]?)(\d{1,2})(?:\2(\d{2}(?:\d{2})?))?(?:-(\d{1,2}:\d{2}(?::\d{2})?))?$")
TIME_FORMATS = ("YYYY-MM-DD[THH[:MM[:SS]]], MM/DD[/YY][-HH:MM[:SS]], MMDD[YY], HH:MM[:SS][AM|PM], "
                "today, tomorrow, midnight, noon, fika, teatime, "
                "now[{+|-}N[seconds|minutes|hours|days|weeks]]")


def parse_time(s: str | None, what: str) -> int | None:
    """sacct's times (its man page's formats: TIME_FORMATS), or epoch seconds, as local time."""
    if s is None:
        return None
    s = s.strip()
    low = s.lower()
    today = time.localtime()

    def at(y, mo, d, h=0, mi=0, sec=0) -> int | None:
        try:
            return int(time.mktime((y, mo, d, h, mi, sec, 0, 0, -1)))
        except (OverflowError, ValueError):
            return None

    def clock(text: str | None):
        m = _CLOCK_RE.match(text or "")
        if not m:
            return None
        h, mi, sec = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if m.group(4):
            if not 1 <= h <= 12:
                return None
            h = h % 12 + (12 if m.group(4) == "pm" else 0)
        return (h, mi, sec) if h < 24 and mi < 60 and sec < 60 else None

    t = None
    if m := _REL_RE.match(low):
        n = int(m.group(2) or 0) * _UNITS[(m.group(3) or "s")[0]]
        t = int(time.time()) + (n if m.group(1) == "+" else -n)
    elif low in _NAMED:
        t = at(today.tm_year, today.tm_mon, today.tm_mday, _NAMED[low])
    elif low == "tomorrow":  # its midnight (mktime carries the day past the month's end)
        t = at(today.tm_year, today.tm_mon, today.tm_mday + 1)
    elif s.isascii() and s.isdigit() and len(s) >= 9:
        t = int(s)
    elif c := clock(low):
        t = at(today.tm_year, today.tm_mon, today.tm_mday, *c)
    elif (m := _DAY_RE.match(low)) and (m.group(2) or len(s.split("-")[0]) in (4, 6)):
        year = m.group(4)
        # no year: sacct's parse_time(past=1) takes a month after this one as last year's
        y = (today.tm_year - (int(m.group(1)) > today.tm_mon) if year is None
             else int(year) + (2000 if len(year) == 2 else 0))
        c = clock(m.group(5)) if m.group(5) else (0, 0, 0)
        if c is not None and 1 <= int(m.group(1)) <= 12 and 1 <= int(m.group(3)) <= 31:
            t = at(y, int(m.group(1)), int(m.group(3)), *c)
    else:
        for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H", "%Y-%m-%d",
                    "%Y-%m-%d %H:%M:%S"):
            try:
                t = int(time.mktime(time.strptime(s, fmt)))
                break
            except (ValueError, OverflowError):
                continue
    if t is None:
        raise HorusError(f"{what}: bad time '{s}' ({TIME_FORMATS})")
    return _in_range(t, what, s)


def _in_range(t: int, what: str, s: str) -> int:
    """Times a database column can hold (epoch seconds; sacct's years 1970-9999)."""
    if not 0 <= t < 253402300800:
        raise HorusError(f"{what}: time '{s}' out of range")
    return t
