"""`horus-admin doctor` on the running local cluster's configuration (22.05 or 25.11, whichever
SLURM_CONF points at: tests/run checks both), and on broken copies of it seeded one at a time."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from slurm_horus.errors import HorusError
from click.testing import CliRunner

from slurm_horus.cli.admin_doctor import register
from slurm_horus.doctor import check_version, diagnose, parse_version

pytestmark = pytest.mark.cluster


def _conf_dir() -> Path:
    conf = os.environ.get("SLURM_CONF")
    if not conf or not Path(conf).is_file() or not shutil.which("sinfo"):
        pytest.skip("SLURM_CONF unset or missing (tests/cluster/up; source tests/cluster/env.sh)")
    return Path(conf).parent


@pytest.fixture()
def site(tmp_path):
    """A copy of the cluster's slurm.conf, gres.conf, policy and hook in a root-owned folder."""
    src = _conf_dir()
    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("slurm.conf", "gres.conf", "horus_policy.conf"):
        shutil.copy(src / name, etc / name)
    shutil.copy(Path(os.path.realpath(src / "job_submit.lua")), etc / "job_submit.lua")
    # the cluster's Prolog/Epilog wrappers are referenced by absolute path: keep them
    return etc


def problems(etc, **kw):
    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout
    return diagnose(etc / "slurm.conf", policy=etc / "horus_policy.conf", version_text=version, **kw)


def edit(path: Path, pattern: str, repl: str):
    text = path.read_text()
    new = re.sub(pattern, repl, text, flags=re.M)
    assert new != text, pattern
    path.write_text(new)


def test_the_cluster_as_set_up_has_no_problems(site):
    assert problems(site) == []


def test_version_check():
    assert parse_version("slurm 25.11.7") == (25, 11)
    assert parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert check_version("slurm 22.05.8") == [] and check_version("slurm 25.11.7") == []
    (p,) = check_version("slurm 21.08.8")
    assert "no gres/shard" in p.what and "22.05" in p.fix
    (p,) = check_version(None)
    assert "unknown" in p.what


@pytest.mark.parametrize("pattern, repl, n, needle", [
    (r" Features=\w+", "", 2, "no Features="),
    (r"^AccountingStoreFlags=.*$", "", 1, "job_comment"),
    (r"^AccountingStorageTRES=.*$", "AccountingStorageTRES=gres/gpu", 1, "lacks gres/shard"),
    (r"^GresTypes=.*$", "GresTypes=gpu", 1, "GresTypes lacks shard"),
    (r"^Prolog=.*$", "", 1, "does not run horus-prolog"),
    (r"^Epilog=.*$", "Epilog=/bin/true", 1, "does not run horus-epilog"),
    (r"^JobSubmitPlugins=.*$", "", 1, "JobSubmitPlugins"),
    (r"^SelectType=.*$", "SelectType=select/linear", 1, "cons_tres"),
    (r"^AccountingStorageType=.*$", "AccountingStorageType=accounting_storage/none", 1, "slurmdbd"),
    (r"Gres=gpu:a100:4,shard:400", "Gres=gpu:a100:4,shard:300", 1, "300 shards for 4 GPUs"),
    (r"Gres=gpu:t4:2,", "Gres=gpu:2,", 1, "untyped GPUs"),
])
def test_each_seeded_slurm_conf_problem_is_found(site, pattern, repl, n, needle):
    edit(site / "slurm.conf", pattern, repl)
    found = problems(site)
    assert len(found) == n, found
    assert all(needle in p.what for p in found), found
    assert all(p.fix for p in found)


def test_gres_conf_shard_count_and_policy_shards_per_gpu(site):
    edit(site / "gres.conf", r"Name=shard Count=200", "Name=shard Count=150")
    (p,) = problems(site)
    assert "Count=150 on gpu-t4" in p.what and "Count=200" in p.fix
    edit(site / "gres.conf", r"Name=shard Count=150", "Name=shard Count=200")
    # counts with Slurm's suffixes, in either case: 1024 shards on four A100s is 256 a GPU
    edit(site / "slurm.conf", r"Gres=gpu:a100:4,shard:400", "Gres=gpu:a100:4,shard:1k")
    edit(site / "gres.conf", r"NodeName=gpu-a100 Name=shard Count=400", "NodeName=gpu-a100 Name=shard Count=1K")
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nshards_per_gpu = 256\n")
    found = problems(site)
    assert not [p for p in found if "gpu-a100" in p.what], found
    edit(site / "slurm.conf", r"shard:1k", "shard:400")
    edit(site / "gres.conf", r"Count=1K", "Count=400")
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nshards_per_gpu = 50\n")
    found = problems(site)
    assert len([p for p in found if "shards_per_gpu=50" in p.what]) == 2  # both nodes
    assert len([p for p in found if "gres.conf" in p.what]) == 2


