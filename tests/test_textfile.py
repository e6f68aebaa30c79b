"""The one writer of whole text files (textfile.replace_text and write_temp), which the claim
record, the hook's pressure file, the requeue journal and the model registry share."""

import errno
import os
import stat

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.ledger.publish import write_atomically
from slurm_horus.predict.registry import Registry
from slurm_horus.textfile import replace_text, write_temp


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
