"""The model mix of generated traces: which real architectures the jobs run, their predicted
util/memory per GPU type, and the cold start's measured memory and utilization residuals.

Default: the shipped table (slurm_horus/data/sim_mix.json, made by benchmarks/make_sim_mix.py),
so no ONNX graph is read at run time; ``ModelMix(zoo_dir)`` predicts from a folder of graphs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import extract_features
from slurm_horus.graph.names import family_of
from slurm_horus.predict.coldstart import ColdStartEstimator, Workload
from slurm_horus.predict.gpus import get_gpu

__all__ = ["MIX", "SHIPPED_TYPES", "SHIPPED_MIX", "SITE_POOLED", "ModelMix", "runtime_factor"]

# The model mix: (zoo model, batch size, task, {trace: weight}).  Philly/Helios: research
# training jobs over all families; PAI: many small and inference jobs (its median util is 1.5 %);
# llm: transformer training, memory-heavy (a 16 GB T4 cannot hold the largest, two of them do not
# fit beside each other on a 40 GB A100).  Where GPUMemNet measured a model, the mix runs the graph
# of that measured run (bert_base_mlm, bert_large_mlm, xlnet_base_cls, xception_224), so its
# memory residuals are those of the very graph predicted.  benchmarks/make_sim_mix.py turns this list into the
# shipped table (slurm_horus/data/sim_mix.json): predictions per GPU type and measured residuals.
MIX: tuple[tuple[str, int, str, dict[str, float]], ...] = (
    ("small_cnn", 64, "train", {"philly": 2, "helios": 4, "pai": 6}),
    ("small_cnn", 32, "infer", {"philly": 0, "helios": 1, "pai": 8}),
    ("lstm_lm", 16, "train", {"philly": 2, "helios": 2, "pai": 2}),
    ("lstm_lm", 64, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("mobilenet_v2", 32, "train", {"philly": 2, "helios": 3, "pai": 2}),
    ("mobilenet_v2", 32, "infer", {"philly": 0, "helios": 1, "pai": 6}),
    ("efficientnet_b0", 16, "train", {"philly": 2, "helios": 2, "pai": 1}),
    ("efficientnet_b0", 16, "infer", {"philly": 0, "helios": 1, "pai": 3}),
    ("inception_v3", 32, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("resnet50", 32, "train", {"philly": 3, "helios": 2, "pai": 1}),
    ("resnet50", 128, "train", {"philly": 1, "helios": 0, "pai": 0, "llm": 1}),
    ("resnet50", 32, "infer", {"philly": 0, "helios": 1, "pai": 3}),
    ("vgg16", 32, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("xception_224", 16, "train", {"philly": 1, "helios": 0, "pai": 0}),
    ("unet", 8, "train", {"philly": 1, "helios": 1, "pai": 0}),
    ("bert_base_mlm", 16, "train", {"philly": 2, "helios": 2, "pai": 1, "llm": 3}),
    ("bert_base_mlm", 16, "infer", {"philly": 0, "helios": 0, "pai": 2}),
    ("bert_base_mlm", 32, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 2}),
    ("bert_large_mlm", 16, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 2}),
    ("gpt2", 8, "train", {"philly": 1, "helios": 1, "pai": 0, "llm": 3}),
    ("gpt2_large", 8, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 1}),
    ("xlnet_base_cls", 8, "train", {"philly": 0, "helios": 0, "pai": 0, "llm": 2}),
    ("t5_small", 16, "train", {"philly": 1, "helios": 1, "pai": 0, "llm": 2}),
    ("vit_b_16", 32, "train", {"philly": 1, "helios": 1, "pai": 0, "llm": 2}),
)

# GPU types the shipped table predicts on (catalog names); other types need --zoo.
SHIPPED_TYPES = ("a100-40gb", "a100-80gb", "t4", "v100-16gb", "v100-32gb", "h100-sxm", "l4",
                 "a10", "a30", "rtx3090", "l40s")
SHIPPED_MIX = Path(__file__).resolve().parents[1] / "data" / "sim_mix.json"
# the key of a site's residuals pooled over all its models (replay.site_residuals)
SITE_POOLED = "*"


def _site_tables(site) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, tuple[dict, dict]]]:
    """({model: util residuals}, {model: memory residuals}, {gpu type: (the same two)}) of
    ``site`` ({"util": {model: [log ratios]}, "mem": {...}, optional "by_type": {gpu type:
    {"util": ..., "mem": ...}}}, as replay.site_residuals makes it), checked: finite numbers."""
    if site is None:
        return {}, {}, {}

    def tables(doc, where: str) -> tuple[dict, dict]:
        out = []
        for kind in ("util", "mem"):
            table = doc.get(kind) if isinstance(doc, Mapping) else None
            if not isinstance(table, Mapping):
                raise HorusError(f"site residuals: no '{kind}' table{where}")
            got = {}
            for model, vals in table.items():
                try:
                    arr = np.asarray(vals, dtype=float) if isinstance(vals, (list, tuple, np.ndarray)) else None
                except (TypeError, ValueError):
                    arr = None
                if arr is None or arr.ndim != 1 or not len(arr) or not np.isfinite(arr).all():
                    raise HorusError(f"site residuals: {kind} of '{model}'{where} is not a list of numbers")
                got[str(model)] = arr
            out.append(got)
        return out[0], out[1]

    util, mem = tables(site, "")
    by_type = site.get("by_type", {})
    if not isinstance(by_type, Mapping):
        raise HorusError("site residuals: 'by_type' is not a table of GPU types")
    return util, mem, {str(t): tables(doc, f" on {t}") for t, doc in by_type.items()}


def _site_get(table: Mapping[str, np.ndarray], model: str | None) -> np.ndarray | None:
    """The site's residuals of the mix's ``model`` in ``table``: under its own name (rows that
    name it so), else under its family, the ledger's ``model_family`` (graph.names.family_of:
    mobilenet_v2 -> mobilenet, vit_b_16 -> vit_b); None where the site has neither."""
    if not model:
        return None
    got = table.get(model)
    return got if got is not None else table.get(family_of(model))


class ModelMix:
    """Predictions of the model mix per (model, batch, task, GPU type), and the predictor's
    measured memory residuals.

    Default: the shipped table (slurm_horus/data/sim_mix.json, made by
    benchmarks/make_sim_mix.py), so no ONNX graph is read at run time.  ``zoo_dir``: a folder of
    ``<model>.onnx`` files to predict from instead (any GPU type of the catalog; dims from
    ``zoo.json`` next to it, else batch/seq=128).  ``site``: the site's own residuals
    (:func:`slurm_horus.sim.replay.site_residuals` of its ledger), used before the shipped ones
    for the models the site ran.
    """

    def __init__(self, zoo_dir: str | os.PathLike | None = None, estimator=None,
                 site: Mapping[str, Mapping[str, Sequence[float]]] | None = None):
        self.zoo_dir = Path(zoo_dir) if zoo_dir is not None else None
        self._estimator = estimator
        try:
            self._table = json.loads(SHIPPED_MIX.read_text())
        except (OSError, ValueError) as e:
            raise HorusError(f"model mix {SHIPPED_MIX}: {e} (run benchmarks/make_sim_mix.py)") from None
        self._shipped = {(e["model"], e["batch"], e["task"]): e["pred"] for e in self._table["entries"]}
        res = self._table["mem_residuals"]
        self._res_model = {m: np.array(v, dtype=float) for m, v in res["by_model"].items()}
        self._res_pooled = np.array(res["pooled"], dtype=float)
        self._util_res = np.array(self._table["util_residuals"]["pooled"], dtype=float)
        self._site_util, self._site_mem, self._site_types = _site_tables(site)
        self._reports: dict[tuple[str, int], Any] = {}
        self._preds: dict[tuple[str, int, str, str], tuple[float, float, float]] = {}
        self._dims: dict[str, dict[str, int]] | None = None

    def mem_residuals(self, model: str) -> np.ndarray:
        """log(measured / predicted) memory of ``model``: the site's runs of it (``site``), else
        GPUMemNet's, else pooled over all models GPUMemNet measured."""
        got = _site_get(self._site_mem, model)
        return got if got is not None else self._res_model.get(model, self._res_pooled)

    def util_residuals(self, model: str | None = None) -> np.ndarray:
        """log(measured / predicted) utilization: the site's solo runs of ``model`` (``site``),
        else of all its models, else the cold start's on held-out GPUMemNet MLP runs (the only
        utilization measurements shipped)."""
        got = _site_get(self._site_util, model)
        if got is None:
            got = self._site_util.get(SITE_POOLED)
        return got if got is not None else self._util_res

    def type_residuals(self, model: str, gpu_type: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(util, memory) residuals of the site's runs of ``model`` on ``gpu_type``; None where
        it has too few (the shipped residuals were measured on one A100 only)."""
        util, mem = self._site_types.get(gpu_type, ({}, {}))
        return _site_get(util, model), _site_get(mem, model)

    def _zoo_dims(self) -> dict[str, dict[str, int]]:
        if self._dims is None:
            self._dims = {}
            try:
                for e in json.loads((self.zoo_dir.parent / "zoo.json").read_text()):
                    self._dims[e["name"]] = dict(e.get("dims") or {})
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return self._dims

    def predict(self, model: str, batch: int, task: str, gpu_type: str) -> tuple[float, float, float]:
        """(util_pct, mem_mib, mem_p90_mib) of ``model`` at ``batch``/``task`` on ``gpu_type``."""
        key = (model, batch, task, gpu_type)
        hit = self._preds.get(key)
        if hit is not None:
            return hit
        gpu = get_gpu(gpu_type)
        if self.zoo_dir is None:
            pred = self._shipped.get((model, batch, task), {}).get(gpu.name)
            if pred is None:
                raise HorusError(f"the shipped model mix has no prediction for {model}/b{batch}/{task} "
                                 f"on {gpu.name} (types: {', '.join(self._table['types'])}); "
                                 "pass --zoo DIR with the ONNX graphs to predict on it")
            out = (float(pred[0]), float(pred[1]), float(pred[2]))
        else:
            out = self._predict_graph(model, batch, task, gpu)
        self._preds[key] = out
        return out

    def _predict_graph(self, model: str, batch: int, task: str, gpu) -> tuple[float, float, float]:
        rkey = (model, batch)
        report = self._reports.get(rkey)
        if report is None:
            path = self.zoo_dir / f"{model}.onnx"
            if not path.is_file():
                raise HorusError(f"model corpus: {path} not found")
            dims = {"seq": 128, "dec_seq": 128, **self._zoo_dims().get(model, {}), "batch": batch}
            report = extract_features(path, dims=dims)
            self._reports[rkey] = report
        if self._estimator is None:
            self._estimator = ColdStartEstimator()
        p = self._estimator.predict(report, gpu, Workload(batch_size=batch, task=task))
        return float(p.util_pct), float(p.mem_mib), float(p.mem_mib_p90)

    def entries(self, trace: str) -> tuple[list[tuple[str, int, str]], np.ndarray]:
        """The mix of ``trace``: its (model, batch, task) entries and their probabilities."""
        items = [(m, b, t) for m, b, t, w in MIX if w.get(trace, 0) > 0]
        weights = np.array([w[trace] for m, b, t, w in MIX if w.get(trace, 0) > 0], dtype=float)
        if not items:
            raise HorusError(f"no model mix for trace '{trace}'")
        if self.zoo_dir is not None:
            available = [i for i, (m, _, _) in enumerate(items) if (self.zoo_dir / f"{m}.onnx").is_file()]
            if not available:
                raise HorusError(f"model corpus: no model of the mix found in {self.zoo_dir}")
            items = [items[i] for i in available]
            weights = weights[available]
        return items, weights / weights.sum()


def runtime_factor(gpu_type: str, reference: str = "a100-40gb") -> float:
    """How much longer a job runs on ``gpu_type`` than on the reference (trace runtimes are
    A100 runtimes): the geometric mean of the FP32-throughput and memory-bandwidth ratios (an
    assumption: training steps are partly compute-, partly bandwidth-bound)."""
    g, r = get_gpu(gpu_type), get_gpu(reference)
    return math.sqrt((r.fp32_tflops * r.mem_bw_gbs) / (g.fp32_tflops * g.mem_bw_gbs))
