"""Readers' access to the ledger: the read-only opener hacct uses, and per-user extracts.

Where Slurm's PrivateData hides other users' jobs, the site keeps the main SQLite file private
and ``horus-admin sync`` writes each user an extract of their own jobs rows beside it
(users/<user>.db); ``open_reader`` opens the ledger if the user may read it, else their extract.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from slurm_horus.ledger.db import default_url, sqlite_file, upsert
from slurm_horus.ledger.report import only_own_colocated
from slurm_horus.ledger.schema import tables
from slurm_horus.ledger.store import Ledger
from slurm_horus.textfile import create_site_dirs


def user_extract(url: str | None, user: str) -> Path | None:
    """Where ``horus-admin sync`` puts ``user``'s extract of a SQLite ledger: users/<user>.db
    beside it (None for a server ledger or a name that is no plain file name)."""
    path = sqlite_file(url or default_url())
    if path is None or not user or "/" in user or user.startswith("."):
        return None
    return path.parent / "users" / f"{user}.db"


def open_reader(url: str | None = None, user: str | None = None) -> Ledger:
    """The ledger for a reader (hacct): read-only, and where the site keeps the main SQLite file
    private (0640 root:root), the user's own extract instead."""
    url = url or default_url()
    path = sqlite_file(url)
    if path is not None and path.exists() and not os.access(path, os.R_OK):
        ext = user_extract(url, user or current_user())
        if ext is not None and ext.exists() and os.access(ext, os.R_OK):
            return Ledger(f"sqlite:///{ext}", readonly=True)
    return Ledger(url, readonly=True)


def current_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def write_user_extracts(ledger: Ledger, folder: str | os.PathLike) -> dict:
    """Per-user SQLite extracts for sites where Slurm's PrivateData hides others' jobs:
    ``<folder>/<user>.db``, the ledger schema with only that user's jobs rows, owned by the
    user, mode 0400 (a site's users often share one primary group, so a group-readable extract
    showed everyone's jobs to everyone), each replaced atomically. Users unknown to this host
    or with names that are not file names are skipped.
    Returns {"written": n, "skipped": [names]}."""
    from sqlalchemy import select

    folder = Path(folder)
    create_site_dirs(folder)
    j = tables()["jobs"]
    with ledger.engine.connect() as conn:
        users = sorted(r[0] for r in conn.execute(select(j.c.user_name).distinct())
                       if r[0] is not None)
    written, skipped = 0, []
    for user in users:
        try:
            uid, gid = pwd.getpwnam(user)[2:4]
        except KeyError:
            uid = gid = None
        if uid is None or "/" in user or user.startswith("."):
            skipped.append(user)
            continue
        tmp = folder / f".{user}.db.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)  # left by a crashed run of this pid
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if os.geteuid() == 0:
                os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
        try:
            ext = Ledger(f"sqlite:///{tmp}", replay=False)
            try:
                with ledger.engine.connect() as src, ext.engine.begin() as dst:
                    rows = [r._asdict() for r in src.execute(select(j).where(j.c.user_name == user))]
                    own = {(r["cluster"], r["job_id"]) for r in rows}
                    upsert(dst, j, list(only_own_colocated(rows, own)), ("cluster", "job_id"))
            finally:
                ext.close()
            os.chmod(tmp, 0o400)  # after the copy: only root writes past the mode bits
            os.replace(tmp, folder / f"{user}.db")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        written += 1
    return {"written": written, "skipped": skipped}
