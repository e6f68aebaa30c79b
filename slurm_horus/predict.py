"""Stage 3: choose the predictor (the serving learned model, else cold start) and predict per GPU."""

from __future__ import annotations

from dataclasses import dataclass

from .coldstart import ColdStartEstimator, Prediction, Workload
from .errors import HorusError
from .features import FeatureReport
from .gpus import GPU
from .registry import Registry


@dataclass
class PredictorChoice:
    estimator: object
    note: str  # why this predictor serves, shown to users
    warning: str | None = None  # why the site's learned model was refused, when it was


def choose_predictor(model_dir=None) -> PredictorChoice:
    """The registry's serving model, or the cold-start estimator (saying why)."""
    registry = Registry(model_dir)
    try:
        version = registry.serving()
        if version is None:
            return PredictorChoice(ColdStartEstimator(),
                                   "no trained model: the cold-start estimator serves alone")
        from .learned import LearnedEstimator

        return PredictorChoice(LearnedEstimator(registry.load(version), version),
                               f"learned model {version} from {registry.root}")
    except HorusError as e:  # a refused model never stops a prediction: cold start serves
        why = f"learned model refused ({e}); the cold-start estimator serves"
        return PredictorChoice(ColdStartEstimator(), why, warning=why)


def predict_for(report: FeatureReport, gpus: list[GPU], workload: Workload,
                choice: PredictorChoice | None = None) -> list[Prediction]:
    choice = choice or choose_predictor()
    return [choice.estimator.predict(report, gpu, workload) for gpu in gpus]