def test_type_features_must_match_the_nodes(site):
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\ntype_features = a100\n")  # t4 no longer declared: its jobs stay unpinned
    (p,) = problems(site)
    assert "GPU type t4" in p.what and "type_features" in p.what and "t4" in p.fix
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\ntype_features = a100, t4\n")
    edit(site / "slurm.conf", r"Features=t4", "Features=fast")  # declared but not on the node
    (p,) = problems(site)
    assert "no Features=t4" in p.what and "invalid" in p.what


def test_policy_without_features_typing_or_gpu_memory(site):
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\ntype_via = gres\n")
    edit(site / "slurm.conf", r" Features=\w+", "")
    assert problems(site) == []  # typed gres needs no Features=
    edit(site / "horus_policy.conf", r"^gpu\.t4\.mem_mib.*$", "")
    found = problems(site)  # the nodes' T4s unknown to the policy, and its type_order's t4
    assert found and all("gpu.t4.mem_mib" in p.what for p in found), found


def test_slowdown_bound_needs_the_pressure_file_and_room_to_pack(site):
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nslowdown_bound = 1.5\n")
    assert problems(site) == []  # the cluster's policy names a pressure file
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nslowdown_bound = 1.01\n")
    (p,) = problems(site)
    assert "lets no job pack" in p.what and "--dry-run" in p.fix
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nslowdown_bound = 1.5\nslowdown_tail = p95\n")
    assert problems(site) == []  # jobs up to 29 % may still pack
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nslowdown_bound = 1.1\n")  # the median job would pack up to 20 %, the p95 one none
    (p,) = problems(site)
    assert "for the p95 job lets no job pack" in p.what and "slowdown_tail" in p.fix
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\nslowdown_bound = 1.5\npressure_file =\n")
    (p,) = problems(site)
    assert "no pressure_file" in p.what and "horus-queue.timer" in p.fix


def test_pack_heavy_always_needs_least_loaded_placement_and_the_loop(site):
    ll = "ll_shared_gres" in (site / "slurm.conf").read_text().lower()  # 25.11's cluster sets it
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\npack_heavy = always\n")
    found = problems(site)
    assert (found == []) == ll, found
    if not ll:
        (p,) = found
        assert "first fit" in p.what and "pack_heavy = pressure" in p.fix
        v = parse_version(subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout)
        assert ("upgrade Slurm to 23.11+" in p.fix) == (v < (23, 11))
        if v < (23, 11):  # the flag named in slurm.conf does not help a Slurm that lacks it
            edit(site / "slurm.conf", r"(?im)^(SelectTypeParameters=\S+)", r"\1,LL_SHARED_GRES")
            (p,) = problems(site)
            assert "needs Slurm 23.11+" in p.what and "upgrade Slurm" in p.fix
    else:
        edit(site / "slurm.conf", r",LL_SHARED_GRES", "")
        (p,) = problems(site)
        assert "first fit" in p.what and "add LL_SHARED_GRES" in p.fix
    with open(site / "horus_policy.conf", "a") as f:
        f.write("\npressure_file =\n")
    assert any("no pressure_file" in p.what and "pack_heavy" in p.what for p in problems(site))


