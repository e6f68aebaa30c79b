"""Stage 3a: the cold-start estimator, physics only, no training data needed.

Peak memory is what nvidia-smi shows for a PyTorch process: CUDA context and libraries, plus the
caching allocator's reserve, which holds weights, gradients, optimizer state, the activations the
backward pass keeps, and transient buffers. Utilization is the fraction of a step in which a
kernel runs: per-op roofline time on the GPU, set against the host's per-kernel launch cost and
the input pipeline, which dominate small models. docs/cold-start.md explains each term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FeatureReport
from slurm_horus.predict.gpus import GPU
from slurm_horus.rounding import shown

TASKS = ("train", "infer")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
PRECISIONS = ("fp32", "fp16", "bf16", "amp")
MIB = 2**20
# Resident threads per SM by compute capability (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"); the driver reserves stack for each of them.
MAX_THREADS_PER_SM = {"3.5": 2048, "3.7": 2048, "5.0": 2048, "5.2": 2048, "6.0": 2048,
                      "6.1": 2048, "7.0": 2048, "7.2": 2048, "7.5": 1024, "8.0": 2048,
                      "8.6": 1536, "8.7": 2048, "8.9": 1536, "9.0": 2048, "10.0": 2048,
                      "12.0": 1536}
STACK_BYTES_PER_THREAD = 1024  # cudaLimitStackSize default
MAX_CPUS_PER_GPU = 1 << 20  # beyond any node; a count past it is a typo or a forgery
# the largest batch size (graph.load.MAX_DIM: no dimension is bound past it, hsubmit takes no
# more); a Workload past it had reached the history as 10**400, whose log scale raised
MAX_BATCH_SIZE = 2**31 - 1
# the report values the cold start reads: each a finite number >= 0 (a stored report is a
# ledger row; NaN, infinity or a negative size had given NaN or negative memory)
READ_VALUES = ("params", "param_bytes", "quantized_params", "quantized_param_bytes",
               "saved_activation_bytes", "max_activation_bytes", "peak_live_bytes", "input_bytes")
OPTIONAL_VALUES = ("param_bytes", "quantized_params", "quantized_param_bytes")  # 0 where absent


@dataclass(frozen=True)
class Workload:
    """How the job runs the model: what the graph alone cannot say."""

    batch_size: int = 1
    task: str = "train"
    optimizer: str = "adam"
    precision: str = "fp32"
    # CPUs per GPU (what feeds each GPU's input pipeline): the job's CPUs over its GPUs, as
    # Slurm allocated them (training rows) or as the job asks for them (hsubmit); None: unknown
    cpus_per_gpu: float | None = None

    def __post_init__(self):
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise HorusError(f"batch size must be an integer from 1 to {MAX_BATCH_SIZE}, "
                             f"got {str(self.batch_size)[:40]}")
        for value, allowed, what in ((self.task, TASKS, "task"),
                                     (self.optimizer, OPTIMIZERS, "optimizer"),
                                     (self.precision, PRECISIONS, "precision")):
            if value not in allowed:
                raise HorusError(f"unknown {what} '{value}'; choose one of {', '.join(allowed)}")
        if self.cpus_per_gpu is not None and (isinstance(self.cpus_per_gpu, bool) or not (
                isinstance(self.cpus_per_gpu, (int, float)) and 0 < self.cpus_per_gpu <= MAX_CPUS_PER_GPU)):
            raise HorusError(f"CPUs per GPU must be a positive number (at most {MAX_CPUS_PER_GPU}), "
                             f"got {self.cpus_per_gpu!r}")


@dataclass(frozen=True)
class Prediction:
    """What one job will use on one GPU type."""

    gpu: str
    util_pct: float
    mem_mib: float
    mem_mib_p90: float
    predictor: str
    confidence: str = "cold-start"
    breakdown: dict = field(default_factory=dict)
    # calibrated on the site's held-out jobs (predict.Calibration); None where not calibrated
    mem_mib_p95: float | None = None
    mem_mib_p99: float | None = None
    util_pct_p90: float | None = None

    def to_dict(self) -> dict:
        # as the hint writes them and the hook judges them (slurm_horus.rounding)
        out = {"gpu": self.gpu, "util_pct": shown(self.util_pct, 1),
               "mem_mib": int(shown(self.mem_mib, 0)), "mem_mib_p90": int(shown(self.mem_mib_p90, 0)),
               "predictor": self.predictor, "confidence": self.confidence,
               "breakdown": self.breakdown}
        for name in ("mem_mib_p95", "mem_mib_p99"):
            if getattr(self, name) is not None:
                out[name] = int(shown(getattr(self, name), 0))
        if self.util_pct_p90 is not None:
            out["util_pct_p90"] = shown(self.util_pct_p90, 1)
        return out


@dataclass(frozen=True)
class ColdStartParams:
    """The estimator's constants; each is a physical quantity, documented in docs/cold-start.md."""

    # Memory constants: fitted on the clean rows of GPUMemNet's timm runs (benchmarks/
    # bench_coldstart.py --fit), each within a physical range; docs/cold-start.md says which.
    context_mib: float = 1535.0       # CUDA context, cuBLAS/cuDNN handles and kernels, less the
    #                                   per-SM stack reservation `fixed_overhead_mib` adds
    reserve_factor: float = 1.022     # caching allocator: rounding, segments, fragmentation
    activation_factor: float = 0.95   # graph's saved tensors -> what autograd really keeps
    workspace_factor: float = 2.37    # conv/GEMM workspace and backward transients, x largest tensor
    p90_factor: float = 1.15          # 90th percentile of measured/predicted (same fit)
    p90_extra_mib: float = 0.0
    # Utilization constants: each bounded to a physically plausible range and then fitted on the
    # training part of the GPUMemNet MLP runs (A100, PyTorch eager; docs/cold-start.md).
    launch_us: float = 15.0           # host cost of one eager kernel (dispatch, autograd)
    kernel_min_us: float = 8.0        # shortest kernel as the GPU sees it, launch latency included
    compute_efficiency: float = 0.64  # fraction of peak FLOP/s large kernels reach
    memory_efficiency: float = 0.9    # fraction of peak bandwidth streaming kernels reach
    step_overhead_us: float = 570.0   # per step: data loader, loss.item() sync, zero_grad
    input_gbs: float = 2.0            # host->device input copy incl. collation (GB/s)


