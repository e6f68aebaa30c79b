"""Readers' access to the ledger: the read-only opener hacct uses, and what sync publishes for it.

Users never open the live SQLite file: one holding a read transaction on it stopped every
write (sync, the probe) until they let go. It is root's alone (0640), and after each sync
``publish`` writes readers a copy: a full snapshot beside it (``<ledger>.readers``) where jobs
are not private, else each user an extract of their own jobs rows (users/<user>.db). A reader
holding either open blocks nothing: the next copy replaces it in one rename.  Each is written
to a temp file beside it (and SQLite's ``-journal`` of that), removed where the write fails, and
those a killed sync left are removed by the next (remove_stale_temps).
"""

from __future__ import annotations

import glob
import os
import pwd
import sqlite3
import tempfile
from pathlib import Path

from slurm_horus.errors import HorusError
from slurm_horus.ledger.db import (BUSY_TIMEOUT_S, REFRESH_ADVICE, default_url, failure_reason,
                                   sqlite_file, upsert)
from slurm_horus.ledger.report import only_own_colocated
from slurm_horus.ledger.schema import tables
from slurm_horus.ledger.store import Ledger
from slurm_horus.textfile import own_dir, remove_stale_temps


def readers_copy(path: Path) -> Path:
    """The snapshot readers open where jobs are not private: ``<ledger>.readers`` beside it
    (never under users/, where an extract takes any user's name)."""
    return path.with_name(path.name + ".readers")


# in users/ beside the extracts: the schema with no jobs, for a user with none (yet) at a site
# where jobs are private; no user name starts with "."
NO_JOBS = ".no-jobs.db"


def user_extract(url: str | None, user: str) -> Path | None:
    """Where ``horus-admin sync`` puts ``user``'s extract of a SQLite ledger: users/<user>.db
    beside it (None for a server ledger or a name that is no plain file name)."""
    path = sqlite_file(url or default_url())
    if path is None or not user or "/" in user or user.startswith("."):
        return None
    return path.parent / "users" / f"{user}.db"


def open_reader(url: str | None = None, user: str | None = None) -> Ledger:
    """The ledger for a reader (hacct), read-only: a server's, or the live SQLite file for root
    and those who may write it; anyone else the copy the last sync published (the snapshot,
    else their own extract), and the file itself only where it is readable to them and no copy
    is (a copy named itself, or a ledger from before the copies until a sync)."""
    url = url or default_url()
    path = sqlite_file(url)
    if path is None or os.geteuid() == 0 or os.access(path, os.W_OK):
        return Ledger(url, readonly=True)
    mine = user_extract(url, user or current_user())
    # a user with no jobs rows has no extract of their own: the empty one, as sacct shows none;
    # never where theirs exists (unreadable: an admin's sync that could not give it to them) or
    # they are no file name
    none = path.parent / "users" / NO_JOBS if mine is not None and not mine.exists() else None
    for copy in (readers_copy(path), mine, none):
        if copy is not None and copy.is_file() and os.access(copy, os.R_OK):
            return Ledger(f"sqlite:///{copy}", readonly=True)
    if path.is_file() and os.access(path, os.R_OK):
        # a copy named itself, or a ledger of before the copies (0644) until a sync publishes one
        return Ledger(url, readonly=True)
    raise HorusError(f"ledger {path}: no copy for readers yet ({readers_copy(path).name}, or "
                     f"users/<you>.db where jobs are private); {REFRESH_ADVICE}, which writes it")


def write_readers_copy(db: Path) -> Path:
    """Snapshot the live SQLite ledger ``db`` for readers (sqlite3's backup API, one read
    transaction): a root-owned temp file beside it, synced, made 0644, then renamed over the
    last one, which readers still holding it keep reading.  HorusError where it cannot be
    written (a full disk: the last copy stands)."""
    dest = readers_copy(db)
    remove_stale_temps(db.parent, f".{glob.escape(dest.name)}.*.tmp*")
    try:
        fd, tmp = tempfile.mkstemp(dir=db.parent, prefix=f".{dest.name}.", suffix=".tmp")
        os.close(fd)
        try:
            # not mode=ro: a crashed writer's hot journal needs rolling back before a read
            src = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
            try:
                dst = sqlite3.connect(tmp)
                try:
                    src.backup(dst)
                finally:
                    dst.close()
            finally:
                src.close()
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.fchmod(fd, 0o644)
            finally:
                os.close(fd)
            os.replace(tmp, dest)
        except BaseException:
            _discard(Path(tmp))
            raise
    except (OSError, sqlite3.Error) as e:
        raise HorusError(f"the readers' copy {dest} was not refreshed ({failure_reason(e)})") from None
    return dest


