"""Stage 3b: the learned predictor, which corrects the cold-start estimate with a site's measurements.

Gradient-boosted trees (scikit-learn's HistGradientBoostingRegressor): the relation between graph
features and utilization is non-linear with thresholds (launch-bound below a kernel size,
compute-bound above), trees need no feature scaling, train on 100k rows in seconds, and cannot
extrapolate to wild values: a tree's output is bounded by what it saw. Memory is learned as a
log-ratio to the cold-start estimate, so the physics carries what the data lacks.

A trained model is saved as plain JSON (the trees' arrays, packed as base64 numbers: trees.py)
and evaluated with numpy alone: no pickle is ever loaded, and predicting does not import
scikit-learn. A model file serves every job of a site, so loading one checks it whole: its
trees (trees.py), its ranges, and sane answers on a small built-in probe set; anything else is
refused, never served. Where it answers is decided in one place, LearnedModel.answer: rows
like its training data (familiar) with outputs in bounds; elsewhere the cold start serves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION, FeatureReport
from slurm_horus.predict.coldstart import (OPTIMIZERS, PRECISIONS, ColdStartEstimator,
                                           Prediction, Workload)
from slurm_horus.predict.gpus import GPU, get_gpu
from slurm_horus.predict.history import weighted_median
from slurm_horus.predict.trees import MAX_TREES, TREE_KEYS, TreeEnsemble

MIN_TRAIN_ROWS = 20  # fewer rows cannot fill the trees' leaves (min_samples_leaf 10)

FORMAT = "slurm-horus-learned"
FORMAT_VERSION = 2  # 2: packed trees; 1 (lists of numbers) still loads
READABLE_VERSIONS = (1, 2)
# The largest model retrain writes (--max-iter 2000: 2,000 trees of 61 nodes per target) is
# 9.3 MiB packed, 12.3 MiB as format 1's lists; a 63 MiB file had cost every hsubmit seconds
MAX_MODEL_BYTES = 16 * 2**20
# inputs a model file may name that mean something else now: such a file is refused (the next
# predictor serves), never fed the new quantity under the old name
RENAMED_INPUTS = {
    # trained on a job's allocated CPUs in all, served its --cpus-per-task
    "cpus_per_task": "cpus_per_task (CPUs, trained and served as two different counts), an input "
                     "now cpus_per_gpu (CPUs per GPU)",
}
# Features whose training range defines "like what the model has seen": the graph's size and
# the GPU's (a model trained on T4 runs alone had answered A100 jobs 20 points off).
RANGE_FEATURES = ("log_flops", "log_params", "log_saved_activation_bytes", "log_batch_size",
                  "gpu_log_bw", "gpu_sm")
RANGE_MARGIN = 1.0  # beyond the training range still trusted: x e for logs, one SM
# Columns whose exact values the model must have seen: the GPU type (its figures; trees split
# between T4 and A100 figures had answered V100, A10 and L4 jobs they never saw) and the
# workload (a model trained on inference alone could not even see task_train, and answered
# training jobs with inference memory).  Models stored before this have no such record.
SEEN_COLUMNS = {
    "gpu": ("gpu_log_fp32", "gpu_log_tensor", "gpu_log_bw", "gpu_log_mem", "gpu_sm"),
    "workload": ("task_train", *(f"opt_{o}" for o in OPTIMIZERS), *(f"prec_{p}" for p in PRECISIONS)),
}
MAX_SEEN = 1000  # distinct GPU or workload rows a model file may list
SEEN_BLOCK = 1 << 16  # (input row, seen row) pairs compared at once
# Objects and lists a model file may hold, counted before it is parsed (registry.py): two
# ensembles of MAX_TREES trees as lists (format 1: an object and a list per array), the seen
# rows, and some for ranges, metrics and meta; 16 MiB of empty lists had cost every hsubmit
# 2 s and 390 MB
MAX_MODEL_CONTAINERS = 2 * MAX_TREES * (1 + len(TREE_KEYS)) + 2 * MAX_SEEN + 1000
# Bounds of a sane model. Its outputs are logs (memory: of the ratio to the cold-start estimate;
# utilization: log1p of a percentage), so no baseline, leaf or sum of them goes near +-MAX_LOG;
# the learned memory stays within MAX_MEM_RATIO of the physics either way; utilization within
# 0..100 %, give or take UTIL_SLACK points above and UTIL_LOG_SLACK below (in log1p units: trees
# fitted to log1p(util) >= 0 undershoot 0 a little, a model whose answers sit far below is broken).
MAX_LOG = 30.0
MAX_MEM_RATIO = 10.0
UTIL_SLACK = 2.0
UTIL_LOG_SLACK = 0.5
# The probe set every model must answer sanely: (batch, GFLOP per step, M params, MiB kept for
# the backward pass, kernels, main op family), a tiny CNN, ResNet-50 and BERT-base alike.
PROBE_JOBS = ((1, 0.05, 0.1, 2, 30, "conv"), (32, 262, 25.6, 2600, 470, "conv"),
              (32, 700, 110, 6000, 900, "matmul"))
PROBE_GPUS = ("a100", "t4")
NO_UTIL_MODEL = ("no utilization model (a cross-validation fold's, trained where no job had its "
                 "GPU alone): never stored")


@lru_cache(maxsize=1)
def _input_names() -> tuple[str, ...]:
    names = [f"log_{n}" if _is_size(n) else n for n in FEATURE_NAMES]
    names += ["gpu_log_fp32", "gpu_log_tensor", "gpu_log_bw", "gpu_log_mem", "gpu_sm",
              "task_train", "cpus_per_gpu",
              *(f"opt_{o}" for o in OPTIMIZERS), *(f"prec_{p}" for p in PRECISIONS),
              "cold_log_mem", "cold_log1p_util", "cold_log_gpu_ms", "cold_log_host_ms"]
    return tuple(names)


def input_names() -> list[str]:
    """The model's input columns, in order (computed once: every load and check asks)."""
    return list(_input_names())


