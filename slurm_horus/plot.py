"""Shared plotting helpers: matplotlib (an optional extra) for files, characters for terminals.

hacct --plot and horus-admin simulate --plot draw through here, so both pictures share one
backend, one missing-library message, one palette and one character canvas. matplotlib is
imported only when a file is asked for: it is optional (the ``[plot]`` extra: ``pip install matplotlib``) and
slow to import. The terminal rendering needs only rich, a core dependency.
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Sequence

from rich.console import Console
from rich.text import Text

from slurm_horus.errors import HorusError

INSTALL_HINT = "pip install matplotlib (the [plot] extra)"
TERM_WIDTH = 80  # what the terminal renderings are laid out for

# One colour per named series: matplotlib colours for files, the nearest rich names for terminals.
COLORS = {"exclusive": "#7f7f7f", "naive": "#e6862a", "horus": "#2a64dc", "oracle": "#2ca02c",
          "cold-start": "#e6862a", "learned": "#2a64dc", "history": "#2ca02c"}
TERM_STYLES = {"exclusive": "white", "naive": "dark_orange", "horus": "dodger_blue1",
               "oracle": "green3", "cold-start": "dark_orange", "learned": "dodger_blue1",
               "history": "green3"}
_CYCLE = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728")


def pyplot(option: str = "--plot FILE.png"):
    """matplotlib.pyplot on the Agg backend (no display needed), or a one-line HorusError
    naming how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise HorusError(f"{option} needs matplotlib: {INSTALL_HINT}; "
                         "or --plot - to draw in the terminal") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def color(name: str, i: int = 0) -> str:
    """The series' colour: fixed for known policies/predictor sources, else a cycle by index."""
    return COLORS.get(name, _CYCLE[i % len(_CYCLE)])


