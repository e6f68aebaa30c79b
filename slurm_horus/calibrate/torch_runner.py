"""The real runner: PyTorch on one CUDA GPU. torch is imported when a TorchRunner is made
(the ``[calibrate]`` extra: ``pip install torch``); without torch or a GPU, one HorusError says so.

Training is forward + cross-entropy + backward + an Adam step in fp32, inference a forward pass
under no_grad; after WARMUP_STEPS the sampler runs while the model steps for the given seconds.
"""

from __future__ import annotations

import gc
import re
import os
import time
from pathlib import Path

from slurm_horus.calibrate.models import example_input, export_spec, model_specs
from slurm_horus.calibrate.plan import Measurement, OutOfMemory, Run, Sampler
from slurm_horus.errors import HorusError
from slurm_horus.predict.gpus import default_catalog, normalize

WARMUP_STEPS = 3


def import_torch():
    """torch, or HorusError (exit 2) saying how to install it."""
    try:
        import torch
    except ImportError:
        raise HorusError("calibrate needs PyTorch with CUDA: pip install torch "
                         "(the [calibrate] extra)") from None
    return torch


def check_device(device: str) -> None:
    """HorusError unless ``device`` names a CUDA device (checked with the other options)."""
    if not re.fullmatch(r"cuda(:[0-9]{1,4})?", device):
        raise HorusError(f"--device {device}: calibrate measures GPUs, use cuda or cuda:N")


def require_torch_gpu(device: str):
    """-> (torch, torch.device); HorusError (exit 2) without torch or without a CUDA GPU."""
    torch = import_torch()
    check_device(device)
    if not torch.cuda.is_available():
        raise HorusError(f"no CUDA GPU visible to PyTorch {torch.__version__} "
                         f"(CUDA build: {torch.version.cuda or 'none'}); "
                         "run calibrate on a GPU node")
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise HorusError(f"--device {device}: only {torch.cuda.device_count()} GPU(s) visible")
    return torch, torch.device("cuda", index)


def nvml_id(torch, index: int) -> str:
    """The NVML id of torch's GPU `index`: its UUID, else the CUDA_VISIBLE_DEVICES entry."""
    try:
        u = str(torch.cuda.get_device_properties(index).uuid)
        if u:
            return u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"
    except Exception:
        pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def gpu_type_of(name: str, override: str | None = None, mem_mib: int | None = None) -> str:
    """The catalog name of a device name like 'NVIDIA H100 80GB HBM3'; ``override`` (--gpu-type)
    may rename it within what the device is, never file its measurements under another GPU:
    the type must be of the architecture the name says and, given the device's ``mem_mib``,
    hold its memory within 10 % (a name the catalog half knows, 'A100-SXM-64GB', is checked
    by its memory too)."""
    cat = default_catalog()
    found = _catalog_entry(name)
    want = cat.get(override) if override else found
    if want is None:
        raise HorusError(f"GPU {name!r} is not in the GPU catalog; pass --gpu-type NAME "
                         f"(known: {', '.join(cat.names())})")
    other_arch = found is not None and found.arch != want.arch
    other_mem = bool(mem_mib) and abs(want.mem_mib - mem_mib) > 0.1 * want.mem_mib
    if other_arch or other_mem:
        seen = f"{found.arch}, " if other_arch else ""
        raise HorusError(f"{'--gpu-type ' + override if override else 'GPU type'}: this device, "
                         f"{name!r} ({seen}{mem_mib or found.mem_mib} MiB), is not {want.name} "
                         f"({want.arch}, {want.mem_mib} MiB)"
                         f"{'' if override else '; pass --gpu-type NAME of what it is'} (a GPU "
                         f"the catalog lacks: add it, $HORUS_GPU_CATALOG)")
    return want.name


def _catalog_entry(name: str):
    """The catalog's GPU for a device name: the name itself, else the longest leading run of
    its words the catalog knows ('h100-80gb-hbm3' -> 'h100'); None if none."""
    cat = default_catalog()
    if g := cat.find(name):
        return g
    words = normalize(name).split("-")
    for n in range(len(words), 0, -1):
        if g := cat.find("-".join(words[:n])):
            return g
    return None