class ColdStartEstimator:
    """Predicts utilization and peak memory from features, GPU type and workload alone."""

    name = "cold-start"

    def __init__(self, params: ColdStartParams | None = None):
        self.params = params or ColdStartParams()

    def predict(self, report: FeatureReport, gpu: GPU, workload: Workload) -> Prediction:
        values = _read_values(report)  # checked once, for both halves
        mem, mem_parts = self._memory(values, gpu, workload)
        util, util_parts = self._utilization(report, values, gpu, workload)
        if not (math.isfinite(mem) and mem > 0 and math.isfinite(util) and 0 <= util <= 100):
            # a graph or GPU figure past what the arithmetic holds (a catalog's 5e-324 TFLOPS
            # had given a NaN utilization, which no hint can carry)
            raise HorusError(f"cold start for {gpu.name}: no finite prediction (utilization "
                             f"{util:.3g} %, memory {mem:.3g} MiB): the graph's or the GPU "
                             "type's figures are out of range")
        p = self.params
        return Prediction(gpu=gpu.name, util_pct=util, mem_mib=mem,
                          mem_mib_p90=mem * p.p90_factor + p.p90_extra_mib,
                          predictor=self.name, confidence="cold-start",
                          breakdown={**mem_parts, **util_parts})

    # --- memory -------------------------------------------------------------------------------

    def fixed_overhead_mib(self, gpu: GPU) -> float:
        """What a CUDA process holds before its first tensor, on this GPU type.

        The driver reserves each thread's local memory (stack, 1 KiB by default,
        cudaLimitStackSize) for every thread the GPU can keep resident: SMs x max threads per SM
        (CUDA C Programming Guide, compute capabilities table): 216 MiB on an A100, 123 MiB on an
        RTX 3090. The rest (context, loaded kernels, cuBLAS/cuDNN handles) is `context_mib`.
        """
        threads = MAX_THREADS_PER_SM.get(gpu.compute_capability, 2048)
        return self.params.context_mib + gpu.sm_count * threads * STACK_BYTES_PER_THREAD / MIB

    def memory_mib(self, report: FeatureReport, gpu: GPU, w: Workload) -> tuple[float, dict]:
        return self._memory(_read_values(report), gpu, w)

    def _memory(self, v: dict[str, float], gpu: GPU, w: Workload) -> tuple[float, dict]:
        """memory_mib from the report's values (_read_values)."""
        p = self.params
        trainable, stored = _split_params(v)
        act_scale = _activation_scale(w.precision)
        # a quantized model's weights (integer, FP8...) stay as stored, whatever the job's precision
        weights = trainable * _weight_bytes(w.precision) + stored
        if w.task == "train":
            grads = trainable * (2 if w.precision in ("fp16", "bf16") else 4)
            optimizer = trainable * _optimizer_bytes(w.optimizer, w.precision)
            activations = v["saved_activation_bytes"] * act_scale * p.activation_factor
            transient = p.workspace_factor * 2 * v["max_activation_bytes"] * act_scale
            # Peak is either the end of the forward pass (all saved activations alive, gradients
            # not yet allocated) or the optimizer step (gradients plus its temporaries).
            forward_peak = weights + optimizer + activations + transient
            step_peak = weights + optimizer + grads + _optimizer_temp(w.optimizer, trainable)
            backward_peak = weights + optimizer + grads + 0.5 * activations + transient
            allocated = max(forward_peak, step_peak, backward_peak)
            parts = {"weights_mib": weights / MIB, "grads_mib": grads / MIB,
                     "optimizer_mib": optimizer / MIB, "activations_mib": activations / MIB,
                     "transient_mib": transient / MIB}
        else:
            live = v["peak_live_bytes"] * act_scale
            transient = p.workspace_factor * v["max_activation_bytes"] * act_scale
            allocated = weights + live + transient
            parts = {"weights_mib": weights / MIB, "activations_mib": live / MIB,
                     "transient_mib": transient / MIB}
        fixed = self.fixed_overhead_mib(gpu)
        total = fixed + allocated * p.reserve_factor / MIB
        parts["context_mib"] = fixed
        return total, {k: round(x, 1) for k, x in parts.items()}

    # --- utilization --------------------------------------------------------------------------

    def utilization_pct(self, report: FeatureReport, gpu: GPU, w: Workload) -> tuple[float, dict]:
        return self._utilization(report, _read_values(report), gpu, w)

    def _utilization(self, report: FeatureReport, values: dict[str, float], gpu: GPU,
                     w: Workload) -> tuple[float, dict]:
        """utilization_pct from the report's nodes and values (_read_values)."""
        p = self.params
        matmul_peak = gpu.peak_flops("fp32" if w.precision == "fp32" else _tensor_precision(w, gpu))
        conv_peak = gpu.peak_flops("tf32" if w.precision == "fp32" else _tensor_precision(w, gpu))
        other_peak = gpu.peak_flops("fp32")
        bandwidth = gpu.mem_bw_bytes_per_s * p.memory_efficiency
        byte_scale = _activation_scale(w.precision)
        gpu_s = 0.0
        kernels = 0
        train = w.task == "train"
        for node in report.nodes:
            if not node.kernels:
                continue
            peak = (conv_peak if node.category == "conv" else
                    matmul_peak if node.category in ("matmul", "attention", "rnn") else other_peak)
            compute = node.flops / (peak * p.compute_efficiency)
            memory = (node.read_bytes + node.write_bytes) * byte_scale / bandwidth
            fwd = max(compute, memory, node.kernels * p.kernel_min_us * 1e-6)
            heavy = node.category in ("conv", "matmul", "attention", "rnn")
            gpu_s += fwd * (3.0 if train and heavy else 2.0 if train else 1.0)
            kernels += node.kernels * (3 if train and heavy else 2 if train else 1)
        if train:
            opt_kernels, opt_s = _optimizer_time(w.optimizer, _split_params(values)[0], bandwidth, p)
            kernels += opt_kernels
            gpu_s += opt_s
        host_s = kernels * p.launch_us * 1e-6
        input_s = values["input_bytes"] * byte_scale / (p.input_gbs * 1e9)
        step_s = max(gpu_s, host_s) + p.step_overhead_us * 1e-6 + input_s
        util = 100.0 * gpu_s / step_s if step_s > 0 else 0.0
        return min(util, 99.0), {"gpu_ms_per_step": round(gpu_s * 1e3, 3),
                                 "host_ms_per_step": round(host_s * 1e3, 3),
                                 "kernels_per_step": kernels}


