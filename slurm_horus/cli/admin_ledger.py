"""`horus-admin sync | retrain | import`: the ledger's admin commands.

The lead wires them into horus-admin with ``register(main)`` (see slurm_horus/cli/admin.py).
"""

from __future__ import annotations

import sys

import click

from slurm_horus.cli.common import (Command, model_dir_option, not_empty, one_line_errors,
                                    parse_time, print_json)
from slurm_horus.errors import HorusError, one_line
from slurm_horus.ledger import Ledger
from slurm_horus.ledger.db import failure_reason
from slurm_horus.ledger.history_export import export_history
from slurm_horus.ledger.publish import publish
from slurm_horus.ledger.retrain import import_csv as do_import, retrain as do_retrain
from slurm_horus.ledger.sync import sync as do_sync
from slurm_horus.predict.registry import Registry
from slurm_horus.textfile import read_text

MAX_SACCT_JSON = 2 << 30  # sacct --json of a busy day is hundreds of MB; /dev/zero is endless

LEDGER = click.option("--ledger", "url", envvar="HORUS_LEDGER_URL", callback=not_empty,
                      help="Ledger database URL (default $HORUS_LEDGER_URL, else ledger_url in "
                           "/etc/slurm-horus/horus.conf, else "
                           "sqlite:////var/lib/slurm-horus/ledger.db).")
MODEL_DIR = model_dir_option()


def _regular_file(value, name: str):
    """A path option's value where it must be a regular file (a FIFO read as an empty policy
    and the record went to the default path, not the one the admin named)."""
    import os
    import stat

    if value is not None and not stat.S_ISREG(os.stat(value).st_mode):
        raise click.BadParameter(f"{value}: not a regular file", param_hint=name)
    return value


@click.command("sync", cls=Command)
@LEDGER
@click.option("-S", "--since", help="Window start (default: 5 minutes before the last sync, else 1 day ago).")
@click.option("-E", "--until", help="Window end (default now).")
@click.option("--all", "all_jobs", is_flag=True,
              help="Also record GPU jobs whose comment carries no hint or workload token.")
@click.option("--from-file", type=click.Path(dir_okay=False), callback=not_empty,
              help="Read sacct --json output from this file instead of running sacct.")
@click.option("--policy", envvar="HORUS_POLICY", type=click.Path(exists=True, dir_okay=False),
              callback=lambda ctx, param, v: _regular_file(v, "--policy"),
              help="Policy file naming record_file and underclaim_window_days (default: the "
                   "hook's).")
