"""One progress bar for the long admin commands (retrain, calibrate): rich on a terminal,
silent otherwise, so logs and --json output stay clean.

    with Progress("retrain", total=6, enabled=sys.stderr.isatty()) as bar:
        bar.describe("fold 1/5")     # what runs now (optional)
        bar.advance()                # one step done; bar.advance("fold 2/5") also describes
"""

from __future__ import annotations


class Progress:
    """A rich progress bar of ``total`` steps titled ``title``; does nothing when disabled."""

    def __init__(self, title: str, total: int, enabled: bool = True):
        self.title, self.total, self.enabled = title, total, enabled
        self._bar = self._task = None

    def __enter__(self) -> "Progress":
        if self.enabled:
            from rich.progress import (BarColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = RichProgress(TextColumn("{task.description:<36}"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"),
                                     TimeElapsedColumn(), TimeRemainingColumn())
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total)
        return self

    def describe(self, what: str) -> None:
        """Show what the current step is doing."""
        if self._bar:
            self._bar.update(self._task, description=f"{self.title}: {what}")

    def advance(self, what: str | None = None) -> None:
        """One step done (and, with ``what``, the description of the next)."""
        if self._bar:
            if what is not None:
                self.describe(what)
            self._bar.update(self._task, advance=1)

    def __exit__(self, *exc) -> None:
        if self._bar:
            self._bar.__exit__(*exc)
            self._bar = None