def _tensor_precision(w: Workload, gpu: GPU) -> str:
    if w.precision == "bf16" and not gpu.has_bf16:
        raise HorusError(f"GPU type '{gpu.name}' does not support bf16")
    return "fp16" if w.precision in ("amp", "fp16") else "bf16"


def _activation_scale(precision: str) -> float:
    """Activation bytes relative to fp32: autocast keeps some ops (softmax, norms) in fp32."""
    return {"fp32": 1.0, "amp": 0.6, "fp16": 0.5, "bf16": 0.5}[precision]


def _read_values(report: FeatureReport) -> dict[str, float]:
    """The report values the cold start reads (READ_VALUES; OPTIONAL_VALUES 0 where absent),
    each a finite float >= 0 (the quantized ones finite); HorusError naming the first that is
    not."""
    v = report.values
    out = {}
    for name in READ_VALUES:
        x = v.get(name, 0) if name in OPTIONAL_VALUES else v[name]
        try:
            # (a quantized count out of range is clamped by _split_params, as it always was)
            ok = not isinstance(x, bool) and math.isfinite(float(x)) \
                and (float(x) >= 0 or name.startswith("quantized_"))
        except (TypeError, ValueError, OverflowError):  # an int past a float's range
            ok = False
        if not ok:
            raise HorusError(f"feature {name} = {str(x)[:40]}: not a finite number >= 0")
        out[name] = float(x)
    return out