def _out_of_memory(message: str) -> bool:
    """A RuntimeError that is an allocation failure by another name (cuBLAS, cuDNN)."""
    return any(k in message for k in ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                                      "CUDNN_STATUS_ALLOC_FAILED"))


def _release(torch) -> None:
    gc.collect()
    torch.cuda.empty_cache()


class TorchRunner:
    """The real Runner: builds each model on one CUDA GPU and steps it while a sampler watches."""

    def __init__(self, device: str = "cuda:0", gpu_type: str | None = None, seed: int = 0):
        self.torch, self.device = require_torch_gpu(device)
        self.gpu_name = self.torch.cuda.get_device_name(self.device.index)
        self.nvml_id = nvml_id(self.torch, self.device.index)
        if self.nvml_id.startswith("MIG-") or " MIG " in f" {self.gpu_name} ":
            raise HorusError(f"{self.gpu_name}: a MIG instance; NVML gives no utilization per "
                             "instance, and a slice is not its whole GPU's type: calibrate on a "
                             "whole GPU")
        mem_mib = self.torch.cuda.get_device_properties(self.device.index).total_memory >> 20
        self.gpu_type = gpu_type_of(self.gpu_name, gpu_type, mem_mib)
        self.specs = model_specs()
        self.seed = seed

    def measure(self, run: Run, sampler: Sampler, seconds: float) -> Measurement:
        t = self.torch
        spec = self.specs[run.model]
        dev = self.device
        t.manual_seed(self.seed)
        _release(t)  # what an earlier failed run's exception kept alive is gone by now
        model = opt = x = step = None
        oom = None
        try:
            model = spec.build().to(dev)
            x = example_input(spec, run.batch_size, dev)
            step, opt = _step(t, model, x, run.task == "train")
            for _ in range(WARMUP_STEPS):
                step()
            t.cuda.synchronize(dev)
            sampler.start()
            # reset after warm-up: the steady state includes Adam's state and the cached blocks
            t.cuda.reset_peak_memory_stats(dev)
            start = time.perf_counter()
            steps = 0
            try:
                while True:
                    step()
                    steps += 1
                    if steps % 4 == 0 or seconds <= 0:
                        t.cuda.synchronize(dev)
                        if time.perf_counter() - start >= seconds:
                            break
                t.cuda.synchronize(dev)
            finally:
                summary = sampler.stop()
            elapsed = time.perf_counter() - start
            alloc = t.cuda.max_memory_allocated(dev) / 2**20
            reserved = t.cuda.max_memory_reserved(dev) / 2**20
        except t.cuda.OutOfMemoryError as e:
            oom = str(e).splitlines()[0] if str(e) else "CUDA out of memory"
        except RuntimeError as e:
            if not _out_of_memory(str(e)):
                raise
            oom = str(e).splitlines()[0]
        finally:
            model = opt = x = step = None
        # out of the except clause: its traceback held the frames that hold the model and its
        # activations, and the cache emptied inside it kept them (the next row's peak was the
        # whole GPU)
        _release(t)
        if oom is not None:
            raise OutOfMemory(oom)
        return Measurement(util_mean=summary.get("util_mean"), util_max=summary.get("util_max"),
                           mem_peak_mib=summary.get("mem_peak_mib"), torch_max_alloc_mib=alloc,
                           torch_max_reserved_mib=reserved, steps=steps, seconds=elapsed,
                           samples=int(summary.get("samples") or 0),
                           util_source=summary.get("util_source", "process"))

    def export(self, model: str, cache_dir: Path, training: bool) -> Path:
        return export_spec(self.specs[model], cache_dir, training)


def _step(t, model, x, train: bool):
    """-> (one training or inference step as a function, the optimizer it steps or None).
    Training: forward, cross-entropy on random targets (a squared mean for outputs without a
    class axis), backward, an Adam step in fp32; inference: a forward pass under no_grad."""
    if not train:
        model.eval()

        def infer():
            with t.no_grad():
                model(x)
        return infer, None
    model.train()
    opt = t.optim.Adam(model.parameters(), lr=1e-4)

    def train_step():
        out = model(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        if out.dim() >= 2 and out.shape[-1] > 1:
            target = t.randint(0, out.shape[-1], out.shape[:-1], device=x.device)
            loss = t.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(),
                                                 target.reshape(-1))
        else:
            loss = out.float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return train_step, opt
