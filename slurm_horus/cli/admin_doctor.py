"""`horus-admin doctor`: check the site's Slurm and slurm-horus set-up (slurm_horus.doctor).

Wired into `horus-admin` by ``register(main)``.
"""

from __future__ import annotations

import os

import click

from slurm_horus.cli.common import model_dir_option, not_empty, one_line_errors, print_json


def _conf_file(ctx, param, value):
    """--slurm-conf: given, a regular file where it exists (a FIFO or /dev/null had been checked
    as an empty slurm.conf, a list of problems of a file that is not there); one missing is the
    doctor's own error."""
    import stat

    value = not_empty(ctx, param, value)
    try:
        mode = os.stat(value).st_mode if value is not None else None
    except OSError:
        return value
    if mode is not None and not stat.S_ISREG(mode):
        raise click.BadParameter(f"{value}: not a regular file", ctx, param)
    return value


def register(main_group: click.Group) -> None:
    """Add the `doctor` command to ``main_group`` (horus-admin)."""

    @main_group.command("doctor")
    @click.option("--slurm-conf", type=click.Path(dir_okay=False), callback=_conf_file,
                  help="slurm.conf to check (default $SLURM_CONF, else /etc/slurm/slurm.conf); "
                       "gres.conf and job_submit.lua are read from its folder.")
    @click.option("--policy", type=click.Path(dir_okay=False), callback=not_empty,
                  help="Policy file (default: the one the hook reads).")
    @click.option("--ledger", "ledger_url", envvar="HORUS_LEDGER_URL", callback=not_empty,
                  help="Ledger URL (default $HORUS_LEDGER_URL or the site default).")
    @model_dir_option("Model registry folder")
    @click.option("--json", "as_json", is_flag=True, help="Problems as JSON.")
    @one_line_errors("horus-admin doctor", needs_stdout=True)
    def doctor(slurm_conf, policy, ledger_url, model_dir, as_json):
        """Check slurm.conf, gres.conf, the hook, the policy, accounting, Prolog/Epilog, the
        ledger's and registry's permissions and the Slurm version; print each problem with its
        fix. Exit 1 when there is any."""
        from slurm_horus.doctor import diagnose, slurm_version_text

        conf = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
        version = slurm_version_text()
        problems = diagnose(conf, policy=policy, ledger_url=ledger_url, model_dir=model_dir,
                            version_text=version)
        if as_json:
            print_json({"slurm_conf": conf, "slurm_version": version,
                        "problems": [{"problem": p.what, "fix": p.fix} for p in problems]})
        else:
            click.echo(f"checked {conf} (Slurm {version or 'version unknown'})")
            for p in problems:
                click.echo(f"PROBLEM: {p.what}\n    fix: {p.fix}")
            click.echo(f"{len(problems)} problem(s)" if problems else "no problems found")
        if problems:
            raise SystemExit(1)