def _split_params(v: dict) -> tuple[float, float]:
    """(the trainable parameters, the quantized ones' stored bytes) of values["params"]: a
    quantized model's weights (FeatureReport.quantized_params: integer, FP8, FP6, FP4) keep
    their stored size and take no gradient nor optimizer state (PyTorch refuses requires_grad
    on an integer tensor, and no optimizer steps an FP8 one).
    Bounded by params and param_bytes: a stored report is a ledger row an admin's import wrote
    (``v``: _read_values of the report; the benchmarks' stand-ins for a report hold values
    alone)."""
    params = v["params"]
    quantized = min(max(v.get("quantized_params", 0), 0), params)
    stored = min(max(v.get("quantized_param_bytes", 0), 0), v.get("param_bytes", 0))
    return params - quantized, stored if quantized else 0


def _weight_bytes(precision: str) -> float:
    """Weights per parameter: amp keeps fp32 masters plus autocast's cached half copies (2
    bytes a parameter had counted a third of them); quantized weights are neither."""
    return {"fp32": 4, "amp": 6, "fp16": 2, "bf16": 2}[precision]


def _optimizer_bytes(optimizer: str, precision: str) -> float:
    states = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}[optimizer]
    return states * (2 if precision in ("fp16", "bf16") else 4)


def _optimizer_temp(optimizer: str, params: float) -> float:
    """The foreach Adam step materialises sqrt(v) for every parameter at once."""
    return params * 4 if optimizer in ("adam", "adamw") else 0.0


def _optimizer_time(optimizer: str, params: float, bandwidth: float, p: ColdStartParams):
    """Kernels and seconds of one optimizer step (multi-tensor, memory bound)."""
    passes = {"sgd": 3, "momentum": 5, "adam": 12, "adamw": 13}[optimizer]
    kernels = {"sgd": 2, "momentum": 4, "adam": 12, "adamw": 13}[optimizer]
    seconds = max(passes * params * 4 / bandwidth, kernels * p.kernel_min_us * 1e-6)
    return kernels, seconds