def _is_size(name: str) -> bool:
    return not (name.startswith("frac_") or name in ("arithmetic_intensity",))


_SIZES = tuple((n, _is_size(n)) for n in FEATURE_NAMES)  # retrain builds 100k rows: once


def input_row(report_values: dict, gpu: GPU, w: Workload, cold: Prediction) -> list[float]:
    """One model input row: features, GPU, workload and the cold-start estimate (all numeric)."""
    row = [math.log1p(max(float(report_values[n]), 0.0)) if size else float(report_values[n])
           for n, size in _SIZES]
    tensor = gpu.fp16_tflops
    row += [math.log(gpu.fp32_tflops), math.log(tensor), math.log(gpu.mem_bw_gbs),
            math.log(gpu.mem_mib), float(gpu.sm_count), float(w.task == "train"),
            float(w.cpus_per_gpu or 0),  # 0: unknown
            *(float(w.optimizer == o) for o in OPTIMIZERS),
            *(float(w.precision == p) for p in PRECISIONS),
            math.log(cold.mem_mib), math.log1p(cold.util_pct),
            math.log1p(cold.breakdown.get("gpu_ms_per_step", 0.0)),
            math.log1p(cold.breakdown.get("host_ms_per_step", 0.0))]
    return row


@dataclass
class LearnedModel:
    """A trained predictor: two ensembles, training ranges, error quantiles and metrics.

    ``util`` is None only in a cross-validation fold's model whose training rows held no run
    that had its GPU alone (fit's ``need_util``): it answers utilization with the cold start's,
    memory with its own, and is never stored (check() and to_json() refuse it)."""

    mem: TreeEnsemble    # predicts log(actual_mem / cold_mem)
    util: TreeEnsemble | None  # predicts log1p(actual_util_pct)
    ranges: dict[str, tuple[float, float]]
    mem_log_q90: float   # 90th percentile of held-out log(actual / predicted) memory
    metrics: dict
    meta: dict
    seen: dict[str, list[list[float]]] | None = None  # SEEN_COLUMNS' distinct training rows

    def to_json(self) -> str:
        if self.util is None:
            raise HorusError(NO_UTIL_MODEL)
        return json.dumps({
            "format": FORMAT, "format_version": FORMAT_VERSION, "feature_version": FEATURE_VERSION,
            "inputs": input_names(), "mem": self.mem.to_dict(), "util": self.util.to_dict(),
            "ranges": self.ranges, "mem_log_q90": self.mem_log_q90, "metrics": self.metrics,
            "meta": self.meta, **({"seen": self.seen} if self.seen is not None else {})})

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "model") -> "LearnedModel":
        """Parse a model file, refusing anything that is not this exact JSON format."""
        if isinstance(text, bytes):
            if len(text) > MAX_MODEL_BYTES:
                raise HorusError(f"{source}: model file too large")
            if not text.lstrip()[:1] == b"{":
                raise HorusError(f"{source}: not a slurm-horus model file (JSON expected; "
                                 "pickles are never loaded)")
            text = text.decode("utf-8", errors="replace")
        try:
            d = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: absurdly nested arrays
            raise HorusError(f"{source}: corrupt model file (invalid JSON)") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise HorusError(f"{source}: not a slurm-horus model file")
        if d.get("format_version") not in READABLE_VERSIONS:
            raise HorusError(f"{source}: model format version {d.get('format_version')} is not "
                             f"supported (expected {FORMAT_VERSION})")
        inputs = d.get("inputs")
        old = [n for n in (inputs if isinstance(inputs, list) else ()) if isinstance(n, str)
               and n in RENAMED_INPUTS]
        if old:
            raise HorusError(f"{source}: trained on {RENAMED_INPUTS[old[0]]}; retrain it "
                             "(horus-admin retrain)")
        if d.get("feature_version") != FEATURE_VERSION or inputs != input_names():
            raise HorusError(f"{source}: trained on another feature version; retrain it")
        try:
            n_inputs = len(input_names())
            model = cls(mem=TreeEnsemble.from_dict(d["mem"], n_inputs, MAX_LOG),
                        util=TreeEnsemble.from_dict(d["util"], n_inputs, MAX_LOG),
                        ranges={k: (float(a), float(b)) for k, (a, b) in d["ranges"].items()},
                        mem_log_q90=float(d["mem_log_q90"]), metrics=dict(d.get("metrics", {})),
                        meta=dict(d.get("meta", {})),
                        seen=None if d.get("seen") is None else
                        {k: [[float(x) for x in row] for row in d["seen"][k]] for k in SEEN_COLUMNS})
            model.check()
        except HorusError as e:
            raise HorusError(f"{source}: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as e:
            raise HorusError(f"{source}: corrupt model file ({type(e).__name__}: {e})") from None
        return model

    def check(self) -> None:
        """Refuse a model whose ranges or p90 margin are not sane, or whose answers on the probe
        set are out of bounds (see PROBE_JOBS)."""
        if self.util is None:
            raise HorusError(NO_UTIL_MODEL)
        names = input_names()
        for name, (lo, hi) in self.ranges.items():
            if name not in names or not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise HorusError(f"bad training range for '{name}': {lo}..{hi}")
        for kind, cols in (SEEN_COLUMNS.items() if self.seen is not None else ()):
            rows = self.seen[kind]
            if not 1 <= len(rows) <= MAX_SEEN or any(
                    len(r) != len(cols) or not all(math.isfinite(x) for x in r) for r in rows):
                raise HorusError(f"bad record of the {kind} rows it was trained on")
        if not abs(self.mem_log_q90) <= math.log(MAX_MEM_RATIO):
            raise HorusError(f"p90 memory margin {self.mem_log_q90!r} (log) is out of bounds")
        rows = np.asarray(probe_rows(), dtype=float)
        why = out_of_bounds(self.util.predict(rows), self.mem.predict(rows))
        if why:
            raise HorusError(f"predicts {why} on the built-in probe set")

    def familiar(self, X) -> np.ndarray:
        """Per row of X: whether its key features lie within (a margin of) the training data
        (NaN is not)."""
        X = np.asarray(X, float)
        ok = np.ones(len(X), bool)
        names = input_names()
        for name, (lo, hi) in self.ranges.items():
            x = X[:, names.index(name)]
            ok &= (x >= lo - RANGE_MARGIN) & (x <= hi + RANGE_MARGIN)
        for kind, cols in (SEEN_COLUMNS.items() if self.seen is not None else ()):
            got = X[:, [names.index(c) for c in cols]]
            seen = np.asarray(self.seen[kind], float)
            # blocks of rows x every seen row at once: one pass per seen row (a file may list
            # MAX_SEEN) had cost 100 ms an answer; a block bounds the N x rows array
            step = max(SEEN_BLOCK // len(seen), 1)
            for i in range(0, len(X), step):
                ok[i:i + step] &= np.isclose(got[i:i + step, None], seen, rtol=1e-9,
                                             atol=1e-12).all(axis=2).any(axis=1)
        return ok

    def answer(self, X, cold_mem, cold_util) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(memory MiB, utilization %, why) for input rows X whose cold-start figures are
        cold_mem / cold_util: the model's answer where the row is familiar and the outputs in
        bounds (why ""), else the cold start's (why says which gate refused). The one place
        that decides where the learned model serves: hsubmit, retrain and the history's
        offsets all go through it. A model without a utilization ensemble (a cross-validation
        fold's: ``util`` None) answers every row's utilization with the cold start's, and
        memory through the same gates (its bound on memory alone)."""
        X = np.asarray(X, float)
        mem = np.array(cold_mem, float)
        util = np.array(cold_util, float)
        why = np.full(len(X), "unlike the training data", dtype=object)
        rows = np.flatnonzero(self.familiar(X))
        if len(rows):
            mem_log = self.mem.predict(X[rows])
            util_log = None if self.util is None else self.util.predict(X[rows])
            ok = _in_bounds(util_log, mem_log)
            why[rows] = np.where(ok, "", "learned model out of bounds")
            rows = rows[ok]
            mem[rows] *= np.exp(mem_log[ok])
            if util_log is not None:
                util[rows] = np.clip(np.expm1(util_log[ok]), 0.0, 100.0)
        return mem, util, why


def _in_bounds(util_log, mem_log) -> np.ndarray:
    """Per output: utilization within 0..100 % (with slack) and memory within MAX_MEM_RATIO
    of the cold start (NaN is out); memory alone where ``util_log`` is None (no utilization
    model: the cold start's utilization is in bounds)."""
    with np.errstate(invalid="ignore"):
        ok = np.abs(mem_log) <= math.log(MAX_MEM_RATIO)
        if util_log is None:
            return ok
        return ok & (util_log >= -UTIL_LOG_SLACK) & (util_log <= math.log1p(100 + UTIL_SLACK))


def mem_in_bounds(mem_mib, cold_mem_mib) -> np.ndarray:
    """Per job: whether its measured memory lies within MAX_MEM_RATIO of the cold start, the
    most a learned answer may move it (NaN is not)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.asarray(mem_mib, float) / np.asarray(cold_mem_mib, float)
        return np.abs(np.log(ratio)) <= math.log(MAX_MEM_RATIO)


def out_of_bounds(util_log, mem_log) -> str | None:
    """What is insane in raw model outputs (arrays: log1p(utilization %), log(memory /
    cold-start)), or None."""
    util, mem = np.asarray(util_log, float), np.asarray(mem_log, float)
    bad = ~((util >= -UTIL_LOG_SLACK) & (util <= math.log1p(100 + UTIL_SLACK)))  # NaN is bad
    with np.errstate(over="ignore"):
        if bad.any():
            return f"utilization {np.expm1(util[bad][0]):.4g} %"
        bad = ~(np.abs(mem) <= math.log(MAX_MEM_RATIO))
        if bad.any():
            return f"memory {np.exp(mem[bad][0]):.3g} x the cold-start estimate"
    return None


def probe_rows() -> list[list[float]]:
    """Input rows of the probe set: PROBE_JOBS on PROBE_GPUS, trained and served."""
    cold = ColdStartEstimator()
    rows = []
    for batch, gflop, mparams, kept_mib, kernels, family in PROBE_JOBS:
        flops, params, kept = gflop * 1e9, mparams * 1e6, kept_mib * 2**20
        traffic = 3.5 * kept + 4 * params
        values = dict.fromkeys(FEATURE_NAMES, 0.0)
        values.update(batch_size=batch, flops=flops, params=params, param_bytes=4 * params,
                      activation_bytes=1.5 * kept, saved_activation_bytes=kept,
                      peak_live_bytes=kept / 4, max_activation_bytes=kept / 20,
                      input_bytes=batch * 602_112, read_bytes=2 * kept + 4 * params,
                      write_bytes=1.5 * kept, kernels=kernels, depth=kernels // 2,
                      n_nodes=kernels, arithmetic_intensity=flops / traffic,
                      flops_per_kernel=flops / kernels, **{f"frac_flops_{family}": 1.0,
                                                           f"n_{family}": kernels // 3})
        report = FeatureReport(model="probe", sha256="", values=values, nodes=[], by_op={},
                               unknown_ops=[], unknown_dims=[], bound_dims={})
        for gpu in map(get_gpu, PROBE_GPUS):
            for w in (Workload(batch_size=batch), Workload(batch_size=batch, task="infer")):
                rows.append(input_row(values, gpu, w, cold.predict(report, gpu, w)))
    return rows


class LearnedEstimator:
    """Cold-start estimate corrected by a learned model; falls back where the model is unsure."""

    def __init__(self, model: LearnedModel, version: str, cold: ColdStartEstimator | None = None):
        self.model = model
        self.version = version
        self.cold = cold or ColdStartEstimator()
        self.name = f"learned:{version}"

    def predict(self, report: FeatureReport, gpu: GPU, workload: Workload) -> Prediction:
        return self.predict_with_cold(report, gpu, workload)[0]

    def predict_with_cold(self, report: FeatureReport, gpu: GPU,
                          workload: Workload) -> tuple[Prediction, Prediction]:
        """The prediction and the cold-start one it corrects (history needs both)."""
        cold = self.cold.predict(report, gpu, workload)
        try:
            row = input_row(report.values, gpu, workload, cold)
        except (OverflowError, ValueError, TypeError):  # a feature past a float (10**400)
            row = [math.nan] * len(_input_names())    # is like no training row: the cold start
        (mem,), (util,), (why,) = self.model.answer([row], [cold.mem_mib], [cold.util_pct])
        if why:
            return Prediction(gpu=cold.gpu, util_pct=cold.util_pct, mem_mib=cold.mem_mib,
                              mem_mib_p90=cold.mem_mib_p90, predictor=self.cold.name,
                              confidence=f"low: {why}, cold-start used",
                              breakdown=cold.breakdown), cold
        mem, util = float(mem), float(util)
        return Prediction(gpu=cold.gpu, util_pct=util, mem_mib=mem,
                          mem_mib_p90=mem * math.exp(max(self.model.mem_log_q90, 0.0)),
                          predictor=self.name, confidence="learned",
                          breakdown=cold.breakdown), cold


def fit(rows: list[list[float]], mem_mib, util_pct, cold_mem_mib, seed: int = 0,
        max_iter: int = 300, need_util: bool = True) -> LearnedModel:
    """Train both ensembles on input rows (see input_row) and measured memory and utilization
    (NaN where not a measurement of the job's need: a run that shared its GPU; the utilization
    model learns from the others).  Where no row had its GPU alone: an error, unless
    ``need_util`` is False, when the model has no utilization ensemble (``util`` None: it
    answers with the cold start's utilization, and can be neither checked nor stored; for a
    cross-validation fold, whose other folds hold every such run)."""
    from sklearn.ensemble import HistGradientBoostingRegressor  # training only: not at import

    X = np.asarray(rows, dtype=float)
    mem = np.asarray(mem_mib, dtype=float)
    util = np.asarray(util_pct, dtype=float)
    cold = np.asarray(cold_mem_mib, dtype=float)
    if len(X) < MIN_TRAIN_ROWS:
        raise HorusError(f"need at least {MIN_TRAIN_ROWS} measured jobs to train, have {len(X)}")
    params = dict(max_iter=max_iter, learning_rate=0.05, max_leaf_nodes=31, min_samples_leaf=10,
                  l2_regularization=1.0, early_stopping=False, random_state=seed)
    # A column that is constant on these rows can never split (one bin, no gain), so the
    # trees are the same without it; histograms over fewer columns make the fit faster.
    varying = np.flatnonzero((X != X[0]).any(axis=0))  # NaN != NaN: such columns stay
    columns = varying if len(varying) else np.arange(1)
    Xv = X[:, columns]
    # memory is learned from jobs within MAX_MEM_RATIO of the cold start only: a dozen far
    # beyond it (JAX or TensorFlow preallocating 90 % of the GPU) pulled the probe set's
    # answers past check()'s bound, and no retrain could store a model
    inside = mem_in_bounds(mem, cold)
    if inside.sum() < MIN_TRAIN_ROWS:
        raise HorusError(f"need at least {MIN_TRAIN_ROWS} measured jobs within {MAX_MEM_RATIO:g}x "
                         f"of the cold-start memory to train, have {int(inside.sum())}")
    mem_est = HistGradientBoostingRegressor(**params).fit(Xv[inside], np.log(mem[inside] / cold[inside]))
    # where most jobs share their GPU few runs measured a need: the utilization model learns
    # from those there are (a handful give the trees one leaf, their mean), and the memory
    # model from every run (20 alone had been required: a sharing site could never retrain)
    alone = ~np.isnan(util)
    if not alone.any() and need_util:
        raise HorusError("no measured job had its GPU alone: its utilization is no measure of "
                         "the job's need, and there is none to train the utilization model on")
    util_est = (HistGradientBoostingRegressor(**params).fit(Xv[alone], np.log1p(util[alone]))
                if alone.any() else None)
    names = input_names()
    ranges = {n: (float(X[:, names.index(n)].min()), float(X[:, names.index(n)].max()))
              for n in RANGE_FEATURES}
    seen = {k: np.unique(X[:, [names.index(c) for c in cols]], axis=0).tolist()
            for k, cols in SEEN_COLUMNS.items()}
    model = LearnedModel(mem=TreeEnsemble.from_sklearn(mem_est, len(names), columns),
                         util=(None if util_est is None
                               else TreeEnsemble.from_sklearn(util_est, len(names), columns)),
                         ranges=ranges,
                         mem_log_q90=0.0, metrics={},
                         meta={"rows": int(len(X)), "seed": seed,
                               "mem_rows_left_out": int(len(X) - inside.sum())},
                         seen=seen)
    return model


def accuracy(pred_mem, mem, pred_util, util, weights=None) -> dict:
    """The figures reports quote: memory median |relative error|, utilization RMSLE and MAE;
    ``weights``: each row's weight in them (default: every job alike).  Utilization only over
    the rows where it is known (NaN: a run that shared its GPU); None (not measured) where
    none is (0 there read as a perfect score in retrain's figures, records and log)."""
    pred_mem, mem = np.asarray(pred_mem, float), np.asarray(mem, float)
    pred_util, util = np.asarray(pred_util, float), np.asarray(util, float)
    rel = np.abs(pred_mem - mem) / mem
    known = ~np.isnan(util)
    sq = (np.log1p(pred_util[known]) - np.log1p(util[known])) ** 2
    err = np.abs(pred_util[known] - util[known])
    if weights is None:
        return {"mem_mdape_pct": float(np.median(rel) * 100),
                "util_rmsle": float(np.sqrt(np.mean(sq))) if known.any() else None,
                "util_mae_pct": float(np.mean(err)) if known.any() else None, "rows": int(len(mem))}
    w = np.asarray(weights, float)
    wu = w[known]
    return {"mem_mdape_pct": weighted_median(rel.tolist(), w.tolist()) * 100,
            "util_rmsle": float(np.sqrt(np.average(sq, weights=wu))) if known.any() else None,
            "util_mae_pct": float(np.average(err, weights=wu)) if known.any() else None,
            "rows": int(len(mem))}


def holdout_split(n: int, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(held-out, training) row indices of a fixed random split: the one every 80/20 figure
    (the learned model's, the cold start's fitted utilization constants) is measured on."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = max(int(round(n * test_fraction)), 1)
    return order[:n_test], order[n_test:]


def train_holdout(rows, mem_mib, util_pct, cold_mem_mib, test_fraction: float = 0.2,
                  seed: int = 0, max_iter: int = 300) -> tuple[LearnedModel, list[int]]:
    """Fit on a fixed random split and measure on the held-out part.

    The held-out memory errors set the model's p90 margin, so packing safety is measured, not
    assumed. Returns the model and the held-out row indices.
    """
    test, train = holdout_split(len(rows), test_fraction, seed)
    X = np.asarray(rows, float)
    mem, util, cold = (np.asarray(a, float) for a in (mem_mib, util_pct, cold_mem_mib))
    model = fit(X[train], mem[train], util[train], cold[train], seed=seed, max_iter=max_iter)
    pred_mem = cold[test] * np.exp(model.mem.predict(X[test]))
    pred_util = np.clip(np.expm1(model.util.predict(X[test])), 0, 100)
    model.metrics = accuracy(pred_mem, mem[test], pred_util, util[test])
    model.mem_log_q90 = float(np.quantile(np.log(mem[test] / pred_mem), 0.9))
    model.meta.update({"train_rows": int(len(train)), "test_rows": int(len(test))})
    return model, test.tolist()
