"""Stage 3b: the learned predictor, which corrects the cold-start estimate with a site's measurements.

Gradient-boosted trees (scikit-learn's HistGradientBoostingRegressor): the relation between graph
features and utilization is non-linear with thresholds (launch-bound below a kernel size,
compute-bound above), trees need no feature scaling, train on 100k rows in seconds, and cannot
extrapolate to wild values: a tree's output is bounded by what it saw. Memory is learned as a
log-ratio to the cold-start estimate, so the physics carries what the data lacks.

A trained model is saved as plain JSON (the trees' arrays) and evaluated here with numpy alone:
no pickle is ever loaded, and predicting does not import scikit-learn.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .coldstart import OPTIMIZERS, PRECISIONS, ColdStartEstimator, Prediction, Workload
from .errors import HorusError
from .features import FEATURE_NAMES, FEATURE_VERSION, FeatureReport
from .gpus import GPU

FORMAT = "slurm-horus-learned"
FORMAT_VERSION = 1
MAX_MODEL_BYTES = 64 * 2**20
# Features whose training range defines "like what the model has seen".
RANGE_FEATURES = ("log_flops", "log_params", "log_saved_activation_bytes", "log_batch_size")
RANGE_MARGIN = 1.0  # natural-log units (x e) beyond the training range still trusted


def input_names() -> list[str]:
    names = [f"log_{n}" if _is_size(n) else n for n in FEATURE_NAMES]
    names += ["gpu_log_fp32", "gpu_log_tensor", "gpu_log_bw", "gpu_log_mem", "gpu_sm",
              "task_train", "cpus_per_task",
              *(f"opt_{o}" for o in OPTIMIZERS), *(f"prec_{p}" for p in PRECISIONS),
              "cold_log_mem", "cold_log1p_util", "cold_log_gpu_ms", "cold_log_host_ms"]
    return names


def _is_size(name: str) -> bool:
    return not (name.startswith("frac_") or name in ("arithmetic_intensity",))


def input_row(report_values: dict, gpu: GPU, w: Workload, cold: Prediction) -> list[float]:
    """One model input row: features, GPU, workload and the cold-start estimate (all numeric)."""
    row = [math.log1p(max(float(report_values[n]), 0.0)) if _is_size(n)
           else float(report_values[n]) for n in FEATURE_NAMES]
    tensor = gpu.fp16_tflops
    row += [math.log(gpu.fp32_tflops), math.log(tensor), math.log(gpu.mem_bw_gbs),
            math.log(gpu.mem_mib), float(gpu.sm_count), float(w.task == "train"),
            float(w.cpus_per_task or 0),  # 0: not requested
            *(float(w.optimizer == o) for o in OPTIMIZERS),
            *(float(w.precision == p) for p in PRECISIONS),
            math.log(cold.mem_mib), math.log1p(cold.util_pct),
            math.log1p(cold.breakdown.get("gpu_ms_per_step", 0.0)),
            math.log1p(cold.breakdown.get("host_ms_per_step", 0.0))]
    return row


@dataclass
class TreeEnsemble:
    """Additive regression trees as arrays; predict() walks them with numpy."""

    baseline: float
    trees: list[dict]

    @classmethod
    def from_sklearn(cls, est) -> "TreeEnsemble":
        """Copy a fitted HistGradientBoostingRegressor's trees (numeric splits only)."""
        trees = []
        for (predictor,) in est._predictors:
            nodes = predictor.nodes
            if nodes["is_categorical"].any():
                raise HorusError("categorical splits are not supported in the JSON format")
            trees.append({k: nodes[src].tolist() for k, src in (
                ("feature", "feature_idx"), ("threshold", "num_threshold"),
                ("missing_left", "missing_go_to_left"), ("left", "left"), ("right", "right"),
                ("leaf", "is_leaf"), ("value", "value"))})
        baseline = float(est._baseline_prediction.ravel()[0])
        return cls(baseline=baseline, trees=trees)

    @classmethod
    def from_dict(cls, d: dict) -> "TreeEnsemble":
        trees = d["trees"]
        keys = ("feature", "threshold", "missing_left", "left", "right", "leaf", "value")
        for t in trees:
            n = len(t["value"])
            if any(len(t[k]) != n for k in keys) or n == 0:
                raise HorusError("malformed tree in model file")
            if any(not 0 <= c < n for c in (*t["left"], *t["right"]) if c):
                raise HorusError("malformed tree in model file (child index out of range)")
        return cls(baseline=float(d["baseline"]), trees=trees)

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "trees": self.trees}

    def predict(self, X):
        import numpy as np

        X = np.asarray(X, dtype=float)
        out = np.full(len(X), self.baseline)
        rows = np.arange(len(X))
        for t in self.trees:
            feature, threshold = np.asarray(t["feature"]), np.asarray(t["threshold"], dtype=float)
            left, right = np.asarray(t["left"]), np.asarray(t["right"])
            leaf, miss = np.asarray(t["leaf"], dtype=bool), np.asarray(t["missing_left"], bool)
            idx = np.zeros(len(X), dtype=int)
            for _ in range(len(t["value"])):  # bounded: a path is never longer than the tree
                active = ~leaf[idx]
                if not active.any():
                    break
                x = X[rows, feature[idx]]
                go_left = np.where(np.isnan(x), miss[idx], x <= threshold[idx])
                idx = np.where(active, np.where(go_left, left[idx], right[idx]), idx)
            out += np.asarray(t["value"], dtype=float)[idx]
        return out