@MODEL_DIR
@click.option("--history/--no-history", default=True, show_default=True,
              help="Refresh the registry's measured-run history for hsubmit when jobs were "
                   "recorded and the registry folder exists.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors("horus-admin sync")
def sync(url, since, until, all_jobs, from_file, policy, model_dir, history, as_json):
    """Record finished jobs from sacct (idempotent), replay the probes' spool, then write the
    hook's claim record (and users' extracts where Slurm keeps jobs private) and refresh the
    history hsubmit predicts reruns from (a graph is predicted from its own runs a sync after
    they end, not a retrain later)."""
    start, end = parse_time(since, "--since"), parse_time(until, "--until")
    if start is not None and end is not None and start > end:
        raise click.UsageError("--since is after --until")
    data = None
    if from_file:
        if since or until:
            raise click.UsageError("-S/-E choose what sacct is asked for; with --from-file the "
                                   "file is the window")
        data = read_text(from_file, "--from-file", MAX_SACCT_JSON)  # bounded; a FIFO: no hang
    ledger = Ledger(url)
    res = do_sync(ledger, sacct_json=data, since=start, until=end, all_jobs=all_jobs)
    try:
        res.update(publish(ledger, policy=policy))
    except HorusError as e:  # a full disk: the jobs are in the ledger, what readers get is not
        raise HorusError(f"{res['recorded']} jobs recorded and {res['replayed']} spooled records "
                         f"replayed, but {e}") from None
    skipped = res.pop("extracts_skipped", None)
    if skipped:  # where jobs are private their hacct finds no copy: the admin must know whose
        res["problems"].append(f"no extract for {len(skipped)} users this host does not know "
                               f"({', '.join(skipped[:5])}{', ...' if len(skipped) > 5 else ''}): "
                               "their hacct finds no copy of the ledger")
    if res["record_kept"]:
        res["problems"].append(f"{res['record_file']} kept: it names under-claimers, and this ledger "
                               "was made here and has never written it (a new or wrong ledger? if it "
                               "is the site's, remove the record)")
    res["history"] = None
    registry = Registry(model_dir)
    if history and (res["recorded"] or res["replayed"]) and registry.root.is_dir():
        res["history"], problem = _history(ledger, registry)
        if problem:
            res["problems"].append(problem)
    if as_json:
        print_json(res)
        return
    for p in res["problems"]:
        click.echo(f"horus-admin sync: warning: {p}", err=True)
    extracts = "" if res["extracts"] is None else f", {res['extracts']} user extracts"
    click.echo(f"sync: {res['recorded']} of {res['jobs_seen']} finished jobs recorded "
               f"({res['claims']} with claims, {res['features']} with features recomputed, "
               f"{res['failed_measurements']} failed measurements flagged); "
               f"spool: {res['replayed']} replayed, {res['quarantined']} quarantined, "
               f"{res['skipped']} skipped; {res['record_file']}: {res['record_users']} users, "
               f"{res['record_accounts']} accounts{extracts}")
    if res["history"]:
        click.echo(_history_line(res["history"]))


@click.command("retrain", cls=Command)
@LEDGER
@MODEL_DIR
@click.option("--import", "import_csv", type=click.Path(dir_okay=False), callback=not_empty,
              help="First import measurements from this CSV (see `horus-admin import`).")
@click.option("--folds", type=click.IntRange(2, 20), default=5, show_default=True)
@click.option("--max-iter", type=click.IntRange(10, 2000), default=200, show_default=True,
              help="Boosting rounds per ensemble.")
@click.option("--force", is_flag=True, help="Promote even if not better than the serving model.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@one_line_errors("horus-admin retrain")
def retrain(url, model_dir, import_csv, folds, max_iter, force, seed, as_json):
    """Train the learned predictor on measured jobs; promote it only if it beats the serving one."""
    ledger = Ledger(url)
    registry = Registry(model_dir)
    if import_csv:
        imp = do_import(ledger, import_csv)
        if not as_json:
            click.echo(f"imported {imp['rows']} rows from {import_csv}{_failed_note(imp)}")
    res = do_retrain(ledger, registry, folds=folds, force=force, seed=seed,
                     max_iter=max_iter, progress=sys.stderr.isatty() and not as_json,
                     log=lambda m: click.echo(m, err=True))
    res["history"], problem = _history(ledger, registry)
    if problem:
        click.echo(f"horus-admin retrain: warning: {problem}", err=True)
    if as_json:
        print_json(res)
        return
    cv, new, base = res["cv"], res["held_out"], res["baseline"]
    click.echo(f"trained {res['version']} on {res['rows']} jobs ({res['skipped']} unusable, "
               f"{res['failed']} failed measurements excluded), {res['cv_folds']}-fold CV by "
               f"graph: mem median rel err {cv['mem_mdape_pct']:.1f}%  {_util_figures(cv)}")
    if new is not None:
        click.echo(f"on the {res['held_out_rows']} jobs of graphs {res['baseline_version']} never saw "
                   "(each user's jobs weighing one user"
                   + ("" if res.get("util_scored") else "; compared on memory alone") + "):")
        for name, m in (("new", new), ("serving", base)):
            click.echo(f"  {name:<8}: mem median rel err {m['mem_mdape_pct']:.1f}%  {_util_figures(m)}"
                       + (f" ({res['baseline_version']})" if name == "serving" else ""))
    if res["promoted"]:
        click.echo(f"promoted {res['version']}" + ("" if res["better"] else " (--force)"))
    else:
        click.echo(f"kept {res['baseline_version']}: {res['version']} is not shown better "
                   "(stored; --force or `horus-admin models promote` to serve it)")
    if res["history"]:
        click.echo(_history_line(res["history"]))


def _util_figures(m: dict) -> str:
    """'util RMSLE 0.123  util MAE 4.5 pp' of accuracy() figures, or that none was measured
    (None: every job scored shared its GPU, so none of its utilization measures its need)."""
    if m.get("util_rmsle") is None or m.get("util_mae_pct") is None:
        return "util not measured (every job scored shared its GPU)"
    return f"util RMSLE {m['util_rmsle']:.3f}  util MAE {m['util_mae_pct']:.1f} pp"


def _history(ledger, registry) -> tuple[dict | None, str | None]:
    """(export_history's answer, None), else (None, the warning that says why): what the
    command did (jobs recorded, a model stored and maybe serving) stands whatever fails here, so
    a failure is its warning, never its error (a locked ledger or a full disk had reported a
    retrain that promoted as an internal error)."""
    from sqlalchemy.exc import DBAPIError

    try:
        return export_history(ledger, registry), None
    except Exception as e:  # noqa: BLE001
        if isinstance(e, DBAPIError):
            why = f"ledger: {failure_reason(e)}"
        elif isinstance(e, (HorusError, OSError)):
            why = str(e)
        else:  # no environment's message: its kind
            why = type(e).__name__
        return None, one_line(f"history not refreshed: {why}")


def _failed_note(imp: dict) -> str:
    notes = [f"{imp['repeated']} repeated rows counted once"] if imp.get("repeated") else []
    if imp.get("failed"):
        notes.append(f"{imp['failed']} failed measurements kept, flagged and excluded from training")
    return f" ({'; '.join(notes)})" if notes else ""


def _history_line(h: dict) -> str:
    line = (f"history: {h.get('runs', 0)} measured runs of {h.get('graphs', 0)} graphs written "
            f"to {h.get('path')}")
    if h.get("runs_dropped"):
        line += (f" ({h['runs_dropped']} of {h.get('measured_runs', '?')} measured jobs left out, the "
                 "oldest of the users with the most settings first: the whole would pass the size "
                 "readers take)")
    return line


@click.command("import", cls=Command)
@click.argument("csv_file", type=click.Path(dir_okay=False))
@LEDGER
@MODEL_DIR
@one_line_errors("horus-admin import")
def import_(csv_file, url, model_dir):
    """Load measured jobs from CSV: gpu_type, util_pct, mem_mib, and model (ONNX path) or
    features (JSON) with cold_util_pct and cold_mem_mib, optional batch_size, task, optimizer,
    precision, cpus_per_gpu, util_max_pct, user, model_family (see docs/ledger.md). Where the
    registry folder exists, its measured-run history is refreshed for hsubmit."""
    ledger = Ledger(url)
    imp = do_import(ledger, csv_file)
    click.echo(f"imported {imp['rows']} rows{_failed_note(imp)}")
    registry = Registry(model_dir)
    if registry.root.is_dir():
        history, problem = _history(ledger, registry)
        if problem:  # the rows are in: a warning, as after a retrain
            click.echo(f"horus-admin import: warning: {problem}", err=True)
        else:
            click.echo(_history_line(history))


def register(main_group: click.Group) -> None:
    """Add sync, retrain and import to horus-admin."""
    for cmd in (sync, retrain, import_):
        main_group.add_command(cmd)
