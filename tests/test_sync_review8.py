"""horus-admin sync, review 8: what an explicit -S/-E window does to the next default one."""

from __future__ import annotations

import time

from slurm_horus.ledger import Ledger
from slurm_horus.ledger import sync as sync_mod
from slurm_horus.slurm import commands as slurm


def test_a_window_after_a_gap_does_not_move_the_default_window_past_the_gap(tmp_path, monkeypatch):
    """A sync -S/-E of a window that starts after the last sync's end read that window alone,
    yet set the last sync to its end: the next default sync started there, and the jobs that
    ended in the gap between them were never asked for."""
    windows = []
    monkeypatch.setattr(slurm, "accounting_jobs", lambda since, until: windows.append((since, until)) or [])
    monkeypatch.setattr(slurm, "accounting_jobs_by_id", lambda ids: [])
    monkeypatch.setattr(slurm, "node_gpu_types", lambda: {})
    monkeypatch.setattr(slurm, "local_cluster", lambda conf=None: "alpha")
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    now = time.time()
    sync_mod.sync(L, since=now - 6 * 3600, until=now - 5 * 3600)
    done = sync_mod.last_sync(L, "alpha")
    sync_mod.sync(L, since=now - 2 * 3600, until=now - 3600)  # a look at a later hour
    assert sync_mod.last_sync(L, "alpha") == done
    # contiguous, window after window (their ends in fractions of a second): it moves on
    sync_mod.sync(L, since=done - 0.5, until=now - 1800.5)
    assert sync_mod.last_sync(L, "alpha") == int(now - 1800.5)
    windows.clear()
    sync_mod.sync(L)  # the default window starts where the contiguous ones ended
    assert windows[0][0] == int(now - 1800.5) - 300
