"""Who may read and write the ledger: an ordinary user never opens the live SQLite file (root's,
0640) but the copy the last sync published, a snapshot or, where the site keeps jobs private,
their own extract, and can write none of them; a reader holding a transaction open blocks no
write; a database server that never answers fails within seconds and the probe's record is
spooled, not lost."""

import json
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_horus.cli.hacct import main as hacct
from slurm_horus.errors import HorusError
from slurm_horus.ledger import (Ledger, Spool, open_reader, record_usage_safely,
                                write_user_extracts)
from slurm_horus.ledger.publish import publish

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- a server that never answers

@pytest.fixture
def silent_server():
    """127.0.0.1:PORT accepting TCP and never sending a byte; stops itself after 90 s."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.5)
    held, stop = [], threading.Event()
    deadline = time.monotonic() + 90

    def serve():
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue
        for c in held:
            c.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)


def test_silent_database_fails_fast_and_probe_record_is_spooled(silent_server, tmp_path,
                                                                 monkeypatch):
    pytest.importorskip("pymysql")
    url = f"mysql+pymysql://u:p@127.0.0.1:{silent_server}/db"
    t0 = time.monotonic()
    with pytest.raises(HorusError, match="cannot open it"):
        Ledger(url)  # the default timeout
    assert time.monotonic() - t0 < 15
    t0 = time.monotonic()
    r = CliRunner().invoke(hacct, ["--ledger", url])
    assert time.monotonic() - t0 < 15
    assert r.exit_code != 0 and r.output.startswith("hacct: error:")
    assert len(r.output.strip().splitlines()) == 1
    monkeypatch.setenv("HORUS_DB_TIMEOUT", "2")
    spool = tmp_path / "spool"
    t0 = time.monotonic()
    assert record_usage_safely(url=url, spool=str(spool), job_id=77, cluster="c",
                               source="probe", util_mean=33, mem_peak_mib=1000) is False
    assert time.monotonic() - t0 < 6
    L = Ledger(f"sqlite:///{tmp_path}/l.db")
    assert Spool(spool).replay(L).applied == 1
    assert L.jobs()[0]["act_util_pct"] == 33


# --------------------------------------------------------------------------- an ordinary user

def _python_for(user: pwd.struct_passwd, root: Path) -> tuple[str, dict]:
    """A Python interpreter and environment with which ``user`` can import slurm_horus: this
    one if they may run it, else the system's same-version Python over a copy of the packages
    hacct needs (the test's own may live under a private home)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/", "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO)}
    probe = [sys.executable, "-c", "import sqlalchemy, click"]
    try:
        if subprocess.run(probe, user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env,
                          capture_output=True).returncode == 0:
            return sys.executable, env
    except PermissionError:
        pass  # not even runnable by them (a private home): the system's below
    exe = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}",
                       path="/usr/bin:/usr/local/bin")
    if exe is None:
        pytest.skip("no Python the ordinary user may run")
    site = root / "site"
    import click
    import markdown_it
    import mdurl
    import pygments
    import rich
    import sqlalchemy
    import typing_extensions

    for mod in (sqlalchemy, click, rich, markdown_it, mdurl, pygments):  # hacct's imports
        shutil.copytree(Path(mod.__file__).parent, site / mod.__name__,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(typing_extensions.__file__, site)
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
    env["PYTHONPATH"] = f"{site}:{REPO}"
    return exe, env


@pytest.fixture(scope="module")
def ordinary_user():
    """horus-alice where the local cluster has her, else a throwaway user removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    made = None
    try:
        user = pwd.getpwnam("horus-alice")
    except KeyError:
        made = f"horus-t{os.getpid()}"
        cp = subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", made],
                            capture_output=True, text=True)
        if cp.returncode != 0:
            pytest.skip(f"useradd: {cp.stderr.strip()}")
        user = pwd.getpwnam(made)
    root = Path(tempfile.mkdtemp(prefix="horus-access-"))
    os.chmod(root, 0o755)
    try:
        yield user, root, _python_for(user, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if made:
            subprocess.run(["userdel", made], capture_output=True)


def _as(user, py, *args, path_first=None):
    exe, env = py
    env = dict(env)
    if path_first:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    return subprocess.run([exe, *args], user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                          env=env, capture_output=True, text=True, timeout=60, cwd="/")


def _fake_scontrol(folder: Path, private: str | None) -> Path:
    """An scontrol that shows this PrivateData (None: one that cannot answer)."""
    folder.mkdir(exist_ok=True)
    script = folder / "scontrol"
    script.write_text("#!/bin/sh\nexit 1\n" if private is None else
                      f"#!/bin/sh\necho 'ClusterName = horus'\necho 'PrivateData = {private}'\n")
    os.chmod(script, 0o755)
    os.chmod(folder, 0o755)
    return folder


def _site_ledger(root: Path, user: str) -> str:
    url = f"sqlite:///{root}/lib/ledger.db"
    L = Ledger(url)
    for jid, name in ((1, user), (2, "someone-else")):
        L.record_submission(job_id=jid, cluster="horus", user=name, submit_time=1700000000 + jid,
                            predictions={"t4": {"util_pct": 10.0, "mem_mib": 500.0}})
        L.record_usage(job_id=jid, cluster="horus", source="sacct", state="COMPLETED",
                       shards=3)
    L.close()
    return url


def _publish(url: str, folder: Path, private: str | None, monkeypatch) -> dict:
    """What horus-admin sync publishes after a sync, where Slurm shows this PrivateData."""
    scontrol = _fake_scontrol(folder / "sync-bin", private)
    monkeypatch.setenv("PATH", f"{scontrol}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    (folder / "policy.conf").write_text(f"record_file = {folder / 'record'}\n")
    L = Ledger(url)
    try:
        return publish(L, policy=str(folder / "policy.conf"))
    finally:
        L.close()


def test_ordinary_user_reads_the_published_copy_and_cannot_write_it(ordinary_user, monkeypatch):
    user, root, py = ordinary_user
    url = _site_ledger(root / "a", user.pw_name)
    db = root / "a" / "lib" / "ledger.db"
    assert db.stat().st_uid == 0 and db.stat().st_mode & 0o777 == 0o640
    public = _fake_scontrol(root / "a" / "public-bin", "none")
    # nothing published yet: one line that says what makes it
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", url, path_first=public)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no copy for readers yet" in r.stderr and "horus-admin sync" in r.stderr
    out = _publish(url, root / "a", "none", monkeypatch)
    copy = db.with_name("ledger.db.readers")
    assert out["readers_copy"] == str(copy) and out["extracts"] is None
    assert (copy.stat().st_uid, copy.stat().st_mode & 0o777) == (0, 0o644)
    assert (db.stat().st_uid, db.stat().st_mode & 0o777) == (0, 0o640)
    assert open_reader(url).sqlite_path() == db  # root reads the live file
    def jobs(*args, where=public):
        r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", url, "-S", "2000-01-01",
                "--json", *args, path_first=where)
        assert r.returncode == 0, r.stderr
        return [(j["job_id"], j["user"]) for j in json.loads(r.stdout)]
    # as sacct: a user's own jobs, everyone's with -a or -u
    assert jobs() == [(1, user.pw_name)]
    assert jobs("-a") == [(1, user.pw_name), (2, "someone-else")]
    assert jobs("-u", "someone-else") == [(2, "someone-else")]
    assert jobs("-j", "2") == [(2, "someone-else")]  # as sacct: -j names the jobs, anyone's
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", f"sqlite:///{copy}", "-a", "-S",
            "2000-01-01", "--json", path_first=public)  # the copy named itself
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 2, r.stderr
    private = _fake_scontrol(root / "a" / "private-bin", "accounts,jobs")
    assert jobs("-a", where=private) == [(1, user.pw_name)]
    # where jobs are private, -u names another user: none of theirs, and not yours as theirs
    assert jobs("-u", "someone-else", where=private) == []
    assert jobs("-u", f"someone-else,{user.pw_name}", where=private) == [(1, user.pw_name)]
    before = db.read_bytes()
    write = ("import sys; from slurm_horus.ledger import Ledger\n"
             "try:\n"
             f"    Ledger({url!r}).record_usage(job_id=2, cluster='horus', source='probe',"
             " util_mean=1)\n"
             "except Exception as e:\n"
             "    print(type(e).__name__, e); sys.exit(3)\n")
    r = _as(user, py, "-c", write)
    assert r.returncode == 3, (r.stdout, r.stderr)
    r = _as(user, py, "-c", f"open({str(db)!r}, 'rb')")
    assert r.returncode != 0 and "PermissionError" in r.stderr
    r = _as(user, py, "-c", f"import sqlite3; sqlite3.connect({str(copy)!r})"
                            ".execute('DELETE FROM jobs').connection.commit()")
    assert r.returncode != 0 and "readonly" in r.stderr
    assert db.read_bytes() == before
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM usage WHERE source = 'probe'").fetchone() == (0,)


def test_a_ledger_from_before_the_copies_reads_as_before_until_a_sync(ordinary_user, monkeypatch):
    """An upgraded site's 0644 ledger has no copy until its first sync: hacct had said "no copy
    for readers yet" over a file users could read; an extract named itself had failed too."""
    user, root, py = ordinary_user
    url = _site_ledger(root / "c", user.pw_name)
    db = root / "c" / "lib" / "ledger.db"
    os.chmod(db, 0o644)
    public = _fake_scontrol(root / "c" / "public-bin", "none")
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", url, "-a", "-S", "2000-01-01",
            "--json", path_first=public)
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 2, r.stderr
    _publish(url, root / "c", "jobs", monkeypatch)  # private: extracts, the live file 0640
    ext = db.parent / "users" / f"{user.pw_name}.db"
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", f"sqlite:///{ext}", "-S", "2000-01-01",
            "--json", path_first=public)
    assert r.returncode == 0 and [j["job_id"] for j in json.loads(r.stdout)] == [1], r.stderr


