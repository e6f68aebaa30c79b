"""The ledger's database connection: URLs, engines with timeouts, file permissions, upserts.

SQLite by default, root's alone (users read the copy each sync publishes: extracts.py), opened
with a rollback journal (so that readers of a file, opened ``mode=ro``, need only read access)
and ``BEGIN IMMEDIATE`` (writers queue on the busy timeout); MariaDB/MySQL via
``mysql+pymysql://...`` (the schema's DDL is written for these two; other servers are refused).
Every server connection has connect and read timeouts
(``db_timeout``): a server that accepts TCP and never answers must not hang a command.

sqlalchemy is imported inside the functions: horus-probe imports this package in every job's
Prolog, which must not pay for it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from slurm_horus.errors import HorusError
from slurm_horus.textfile import create_site_dirs

ENV_URL = "HORUS_LEDGER_URL"
ENV_DB_TIMEOUT = "HORUS_DB_TIMEOUT"
DEFAULT_URL = "sqlite:////var/lib/slurm-horus/ledger.db"
BUSY_TIMEOUT_S = 30.0
DB_TIMEOUT_S = 10.0
REFRESH_ADVICE = "ask an admin to run horus-admin sync"


def failure_reason(e: Exception) -> str:
    """What the system or the database said, in a few words (its first line, at most 200
    characters): under SQLAlchemy's wrapper, whose own text adds the statement and its
    parameters, SQLite's (or the server's) message; the wrapper's type where it wraps none."""
    if hasattr(e, "orig"):
        if e.orig is None:
            return type(e).__name__
        e = e.orig
    text = str(getattr(e, "strerror", None) or e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:200]


def default_url() -> str:
    """$HORUS_LEDGER_URL, else ``ledger_url`` in the site's horus.conf, else the SQLite file."""
    from slurm_horus.siteconf import site_setting

    return os.environ.get(ENV_URL) or site_setting("ledger_url") or DEFAULT_URL


def db_timeout() -> float:
    """Seconds a database server may take to connect or answer ($HORUS_DB_TIMEOUT, default 10)."""
    try:
        t = float(os.environ.get(ENV_DB_TIMEOUT) or DB_TIMEOUT_S)
    except ValueError:
        t = DB_TIMEOUT_S
    return t if 0 < t <= 3600 else DB_TIMEOUT_S  # drivers refuse longer waits (and inf, nan)


def mask_url(url: str) -> str:
    """The URL without its password, for messages; one SQLAlchemy cannot parse (a mistyped
    port) without anything between ``://`` and its last ``@``."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"://.*@", "://***@", str(url), flags=re.S)


def sqlite_file(url: str) -> Path | None:
    """The file of a sqlite:/// URL (None for servers and in-memory databases)."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:" \
            or u.database.startswith("file:"):
        return None
    return Path(u.database).expanduser()


def _create_site_file(path: Path) -> None:
    """Create the ledger's folders 0755 (users reach the copies published beside it) and its
    file 0640 whatever the umask: a user who could read it could hold a read transaction and
    stop every write. Existing ones keep the mode the admin gave them."""
    create_site_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o640)
    finally:
        os.close(fd)


def _sqlite_functions(dbapi_conn) -> None:
    """ln() for the views where SQLite was built without its math functions."""
    try:
        dbapi_conn.execute("SELECT ln(1)")
    except Exception:
        import math

        dbapi_conn.create_function(
            "ln", 1, lambda x: math.log(x) if x is not None and x > 0 else None,
            deterministic=True)


