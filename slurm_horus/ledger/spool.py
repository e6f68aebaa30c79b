"""The spool: usage records that could not reach the ledger, kept until they can.

horus-probe's writes never fail a job: when the ledger is unreachable or locked, the record goes
to a root-only folder (one JSON file per record, written atomically) that the next write or
``horus-admin sync`` replays. Replay trusts only files root (or the replaying user) wrote, since
replayed usage counts as measured.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from slurm_horus.proc import started
from slurm_horus.textfile import NOT_OWNER, WRITABLE, untrusted

ENV_SPOOL = "HORUS_SPOOL"
DEFAULT_SPOOL = "/var/spool/slurm-horus"


def spool_dir() -> Path:
    """$HORUS_SPOOL, else the root-only /var/spool/slurm-horus."""
    return Path(os.environ.get(ENV_SPOOL) or DEFAULT_SPOOL)


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
    why = untrusted(st, uids, kind="folder" if folder else "file")
    if not why:
        return None
    return {NOT_OWNER: f"owned by uid {st.st_uid}",
            WRITABLE: f"group/other-writable (mode {stat.S_IMODE(st.st_mode):04o})"}.get(why[0], why[0])


CLAIM = ".claim-"  # a file being replayed: NAME.claim-PID-START, the replayer's pid and start


def _abandoned(claim: Path) -> bool:
    """Whether the replayer that claimed this file is gone: no process has its pid, or one that
    started at another time has (the pid reused). A claim named by pid alone (before the start
    was in the name) is taken back once no process has that pid."""
    pid, _, start = claim.suffix[len(CLAIM):].partition("-")
    try:
        now = started(pid) if pid.isdigit() else None
    except OSError:  # cannot tell: left to its replayer
        return False
    return now is None or (start != "" and now != start)


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
        """The files to replay: new ones, and those a replayer claimed and died with (killed
        mid-replay, its file had been left out of every later replay)."""
        try:
            return sorted([*self.root.glob("*.jsonl"),
                           *(p for p in self.root.glob(f"*{CLAIM}*") if _abandoned(p))])
        except OSError:  # a spool this user may not read is not theirs to replay
            return []

    def replay(self, ledger) -> Replay:
        """Apply every trusted spooled record to ``ledger`` (its ``_apply``). A record that cannot be applied
        (bad JSON, bad job id, unknown kind, a value the database refuses for good) is renamed
        ``.bad`` and the rest go on; any other database error (unreachable, locked) stops the
        replay and leaves the file for next time."""
        from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

        uids = tuple({0, os.geteuid()})
        mine = f"{CLAIM}{os.getpid()}-{started(os.getpid())}"
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
            claimed = path.with_suffix(mine)
            try:
                os.rename(path, claimed)  # another replayer may have taken it
            except OSError:
                continue
            path = path.with_suffix(".jsonl")  # its name, whoever had claimed it
            try:
                recs = [json.loads(ln) for ln in claimed.read_text().splitlines() if ln.strip()]
                for rec in recs:
                    ledger._apply(rec["kind"], rec["data"])
            except DBAPIError as e:
                if not isinstance(e, (DataError, IntegrityError)):
                    os.rename(claimed, path)  # retry next time
                    raise
                self._quarantine(claimed, path, e, problems)  # retried, it would fail every sync
                quarantined += 1
                continue
            except Exception as e:  # noqa: BLE001 - whatever is wrong with it, it is this file
                self._quarantine(claimed, path, e, problems)
                quarantined += 1
                continue
            os.unlink(claimed)
            applied += len(recs)
        return Replay(applied, quarantined, skipped, problems)

    @staticmethod
    def _quarantine(claimed: Path, path: Path, e: Exception, problems: list[str]) -> None:
        os.rename(claimed, path.with_suffix(".bad"))
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        problems.append(f"{path}: quarantined as .bad ({type(e).__name__}: {reason})")