def test_private_ledger_falls_back_to_the_users_extract(ordinary_user, monkeypatch):
    user, root, py = ordinary_user
    url = _site_ledger(root / "b", user.pw_name)
    db = root / "b" / "lib" / "ledger.db"
    assert _publish(url, root / "b", "jobs", monkeypatch)["extracts"] == 1
    assert not db.with_name("ledger.db.readers").exists()
    private = _fake_scontrol(root / "b" / "bin", "jobs")
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", url, "-S", "2000-01-01", "-P", "-n", "-o",
            "JobID,User,Alloc", path_first=private)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"1|{user.pw_name}|3 shards\n"
    ext = db.parent / "users" / f"{user.pw_name}.db"
    r = _as(user, py, "-c", f"import sqlite3; sqlite3.connect({str(ext)!r})"
                            ".execute('DELETE FROM jobs').connection.commit()")
    assert r.returncode != 0 and "readonly" in r.stderr
    # a user with no jobs rows: none listed, as sacct shows none (hacct had told them to ask
    # for a sync, which writes no extract of theirs)
    url = _site_ledger(root / "c", "daemon")
    assert _publish(url, root / "c", "jobs", monkeypatch)["extracts"] == 1
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", url, "-S", "2000-01-01", "-P", "-n", "-o",
            "JobID,User", path_first=private)
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    # a user whose extract they cannot read (an admin's sync could not give it to them): told
    # so, never shown the empty one as if they had no jobs
    ext.chmod(0o400)
    os.chown(ext, 0, 0)
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", f"sqlite:///{db}", "-S", "2000-01-01",
            "-P", "-n", path_first=private)
    assert r.returncode != 0 and "no copy for readers yet" in r.stderr, (r.stdout, r.stderr)


