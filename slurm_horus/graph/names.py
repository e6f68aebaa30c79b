"""A model's family from its file name: what the ledger, the history and the simulator's site
residuals group runs by.  Kept apart from the graph loader so that the ledger can name a model
without importing ONNX or the predictors."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["family_of"]


def family_of(model_path: str) -> str:
    """A model's family from its file name: 'resnet50_bs64.onnx' -> 'resnet50'.  Characters
    other than letters, digits and ``_.+-`` become ``_``: the name is the user's, and a '|' in
    it shifted the columns of ``hacct -P`` (a space, of the plain table)."""
    stem = Path(str(model_path)).name
    stem = re.sub(r"\.onnx$", "", stem, flags=re.I)
    stem = re.split(r"[._-](?:bs|b|batch|v|ep|epoch|step)?\d*$", stem)[0] or stem
    return re.sub(r"[^\w.+-]", "_", stem.lower())[:64]
