"""`horus-admin calibrate`: measure models on this site's GPUs, write `horus-admin import` rows.

Wired into horus-admin with ``register(main)`` (see slurm_horus/cli/admin.py).
"""

from __future__ import annotations

import importlib.util
import sys

import click

from slurm_horus.calibrate.models import default_models, model_specs
from slurm_horus.calibrate.orchestrate import calibrate as run_calibration, check_paths
from slurm_horus.calibrate.plan import DEFAULT_BATCH_SIZES, DEFAULT_TASKS, plan
from slurm_horus.calibrate.sampler import BackgroundSampler
from slurm_horus.calibrate.torch_runner import TorchRunner, check_device, import_torch, require_torch_gpu
from slurm_horus.cli.common import Command, FiniteFloatRange, not_empty, one_line_errors
from slurm_horus.errors import HorusError
from slurm_horus.ledger import Ledger
from slurm_horus.ledger.nvml import NvmlSampler
from slurm_horus.predict.coldstart import MAX_BATCH_SIZE, TASKS
from slurm_horus.predict.gpus import default_catalog


def _csv_list(value: str | None, what: str, cast=str) -> list:
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    try:
        out = [cast(v) for v in items]
    except ValueError:
        raise HorusError(f"{what}: expected a comma-separated list, got {value!r}") from None
    if not out:
        raise HorusError(f"{what}: empty list")
    return out


@click.command("calibrate", cls=Command)
@click.option("--out", "out", type=click.Path(dir_okay=False),
              help="CSV to write the rows to (the `horus-admin import` format; an existing file "
                   "only with --resume); required to run.")
@click.option("--ledger", "url", envvar="HORUS_LEDGER_URL", default=None, callback=not_empty,
              help="Also record each row in this ledger (as `horus-admin import` would).")
@click.option("--models", callback=not_empty, help="Comma-separated model names (default: a ~10 minute set; "
                                "--list-models shows all).")
@click.option("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)), show_default=True)
@click.option("--tasks", default=",".join(DEFAULT_TASKS), show_default=True)
@click.option("--seconds", type=FiniteFloatRange(0.5, 3600), default=20.0, show_default=True,
              help="Measured time per run (after 3 warm-up steps).")
@click.option("--device", default="cuda:0", show_default=True)
@click.option("--gpu-type", help="Catalog name of the GPU (default: from the device name).")
@click.option("--cache-dir", type=click.Path(file_okay=False), callback=not_empty,
              help="Where exported ONNX graphs are kept (default: next to --out).")
@click.option("--resume", is_flag=True, help="Continue --out: skip runs already in it.")
@click.option("--list-models", is_flag=True, help="List the models calibrate can build here.")
@one_line_errors("horus-admin calibrate")
def calibrate(out, url, models, batch_sizes, tasks, seconds, device, gpu_type, cache_dir, resume,
              list_models):
    """Run real PyTorch models (random weights, synthetic data) on a GPU, measure utilization
    and memory via NVML, and append one import-format row per (model, batch size, task).
    Needs torch and nvidia-ml-py (the [calibrate] and [probe] extras) and a CUDA GPU."""
    bs = _csv_list(batch_sizes, "--batch-sizes", int)
    if any(not 1 <= b <= MAX_BATCH_SIZE for b in bs):
        raise HorusError(f"--batch-sizes: must be integers from 1 to {MAX_BATCH_SIZE:,}")
    ts = _csv_list(tasks, "--tasks")
    if bad := [t for t in ts if t not in TASKS]:
        raise HorusError(f"--tasks: unknown {', '.join(bad)} (choose from {', '.join(TASKS)})")
    if list_models:
        import_torch()  # the models are torch code: the same one-line error without it
        for name, spec in model_specs().items():
            click.echo(f"{name:22} {spec.family:20} {spec.needs or 'torch'}")
        return
    if not out:
        raise HorusError("--out CSV is required (where the rows go)")
    # every option and dependency first, the GPU next (nothing is opened or created before
    # it): "no CUDA GPU" then means the options are right and only the node is wrong
    check_paths(out, cache_dir, resume)
    check_device(device)
    import_torch()
    available = list(model_specs())
    names = _csv_list(models, "--models") if models else default_models(available)
    if unknown := [m for m in names if m not in available]:
        raise HorusError(f"--models: unknown or not buildable here: {', '.join(unknown)} "
                         f"(available: {', '.join(available)}; resnet50 etc. need torchvision, "
                         "bert_base/gpt2 need transformers)")
    if gpu_type:
        try:
            default_catalog().get(gpu_type)
        except HorusError as e:
            raise HorusError(f"--gpu-type: {e}") from None
    if importlib.util.find_spec("pynvml") is None:
        raise HorusError("calibrate samples the GPU through NVML: "
                         "pip install nvidia-ml-py (the [probe] extra)")
    require_torch_gpu(device)
    runner = TorchRunner(device, gpu_type)
    ledger = Ledger(url) if url else None
    runs = plan(names, bs, ts)
    tty = sys.stderr.isatty()
    click.echo(f"calibrate: {len(runs)} runs on {runner.gpu_name} ({runner.gpu_type}), "
               f"{seconds:g} s each -> {out}", err=True)
    res = run_calibration(
        runner, runs, out, sampler_factory=lambda: BackgroundSampler(NvmlSampler([runner.nvml_id])),
        seconds=seconds, cache_dir=cache_dir, resume=resume, ledger=ledger, progress=tty,
        log=(lambda m: None) if tty else (lambda m: click.echo(m, err=True)))
    click.echo(f"calibrate: {len(res.done)} runs written, {len(res.skipped)} already done, "
               f"{len(res.failed)} failed -> {out}")
    for r, why in res.failed:
        click.echo(f"  {r.model} b{r.batch_size} {r.task}: {why}", err=True)
    if res.done and not ledger:
        click.echo(f"next: horus-admin import {out} && horus-admin retrain")
    if res.failed and not res.done:
        raise HorusError(f"every run failed ({len(res.failed)}); nothing was measured")


def register(main_group: click.Group) -> None:
    """Add calibrate to horus-admin."""
    main_group.add_command(calibrate)
