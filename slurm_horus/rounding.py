"""How the hint writes a figure: rounded UP (utilization to 0.1 %, memory to whole MiB) from the
float's shortest decimal form, so 40.2 stays 40.2.  The hook charges what the hint says, so every
place that shows a prediction rounds the same way (a p90 shown as 5830 had been charged 5831, a
utilization shown as 69.9 % judged at 70.0)."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Context, Decimal

__all__ = ["round_up", "shown"]

_EXACT = Context(prec=400)  # any float's integer part (up to 1.8e308) without loss


def round_up(value: Decimal, places: int) -> Decimal:
    return value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_CEILING, context=_EXACT)


def shown(value: float, places: int) -> float:
    """``value`` as the hint writes it, as a number (``places``: 1 for utilization, 0 for MiB);
    a value that is not finite as it is."""
    v = float(value)
    return float(round_up(Decimal(repr(v)), places)) if math.isfinite(v) else v
