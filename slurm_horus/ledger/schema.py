"""The ledger's schema: ``sql/schema.sql`` is its one definition.

The DDL and the reporting views are executed from ``sql/schema.sql`` and ``sql/views.sql``, so
what admins read is what runs. The SQLAlchemy tables the code builds its statements from are
reflected from that same file (run once into an in-memory SQLite), so they cannot drift from it.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurm_horus.errors import HorusError

# 6: per-job accuracy terms stored for hacct --summary (ledger.jobs.accuracy_terms).
# 7: what the hook and horus-admin queue did to each job (jobs.hook_action, queue_actions).
SCHEMA_VERSION = 11
KEYS = {"submissions": ("cluster", "job_id"), "usage": ("cluster", "job_id", "source"),
        "jobs": ("cluster", "job_id"), "predictor_versions": ("version",),
        "ledger_state": ("name",)}


def sql_dir() -> Path:
    """Folder holding schema.sql and views.sql ($HORUS_SQL_DIR, else the repository's sql/,
    else the one pip installed, share/slurm-horus/sql: shared_files)."""
    from slurm_horus.shared_files import shared_path

    env = os.environ.get("HORUS_SQL_DIR")
    if env:
        return Path(env)
    found = shared_path("sql", "schema.sql")
    if found is None:
        raise HorusError("ledger: sql/schema.sql not found (set HORUS_SQL_DIR)")
    return found.parent


def schema_text() -> str:
    return (sql_dir() / "schema.sql").read_text()


def views_text() -> str:
    return (sql_dir() / "views.sql").read_text()


def split_sql(text: str) -> list[str]:
    """Statements of a .sql file: `--` comments dropped, split at `;` ending a line."""
    lines = [ln.split("--", 1)[0].rstrip() for ln in text.splitlines()]
    out, cur = [], []
    for ln in lines:
        if not ln.strip():
            continue
        cur.append(ln)
        if ln.endswith(";"):
            stmt = "\n".join(cur).rstrip(";").strip()
            if stmt:
                out.append(stmt)
            cur = []
    if cur and "\n".join(cur).strip():
        out.append("\n".join(cur).strip())
    return out


MYSQL_CHARSET = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"  # any text, compared as SQLite does


def exec_script(conn, text: str) -> None:
    """Run every statement of a .sql text (escaping % for format-paramstyle drivers). On
    MySQL/MariaDB tables are made utf8mb4: a server's default (latin1 before MariaDB 11.6)
    refused a model path in CJK, and that job stopped every sync."""
    pct = conn.dialect.paramstyle in ("format", "pyformat")
    mysql = conn.dialect.name in ("mysql", "mariadb")
    for stmt in split_sql(text):
        if mysql and stmt.lstrip().upper().startswith("CREATE TABLE"):
            stmt = f"{stmt.rstrip().rstrip(';')} {MYSQL_CHARSET}"
        conn.exec_driver_sql(stmt.replace("%", "%%") if pct else stmt)


_TABLES: dict | None = None


def tables() -> dict:
    """{name: sqlalchemy Table} of the newest schema, reflected from schema.sql."""
    global _TABLES
    if _TABLES is None:
        from sqlalchemy import MetaData, create_engine

        md = MetaData()
        engine = create_engine("sqlite://")
        with engine.begin() as conn:
            exec_script(conn, schema_text())
            md.reflect(conn)
        engine.dispose()
        _TABLES = dict(md.tables)
    return _TABLES


def job_fields() -> tuple[str, ...]:
    """The columns of a jobs row besides its key, in schema order."""
    return tuple(c.name for c in tables()["jobs"].columns if c.name not in KEYS["jobs"])
