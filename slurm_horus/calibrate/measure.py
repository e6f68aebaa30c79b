"""horus-admin calibrate: measure real models on this site's GPUs and write training rows.

For each (model, batch size, task) the PyTorch model (random weights, synthetic data; training
is Adam in fp32) runs for a fixed time on one GPU while a sampler records SM utilization and
memory through NVML; ``torch.cuda.max_memory_allocated`` is recorded too. The same model is
exported to ONNX (legacy exporter, opset 17, weights stripped as tests/data/make_zoo.py does)
into a cache folder, the project's graph stage extracts its features, and one row per run is
appended to a CSV in the ``horus-admin import`` format (IMPORT_COLUMNS, plus calibration
columns the import ignores) and, optionally, imported into the ledger.

Layers, so the orchestration is testable without torch or a GPU:

- ``Sampler`` (start() / stop() -> summary dict): ``NvmlSampler`` reuses probe.NvmlSampler.
- ``Runner`` (gpu_type, measure(run, sampler, seconds), export(model, cache_dir)):
  ``TorchRunner`` is the real one; torch is imported lazily (``pip install slurm-horus[calibrate]``).
- ``calibrate(...)``: plan, resume, rows, CSV, ledger, progress.

Rows carry ``calib_id`` = hash of (model, batch, task, gpu type); ``--resume`` skips ids already
in the CSV, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from slurm_horus.errors import HorusError
from slurm_horus.ledger.retrain import IMPORT_COLUMNS

# The import format's columns first (unchanged), then calibration's own, which
# `horus-admin import` ignores.
EXTRA_COLUMNS = ("calib_id", "seconds", "steps", "samples", "torch_max_alloc_mib",
                 "torch_max_reserved_mib", "util_source", "torch_version", "created")
CSV_COLUMNS = (*IMPORT_COLUMNS, *EXTRA_COLUMNS)
DEFAULT_BATCH_SIZES = (8, 32, 128)
DEFAULT_TASKS = ("train", "infer")
OPSET = 17
DYNAMO_OPSET = 18
WARMUP_STEPS = 3


# --------------------------------------------------------------------------- interfaces

class Sampler(Protocol):
    """What calibrate needs from a GPU sampler."""

    def start(self) -> None: ...

    def stop(self) -> dict:
        """-> {"util_mean": float|None, "util_max": float|None, "mem_peak_mib": float|None,
        "samples": int, "util_source": str}"""


@dataclass(frozen=True)
class Run:
    model: str
    batch_size: int
    task: str


@dataclass
class Measurement:
    util_mean: float | None
    util_max: float | None
    mem_peak_mib: float | None  # NVML: what the process held (context + allocator cache)
    torch_max_alloc_mib: float
    torch_max_reserved_mib: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    samples: int = 0
    util_source: str = "process"


class OutOfMemory(Exception):
    """The run did not fit on the GPU."""


class Runner(Protocol):
    gpu_type: str  # a name the GPU catalog knows

    def measure(self, run: Run, sampler: Sampler, seconds: float) -> Measurement: ...

    def export(self, model: str, cache_dir: Path) -> Path:
        """The model's weightless ONNX file (symbolic batch) in cache_dir."""


# --------------------------------------------------------------------------- model specs

@dataclass
class ModelSpec:
    name: str
    family: str
    build: Callable  # () -> torch.nn.Module
    kind: str  # "image" | "tokens" | "vector"
    size: int = 0  # image side, sequence length or vector width
    vocab: int = 0
    inputs: tuple = ("input",)
    outputs: tuple = ("output",)
    dims: dict = field(default_factory=dict)  # dims other than batch, for feature extraction
    needs: str = ""  # "torchvision" | "transformers" | "" (plain torch)


