"""Stage 5: the ledger, where predictions meet measured use.

SQLAlchemy Core over any database URL: SQLite by default (rollback journal, so that users who
may only read the file can), MariaDB/MySQL via ``mysql+pymysql://...``. The DDL lives in
``sql/schema.sql`` and the reporting views in ``sql/views.sql``; both are executed from those
files, so what admins read is what is tested.

Only the site writes the ledger: ``horus-admin sync`` (from sacct) and horus-probe run as root.
Users read it (``Ledger(url, readonly=True)``). The probe's writes never raise:
``record_usage_safely`` falls back to a root-only spool (one JSON file per record, written
atomically) that the next write or ``horus-admin sync`` replays. Every write is an upsert keyed
by (cluster, job id[, source]), so replaying twice, or syncing the same window again, counts
nothing twice. Every connection has connect and read timeouts (``db_timeout``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from slurm_horus.errors import HorusError

ENV_URL = "HORUS_LEDGER_URL"
ENV_SPOOL = "HORUS_SPOOL"
ENV_DB_TIMEOUT = "HORUS_DB_TIMEOUT"
DEFAULT_URL = "sqlite:////var/lib/slurm-horus/ledger.db"
DEFAULT_SPOOL = "/var/spool/slurm-horus"
SCHEMA_VERSION = 5
SOURCES = ("sacct", "probe", "import")
# Which measurement wins for utilization/memory, and for placement facts (node, state, ...).
UTIL_ORDER = ("probe", "sacct", "import")
PLACE_ORDER = ("sacct", "probe", "import")
# Measurements users cannot forge: Slurm's accounting and the probe slurmd starts as root.
TRUSTED_ORDER = ("probe", "sacct")
BUSY_TIMEOUT_S = 30.0
DB_TIMEOUT_S = 10.0
# Under-claim audit: measured use above the claim by more than noise (design: issue 10).
UNDERCLAIM_MEM = (1.10, 256.0)   # act_mem_mib > claimed mem_p90 * 1.10 + 256
UNDERCLAIM_UTIL = (1.25, 10.0)   # act_util_pct > claimed util * 1.25 + 10
REFRESH_ADVICE = "ask an admin to run horus-admin sync"
# A GPU job that never used its GPU is a failed measurement (docs/definitions.md): utilization
# exactly 0 with memory unknown or at most a bare CUDA context (the hook's min_mem_mib floor).
BARE_CONTEXT_MIB = 512.0

USAGE_FIELDS = ("util_mean", "util_max", "mem_peak_mib", "elapsed_s", "state", "node", "gpu_type",
                "gpu_index", "gpus", "shards", "colocated", "start_time", "end_time")
JOB_FIELDS = ("has_submission", "user_name", "account", "submit_time", "model_family", "predictor",
              "gpu_type", "gpu_index", "node", "gpus", "shards", "state", "elapsed_s",
              "start_time", "end_time", "pred_util_pct", "pred_mem_mib", "pred_mem_p90_mib",
              "act_util_pct", "act_util_max", "act_mem_mib", "colocated", "sources",
              "mem_err_bucket", "under_claim", "claim_flags", "failed_measurement")


def sql_dir() -> Path:
    """Folder holding schema.sql and views.sql ($HORUS_SQL_DIR, else the repository's sql/)."""
    env = os.environ.get("HORUS_SQL_DIR")
    if env:
        return Path(env)
    for cand in (Path(__file__).resolve().parents[1] / "sql",
                 Path(__file__).resolve().parents[2] / "sql",
                 Path(sys.prefix) / "share" / "slurm-horus" / "sql"):
        if (cand / "schema.sql").is_file():
            return cand
    raise HorusError("ledger: sql/schema.sql not found (set HORUS_SQL_DIR)")


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


def exec_script(conn, text: str) -> None:
    """Run every statement of a .sql text (escaping % for format-paramstyle drivers)."""
    pct = conn.dialect.paramstyle in ("format", "pyformat")
    for stmt in split_sql(text):
        conn.exec_driver_sql(stmt.replace("%", "%%") if pct else stmt)


def default_url() -> str:
    return os.environ.get(ENV_URL) or DEFAULT_URL


def spool_dir() -> Path:
    """$HORUS_SPOOL, else the root-only /var/spool/slurm-horus."""
    return Path(os.environ.get(ENV_SPOOL) or DEFAULT_SPOOL)


def db_timeout() -> float:
    """Seconds a database server may take to connect or answer ($HORUS_DB_TIMEOUT, default 10):
    a server that accepts TCP and never answers must not hang a command."""
    try:
        t = float(os.environ.get(ENV_DB_TIMEOUT) or DB_TIMEOUT_S)
    except ValueError:
        t = DB_TIMEOUT_S
    return t if t > 0 else DB_TIMEOUT_S


def mask_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<ledger url>"


# --------------------------------------------------------------------------- tables (Core)

def _tables():
    from sqlalchemy import (BigInteger, Column, Float, Integer, MetaData, String, Table, Text)

    md = MetaData()
    t = {}
    t["schema_version"] = Table("schema_version", md, Column("version", Integer, primary_key=True),
                                Column("applied", BigInteger))
    t["submissions"] = Table(
        "submissions", md,
        Column("cluster", String(64), primary_key=True), Column("job_id", BigInteger, primary_key=True),
        Column("user_name", String(64)), Column("account", String(64)),
        Column("submit_time", BigInteger), Column("model_path", Text),
        Column("model_sha256", String(64)), Column("model_family", String(64)),
        Column("feature_version", Integer), Column("features", Text), Column("workload", Text),
        Column("gpu_types", Text), Column("predictions", Text), Column("hint", Text),
        Column("policy_decision", Text), Column("predictor", String(64)),
        Column("uid", BigInteger))
    t["usage"] = Table(
        "usage", md,
        Column("cluster", String(64), primary_key=True), Column("job_id", BigInteger, primary_key=True),
        Column("source", String(16), primary_key=True),
        Column("util_mean", Float), Column("util_max", Float), Column("mem_peak_mib", Float),
        Column("elapsed_s", BigInteger), Column("state", String(32)), Column("node", String(128)),
        Column("gpu_type", String(64)), Column("gpu_index", Integer), Column("shards", Integer),
        Column("colocated", Text), Column("start_time", BigInteger), Column("end_time", BigInteger),
        Column("recorded", BigInteger), Column("gpus", Integer))
    t["predictor_versions"] = Table(
        "predictor_versions", md, Column("version", String(32), primary_key=True),
        Column("created", BigInteger), Column("metrics", Text), Column("n_rows", Integer),
        Column("promoted", Integer))
    t["jobs"] = Table(
        "jobs", md,
        Column("cluster", String(64), primary_key=True), Column("job_id", BigInteger, primary_key=True),
        Column("has_submission", Integer), Column("user_name", String(64)),
        Column("account", String(64)), Column("submit_time", BigInteger),
        Column("model_family", String(64)), Column("predictor", String(64)),
        Column("gpu_type", String(64)), Column("gpu_index", Integer), Column("node", String(128)),
        Column("shards", Integer), Column("state", String(32)), Column("elapsed_s", BigInteger),
        Column("start_time", BigInteger), Column("end_time", BigInteger),
        Column("pred_util_pct", Float), Column("pred_mem_mib", Float),
        Column("act_util_pct", Float), Column("act_util_max", Float), Column("act_mem_mib", Float),
        Column("colocated", Text), Column("sources", String(64)),
        Column("mem_err_bucket", Integer), Column("gpus", Integer),
        Column("pred_mem_p90_mib", Float), Column("under_claim", Integer),
        Column("claim_flags", String(16)), Column("failed_measurement", Integer))
    t["ledger_state"] = Table("ledger_state", md, Column("name", String(64), primary_key=True),
                              Column("value", Text))
    return md, t


_TABLES = None


def tables() -> dict:
    global _TABLES
    if _TABLES is None:
        _TABLES = _tables()
    return _TABLES[1]


# --------------------------------------------------------------------------- migrations

# Each step only adds what its version lacks to tables that exist; missing tables, indices and
# the jobs rows come from schema.sql and refresh_jobs once all steps ran (_finish_migration),
# so that the Core tables, which describe the newest version, are only used on a complete schema.

def _add_columns(conn, table: str, cols: dict[str, str]) -> None:
    from sqlalchemy import inspect

    if table not in inspect(conn).get_table_names():
        return
    have = _columns(conn, table)
    for name, typ in cols.items():
        if name not in have:
            conn.exec_driver_sql(f"ALTER TABLE `{table}` ADD COLUMN {name} {typ}")


def _migrate_1_to_2(conn) -> None:
    """v1 had no placement columns in usage and no jobs/ledger_state tables."""
    _add_columns(conn, "usage", {"gpu_index": "INTEGER", "shards": "INTEGER", "colocated": "TEXT",
                                 "start_time": "BIGINT", "end_time": "BIGINT",
                                 "recorded": "BIGINT"})
    _add_columns(conn, "predictor_versions", {"promoted": "INTEGER NOT NULL DEFAULT 0"})


def _migrate_2_to_3(conn) -> None:
    """v3 stores each job's memory-error histogram bin, so hacct --summary reads an index."""
    _add_columns(conn, "jobs", {"mem_err_bucket": "INTEGER"})


def _migrate_3_to_4(conn) -> None:
    """v4: whole GPUs apart from shards, the under-claim audit, the job owner's uid."""
    _add_columns(conn, "usage", {"gpus": "INTEGER"})
    _add_columns(conn, "jobs", {"gpus": "INTEGER", "pred_mem_p90_mib": "DOUBLE PRECISION",
                                "under_claim": "INTEGER", "claim_flags": "VARCHAR(16)"})
    _add_columns(conn, "submissions", {"uid": "BIGINT"})
    # the summary's covering index now holds under_claim (ix_jobs_summary in schema.sql)
    if conn.dialect.name in ("mysql", "mariadb"):
        if "ix_jobs_accuracy" in {i["name"] for i in _indexes(conn, "jobs")}:
            conn.exec_driver_sql("DROP INDEX ix_jobs_accuracy ON jobs")
    else:
        conn.exec_driver_sql("DROP INDEX IF EXISTS ix_jobs_accuracy")


def _finish_migration(conn) -> None:
    """New tables and indices, then every jobs row merged again under the new rules."""
    exec_script(conn, (sql_dir() / "schema.sql").read_text())
    keys = [(r[0], r[1]) for r in conn.exec_driver_sql(
        "SELECT cluster, job_id FROM submissions UNION SELECT cluster, job_id FROM `usage`")]
    refresh_jobs(conn, keys)


def _migrate_4_to_5(conn) -> None:
    """v5 flags failed measurements; the summary's covering index gains the flag and the p90."""
    _add_columns(conn, "jobs", {"failed_measurement": "INTEGER"})
    if conn.dialect.name in ("mysql", "mariadb"):
        if "ix_jobs_summary" in {i["name"] for i in _indexes(conn, "jobs")}:
            conn.exec_driver_sql("DROP INDEX ix_jobs_summary ON jobs")
    else:
        conn.exec_driver_sql("DROP INDEX IF EXISTS ix_jobs_summary")


MIGRATIONS = {2: _migrate_1_to_2, 3: _migrate_2_to_3, 4: _migrate_3_to_4, 5: _migrate_4_to_5}


def failed_measurement(act_util, act_mem) -> int | None:
    """1 when a measurement shows a job that never used its GPU (utilization exactly 0, memory
    unknown or at most BARE_CONTEXT_MIB), 0 for a usable one, None when nothing was measured.
    Flagged rows stay in the ledger but count in no accuracy figure and train nothing."""
    if act_util is None and act_mem is None:
        return None
    if act_util is not None and float(act_util) == 0.0 and \
            (act_mem is None or float(act_mem) <= BARE_CONTEXT_MIB):
        return 1
    return 0


def under_claim(claim_util, claim_mem_p90, act_util, act_mem) -> tuple[int | None, str | None]:
    """(1, flags) when trusted measured use exceeds the claim beyond noise, (0, None) when it
    does not, (None, None) when there is no claim or no measurement to compare."""
    flags, compared = [], False
    if claim_mem_p90 is not None and act_mem is not None:
        compared = True
        if act_mem > claim_mem_p90 * UNDERCLAIM_MEM[0] + UNDERCLAIM_MEM[1]:
            flags.append("mem")
    if claim_util is not None and act_util is not None:
        compared = True
        if act_util > claim_util * UNDERCLAIM_UTIL[0] + UNDERCLAIM_UTIL[1]:
            flags.append("util")
    if not compared:
        return None, None
    return (1, ",".join(flags)) if flags else (0, None)


def mem_err_bucket(pred_mem_mib, act_mem_mib) -> int:
    """Histogram bin of |predicted - actual| / actual memory: 0.5 % bins below 100 %, 10 % bins
    to 1000 %, one bin above; -1 where either value is missing."""
    if not pred_mem_mib or not act_mem_mib or pred_mem_mib <= 0 or act_mem_mib <= 0:
        return -1
    rel = abs(pred_mem_mib - act_mem_mib) / act_mem_mib
    if rel < 1.0:
        return int(rel * 200)
    if rel < 10.0:
        return 200 + int((rel - 1.0) * 10)
    return 290


def mem_err_bucket_bounds(b: int) -> tuple[float, float]:
    """The relative-error interval a mem_err_bucket bin stands for (its inverse)."""
    if b < 200:
        return b / 200, (b + 1) / 200
    if b < 290:
        return 1.0 + (b - 200) / 10, 1.0 + (b - 199) / 10
    return 10.0, 10.0


def _columns(conn, table: str) -> set[str]:
    from sqlalchemy import inspect

    return {c["name"] for c in inspect(conn).get_columns(table)}


def _indexes(conn, table: str) -> list[dict]:
    from sqlalchemy import inspect

    return inspect(conn).get_indexes(table)


# --------------------------------------------------------------------------- upsert helper

def upsert(conn, table, rows: list[dict], keys: tuple[str, ...]) -> None:
    """INSERT ... ON CONFLICT/DUPLICATE KEY UPDATE for SQLite, MariaDB/MySQL and PostgreSQL."""
    if not rows:
        return
    name = conn.dialect.name
    cols = list(rows[0].keys())
    upd = [c for c in cols if c not in keys]
    if name == "sqlite" or name == "postgresql":
        if name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        stmt = insert(table)
        stmt = (stmt.on_conflict_do_update(index_elements=list(keys),
                                           set_={c: stmt.excluded[c] for c in upd})
                if upd else stmt.on_conflict_do_nothing(index_elements=list(keys)))
    elif name in ("mysql", "mariadb"):
        from sqlalchemy.dialects.mysql import insert

        stmt = insert(table)
        stmt = stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in (upd or cols[:1])})
    else:  # generic: delete + insert
        from sqlalchemy import and_, delete

        for r in rows:
            conn.execute(delete(table).where(and_(*(table.c[k] == r[k] for k in keys))))
        conn.execute(table.insert(), rows)
        return
    for i in range(0, len(rows), 5000):
        conn.execute(stmt, rows[i:i + 5000])


