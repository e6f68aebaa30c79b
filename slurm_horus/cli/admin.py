"""`horus-admin`: the admin's tools (learned-model registry; later sync, retrain, simulate)."""

from __future__ import annotations

import os

import click

from slurm_horus.cli.common import Group, model_dir_option, one_line_errors, print_json
from slurm_horus.errors import one_line

MODEL_DIR = model_dir_option()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-horus")
def main():
    """Administer slurm-horus."""


@main.group()
def models():
    """The learned-model registry: list, promote, rollback."""


@models.command("list")
@MODEL_DIR
@click.option("--json", "as_json", is_flag=True)
@one_line_errors("horus-admin models list", needs_stdout=True)
def models_list(model_dir, as_json):
    """List model versions with their cross-validated accuracy (the promotion compares the
    candidate with the serving model on rows neither saw, as retrain reports) and the calibrated
    memory bounds each serves with (bounds=p90/p95/p99, none, or ? where refused); * marks the
    serving one."""
    from slurm_horus.errors import HorusError
    from slurm_horus.predict.registry import Registry

    if model_dir is not None and not os.path.isdir(model_dir):
        # a folder named (--model-dir, $HORUS_MODEL_DIR) and not there is a typo, not a site
        # without models yet
        raise HorusError(f"no registry folder {model_dir}")
    registry = Registry(model_dir)
    entries = registry.list()
    for e in entries:
        if e["valid"]:
            e["bounds"], why = _bounds(registry, e["version"])
            if e["serving"]:
                _warn_without_bounds("models list", why)
    if as_json:
        print_json(entries)
        return
    if not entries:
        click.echo("no models: the cold-start estimator serves")
    for e in entries:
        mark = "*" if e["serving"] else " "
        if not e["valid"]:
            click.echo(f"{mark} {e['version']}  INVALID: {one_line(str(e['error']))}")
            continue
        m, meta = e["metrics"], e["meta"]

        def fig(key, fmt, unit=""):  # a figure the file holds as something else prints as ?
            v = m.get(key) if isinstance(m, dict) else None
            if v is None and isinstance(m, dict) and key in m:
                return "none"  # not measured: every job scored shared its GPU (util figures)
            return (format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "?") + unit

        meta = meta if isinstance(meta, dict) else {}
        bounds = "?" if e["bounds"] is None else "/".join(e["bounds"]) or "none"
        # the registry's files are root's, but what they say is printed, not obeyed
        click.echo(one_line(f"{mark} {e['version']}  rows={meta.get('rows', '?')}  "
                            f"mem_mdape={fig('mem_mdape_pct', '.1f')}%  util_rmsle={fig('util_rmsle', '.3f')}  "
                            f"util_mae={fig('util_mae_pct', '.1f', 'pp')}  bounds={bounds}  "
                            f"{meta.get('created', '')}"))


def _bounds(registry, version: str) -> tuple[list[str] | None, str | None]:
    """The calibrated memory bounds ``version`` serves with (None: its calibration is refused),
    and what is wrong when it has none."""
    from slurm_horus.errors import HorusError
    from slurm_horus.predict.chain import load_calibration, no_bounds

    try:
        cal = load_calibration(registry, version)
    except HorusError as e:
        return None, f"calibration refused ({e}); {version}'s bounds are its own"
    bounds = list(cal.learned_bounds(version)) if cal else []
    return bounds, None if bounds else no_bounds(version)


def _warn_without_bounds(command: str, why: str | None) -> None:
    """A warning where the serving version has no calibrated bounds or they are refused: a
    rollback had served the older model without its p95/p99, and nothing said so."""
    if why:
        click.echo(one_line(f"horus-admin {command}: warning: {why}"), err=True)


@models.command()
@click.argument("version")
@MODEL_DIR
@one_line_errors("horus-admin models promote")
def promote(version, model_dir):
    """Serve VERSION from now on."""
    from slurm_horus.predict.registry import Registry

    registry = Registry(model_dir)
    registry.promote(version)
    click.echo(f"serving {version}")
    _warn_without_bounds("models promote", _bounds(registry, version)[1])


@models.command()
@MODEL_DIR
@one_line_errors("horus-admin models rollback")
def rollback(model_dir):
    """Serve the previously serving version again."""
    from slurm_horus.predict.registry import Registry

    registry = Registry(model_dir)
    version = registry.rollback()
    click.echo(f"serving {version}")
    _warn_without_bounds("models rollback", _bounds(registry, version)[1])


def _register_subcommands() -> None:
    from slurm_horus.cli.admin_calibrate import register as register_calibrate
    from slurm_horus.cli.admin_doctor import register as register_doctor
    from slurm_horus.cli.admin_ledger import register as register_ledger
    from slurm_horus.cli.admin_queue import register as register_queue
    from slurm_horus.cli.admin_simulate import register as register_simulate

    register_ledger(main)
    register_queue(main)
    register_calibrate(main)
    register_simulate(main)
    register_doctor(main)


_register_subcommands()


if __name__ == "__main__":
    main()