def check_path(path: str) -> str:
    """The file a --plot FILE names (no suffix: .png added, as matplotlib would write), checked
    before any work is done: a folder, a format matplotlib does not write or a folder that is not
    there is a one-line HorusError, not a failure after the simulation or the query."""
    pyplot()  # a missing matplotlib is one line too
    from matplotlib.backend_bases import FigureCanvasBase

    if not path or os.path.isdir(path):
        raise HorusError(f"--plot {path!r}: name a FILE.png")
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not ext:
        path, ext = path.rstrip(".") + ".png", "png"  # "out." too: matplotlib's out.png
    kinds = FigureCanvasBase.get_supported_filetypes()
    if ext not in kinds:
        raise HorusError(f"--plot {path}: .{ext} is no image format matplotlib writes "
                         f"(use .png; also {', '.join(sorted(k for k in kinds if k != 'png'))})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise HorusError(f"--plot {path}: no folder {folder}")
    return path


def save(fig, path: str) -> str:
    """Write the figure (format from the file's suffix; none: .png) and free it; the path
    written.  Bad paths are one line (check_path)."""
    plt = pyplot()
    try:
        path = check_path(path)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except (OSError, ValueError) as e:
        raise HorusError(f"--plot {path}: {getattr(e, 'strerror', None) or e}") from None
    finally:
        plt.close(fig)
    return path


def console(width: int | None = None) -> Console:
    """A console for the terminal renderings: at most 100 columns, so bars keep a readable
    length on wide terminals (they are laid out to fit 80)."""
    c = Console()
    return Console(width=min(width or c.width, TERM_WIDTH + 20))


# --------------------------------------------------------------------------- terminal

def fmt_num(v: float) -> str:
    """Short tick text: 0.5, 12, 1.2k, 35k."""
    a = abs(v)
    if a >= 10000:
        return f"{v / 1000:.0f}k"
    if a >= 1000:
        return f"{v / 1000:.1f}k"
    if a >= 10 or a == 0:
        return f"{v:.0f}"
    return f"{v:.1f}"


class Canvas:
    """A character scatter: each cell shows the glyph of the series with most points there,
    so overlapping series stay readable without colour."""

    def __init__(self, width: int, height: int, xlim: tuple[float, float],
                 ylim: tuple[float, float], log: bool = False):
        self.w, self.h, self.log = width, height, log
        self.x0, self.x1 = (self._t(v) for v in xlim)
        self.y0, self.y1 = (self._t(v) for v in ylim)
        self.cells: dict[tuple[int, int], dict[str, int]] = {}
        self.glyphs: dict[str, tuple[str, str]] = {}
        self.xlim, self.ylim = xlim, ylim

    def _t(self, v: float) -> float:
        return math.log10(max(v, 1e-9)) if self.log else v

    def _cell(self, x: float, y: float) -> tuple[int, int]:
        fx = (self._t(x) - self.x0) / ((self.x1 - self.x0) or 1)
        fy = (self._t(y) - self.y0) / ((self.y1 - self.y0) or 1)
        cx = min(max(int(round(fx * (self.w - 1))), 0), self.w - 1)
        cy = min(max(int(round(fy * (self.h - 1))), 0), self.h - 1)
        return cx, self.h - 1 - cy

    def series(self, name: str, glyph: str, style: str, points: Iterable[tuple[float, float]]):
        self.glyphs[name] = (glyph, style)
        for x, y in points:
            c = self.cells.setdefault(self._cell(x, y), {})
            c[name] = c.get(name, 0) + 1

    def diagonal(self) -> None:
        """y = x, drawn under the points."""
        lo, hi = max(self.xlim[0], self.ylim[0]), min(self.xlim[1], self.ylim[1])
        for k in range(4 * self.w):
            v = (10 ** (math.log10(lo) + (math.log10(hi) - math.log10(lo)) * k / (4 * self.w - 1))
                 if self.log else lo + (hi - lo) * k / (4 * self.w - 1))
            self.cells.setdefault(self._cell(v, v), {})

    def render(self, ylabel: str, xlabel: str) -> list[Text]:
        """Lines of the panel: y label, the grid with y ticks, the x axis with ticks, x label."""
        lines = [Text(ylabel, style="bold")]
        yt = {0: self.ylim[1], self.h // 2: self._inv(self.y0 + (self.y1 - self.y0) / 2),
              self.h - 1: self.ylim[0]}
        for r in range(self.h):
            line = Text(f"{fmt_num(yt[r]) if r in yt else '':>5} |")
            for c in range(self.w):
                counts = self.cells.get((c, r))
                if counts is None:
                    line.append(" ")
                elif not counts:
                    line.append(".", style="grey50")
                else:
                    name = max(counts, key=counts.get)
                    glyph, style = self.glyphs[name]
                    line.append(glyph, style=style)
            lines.append(line)
        lines.append(Text("      +" + "-" * self.w))
        lo, mid, hi = fmt_num(self.xlim[0]), fmt_num(self._inv(self.x0 + (self.x1 - self.x0) / 2)), \
            fmt_num(self.xlim[1])
        ticks = [" "] * (self.w + 2)
        for pos, s in ((0, lo), ((self.w - len(mid)) // 2, mid), (self.w + 1 - len(hi), hi)):
            ticks[pos:pos + len(s)] = s
        lines.append(Text("      " + "".join(ticks)))
        lines.append(Text(f"{xlabel:>{self.w + 7}}"))
        return lines

    def _inv(self, t: float) -> float:
        return 10 ** t if self.log else t


def side_by_side(panels: Sequence[list[Text]], gap: int = 3) -> Text:
    """Panels (lists of lines) next to each other, padded to each panel's widest line."""
    widths = [max(len(line) for line in p) for p in panels]
    out = Text()
    for r in range(max(len(p) for p in panels)):
        for k, p in enumerate(panels):
            line = p[r].copy() if r < len(p) else Text()
            line.pad_right(widths[k] - len(line) + (gap if k < len(panels) - 1 else 0))
            out.append_text(line)
        out.append("\n")
    return out


def bars(rows: Sequence[tuple[str, float, str]], width: int = 40, style_of=None,
         top: float | None = None) -> Text:
    """Horizontal bars, one per (label, value, value text), scaled to ``top`` (default: the
    largest value)."""
    top = top or max((v for _, v, _ in rows), default=0) or 1.0
    lw = max((len(lab) for lab, _, _ in rows), default=0)
    out = Text()
    for lab, v, s in rows:
        n = max(int(round(width * v / top)), 1 if v > 0 else 0)
        out.append(f"  {lab:<{lw}} ")
        out.append("█" * n, style=(style_of(lab) if style_of else None))
        out.append(f"{' ' * (width - n)} {s}\n")
    return out


def legend(names: Iterable[str], glyph_of=None) -> Text:
    """One line naming each series in its colour (and glyph, for the scatters)."""
    out = Text("  ")
    for n in names:
        g = glyph_of(n) if glyph_of else "█"
        out.append(f"{g} {n}", style=TERM_STYLES.get(n))
        out.append("   ")
    return out
