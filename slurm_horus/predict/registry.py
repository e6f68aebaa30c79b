"""Versioned store of learned models: list, add, promote, rollback, each an atomic file rename.

Layout of the registry folder: `vNNNN.json` (one model each, never rewritten), `current.json`
({"serving": "vNNNN", "history": [...]}) which says which version serves, `history.json`
(the site's measured runs and offsets, see history.py; rewritten by each export),
`calibration.json` (the bounds' conformal quantiles, see retrain.py), `calibration-vNNNN.json`
(those of version vNNNN's own answers, which serve whenever it serves), `rows-vNNNN.json` (the
rows each version was trained on; root's alone, 0600), `.pseudonym-key` (root's alone) and
`users/<name>` (that user's pseudonym in history.json, readable by that user alone). Readers
never see a half-written file: everything is written to a temporary file (`.tmp-*.json`) and
renamed into place; a write that fails removes its own, and each write first removes those of
writers killed mid-write (remove_stale_temps).
Folders are made 0755 whatever the umask: a group-writable one would be refused by every reader.

history.json names users by pseudonyms (an HMAC of the name under the registry's key), never by
name: it is readable by all, and where Slurm keeps jobs private it must not say who ran what.

The serving model answers for every user of a site, so the registry is read only where nobody
but root (or the user reading it) can write: the folder, its parents (a sticky /tmp is fine)
and the files must be owned by root or the reader and not writable by group or others.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import math
import os
import pwd
import re
import secrets
import stat
import time
from pathlib import Path

from slurm_horus.errors import HorusError
from slurm_horus.textfile import (NOT_OWNER, create_site_dirs, open_for_reading, own_dir,
                                  remove_stale_temps, replace_text, untrusted, write_temp)
from slurm_horus.predict.learned import MAX_MODEL_BYTES, MAX_MODEL_CONTAINERS, LearnedModel

ENV_VAR = "HORUS_MODEL_DIR"
DEFAULT_DIR = Path("/var/lib/slurm-horus/models")
# what an admin does about a damaged current.json: every command that reads it had only failed
STATE_REPAIR = ("an admin may remove it: the cold start serves until `horus-admin models promote "
                "VERSION`")
VERSION_RE = re.compile(r"v(\d{4,})")  # fullmatch only: with "$", "v0001\n" matched too
HISTORY_FILE = "history.json"
CALIBRATION_FILE = "calibration.json"
USERS_DIR = "users"
MAX_SMALL_JSON = 1 << 20  # current.json, calibration files: a few kB written; a huge one cost every hsubmit seconds
# history.json: an export of 100,000 jobs, each a setting of its own, is 23 MiB (0.7 s to read);
# a 63 MiB one had cost every hsubmit 9.5 s and 1 GB
MAX_HISTORY_BYTES = 32 << 20
# and its values and its objects and lists, counted in its bytes before parsing (commas, braces
# and brackets outside its strings: a run's dims key, "input_ids[1]=512,attention_mask[1]=512",
# holds a comma and a bracket a dimension, which had made a BERT's export past 24 MiB, a
# real one, be refused by every reader and by save_json): fit's smallest run entry is one
# object of 13 fields in 154 bytes (11 bytes a value), its graph's list 70 more, and a real
# export's run 250 (16 bytes a value), so an export within the byte cap holds under 3.1 million
# values and 300,000 objects and lists. Millions of tiny ones within the byte cap ([] or "ab")
# had cost every hsubmit up to 5 s and 1.3 GB; within these caps a file costs at most about
# twice what an export at the byte cap does (2 s, 240 MB peak)
MAX_HISTORY_VALUES = MAX_HISTORY_BYTES // 8
MAX_HISTORY_CONTAINERS = MAX_HISTORY_BYTES // 64
MAX_ROWS_BYTES = 64 << 20  # rows-vNNNN.json, read by retrain alone: 25 bytes a training job
KEY_FILE = ".pseudonym-key"
TEMP_PREFIX, TEMP_SUFFIX = ".tmp-", ".json"  # _write_temp's names
PSEUDONYM_RE = re.compile(r"u-[0-9a-f]{16}")


def default_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DIR)


def _check_trusted(path: Path, st: os.stat_result, sticky_ok: bool = False) -> None:
    why = untrusted(st, (0, os.getuid()), sticky_ok=sticky_ok)  # sticky_ok: a folder above the root
    if NOT_OWNER in why:
        raise HorusError(f"{path} is owned by uid {st.st_uid}, neither root nor you: "
                         "not trusted")
    if why:
        raise HorusError(f"{path} is writable by group or others: not trusted")


class Registry:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root else default_dir()
        self._lock_fd: int | None = None
        self._lock_depth = 0

    # --- reading ---------------------------------------------------------------------------

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        found = [p.stem for p in self.root.glob("v*.json") if VERSION_RE.fullmatch(p.stem)]
        return sorted(found, key=lambda v: int(v[1:]))

    def state(self) -> dict:
        path = self.root / "current.json"
        try:
            state = json.loads(self._read(path, MAX_SMALL_JSON))
        except FileNotFoundError:
            return {"serving": None, "history": []}
        except (OSError, ValueError, RecursionError) as e:
            raise HorusError(f"{path}: unreadable registry state ({type(e).__name__}); {STATE_REPAIR}") from None
        if not (isinstance(state, dict) and "serving" in state
                and (state["serving"] is None
                     or (isinstance(state["serving"], str) and VERSION_RE.fullmatch(state["serving"])))
                and isinstance(state.get("history", []), list)
                and all(isinstance(v, str) and VERSION_RE.fullmatch(v) for v in state.get("history", []))):
            raise HorusError(f"{path}: not a registry state file; {STATE_REPAIR}")
        return state

    def serving(self) -> str | None:
        return self.state().get("serving")

    def load(self, version: str) -> LearnedModel:
        if not VERSION_RE.fullmatch(version or ""):
            raise HorusError(f"not a model version: '{version}' (expected e.g. v0003)")
        path = self.root / f"{version}.json"
        try:
            data = self._read(path, MAX_MODEL_BYTES)
        except FileNotFoundError:
            raise HorusError(f"model {version} is not in the registry at {self.root}") from None
        except OSError as e:
            raise HorusError(f"{path}: {e.strerror}") from None
        if why := _shape_problem(data, MAX_MODEL_CONTAINERS):
            raise HorusError(f"{path}: {why}")
        return LearnedModel.from_json(data, source=str(path))

    def load_json(self, name: str, max_bytes: int | None = None) -> dict | list | None:
        """A registry JSON file's content (None when there is none), under the same trust
        checks as models and within max_bytes (default: its size_cap); its fields are the
        caller's to check."""
        path = self.root / name
        try:
            data = self._read(path, max_bytes or size_cap(name))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise HorusError(f"{path}: {e.strerror}") from None
        if name == HISTORY_FILE and (why := _history_shape_problem(data)):
            raise HorusError(f"{path}: {why}")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise HorusError(f"{path}: corrupt file (invalid JSON)") from None

    def load_history(self) -> dict | None:
        """history.json (fields checked by HistoryPredictor.from_dict)."""
        return self.load_json(HISTORY_FILE)

    def pseudonym(self, user: str) -> str | None:
        """``user``'s name in history.json, from users/<user> (None when there is none, or the
        file is not one the registry wrote)."""
        if not _plain_name(user):
            return None
        try:
            text = self._read(self.root / USERS_DIR / user, 64).decode("ascii").strip()
        except (OSError, HorusError, UnicodeDecodeError):
            return None
        return text if PSEUDONYM_RE.fullmatch(text) else None

    def _read(self, path: Path, max_bytes: int) -> bytes:
        """A registry file's bytes, refused unless it and its folders are trusted (see above)
        and it holds at most max_bytes. The registry writes only regular files, so a symlink
        there is refused: it could serve a file from a folder nobody checked."""
        try:
            f = open_for_reading(path, follow_symlinks=False)  # a FIFO must not hang hsubmit
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise HorusError(f"{path}: a symlink, not a file the registry wrote") from None
            raise
        with f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise HorusError(f"{path}: not a regular file")
            self._check_folders(path.parent)
            _check_trusted(path, os.fstat(f.fileno()))
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise HorusError(f"{path}: file too large (at most {max_bytes:,} bytes)")
        return data

    def _check_folders(self, folder: Path | None = None) -> None:
        """HorusError unless ``folder`` (the root, or one inside it: users/), the root and its
        parents are trusted (see above)."""
        root = self.root.resolve()
        inner = folder.resolve() if folder is not None else root
        for d in ([inner] if inner != root else []):
            _check_trusted(d, d.stat())
        for d in (root, *root.parents):
            _check_trusted(d, d.stat(), sticky_ok=d != root)

    def list(self) -> list[dict]:
        """One entry per version: its metrics, size of training data and whether it serves."""
        serving = self.serving()
        out = []
        for v in self.versions():
            try:
                model = self.load(v)
                out.append({"version": v, "serving": v == serving, "metrics": model.metrics,
                            "meta": model.meta, "valid": True})
            except HorusError as e:
                out.append({"version": v, "serving": v == serving, "valid": False,
                            "error": str(e)})
        return out

    # --- writing (admin) -------------------------------------------------------------------

    def add(self, model: LearnedModel) -> str:
        """Store a new version (not serving yet); returns its name."""
        self._make_root()
        while True:
            versions = self.versions()
            number = int(versions[-1][1:]) + 1 if versions else 1
            version = f"v{number:04d}"
            model.meta.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            text = model.to_json()
            if len(text) > MAX_MODEL_BYTES:  # every reader would refuse it
                raise HorusError(f"model of {len(text) / 2**20:.0f} MiB, over the "
                                 f"{MAX_MODEL_BYTES >> 20} MiB readers take; not stored")
            path = self.root / f"{version}.json"
            try:
                tmp = self._write_temp(text)
                try:
                    os.link(tmp, path)  # fails if another writer took it
                    return version
                except FileExistsError:
                    continue
                finally:
                    os.unlink(tmp)
            except OSError as e:
                raise _not_written(path, e) from None

    def lock(self):
        """The registry's changes one at a time (retrain, promote, rollback): a retrain that
        read the serving version before another promoted wrote bounds for a model no longer
        serving. Re-entrant within this Registry; another holder is an error, not a wait."""
        registry = self

        class _Lock:
            def __enter__(self):
                if registry._lock_depth == 0 and registry.root.is_dir():  # none: nothing to change
                    path = registry.root / ".lock"
                    try:  # never a FIFO's wait, never through a link
                        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
                    except OSError as e:
                        raise HorusError(f"{path}: {e.strerror or e}") from None
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                        os.close(fd)
                        raise HorusError(f"{path}: not a lock file the registry made: remove it")
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)
                        raise HorusError(f"model registry {registry.root}: another retrain, promote "
                                         "or rollback is running; try again when it ends") from None
                    registry._lock_fd = fd
                registry._lock_depth += 1

            def __exit__(self, *exc):
                registry._lock_depth -= 1
                if registry._lock_depth == 0 and registry._lock_fd is not None:
                    os.close(registry._lock_fd)
                    registry._lock_fd = None
        return _Lock()

    def promote(self, version: str) -> None:
        with self.lock():
            self._promote(version)

    def restore(self, state: dict) -> None:
        """Serve as ``state`` (an earlier state()) said: undoes a promote the ledger could not
        record, which would otherwise serve a model the ledger says was not promoted."""
        with self.lock():
            self._write_state(state)

    def _promote(self, version: str) -> None:
        self.load(version)  # refuse to serve a file that does not load
        state = self.state()
        history = list(state.get("history", []))
        if state.get("serving") and state["serving"] != version:  # promoting it again is no change
            history.append(state["serving"])
        self._write_state({"serving": version, "history": history[-50:],
                           "changed": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    def rollback(self) -> str:
        """Serve the previously serving version again."""
        with self.lock():
            return self._rollback()

    def _rollback(self) -> str:
        state = self.state()
        history = list(state.get("history", []))
        if not history:
            raise HorusError("nothing to roll back to: no earlier serving version")
        previous = history.pop()
        self.load(previous)
        self._write_state({"serving": previous, "history": history,
                           "changed": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return previous

    def save_json(self, name: str, obj, mode: int = 0o644) -> None:
        """Replace a registry JSON file atomically (readers see the old or the new file, whole)."""
        text = json.dumps(obj, separators=(",", ":"))
        cap = size_cap(name)
        if len(text) > cap:  # every reader would refuse it: the old one serves
            raise HorusError(f"{name}: {len(text) / 2**20:.1f} MiB, over the {cap / 2**20:g} MiB "
                             "readers take; not replaced")
        if name == HISTORY_FILE and (why := _history_shape_problem(text.encode())):
            raise HorusError(f"{name}: {why}; not replaced")
        self._make_root()
        self._replace(self.root / name, text, mode)

    def pseudonyms(self, users) -> dict[str, str]:
        """{name: pseudonym} of ``users`` under the registry's key (made on first use, root's
        alone), and for each user this host knows, users/<name> holding theirs, owned by them
        and readable by them alone (rewritten only when it changed)."""
        key = self._key()
        out = {u: "u-" + hmac.new(key, u.encode(), hashlib.sha256).hexdigest()[:16] for u in users}
        folder = self.root / USERS_DIR
        own_dir(folder, 0o711)  # each user opens their own file; nobody lists who has one
        remove_stale_temps(folder, f"{TEMP_PREFIX}*{TEMP_SUFFIX}")
        for old in os.listdir(folder):  # a user gone: their uid may be someone else's next
            if old not in out and not old.startswith("."):
                (folder / old).unlink(missing_ok=True)
        for user, name in out.items():
            path = folder / user
            try:
                uid, gid = (pwd.getpwnam(user)[2:4]) if _plain_name(user) else (None, None)
            except KeyError:
                uid = gid = None
            if uid is None:  # unknown here (deleted?): whoever gets the uid next must not read it
                if _plain_name(user):
                    path.unlink(missing_ok=True)
                continue
            try:
                st = path.lstat()
                if (stat.S_ISREG(st.st_mode) and st.st_uid == (uid if os.geteuid() == 0 else st.st_uid)
                        and stat.S_IMODE(st.st_mode) == 0o400
                        and _head(path) == name):
                    continue
            except OSError:  # gone, or not to be read now (_head): written anew
                pass
            self._replace(path, name + "\n", 0o400, (uid, gid))
        return out

    def _key(self) -> bytes:
        """The pseudonyms' key: 32 random bytes, made once (whole, in one link: an export that
        crashed or raced another never leaves a short one), readable by root alone."""
        path = self.root / KEY_FILE
        self._make_root()
        if not path.exists():
            tmp = self._write_temp("", 0o600)
            try:
                with open(tmp, "wb") as f:
                    f.write(secrets.token_bytes(32))
                    f.flush()
                    os.fsync(f.fileno())
                os.link(tmp, path)
            except FileExistsError:
                pass  # another export made it first: theirs it is
            finally:
                os.unlink(tmp)
        key = self._read(path, 64)
        if len(key) != 32:
            raise HorusError(f"{path}: not a key the registry wrote (remove it: the pseudonyms "
                             "change once)")
        return key

    def _make_root(self) -> None:
        """The folder, made before a write, with the temp files of writers killed mid-write
        removed (they had stayed for good)."""
        create_site_dirs(self.root)
        remove_stale_temps(self.root, f"{TEMP_PREFIX}*{TEMP_SUFFIX}")

    def save_history(self, history: dict) -> None:
        self.save_json(HISTORY_FILE, history)

    def _write_state(self, state: dict) -> None:
        self._make_root()
        self._replace(self.root / "current.json", json.dumps(state, indent=1))

    def check_writable(self) -> None:
        """HorusError unless a file can be written here (what every change of the registry
        does first): retrain asks before it trains, not after minutes of it."""
        try:
            self._make_root()
            os.unlink(self._write_temp(""))
        except OSError as e:
            raise HorusError(f"model registry {self.root}: cannot write ({e.strerror or e})") from None
        self._check_folders()  # what every reader will refuse, found now

    def _replace(self, path: Path, text: str, mode: int = 0o644,
                 owner: tuple[int, int] | None = None) -> None:
        """Replace ``path`` with ``text`` in one rename, of ``mode`` (and, run as root, ``owner``'s
        uid and gid); HorusError naming it where it cannot be written (a full disk: the old file
        stands, and no temp file is left)."""
        try:
            replace_text(path, text, TEMP_PREFIX, TEMP_SUFFIX, mode,
                         owner if os.geteuid() == 0 else None)
        except OSError as e:
            raise _not_written(path, e) from None

    def _write_temp(self, text: str, mode: int = 0o644) -> str:
        """A synced temp file holding ``text`` in the root, of the names _make_root removes once
        stale; removed where the write fails."""
        return write_temp(self.root, text, TEMP_PREFIX, TEMP_SUFFIX, mode)


def _not_written(path: Path, e: OSError) -> HorusError:
    """The one-line error of a registry file not written (a full disk, a read-only folder)."""
    return HorusError(f"{path}: not written ({e.strerror or e})")


def calibration_file(version: str) -> str:
    """The file of a learned version's own calibrated bounds (written by retrain)."""
    return f"calibration-{version}.json"


def size_cap(name: str) -> int:
    """The most bytes registry file ``name`` may hold: readers refuse more, save_json writes
    no more (docs/ledger.md, Retraining)."""
    if name == HISTORY_FILE:
        return MAX_HISTORY_BYTES
    if name.startswith("rows-"):
        return MAX_ROWS_BYTES
    return MAX_MODEL_BYTES if VERSION_RE.fullmatch(name.removesuffix(".json")) else MAX_SMALL_JSON


_STRUCTURE = b'"{[,'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_COUNT_CHUNK = 1 << 20


def _structure_counts(data: bytes, max_containers: int, max_values: float) -> tuple[int, int]:
    """(objects and lists, values) of JSON ``data``: its braces and brackets, and those with its
    commas, outside its strings (as the parser tokenizes them; what it parses of a file it
    then refuses is counted too). Counted in all its bytes first (fast: a real file has few
    in its strings); only past a cap are its strings left out, a megabyte at a time."""
    containers = data.count(b"{") + data.count(b"[")
    values = containers + data.count(b",")
    if containers <= max_containers and values <= max_values:
        return containers, values
    if b"\\" in data:  # escapes: a backslash's own, then a quote's (no string's end)
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    compact = data.translate(None, _NOT_STRUCTURE)  # quotes, braces, brackets, commas
    containers = commas = 0
    inside = False  # within a string where a chunk starts
    for start in range(0, len(compact), _COUNT_CHUNK):
        parts = compact[start:start + _COUNT_CHUNK].split(b'"')
        outside = b"".join(parts[int(inside)::2])
        containers += outside.count(b"{") + outside.count(b"[")
        commas += outside.count(b",")
        inside ^= len(parts) % 2 == 0  # an odd number of quotes in the chunk
    return containers, containers + commas


def _history_shape_problem(data: bytes) -> str | None:
    """Why history.json's bytes are not an export's (more values, or objects and lists, than
    one within the byte cap holds); None where they may be."""
    return _shape_problem(data, MAX_HISTORY_CONTAINERS, MAX_HISTORY_VALUES)


def _shape_problem(data: bytes, max_containers: int, max_values: float = math.inf) -> str | None:
    """Why JSON ``data`` holds more objects and lists, or values, than its readers take, told by
    counting before parsing it builds millions of objects; None where it may not."""
    containers, values = _structure_counts(data, max_containers, max_values)
    if containers > max_containers:
        return f"{containers:,} objects and lists, more than readers take ({max_containers:,})"
    if values > max_values:
        return f"{values:,} values, more than readers take ({max_values:,})"
    return None


def _plain_name(user: str | None) -> bool:
    return bool(user) and "/" not in user and not user.startswith(".") and "\0" not in user


def _head(path: Path) -> str:
    """The file's first line, read without waiting (OSError otherwise): its owner may hold a
    write lease on it, which had held a plain open(), and the export, lease-break-time (45 s)."""
    with open_for_reading(path, follow_symlinks=False, regular_only=True) as f:
        return f.read(64).decode("ascii", errors="replace").strip()