def test_policy_lines_the_hook_ignores_are_named_with_their_line(site):
    pol = site / "horus_policy.conf"
    n = len(pol.read_text().split("\n"))
    with open(pol, "a") as f:
        f.write("slowdown_tail = p97\npack_limt_pct = 80\nslowdown_tail = p95   # fine\n")
    got = [p.what for p in problems(site)]
    assert len(got) == 2 and all("is ignored by the hook" in w for w in got), got
    assert f"line {n}: slowdown_tail = 'p97'" in got[0] and f"line {n + 1}: pack_limt_pct" in got[1]
    with open(pol, "a") as f:
        f.write("pack heavy always\n= 3\n")  # not key = value: the hook says "unreadable line"
    got = [p.what for p in problems(site)][2:]
    assert [f"line {n + 3}: 'pack heavy always'" in got[0], f"line {n + 4}: '= 3'" in got[1]] == [True, True]
    assert all("not a 'key = value' line" in w for w in got), got
    from slurm_horus.slurm.hook_runtime import HookRuntime  # the hook agrees: both unreadable
    hook = HookRuntime(site / "job_submit.lua")
    warns = [m for _, m in hook.submit({"tres_per_node": "gres:gpu:1", "comment": "horus:v1;a100=20/3000/3500"},
                                       policy_path=pol).log]
    assert sum("unreadable line" in m for m in warns) == 2, warns
    pol.write_text("# " + "x" * 70000 + "\n")
    assert any("the hook ignores all of it" in p.what for p in problems(site))
    # no raw_shards line and a key the hook does not know: it fails closed, and doctor says so
    pol.write_text("gpu.a100.mem_mib = 40960\nraw-shards = allow\n")
    assert any("no raw_shards line" in p.what and "whole GPUs" in p.what for p in problems(site))
    pol.write_text("gpu.a100.mem_mib = 40960\nraw-shards = allow\nraw_shards = allow\n")
    assert not any("no raw_shards line" in p.what for p in problems(site))


def test_hook_missing_or_foreign(site):
    (site / "job_submit.lua").write_text("function slurm_job_submit() return 0 end\n")
    (p,) = problems(site)
    assert "not slurm-horus's hook" in p.what
    (site / "job_submit.lua").unlink()
    (p,) = problems(site)
    assert "job_submit.lua is missing" in p.what


