"""Stage 3: choose the predictor and predict per GPU type.

The site's measured runs (the registry's history.json) answer first where they know the graph;
the serving learned model, else the cold-start estimator, answers otherwise, corrected by the
site's offsets for the GPU type. A refused model or history never stops a prediction: what is
left serves, and the user is told why.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FeatureReport
from slurm_horus.predict.coldstart import ColdStartEstimator, Prediction, Workload
from slurm_horus.predict.gpus import GPU
from slurm_horus.predict.history import HistoryPredictor, current_user
from slurm_horus.predict.learned import LearnedEstimator
from slurm_horus.predict.registry import CALIBRATION_FILE, MAX_SMALL_JSON, Registry
from slurm_horus.errors import CONTROL_CHARS

QUANTILES = ("0.9", "0.95", "0.99")
# the calibrated quantiles a calibration.json may hold (retrain clamps memory's to them):
# log(actual / predicted) memory, 0.135x..20x; actual - predicted utilization, points
MEM_LOG_Q_BOUNDS = (-2.0, 3.0)
UTIL_Q_BOUNDS = (-100.0, 100.0)


class Calibration:
    """The bounds' split-conformal quantiles (registry calibration.json, written by retrain):
    per GPU type (or "*") and predictor source, the quantiles of log(actual / predicted) memory
    and of actual - predicted utilization on held-out jobs (docs/definitions.md)."""

    def __init__(self, data: dict, serving: str | None):
        if not isinstance(data, dict) or data.get("version") != 1 \
                or not isinstance(data.get("quantiles"), dict):
            raise HorusError("calibration.json: not a version-1 calibration file")
        self.model = data.get("model")
        self.serving = serving
        self.quantiles = {}
        for gtype, by_source in data["quantiles"].items():
            if not isinstance(by_source, dict):
                raise HorusError(f"calibration.json: {gtype!r}: expected an object")
            for source, e in by_source.items():
                self.quantiles[(str(gtype), str(source))] = (
                    _checked(e, "mem_log_q", *MEM_LOG_Q_BOUNDS), _checked(e, "util_q", *UTIL_Q_BOUNDS))

    def apply(self, p: Prediction) -> Prediction:
        """p with calibrated bounds where this GPU type and predictor source have them."""
        source = p.predictor.split(":", 1)[0]
        if source == "learned" and p.predictor != f"learned:{self.model}":
            return p  # calibrated for another model version
        entry = self.quantiles.get((p.gpu, source)) or self.quantiles.get(("*", source))
        if entry is None:
            return p
        mem_q, util_q = entry
        # the quantiles are of the measured against the predictor's own figure: where site
        # offsets moved it, they still bound the measurement from that figure (applied to the
        # moved one, a site below the cold start got a p90 equal to its estimate: 52 % covered)
        base_mem = p.breakdown.get("base_mem_mib", p.mem_mib)
        base_util = p.breakdown.get("base_util_pct", p.util_pct)
        mem = {q: max(base_mem * math.exp(v), p.mem_mib) for q, v in mem_q.items()}
        return replace(p, mem_mib_p90=mem.get("0.9", p.mem_mib_p90),
                       mem_mib_p95=mem.get("0.95"), mem_mib_p99=mem.get("0.99"),
                       util_pct_p90=(min(max(base_util + util_q["0.9"], p.util_pct), 100.0)
                                     if "0.9" in util_q else None))


def _checked(entry, key: str, lo: float, hi: float) -> dict[str, float]:
    if not isinstance(entry, dict) or not isinstance(entry.get(key), dict):
        raise HorusError(f"calibration.json: an entry lacks {key}")
    out = {}
    for q, v in entry[key].items():
        if q not in QUANTILES or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not lo <= v <= hi:
            raise HorusError(f"calibration.json: {key} {q!r}={v!r} out of bounds")
        out[q] = float(v)
    return out


MAX_WARNING = 400  # characters of a refusal shown to users


@dataclass
class PredictorChoice:
    estimator: object
    note: str  # why this predictor serves, shown to users
    warning: str | None = None  # why the site's learned model, history or calibration was refused
    calibration: Calibration | None = None


def choose_predictor(model_dir=None) -> PredictorChoice:
    """History over the registry's serving model, else over the cold-start estimator, with the
    site's calibrated bounds."""
    registry = Registry(model_dir)
    choice = _choose(registry)
    if model_dir and not os.path.isdir(registry.root):  # no folder, or none we may look in
        # a folder the user named (--horus-model-dir, --model-dir) that is not there: a typo to
        # hear of (the site's folder, default or $HORUS_MODEL_DIR, is made by the first retrain)
        missing = f"model registry {registry.root}: no such folder (or not one you may look in)"
        choice.warning = "; ".join(w for w in (missing, choice.warning) if w)  # first: the cause
    try:
        stored = registry.load_json(CALIBRATION_FILE, max_bytes=MAX_SMALL_JSON)
        if stored is not None:
            choice.calibration = Calibration(stored, registry.serving())
    except HorusError as e:
        why = f"calibration refused ({e}); bounds are the predictors' own"
        choice.warning = "; ".join(w for w in (choice.warning, why) if w)
    # both may quote a registry file's content: short printable lines
    choice.note, choice.warning = _line(choice.note), choice.warning and _line(choice.warning)
    return choice


def _line(text: str) -> str:
    text = CONTROL_CHARS.sub("?", text[:MAX_WARNING + 1])
    return text if len(text) <= MAX_WARNING else text[:MAX_WARNING - 3] + "..."


def _choose(registry: Registry) -> PredictorChoice:
    warnings = []
    try:
        version = registry.serving()
        if version is None:
            base = ColdStartEstimator()
            note = "no trained model: the cold-start estimator serves"
        else:
            base = LearnedEstimator(registry.load(version), version)
            note = f"learned model {version} from {registry.root}"
    except HorusError as e:
        base = ColdStartEstimator()
        note = f"learned model refused ({e}); the cold-start estimator serves"
        warnings.append(note)
    try:
        stored = registry.load_history()
        if stored is None:
            alone = " alone" if isinstance(base, ColdStartEstimator) and not warnings else ""
            return PredictorChoice(base, note + alone + " (no site history)", *warnings[:1])
        user = None  # a history of names (older exports): the reader's own name
        if isinstance(stored, dict) and stored.get("pseudonymous") is True:
            user = registry.pseudonym(current_user() or "") or ""  # "": none of its runs are ours
        history = HistoryPredictor.from_dict(stored, base=base, user=user, source=str(registry.root))
        return PredictorChoice(history, note + f"; site history of {len(history.graphs)} "
                               "graph(s) first", *warnings[:1])
    except HorusError as e:
        why = f"site history refused ({e}); predictions ignore it"
        return PredictorChoice(base, note + f"; {why}", "; ".join([*warnings, why]))


def predict_for(report: FeatureReport, gpus: list[GPU], workload: Workload,
                choice: PredictorChoice | None = None) -> list[Prediction]:
    choice = choice or choose_predictor()
    preds = [choice.estimator.predict(report, gpu, workload) for gpu in gpus]
    if choice.calibration is None:
        return preds
    return [choice.calibration.apply(p) for p in preds]
