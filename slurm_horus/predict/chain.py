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
from slurm_horus.predict.registry import CALIBRATION_FILE, Registry, calibration_file
from slurm_horus.errors import CONTROL_CHARS

QUANTILES = {"0.9": "p90", "0.95": "p95", "0.99": "p99"}  # a calibration file's quantiles: the bounds
# the calibrated quantiles a calibration.json may hold (retrain clamps memory's to them):
# log(actual / predicted) memory, 0.135x..20x; actual - predicted utilization, points
MEM_LOG_Q_BOUNDS = (-2.0, 3.0)
UTIL_Q_BOUNDS = (-100.0, 100.0)


class Calibration:
    """The bounds' split-conformal quantiles (written by retrain): per GPU type (or "*") and
    predictor source, the quantiles of log(actual / predicted) memory and of actual - predicted
    utilization on held-out jobs (docs/definitions.md). ``data``: calibration.json (the cold
    start's, and the learned entries of the version serving when retrain wrote it); ``own``:
    calibration-<serving>.json, the serving version's own learned entries, which replace those
    (a rollback had served the older version with none)."""

    def __init__(self, data: dict | None, serving: str | None, own: dict | None = None):
        self.model = None  # the version the learned entries are of
        self.quantiles = {}
        if data is not None:
            self._add(data, CALIBRATION_FILE)
            self.model = data.get("model")
        if own is not None:
            name = calibration_file(serving)
            if not isinstance(own, dict) or own.get("model") != serving:
                raise HorusError(f"{name}: not the calibration of {serving}")
            self.quantiles = {k: v for k, v in self.quantiles.items() if k[1] != "learned"}
            self._add(own, name, "learned")
            self.model = serving

    def _add(self, data, name: str, only: str | None = None) -> None:
        """The entries of one calibration file (of predictor source ``only``, where given)."""
        if not isinstance(data, dict) or data.get("version") != 1 \
                or not isinstance(data.get("quantiles"), dict):
            raise HorusError(f"{name}: not a version-1 calibration file")
        for gtype, by_source in data["quantiles"].items():
            if not isinstance(by_source, dict):
                raise HorusError(f"{name}: {gtype!r}: expected an object")
            for source, e in by_source.items():
                if only is None or source == only:
                    self.quantiles[(str(gtype), str(source))] = (
                        _checked(e, "mem_log_q", *MEM_LOG_Q_BOUNDS, name),
                        _checked(e, "util_q", *UTIL_Q_BOUNDS, name))

    def learned_bounds(self, version: str) -> tuple[str, ...]:
        """The calibrated memory bounds ("p90", "p95", "p99") learned ``version``'s answers
        carry, on some GPU type; () where none."""
        if version != self.model:
            return ()
        have = {q for (_, source), (mem_q, _) in self.quantiles.items() if source == "learned"
                for q in mem_q}
        return tuple(bound for q, bound in QUANTILES.items() if q in have)

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
        # each bound at least the one below it, and a p99 only above a p95, as the hint carries
        # them: quantiles out of order ({"0.9": 0.1, "0.95": 0.9, "0.99": 0.5}), or a p95 with
        # no p90 beside the predictor's own p90, had shown horus predict other bounds than the
        # hook's
        p90 = mem.get("0.9", p.mem_mib_p90)
        p95 = max(mem["0.95"], p90) if "0.95" in mem else None
        p99 = max(mem["0.99"], p95) if "0.99" in mem and p95 is not None else None
        return replace(p, mem_mib_p90=p90, mem_mib_p95=p95, mem_mib_p99=p99,
                       util_pct_p90=(min(max(base_util + util_q["0.9"], p.util_pct), 100.0)
                                     if "0.9" in util_q else None))


def _checked(entry, key: str, lo: float, hi: float, name: str) -> dict[str, float]:
    if not isinstance(entry, dict) or not isinstance(entry.get(key), dict):
        raise HorusError(f"{name}: an entry lacks {key}")
    out = {}
    for q, v in entry[key].items():
        if q not in QUANTILES or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not lo <= v <= hi:
            raise HorusError(f"{name}: {key} {q!r}={v!r} out of bounds")
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
    name = choice.estimator.name  # "learned:vNNNN" where a learned model serves
    version = name.removeprefix("learned:") if name.startswith("learned:") else None
    try:
        choice.calibration = load_calibration(registry, version)
        if version and not (choice.calibration and choice.calibration.learned_bounds(version)):
            choice.note += f"; {no_bounds(version)}"
    except HorusError as e:
        why = f"calibration refused ({e}); bounds are the predictors' own"
        choice.warning = "; ".join(w for w in (choice.warning, why) if w)
    # both may quote a registry file's content: short printable lines
    choice.note, choice.warning = _line(choice.note), choice.warning and _line(choice.warning)
    return choice


def load_calibration(registry: Registry, serving: str | None) -> Calibration | None:
    """The calibrated bounds that serve with learned version ``serving`` (None: the cold start
    serves), None where retrain has written none; HorusError where a file is refused."""
    stored = registry.load_json(CALIBRATION_FILE)
    own = registry.load_json(calibration_file(serving)) if serving else None
    return None if stored is None and own is None else Calibration(stored, serving, own)


def no_bounds(version: str) -> str:
    """What it means that learned ``version`` has no calibrated bounds."""
    return (f"{version} has no calibrated bounds (its own p90, no p95/p99: a policy's "
            "memory = p95 or p99 charges its p90)")


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