def _plain_models() -> dict[str, ModelSpec]:
    """Models written with torch.nn alone, so calibrate works with torch only."""
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self, d_in=1024, hidden=4096, layers=4, classes=1000):
            super().__init__()
            mods, d = [], d_in
            for _ in range(layers):
                mods += [nn.Linear(d, hidden), nn.ReLU()]
                d = hidden
            self.body = nn.Sequential(*mods, nn.Linear(d, classes))

        def forward(self, x):
            return self.body(x)

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (self.down(x) if self.down is not None else x))

    class ResNetMini(nn.Module):
        """ResNet-18-shaped (BasicBlock x [2,2,2,2], 64..512 channels), 224x224 input."""

        def __init__(self, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for i, c in enumerate((64, 128, 256, 512)):
                blocks += [Basic(cin, c, 1 if i == 0 else 2), Basic(c, c, 1)]
                cin = c
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    class SmallCNN(nn.Module):
        """The CIFAR-10 net of the PyTorch tutorial (as tests/data/make_zoo.py)."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                                          nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
            self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(),
                                            nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

        def forward(self, x):
            return self.classifier(self.features(x))

    class RNNLM(nn.Module):
        """Embedding, stacked LSTM/GRU, linear decoder (as make_zoo.py's lstm_lm / gru_lm)."""

        def __init__(self, cell, vocab, emb, hidden, layers):
            super().__init__()
            self.embedding = nn.Embedding(vocab, emb)
            self.rnn = cell(emb, hidden, layers, batch_first=True)
            self.decoder = nn.Linear(hidden, vocab)

        def forward(self, input_ids):
            out, _ = self.rnn(self.embedding(input_ids))
            return self.decoder(out)

    class Encoder(nn.Module):
        """BERT-base-shaped encoder from torch.nn.TransformerEncoder (12 x 768, 12 heads)."""

        def __init__(self, vocab=30522, d=768, heads=12, layers=12, ff=3072, max_len=512):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(max_len, d)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, activation="gelu",
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)

        def forward(self, input_ids):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            return self.norm(self.encoder(self.tok(input_ids) + self.pos(pos)[None]))

    seq = {"seq": 128}
    rnn = {"seq": 35}
    return {
        "small_cnn": ModelSpec("small_cnn", "cnn", SmallCNN, "image", 32),
        "resnet_mini": ModelSpec("resnet_mini", "cnn", ResNetMini, "image", 224),
        "mlp": ModelSpec("mlp", "mlp", MLP, "vector", 1024),
        "lstm_lm": ModelSpec("lstm_lm", "rnn", lambda: RNNLM(nn.LSTM, 10000, 650, 650, 2),
                             "tokens", 35, 10000, ("input_ids",), ("logits",), rnn),
        "gru_lm": ModelSpec("gru_lm", "rnn", lambda: RNNLM(nn.GRU, 10000, 256, 512, 2),
                            "tokens", 35, 10000, ("input_ids",), ("logits",), rnn),
        "transformer_encoder": ModelSpec("transformer_encoder", "transformer-encoder", Encoder,
                                         "tokens", 128, 30522, ("input_ids",),
                                         ("last_hidden_state",), seq),
    }


def _library_models() -> dict[str, ModelSpec]:
    """torchvision / transformers models of the test zoo (built when those are importable)."""
    def tv(name, **kw):
        def build():
            import torchvision

            return torchvision.models.get_model(name, weights=None, **kw)
        return build

    def hf(model_cls, config_cls, config=None):
        def build():
            import transformers
            from torch import nn

            class ByName(nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, input_ids):
                    out = self.m(input_ids=input_ids)
                    return out["logits"] if "logits" in out else out["last_hidden_state"]

            cfg = getattr(transformers, config_cls)(**(config or {}))
            return ByName(getattr(transformers, model_cls)(cfg))
        return build

    seq = {"seq": 128}
    out = {}
    for name, size, family in (("resnet50", 224, "cnn"), ("vgg16", 224, "cnn"),
                               ("mobilenet_v2", 224, "cnn"), ("efficientnet_b0", 224, "cnn"),
                               ("vit_b_16", 224, "vit")):
        out[name] = ModelSpec(name, family, tv(name), "image", size, needs="torchvision")
    out["bert_base"] = ModelSpec("bert_base", "transformer-encoder", hf("BertModel", "BertConfig"),
                                 "tokens", 128, 30522, ("input_ids",), ("last_hidden_state",), seq,
                                 needs="transformers")
    out["gpt2"] = ModelSpec("gpt2", "transformer-decoder",
                            hf("GPT2LMHeadModel", "GPT2Config", {"use_cache": False}), "tokens",
                            128, 50257, ("input_ids",), ("logits",), seq, needs="transformers")
    return out


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def model_specs() -> dict[str, ModelSpec]:
    """Every model calibrate can build here (plain torch ones always; library ones if installed)."""
    specs = _plain_models()
    for name, spec in _library_models().items():
        if _importable(spec.needs):
            specs[name] = spec
    return specs


def default_models(available: list[str]) -> list[str]:
    """About 10 minutes on one GPU at the defaults (see docs/calibrate.md)."""
    want = ["mlp", "resnet_mini", "lstm_lm", "transformer_encoder", "resnet50", "bert_base"]
    picked = [m for m in want if m in available]
    if "resnet50" not in picked and "resnet_mini" in picked:
        picked.append("small_cnn")
    return picked


# --------------------------------------------------------------------------- the real sampler

class NvmlSampler:
    """Samples this process's SM utilization and memory on one GPU in a background thread.

    Per-process figures come from probe.NvmlSampler; where NVML cannot see this process (a
    container with its own PID namespace) it falls back to the whole device's utilization and
    used memory, and says so in ``util_source``.
    """

    def __init__(self, gpu_id: str, interval: float = 0.2, pid: int | None = None):
        from slurm_horus.ledger.probe import NvmlSampler as ProbeSampler, Summary

        self._probe = ProbeSampler([gpu_id])
        self._summary_cls = Summary
        self.interval, self.pid = interval, pid or os.getpid()
        self._thread = None
        self._stop = threading.Event()

    def _device(self):
        n, h = self._probe.nvml, self._probe.handles[0]
        return float(n.nvmlDeviceGetUtilizationRates(h).gpu), n.nvmlDeviceGetMemoryInfo(h).used / 2**20

    def _loop(self):
        while not self._stop.is_set():
            try:
                util, mem = self._probe.sample({self.pid})
                if not mem:  # this PID is invisible to NVML: use the device's figures
                    util, mem = self._device()
                    self.source = "device"
                self.summary.add(util, mem)
            except Exception:
                pass
            self._stop.wait(self.interval)

    def start(self) -> None:
        self.summary = self._summary_cls()
        self.source = "process"
        self._probe.last_ts = {k: int(time.time() * 1e6) for k in self._probe.last_ts}
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join()
        return {**self.summary.result(), "util_source": self.source}

    def close(self) -> None:
        self._probe.close()


# --------------------------------------------------------------------------- the real runner

def require_torch_gpu(device: str):
    """-> (torch, torch.device); HorusError (exit 2) without torch or without a CUDA GPU."""
    try:
        import torch
    except ImportError:
        raise HorusError("calibrate needs PyTorch: pip install 'slurm-horus[calibrate]' "
                         "(torch with CUDA)") from None
    if not device.startswith("cuda"):
        raise HorusError(f"--device {device}: calibrate measures GPUs, use cuda or cuda:N")
    if not torch.cuda.is_available():
        raise HorusError(f"no CUDA GPU visible to PyTorch {torch.__version__} "
                         f"(CUDA build: {torch.version.cuda or 'none'}); run calibrate on a GPU node")
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
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def gpu_type_of(name: str, override: str | None = None) -> str:
    """The catalog name of a device name like 'NVIDIA H100 80GB HBM3'."""
    from slurm_horus.predict.gpus import default_catalog, normalize

    cat = default_catalog()
    if override:
        return cat.get(override).name
    if g := cat.find(name):
        return g.name
    key = normalize(name)
    words = key.split("-")
    # the longest leading run of words the catalog knows: 'h100-80gb-hbm3' -> 'h100'
    for n in range(len(words), 0, -1):
        if g := cat.find("-".join(words[:n])):
            return g.name
    raise HorusError(f"GPU {name!r} is not in the GPU catalog; pass --gpu-type NAME "
                     f"(known: {', '.join(cat.names())})")


class TorchRunner:
    def __init__(self, device: str = "cuda:0", gpu_type: str | None = None, seed: int = 0):
        self.torch, self.device = require_torch_gpu(device)
        self.gpu_name = self.torch.cuda.get_device_name(self.device.index)
        self.gpu_type = gpu_type_of(self.gpu_name, gpu_type)
        self.nvml_id = nvml_id(self.torch, self.device.index)
        self.specs = model_specs()
        self.seed = seed

    # -- data
    def _inputs(self, spec: ModelSpec, batch: int, device):
        t = self.torch
        if spec.kind == "image":
            return t.randn(batch, 3, spec.size, spec.size, device=device)
        if spec.kind == "vector":
            return t.randn(batch, spec.size, device=device)
        return t.randint(0, spec.vocab, (batch, spec.size), device=device)

    def measure(self, run: Run, sampler: Sampler, seconds: float) -> Measurement:
        t = self.torch
        spec = self.specs[run.model]
        dev = self.device
        t.manual_seed(self.seed)
        model = opt = x = None
        try:
            model = spec.build().to(dev)
            x = self._inputs(spec, run.batch_size, dev)
            train = run.task == "train"
            if train:
                model.train()
                opt = t.optim.Adam(model.parameters(), lr=1e-4)

                def step():
                    out = model(x)
                    out = out[0] if isinstance(out, (tuple, list)) else out
                    if out.dim() >= 2 and out.shape[-1] > 1:
                        target = t.randint(0, out.shape[-1], out.shape[:-1], device=dev)
                        loss = t.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(),
                                                             target.reshape(-1))
                    else:
                        loss = out.float().pow(2).mean()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            else:
                model.eval()

                def step():
                    with t.no_grad():
                        model(x)
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
            raise OutOfMemory(str(e).splitlines()[0] if str(e) else "CUDA out of memory") from None
        finally:
            model = opt = x = None  # drop the references before emptying the cache
            import gc

            gc.collect()
            t.cuda.empty_cache()
        return Measurement(util_mean=summary.get("util_mean"), util_max=summary.get("util_max"),
                           mem_peak_mib=summary.get("mem_peak_mib"), torch_max_alloc_mib=alloc,
                           torch_max_reserved_mib=reserved, steps=steps, seconds=elapsed,
                           samples=int(summary.get("samples") or 0),
                           util_source=summary.get("util_source", "process"))

    def export(self, model: str, cache_dir: Path) -> Path:
        return export_onnx(self.specs[model], cache_dir, self.torch)


