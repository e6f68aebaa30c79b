"""history.json is readable by every user: it names users by pseudonyms, each user can read
their own and no one else's, and the registry's private files stay root's."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.graph.features import FEATURE_NAMES, FEATURE_VERSION
from slurm_horus.ledger import Ledger
from slurm_horus.ledger.history_export import export_history
from slurm_horus.predict.registry import PSEUDONYM_RE, Registry

USERS = ("nobody", "daemon")  # accounts every Debian host has


@pytest.fixture
def shared_dir():
    """A folder other users can traverse (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="horus-privacy-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _ledger(folder: Path, users=USERS * 2, family: str = "resnet50", graphs: int = 2,
            predicted=(80.0, 5000.0), used=(60.0, 5000.0)) -> Ledger:
    """Job i (from 1) run by users[i-1], of graph i % graphs, every one of ``family``."""
    L = Ledger(f"sqlite:///{folder}/l.db", spool=str(folder / "sp"))
    for jid, user in enumerate(users, 1):
        L.record_submission(job_id=jid, cluster="c", user=user, model_sha256=f"{jid % graphs:02x}" * 32,
                            model_path=f"/m/{family}.onnx", model_family=family,
                            features={n: 1.0 for n in FEATURE_NAMES}, feature_version=FEATURE_VERSION,
                            workload={"batch_size": 32, "task": "train"},
                            predictions={"a100-40gb": {"util_pct": predicted[0], "mem_mib": predicted[1]}})
        L.record_usage(job_id=jid, cluster="c", source="sacct", util_mean=used[0], util_max=99,
                       mem_peak_mib=used[1] + jid, gpu_index=0, state="COMPLETED", elapsed_s=600,
                       node="n1", gpu_type="a100-40gb", start_time=1700000000, end_time=1700000600)
    return L


def _as(user: str, code: str) -> subprocess.CompletedProcess:
    pw = pwd.getpwnam(user)
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[1])})


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_history_names_no_user_and_each_user_reads_only_their_own_pseudonym(shared_dir, python_for_others):
    root = shared_dir / "models"
    export_history(_ledger(shared_dir), Registry(root))
    text = (root / "history.json").read_text()
    assert not any(u in text for u in USERS)
    doc = json.loads(text)
    assert doc["pseudonymous"] is True
    names = {r["user"] for runs in doc["graphs"].values() for r in runs}
    assert len(names) == 2 and all(PSEUDONYM_RE.fullmatch(n) for n in names)
    for user in USERS:
        st = (root / "users" / user).stat()
        assert st.st_uid == pwd.getpwnam(user).pw_uid and st.st_mode & 0o777 == 0o400
    assert (root / ".pseudonym-key").stat().st_mode & 0o777 == 0o600
    # nobody's hsubmit knows itself in the history, and cannot read daemon's name there
    r = _as("nobody", "from slurm_horus.predict.chain import choose_predictor\n"
                      f"print(choose_predictor({str(root)!r}).estimator.user)\n"
                      f"open({str(root / 'users' / 'daemon')!r})")
    own = r.stdout.strip()
    assert own in names and "PermissionError" in r.stderr
    # nor who has a pseudonym at all (users/ was 0755: listing it, and comparing exports,
    # tied a new pseudonym to the one new name)
    r = _as("nobody", f"import os\nos.listdir({str(root / 'users')!r})")
    assert "PermissionError" in r.stderr and (root / "users").stat().st_mode & 0o777 == 0o711
    # jobs 1 and 3 (graph 01..) were nobody's, 2 and 4 (graph 00..) daemon's
    assert {x["user"] for x in doc["graphs"]["01" * 32]} == {own}
    assert own not in {x["user"] for x in doc["graphs"]["00" * 32]}
    # the same names at the next export; a key of the wrong size is refused, not replaced
    export_history(_ledger(shared_dir), Registry(root))
    assert {r["user"] for runs in json.loads((root / "history.json").read_text())["graphs"].values()
            for r in runs} == names
    (root / ".pseudonym-key").write_bytes(b"short")
    with pytest.raises(HorusError, match="pseudonym-key"):
        export_history(_ledger(shared_dir), Registry(root))


def test_registry_folders_are_0755_whatever_the_umask_and_users_0711(tmp_path):
    old = os.umask(0o002)
    try:
        reg = Registry(tmp_path / "a" / "models")
        reg.save_json("x.json", {})
        reg.pseudonyms(["someone-unknown-here"])
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "models"):
        assert d.stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "models" / "users").stat().st_mode & 0o777 == 0o711
    assert reg.load_json("x.json") == {}  # a reader trusts what it wrote


