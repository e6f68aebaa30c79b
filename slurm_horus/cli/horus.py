"""`horus`: look at what slurm-horus sees in a model (features) and what it predicts."""

from __future__ import annotations

from dataclasses import dataclass

import click

from slurm_horus.graph.load import parse_dims
from slurm_horus.cli.common import Group, human, model_dir_option, one_line_errors, print_json
from slurm_horus.errors import HorusError, one_line
from slurm_horus.rounding import shown

BATCH_HELP = "Bind the batch dimension (symbolic batch-like or leading input dimensions)."
DIM_HELP = "Bind a symbolic dimension by name, e.g. --dim seq=512 (repeatable)."


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-horus")
def main():
    """Predict a deep-learning job's GPU use from its ONNX graph."""


@main.command()
@click.argument("model", metavar="MODEL.onnx")
@click.option("--batch-size", "-b", type=int, help=BATCH_HELP)
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help=DIM_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--nodes", is_flag=True, help="Include the per-node breakdown (with --json).")
@one_line_errors("horus features", needs_stdout=True)
def features(model, batch_size, dims, as_json, nodes):
    """Extract the features of MODEL (FLOPs, parameters, activations, op mix)."""
    from slurm_horus.graph.features import extract_features

    report = extract_features(model, batch_size=batch_size, dims=parse_dims(dims))
    if as_json:
        for warning in report.warnings():
            click.echo(f"horus features: warning: {one_line(warning)}", err=True)
        print_json(report.to_dict(nodes=nodes))
        return
    _print_feature_table(report)


def _print_feature_table(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=_plain(f"{report.model}"), title_justify="left")  # names are not markup
    for col, justify in (("op", "left"), ("count", "right"), ("FLOPs", "right"),
                         ("params", "right"), ("activations", "right")):
        table.add_column(col, justify=justify)
    for op, s in sorted(report.by_op.items(), key=lambda kv: -kv[1].flops):
        table.add_row(_plain(op), str(s.count), human(s.flops), human(s.params),
                      human(s.activation_bytes, "B"))
    v = report.values
    table.add_section()
    table.add_row("total", str(int(v["n_nodes"])), human(v["flops"]), human(v["params"]),
                  human(v["activation_bytes"], "B"), style="bold")
    console.print(table)
    console.print(f"bound: {_plain(_fmt_dims(report.bound_dims))}   depth: {int(v['depth'])}   "
                  f"kernels: {int(v['kernels'])}   memory traffic: "
                  f"{human(v['read_bytes'] + v['write_bytes'], 'B')}   "
                  f"kept for backward: {human(v['saved_activation_bytes'], 'B')}")
    for warning in report.warnings():
        console.print(f"[yellow]warning: {_plain(warning)}[/yellow]")
    if report.unknown_dims:
        console.print(f"[yellow]unknown dimensions (bind with --dim NAME=VALUE): "
                      f"{_plain(_few(report.unknown_dims))}[/yellow]")
    if report.missing_external_data:
        console.print(f"weights not present (not needed): "
                      f"{_plain(', '.join(report.missing_external_data))}")


def _plain(text: str) -> str:
    """Text from a model file (its path, op and dimension names) for rich: no markup, and no
    control characters to drive the terminal."""
    from rich.markup import escape

    return escape(one_line(text))


def _few(names: list[str], n: int = 6) -> str:
    """The names users can bind first (not ONNX's generated unk__N), at most n of them."""
    ordered = sorted(names, key=lambda d: d.startswith("unk__"))
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(ordered[:n]) + more


def _fmt_dims(dims: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items()) or "none"


@main.command()
@click.argument("model", metavar="MODEL.onnx")
@click.option("--batch-size", "-b", type=int, required=True, help=BATCH_HELP)
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help=DIM_HELP)
@click.option("--task", type=click.Choice(["train", "infer"]), default="train", show_default=True)
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam", "adamw"]),
              default="adam", show_default=True, help="Optimizer (training only).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "amp"]), default="fp32",
              show_default=True, help="amp = torch.autocast mixed precision.")
@click.option("--cpus-per-gpu", type=float, metavar="N",
              help="CPUs per GPU the job gets (they feed each GPU's input pipeline); hsubmit "
              "reads it from the job's request. Default: 1, Slurm's for a one-GPU job.")
@click.option("--gpu", "gpu_types", multiple=True, metavar="TYPE",
              help="GPU type or Slurm gres type name (repeatable or comma-separated; default: every "
              "catalog type).")
