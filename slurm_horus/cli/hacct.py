"""`hacct`: sacct for predictions - each job's predicted vs actual GPU use, from the ledger.

Users only read the ledger (opened read-only; where the site keeps the main file private, their
own extract). Like sacct, where Slurm's PrivateData contains `jobs`, a user who cannot write the
ledger sees only their own jobs.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from itertools import chain, islice

import click

from slurm_horus.cli.common import (Command, given_order, last_given, not_empty, one_line_errors,
                                    parse_time)


def _split(values, what: str | None = None) -> list[str]:
    """Comma lists, as sacct's.  ``what`` names an option whose words are matched as text in
    the ledger (-u, -A, -M): a word with bytes that are no UTF-8 (the shell's $'\\xff', which
    Python holds as lone surrogates) is an error naming it; the database driver had failed on it
    after the header was printed, an internal error."""
    out = []
    for v in values or ():
        out += [x.strip() for x in v.split(",") if x.strip()]
    if what is not None:
        from slurm_horus.errors import HorusError, one_line

        for x in out:
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                shown = one_line(x.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
                raise HorusError(f"{what}: '{shown[:40]}' is not UTF-8 text") from None
    return out


def _user_name(user: str) -> str:
    """-u takes names or uids, as sacct does (a uid no account has stays as given: no match)."""
    import pwd

    if user.isascii() and user.isdigit():
        try:
            return pwd.getpwuid(int(user)).pw_name
        except (KeyError, OverflowError):
            pass
    return user


def _who(order: list[str], users: tuple[str, ...], allusers: bool) -> tuple[tuple[str, ...], bool]:
    """(users, every user's) from -u and -a as sacct reads them, one use after another
    (options.c): -a sets every user's, -u -1 too, -u NAME unsets it and adds the name.
    ``order``: each use of users/allusers on the command line (common.given_order)."""
    if order.count("users") != len(users):  # no order known: -u's names, else -a
        return users, allusers and not users
    every, names, values = False, [], iter(users)
    for name in order:
        value = next(values) if name == "users" else None
        if name == "allusers" or value == "-1":
            every = True
        else:
            every = False
            names.append(value)
    return (() if every else tuple(names)), every


# sacct -j's names of a job inside another: its separator, its form, what it is, the lookup
_MEMBERS = {"_": ("ArrayJobId_TaskId (task ranges are not read)", "array tasks", "array_task_job_ids"),
            "+": ("HetJobId+Offset (a heterogeneous job's component)", "heterogeneous job components",
                  "het_component_job_ids")}


def _member_jobs(names: list[str], sep: str, cluster: str | None) -> list[int]:
    """The own job ids of array tasks named ArrayJobId_TaskId (sep "_"; int() had read 224_5
    as 2245) or heterogeneous job components named HetJobId+Offset ("+"), as sacct -j takes
    them: the ledger keys each by its own id and keeps no parent's, so they come from Slurm's
    accounting.  One Slurm does not know names no job, as in sacct: left out, not an error."""
    from slurm_horus.errors import HorusError
    from slurm_horus.slurm import commands as slurm

    form, what, lookup = _MEMBERS[sep]
    pairs = []
    for x in names:
        a, _, t = x.partition(sep)
        if not (a.isascii() and a.isdigit() and t.isascii() and t.isdigit()
                and 0 < int(a) < 2 ** 32 and int(t) < 2 ** 32):
            raise HorusError(f"-j/--jobs: {x[:40]!r} is not {form}")
        pairs.append((int(a), int(t)))
    try:
        found = getattr(slurm, lookup)(pairs, cluster)
    except HorusError as e:
        raise HorusError(f"-j/--jobs: {what} are looked up in Slurm's accounting: {e}") from None
    return [found[p] for p in pairs if p in found]


def _het_components(job_ids: list[int], cluster: str | None) -> list[int]:
    """The components' own ids of those of ``job_ids`` that lead a heterogeneous job, as sacct
    -j N lists them, from Slurm's accounting as N+K's are: the ledger lists those it keeps a
    HetJobId for itself (schema v11), this finds the ones synced before. Where it cannot
    answer, none: the ledger's jobs of those ids are still listed (N+K, with nothing else to
    name it by, is an error there)."""
    from slurm_horus.errors import HorusError
    from slurm_horus.slurm import commands as slurm

    try:
        found = slurm.het_job_component_ids(job_ids, cluster)
    except HorusError:
        return []
    return [c for comps in found.values() for c in comps]


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--jobs", "jobs", multiple=True,
              help="Job ids (comma-separated), as sacct takes them: N (an array's tasks and a "
              "heterogeneous job's components too), ArrayJobId_TaskId, HetJobId+Offset (these and "
              "components looked up in Slurm's accounting); a .step names its job.")
@click.option("-u", "--user", "--uid", "users", multiple=True,
              help="Users or uids (comma-separated; -1: every user's, as -a).")
@click.option("-A", "--account", "accounts", multiple=True, help="Accounts (comma-separated).")
@click.option("-a", "--allusers", is_flag=True,
              help="Every user's jobs (as sacct: without it, and without -u, a user other than root "
              "sees their own; the later of -a and -u wins).")
@click.option("-S", "--starttime", help="Jobs ending (or submitted) at or after this time "
              "(default, as sacct: 00:00 today, unless -j or -s is given; --summary and --plot: "
              "all). sacct's formats: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], HH:MM, today, "
              "midnight, noon, now-2days, now-1weeks, ...")
@click.option("-E", "--endtime", help="Jobs submitted at or before this time (default: now; "
              "with -s and -S, -S, as in sacct).")
@click.option("-s", "--state", "states", multiple=True,
              help="States, e.g. CD,F,TO,CA,OOM (comma-separated).")
@click.option("-o", "--format", "fmt", help="Columns, e.g. JobID,User,PredMem,ActMem%8, "
              "JobID,Start,End,NodeList or JobID,HookAct,QueueAct (what the hook and "
              "horus-admin queue did); '-o help' or -e lists them. With a Name%W width, sacct's "
              "fixed-width table on a terminal too.")
@click.option("-e", "--helpformat", is_flag=True, help="List the columns -o takes, as sacct -e.")
@click.option("-P", "--parsable2", is_flag=True, help="'|'-separated, no trailing '|'.")
@click.option("-p", "--parsable", is_flag=True, help="'|'-separated, with a trailing '|' (of -p and -P, the last given wins, as in sacct).")
@click.option("--delimiter", default="|", metavar="CHARACTERS",
              help="The separator of -p and -P instead of '|' (as sacct: ignored without them).")
@click.option("-X", "--allocations", is_flag=True,
              help="Accepted for sacct's sake: the ledger holds jobs, never steps.")
@click.version_option(None, "-V", "--version", package_name="slurm-horus", prog_name="hacct",
                      message="%(prog)s (slurm-horus) %(version)s")
@click.option("-n", "--noheader", is_flag=True, help="No header line.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, in a list.")
@click.option("--summary", is_flag=True, help="Accuracy: MAE, RMSLE, median relative error, "
              "coverage by model family, GPU type and user, jobs far above prediction, and "
              "horus-admin queue's OOM requeues (how many then completed), packs and spreads.")
@click.option("--plot", "plot", is_flag=False, flag_value="-", default=None,
              metavar="[FILE.png|-]", help="Predicted vs measured utilization and memory, and "
              "the error over time: in the terminal (no file, or -), else into FILE.png "
              "(needs matplotlib: pip install matplotlib, the [plot] extra).")
@click.option("--under-claims", "under_claims", is_flag=True,
              help="Only jobs whose measured use exceeded their hint (the claim audit).")
@click.option("-M", "--clusters", "--cluster", "clusters", multiple=True,
              help="Clusters (comma-separated), or all (default, as sacct: this host's cluster; "
              "every cluster where Slurm cannot say).")
@click.option("-L", "--allclusters", is_flag=True, help="Every cluster's jobs (-M all).")
@click.option("--ledger", "url", envvar="HORUS_LEDGER_URL", callback=not_empty,
              help="Ledger database URL (default $HORUS_LEDGER_URL or the site ledger); "
              "opened read-only.")
@one_line_errors("hacct", needs_stdout=lambda o: o.get("plot") in (None, "-") or o.get("summary")
                 or o.get("helpformat")
                 or (o.get("fmt") or "").strip().lower() == "help")  # else a PNG is the answer
def main(jobs, users, accounts, allusers, starttime, endtime, states, fmt, helpformat, parsable2,
         parsable, delimiter, allocations, noheader, as_json, summary, plot, under_claims,
         clusters, allclusters, url):
    """Predicted vs actual GPU use of jobs (sacct-style)."""
    from slurm_horus.ledger import plots, report
    from slurm_horus.errors import HorusError
    from slurm_horus.slurm.accounting import STATE_ABBREV

    if helpformat or (fmt and fmt.strip().lower() == "help"):  # as sacct -e (and -o help)
        click.echo(report.help_format(), nl=False)
        return
    cols = report.parse_format(fmt)
    if plot not in (None, "-"):
        from slurm_horus.plot import check_path

        plot = check_path(plot)  # before the ledger is read
    from slurm_horus.slurm import commands as slurm

    # scontrol show config, asked at most once (the cluster's name, its privacy)
    config = functools.cache(slurm.slurm_config)
    # matched as text: UTF-8, checked first (the users again after _who, which may change them)
    _split(users, "-u/--user")
    account_list = _split(accounts, "-A/--account")
    names = [c.lower() for c in _split(clusters, "-M/--clusters")]
    every = allclusters or "all" in names
    # as sacct: this host's cluster by default (decided below, once the ledger is open)
    local = None if every or names else slurm.local_cluster(config())
    cluster = None if every else (names or local)
    ids = [x.split(".")[0] for x in _split(jobs)]  # N.step: the ledger holds jobs, not steps
    # ArrayJobId_TaskId and HetJobId+Offset: the ledger keys tasks and het components by their
    # own ids, which Slurm's accounting gives; each names that job alone
    tasks = [x for x in ids if "_" in x]
    comps = [x for x in ids if "+" in x and "_" not in x]
    task_ids = None  # the own ids of those: None where none was named so
    one = cluster if isinstance(cluster, str) or cluster is None else (cluster[0] if len(cluster) == 1 else None)
    if (tasks or comps) and cluster and one is None:
        what = "array tasks" if tasks else "heterogeneous job components"
        raise HorusError(f"-j/--jobs: {what} are looked up in one cluster: give one -M")
    ids = [x for x in ids if x not in tasks and x not in comps]
    job_ids = [int(x) if x.isascii() and x.isdigit() else -1 for x in ids]
    bad = next((x for x, j in zip(ids, job_ids) if not 0 < j < 2 ** 32), None)  # Slurm's: 32-bit
    if bad is not None:
        raise HorusError(f"-j/--jobs: {bad[:40]}{'...' if len(bad) > 40 else ''}: not a job id")
    if tasks or comps:
        task_ids = (_member_jobs(tasks, "_", one) if tasks else []) + (_member_jobs(comps, "+", one) if comps else [])
    state_list = [STATE_ABBREV.get(s.upper(), s.upper()) for s in _split(states)]
    unknown = sorted(set(state_list) - set(STATE_ABBREV.values()))
    if unknown:
        raise HorusError(f"-s/--state: unknown state {', '.join(unknown)} (e.g. CD, F, TO, CA, OOM)")
    named = bool(job_ids or tasks or comps)  # -j: those jobs, whenever and whoever's (a task Slurm lacks: none)
    if starttime is None and not named and not state_list and not summary and plot is None:
        starttime = time.strftime("%Y-%m-%dT00:00:00")  # as sacct: since midnight
    # as sacct: -u -1 is every user's, and of -u and -a the later wins (-u bob -a: everyone's)
    users, allusers = _who(given_order(click.get_current_context(), "users", "allusers"), users, allusers)
    filters = dict(job_ids=job_ids or None, task_ids=task_ids, users=[_user_name(u) for u in _split(users)] or None,
                   accounts=[a.lower() for a in account_list] or None, states=state_list or None,
                   start=parse_time(starttime, "-S/--starttime"),
                   end=parse_time(endtime, "-E/--endtime"), cluster=cluster,
                   under_claims=under_claims)
    if state_list and filters["start"] is not None and filters["end"] is None:
        filters["end"] = filters["start"]  # as sacct: with -s, -E defaults to -S (the states then)
    end = filters["end"] if filters["end"] is not None else int(time.time())  # sacct's default -E: now
    if filters["start"] is not None and filters["start"] > end:
        # as sacct, rather than an empty list (-E before midnight with the default -S too; -S
        # tomorrow, now+1hours or a later hour today against the default end, now)
        e = HorusError(f"Start time ({report.sacct_time(filters['start'])}) requested is after "
                       f"end time ({report.sacct_time(end)})")
        e.exit_code = 1  # sacct's
        raise e
    # as sacct -j N: a heterogeneous job's components too, looked up in the one cluster listed
    # (with -L or several -M, an id is no one job: its components are not looked up)
    if job_ids and not every and not (cluster and one is None) and (het := _het_components(job_ids, one)):
        filters["task_ids"] = (task_ids or []) + het
    from slurm_horus.ledger import current_user, open_reader

    me = current_user()
    ledger = open_reader(url, me)
    if local is not None and (held := set(ledger.clusters())) and (local not in held or len(held) == 1):
        # the ledger holds one cluster's jobs, or none under the name Slurm gives now (a
        # renamed cluster, a ledger of elsewhere): nothing of another cluster to hide here
        filters["cluster"] = None
    asked = filters["users"]
    private = not ledger.writable() and slurm.private_jobs(unknown=True, conf=config())
    if private:
        # as sacct where jobs are private: a user's own, whoever else -u names ("" matches no
        # one: -u bob shows none of bob's, never your own under his name)
        filters["users"] = [me] if not asked or me in asked else [""]
    elif not asked and not allusers and not named and os.geteuid() != 0:
        filters["users"] = [me]  # as sacct: your own jobs unless -a (or -j: those jobs)
    # the jobs that shared a GPU with yours are named only where they are yours
    own = {(r["cluster"], r["job_id"]) for r in ledger.iter_jobs(users=[me])} if private else None
    if summary:
        s = report.summary(ledger, own=own, **filters)
        if as_json:
            from slurm_horus.cli.common import print_json

            print_json(s)
        else:
            click.echo(report.summary_text(s), nl=False)
        return
    if plot is not None:
        from slurm_horus.plot import console, save

        points = plots.plot_points(ledger, **filters)
        where = plots.describe(ledger.url, filters, shown=len(points))
        if plot == "-":
            console().print(plots.terminal(points, where), end="")
        else:
            click.echo(f"wrote {save(plots.figure(points, where), plot)}")
        return
    # streamed from the ledger a chunk at a time: a window of a million jobs is printed in the
    # memory of a few thousand (it took 3 GB, 8 GB as JSON, all read before the first line)
    def listed():
        rows = ledger.iter_jobs(**filters)
        return report.only_own_colocated(rows, own) if private else rows

    rows = listed()
    if as_json:
        _json_lines(rows)
        return
    pipe = parsable2 or parsable
    # a Name%W width asks for sacct's fixed-width table, on a terminal too (the rich table
    # ignored it: no '-----' line, values cut to '…')
    fixed = any(w for _, w in cols)
    if sys.stdout.isatty() and not pipe and not fixed:
        first = list(islice(rows, RICH_MAX_ROWS + 1))
        if len(first) <= RICH_MAX_ROWS:
            from rich.console import Console

            table, console = report.rich_table(first, cols, noheader), Console()
            need = console.measure(table, options=console.options.update_width(1 << 16)).maximum
            if need > console.width:  # whole values, lines the terminal wraps, as sacct's
                # (fitted, ids and users were cut to '…'); a height too, or a dumb terminal's 80 wins
                console = Console(width=need, height=console.height)
            console.print(table)
            return
        rows = chain(first, rows)
    # fixed widths: a pass for the widths, then the lines
    widths = None if pipe else report.column_widths(listed(), cols)
    trailing = last_given(click.get_current_context(), "parsable", "parsable2") == "parsable"
    for line in report.plain_lines(rows, cols, pipe, noheader, trailing=trailing,
                                   widths=widths, delimiter=delimiter):
        click.echo(line)


RICH_MAX_ROWS = 5000  # more than a screen can show: the plain table (streamed) instead


def _json_lines(rows) -> None:
    """The jobs as one JSON list (json.dumps(..., indent=1)'s text), written job by job."""
    import json
    import textwrap

    from slurm_horus.cli.common import finite
    from slurm_horus.ledger.report import job_json

    first = True
    for r in rows:
        click.echo("[" if first else ",")
        click.echo(textwrap.indent(json.dumps(finite(job_json(r)), indent=1), " "), nl=False)
        first = False
    click.echo("[]" if first else "\n]")


if __name__ == "__main__":
    main()
