"""`horus`: look at what slurm-horus sees in a model (features) and what it predicts."""

from __future__ import annotations

import click

from .common import human, one_line_errors, parse_dims, print_json

BATCH_HELP = "Bind the batch dimension (symbolic batch-like or leading input dimensions)."
DIM_HELP = "Bind a symbolic dimension by name, e.g. --dim seq=512 (repeatable)."


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-horus")
def main():
    """Predict a deep-learning job's GPU use from its ONNX graph."""


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--batch-size", "-b", type=int, help=BATCH_HELP)
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help=DIM_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--nodes", is_flag=True, help="Include the per-node breakdown (with --json).")
@one_line_errors("horus features")
def features(model, batch_size, dims, as_json, nodes):
    """Extract the features of MODEL (FLOPs, parameters, activations, op mix)."""
    from ..features import extract_features

    report = extract_features(model, batch_size=batch_size, dims=parse_dims(dims))
    if as_json:
        print_json(report.to_dict(nodes=nodes))
        return
    _print_feature_table(report)


def _print_feature_table(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{report.model}", title_justify="left")
    for col, justify in (("op", "left"), ("count", "right"), ("FLOPs", "right"),
                         ("params", "right"), ("activations", "right")):
        table.add_column(col, justify=justify)
    for op, s in sorted(report.by_op.items(), key=lambda kv: -kv[1].flops):
        table.add_row(op, str(s.count), human(s.flops), human(s.params),
                      human(s.activation_bytes, "B"))
    v = report.values
    table.add_section()
    table.add_row("total", str(int(v["n_nodes"])), human(v["flops"]), human(v["params"]),
                  human(v["activation_bytes"], "B"), style="bold")
    console.print(table)
    console.print(f"bound: {_fmt_dims(report.bound_dims)}   depth: {int(v['depth'])}   "
                  f"kernels: {int(v['kernels'])}   memory traffic: "
                  f"{human(v['read_bytes'] + v['write_bytes'], 'B')}   "
                  f"kept for backward: {human(v['saved_activation_bytes'], 'B')}")
    if report.unknown_ops:
        console.print(f"[yellow]no cost rule for: {', '.join(report.unknown_ops)}[/yellow]")
    if report.unknown_dims:
        console.print(f"[yellow]unknown dimensions (bind with --dim NAME=VALUE): "
                      f"{', '.join(report.unknown_dims)}[/yellow]")
    if report.missing_external_data:
        console.print(f"weights not present (not needed): "
                      f"{', '.join(report.missing_external_data)}")


def _fmt_dims(dims: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items()) or "none"