def export_onnx(spec: ModelSpec, cache_dir: Path, torch=None) -> Path:
    """Export `spec` on the CPU to cache_dir/NAME.onnx, weights stripped (as make_zoo.py does):
    the legacy exporter, opset 17, symbolic batch (and seq), every tensor >= 1 KiB moved to an
    external file that is then deleted, so the graph keeps each initializer's name, dtype, dims."""
    import onnx

    if torch is None:
        import torch
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = cache_dir / f"{spec.name}.onnx"
    if out.exists():
        return out
    torch.manual_seed(0)
    model = spec.build().eval()
    with torch.no_grad():  # in eval mode the exporter merges equal initializers: decorrelate
        for p in [*model.parameters(), *model.buffers()]:
            if p.is_floating_point():
                p.add_(torch.rand_like(p), alpha=1e-3)
    if spec.kind == "image":
        x = torch.randn(1, 3, spec.size, spec.size)
        in_axes = {0: "batch"}
    elif spec.kind == "vector":
        x = torch.randn(1, spec.size)
        in_axes = {0: "batch"}
    else:
        x = torch.randint(0, spec.vocab, (1, spec.size))  # full length: dynamo may fix it
        in_axes = {0: "batch", 1: "seq"}
    axes = {n: in_axes for n in spec.inputs} | {n: {0: "batch"} for n in spec.outputs}
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / out.name
        kw = dict(input_names=list(spec.inputs), output_names=list(spec.outputs),
                  dynamic_axes=axes)
        try:
            torch.onnx.export(model, (x,), str(raw), dynamo=False, opset_version=OPSET, **kw)
        except Exception:  # as make_zoo.py: a legacy failure falls back to dynamo (opset 18)
            torch.onnx.export(model, (x,), str(raw), dynamo=True, opset_version=DYNAMO_OPSET, **kw)
        proto = onnx.load(str(raw))
        part = Path(tmp) / (out.name + ".part")
        data = part.with_name(part.name + ".data")
        onnx.save_model(proto, str(part), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data.name, size_threshold=1024)
        data.unlink(missing_ok=True)
        os.replace(part, out)  # atomic: an interrupted export leaves no half file in the cache
    return out