@model_dir_option("Learned-model registry folder")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object with one --gpu).")
@one_line_errors("horus predict", needs_stdout=True)
def predict(model, batch_size, dims, task, optimizer, precision, cpus_per_gpu, gpu_types,
            model_dir, as_json):
    """Predict GPU utilization and peak GPU memory of MODEL per GPU type."""
    from slurm_horus.predict.coldstart import Workload
    from slurm_horus.graph.features import extract_features
    from slurm_horus.predict.gpus import default_catalog
    from slurm_horus.predict.chain import choose_predictor, predict_for

    # no --cpus-per-gpu: one, what hsubmit reads from a one-GPU job that asks for no CPUs
    workload = Workload(batch_size=batch_size, task=task, optimizer=optimizer, precision=precision,
                        cpus_per_gpu=1.0 if cpus_per_gpu is None else cpus_per_gpu)
    catalog = default_catalog()
    if gpu_types:  # comma lists, as Slurm's
        gpu_types = [t.strip() for v in gpu_types for t in v.split(",") if t.strip()]
        if not gpu_types:
            raise HorusError("--gpu: no GPU type given")
    gpus = [catalog.get(t) for t in gpu_types] if gpu_types else list(catalog)
    if not gpu_types and precision == "bf16":
        gpus = [g for g in gpus if g.has_bf16]
    report = extract_features(model, batch_size=batch_size, dims=parse_dims(dims))
    report.require_bound()  # as hsubmit: no prediction from sizes taken as 1
    if click.get_current_context().get_parameter_source("model_dir") is not click.core.ParameterSource.COMMANDLINE:
        model_dir = None  # the site's folder ($HORUS_MODEL_DIR), not one named here: none yet is no typo
    choice = choose_predictor(model_dir)
    predictions = predict_for(report, gpus, workload, choice)
    fits = [hook_fit(p, g, asked) for p, g, asked in
            zip(predictions, gpus, gpu_types or [None] * len(gpus))]
    for warning in [*report.warnings(), *filter(None, [choice.warning])]:
        click.echo(f"horus predict: warning: {warning}", err=True)
    if as_json:
        rows = [dict(p.to_dict(), fits=f.fits, fit_limit_mib=f.limit_mib, fit_rule=f.rule)
                for p, f in zip(predictions, fits)]
        extra = {"model": report.model, "workload": workload.__dict__, "note": choice.note,
                 "unknown_dims": report.unknown_dims, "unknown_ops": report.unknown_ops}
        print_json({**rows[0], **extra} if len(rows) == 1 else {"predictions": rows, **extra})
        return
    _print_prediction_table(report, workload, predictions, gpus, fits, choice.note)


@dataclass(frozen=True)
class Fit:
    fits: bool | None   # None: the policy does not know the GPU type (the hook never packs it)
    limit_mib: float | None
    rule: str           # what was compared with what, and where the limit comes from


def hook_fit(p, gpu, asked: str | None = None) -> Fit:
    """Whether the hook would let this job share a GPU memory-wise, judged as job_submit.lua
    does: the policy's `memory` figure (p90 unless set; p95/p99 where calibrated, else p90),
    rounded up to whole MiB as the hint carries it, at least min_mem_mib, against
    pack_limit_pct % of the policy's gpu.<type>.mem_mib (the type as asked, else its catalog
    name or an alias). Without a readable policy file: p90 against the catalog's memory,
    and the rule says so."""
    from slurm_horus.slurm.policy import charged_mem_mib, policy_file, policy_value
    from slurm_horus.textfile import open_for_reading

    path = policy_file()
    try:  # a FIFO is no policy (the hook's io.open would wait on it for ever)
        with open_for_reading(path, regular_only=True):
            pass
    except OSError:
        ok = p.mem_mib_p90 <= gpu.mem_mib
        return Fit(ok, float(gpu.mem_mib),
                   f"p90 {'<=' if ok else '>'} {gpu.name}'s {gpu.mem_mib} MiB in the GPU catalog "
                   f"(no readable policy at {path})")
    names = [n for n in dict.fromkeys([asked, gpu.name, *gpu.aliases]) if n]
    mem_of = {n: policy_value(f"gpu.{n.lower()}.mem_mib", path=path) for n in names}
    gtype = next((n for n in names if mem_of[n] is not None), None)
    if gtype is None:
        if p.mem_mib_p90 > gpu.mem_mib:  # not the hook's question: not even a whole GPU holds it
            return Fit(False, float(gpu.mem_mib), f"p90 > {gpu.name}'s {gpu.mem_mib} MiB in the "
                                                  "GPU catalog: it does not fit the GPU at all")
        return Fit(None, None, f"{path} has no gpu.<type>.mem_mib for this type: the hook "
                               "does not pack it")
    pack = int(policy_value("pack_limit_pct", "90", path=path))
    field, mem = charged_mem_mib(p.mem_mib, p.mem_mib_p90, p.mem_mib_p95, p.mem_mib_p99, path=path)
    total = int(mem_of[gtype])
    ok = mem * 100 <= total * pack
    return Fit(ok, total * pack / 100,
               f"{field} {mem} MiB {'<=' if ok else '>'} {pack}% of gpu.{gtype.lower()}.mem_mib "
               f"{total} MiB in {path}")


def _print_prediction_table(report, workload, predictions, gpus, fits, note) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=_plain(f"{report.model}  batch {workload.batch_size}, {workload.task}, "
                               f"{workload.optimizer}, {workload.precision}"), title_justify="left")
    for col in ("GPU", "util %", "memory MiB", "p90 MiB", "limit MiB", "fits", "predictor"):
        table.add_column(col, justify="left" if col in ("GPU", "predictor") else "right")
    for p, g, f in zip(predictions, gpus, fits):
        verdict = {True: "yes", False: "[red]no[/red]", None: "-"}[f.fits]
        table.add_row(g.name, f"{shown(p.util_pct, 1):.1f}", f"{shown(p.mem_mib, 0):,.0f}",
                      f"{shown(p.mem_mib_p90, 0):,.0f}",
                      "-" if f.limit_mib is None else f"{f.limit_mib:,.0f}", verdict, p.predictor)
    console.print(table)
    judged = [(g, f) for g, f in zip(gpus, fits) if f.fits is not None]
    if judged:
        console.print(_plain(f"fits: judged as the job_submit hook packs, e.g. {judged[0][0].name}: "
                             f"{judged[0][1].rule}"))
    if len(judged) < len(fits):
        console.print(_plain("-: " + next(f.rule for f in fits if f.fits is None)))
    console.print(_plain(note))


if __name__ == "__main__":
    main()