# --------------------------------------------------------------------------- jobs (merged view)

def _loads(s, default=None):
    if s is None or s == "":
        return default
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return default


def merge_job(sub: dict | None, usages: dict[str, dict]) -> dict:
    """One jobs row from a submission row (or None) and usage rows by source."""
    def first(field, order):
        for src in order:
            u = usages.get(src)
            if u is not None and u.get(field) is not None:
                return u[field]
        return None

    row = {f: None for f in JOB_FIELDS}
    row["has_submission"] = 1 if sub else 0
    preds = {}
    if sub:
        for f in ("user_name", "account", "submit_time", "model_family", "predictor"):
            row[f] = sub.get(f)
        preds = _loads(sub.get("predictions"), {}) or {}
    for f in ("gpu_type", "gpu_index", "node", "gpus", "shards", "state", "elapsed_s",
              "start_time", "end_time", "colocated"):
        row[f] = first(f, PLACE_ORDER)
    row["act_util_pct"] = first("util_mean", UTIL_ORDER)
    row["act_util_max"] = first("util_max", UTIL_ORDER)
    row["act_mem_mib"] = first("mem_peak_mib", UTIL_ORDER)
    if row["gpu_type"] is None and isinstance(preds, dict) and len(preds) == 1:
        row["gpu_type"] = next(iter(preds))
    p = preds.get(row["gpu_type"]) if isinstance(preds, dict) and row["gpu_type"] else None
    if isinstance(p, dict):
        row["pred_util_pct"] = p.get("util_pct")
        row["pred_mem_mib"] = p.get("mem_mib")
        row["pred_mem_p90_mib"] = p.get("mem_mib_p90")
        if not row["predictor"]:
            row["predictor"] = p.get("predictor")
    row["sources"] = ",".join(s for s in SOURCES if s in usages) or None
    row["failed_measurement"] = failed_measurement(row["act_util_pct"], row["act_mem_mib"])
    row["mem_err_bucket"] = -1 if row["failed_measurement"] else \
        mem_err_bucket(row["pred_mem_mib"], row["act_mem_mib"])
    claim_mem = row["pred_mem_p90_mib"] if row["pred_mem_p90_mib"] is not None \
        else row["pred_mem_mib"]
    row["under_claim"], row["claim_flags"] = under_claim(
        row["pred_util_pct"], claim_mem, first("util_mean", TRUSTED_ORDER),
        first("mem_peak_mib", TRUSTED_ORDER))
    return row