def test_registry_changes_one_at_a_time_and_files_readers_take(tmp_path):
    """A retrain that read the serving version before another promoted wrote bounds for a model
    no longer serving: retrain, promote and rollback hold the registry's lock. A state naming no
    version (hand-edited) is refused before anything builds on it (a retrain had promoted over
    it and left every later change refused); a file readers would refuse is not written; a
    huge current.json or calibration.json is refused, not parsed by every hsubmit."""
    root = tmp_path / "models"
    a, b = Registry(root), Registry(root)
    a.save_json("x.json", {})  # a registry there: the lock guards it
    with a.lock(), a.lock():  # re-entrant in one Registry
        with pytest.raises(HorusError, match="another retrain, promote or rollback is running"):
            b.promote("v0001")
        with pytest.raises(HorusError, match="another retrain"):
            b.rollback()
    with pytest.raises(HorusError, match="not in the registry"):
        b.promote("v0001")  # the lock is free again: the version's own error
    root.joinpath("current.json").write_text('{"serving": "v1", "history": []}')
    with pytest.raises(HorusError, match="not a registry state file"):
        a.state()
    root.joinpath("current.json").write_text('{"serving": null, "history": [], "x": "' + "y" * (1 << 20) + '"}')
    with pytest.raises(HorusError, match="too large"):
        a.state()
    root.joinpath("calibration.json").write_text("[" + "[]," * (1 << 19) + "[]]")
    from slurm_horus.predict.registry import MAX_SMALL_JSON

    with pytest.raises(HorusError, match="too large"):
        a.load_json("calibration.json", max_bytes=MAX_SMALL_JSON)
    with pytest.raises(HorusError, match="readers take; not replaced"):
        a.save_json("history.json", {"x": "y" * (65 << 20)})
    assert not root.joinpath("history.json").exists()
    # a mistyped registry path is not made one by a failed promote; a FIFO at .lock is no wait
    none = Registry(tmp_path / "typo" / "models")
    with pytest.raises(HorusError, match="nothing to roll back"):
        none.rollback()
    assert not (tmp_path / "typo").exists()
    (root / ".lock").unlink()
    os.mkfifo(root / ".lock")
    with pytest.raises(HorusError, match=r"\.lock: "):  # one line (ENXIO), never a wait
        a.rollback()


def test_a_registry_readers_would_refuse_is_refused_before_training(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    os.chmod(root, 0o775)
    with pytest.raises(HorusError, match="writable by group or others"):
        Registry(root).check_writable()


def test_rows_file_of_a_version_is_roots_alone(tmp_path):
    reg = Registry(tmp_path / "models")
    reg.save_json("rows-v0001.json", {"version": 1, "keys": ["c/1"]}, mode=0o600)
    assert (tmp_path / "models" / "rows-v0001.json").stat().st_mode & 0o777 == 0o600
    assert reg.load_json("rows-v0001.json")["keys"] == ["c/1"]


def test_a_user_gone_from_the_history_loses_their_pseudonym_file(tmp_path):
    # their uid may be given to someone else, who could then read it and find their runs
    reg = Registry(tmp_path / "models")
    reg.pseudonyms(["nobody", "daemon"])
    assert {p.name for p in (tmp_path / "models" / "users").iterdir()} == {"nobody", "daemon"}
    reg.pseudonyms(["nobody"])
    assert {p.name for p in (tmp_path / "models" / "users").iterdir()} == {"nobody"}
    # a user deleted from the host whose runs stay in the history loses it too
    (tmp_path / "models" / "users" / "no-such-user-xyz").write_text("u-0000000000000000\n")
    reg.pseudonyms(["nobody", "no-such-user-xyz"])
    assert {p.name for p in (tmp_path / "models" / "users").iterdir()} == {"nobody"}
    assert len((tmp_path / "models" / ".pseudonym-key").read_bytes()) == 32


def test_history_names_no_model_family_and_the_family_still_answers(tmp_path):
    """Families are users' model file names ('acquisition-target.onnx'): history.json listed
    them for every user to read. It names them by salted hashes; a job whose file names one
    still gets its family's correction, as from the ledger itself."""
    from slurm_horus.ledger.history_export import build_history
    from slurm_horus.predict.history import HistoryPredictor
    from slurm_horus.predict.workload import Workload

    L = _ledger(tmp_path, users=[f"u{j % 3}" for j in range(1, 7)], family="acquisition-target",
                graphs=3, predicted=(40.0, 3000.0), used=(70.0, 9000.0))
    plain = build_history(L)
    published = build_history(L, pseudonyms=lambda users: {u: f"u-{i:016x}" for i, u in enumerate(users)})
    assert "acquisition-target" in json.dumps(plain)
    assert "acquisition" not in json.dumps(published) and published["family_salt"]
    w = Workload(batch_size=32, task="train")

    def answer(doc, family):
        h = HistoryPredictor.from_dict(json.loads(json.dumps(doc)))
        return h.estimate("ff" * 32, "a100-40gb", w, "", 3000.0, 40.0, family, None,
                          3000.0, 40.0, "cold-start")
    got = answer(published, "acquisition-target")
    assert got == answer(plain, "acquisition-target") and got.tier == "family"
    assert answer(published, "other-model").tier != "family"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_lease_on_a_pseudonym_file_holds_no_export(shared_dir, python_for_others):
    """users/<name> is its user's own file: a write lease on it (F_SETLEASE) had held the export's
    plain open() for lease-break-time (45 s), every export; it is read without waiting now, and
    a file that cannot be read is written anew."""
    import time

    reg = Registry(shared_dir / "models")
    (name,) = reg.pseudonyms(["nobody"]).values()
    path = shared_dir / "models" / "users" / "nobody"
    pw = pwd.getpwnam("nobody")
    holder = subprocess.Popen(
        ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", sys.executable,
         "-c", "import fcntl, os, signal, sys\n"
               "signal.signal(signal.SIGIO, signal.SIG_IGN)\n"  # the lease's break kills no holder
               f"fd = os.open({str(path)!r}, os.O_RDONLY)\n"
               "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n"
               "print('held', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        assert reg.pseudonyms(["nobody"]) == {"nobody": name}
        assert time.monotonic() - t0 < 10
        assert path.read_text().strip() == name and path.stat().st_uid == pw.pw_uid
    finally:
        holder.kill()
        holder.wait()