def _discard(tmp: Path) -> None:
    """Remove a SQLite temp file and the rollback journal a failed write left beside it."""
    for path in (tmp, tmp.with_name(tmp.name + "-journal")):
        path.unlink(missing_ok=True)


def current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def write_user_extracts(ledger: Ledger, folder: str | os.PathLike) -> dict:
    """Per-user SQLite extracts for sites where Slurm's PrivateData hides others' jobs:
    ``<folder>/<user>.db``, the ledger schema with only that user's jobs rows, owned by the
    user, mode 0400 (a site's users often share one primary group, so a group-readable extract
    showed everyone's jobs to everyone), each replaced atomically, in a folder of root's (own_dir)
    of mode 0711; the extracts of users no longer known here are removed. Users unknown to this host
    or with names that are not file names are skipped.  NO_JOBS, the schema without rows (0444),
    serves a user with none (hacct had told them to ask for a sync, which never wrote one).
    Returns {"written": n, "skipped": [names]}."""
    from sqlalchemy import select

    folder = Path(folder)
    own_dir(folder, 0o711)  # each user opens their own extract; nobody lists whose there are
    remove_stale_temps(folder, ".*.tmp*")
    j = tables()["jobs"]
    with ledger.engine.connect() as conn:
        users = sorted(r[0] for r in conn.execute(select(j.c.user_name).distinct())
                       if r[0] is not None)
    _write_extract(ledger, folder, NO_JOBS, None, None, None)
    written, skipped, kept = 0, [], set()
    for user in users:
        try:
            uid, gid = pwd.getpwnam(user)[2:4]
        except KeyError:
            uid = gid = None
        if uid is None or "/" in user or user.startswith("."):
            skipped.append(user)
            continue
        _write_extract(ledger, folder, f"{user}.db", user, uid, gid)
        written += 1
        kept.add(f"{user}.db")
    for old in os.listdir(folder):  # a user gone: their uid may be someone else's next
        if old.endswith(".db") and not old.startswith(".") and old not in kept:
            (folder / old).unlink(missing_ok=True)
    return {"written": written, "skipped": skipped}


def _write_extract(ledger: Ledger, folder: Path, name: str, user: str | None, uid: int | None,
                   gid: int | None) -> None:
    """``folder/name``: the ledger schema with ``user``'s jobs rows (None: none; then 0444 and
    root's), root's (0600) until complete, then 0400 and the user's, replaced atomically;
    HorusError where it cannot be written (a full disk: the last one stands)."""
    from sqlalchemy import select
    from sqlalchemy.exc import DBAPIError

    j = tables()["jobs"]
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    try:
        # left by a crashed run of this pid, its journal too: SQLite would roll that into the new file
        _discard(tmp)
        # root's (0600) until complete: given to the user first, it was theirs to lock or write
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            ext = Ledger(f"sqlite:///{tmp}", replay=False)
            try:
                if user is not None:
                    with ledger.engine.connect() as src, ext.engine.begin() as dst:
                        rows = [r._asdict() for r in src.execute(select(j).where(j.c.user_name == user))]
                        own = {(r["cluster"], r["job_id"]) for r in rows}
                        upsert(dst, j, list(only_own_colocated(rows, own)), ("cluster", "job_id"))
            finally:
                ext.close()
            os.chmod(tmp, 0o444 if user is None else 0o400)  # before it is theirs: never writable by them
            if user is not None and os.geteuid() == 0:
                os.chown(tmp, uid, gid)
            os.replace(tmp, folder / name)
        except BaseException:
            _discard(tmp)
            raise
    except (OSError, sqlite3.Error, DBAPIError) as e:
        raise HorusError(f"the user extract {folder / name} was not refreshed "
                         f"({failure_reason(e)})") from None