def make_engine(url: str, busy_timeout: float, readonly: bool = False):
    """An engine for ``url``; a missing SQLite file is created 0640 (not when ``readonly``)."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    try:
        u = make_url(url)
    except Exception:
        raise HorusError(f"ledger: not a database URL: {mask_url(url)!r}") from None
    if u.get_backend_name() == "sqlite":
        path = sqlite_file(url)
        if readonly and path is not None:
            return _readonly_sqlite(path, busy_timeout)
        if path is not None:
            if not path.is_absolute():
                # sqlite:///var/lib/... is var/lib/... under the current folder: a ledger nobody
                # else finds (the site's path takes four slashes)
                raise HorusError(f"ledger {url}: a relative path; give the absolute one "
                                 f"(sqlite:////{str(path).lstrip('/')})")
            _create_site_file(path)
        engine = create_engine(u, poolclass=NullPool,
                               connect_args={"timeout": busy_timeout, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _rec):
            cur = dbapi_conn.cursor()
            # a rollback journal, not WAL: WAL readers need write access to -shm.  Tried without
            # waiting (the next connection tries again): it waits for a lock another writer may
            # hold, and an open had waited the busy timeout twice, here and at BEGIN IMMEDIATE
            cur.execute("PRAGMA busy_timeout = 0")
            try:
                cur.execute("PRAGMA journal_mode = DELETE")
            except Exception:
                pass
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            cur.execute("PRAGMA synchronous = FULL")
            cur.close()
            _sqlite_functions(dbapi_conn)

        @event.listens_for(engine, "begin")
        def _begin(conn):
            # BEGIN IMMEDIATE: take the write lock up front so writers queue on the busy timeout
            # instead of failing on a read-to-write upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        return engine
    if u.get_backend_name() not in ("mysql", "mariadb"):
        raise HorusError(f"ledger: {u.get_backend_name()} is not supported (SQLite or "
                         "MariaDB/MySQL: sql/schema.sql is written for those)")
    t = db_timeout()
    kwargs: dict = {"pool_pre_ping": True,
                    "connect_args": {"connect_timeout": max(1, int(round(t))), "read_timeout": t,
                                     "write_timeout": t}}
    try:
        return create_engine(u, **kwargs)
    except ModuleNotFoundError as e:
        raise HorusError(f"ledger: database driver missing for {u.drivername} ({e.name}); "
                         "for MariaDB: pip install pymysql") from None
    except Exception as e:  # e.g. NoSuchModuleError for an unknown dialect
        raise HorusError(f"ledger: cannot use database URL {mask_url(url)} "
                         f"({type(e).__name__})") from None


def _readonly_sqlite(path: Path, busy_timeout: float):
    """A SQLite ledger opened ``mode=ro``: works with read permission alone, never writes."""
    import sqlite3
    from urllib.parse import quote

    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    if not path.exists():
        raise HorusError(f"ledger {path}: not found; {REFRESH_ADVICE}")
    if not os.access(path, os.R_OK):
        raise HorusError(f"ledger {path}: not readable by you; {REFRESH_ADVICE}")
    if not path.is_file():  # a FIFO would hang SQLite's open, a folder fail obscurely
        raise HorusError(f"ledger {path}: not a regular file")
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"

    def connect():
        con = sqlite3.connect(uri, uri=True, timeout=busy_timeout, check_same_thread=False)
        _sqlite_functions(con)
        return con
    return create_engine("sqlite://", creator=connect, poolclass=NullPool)


def _within_lengths(table, rows: list[dict]) -> list[dict]:
    """The rows with each text cut to its column's length (VARCHAR(n)): MariaDB refuses a
    longer one, and with it the whole batch (a sync then failed at every run on one
    multi-node job's node list), where SQLite keeps any length."""
    limits = {c.name: c.type.length for c in table.columns if getattr(c.type, "length", None)}
    out = []
    for r in rows:
        long = [k for k, v in r.items() if isinstance(v, str) and k in limits and len(v) > limits[k]]
        out.append({**r, **{k: r[k][:limits[k]] for k in long}} if long else r)
    return out


def upsert(conn, table, rows: list[dict], keys: tuple[str, ...]) -> None:
    """INSERT ... ON CONFLICT/DUPLICATE KEY UPDATE for SQLite and MariaDB/MySQL:
    writing a record twice replaces it, so replays and re-syncs count nothing twice."""
    if not rows:
        return
    rows = _within_lengths(table, rows)
    name = conn.dialect.name
    cols = list(rows[0].keys())
    upd = [c for c in cols if c not in keys]
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        stmt = insert(table)
        stmt = (stmt.on_conflict_do_update(index_elements=list(keys),
                                           set_={c: stmt.excluded[c] for c in upd})
                if upd else stmt.on_conflict_do_nothing(index_elements=list(keys)))
    else:  # MariaDB/MySQL: the only servers make_engine opens
        from sqlalchemy.dialects.mysql import insert

        stmt = insert(table)
        stmt = stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in (upd or cols[:1])})
    for i in range(0, len(rows), 5000):
        conn.execute(stmt, rows[i:i + 5000])