# --------------------------------------------------------------------------- orchestration

def run_id(model: str, batch_size: int, task: str, gpu_type: str) -> str:
    key = f"{model}|{batch_size}|{task}|{gpu_type}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def plan(models: list[str], batch_sizes: list[int], tasks: list[str]) -> list[Run]:
    return [Run(m, b, t) for m in models for t in tasks for b in sorted(batch_sizes)]


def done_ids(path: Path) -> set[str]:
    """calib_id of every complete row already in the CSV."""
    if not path.exists():
        return set()
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return set()
        if "calib_id" not in reader.fieldnames:
            raise HorusError(f"{path}: not a calibrate CSV (no calib_id column); "
                             "choose another --out")
        return {r["calib_id"] for r in reader if r.get("calib_id") and r.get("mem_mib")}


class CsvAppender:
    """Appends rows in CSV_COLUMNS; writes the header for a new file; each row is flushed and
    fsync'ed, so an interrupt loses at most the run in progress."""

    def __init__(self, path: Path):
        self.path = Path(path)
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), None)
            if header != list(CSV_COLUMNS):
                raise HorusError(f"{self.path}: exists with other columns; use another --out "
                                 "or move it away")
            self._fix_tail()
        self.f = open(self.path, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=CSV_COLUMNS)
        if new:
            self.w.writeheader()
            self.f.flush()

    def _fix_tail(self):
        """A row cut by a crash lacks its newline: end the file with one."""
        with open(self.path, "rb+") as f:
            f.seek(0, 2)
            if f.tell() and (f.seek(-1, 2), f.read(1))[1] != b"\n":
                f.write(b"\n")

    def append(self, row: dict) -> None:
        self.w.writerow(row)
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self):
        self.f.close()