def test_a_fifo_where_the_hook_reads_is_found_without_waiting_on_it(site, tmp_path):
    # slurmctld's hook opens the policy, the claim record and the pressure file at every
    # submission; a FIFO there holds every submission (and held the doctor reading it)
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = (site / "horus_policy.conf").read_text()
    (site / "horus_policy.conf").write_text(text + f"\nrecord_file = {fifo}\n")
    found = []
    t = threading.Thread(target=lambda: found.extend(problems(site)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive() and [p.what for p in found] == [
        f"the claim record (record_file) {fifo} is not a regular file: slurmctld would wait on it "
        "at every submission"]
    (site / "horus_policy.conf").unlink()
    os.mkfifo(site / "horus_policy.conf")
    found.clear()
    t = threading.Thread(target=lambda: found.extend(problems(site)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive() and len(found) == 1 and "the policy" in found[0].what


def test_permissions_of_policy_ledger_and_registry(site, tmp_path):
    os.chmod(site / "horus_policy.conf", 0o664)
    ledger = tmp_path / "ledger"
    ledger.mkdir(mode=0o755)
    (ledger / "ledger.db").write_bytes(b"")
    os.chmod(ledger / "ledger.db", 0o646)
    reg = tmp_path / "models"
    reg.mkdir()
    os.chmod(reg, 0o775)
    (reg / "current.json").write_text("{}")
    found = problems(site, ledger_url=f"sqlite:///{ledger}/ledger.db", model_dir=reg)
    whats = sorted(p.what.split(" /")[0] for p in found)
    assert whats == ["the ledger", "the model registry", "the policy"], found
    assert all("group or others" in p.what and p.fix.startswith("chmod go-w") for p in found)


def test_cli_exit_codes_and_fixes(site):
    group = click.Group()
    register(group)
    runner = CliRunner()
    args = ["doctor", "--slurm-conf", str(site / "slurm.conf"), "--policy", str(site / "horus_policy.conf")]
    r = runner.invoke(group, args)
    assert r.exit_code == 0 and "no problems found" in r.output, r.output
    edit(site / "slurm.conf", r"^AccountingStoreFlags=.*$", "")
    edit(site / "slurm.conf", r" Features=\w+", "")
    r = runner.invoke(group, args)
    assert r.exit_code == 1
    assert r.output.count("PROBLEM:") == 3 and r.output.count("fix:") == 3
    assert "add job_comment to AccountingStoreFlags" in r.output
    r = runner.invoke(group, ["doctor", "--slurm-conf", str(site / "nosuch.conf")])
    assert r.exit_code != 0 and "nosuch.conf" in r.output and "Traceback" not in r.output


def test_a_ledger_or_registry_that_cannot_be_read_is_a_problem(tmp_path):
    from slurm_horus.doctor import check_ledger, check_registry
    from slurm_horus.ledger import Ledger

    good = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(good).record_usage(job_id=1, source="sacct", elapsed_s=1)
    assert check_ledger(good) == []
    assert check_ledger(f"sqlite:///{tmp_path}/not-yet.db") == []  # the first sync makes it
    (tmp_path / "corrupt.db").write_bytes(bytes(range(256)) * 20)
    for url in ("garbage", f"sqlite:///{tmp_path}/corrupt.db"):
        (p,) = check_ledger(url)
        assert "cannot read the ledger" in p.what and "ledger_url" in p.fix
    assert check_registry(tmp_path / "no-registry") == []
    (p,) = check_registry(tmp_path / "ledger.db")
    assert "not a folder" in p.what
    reg = tmp_path / "models"
    reg.mkdir()
    assert check_registry(reg) == []
    (reg / "current.json").write_text("[" * 100_000 + "]" * 100_000)
    (p,) = check_registry(reg)
    assert "cannot be served" in p.what
    (reg / "current.json").unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    (reg / "calibration.json").symlink_to(tmp_path / "elsewhere.json")  # hsubmit refuses it
    (p,) = check_registry(reg)
    assert "is a symlink" in p.what


def test_a_ledger_users_can_read_or_a_readers_copy_they_can_write_is_a_problem(tmp_path):
    """A user who can read the live ledger can hold a read transaction and stop every write;
    one who can write the readers' copy writes what others' hacct shows."""
    from slurm_horus.doctor import check_ledger
    from slurm_horus.ledger import Ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(url).close()
    assert check_ledger(url) == []  # made 0640
    os.chmod(tmp_path / "ledger.db", 0o644)
    (p,) = check_ledger(url)
    assert "readable by others" in p.what and p.fix.startswith(f"chmod 0640 {tmp_path}/ledger.db")
    os.chmod(tmp_path / "ledger.db", 0o640)
    copy = tmp_path / "ledger.db.readers"
    copy.write_bytes(b"")
    os.chmod(copy, 0o646)
    (p,) = check_ledger(url)
    assert "the readers' copy" in p.what and "group or others" in p.what


def test_the_shipped_policy_passes_the_pressure_check():
    # a fresh install (no pressure_file yet) had failed doctor on the policy it ships
    from slurm_horus.doctor import check_pressure_keys
    assert check_pressure_keys(Path(__file__).resolve().parents[1] / "etc" / "horus_policy.conf") == []


def test_slurm_conf_includes_are_read_in_place(tmp_path):
    # a site keeping its NodeName lines in nodes.conf had been told GresTypes lacked gpu,shard
    from slurm_horus.doctor import read_slurm_conf

    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "gres.conf").write_text("GresTypes=gpu,shard\n")
    (tmp_path / "nodes.conf").write_text("NodeName=g1 Gres=gpu:a100:4,shard:400 State=UNKNOWN\n")
    (tmp_path / "slurm.conf").write_text("ClusterName=c\nInclude nodes.conf\n"
                                         f"include {tmp_path}/conf.d/*.conf  # absolute, a glob\n")
    conf = read_slurm_conf(tmp_path / "slurm.conf")
    assert conf.settings["grestypes"] == "gpu,shard" and conf.settings["clustername"] == "c"
    assert [n["nodename"] for n in conf.nodes] == ["g1"]
    (tmp_path / "loop.conf").write_text("Include loop.conf\n")
    with pytest.raises(HorusError, match="nested"):
        read_slurm_conf(tmp_path / "loop.conf")
    (tmp_path / "gone.conf").write_text("Include nodes-old.conf\n")
    with pytest.raises(HorusError, match="no such file"):  # slurmctld would not start
        read_slurm_conf(tmp_path / "gone.conf")


def test_a_policy_key_the_installed_hook_does_not_know_is_reported(tmp_path):
    # an upgrade that left an older hook in place: doctor had judged the policy by the
    # package's rules and said "no problems found"
    from slurm_horus.doctor import check_policy_known_to_hook

    repo = Path(__file__).resolve().parents[1]
    pol = tmp_path / "horus_policy.conf"
    pol.write_text("pack_heavy = always\ngpu.a100.mem_mib = 40960\n# nosuch = 1\n")
    assert check_policy_known_to_hook(pol, repo / "etc" / "job_submit.lua") == []
    old = tmp_path / "job_submit.lua"
    old.write_text((repo / "etc" / "job_submit.lua").read_text().replace("pack_heavy", "pack_hvy"))
    (problem,) = check_policy_known_to_hook(pol, old)
    assert "pack_heavy is unknown to the installed hook" in problem.what


def test_prolog_globs_fifos_odd_bytes_and_files_others_write(site, tmp_path):
    """A glob Prolog (slurmd takes them) is read through, a FIFO Epilog does not hold the
    doctor, a byte of Latin-1 in gres.conf is no internal error, and a pressure file any user
    can write (the hook believes it: it turns packing on) is a problem."""
    import threading

    prolog_d = tmp_path / "prolog.d"
    prolog_d.mkdir()
    wrapper = re.search(r"^Prolog=(\S+)", (site / "slurm.conf").read_text(), re.M).group(1)
    shutil.copy(wrapper, prolog_d / "50-horus")
    fifo = tmp_path / "epilog-fifo"
    os.mkfifo(fifo)
    edit(site / "slurm.conf", r"^Prolog=\S+", f"Prolog={prolog_d}/*")
    edit(site / "slurm.conf", r"^Epilog=\S+", f"Epilog={fifo}")
    with open(site / "gres.conf", "ab") as f:
        f.write(b"# caf\xe9\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "pressure").write_text("")
    os.chmod(shared / "pressure", 0o666)
    edit(site / "horus_policy.conf", r"^pressure_file\s*=.*$", f"pressure_file = {shared}/pressure")
    found = []
    t = threading.Thread(target=lambda: found.extend(problems(site)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    whats = [p.what for p in found]
    assert not any(w.startswith("Prolog") for w in whats), whats
    assert any(w.startswith("Epilog does not run horus-epilog") for w in whats), whats
    assert any(w.startswith(f"the pressure file (pressure_file) {shared}/pressure is writable") for w in whats)
    assert any(w.startswith(f"the folder of the pressure file (pressure_file) {shared} is writable")
               for w in whats), whats


def test_slurm_syntax_doctor_had_misread_is_no_problem(site):
    """Spaces about '=' and quoted values are slurm.conf as Slurm reads it (a review: each gave
    a false problem and a wrong fix); a Latin-1 byte in a comment stopped every check."""
    edit(site / "slurm.conf", r"^GresTypes=gpu,shard", "GresTypes = gpu,shard")
    edit(site / "slurm.conf", r"Features=a100", 'Features="a100"')
    edit(site / "slurm.conf", r"^Prolog=(\S+)", r'Prolog="\1"')
    with open(site / "slurm.conf", "ab") as f:
        f.write(b"# maintainer: J\xfcrgen\n")
    assert problems(site) == []


@pytest.mark.parametrize("seed, says", [
    # Slurm matches features case and all: --constraint=a100 fits no Features=A100
    (lambda s: edit(s / "slurm.conf", r"Features=a100", "Features=A100"), "no Features=a100"),
    (lambda s: edit(s / "slurm.conf", r"gpu:a100:4", "gpu:A100:4"), "GPU type A100 is not lower case"),
    # a hook slurmctld cannot load, or one of another version
    (lambda s: open(s / "job_submit.lua", "a").write("\nthis is not lua )(\n"), "is not valid Lua"),
    (lambda s: open(s / "job_submit.lua", "a").write("\n-- edited\n"), "differs from this package's hook"),
    # whoever may write the hook's folder may replace the hook slurmctld runs as root
    (lambda s: os.chmod(s, 0o777), "the hook's folder"),
    # a gres.conf line without NodeName is every node's
    (lambda s: (edit(s / "gres.conf", r"^NodeName=\S+ Name=shard Count=\d+\n", ""),
                open(s / "gres.conf", "a").write("Name=shard Count=300\n")), "Name=shard Count=300 on gpu-t4"),
    # more memory than the type has: jobs packed into memory it lacks
    (lambda s: edit(s / "horus_policy.conf", r"^gpu\.t4\.mem_mib = \d+", "gpu.t4.mem_mib = 81920"),
     "over twice what a t4 has"),
])
def test_each_problem_a_review_found_doctor_passing_is_found(site, seed, says):
    seed(site)
    found = problems(site)
    assert any(says in p.what for p in found), found
    assert all(p.fix for p in found)


def test_a_misspelt_on_prediction_error_in_horus_conf_is_a_problem(tmp_path):
    # hsubmit takes it for submit: every job whose model cannot be read went in, while the
    # admin believed refusal was on, and doctor had said nothing
    from slurm_horus.doctor import check_site_settings

    conf = tmp_path / "horus.conf"
    conf.write_text("on_prediction_error = refuse_jobs\n")
    (p,) = check_site_settings({"HORUS_CONF": str(conf)})
    assert "'refuse_jobs' (horus.conf) is neither submit nor refuse" in p.what and str(conf) in p.fix
    # the users' environment variable is theirs: not the site's setting
    conf.write_text("on_prediction_error = refuse\n")
    assert check_site_settings({"HORUS_CONF": str(conf), "HORUS_ON_PREDICTION_ERROR": "x"}) == []
    assert check_site_settings({"HORUS_CONF": str(tmp_path / "none.conf")}) == []


def test_files_the_hook_reads_that_slurmuser_cannot_read_are_found(site, tmp_path):
    """slurmctld runs the hook as SlurmUser: a 0600 root policy left it on its built-in
    defaults (no GPU types: nothing shared) while doctor, reading as root, said nothing."""
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own folders are 0700: no one else reads
    try:
        os.chmod(top, 0o755)
        shutil.copytree(site, top / "etc")
        _slurm_user_cases(top / "etc")
    finally:
        shutil.rmtree(top)


def _slurm_user_cases(site):
    edit(site / "slurm.conf", r"^SlurmUser=.*$", "SlurmUser=horus-bob")
    assert not [p for p in problems(site) if "SlurmUser" in p.what]
    os.chmod(site / "horus_policy.conf", 0o600)
    found = [p for p in problems(site) if "SlurmUser" in p.what]
    assert [p.what.split(" cannot")[0] for p in found] == [f"the policy {site / 'horus_policy.conf'}"]
    assert "chmod o+r" in found[0].fix
    os.chmod(site / "horus_policy.conf", 0o644)
    os.chmod(site, 0o700)  # its folder: no search for others
    assert len([p for p in problems(site) if "SlurmUser" in p.what]) == 2  # the hook and the policy
    os.chmod(site, 0o755)
    edit(site / "slurm.conf", r"^SlurmUser=.*$", "SlurmUser=no-such-user-xyz")
    assert [p for p in problems(site) if "no user on this host" in p.what]


def test_policy_keys_the_hook_drops_for_what_other_keys_say_are_found(site):
    """A type_order type with no gpu.<type>.mem_mib, and shards beyond shards_per_gpu: the hook
    dropped them and said so only in slurmctld's log."""
    pol = site / "horus_policy.conf"
    pol.write_text(pol.read_text() + "\ntype_order = a100, h100\nmin_shards = 150\n")
    found = [p.what for p in problems(site) if "the hook ignores it" in p.what]
    assert any("type_order: h100 has no gpu.h100.mem_mib" in w for w in found), found
    assert any("min_shards: larger than shards_per_gpu" in w for w in found), found


def test_a_misspelt_site_setting_a_bad_backend_and_a_broken_gpu_catalog_are_found(tmp_path, monkeypatch):
    """Each had left doctor silent (a misspelt ledgerurl: the default ledger without a word; a
    backend name no command takes) or stopped it with exit 2 (a broken gpus.json)."""
    from slurm_horus.doctor import check_gpu_memory, check_site_settings

    conf = tmp_path / "horus.conf"
    conf.write_text("# site\nledgerurl = mysql://x\nledger_url = sqlite:////var/lib/l.db\n")
    (p,) = check_site_settings({"HORUS_CONF": str(conf)})
    assert "line 2: 'ledgerurl' is no setting" in p.what and "ledger_url" in p.fix
    (p,) = check_site_settings({"HORUS_CONF": str(conf.with_name("none")), "HORUS_SLURM_BACKEND": "pyslrum"})
    assert "HORUS_SLURM_BACKEND=pyslrum: need cli, pyslurm or auto" in p.what
    assert check_site_settings({"HORUS_CONF": str(conf.with_name("none")), "HORUS_SLURM_BACKEND": "CLI"}) == []
    bad = tmp_path / "gpus.json"
    bad.write_text("{not json")
    monkeypatch.setenv("HORUS_GPU_CATALOG", str(bad))
    from slurm_horus.predict.gpus import default_catalog
    default_catalog.cache_clear()  # read once per process
    try:
        (p,) = check_gpu_memory({"a100": "40960"})
    finally:
        default_catalog.cache_clear()
    assert p.what.startswith("the GPU catalog cannot be read") and "gpus.json" in p.fix


def test_a_sqlite_ledger_the_probe_on_other_hosts_cannot_reach_is_a_problem(site):
    """The guide exported the ledger read-only to GPU nodes whose probe must write it: every
    measurement stayed in the nodes' spools (on 22.05 the only ones)."""
    url = "sqlite:////var/lib/slurm-horus/ledger.db"
    assert not [p for p in problems(site, ledger_url=url) if "probe on GPU nodes" in p.what]
    edit(site / "slurm.conf", r"^NodeName=gpu-t4 NodeHostname=\S+", "NodeName=gpu-t4 NodeHostname=node07")
    (p,) = [p for p in problems(site, ledger_url=url) if "probe on GPU nodes" in p.what]
    assert "(node07)" in p.what and "MariaDB" in p.fix
    assert not [p for p in problems(site, ledger_url="mysql+pymysql://h/db") if "probe on GPU nodes" in p.what]
    with open(site / "gres.conf", "a") as f:  # sacct measures: the probe's rows are not the only ones
        f.write("\nAutoDetect=nvml\n")
    assert not [p for p in problems(site, ledger_url=url) if "probe on GPU nodes" in p.what]


def test_a_registry_beneath_a_folder_others_may_write_says_chmod(tmp_path):
    """The fix had read "horus-admin models rollback, or retrain" for a group-writable parent."""
    from slurm_horus.doctor import check_registry

    reg = tmp_path / "site" / "models"
    reg.mkdir(parents=True)
    os.chmod(tmp_path / "site", 0o775)
    found = check_registry(reg)
    assert [p.fix for p in found] == [f"chmod go-w {tmp_path / 'site'}"], found


def test_a_folder_where_a_user_could_put_a_fifo_for_the_hook_is_found(site, tmp_path):
    """A review: slurmctld's hook opens the policy, the claim record and the pressure file at
    every submission, and Lua cannot open without waiting: a FIFO a user puts in the place of a
    missing one (a world-writable sticky folder such as /tmp lets anyone make a new name) or in
    the folder a symlink leads to holds every submission.  Each such folder is a problem, as the
    folder is where the path really leads."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chmod(theirs, 0o775)
    (theirs / "record").write_text("")
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    (ours / "record").symlink_to(theirs / "record")
    edit(site / "horus_policy.conf", r"^pressure_file\s*=.*$", f"pressure_file = {sticky}/pressure")
    with open(site / "horus_policy.conf", "a") as f:
        f.write(f"\nrecord_file = {ours}/record\n")
    found = problems(site)
    assert sorted(p.what.split(" (mode")[0] for p in found) == [
        f"the folder of the claim record (record_file) {theirs} is writable by group or others",
        f"the folder of the pressure file (pressure_file) {sticky} is writable by group or others"], found
    assert all("FIFO" in p.what for p in found)
    fixes = {p.fix for p in found}
    assert fixes == {f"chmod go-w {theirs}",
                     "keep the pressure file (pressure_file) in a folder only root can write (as /var/lib/slurm-horus)"}
    # the policy's own folder, even where the policy is missing (it is then looked for there)
    (site / "horus_policy.conf").unlink()
    os.chmod(site, 0o1777)
    assert any(p.what.startswith(f"the folder of the policy {site} is writable") for p in problems(site))
