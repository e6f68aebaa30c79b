"""The simulator's comparison chart."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence


# --------------------------------------------------------------------------------------------
# A tiny PNG bar chart (no matplotlib): one panel per metric, one bar per policy
# --------------------------------------------------------------------------------------------

COLORS = {"exclusive": (120, 120, 120), "naive": (230, 140, 30), "horus": (40, 100, 220),
          "oracle": (40, 170, 80)}
PLOT_METRICS = ("makespan_s", "mean_jct_s", "mean_wait_s", "gpu_util", "gpus_busy_frac", "oom_failures")


def _png(width: int, height: int, rows: list[bytearray]) -> bytes:
    raw = b"".join(b"\x00" + bytes(r) for r in rows)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def write_png(path: str | os.PathLike, results: Mapping[str, Mapping[str, Any]],
              metrics: Sequence[str] = PLOT_METRICS) -> list[str]:
    """Grouped bars: one panel per metric (scaled to that metric's largest value), one bar per
    policy in COLORS.  Returns the legend lines (the PNG has no text)."""
    pols = list(results)
    pw, ph, bw, gap, m = 150, 200, 24, 8, 10
    width, height = m + len(metrics) * (pw + m), ph + 2 * m
    rows = [bytearray(b"\xff" * (3 * width)) for _ in range(height)]

    def rect(x0, y0, x1, y1, c):
        for y in range(max(0, y0), min(height, y1)):
            r = rows[y]
            for x in range(max(0, x0), min(width, x1)):
                r[3 * x:3 * x + 3] = bytes(c)

    legend = []
    for k, metric in enumerate(metrics):
        x0 = m + k * (pw + m)
        rect(x0, m + ph - 1, x0 + pw, m + ph, (0, 0, 0))  # baseline
        vals = [float(results[p].get(metric, 0) or 0) for p in pols]
        top = max(vals) if vals and max(vals) > 0 else 1.0
        for i, (p, v) in enumerate(zip(pols, vals)):
            h = int(round((ph - 10) * v / top))
            bx = x0 + gap + i * (bw + gap)
            rect(bx, m + ph - 1 - h, bx + bw, m + ph - 1, COLORS.get(p, (0, 0, 0)))
        legend.append(f"panel {k + 1}: {metric} (max {top:.4g})")
    Path(path).write_bytes(_png(width, height, rows))
    legend.append("bars left to right: " + ", ".join(f"{p} rgb{COLORS.get(p, (0, 0, 0))}" for p in pols))
    return legend
