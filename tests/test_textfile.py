"""The one writer of whole text files (textfile.replace_text and write_temp), which the claim
record, the hook's pressure file, the requeue journal and the model registry share."""

import errno
import os
import stat

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.ledger.publish import write_atomically
from slurm_horus.predict.registry import Registry
from slurm_horus.textfile import (NOT_FILE, NOT_FOLDER, NOT_OWNER, WRITABLE, replace_text, untrusted,
                                  write_temp)


def test_a_replaced_file_has_its_text_mode_and_owner_and_no_temp_is_left(tmp_path):
    path = tmp_path / "f"
    path.write_text("old\n")
    uid, gid = (65534, 65534) if os.geteuid() == 0 else (-1, os.getegid())
    replace_text(path, "new\n", ".w-", ".tmp", 0o640, (uid, gid))
    st = path.stat()
    assert path.read_text() == "new\n" and stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_gid == gid and st.st_uid == (os.geteuid() if uid == -1 else uid)
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


@pytest.mark.parametrize("failing", ["fsync", "fchown", "replace"])
def test_a_write_that_fails_keeps_the_old_file_and_its_error_and_leaves_no_temp(tmp_path, monkeypatch,
                                                                                 failing):
    """A full disk (or a group the writer may not give) fails the write: the caller gets the
    OSError to say so in its own words, readers the old file, and no temp file stays."""
    path = tmp_path / "f"
    path.write_text("old\n")

    def full(*a):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, failing, full)
    with pytest.raises(OSError) as raised:
        replace_text(path, "new\n", ".w-", owner=(-1, os.getegid()))
    monkeypatch.undo()
    assert raised.value.errno == errno.ENOSPC
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_temp_that_cannot_be_removed_does_not_hide_the_full_disk_that_failed_the_write(tmp_path,
                                                                                         monkeypatch):
    """The registry's writer removed a failed temp file unguarded: an error there replaced the
    full disk's in the one line the admin reads."""
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def gone(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)

    reg = Registry(tmp_path / "models")
    reg.save_json("calibration.json", {"kept": 1})
    monkeypatch.setattr(os, "fsync", full)
    monkeypatch.setattr(os, "unlink", gone)
    with pytest.raises(HorusError, match=r"calibration\.json: not written \(No space left on device\)$"):
        reg.save_json("calibration.json", {"kept": 0})
    with pytest.raises(OSError) as raised:
        write_atomically(tmp_path / "record", "new\n")
    assert raised.value.errno == errno.ENOSPC


def test_a_temp_file_is_synced_and_named_for_its_writers_cleanup(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    tmp = write_temp(tmp_path, "text", ".w-", ".json", 0o600)
    assert synced and os.path.dirname(tmp) == str(tmp_path)
    name = os.path.basename(tmp)
    assert name.startswith(".w-") and name.endswith(".json")
    assert open(tmp).read() == "text" and stat.S_IMODE(os.stat(tmp).st_mode) == 0o600


def _st(mode, uid=0, gid=0):
    return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize("st, kw, why", [
    (_st(stat.S_IFREG | 0o644), {}, ()),
    (_st(stat.S_IFDIR | 0o755), {"kind": "folder"}, ()),
    (_st(stat.S_IFREG | 0o600, uid=1000), {}, ()),  # one of the owners
    (_st(stat.S_IFDIR | 0o755), {"kind": "file"}, (NOT_FILE,)),
    (_st(stat.S_IFLNK | 0o777), {"kind": "file"}, (NOT_FILE, WRITABLE)),
    (_st(stat.S_IFREG | 0o644), {"kind": "folder"}, (NOT_FOLDER,)),
    (_st(stat.S_IFREG | 0o644, uid=1001), {}, (NOT_OWNER,)),
    (_st(stat.S_IFREG | 0o664), {}, (WRITABLE,)),
    (_st(stat.S_IFREG | 0o646), {}, (WRITABLE,)),
    (_st(stat.S_IFDIR | 0o777, uid=1001), {"kind": "file"}, (NOT_FILE, NOT_OWNER, WRITABLE)),
    # sticky_ok: a sticky folder others write to (as /tmp), never a sticky file
    (_st(stat.S_IFDIR | 0o1777), {}, (WRITABLE,)),
    (_st(stat.S_IFDIR | 0o1777), {"sticky_ok": True}, ()),
    (_st(stat.S_IFDIR | 0o1777, uid=1001), {"sticky_ok": True}, (NOT_OWNER,)),
    (_st(stat.S_IFREG | 0o1666), {"sticky_ok": True}, (WRITABLE,)),
    # group_ok: group write by those gids alone, never write by others
    (_st(stat.S_IFDIR | 0o775, gid=0), {"group_ok": (0,)}, ()),
    (_st(stat.S_IFDIR | 0o775, gid=100), {"group_ok": (0,)}, (WRITABLE,)),
    (_st(stat.S_IFDIR | 0o757, gid=0), {"group_ok": (0,)}, (WRITABLE,)),
])
def test_untrusted_gives_every_reason_in_order(st, kw, why):
    assert untrusted(st, (0, 1000), **kw) == why


def test_untrusted_owners_are_exactly_those_given():
    st = _st(stat.S_IFREG | 0o644, uid=0)
    assert untrusted(st, (1000,)) == (NOT_OWNER,)  # root is no owner unless named
    assert untrusted(st, ()) == (NOT_OWNER,)
    assert untrusted(st, {0}) == ()
    with pytest.raises(ValueError):
        untrusted(st, (0,), kind="dir")


@pytest.mark.parametrize("kind", ["fifo", "folder", "other-writable"])
def test_read_text_with_owners_refuses_what_it_may_not_trust_without_reading_it(tmp_path, kind):
    """read_text(owners=...) judges the file it opened: a FIFO (nobody writing: no wait), a
    folder or a file others may write is one line, never its text."""
    from slurm_horus.textfile import read_text

    path = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "folder":
        path.mkdir(0o755)
    else:
        path.write_text("forged\n")
        os.chmod(path, 0o646)
    with pytest.raises(HorusError) as e:
        read_text(path, "rows", 100, owners=(os.geteuid(),))
    assert {"fifo": NOT_FILE, "folder": "Is a directory", "other-writable": WRITABLE}[kind] in str(e.value)
    assert "\n" not in str(e.value) and "forged" not in str(e.value)
    if kind == "other-writable":
        os.chmod(path, 0o644)
        assert read_text(path, "rows", 100, owners=(os.geteuid(),)) == "forged\n"
        assert read_text(path, "rows", 100) == "forged\n"  # no owners: no check, as before
