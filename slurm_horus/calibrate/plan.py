"""What calibrate runs and what it needs from a GPU: runs, their ids, measurements, and the two
protocols (Sampler, Runner) that keep the orchestration testable without torch or a GPU."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DEFAULT_BATCH_SIZES = (8, 32, 128)
DEFAULT_TASKS = ("train", "infer")


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


class Sampler(Protocol):
    """What calibrate needs from a GPU sampler."""

    def start(self) -> None: ...

    def stop(self) -> dict:
        """-> {"util_mean": float|None, "util_max": float|None, "mem_peak_mib": float|None,
        "samples": int, "util_source": str}"""


class Runner(Protocol):
    gpu_type: str  # a name the GPU catalog knows

    def measure(self, run: Run, sampler: Sampler, seconds: float) -> Measurement: ...

    def export(self, model: str, cache_dir: Path, training: bool) -> Path:
        """The model's weightless ONNX file (symbolic batch) in cache_dir, exported in training
        mode for training runs (their graph features then match their measured memory)."""


def run_id(model: str, batch_size: int, task: str, gpu_type: str) -> str:
    """The stable id of a run on a GPU type: what --resume and the ledger import key on."""
    key = f"{model}|{batch_size}|{task}|{gpu_type}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def plan(models: list[str], batch_sizes: list[int], tasks: list[str]) -> list[Run]:
    """Every (model, task, batch size) once, smallest batch first so an out-of-memory skips the
    rest."""
    return [Run(m, b, t) for m in dict.fromkeys(models) for t in dict.fromkeys(tasks)
            for b in sorted(set(batch_sizes))]
