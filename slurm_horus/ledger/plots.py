"""hacct --plot: predicted against measured."""

from __future__ import annotations

import struct
import zlib

def plot_points(ledger, limit: int = 20000, **filters) -> list[tuple]:
    """(submit_time, pred_util, act_util, pred_mem, act_mem) of measured jobs."""
    from sqlalchemy import or_ as _or, select

    from slurm_horus.ledger import job_filters, tables

    j = tables()["jobs"]
    stmt = select(j.c.submit_time, j.c.pred_util_pct, j.c.act_util_pct, j.c.pred_mem_mib,
                  j.c.act_mem_mib).where(_or(j.c.act_util_pct.isnot(None),
                                             j.c.act_mem_mib.isnot(None)))
    stmt = job_filters(stmt, submitted_only=True, **filters)
    stmt = stmt.order_by(j.c.submit_time.desc()).limit(limit)
    with ledger.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(stmt)][::-1]


def text_plot(points: list[tuple], width: int = 60, height: int = 18) -> str:
    """Predicted (x) vs actual (y) utilization as characters, then |error| over time."""
    pts = [(p[1], p[2]) for p in points if p[1] is not None and p[2] is not None]
    out = [f"predicted (x) vs actual (y) GPU utilization, {len(pts)} jobs, '.' = exact"]
    grid = [[" "] * width for _ in range(height)]
    for i in range(min(width, height * 4)):
        x = i * (width - 1) // max(width - 1, 1)
        y = height - 1 - int(round(x / (width - 1) * (height - 1)))
        grid[y][x] = "."
    counts: dict[tuple[int, int], int] = {}
    for px, py in pts:
        x = min(max(int(px / 100 * (width - 1)), 0), width - 1)
        y = height - 1 - min(max(int(py / 100 * (height - 1)), 0), height - 1)
        counts[(x, y)] = counts.get((x, y), 0) + 1
    for (x, y), n in counts.items():
        grid[y][x] = "o" if n == 1 else ("O" if n < 10 else "#")
    for i, row in enumerate(grid):
        label = "100" if i == 0 else ("  0" if i == height - 1 else "   ")
        out.append(f"{label} |" + "".join(row))
    out.append("    +" + "-" * width)
    out.append("     0" + " " * (width - 8) + "100")
    errs = [(p[0], abs(p[2] - p[1])) for p in points
            if p[0] is not None and p[1] is not None and p[2] is not None]
    if errs:
        out.append("")
        out.append("mean |utilization error| (pp) over time")
        t0, t1 = errs[0][0], errs[-1][0]
        nb = min(12, len(errs))
        span = max(t1 - t0, 1)
        bins: list[list[float]] = [[] for _ in range(nb)]
        for t, e in errs:
            bins[min(int((t - t0) / span * nb), nb - 1)].append(e)
        import time

        for k, b in enumerate(bins):
            if not b:
                continue
            mean = sum(b) / len(b)
            day = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t0 + span * k / nb))
            out.append(f"{day}  {'#' * int(round(mean / 2)):<50} {mean:5.1f} ({len(b)})")
    return "\n".join(out) + "\n"


def write_png(path: str, points: list[tuple], width: int = 640, height: int = 320) -> None:
    """Two panels without text: left predicted vs actual utilization (grey diagonal = exact),
    right |util error| (blue) and |memory error| % of actual (orange, clipped at 100) over time."""
    W, H = width, height
    img = bytearray(b"\xff" * (W * H * 3))

    def px(x, y, c):
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            img[i:i + 3] = bytes(c)

    def box(x0, y0, x1, y1):
        for x in range(x0, x1 + 1):
            px(x, y0, (0, 0, 0)); px(x, y1, (0, 0, 0))  # noqa: E702
        for y in range(y0, y1 + 1):
            px(x0, y, (0, 0, 0)); px(x1, y, (0, 0, 0))  # noqa: E702

    pad = 20
    half = W // 2
    L = (pad, pad, half - pad, H - pad)
    R = (half + pad, pad, W - pad, H - pad)
    box(*L)
    box(*R)
    lw, lh = L[2] - L[0], L[3] - L[1]
    for k in range(min(lw, lh)):
        px(L[0] + int(k * lw / min(lw, lh)), L[3] - int(k * lh / min(lw, lh)), (170, 170, 170))
    for p in points:
        if p[1] is None or p[2] is None:
            continue
        x = L[0] + int(min(max(p[1], 0), 100) / 100 * lw)
        y = L[3] - int(min(max(p[2], 0), 100) / 100 * lh)
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                px(x + dx, y + dy, (200, 30, 30))
    ts = [p[0] for p in points if p[0] is not None]
    if ts:
        t0, span = min(ts), max(max(ts) - min(ts), 1)
        rw, rh = R[2] - R[0], R[3] - R[1]
        for p in points:
            if p[0] is None:
                continue
            x = R[0] + int((p[0] - t0) / span * rw)
            if p[1] is not None and p[2] is not None:
                px(x, R[3] - int(min(abs(p[2] - p[1]), 100) / 100 * rh), (30, 80, 200))
            if p[3] is not None and p[4]:
                e = min(abs(p[3] - p[4]) / p[4] * 100, 100)
                px(x, R[3] - int(e / 100 * rh), (240, 140, 20))
    raw = b"".join(b"\x00" + bytes(img[y * W * 3:(y + 1) * W * 3]) for y in range(H))

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)