def refresh_jobs(conn, keys: Iterable[tuple[str, int]]) -> None:
    """Recompute the jobs rows of these (cluster, job id) keys from submissions and usage."""
    from sqlalchemy import and_, or_, select

    t = tables()
    keys = sorted(set((str(c), int(j)) for c, j in keys))
    if not keys:
        return
    sub_cols = [t["submissions"].c[c] for c in ("cluster", "job_id", "user_name", "account",
                                                 "submit_time", "model_family", "predictor",
                                                 "predictions")]
    out = []
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        by_cluster: dict[str, list[int]] = {}
        for c, j in chunk:
            by_cluster.setdefault(c, []).append(j)
        cond_s = or_(*(and_(t["submissions"].c.cluster == c, t["submissions"].c.job_id.in_(js))
                       for c, js in by_cluster.items()))
        cond_u = or_(*(and_(t["usage"].c.cluster == c, t["usage"].c.job_id.in_(js))
                       for c, js in by_cluster.items()))
        subs = {(r.cluster, int(r.job_id)): r._asdict()
                for r in conn.execute(select(*sub_cols).where(cond_s))}
        usages: dict[tuple, dict] = {}
        for r in conn.execute(select(t["usage"]).where(cond_u)):
            usages.setdefault((r.cluster, int(r.job_id)), {})[r.source] = r._asdict()
        for key in chunk:
            if key not in subs and key not in usages:
                continue
            row = merge_job(subs.get(key), usages.get(key, {}))
            row["cluster"], row["job_id"] = key
            out.append(row)
    upsert(conn, t["jobs"], out, ("cluster", "job_id"))