@dataclass
class LearnedModel:
    """A trained predictor: two ensembles, training ranges, error quantiles and metrics."""

    mem: TreeEnsemble    # predicts log(actual_mem / cold_mem)
    util: TreeEnsemble   # predicts log1p(actual_util_pct)
    ranges: dict[str, tuple[float, float]]
    mem_log_q90: float   # 90th percentile of held-out log(actual / predicted) memory
    metrics: dict
    meta: dict

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "format_version": FORMAT_VERSION, "feature_version": FEATURE_VERSION,
            "inputs": input_names(), "mem": self.mem.to_dict(), "util": self.util.to_dict(),
            "ranges": self.ranges, "mem_log_q90": self.mem_log_q90, "metrics": self.metrics,
            "meta": self.meta})

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
        except ValueError:
            raise HorusError(f"{source}: corrupt model file (invalid JSON)") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise HorusError(f"{source}: not a slurm-horus model file")
        if d.get("format_version") != FORMAT_VERSION:
            raise HorusError(f"{source}: model format version {d.get('format_version')} is not "
                             f"supported (expected {FORMAT_VERSION})")
        if d.get("feature_version") != FEATURE_VERSION or d.get("inputs") != input_names():
            raise HorusError(f"{source}: trained on another feature version; retrain it")
        try:
            return cls(mem=TreeEnsemble.from_dict(d["mem"]), util=TreeEnsemble.from_dict(d["util"]),
                       ranges={k: (float(a), float(b)) for k, (a, b) in d["ranges"].items()},
                       mem_log_q90=float(d["mem_log_q90"]), metrics=dict(d.get("metrics", {})),
                       meta=dict(d.get("meta", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise HorusError(f"{source}: corrupt model file ({type(e).__name__}: {e})") from None

    def familiar(self, row: list[float]) -> bool:
        """Whether a row's key features lie within (a margin of) the training data."""
        names = input_names()
        for name, (lo, hi) in self.ranges.items():
            x = row[names.index(name)]
            if not (lo - RANGE_MARGIN <= x <= hi + RANGE_MARGIN):
                return False
        return True


class LearnedEstimator:
    """Cold-start estimate corrected by a learned model; falls back where the model is unsure."""

    def __init__(self, model: LearnedModel, version: str, cold: ColdStartEstimator | None = None):
        self.model = model
        self.version = version
        self.cold = cold or ColdStartEstimator()
        self.name = f"learned:{version}"

    def predict(self, report: FeatureReport, gpu: GPU, workload: Workload) -> Prediction:
        cold = self.cold.predict(report, gpu, workload)
        row = input_row(report.values, gpu, workload, cold)
        if not self.model.familiar(row):
            return Prediction(gpu=cold.gpu, util_pct=cold.util_pct, mem_mib=cold.mem_mib,
                              mem_mib_p90=cold.mem_mib_p90, predictor=self.cold.name,
                              confidence="low: unlike the training data, cold-start used",
                              breakdown=cold.breakdown)
        mem = cold.mem_mib * math.exp(float(self.model.mem.predict([row])[0]))
        util = min(max(math.expm1(float(self.model.util.predict([row])[0])), 0.0), 100.0)
        return Prediction(gpu=cold.gpu, util_pct=util, mem_mib=mem,
                          mem_mib_p90=mem * math.exp(max(self.model.mem_log_q90, 0.0)),
                          predictor=self.name, confidence="learned", breakdown=cold.breakdown)


def fit(rows: list[list[float]], mem_mib, util_pct, cold_mem_mib, seed: int = 0,
        max_iter: int = 300) -> LearnedModel:
    """Train both ensembles on input rows (see input_row) and measured memory and utilization."""
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingRegressor

    X = np.asarray(rows, dtype=float)
    mem = np.asarray(mem_mib, dtype=float)
    util = np.asarray(util_pct, dtype=float)
    cold = np.asarray(cold_mem_mib, dtype=float)
    if len(X) < 20:
        raise HorusError(f"need at least 20 measured jobs to train, have {len(X)}")
    params = dict(max_iter=max_iter, learning_rate=0.05, max_leaf_nodes=31, min_samples_leaf=10,
                  l2_regularization=1.0, early_stopping=False, random_state=seed)
    mem_est = HistGradientBoostingRegressor(**params).fit(X, np.log(mem / cold))
    util_est = HistGradientBoostingRegressor(**params).fit(X, np.log1p(util))
    names = input_names()
    ranges = {n: (float(X[:, names.index(n)].min()), float(X[:, names.index(n)].max()))
              for n in RANGE_FEATURES}
    model = LearnedModel(mem=TreeEnsemble.from_sklearn(mem_est),
                         util=TreeEnsemble.from_sklearn(util_est), ranges=ranges,
                         mem_log_q90=0.0, metrics={}, meta={"rows": int(len(X)), "seed": seed})
    return model


def accuracy(pred_mem, mem, pred_util, util) -> dict:
    """The figures reports quote: memory median |relative error|, utilization RMSLE and MAE."""
    import numpy as np

    pred_mem, mem = np.asarray(pred_mem, float), np.asarray(mem, float)
    pred_util, util = np.asarray(pred_util, float), np.asarray(util, float)
    return {"mem_mdape_pct": float(np.median(np.abs(pred_mem - mem) / mem) * 100),
            "util_rmsle": float(np.sqrt(np.mean((np.log1p(pred_util) - np.log1p(util)) ** 2))),
            "util_mae_pct": float(np.mean(np.abs(pred_util - util))),
            "rows": int(len(mem))}


def train_holdout(rows, mem_mib, util_pct, cold_mem_mib, test_fraction: float = 0.2,
                  seed: int = 0, max_iter: int = 300) -> tuple[LearnedModel, list[int]]:
    """Fit on a fixed random split and measure on the held-out part.

    The held-out memory errors set the model's p90 margin, so packing safety is measured, not
    assumed. Returns the model and the held-out row indices.
    """
    import numpy as np

    n = len(rows)
    order = np.random.default_rng(seed).permutation(n)
    n_test = max(int(round(n * test_fraction)), 1)
    test, train = order[:n_test], order[n_test:]
    X = np.asarray(rows, float)
    mem, util, cold = (np.asarray(a, float) for a in (mem_mib, util_pct, cold_mem_mib))
    model = fit(X[train], mem[train], util[train], cold[train], seed=seed, max_iter=max_iter)
    pred_mem = cold[test] * np.exp(model.mem.predict(X[test]))
    pred_util = np.clip(np.expm1(model.util.predict(X[test])), 0, 100)
    model.metrics = accuracy(pred_mem, mem[test], pred_util, util[test])
    model.mem_log_q90 = float(np.quantile(np.log(mem[test] / pred_mem), 0.9))
    model.meta.update({"train_rows": int(len(train)), "test_rows": int(len(test))})
    return model, test.tolist()
