"""After a sync: the claim record the hook reads, and what readers (hacct) open of a SQLite
ledger: a snapshot, or per-user extracts where jobs are private.

The record file lists, per user and per account, how often measured use exceeded what was
claimed (``Ledger.under_claims``); ``etc/job_submit.lua`` reads it to refuse shards to repeat
under-claimers. It is replaced in one rename, so the hook never reads half a file.
"""

from __future__ import annotations

import os
import re
import stat
import time

from slurm_horus.errors import HorusError, to_stderr
from slurm_horus.ledger.extracts import readers_copy, write_readers_copy, write_user_extracts
from slurm_horus.slurm import commands as slurm
from slurm_horus.slurm.policy import (DEFAULT_RECORD, POLICY_MAX_BYTES, ignored_policy_summary, policy_file,
                                      policy_values)
from slurm_horus.textfile import open_for_reading, read_text, remove_stale_temps, replace_text

RECORD_HEADER = "# slurm-horus claim record: written by horus-admin sync, read by job_submit.lua\n"
_NAME_OK = re.compile(r"[^\s#]{1,128}")
TEMP_PREFIX = ".record-"  # write_atomically's temp files
# their names alone (mkstemp's: the prefix and 8 random characters): the folder may hold others'
TEMP_NAMES = TEMP_PREFIX + "?" * 8


def claim_record(rows: list[dict]) -> tuple[str, int, int]:
    """(text, users, accounts) of the hook's record file from Ledger.under_claims rows: users
    and accounts with under-claims, most first, since the hook reads only the first 64 KiB (a
    site's thousands of users without one, listed first, pushed every account past it)."""
    users: dict[str, list] = {}
    accounts: dict[str, list] = {}
    for r in rows:
        for into, name in ((users, r["user_name"]), (accounts, r["account"])):
            if name and _NAME_OK.fullmatch(name):
                e = into.setdefault(name, [None, 0, 0])
                e[0] = e[0] if r["uid"] is None else r["uid"]
                e[1] += r["under_claims"]
                e[2] += r["jobs"]

    entries = [(-n, 0, name, f"user {'-' if uid is None else uid} {name} {n} {m}\n")
               for name, (uid, n, m) in users.items() if n > 0]
    entries += [(-n, 1, name, f"account - {name} {n} {m}\n")
                for name, (_, n, m) in accounts.items() if n > 0]
    entries.sort()
    return (RECORD_HEADER + "".join(e[3] for e in entries), sum(e[1] == 0 for e in entries),
            sum(e[1] == 1 for e in entries))


def write_atomically(path: str | os.PathLike, text: str, mode: int = 0o644,
                     gid: int | None = None) -> None:
    """Replace ``path`` with ``text`` in one rename (readers see the old or the new file),
    of ``mode`` and, given one, group ``gid``; first removing the temp files of writers killed
    mid-write, which nothing else removes.  Raises OSError (the old file stands)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o755, exist_ok=True)
    remove_stale_temps(folder, TEMP_NAMES, owner=os.geteuid())  # any folder an admin names
    replace_text(path, text, TEMP_PREFIX, mode=mode, owner=None if gid is None else (-1, gid))


def publish(ledger, *, policy: str | None = None, now: float | None = None) -> dict:
    """After a sync: the hook's record file (policy ``record_file``, counting under-claims over
    ``underclaim_window_days``) and, for a SQLite ledger, what readers open. The live file is
    root's alone (0640 root:root: a reader's transaction on it stopped every write); readers
    get a snapshot (``<ledger>.readers``, 0644) where Slurm shows jobs to everyone, else each
    user an extract of their own, the snapshot removed: where Slurm cannot say, extracts too
    (never a leak). The record, which names under-claimers, is SlurmUser's group's (0640)
    where jobs are private, 0644 where they are not, and keeps its mode where Slurm cannot say.
    A policy file the hook cannot use as written is said in one line on stderr (policy_warning
    in the answer), the sync going on with the defaults of what it could not read."""
    values, warning = _policy(policy)
    path = values.get("record_file", DEFAULT_RECORD)
    days = float(values.get("underclaim_window_days", "30"))  # the hook's check: an integer
    if warning:
        warning += f"; the claim record is written to {path}"
        to_stderr("horus-admin sync", f"warning: {warning}")
    text, users, accounts = claim_record(
        ledger.under_claims((now or time.time()) - days * 86400))
    private = slurm.private_jobs(unknown=None)
    kept = ledger.unproven("published") and _has_entries(path)
    if not kept:  # a ledger a mistyped --ledger made would forgive every under-claimer
        mode, gid = _record_mode(path, private)
        try:
            write_atomically(path, text, mode, gid)
        except OSError as e:  # a full disk: the hook reads the last record
            raise HorusError(f"the claim record {path} was not replaced ({e.strerror or e})") from None
        ledger.set_state("published", str(int(now or time.time())))
    out = {"record_file": path, "record_users": users, "record_accounts": accounts,
           "record_kept": kept, "extracts": None, "readers_copy": None, "policy_warning": warning}
    db = ledger.sqlite_path()
    if db is None:
        return out
    if os.geteuid() == 0:
        os.chown(db, 0, 0)
    os.chmod(db, 0o640)
    if private is False:
        out["readers_copy"] = str(write_readers_copy(db))
    else:
        readers_copy(db).unlink(missing_ok=True)
        written = write_user_extracts(ledger, db.parent / "users")
        out["extracts"] = written["written"]
        out["extracts_skipped"] = written["skipped"]  # their hacct finds no copy
    return out


def _policy(policy: str | None) -> tuple[dict[str, str], str | None]:
    """(what the hook takes from the policy file: policy_values, a warning or None).  A file
    that is there but that the hook cannot read as written (binary, UTF-16, over 64 KiB: its
    lines ignored) had sent the record to the default path unsaid; one another user may change
    gives nothing, since root writes the record where it says.  No file: the hook is off."""
    path = policy_file(policy)
    if not os.path.lexists(path):
        return {}, None
    try:
        text = read_text(path, "policy file", POLICY_MAX_BYTES, "surrogateescape",
                         owners={0, os.geteuid()})
    except HorusError as e:
        return {}, f"{e}: none of its settings used"
    return policy_values(text), ignored_policy_summary(path, text)


def _has_entries(path: str) -> bool:
    """Whether the record file names anyone (an unreadable one, or a FIFO: no, without waiting)."""
    try:
        with open_for_reading(path) as f:
            text = f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return False
    return any(line.startswith(("user ", "account ")) for line in text.splitlines())


def _record_mode(path: str, private: bool | None) -> tuple[int, int | None]:
    """(mode, group) of the record file: see publish.  A kept mode never lets group or others
    write (a record its users may change names no under-claimer the hook should see)."""
    if private:
        gid = slurm.slurm_user_gid()
        return (0o640, gid) if gid is not None and os.geteuid() == 0 else (0o644, None)
    if private is None:
        try:
            st = os.stat(path)
            return stat.S_IMODE(st.st_mode) & 0o644, st.st_gid
        except OSError:
            pass
    return 0o644, None