# --------------------------------------------------------------------------- spool

class Replay(NamedTuple):
    """What a spool replay did: records applied, files quarantined (renamed .bad) and files or
    folders skipped as untrusted; ``problems`` has one line about each of the latter two."""
    applied: int
    quarantined: int
    skipped: int
    problems: list


def _trusted(st, uids: tuple[int, ...], *, folder: bool) -> str | None:
    """Why a spool folder or file must not be replayed, or None: only root (or the replaying
    uid) may have put records there, since replayed usage counts as measured."""
    import stat

    if folder and not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if not folder and not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid not in uids:
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"group/other-writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


class Spool:
    """Records that could not reach the ledger: one JSON file each, replayed later."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root else spool_dir()

    def put(self, kind: str, data: dict) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp = self.root / f".{name}.tmp"
        final = self.root / f"{name}.jsonl"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"kind": kind, "data": data, "spooled": time.time()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return final

    def pending(self) -> list[Path]:
        try:
            return sorted(self.root.glob("*.jsonl"))
        except OSError:  # a spool this user may not read is not theirs to replay
            return []

    def replay(self, ledger: "Ledger") -> Replay:
        """Apply every trusted spooled record to ``ledger``. A record that cannot be applied
        (bad JSON, bad job id, unknown kind) is renamed ``.bad`` and the rest go on; a
        database error stops the replay and leaves the file for next time."""
        from sqlalchemy.exc import DBAPIError

        uids = tuple({0, os.geteuid()})
        applied = quarantined = skipped = 0
        problems: list[str] = []
        try:
            why = _trusted(os.lstat(self.root), uids, folder=True)
        except FileNotFoundError:
            return Replay(0, 0, 0, [])
        if why:
            n = len(self.pending())
            return Replay(0, 0, n, [f"{self.root}: not replayed, {why}"] if n else [])
        for path in self.pending():
            try:
                why = _trusted(os.lstat(path), uids, folder=False)
            except FileNotFoundError:  # another replayer took it
                continue
            if why:
                skipped += 1
                problems.append(f"{path}: skipped, {why}")
                continue
            claimed = path.with_suffix(f".claim-{os.getpid()}")
            try:
                os.rename(path, claimed)  # another replayer may have taken it
            except OSError:
                continue
            try:
                recs = [json.loads(ln) for ln in claimed.read_text().splitlines() if ln.strip()]
                for rec in recs:
                    ledger._apply(rec["kind"], rec["data"])
            except DBAPIError:
                os.rename(claimed, path)  # retry next time
                raise
            except Exception as e:  # noqa: BLE001 - whatever is wrong with it, it is this file
                os.rename(claimed, path.with_suffix(".bad"))
                quarantined += 1
                reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
                problems.append(f"{path}: quarantined as .bad ({type(e).__name__}: {reason})")
                continue
            os.unlink(claimed)
            applied += len(recs)
        return Replay(applied, quarantined, skipped, problems)


# --------------------------------------------------------------------------- the ledger

class Ledger:
    """The job ledger. ``Ledger()`` opens $HORUS_LEDGER_URL or the site default, creating or
    migrating the schema as needed (the site's writers). ``Ledger(url, readonly=True)`` is for
    readers such as hacct: SQLite opened ``mode=ro``, nothing created, migrated or written."""

    def __init__(self, url: str | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S,
                 spool: Spool | str | None = None, replay: bool = True, readonly: bool = False):
        self.url = url or default_url()
        self.readonly = readonly
        self.spool = spool if isinstance(spool, Spool) else Spool(spool)
        self._replay = replay and not readonly
        self.engine = _make_engine(self.url, busy_timeout, readonly)
        from sqlalchemy.exc import DBAPIError

        try:
            self._check_readable() if readonly else self._setup()
        except DBAPIError as e:  # unreachable server, bad credentials, unwritable file, ...
            self.engine.dispose()
            reason = str(e.orig).strip().splitlines()[0] if e.orig else type(e).__name__
            raise HorusError(f"ledger {mask_url(self.url)}: cannot open it ({reason[:200]})") \
                from None
        except HorusError:
            self.engine.dispose()
            raise

    def sqlite_path(self) -> Path | None:
        """The database file of a SQLite ledger (None for a server)."""
        return _sqlite_file(self.url)

    def writable(self) -> bool:
        """Whether this process may write the ledger: root, or write access to a SQLite file
        (a server's grants are not known: False)."""
        if self.readonly:
            path = self.sqlite_path()
            return os.geteuid() == 0 or (path is not None and os.access(path, os.W_OK))
        return True

    # --- setup ---------------------------------------------------------------------------

    def _setup(self) -> None:
        from sqlalchemy import inspect

        t = tables()
        with self.engine.begin() as conn:
            names = set(inspect(conn).get_table_names())
            if "schema_version" not in names and "submissions" not in names:
                exec_script(conn, (sql_dir() / "schema.sql").read_text())
                conn.execute(t["schema_version"].insert(),
                             [{"version": SCHEMA_VERSION, "applied": int(time.time())}])
                self._create_views(conn)
                return
            version = self._version(conn, names)
            if version > SCHEMA_VERSION:
                raise HorusError(f"ledger {mask_url(self.url)}: schema version {version} is newer "
                                 f"than this slurm-horus ({SCHEMA_VERSION}); upgrade slurm-horus")
            if version < SCHEMA_VERSION:
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    MIGRATIONS[v](conn)
                    conn.execute(t["schema_version"].insert(),
                                 [{"version": v, "applied": int(time.time())}])
                _finish_migration(conn)
                self._create_views(conn)
            elif self._views_stale(conn):
                self._create_views(conn)

    def _check_readable(self) -> None:
        """A reader needs a ledger at this schema version: it cannot create or migrate one."""
        from sqlalchemy import inspect

        with self.engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
            if "jobs" not in names:
                raise HorusError(f"ledger {mask_url(self.url)}: no ledger tables yet; "
                                 f"{REFRESH_ADVICE}")
            version = self._version(conn, names)
        if version < SCHEMA_VERSION:
            raise HorusError(f"ledger {mask_url(self.url)}: schema version {version} is older "
                             f"than this slurm-horus ({SCHEMA_VERSION}); {REFRESH_ADVICE}")
        if version > SCHEMA_VERSION:
            raise HorusError(f"ledger {mask_url(self.url)}: schema version {version} is newer "
                             f"than this slurm-horus ({SCHEMA_VERSION}); upgrade slurm-horus")

    @staticmethod
    def _version(conn, names) -> int:
        if "schema_version" not in names:
            return 1
        v = conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").scalar()
        return int(v or 1)

    @staticmethod
    def _views_text() -> str:
        return (sql_dir() / "views.sql").read_text()

    def _views_stale(self, conn) -> bool:
        import hashlib

        h = hashlib.sha256(self._views_text().encode()).hexdigest()[:16]
        cur = conn.exec_driver_sql(
            "SELECT value FROM ledger_state WHERE name = 'views_sha'").scalar()
        return cur != h

    def _create_views(self, conn) -> None:
        import hashlib

        text = self._views_text()
        exec_script(conn, text)
        h = hashlib.sha256(text.encode()).hexdigest()[:16]
        upsert(conn, tables()["ledger_state"], [{"name": "views_sha", "value": h}], ("name",))

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT MAX(version) FROM schema_version").scalar())

    # --- writing -------------------------------------------------------------------------

    def _apply(self, kind: str, data: dict) -> None:
        """One spooled record, validated again: the file may be old, damaged or edited."""
        if kind != "usage":
            raise HorusError(f"unknown spooled record kind {kind!r}")
        if not isinstance(data, dict):
            raise HorusError("spooled record data is not an object")
        self._write_usage([usage_record(**data)])

    def _after_write(self) -> None:
        if self._replay and self.spool.pending():
            try:
                self.spool.replay(self)
            except Exception:
                pass  # stays spooled; horus-admin sync retries

    def record_submission(self, *, job_id: int, cluster: str = "", user: str | None = None,
                          account: str | None = None, submit_time: float | None = None,
                          model_path: str | None = None, model_sha256: str | None = None,
                          model_family: str | None = None, feature_version: int | None = None,
                          features: dict | None = None, workload: dict | None = None,
                          gpu_types: list | None = None, predictions: dict | None = None,
                          hint: str | None = None, policy_decision: Any = None,
                          predictor: str | None = None, uid: int | None = None) -> None:
        """Store (or replace) one submission. Raises on database errors."""
        rec = submission_record(**{k: v for k, v in locals().items() if k != "self"})
        self._write_submissions([rec])
        self._after_write()

    def record_usage(self, *, job_id: int, source: str, cluster: str = "", **fields) -> None:
        """Store (or replace) one measurement of a job from ``source``."""
        rec = usage_record(job_id=job_id, source=source, cluster=cluster, **fields)
        self._write_usage([rec])
        self._after_write()

    def record_usages(self, records: list[dict], recompute_keys: Iterable = ()) -> None:
        """Bulk form of record_usage (sync): one transaction."""
        recs = [usage_record(**r) for r in records]
        self._write_usage(recs, extra_keys=recompute_keys)

    def record_submissions(self, records: list[dict]) -> None:
        self._write_submissions([submission_record(**r) for r in records])

    def _write_submissions(self, recs: list[dict]) -> None:
        t = tables()
        with self.engine.begin() as conn:
            upsert(conn, t["submissions"], recs, ("cluster", "job_id"))
            refresh_jobs(conn, [(r["cluster"], r["job_id"]) for r in recs])

    def _write_usage(self, recs: list[dict], extra_keys: Iterable = ()) -> None:
        t = tables()
        with self.engine.begin() as conn:
            upsert(conn, t["usage"], recs, ("cluster", "job_id", "source"))
            refresh_jobs(conn, [(r["cluster"], r["job_id"]) for r in recs] + list(extra_keys))

    def set_state(self, name: str, value: str) -> None:
        with self.engine.begin() as conn:
            upsert(conn, tables()["ledger_state"], [{"name": name, "value": value}], ("name",))

    def get_state(self, name: str) -> str | None:
        from sqlalchemy import select

        t = tables()["ledger_state"]
        with self.engine.connect() as conn:
            return conn.execute(select(t.c.value).where(t.c.name == name)).scalar()

    def record_predictor_version(self, version: str, metrics: dict, n_rows: int,
                                 promoted: bool) -> None:
        with self.engine.begin() as conn:
            upsert(conn, tables()["predictor_versions"],
                   [{"version": version, "created": int(time.time()),
                     "metrics": json.dumps(metrics, default=str), "n_rows": int(n_rows),
                     "promoted": int(bool(promoted))}], ("version",))

    # --- reading -------------------------------------------------------------------------

    def under_claims(self, since: float) -> list[dict]:
        """Per user (name, uid) and account: jobs ending (or submitted) since ``since`` whose
        claim was checked against a trusted measurement, and how many of them under-claimed.
        What ``horus-admin sync`` writes into the hook's record file."""
        from sqlalchemy import and_, case, func, select

        t = tables()
        j, s = t["jobs"], t["submissions"]
        stmt = (select(j.c.user_name, s.c.uid, j.c.account,
                       func.sum(case((j.c.under_claim == 1, 1), else_=0)).label("under_claims"),
                       func.count().label("jobs"))
                .select_from(j.outerjoin(s, and_(s.c.cluster == j.c.cluster,
                                                 s.c.job_id == j.c.job_id)))
                .where(j.c.under_claim.isnot(None),
                       func.coalesce(j.c.end_time, j.c.submit_time) >= int(since))
                .group_by(j.c.user_name, s.c.uid, j.c.account)
                .order_by(j.c.user_name, j.c.account))
        with self.engine.connect() as conn:
            return [{"user_name": r.user_name, "uid": None if r.uid is None else int(r.uid),
                     "account": r.account, "under_claims": int(r.under_claims or 0),
                     "jobs": int(r.jobs)} for r in conn.execute(stmt)]

    def submissions_exist(self, cluster: str, job_ids: list[int]) -> set[int]:
        from sqlalchemy import select

        t = tables()["submissions"]
        found: set[int] = set()
        with self.engine.connect() as conn:
            for i in range(0, len(job_ids), 900):
                chunk = job_ids[i:i + 900]
                found |= {int(r[0]) for r in conn.execute(
                    select(t.c.job_id).where(t.c.cluster == cluster, t.c.job_id.in_(chunk)))}
        return found

    def jobs(self, *, job_ids: Iterable[int] | None = None, users: Iterable[str] | None = None,
             accounts: Iterable[str] | None = None, states: Iterable[str] | None = None,
             start: float | None = None, end: float | None = None, cluster: str | None = None,
             submitted_only: bool = False, under_claims: bool = False,
             limit: int | None = None) -> list[dict]:
        """Jobs (submission joined with the best measurement), oldest first, as dicts."""
        from sqlalchemy import select

        stmt = select(tables()["jobs"])
        stmt = job_filters(stmt, job_ids=job_ids, users=users, accounts=accounts, states=states,
                           start=start, end=end, cluster=cluster, submitted_only=submitted_only,
                           under_claims=under_claims)
        j = tables()["jobs"]
        stmt = stmt.order_by(j.c.submit_time, j.c.cluster, j.c.job_id)
        if limit:
            stmt = stmt.limit(limit)
        with self.engine.connect() as conn:
            return [r._asdict() for r in conn.execute(stmt)]

    def submission(self, cluster: str, job_id: int) -> dict | None:
        from sqlalchemy import select

        t = tables()["submissions"]
        with self.engine.connect() as conn:
            r = conn.execute(select(t).where(t.c.cluster == cluster, t.c.job_id == int(job_id))).first()
        return r._asdict() if r else None

    def usage(self, cluster: str, job_id: int) -> dict[str, dict]:
        from sqlalchemy import select

        t = tables()["usage"]
        with self.engine.connect() as conn:
            return {r.source: r._asdict() for r in conn.execute(
                select(t).where(t.c.cluster == cluster, t.c.job_id == int(job_id)))}

    def predictor_versions(self) -> list[dict]:
        from sqlalchemy import select

        t = tables()["predictor_versions"]
        with self.engine.connect() as conn:
            return [r._asdict() for r in conn.execute(select(t).order_by(t.c.version))]

    def count(self, table: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.exec_driver_sql(
                f"SELECT COUNT(*) FROM {'`usage`' if table == 'usage' else table}").scalar())

    def close(self) -> None:
        self.engine.dispose()


def job_filters(stmt, *, job_ids=None, users=None, accounts=None, states=None, start=None,
                end=None, cluster=None, submitted_only=False, under_claims=False):
    """sacct-like filters on the jobs table: -j, -u, -A, -s, -S/-E (submit or end in window),
    and hacct's --under-claims."""
    from sqlalchemy import func, or_

    j = tables()["jobs"]
    if job_ids:
        stmt = stmt.where(j.c.job_id.in_([int(x) for x in job_ids]))
    if users:
        stmt = stmt.where(j.c.user_name.in_(list(users)))
    if accounts:
        stmt = stmt.where(j.c.account.in_(list(accounts)))
    if states:
        conds = []
        for s in states:
            conds.append(func.upper(j.c.state).like(s.upper() + "%"))
        stmt = stmt.where(or_(*conds))
    if cluster:
        stmt = stmt.where(j.c.cluster == cluster)
    when = func.coalesce(j.c.end_time, j.c.submit_time)
    if start is not None:
        stmt = stmt.where(when >= int(start))
    if end is not None:
        stmt = stmt.where(func.coalesce(j.c.submit_time, j.c.start_time, j.c.end_time) <= int(end))
    if submitted_only:
        stmt = stmt.where(j.c.has_submission == 1)
    if under_claims:
        stmt = stmt.where(j.c.under_claim == 1)
    return stmt


def _sqlite_file(url: str) -> Path | None:
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


def _create_site_dirs(folder: Path) -> None:
    """Create missing folders 0755 whatever the umask; existing ones keep their mode."""
    missing = []
    d = folder
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o755)
            os.chmod(d, 0o755)
        except FileExistsError:
            pass


def _create_site_file(path: Path) -> None:
    """Create the ledger's folders 0755 and its file 0644 whatever the umask, so that users
    can read what only the site writes. Existing ones keep the mode the admin gave them."""
    _create_site_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)