def test_a_ledger_whose_folder_is_read_only_is_not_writable(ordinary_user):
    """The user owns the SQLite file, root its folder: SQLite cannot make its journal there.  A
    write that changes no page passed the check, and retrain trained and promoted, then failed
    to record the version."""
    user, root, py = ordinary_user
    url = _site_ledger(root / "ro", user.pw_name)
    db = root / "ro" / "lib" / "ledger.db"
    os.chown(db, user.pw_uid, user.pw_gid)
    os.chmod(db.parent, 0o755)
    check = ("from slurm_horus.ledger import Ledger\n"
             f"Ledger({url!r}).check_writable()\n")
    r = _as(user, py, "-c", check)
    assert r.returncode != 0 and "cannot write (attempt to write a readonly database)" in r.stderr, r.stderr
    os.chmod(db.parent, 0o777)  # the folder writable too: the check passes, and leaves nothing
    r = _as(user, py, "-c", check)
    assert r.returncode == 0, r.stderr
    assert Ledger(url).count("predictor_versions") == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")
@pytest.mark.parametrize("private", ["jobs", "none", None])
def test_publish_keeps_the_record_and_ledger_to_whom_slurm_shows_jobs(tmp_path, monkeypatch, private):
    """Where PrivateData hides jobs the record (it names under-claimers) is SlurmUser's group's;
    where Slurm cannot say, the record keeps the mode it had. The live ledger is root's
    everywhere; readers get a snapshot only where Slurm says jobs are public, else extracts
    (a stale snapshot is removed)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text("#!/bin/sh\nexit 1\n" if private is None else
                      f"#!/bin/sh\necho 'PrivateData = {private}'\necho 'SlurmUser = daemon(1)'\n")
    os.chmod(script, 0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    record = tmp_path / "record"
    (tmp_path / "policy.conf").write_text(f"record_file = {record}\n")
    record.write_text("old\n")
    os.chmod(record, 0o600)
    url = _site_ledger(tmp_path / "s", "daemon")
    db = tmp_path / "s" / "lib" / "ledger.db"
    copy = db.with_name("ledger.db.readers")
    copy.write_bytes(b"stale")
    os.chmod(db, 0o644)  # an older install's
    out = publish(Ledger(url), policy=str(tmp_path / "policy.conf"))
    st = record.stat()
    assert (db.stat().st_uid, db.stat().st_mode & 0o777) == (0, 0o640)
    if private == "jobs":
        assert (st.st_mode & 0o777, st.st_gid) == (0o640, pwd.getpwnam("daemon").pw_gid)
    elif private == "none":
        assert st.st_mode & 0o777 == 0o644
    else:
        assert st.st_mode & 0o777 == 0o600
    if private == "none":
        assert out["extracts"] is None and out["readers_copy"] == str(copy)
        assert [j["job_id"] for j in Ledger(f"sqlite:///{copy}", readonly=True).jobs()] == [1, 2]
        assert not [p for p in db.parent.iterdir() if p.name.endswith(".tmp")]
    else:
        assert out["extracts"] == 1 and out["readers_copy"] is None and not copy.exists()
    assert record.read_text().startswith("# slurm-horus claim record")


def test_an_admin_who_is_not_root_writes_the_extracts(ordinary_user):
    """The extract's mode was set before SQLite wrote into it: only root writes past 0400."""
    user, root, py = ordinary_user
    url = _site_ledger(root / "e", user.pw_name)
    os.chown(root / "e" / "lib", user.pw_uid, user.pw_gid)  # the admin's site folder
    os.chmod(root / "e" / "lib" / "ledger.db", 0o644)
    code = ("from slurm_horus.ledger import Ledger, write_user_extracts\n"
            f"print(write_user_extracts(Ledger({url!r}, readonly=True), {str(root / 'e' / 'lib' / 'users')!r}))\n")
    r = _as(user, py, "-c", code)
    assert r.returncode == 0 and "'written': 1" in r.stdout, r.stderr
    ext = root / "e" / "lib" / "users" / f"{user.pw_name}.db"
    assert ext.stat().st_mode & 0o777 == 0o400


