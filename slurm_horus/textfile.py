"""Text files a command is pointed at (a cluster description, a policy, slurm.conf, a GPU
catalog, an export), read as one-line HorusErrors: missing, a folder, larger than the caller
allows, not UTF-8, or (where what it says is acted on as fact) one another user may change --
never a traceback, and never an endless read of /dev/zero or a pipe; the folders the site's own
files are written to, made 0755 whatever the umask; text files written whole, in one rename;
the temp files writers killed mid-write left there, removed; and the one rule of which files and
folders may be trusted (untrusted)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Collection

from slurm_horus.errors import HorusError

__all__ = ["NOT_FILE", "NOT_FOLDER", "NOT_OWNER", "WRITABLE", "create_site_dirs", "open_for_reading",
           "read_text", "remove_stale_temps", "replace_text", "untrusted", "write_temp"]

# a writer's temp file changes while it is filled and is renamed into place within seconds (a
# minute for a GB ledger's copy): one unchanged for an hour is a killed writer's, and a writer
# stopped longer (SIGSTOP) fails its rename with an error, losing nothing
STALE_TEMP_S = 3600

# untrusted's reasons, in the order it looks; each caller words its own message from them
NOT_FILE, NOT_FOLDER = "not a regular file", "not a folder"
NOT_OWNER = "not owned by an allowed user"
WRITABLE = "writable by group or others"


def untrusted(st: os.stat_result, owners: Collection[int], *, kind: str | None = None,
              sticky_ok: bool = False, group_ok: Collection[int] = ()) -> tuple[str, ...]:
    """Why the file or folder of stat ``st`` is not to be trusted, every reason in order
    (NOT_FILE or NOT_FOLDER, NOT_OWNER, WRITABLE); () when it is.  What slurm-horus takes as
    measured or as the site's (usage rows, a model, the policy, an export cache) must be
    changeable by nobody but ``owners`` (uids): owned by one of them, written by neither group nor
    others.  ``kind``: "file" (a regular one) or "folder" required, None either.  Where a place
    accepts more, it says so: ``sticky_ok`` a sticky folder others write to (as /tmp: only an
    entry's owner may rename or remove it; never where a new name alone does harm), ``group_ok``
    group write where the group is one of these gids (root's: only root's members)."""
    if kind not in (None, "file", "folder"):
        raise ValueError(f"kind: {kind!r}")
    mode = st.st_mode
    why = []
    if kind == "file" and not stat.S_ISREG(mode):
        why.append(NOT_FILE)
    elif kind == "folder" and not stat.S_ISDIR(mode):
        why.append(NOT_FOLDER)
    if st.st_uid not in owners:
        why.append(NOT_OWNER)
    if ((mode & 0o002 or (mode & 0o020 and st.st_gid not in group_ok))
            and not (sticky_ok and stat.S_ISDIR(mode) and mode & stat.S_ISVTX)):
        why.append(WRITABLE)
    return tuple(why)


def open_for_reading(path: str | os.PathLike, follow_symlinks: bool = True,
                     regular_only: bool = False) -> BinaryIO:
    """``open(path, "rb")`` that does not wait for a writer: a FIFO nobody writes to reads as
    empty instead of hanging the command (a pipe being written, as from ``<(...)``, reads as
    usual).  Without ``follow_symlinks`` a symlink as the last component raises OSError (ELOOP);
    with ``regular_only`` anything but a regular file (a FIFO, /dev/zero, a folder) raises
    OSError too.  Raises OSError."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if regular_only and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | os.PathLike, what: str, max_bytes: int, errors: str = "strict", *,
              owners: Collection[int] | None = None) -> str:
    """The file's text; HorusError("<what> <path>: ...") when it cannot be had (``errors``:
    "replace" reads a file with a stray byte as Slurm does, bytes it does not care about).
    ``owners`` (uids): only a regular file of one of them that no one else can write is read
    (untrusted), judged on the descriptor read, so no rename after the check swaps the file."""
    try:
        with open_for_reading(path) as f:
            why = untrusted(os.fstat(f.fileno()), owners, kind="file") if owners is not None else ()
            if why:
                raise HorusError(f"{what} {path}: {', '.join(why)}: only a regular file of "
                                 f"{' or '.join(_user_name(u) for u in sorted(set(owners)))} that "
                                 "no one else can write is read")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise HorusError(f"{what} {path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise HorusError(f"{what} {path}: larger than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8-sig", errors)  # a leading BOM (Excel's "CSV UTF-8") is no content
    except UnicodeDecodeError:
        raise HorusError(f"{what} {path}: not UTF-8 text") from None


def _user_name(uid: int) -> str:
    """A uid's user name, else the number."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def create_site_dirs(folder: str | os.PathLike) -> None:
    """Create missing folders 0755 whatever the umask (a group-writable one is refused by every
    reader that checks trust); existing ones keep their mode."""
    missing = []
    d = Path(folder)
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o755)
            os.chmod(d, 0o755)
        except FileExistsError:
            pass


def own_dir(folder: str | os.PathLike, mode: int) -> None:
    """Create ``folder`` (create_site_dirs) and give it ``mode``, refusing (HorusError) one that
    is a symbolic link or not this process's user's, or one inside a folder another user may
    change (_others_may_change): root re-moding, or writing users' files into, a folder a link
    points elsewhere, or another user may swap files in or swap for their own."""
    create_site_dirs(folder)
    for d in {*Path(os.path.abspath(folder)).parents, *Path(folder).resolve().parents}:
        if _others_may_change(d):
            raise HorusError(f"{folder}: inside {d}, which other users may change (its owner or "
                             "mode): nothing written there")
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise HorusError(f"{folder}: not a plain folder ({e.strerror}): nothing written there") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise HorusError(f"{folder}: owned by another user: nothing written there")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _others_may_change(d: Path) -> bool:
    """Whether a user other than root and this one may rename or replace what folder ``d``
    holds: its owner, or others (or a group other than root's) with write access and no sticky
    bit (in a sticky folder such as /tmp only an entry's owner may move it); or, for a symbolic
    link on the way, its owner (who may point it elsewhere)."""
    if d.is_symlink() and d.lstat().st_uid not in (0, os.geteuid()):  # a link's mode means nothing
        return True
    return bool(untrusted(d.stat(), (0, os.geteuid()), sticky_ok=True, group_ok=(0,)))


def write_temp(folder: str | os.PathLike, text: str, prefix: str, suffix: str = "",
               mode: int = 0o644, owner: tuple[int, int] | None = None) -> str:
    """A temp file in ``folder`` (named ``prefix``, random characters, ``suffix``: the names its
    writer's remove_stale_temps matches) holding ``text``, of ``mode`` and ``owner`` ((uid, gid),
    -1 leaving one as it is), synced before its writer renames or links it into place; removed
    where the write fails (a full disk had left an empty one each time).  Raises OSError."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # as read_text reads it, whatever the locale
            f.write(text)
            f.flush()
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def replace_text(path: str | os.PathLike, text: str, prefix: str, suffix: str = "",
                 mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
    """Replace ``path`` with ``text`` in one rename of a temp file beside it (write_temp):
    readers see the old file or the new one, whole.  Where the write fails (a full disk) the old
    file stands and no temp file is left.  Raises OSError."""
    tmp = write_temp(os.path.dirname(os.path.abspath(path)), text, prefix, suffix, mode, owner)
    try:
        os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: str) -> None:
    """Remove a failed write's temp file, keeping the error that failed it."""
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def remove_stale_temps(folder: str | os.PathLike, pattern: str, owner: int | None = None) -> None:
    """Remove the files in ``folder`` that match ``pattern`` (a writer's own temp-file names, a
    glob) and are unchanged for STALE_TEMP_S: a writer killed mid-write (SIGTERM, a crash) leaves
    its temp file, which nothing else removes (a 108 MB copy of the ledger had stayed), while a
    concurrent writer's is never that old.  ``owner``: only that uid's files, where the folder
    is not the site's own (a sticky /tmp: another user's file of that name is theirs).  A file
    it cannot remove is left: a cleanup never fails the write it comes before."""
    cutoff = time.time() - STALE_TEMP_S
    for path in Path(folder).glob(pattern):
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff and owner in (None, st.st_uid):
                path.unlink()
        except OSError:
            pass