def _fmt(x, nd=2):
    return "" if x is None else f"{float(x):.{nd}f}"


def make_row(run: Run, gpu_type: str, m: Measurement, onnx_path: Path, family: str,
             dims: dict | None = None, torch_version: str = "") -> dict:
    """One import-format row: features and the cold-start estimate from the graph stage."""
    from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
    from slurm_horus.graph.features import extract_features
    from slurm_horus.predict.gpus import get_gpu

    report = extract_features(onnx_path, batch_size=run.batch_size, dims=dims or None)
    w = Workload(batch_size=run.batch_size, task=run.task, optimizer="adam", precision="fp32")
    cold = ColdStartEstimator().predict(report, get_gpu(gpu_type), w)
    mem = m.mem_peak_mib if m.mem_peak_mib else None
    if not mem:  # NVML saw nothing: the allocator's reserve is the closest lower bound
        mem = m.torch_max_reserved_mib or m.torch_max_alloc_mib
    util = min(max(m.util_mean or 0.0, 0.0), 100.0)
    return {
        "model": str(onnx_path), "features": json.dumps(report.values, sort_keys=True),
        "gpu_type": gpu_type, "batch_size": run.batch_size, "task": run.task,
        "optimizer": "adam" if run.task == "train" else "", "precision": "fp32",
        "cpus_per_task": "", "util_pct": _fmt(util), "mem_mib": _fmt(mem, 1),
        "util_max_pct": _fmt(m.util_max), "user": "calibrate", "model_family": family,
        "cold_util_pct": _fmt(cold.util_pct), "cold_mem_mib": _fmt(cold.mem_mib, 1),
        "cold_gpu_ms": _fmt(cold.breakdown.get("gpu_ms_per_step", 0.0), 4),
        "cold_host_ms": _fmt(cold.breakdown.get("host_ms_per_step", 0.0), 4),
        "calib_id": run_id(run.model, run.batch_size, run.task, gpu_type),
        "seconds": _fmt(m.seconds), "steps": m.steps, "samples": m.samples,
        "torch_max_alloc_mib": _fmt(m.torch_max_alloc_mib, 1),
        "torch_max_reserved_mib": _fmt(m.torch_max_reserved_mib, 1),
        "util_source": m.util_source, "torch_version": torch_version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def import_row(ledger, row: dict) -> None:
    """Record one row in the ledger exactly as `horus-admin import` of the CSV would (same
    stable id, so importing the CSV later changes nothing)."""
    from slurm_horus.ledger.retrain import import_csv

    fd, tmp = tempfile.mkstemp(suffix=".csv", prefix="horus-calibrate-")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            w.writerow(row)
        import_csv(ledger, tmp)
    finally:
        os.unlink(tmp)


@dataclass
class Result:
    done: list = field(default_factory=list)  # calib_ids written now
    skipped: list = field(default_factory=list)  # already in the CSV (--resume)
    failed: list = field(default_factory=list)  # (Run, reason)


def calibrate(runner: Runner, runs: list[Run], out: str | os.PathLike, *,
              sampler_factory: Callable[[], Sampler], seconds: float = 20.0,
              cache_dir: str | os.PathLike | None = None, resume: bool = False, ledger=None,
              specs: dict | None = None, progress: bool = False,
              log: Callable[[str], None] = lambda m: None) -> Result:
    """Measure every run not yet done, append a row each to `out` (and the ledger)."""
    out = Path(out)
    cache = Path(cache_dir) if cache_dir else out.parent / "horus-calibrate-onnx"
    specs = specs if specs is not None else getattr(runner, "specs", {})
    gpu = runner.gpu_type
    done = done_ids(out) if resume else set()
    if not resume and out.exists() and out.stat().st_size > 0:
        raise HorusError(f"{out} exists: pass --resume to continue it, or choose another --out")
    res = Result()
    todo = []
    for r in runs:
        rid = run_id(r.model, r.batch_size, r.task, gpu)
        (res.skipped if rid in done else todo).append(rid if rid in done else r)
    writer = CsvAppender(out)
    oom_at: dict = {}  # (model, task) -> smallest batch that ran out of memory
    torch_version = getattr(getattr(runner, "torch", None), "__version__", "")
    bar = _Bar(progress, len(todo))
    try:
        with bar:
            sampler = sampler_factory()
            try:
                for r in todo:
                    label = f"{r.model} b{r.batch_size} {r.task}"
                    bar.describe(label)
                    limit = oom_at.get((r.model, r.task))
                    if limit is not None and r.batch_size >= limit:
                        res.failed.append((r, f"skipped: batch {limit} ran out of memory"))
                        bar.advance()
                        continue
                    try:
                        m = runner.measure(r, sampler, seconds)
                    except OutOfMemory as e:
                        oom_at[(r.model, r.task)] = r.batch_size
                        res.failed.append((r, f"out of memory ({e})"[:200]))
                        log(f"{label}: out of memory")
                        bar.advance()
                        continue
                    if m.util_mean is None:
                        res.failed.append((r, "the sampler got no utilization samples"))
                        log(f"{label}: no utilization samples (NVML); not written")
                        bar.advance()
                        continue
                    spec = specs.get(r.model)
                    try:
                        onnx_path = runner.export(r.model, cache)
                        row = make_row(r, gpu, m, onnx_path,
                                       family=getattr(spec, "family", "") or "",
                                       dims=getattr(spec, "dims", None),
                                       torch_version=torch_version)
                    except Exception as e:  # export / graph stage: this model only
                        msg = (str(e).strip().splitlines() or [""])[0][:200]
                        res.failed.append((r, f"export/features: {type(e).__name__}: {msg}"))
                        log(f"{label}: export/features failed ({type(e).__name__})")
                        bar.advance()
                        continue
                    writer.append(row)
                    if ledger is not None:
                        import_row(ledger, row)
                    res.done.append(row["calib_id"])
                    log(f"{label}: util {row['util_pct']}%  mem {row['mem_mib']} MiB  "
                        f"(torch alloc {row['torch_max_alloc_mib']} MiB, {m.steps} steps)")
                    bar.advance()
            finally:
                close = getattr(sampler, "close", None)
                if close:
                    close()
    finally:
        writer.close()
    return res


class _Bar:
    """A rich progress bar on a terminal; silent otherwise."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.p = enabled, total, None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self.p = Progress(TextColumn("{task.description:<36}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                              TimeRemainingColumn())
            self.p.__enter__()
            self.task = self.p.add_task("calibrate", total=self.total)
        return self

    def describe(self, what: str):
        if self.p:
            self.p.update(self.task, description=f"calibrate: {what}")

    def advance(self):
        if self.p:
            self.p.update(self.task, advance=1)

    def __exit__(self, *exc):
        if self.p:
            self.p.__exit__(*exc)