@pytest.mark.parametrize("private", ["none", "jobs"])
def test_a_reader_holding_a_transaction_blocks_no_write(ordinary_user, monkeypatch, private):
    """A user who held a read transaction on the file they open (the live ledger, 0644) made
    every write wait out the busy timeout and fail: sync, the probe (spooled), the record."""
    user, root, py = ordinary_user
    url = _site_ledger(root / f"h-{private}", user.pw_name)
    db = root / f"h-{private}" / "lib" / "ledger.db"
    _publish(url, root / f"h-{private}", private, monkeypatch)
    hold = ("import sqlite3, sys\n"
            "from slurm_horus.ledger import open_reader\n"
            f"path = open_reader({url!r}).sqlite_path()\n"
            "c = sqlite3.connect(f'file:{path}?mode=ro', uri=True, isolation_level=None)\n"
            "c.execute('BEGIN')\n"
            "print(path, c.execute('SELECT count(*) FROM jobs').fetchone()[0], flush=True)\n"
            "sys.stdin.read()\n"
            "print(c.execute('SELECT count(*) FROM jobs').fetchone()[0], flush=True)\n")
    exe, env = py
    reader = subprocess.Popen([exe, "-c", hold], user=user.pw_uid, group=user.pw_gid,
                              extra_groups=[], env=env, cwd="/", text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = reader.stdout.readline()
        assert line, reader.stderr.read()
        held, n = line.split()
        assert Path(held) != db and n == ("2" if private == "none" else "1")
        L = Ledger(url, busy_timeout=2)
        L.record_submission(job_id=3, cluster="horus", user=user.pw_name,
                            submit_time=1700000003, predictions={"t4": {"util_pct": 10.0}})
        L.close()
        _publish(url, root / f"h-{private}", private, monkeypatch)  # replaces what is held
        reader.stdin.close()
        assert reader.stdout.readline().strip() == n  # the reader kept its snapshot
    finally:
        reader.kill()
        reader.wait(10)
    r = _as(user, py, "-m", "slurm_horus.cli.hacct", "--ledger", url, "-S", "2000-01-01", "-P",
            "-n", "-o", "JobID", path_first=_fake_scontrol(root / f"h-{private}" / "bin", private))
    assert r.returncode == 0 and r.stdout.split() == ["1", "3"], r.stderr


def test_the_extract_is_roots_until_it_is_complete(ordinary_user, monkeypatch):
    """The temp file of a user's extract was theirs (0600) before root filled it: they could
    lock it, stalling the sync, or write SQLite content root then opened."""
    from slurm_horus.ledger import extracts

    user, root, _ = ordinary_user
    url = _site_ledger(root / "x", user.pw_name)
    folder = root / "x" / "lib" / "users"
    seen = []
    real = extracts.upsert

    def filling(*args, **kw):
        seen.extend(os.stat(p) for p in folder.glob(".*.tmp"))
        return real(*args, **kw)

    monkeypatch.setattr(extracts, "upsert", filling)
    assert write_user_extracts(Ledger(url), folder)["written"] == 1
    assert seen and all((st.st_uid, st.st_mode & 0o777) == (0, 0o600) for st in seen)
    st = (folder / f"{user.pw_name}.db").stat()
    assert (st.st_uid, st.st_mode & 0o777) == (user.pw_uid, 0o400)


@pytest.mark.parametrize("private, copy", [("none", "readers' copy"), ("jobs", "user extract")])
def test_a_copy_for_readers_a_full_disk_stops_is_one_line_after_the_jobs_are_recorded(
        tmp_path, monkeypatch, private, copy):
    """A review: on a full disk sync recorded the jobs, then said `internal error:
    OperationalError: database or disk is full` of the readers' copy, as if nothing had been
    recorded. The error says what was done and what was not, and leaves no temp file."""
    import sqlalchemy.exc

    from slurm_horus.cli.admin import main as admin
    from slurm_horus.ledger import extracts

    monkeypatch.setenv("PATH", f"{_fake_scontrol(tmp_path / 'bin', private)}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    if private == "none":
        real = sqlite3.connect

        def full(path, *a, **kw):  # the copy's temp file on a full disk: SQLite's own error
            con = real(path, *a, **kw)
            if str(path).endswith(".tmp"):
                con.execute("PRAGMA max_page_count = 1")
            return con

        monkeypatch.setattr(sqlite3, "connect", full)
    else:
        def full(*a, **kw):  # filling the job's user's (root's) extract
            raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database or disk is full"))

        monkeypatch.setattr(extracts, "upsert", full)
    lib = tmp_path / "lib"
    lib.mkdir()
    url = f"sqlite:///{lib}/ledger.db"
    sacct = REPO / "tests" / "fixtures" / "slurm-25.11" / "sacct_json_finished_gpu.stdout"
    r = CliRunner().invoke(admin, ["sync", "--all", "--from-file", str(sacct), "--ledger", url])
    assert r.exit_code != 0 and "internal error" not in r.output, r.output
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("horus-admin sync: error: 1 jobs recorded and 0 spooled records "
                               f"replayed, but the {copy} "), r.stderr
    assert "was not refreshed (database or disk is full)" in r.stderr, r.stderr
    assert len(Ledger(url, readonly=True).jobs()) == 1
    assert not [p for p in lib.rglob("*") if ".tmp" in p.name]


def test_temp_files_of_a_killed_sync_are_removed_by_the_next_never_a_live_ones(tmp_path):
    """SIGTERM during a sync's copy of a large ledger left its temp file (108 MB) and its
    journal, which every later sync kept; the next removes those an hour old, never one a
    concurrent sync is still filling."""
    from slurm_horus.ledger.extracts import write_readers_copy
    from slurm_horus.textfile import STALE_TEMP_S

    url = _site_ledger(tmp_path, "daemon")
    lib = tmp_path / "lib"
    (lib / "users").mkdir()
    stale = [lib / ".ledger.db.readers.killed.tmp", lib / ".ledger.db.readers.killed.tmp-journal",
             lib / "users" / ".daemon.db.1.tmp", lib / "users" / ".daemon.db.1.tmp-journal"]
    live = [lib / ".ledger.db.readers.live.tmp", lib / "users" / ".daemon.db.2.tmp"]
    for p in (*stale, *live):
        p.write_bytes(b"")
    old = time.time() - STALE_TEMP_S - 60
    for p in stale:
        os.utime(p, (old, old))
    write_readers_copy(lib / "ledger.db")
    write_user_extracts(Ledger(url), lib / "users")
    assert not any(p.exists() for p in stale) and all(p.exists() for p in live)


def test_a_claim_record_a_full_disk_stops_is_one_line_and_the_last_one_stands(tmp_path, monkeypatch):
    """The record's OSError on a full disk reached the admin as an internal error."""
    import errno

    monkeypatch.setenv("PATH", f"{_fake_scontrol(tmp_path / 'bin', 'none')}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    record = tmp_path / "record"
    record.write_text("old\n")
    (tmp_path / "policy.conf").write_text(f"record_file = {record}\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    L = Ledger(_site_ledger(tmp_path, "daemon"))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HorusError, match=r"claim record .*/record was not replaced \(No space left on device\)"):
        publish(L, policy=str(tmp_path / "policy.conf"))
    assert record.read_text() == "old\n" and not list(tmp_path.glob(".record-*"))


def test_temp_files_of_a_killed_record_writer_are_removed_never_a_live_ones_or_others(tmp_path):
    """A sync killed while writing the claim record (or the loop, the pressure file) left its
    `.record-*` temp file, which nothing removed; the next write removes those an hour old, never
    one a concurrent writer is filling, nor another file of the folder it shares."""
    from slurm_horus.ledger.publish import write_atomically
    from slurm_horus.textfile import STALE_TEMP_S

    def temp():  # named as the writer names its own
        fd, path = tempfile.mkstemp(dir=tmp_path, prefix=".record-")
        os.close(fd)
        return Path(path)

    stale, live = temp(), temp()
    others = [tmp_path / ".record-kept-by-hand", tmp_path / ".ledger.db.readers.x.tmp", tmp_path / "record.bak"]
    for p in others:
        p.write_text("")
    old = time.time() - STALE_TEMP_S - 60
    for p in (stale, *others):
        os.utime(p, (old, old))
    write_atomically(tmp_path / "record", "new\n")
    assert not stale.exists() and live.exists() and all(p.exists() for p in others)
    assert (tmp_path / "record").read_text() == "new\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_stale_record_temp_name_of_another_users_is_theirs(tmp_path):
    """The record's folder is whatever the admin names (a pressure file in a sticky /tmp): a
    file of the temp files' name and age that another user owns is theirs, never removed."""
    from slurm_horus.ledger.publish import write_atomically
    from slurm_horus.textfile import STALE_TEMP_S

    theirs = tmp_path / ".record-abcdefgh"
    theirs.write_text("")
    os.chown(theirs, 65534, 65534)
    old = time.time() - STALE_TEMP_S - 60
    os.utime(theirs, (old, old))
    write_atomically(tmp_path / "pressure", "x\n")
    assert theirs.exists()


def test_failure_reason_is_one_short_line_of_what_the_database_said():
    """One reader of SQLAlchemy's wrapper for every message (store, extracts, horus-admin): the
    driver's first line, never the statement the wrapper adds, and the wrapper's type where it
    wraps nothing."""
    from sqlalchemy.exc import OperationalError

    from slurm_horus.ledger.db import failure_reason

    wrapped = OperationalError("INSERT INTO jobs VALUES (?)", (1,),
                               Exception("database is locked\nsecond line " + "x" * 300))
    assert failure_reason(wrapped) == "database is locked"
    assert failure_reason(OperationalError("SELECT 1", (), None)) == "OperationalError"
    assert failure_reason(OSError(28, "No space left on device")) == "No space left on device"
    assert failure_reason(Exception("y" * 300)) == "y" * 200
    assert failure_reason(Exception()) == "Exception"