def _sqlite_functions(dbapi_conn) -> None:
    try:
        dbapi_conn.execute("SELECT ln(1)")
    except Exception:  # SQLite built without math functions
        import math

        dbapi_conn.create_function(
            "ln", 1, lambda x: math.log(x) if x is not None and x > 0 else None,
            deterministic=True)


def _make_engine(url: str, busy_timeout: float, readonly: bool = False):
    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    try:
        u = make_url(url)
    except Exception:
        raise HorusError(f"ledger: not a database URL: {url!r}") from None
    if u.get_backend_name() == "sqlite":
        path = _sqlite_file(url)
        if readonly and path is not None:
            return _readonly_sqlite(path, busy_timeout)
        if path is not None:
            _create_site_file(path)
        engine = create_engine(u, poolclass=NullPool,
                               connect_args={"timeout": busy_timeout, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _rec):
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            try:  # a rollback journal, not WAL: WAL readers need write access to -shm
                cur.execute("PRAGMA journal_mode = DELETE")
            except Exception:
                pass
            cur.execute("PRAGMA synchronous = FULL")
            cur.close()
            _sqlite_functions(dbapi_conn)

        @event.listens_for(engine, "begin")
        def _begin(conn):
            # BEGIN IMMEDIATE: take the write lock up front so writers queue on the busy timeout
            # instead of failing on a read-to-write upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        return engine
    t = db_timeout()
    kwargs: dict = {"pool_pre_ping": True}
    if u.get_backend_name() in ("mysql", "mariadb"):
        kwargs["connect_args"] = {"connect_timeout": max(1, int(round(t))), "read_timeout": t,
                                  "write_timeout": t}
    elif u.get_backend_name() == "postgresql":
        kwargs["connect_args"] = (
            {"timeout": t} if u.get_driver_name() == "pg8000" else
            {"connect_timeout": max(1, int(round(t))),
             "options": f"-c statement_timeout={int(t * 1000)}"})
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
        raise HorusError(f"ledger {path}: not readable by you, and no extract of your jobs "
                         f"beside it; {REFRESH_ADVICE}")
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"

    def connect():
        con = sqlite3.connect(uri, uri=True, timeout=busy_timeout, check_same_thread=False)
        _sqlite_functions(con)
        return con
    return create_engine("sqlite://", creator=connect, poolclass=NullPool)


# --------------------------------------------------------------------------- records

def _json(v):
    if v is None or isinstance(v, str):
        return v
    return json.dumps(v, sort_keys=True, default=_jdefault)


def _jdefault(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dict__"):
        return o.__dict__
    return str(o)


def _pred_dict(p) -> dict:
    if isinstance(p, dict):
        return p
    d = p.to_dict() if hasattr(p, "to_dict") else dict(p)
    return d


def submission_record(*, job_id, cluster="", user=None, account=None, submit_time=None,
                      model_path=None, model_sha256=None, model_family=None,
                      feature_version=None, features=None, workload=None, gpu_types=None,
                      predictions=None, hint=None, policy_decision=None, predictor=None,
                      uid=None) -> dict:
    try:
        job_id = int(str(job_id).split(";")[0])
    except ValueError:
        raise HorusError(f"ledger: bad job id {job_id!r}") from None
    preds = {str(k): _pred_dict(v) for k, v in (predictions or {}).items()}
    if predictor is None and preds:
        predictor = next(iter(preds.values())).get("predictor")
    if model_family is None and model_path:
        model_family = family_of(model_path)
    if workload is not None and not isinstance(workload, (dict, str)):
        from dataclasses import asdict, is_dataclass

        workload = asdict(workload) if is_dataclass(workload) else dict(workload)
    return {"cluster": cluster or "", "job_id": job_id, "user_name": user, "account": account,
            "submit_time": int(submit_time if submit_time is not None else time.time()),
            "model_path": str(model_path) if model_path else None, "model_sha256": model_sha256,
            "model_family": model_family, "feature_version": feature_version,
            "features": _json(features), "workload": _json(workload),
            "gpu_types": _json(list(gpu_types) if gpu_types is not None else sorted(preds) or None),
            "predictions": _json(preds), "hint": hint, "policy_decision": _json(policy_decision),
            "predictor": predictor, "uid": None if uid is None else int(uid)}


def usage_record(*, job_id, source, cluster="", util_mean=None, util_max=None, mem_peak_mib=None,
                 elapsed_s=None, state=None, node=None, gpu_type=None, gpu_index=None,
                 gpus=None, shards=None, colocated=None, start_time=None, end_time=None,
                 recorded=None) -> dict:
    """A usage row: ``gpus`` whole GPUs allocated (gres/gpu), ``shards`` shards (gres/shard)."""
    if source not in SOURCES:
        raise HorusError(f"ledger: usage source must be one of {', '.join(SOURCES)}, not {source!r}")
    if isinstance(colocated, (list, tuple, set)):
        colocated = ",".join(str(x) for x in sorted(colocated, key=lambda x: int(x))) or None

    def f(x):
        return None if x is None else float(x)

    def i(x):
        return None if x is None else int(x)
    return {"cluster": cluster or "", "job_id": int(job_id), "source": source,
            "util_mean": f(util_mean), "util_max": f(util_max), "mem_peak_mib": f(mem_peak_mib),
            "elapsed_s": i(elapsed_s), "state": state, "node": node, "gpu_type": gpu_type,
            "gpu_index": i(gpu_index), "gpus": i(gpus), "shards": i(shards),
            "colocated": colocated,
            "start_time": i(start_time), "end_time": i(end_time),
            "recorded": int(recorded if recorded is not None else time.time())}


def family_of(model_path: str) -> str:
    """A model's family from its file name: 'resnet50_bs64.onnx' -> 'resnet50'."""
    import re

    stem = Path(str(model_path)).name
    stem = re.sub(r"\.onnx$", "", stem, flags=re.I)
    stem = re.split(r"[._-](?:bs|b|batch|v|ep|epoch|step)?\d*$", stem)[0] or stem
    return stem.lower()[:64]


# --------------------------------------------------------------------------- never-raising writer

def record_usage_safely(*, url: str | None = None, spool: str | None = None,
                        timeout: float = 10.0, **kwargs) -> bool:
    """record_usage for horus-probe: never raises. True if written, False if spooled."""
    try:
        data = usage_record(**kwargs)
    except Exception:
        return False
    try:
        ledger = Ledger(url, busy_timeout=timeout, spool=spool)
        try:
            ledger._apply("usage", data)
            ledger._after_write()
        finally:
            ledger.close()
        return True
    except BaseException as e:  # noqa: BLE001 - the job's epilog must never fail here
        if isinstance(e, KeyboardInterrupt):
            raise
        try:
            Spool(spool).put("usage", data)
        except Exception as e2:
            try:
                sys.stderr.write(f"slurm-horus: warning: ledger record lost ({e2})\n")
            except Exception:
                pass
        return False


# --------------------------------------------------------------------------- readers

def user_extract(url: str | None, user: str) -> Path | None:
    """Where ``horus-admin sync`` puts ``user``'s extract of a SQLite ledger: users/<user>.db
    beside it (None for a server ledger or a name that is no plain file name)."""
    path = _sqlite_file(url or default_url())
    if path is None or not user or "/" in user or user.startswith("."):
        return None
    return path.parent / "users" / f"{user}.db"


def open_reader(url: str | None = None, user: str | None = None) -> Ledger:
    """The ledger for a reader (hacct): read-only, and where the site keeps the main SQLite file
    private (0640 root:root), the user's own extract instead."""
    url = url or default_url()
    path = _sqlite_file(url)
    if path is not None and path.exists() and not os.access(path, os.R_OK):
        ext = user_extract(url, user or current_user())
        if ext is not None and ext.exists() and os.access(ext, os.R_OK):
            return Ledger(f"sqlite:///{ext}", readonly=True)
    return Ledger(url, readonly=True)


def current_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def write_user_extracts(ledger: Ledger, folder: str | os.PathLike) -> dict:
    """Per-user SQLite extracts for sites where Slurm's PrivateData hides others' jobs:
    ``<folder>/<user>.db``, the ledger schema with only that user's jobs rows, owned by root
    and the user's primary group, mode 0640, each replaced atomically. Users unknown to this
    host (no primary group) or with names that are not file names are skipped.
    Returns {"written": n, "skipped": [names]}."""
    import pwd

    from sqlalchemy import select

    folder = Path(folder)
    _create_site_dirs(folder)
    j = tables()["jobs"]
    with ledger.engine.connect() as conn:
        users = sorted(r[0] for r in conn.execute(select(j.c.user_name).distinct())
                       if r[0] is not None)
    written, skipped = 0, []
    for user in users:
        try:
            gid = pwd.getpwnam(user).pw_gid
        except KeyError:
            gid = None
        if gid is None or "/" in user or user.startswith("."):
            skipped.append(user)
            continue
        tmp = folder / f".{user}.db.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)  # left by a crashed run of this pid
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchown(fd, 0 if os.geteuid() == 0 else -1, gid)
            os.fchmod(fd, 0o640)
        finally:
            os.close(fd)
        try:
            ext = Ledger(f"sqlite:///{tmp}", replay=False)
            try:
                with ledger.engine.connect() as src, ext.engine.begin() as dst:
                    rows = src.execute(select(j).where(j.c.user_name == user))
                    upsert(dst, j, [r._asdict() for r in rows], ("cluster", "job_id"))
            finally:
                ext.close()
            os.replace(tmp, folder / f"{user}.db")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        written += 1
    return {"written": written, "skipped": skipped}
