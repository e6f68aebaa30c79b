"""The hook's trust policy, on the real etc/job_submit.lua in Lua 5.1 (lupa): raw shard requests
(raw_shards), the memory floor of a hint (min_mem_mib), the claim record written by
`horus-admin sync` (record_file, underclaim_limit), the workload token it must ignore, the
job_modify path, and slurm_horus.slurm.policy.policy_value()."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

pytest.importorskip("lupa")

from slurm_horus.slurm.hook_runtime import Decision, HookCache, HookRuntime  # noqa: E402
from slurm_horus.slurm.policy import (charged_mem_mib, decide, policy_file, policy_value, policy_values,  # noqa: E402
                                      policy_with_overrides)

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "etc" / "job_submit.lua"
SHIPPED = REPO / "etc" / "horus_policy.conf"

UID = 54321
LIGHT = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"  # t4: 26 shards (memory-bound)
HEAVY = "horus:v1;t4=85/3000/3500;a100=75/3000/3500"
JOB_TOKEN = ("horus-job:v1;sha=" + "ab" * 32 + ";bs=8;task=train;opt=adam;prec=fp32;dims=batch:8;"
             "model=/home/u/models/horus:v1%3Ba100=1/1/1%20x.onnx")

BASE = """
shards_per_gpu = 100
pack_limit_pct = 90
exclusive_util_pct = 70
memory = p90
min_shards = 1
on_bad_hint = ignore
gpu.a100.mem_mib = 40960
gpu.t4.mem_mib = 15360
type_order = t4, a100
type_features = a100, t4
"""


@pytest.fixture()
def site(tmp_path):
    """write(policy_extra, record=None) -> policy path; the record file lives in tmp_path."""
    record = tmp_path / "record"

    def write(extra: str = "", record_text: str | None = None, name: str = "policy.conf") -> Path:
        if record_text is not None:
            record.write_text(record_text)
        p = tmp_path / name
        p.write_text(BASE + f"record_file = {record}\n" + extra)
        return p

    write.record = record
    return write


def run(job: dict, policy: Path, uid: int = UID, **kw) -> Decision:
    return decide(job, policy_path=policy, hook_path=HOOK, submit_uid=uid, **kw)


def changed(before: dict, d: Decision) -> dict:
    after = d.job_desc
    keys = set(before) | set(after)
    return {k: after.get(k) for k in keys if before.get(k) != after.get(k) and k != "admin_comment"}


# A valid GRES request as slurmctld 22.05 / 23.11+ would take it.
_GRES_ITEM = re.compile(r"(gres[:/])?[a-z0-9_]+(:[a-z0-9_\-]+)?(:[0-9]+)?")


def assert_valid_gres(s: str | None):
    if s is None:
        return
    items = s.split(",")
    assert all(_GRES_ITEM.fullmatch(i) for i in items), s
    names = [i.split("/")[-1].split(":")[1 if i.startswith("gres:") else 0] for i in items]
    assert not ("gpu" in names and "shard" in names), s
    typed = [tuple(re.sub(r"^gres[:/]", "", i).split(":")[:-1]) for i in items]
    assert len(typed) == len(set(typed)), s  # a name (and type) twice: which count would Slurm take?


# --------------------------------------------------------------------------- raw_shards

RAW = [
    # (id, tres_per_node, whole-GPU equivalent)
    ("22.05 spelling", "gres:shard:3", "gres:gpu:1"),
    ("23.11 spelling", "gres/shard:3", "gres/gpu:1"),
    ("typed 22.05", "gres:shard:a100:30", "gres:gpu:a100:1"),
    ("typed 25.11", "gres/shard:t4:70", "gres/gpu:t4:1"),
    ("bare name", "shard", "gpu:1"),
    ("a whole GPU's worth", "gres:shard:100", "gres:gpu:1"),
    ("more than one GPU's shards", "gres:shard:150", "gres:gpu:2"),
    ("other GRES kept in place", "gres:nvme:1,gres:shard:5,gres:fpga:2", "gres:nvme:1,gres:gpu:1,gres:fpga:2"),
]


@pytest.mark.parametrize("name,gres,whole", RAW, ids=[r[0] for r in RAW])
def test_raw_shards_whole_gives_whole_gpus(site, name, gres, whole):
    pol = site("raw_shards = whole\n")
    job = {"tres_per_node": gres, "comment": "my own note", "partition": "gpu"}
    d = run(job, pol)
    assert d.rc == 0 and d.action == "exclusive"
    assert changed(job, d) == {"tres_per_node": whole}
    assert d.job_desc["comment"] == job["comment"]
    assert "shards asked without a valid hint, raw_shards = whole" in d.admin_comment
    note, token = d.admin_comment.rsplit(" ", 1)  # the user's note, then the decision token
    assert d.user_messages == [note] and token.startswith("horus-decision:v1;action=" + d.action)
    typed = re.search(r"shard:([a-z0-9]+):", gres)
    assert d.gpu_type == (typed.group(1) if typed else "any")


@pytest.mark.parametrize("gres", ["gres:shard:3", "gres/shard:a100:30"])
def test_raw_shards_refuse(site, gres):
    pol = site("raw_shards = refuse\n")
    d = run({"tres_per_node": gres}, pol)
    assert d.rc != 0 and d.action == "rejected"
    assert d.written == ()
    assert len(d.user_messages) == 1
    msg = d.user_messages[0]
    assert msg.startswith("horus: job rejected:") and "raw_shards = refuse" in msg and "hsubmit" in msg


@pytest.mark.parametrize("extra", ["", "raw_shards = allow\n", "raw_shards = sometimes\nraw_shards = allow\n"],
                         ids=["built-in default", "allow", "a valid line after an invalid one"])
def test_raw_shards_allow_leaves_job_untouched(site, extra):
    pol = site(extra)
    job = {"tres_per_node": "gres:shard:3"}
    d = run(job, pol)
    assert d.rc == 0 and d.written == () and d.job_desc == job and d.user_messages == []
    assert policy_value("raw_shards", "allow", path=pol) == "allow"


def test_a_policy_that_cannot_be_used_fails_closed_on_raw_shards(site, tmp_path):
    """A mistyped raw_shards, an unreadable or oversized policy: raw shard requests become
    whole GPUs, never pass uncosted.  A missing file turns the hook off (Slurm's behaviour), and
    an empty one is the defaults."""
    job = {"tres_per_node": "gres:shard:5"}
    whole = {"tres_per_node": "gres:gpu:1"}
    big = tmp_path / "big.conf"
    big.write_text("raw_shards = allow\n" + "# padding\n" * 8000)
    bom = tmp_path / "bom.conf"
    bom.write_text("\ufeffraw_shards = allow\n")
    empty = tmp_path / "empty.conf"
    empty.write_text("")
    cases = [(site("raw_shards = allow\nraw_shards = Whole\n"), whole), (tmp_path, whole), (big, whole),
             (bom, job), (empty, job), (tmp_path / "missing.conf", job)]
    for pol, want in cases:
        d = run(job, pol)
        assert d.rc == 0 and dict(job, **changed(job, d)) == want, pol
    assert policy_value("raw_shards", "allow", path=cases[0][0]) == "whole"
    assert policy_value("raw_shards", "allow", path=bom) == "allow"
    for unusable in (tmp_path, big):  # the admin tools say what the hook does
        assert policy_value("raw_shards", "allow", path=unusable) == "whole"
    assert policy_value("raw_shards", "allow", path=tmp_path / "missing.conf") == "allow"


@pytest.mark.parametrize("text", ["raw_shards: whole\n", "raw_shards whole\n", "raw-shards = whole\n",
                                  "# the site's policy\rraw_shards = allow\rnot a line\r"],
                         ids=["colon", "no equals", "misspelt key", "CR-only line ends"])
def test_a_policy_line_the_hook_cannot_take_fails_closed_without_raw_shards(site, text):
    """A misspelt or unreadable raw_shards line had left the built-in allow; a file saved with
    CR line ends was one comment line, every default (a review).  Without a raw_shards line the
    hook takes, an unreadable line or unknown key gives whole; a valid one still decides."""
    job = {"tres_per_node": "gres:shard:5"}
    pol = site(text)
    d = run(job, pol)
    cr = "\r" in text
    want = job if cr else {"tres_per_node": "gres:gpu:1"}  # CR: its raw_shards = allow line is read
    assert d.rc == 0 and dict(job, **changed(job, d)) == want, text
    assert policy_value("raw_shards", "x", path=pol) == ("allow" if cr else "whole")
    fine = site("type_via = gres\n", name="fine.conf")  # no mistake: the built-in allow stays
    assert run(job, fine).written == () and policy_value("raw_shards", "allow", path=fine) == "allow"
    lone_cr = site("raw_shards = whole\rtype_via = gres\r", name="cr.conf")
    assert dict(job, **changed(job, run(job, lone_cr))) == {"tres_per_node": "gres:gpu:1"}
    assert policy_value("type_via", path=lone_cr) == "gres"


@pytest.mark.parametrize("text,whole", [("gpu.A100.mem_mib = 40960\n", False), ("gpu.a.b.mem_mib = 40960\n", False),
                                        ("shards_per_gpu = 100\n\u00a0\n", True), ("\u3000\n", True),
                                        ("\n" * 1000 + "raw_shards = allow\n", True),
                                        ("type_via = gres  " + "x" * 1100 + "\n", True),
                                        (" " * 1100 + "\n", False), ("# " + "x" * 1100 + "\n", False)],
                         ids=["bad type name", "dotted type", "no-break space line", "ideographic space line",
                              "past line 1000", "long line",
                              "long blank line", "long comment"])
def test_python_and_the_hook_agree_on_when_a_policy_fails_closed(site, text, whole):
    """A gpu.<type>.mem_mib key with a bad type name is a key the hook knows (it logs the name);
    a line of Unicode spaces is text to Lua's ASCII %s, so unreadable (a regression review)."""
    pol = site(text)
    job = {"tres_per_node": "gres:shard:5"}
    d = run(job, pol)
    assert (d.job_desc["tres_per_node"] == "gres:gpu:1") is whole, d
    assert policy_value("raw_shards", "allow", path=pol) == ("whole" if whole else "allow")


@pytest.mark.parametrize("text,whole", [("type_via = gres\n" + "\n" * 999, False),
                                        ("type_via = gres\n" + "\n" * 998 + "# end", False),
                                        ("type_via = gres\n" + "\n" * 1000, True),
                                        ("type_via = gres\r\n" * 1000 + "x", True)],
                         ids=["1000 lines", "1000 lines unended", "1001 lines", "a 1001st line after CRLF"])
def test_python_and_the_hook_count_a_policys_lines_alike(tmp_path, text, whole):
    """The hook reads 1000 lines; a 1001st is a mistake of the file (what it says is unknown),
    which fails closed where no raw_shards line was read; a last line end starts no line."""
    pol = tmp_path / "policy.conf"
    pol.write_text(text, newline="")
    d = run({"tres_per_node": "gres:shard:5"}, pol)
    assert (d.job_desc["tres_per_node"] == "gres:gpu:1") is whole, d
    assert policy_value("raw_shards", "allow", path=pol) == ("whole" if whole else "allow")


def test_an_override_comments_out_the_right_line_of_a_policy_with_lone_cr_line_ends():
    """policy_with_overrides numbered lines at LF while the hook (and _policy_entries) split at
    CR too: the wrong line was commented out, or an IndexError (a regression review)."""
    base = "gpu.t4.mem_mib = 15360\rtype_order = t4\nraw_shards = refuse\nmemory = p99\r"
    text = policy_with_overrides(base, {"memory": "p90", "shards_per_gpu": "50"})
    got = policy_values(text)
    assert got["raw_shards"] == "refuse" and got["memory"] == "p90" and got["type_order"] == "t4"
    assert got["shards_per_gpu"] == "50"


@pytest.mark.parametrize("gres", [" shard:1", "\tshard:1", "gres/ shard:1", "gres/gres/shard:1"])
def test_a_shard_item_with_blanks_or_a_doubled_prefix_is_still_a_shard_request(site, gres):
    """Whether slurmctld trims these is not known here: the hook takes them for shard requests it
    cannot read (refused under raw_shards = refuse), as before the exact-name change."""
    d = run({"tres_per_node": gres}, site("raw_shards = refuse\n"))
    assert d.rc != 0 and d.action == "rejected"


@pytest.mark.parametrize("gres", ["xgres/shard:50", "gresshard:50", "gpu_gres/shard:50", "xgresshard:50",
                                  "gres/nvme:1,my.gres/shard:50"])
def test_a_shard_item_slurm_reads_after_other_text_is_a_shard_request(site, gres):
    """slurmctld reads a GRES item's name after the first "gres" in it, wherever that is
    (slurm_get_next_tres: "xgres/shard:50" and "gresshard:50" ask for 50 shards).  The hook read
    such an item by its own first word, no shard, so a job description written through libslurm
    or slurmrestd got uncosted shards past raw_shards = whole / refuse (a review)."""
    for mode in ("refuse", "whole"):  # whole: a request it cannot read is refused, never passed
        d = run({"tres_per_node": gres}, site(f"raw_shards = {mode}\n", name=f"{mode}.conf"))
        assert d.rc != 0 and d.action == "rejected", (mode, d)
    rt = HookRuntime(HOOK)
    assert modify(rt, {"tres_per_node": gres}, 1002, site("raw_shards = whole\n", name="m.conf"))[0] != 0
    # a GRES whose own name holds "gres" is read by it, as Slurm reads it
    for other in ("gres/egress:1", "gres:progress_shard:2"):
        job = {"tres_per_node": other}
        d = run(job, site("raw_shards = refuse\n", name="o.conf"))
        assert d.rc == 0 and d.written == () and d.job_desc == job, other

@pytest.mark.parametrize("gres", ["gres:shardfs:1k", "gres:nvme:shard0:2G", "gres/bandwidth:shardnet:4G"])
def test_a_gres_that_only_contains_shard_is_no_shard_request(site, gres):
    """Slurm names a GRES exactly (gres.c _get_next_gres, case and all): a site GRES whose name
    or type contains "shard", with a suffixed count the hook cannot read, was taken for an
    unreadable shard request and rejected under raw_shards = whole (a review)."""
    job = {"tres_per_node": gres}
    d = run(job, site("raw_shards = whole\n"))
    assert d.rc == 0 and d.written == () and d.job_desc == job
    d = run({"tres_per_node": "gres:shard:1k"}, site("raw_shards = whole\n", name="w.conf"))
    assert d.rc != 0  # a shard count the hook cannot read is still not let through uncosted


@pytest.mark.parametrize("text", [
    "# c\n" * 1000 + "raw_shards = refuse\n",  # its raw_shards line past the 1000 lines read
    "raw_shards = refuse" + " " * 1100 + "\n",  # one line over 1024 characters
    "x" * 1100 + " = 1\n",
], ids=["over 1000 lines", "long raw_shards line", "long line"])
def test_a_policy_over_the_hooks_line_limits_fails_closed(tmp_path, text):
    """A review: lines past the 1000th, or one over 1024 characters, were skipped without counting
    as a mistake, so a raw shard request was allowed though the file may have said otherwise."""
    pol = tmp_path / "p.conf"
    pol.write_text(BASE + text)
    d = run({"tres_per_node": "gres:shard:5"}, pol)
    assert d.rc == 0 and d.job_desc["tres_per_node"] == "gres:gpu:1" and d.reason == "raw_shards", d
    assert any("1000 lines" in m or "too long" in m for _, m in d.log)
    assert any("raw_shards = whole" in m for _, m in d.log)


def test_a_long_blank_line_is_no_policy_mistake(tmp_path):
    pol = tmp_path / "p.conf"
    pol.write_text(BASE + " " * 1100 + "\n" + "# " + "c" * 1100 + "\n")
    d = run({"tres_per_node": "gres:shard:5"}, pol)
    assert d.rc == 0 and d.written == ()  # raw_shards' default, allow


def test_a_policy_the_hook_may_not_open_fails_closed(site, tmp_path, python_for_others):
    """slurmctld runs the hook as SlurmUser: a policy it cannot open (EACCES) is a broken
    policy, not a missing one."""
    import subprocess
    import sys

    pol = site("raw_shards = allow\n")
    os.chmod(pol, 0o600)  # root's alone
    code = ("import json, sys; from slurm_horus.slurm.policy import decide; "
            "d = decide({'tres_per_node': 'gres:shard:5'}, policy_path=sys.argv[1], hook_path=sys.argv[2], "
            "submit_uid=1); print(json.dumps(d.job_desc))")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                        "-c", code, str(pol), str(HOOK)], capture_output=True, text=True, timeout=60,
                       cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip("setpriv needs root")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tres_per_node"] == "gres:gpu:1"


@pytest.mark.parametrize("gres", ["gres:gpu:1,gres:shardfs:1", "gres:gpu:a100_shard:1",
                                  "gres:gpu:1,gres:shard:0"])
def test_a_gres_named_like_shard_or_no_shard_at_all_is_no_shard_request(site, gres):
    """Only an entry named shard with a count asks for shards: these valid jobs are neither
    refused nor converted, and a hint beside them is costed as for any GPU request."""
    job = {"tres_per_node": gres}
    for mode in ("whole", "refuse", "allow"):
        d = run(job, site(f"raw_shards = {mode}\n", name=f"{mode}.conf"))
        assert d.rc == 0 and d.written == () and d.job_desc == job, (mode, gres)
    if "a100_shard" not in gres:  # an unknown type is left unchanged anyway
        d = run(dict(job, comment=LIGHT), site("raw_shards = allow\n", name="hint.conf"))
        assert d.action == "shared" and "already asks" not in (d.admin_comment or ""), gres
        assert_valid_gres(d.job_desc["tres_per_node"])
        assert d.job_desc["tres_per_node"].startswith("gres:shard:"), d.job_desc
    rt = HookRuntime(HOOK)
    assert modify(rt, {"tres_per_node": gres}, 1002, site("raw_shards = refuse\n", name="m.conf"))[0] == 0


@pytest.mark.parametrize("field", ["p95", "p99"])
def test_a_high_quantile_below_the_p90_is_costed_at_the_p90(site, field):
    """The claim audit checks measured memory against the hint's p90: a hint whose p95/p99
    claims less is costed at the p90, as an honest one."""
    pol = site(f"memory = {field}\n")
    honest = run({"comment": "horus:v1;t4=5/3000/12000/12500/13000", "tres_per_node": "gres:gpu:1"}, pol)
    forged = run({"comment": "horus:v1;t4=5/3000/12000/100/100", "tres_per_node": "gres:gpu:1"}, pol)
    shards = [int(d.job_desc["tres_per_node"].rsplit(":", 1)[1]) for d in (honest, forged)]
    assert forged.action == "shared" and shards[1] >= 87  # 12000 of 15360 MiB at a 90 % pack limit
    assert shards[1] <= shards[0]
    assert charged_mem_mib(3000, 12000, 100, 100, path=pol) == (field, 12000)
    # a hint without the asked bound: the largest it gives up to that quantile, as the hook
    assert charged_mem_mib(1000, 9000, 10000, None, path=pol) == ("p95", 10000)
    assert charged_mem_mib(1000, 9000, None, 11000, path=pol) == (("p99", 11000) if field == "p99" else ("p90", 9000))
    d = run({"comment": "horus:v1;t4=5/1000/9000/10000", "tres_per_node": "gres:gpu:1"}, pol)
    assert "10000 MiB p95" in d.job_desc["admin_comment"], d


def test_a_gpu_per_node_is_shared_only_where_the_job_keeps_to_one_node(site):
    """Shards are per node: a job of several tasks that may span nodes would get shards on each.
    (--gpus=1, a GPU per job, is never shared: sbatch's SLURM_GPUS makes each srun step ask
    for a GPU, tests/test_job_submit_lua.py.)"""
    pol = site()
    base = {"comment": LIGHT, "tres_per_node": "gres/gpu:1"}
    spans = run(dict(base, num_tasks=64, min_nodes=4294967294, max_nodes=4294967294), pol)
    assert spans.written == ("admin_comment",) and spans.action == "unchanged"
    assert "span nodes" in spans.admin_comment
    for ok in (base, dict(base, num_tasks=1), dict(base, num_tasks=64, max_nodes=1)):
        d = run(ok, pol)
        assert d.action == "shared" and d.job_desc["tres_per_node"] == "gres/shard:26", ok
    gpus = {"comment": LIGHT, "tres_per_job": "gres/gpu:1"}
    for job in (gpus, dict(gpus, num_tasks=64, max_nodes=1)):
        assert run(job, pol).action == "unchanged"


def test_jobs_without_shards_or_hint_are_never_touched_in_any_mode(site):
    for mode in ("allow", "whole", "refuse"):
        pol = site(f"raw_shards = {mode}\n", name=f"{mode}.conf")
        for job in ({"tres_per_node": "gres:gpu:1"}, {"tres_per_job": "gres/gpu:2"},
                    {"tres_per_node": "gres:nvme:1", "comment": "x"},
                    {"tres_per_node": "gres:shard:0"}, {}):
            d = run(job, pol)
            assert d.rc == 0 and d.written == () and d.job_desc == job, (mode, job)


UNCONVERTIBLE = [
    ("shards per task", {"tres_per_task": "gres/shard:2"}, "per job, task or socket"),
    ("shards per job", {"tres_per_job": "gres:shard:2"}, "per job, task or socket"),
    ("gpu and shard together", {"tres_per_node": "gres:gpu:1,gres:shard:2"}, "together"),
    ("shards twice", {"tres_per_node": "gres:shard:3,gres/shard:150"}, "asked twice"),
    ("count with a suffix", {"tres_per_node": "gres:shard:2k"}, "unreadable"),
    ("odd type", {"tres_per_node": "gres:shard:A%s:2"}, "unusual GPU type"),
    ("huge count", {"tres_per_node": "gres:shard:99999999999999999999"}, "unusual shard count"),
    ("overlong field", {"tres_per_node": "gres:shard:1," + "x" * 2000}, "unusual tres_per_node"),
]


@pytest.mark.parametrize("name,job,why", UNCONVERTIBLE, ids=[u[0] for u in UNCONVERTIBLE])
def test_unconvertible_shard_request_is_refused_not_mangled(site, name, job, why):
    pol = site("raw_shards = whole\n")
    d = run(job, pol)
    assert d.rc != 0 and d.written == ()
    assert "cannot be turned into whole GPUs" in d.user_messages[0] and why in d.user_messages[0]
    # with allow, the same job is left to Slurm
    allow = run(job, site("raw_shards = allow\n", name="allow.conf"))
    assert allow.rc == 0 and allow.written == ()


def test_bad_hint_with_shards_is_a_raw_request(site):
    pol = site("raw_shards = whole\n")
    job = {"comment": "horus:v1;t4=nan/1/1", "tres_per_node": "gres:shard:1"}
    d = run(job, pol)
    assert d.rc == 0 and changed(job, d) == {"tres_per_node": "gres:gpu:1"}
    assert "without a valid hint" in d.admin_comment
    # on_bad_hint = reject still wins
    rej = run(job, site("raw_shards = whole\non_bad_hint = reject\n", name="rej.conf"))
    assert rej.rc != 0 and "bad resource hint" in rej.user_messages[0]
    # allow: as before, the bad hint is noted and the job runs as submitted
    allow = run(job, site("raw_shards = allow\n", name="allow.conf"))
    assert allow.rc == 0 and changed(job, allow) == {}
    assert allow.admin_comment.startswith("horus: ignored hint (")


@pytest.mark.parametrize("mode", ["whole", "refuse"])
def test_valid_hint_with_own_shard_request_is_costed_from_the_hint(site, mode):
    """A forged low shard count beside a valid hint is replaced by the hint's own shard count."""
    pol = site(f"raw_shards = {mode}\n")
    d = run({"comment": LIGHT, "tres_per_node": "gres:shard:1"}, pol)
    assert d.rc == 0 and (d.action, d.gpu_type, d.shards) == ("shared", "t4", 26)
    assert d.job_desc["tres_per_node"] == "gres:shard:26" and d.job_desc["features"] == "t4"
    d = run({"comment": HEAVY, "tres_per_node": "gres/shard:a100:5"}, pol)
    assert d.rc == 0 and d.action == "exclusive" and d.job_desc["tres_per_node"] == "gres/gpu:a100:1"
    # the hint cannot handle it (several GPUs): whole GPUs, with the reason
    d = run({"comment": LIGHT, "tres_per_node": "gres:shard:250"}, pol)
    assert d.rc == 0 and d.action == "exclusive" and d.job_desc["tres_per_node"] == "gres:gpu:3"
    assert "hint not applied: multi-GPU request" in d.admin_comment
    # allow: the user's shard request stands, as before
    a = run({"comment": LIGHT, "tres_per_node": "gres:shard:1"}, site("raw_shards = allow\n", name="a.conf"))
    assert a.action == "unchanged" and a.job_desc["tres_per_node"] == "gres:shard:1"


def test_shipped_policy_converts_raw_shards():
    assert policy_value("raw_shards", path=SHIPPED) == "whole"
    d = decide({"tres_per_node": "gres:shard:3"}, policy_path=SHIPPED, hook_path=HOOK, submit_uid=UID)
    assert d.rc == 0 and d.job_desc["tres_per_node"] == "gres:gpu:1"


def test_random_shard_requests_never_become_invalid(site):
    rng = random.Random(10)
    pols = [site(f"raw_shards = {m}\n", name=f"{m}.conf") for m in ("allow", "whole", "refuse")]
    parts = ["gres:shard:3", "gres/shard:a100:7", "shard", "gres:nvme:1", "gres:gpu:1", "gres:shard:0",
             "gres:shard:150", "gres/shard:t4:1", "shard:x:y:z", "gres:shard:", ":", "gres:gpu:t4:2",
             "gres:shard:%s", "gres:mps:50", "gres:gpu:0", "gres/shard:a100:0"]
    comments = [None, "", "note", LIGHT, HEAVY, "horus:v1;bad", "x " + LIGHT + " " + JOB_TOKEN]
    for _ in range(400):
        job = {"tres_per_node": ",".join(rng.sample(parts, rng.randint(1, 3)))}
        if rng.random() < 0.3:
            job["tres_per_task"] = rng.choice(["gres/shard:2", "gres:gpu:1", "gres/nvme:1", "gres:gpu:0"])
        c = rng.choice(comments)
        if c is not None:
            job["comment"] = c
        for pol in pols:
            d = run(job, pol)
            assert not [m for m in d.log if m[0] == "error"], (job, d.log)
            if d.rc != 0:
                assert d.written == () and d.user_messages
                continue
            if "tres_per_node" in d.written:  # what the hook wrote is valid (the user's own items stay)
                out = d.job_desc.get("tres_per_node")
                new = [i for i in (out or "").split(",") if i not in (job["tres_per_node"] or "").split(",")]
                assert_valid_gres(",".join(new) or None)
                names = {re.sub(r"^gres[:/]", "", i).split(":")[0] for i in out.split(",")}
                assert not {"gpu", "shard"} <= names, (job, out)
            if d.job_desc.get("comment") != job.get("comment"):
                raise AssertionError("comment changed")


# --------------------------------------------------------------------------- min_mem_mib

def test_tiny_hint_memory_is_costed_as_the_floor(site):
    job = {"comment": "horus:v1;t4=1/1/1", "tres_per_node": "gres:gpu:1"}
    d = run(job, site())  # built-in default 512
    assert (d.action, d.shards) == ("shared", 4)  # ceil(100 * 512 / (15360 * 0.9)) = 4
    assert "mem 512 MiB p90" in d.admin_comment
    assert run(job, site("min_mem_mib = 0\n", name="off.conf")).shards == 2  # util 1 % -> 2
    assert run(job, site("min_mem_mib = 4096\n", name="4g.conf")).shards == 30
    e = run(job, site("memory = expected\n", name="exp.conf"))
    assert e.shards == 4 and "mem 512 MiB expected" in e.admin_comment
    # above the floor nothing changes
    assert run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, site("min_mem_mib = 3000\n", name="m.conf")).shards == 26


def test_issue_forged_hint_on_a100_is_costed_as_512_mib():
    d = decide({"comment": "horus:v1;a100=1/1/1", "tres_per_node": "gres:gpu:1"}, policy_path=SHIPPED,
               hook_path=HOOK, submit_uid=UID)
    assert d.action == "shared" and "mem 512 MiB" in d.admin_comment


def test_bad_min_mem_values(site):
    for i, v in enumerate(("-1", "1e3", "lots", "512.5", "100000000")):
        d = run({"comment": "horus:v1;t4=1/1/1", "tres_per_node": "gres:gpu:1"},
                site(f"min_mem_mib = {v}\n", name=f"b{i}.conf"))
        assert d.shards == 4, v  # default 512
        assert any("min_mem_mib" in m[1] for m in d.log), v


# --------------------------------------------------------------------------- claim record

RECORD = """# slurm-horus claim record: written by horus-admin sync, read by job_submit.lua
user 54321 alice 4 9
user 1002 bob 1 12
account - physics 3 20
account - chem 0 5
"""


def test_repeat_under_claimer_gets_a_whole_gpu(site):
    pol = site(record_text=RECORD)
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}
    d = run(job, pol, uid=54321)
    assert d.rc == 0 and d.action == "exclusive" and d.gpu_type == "any"
    assert changed(job, d) == {}  # keeps the whole GPU it asked for
    assert "claim record: user alice (uid 54321) has 4 under-claims in 9 jobs, limit 3" in d.admin_comment
    note, token = d.admin_comment.rsplit(" ", 1)  # the user's note, then the decision token
    assert d.user_messages == [note] and token.startswith("horus-decision:v1;action=" + d.action)
    # its own type is kept
    d = run({"comment": LIGHT, "tres_per_node": "gres/gpu:a100:1"}, pol, uid=54321)
    assert d.action == "exclusive" and d.gpu_type == "a100" and d.job_desc["tres_per_node"] == "gres/gpu:a100:1"
    # under the limit: shares as usual
    assert run(job, pol, uid=1002).action == "shared"
    assert run(job, pol, uid=7).action == "shared"
    # a job that would not share anyway is decided as before
    assert "util" in run({"comment": HEAVY, "tres_per_node": "gres:gpu:1"}, pol, uid=54321).admin_comment


def test_account_record(site):
    pol = site(record_text=RECORD)
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}
    d = run({**job, "account": "Physics"}, pol, uid=7)
    assert d.action == "exclusive" and "claim record: account physics has 3 under-claims" in d.admin_comment
    assert run({**job, "account": "chem"}, pol, uid=7).action == "shared"
    assert run(job, pol, uid=7).action == "shared"  # no account known at all


def test_account_record_applies_to_a_job_without_an_account(site):
    """A review: slurmctld fills in the user's default account only after the hook, so a job
    without -A had job.account nil and its account's record was never looked at (-A horus:
    exclusive; the same job without -A: shared).  The hook reads default_account then, on the
    hint path and the raw_shards = allow path alike."""
    pol = site(record_text=RECORD)
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "default_account": "physics"}
    d = run(job, pol, uid=7)
    assert d.action == "exclusive" and d.reason == "record", d.admin_comment
    assert "claim record: account physics has 3 under-claims" in d.admin_comment
    assert run({**job, "account": "chem"}, pol, uid=7).action == "shared"  # -A names another one
    assert run({**job, "default_account": "chem"}, pol, uid=7).action == "shared"
    allow = site("raw_shards = allow\n", RECORD, name="allow.conf")
    raw = {"tres_per_node": "gres:shard:2", "default_account": "Physics"}
    d = run(raw, allow, uid=7)
    assert d.job_desc["tres_per_node"] == "gres:gpu:1" and "account physics" in d.admin_comment
    assert run({**raw, "default_account": "chem"}, allow, uid=7).written == ()


def test_limit_setting(site):
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}
    assert run(job, site("underclaim_limit = 0\n", RECORD), uid=54321).action == "shared"
    assert run(job, site("underclaim_limit = 5\n", RECORD, name="5.conf"), uid=54321).action == "shared"
    assert run(job, site("underclaim_limit = 1\n", RECORD, name="1.conf"), uid=1002).action == "exclusive"
    d = run(job, site("underclaim_limit = many\n", RECORD, name="bad.conf"), uid=54321)
    assert d.action == "exclusive"  # invalid -> default 3
    assert any("underclaim_limit" in m[1] for m in d.log)


def test_under_claimer_raw_shards_even_when_allowed(site):
    pol = site("raw_shards = allow\n", RECORD)
    job = {"tres_per_node": "gres:shard:2"}
    d = run(job, pol, uid=54321)
    assert d.rc == 0 and d.job_desc["tres_per_node"] == "gres:gpu:1"
    assert "claim record: user alice" in d.admin_comment
    assert run(job, pol, uid=1002).written == ()  # others: allowed, untouched
    # valid hint + own shard request + bad record: whole GPU
    d = run({"comment": LIGHT, "tres_per_node": "gres:shard:2"}, pol, uid=54321)
    assert d.job_desc["tres_per_node"] == "gres:gpu:1" and d.action == "exclusive"
    # refuse mode refuses it
    d = run(job, site("raw_shards = refuse\n", RECORD, name="r.conf"), uid=54321)
    assert d.rc != 0


GARBLED = {
    "missing": None,
    "empty": "",
    "binary": "\x00\xff\xfe user 54321",
    "wrong field count": "user 54321 alice 4\nuser 54321 alice 4 9 extra\n",
    "non-numeric": "user alice alice 4 9\nuser 54321 alice four 9\nuser -54321 alice 4 9\n",
    "huge numbers": "user 54321 alice 99999999999999999999 9\n",
    "long line": "user 54321 " + "a" * 5000 + " 4 9\n",
    "unknown kind": "group 54321 alice 4 9\naccount 54321 alice 4 9\n",
    "percent signs": "user 54321 %s%n%d 4 9\n",
}


@pytest.mark.parametrize("text", list(GARBLED.values()), ids=list(GARBLED))
def test_garbled_or_missing_record_applies_no_limit(site, text):
    pol = site()
    if text is not None:
        site.record.write_bytes(text.encode("latin-1"))
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, pol, uid=54321)
    if text == "user 54321 %s%n%d 4 9\n":  # a name it will not print: still matched by uid
        assert d.action == "exclusive" and "uid 54321 has 4" in d.admin_comment
        return
    assert d.rc == 0 and d.action == "shared"
    assert not [m for m in d.log if m[0] == "error"]


def test_record_that_is_a_directory(site, tmp_path):
    d_ = tmp_path / "recdir"
    d_.mkdir()
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, site(f"record_file = {d_}\n"), uid=54321)
    assert d.rc == 0 and d.action == "shared"


def test_good_lines_survive_garbled_ones_and_duplicates_take_the_max(site):
    text = "garbage here\nuser 54321 alice 1 9\n\n   # comment\nuser 54321 alice 5 9\nuser 54321 alice 0 9\n"
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, site(record_text=text), uid=54321)
    assert d.action == "exclusive" and "5 under-claims" in d.admin_comment
    assert any("1 unreadable line" in m[1] for m in d.log)


def test_only_the_first_64_kib_are_read(site):
    filler = "".join(f"user {100000 + i} u{i} 0 1\n" for i in range(4000))  # ~ 80 KiB
    assert len(filler) > 65536
    at = filler[:65000].rfind("\n") + 1
    early = filler[:at] + "user 54321 alice 4 9\n" + filler[at:]
    late = filler + "user 54321 alice 4 9\n"
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}
    d_early = run(job, site(record_text=early), uid=54321)
    assert d_early.action == "exclusive"
    assert any("larger than 64 KiB" in m[1] for m in d_early.log)
    d_late = run(job, site(record_text=late, name="late.conf"), uid=54321)
    assert d_late.action == "shared"
    # the line cut at 64 KiB is not read as a shorter number
    boundary = "x" * (65536 - len("user 54321 alice 1")) + "\n"
    text = boundary[:-1][: 65536 - 30] + "\nuser 54321 alice 1" + "2" * 20 + " 9\n"
    assert run(job, site(record_text=text, name="b.conf"), uid=54321).rc == 0


def test_record_changes_are_seen_at_the_next_submission(site):
    cache = HookCache()
    pol = site(record_text="user 54321 alice 0 1\n")
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}
    assert decide(job, policy_path=pol, hook_path=HOOK, submit_uid=54321, cache=cache).action == "shared"
    site.record.write_text("user 54321 alice 3 4\n")
    assert decide(job, policy_path=pol, hook_path=HOOK, submit_uid=54321, cache=cache).action == "exclusive"
    site.record.unlink()
    assert decide(job, policy_path=pol, hook_path=HOOK, submit_uid=54321, cache=cache).action == "shared"


def test_record_is_not_read_for_jobs_that_would_not_share(site, monkeypatch):
    """No record read for jobs without hint/shards (fast path): a FIFO there would block a read."""
    fifo = site.record
    os.mkfifo(fifo)
    pol = site()
    for job in ({"tres_per_node": "gres:gpu:1"}, {"comment": HEAVY, "tres_per_node": "gres:gpu:1"},
                {"comment": LIGHT, "tres_per_node": "gres:gpu:2"}):
        assert run(job, pol, uid=54321).rc == 0


# --------------------------------------------------------------------------- workload token

@pytest.mark.parametrize("comment", [
    LIGHT + " " + JOB_TOKEN,
    "my run " + LIGHT + " " + JOB_TOKEN,
    JOB_TOKEN + " " + LIGHT,
])
def test_workload_token_is_ignored(site, comment):
    pol = site()
    d = run({"comment": comment, "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.shards) == ("shared", "t4", 26)
    assert d.job_desc["comment"] == comment  # never stripped


def test_workload_token_alone_is_not_a_hint(site):
    pol = site("on_bad_hint = reject\nraw_shards = refuse\n")
    job = {"comment": JOB_TOKEN, "tres_per_node": "gres:gpu:1"}
    d = run(job, pol)
    assert d.rc == 0 and d.written == () and d.job_desc == job


# --------------------------------------------------------------------------- job_modify

def modify(rt: HookRuntime, fields: dict, uid: int, policy: Path, rec: dict | None = None):
    g = rt._g
    g._horus_reset()
    g._horus_policy_override = str(policy)
    try:
        job, backing, _ = g._horus_make_job(rt._lua.table_from(fields))
        jr = rt._lua.table_from(rec or {})
        rc = g.slurm_job_modify(job, jr, rt._lua.table(), uid)
        return rc, dict(backing.items())
    finally:
        g._horus_policy_override = None


def test_modify_to_shards_by_a_user(site):
    rt = HookRuntime(HOOK)
    whole, refuse, allow = site("raw_shards = whole\n"), site("raw_shards = refuse\n", name="r.conf"), \
        site("raw_shards = allow\n", RECORD, name="a.conf")
    assert modify(rt, {"tres_per_node": "gres:shard:1"}, 1002, whole) == (0, {"tres_per_node": "gres:gpu:1"})
    rc, _ = modify(rt, {"tres_per_node": "gres:shard:1"}, 1002, refuse)
    assert rc != 0
    assert modify(rt, {"tres_per_node": "gres:shard:1"}, 0, refuse) == (0, {"tres_per_node": "gres:shard:1"})
    assert modify(rt, {"tres_per_node": "gres:shard:1"}, 1002, allow) == (0, {"tres_per_node": "gres:shard:1"})
    assert modify(rt, {"tres_per_node": "gres:shard:1"}, 54321, allow)[1] == {"tres_per_node": "gres:gpu:1"}
    rc, f = modify(rt, {"tres_per_node": "gres:shard:1"}, 7, allow, rec={"account": "physics"})
    assert f == {"tres_per_node": "gres:gpu:1"}
    # other updates are not looked at
    assert modify(rt, {"time_limit": 30}, 1002, refuse) == (0, {"time_limit": 30})


def test_an_update_to_shards_is_judged_by_the_record_of_the_jobs_owner(site):
    """An operator or account coordinator may update another user's job: the claim record was
    looked up under the updater's uid, so a user with under-claims got raw shards on their job
    through a clean coordinator (and a clean user's job lost them through a flagged one)."""
    rt = HookRuntime(HOOK)
    allow = site("raw_shards = allow\n", RECORD)
    ask = {"tres_per_node": "gres:shard:1"}
    assert modify(rt, ask, 1003, allow, rec={"user_id": 54321}) == (0, {"tres_per_node": "gres:gpu:1"})
    assert modify(rt, ask, 54321, allow, rec={"user_id": 1003}) == (0, ask)

def test_a_refused_update_is_logged_not_told_to_the_user(site):
    """Slurm 22.05 takes no user message in job_modify: each refused update made slurmctld log
    "error: Use of log.user() in job_modify is not supported" (a review)."""
    rt = HookRuntime(HOOK)
    pol = site("raw_shards = whole\n")
    shared = {"comment": "horus:v1;a100=30/4000/12000", "tres_per_node": "gres:shard:34", "features": "a100"}
    assert modify(rt, {"features": "t4"}, 1002, pol, rec=shared)[0] != 0
    assert list(rt._g._horus_user_msgs.values()) == []
    logged = [str(m[2]) for m in rt._g._horus_msgs.values()]
    assert any(m.startswith("horus: update by uid 1002 refused: a job on GPU shards keeps the GPU type")
               and "cancel and resubmit" in m for m in logged), logged


def test_users_cannot_change_the_hint_or_the_gpu_type_of_a_shared_job(site):
    """After the hook decided: the loop and the claim audit read the hint, and a job's shards
    were costed for its type's memory (Features/Partition pin it)."""
    rt = HookRuntime(HOOK)
    pol = site("raw_shards = whole\n")
    hint = "horus:v1;a100=30/4000/12000"
    shared = {"comment": f"note {hint}", "tres_per_node": "gres:shard:34", "features": "a100",
              "partition": "gpu"}
    whole = dict(shared, tres_per_node="gres:gpu:1")
    for fields in ({"comment": "horus:v1;a100=30/600/600"}, {"comment": "note"}, {"comment": ""},
                   {"comment": f"{hint} horus-job:v1;sha={'0' * 64}"}):
        assert modify(rt, fields, 1002, pol, rec=shared)[0] != 0, fields
        assert modify(rt, fields, 1002, pol, rec=whole)[0] != 0, fields
        assert modify(rt, fields, 0, pol, rec=shared)[0] == 0  # root's (the loop's) pass
    # other words of the comment are the user's to change
    assert modify(rt, {"comment": f"new note {hint}"}, 1002, pol, rec=shared)[0] == 0
    for fields in ({"features": "t4"}, {"partition": "t4"}, {"features": "t4", "partition": "t4"}):
        assert modify(rt, fields, 1002, pol, rec=shared)[0] != 0, fields
        assert modify(rt, fields, 1002, pol, rec=whole)[0] == 0, fields  # a whole GPU anywhere
    assert modify(rt, {"features": "a100", "time_limit": 60}, 1002, pol, rec=shared)[0] == 0
    # its shards were costed as one GPU's share: it stays on one node
    for fields in ({"min_nodes": 4, "max_nodes": 4}, {"max_nodes": 2}):
        assert modify(rt, fields, 1002, pol, rec=shared)[0] != 0, fields
        assert modify(rt, fields, 1002, pol, rec=whole)[0] == 0, fields
    assert modify(rt, {"max_nodes": 1}, 1002, pol, rec=shared)[0] == 0
    # more tasks than its CPUs on its one node: pending for good (BadConstraints on 22.05), so
    # refused; as many or fewer (-N1 -n4 restating 4, or 2) fit where it fits
    for fields in ({"num_tasks": 20}, {"ntasks_per_node": 2}):
        assert modify(rt, fields, 1002, pol, rec=shared)[0] != 0, fields
        assert modify(rt, fields, 1002, pol, rec=whole)[0] == 0, fields
    assert modify(rt, {"num_tasks": 1}, 1002, pol, rec=shared)[0] == 0
    four = dict(shared, min_cpus=4)
    for n in (2, 4):
        assert modify(rt, {"num_tasks": n, "ntasks_per_node": n}, 1002, pol, rec=four)[0] == 0, n
    assert modify(rt, {"num_tasks": 5}, 1002, pol, rec=four)[0] != 0
    # a node list of several nodes spreads it as surely (a review: it passed)
    for nodes in ("n1,n2", "gpu[1-2]", "n1 n2", "n1\tn2"):  # Slurm splits at space and tab too
        assert modify(rt, {"req_nodes": nodes}, 1002, pol, rec=shared)[0] != 0, nodes
        assert modify(rt, {"req_nodes": nodes}, 1002, pol, rec=whole)[0] == 0, nodes
    assert modify(rt, {"req_nodes": "n1"}, 1002, pol, rec=shared)[0] == 0
    assert modify(rt, {"req_nodes": "gpu[3]"}, 1002, pol, rec=shared)[0] == 0  # one node
    assert modify(rt, {"req_nodes": "gpu[3,4]"}, 1002, pol, rec=shared)[0] != 0
    # a comment too long to parse changes no hint
    long = "horus:x " * 10000
    assert modify(rt, {"comment": long}, 1002, pol, rec=dict(shared, comment=long))[0] != 0


def test_admin_uids_update_jobs_as_root_does(site):
    """Only uid 0's updates passed: an operator (or SlurmUser) moving a shared job off a
    draining partition was refused as a user would be. admin_uids lists them; the hook and
    the admin tools read the same values."""
    from slurm_horus.slurm.policy import ignored_policy_lines, policy_values

    rt = HookRuntime(HOOK)
    shared = {"comment": "horus:v1;a100=30/4000/12000", "tres_per_node": "gres:shard:34",
              "features": "a100", "partition": "gpu"}
    move = {"partition": "other", "features": "t4"}
    text = "raw_shards = whole\nadmin_uids = 0000000450, 64030 1862400001\n"
    pol = site(text)
    for uid in (450, 64030, 1862400001, 0):  # a directory's uids have 10 digits
        assert modify(rt, move, uid, pol, rec=shared) == (0, move), uid
        assert modify(rt, {"tres_per_node": "gres:shard:1"}, uid, pol)[1] == {"tres_per_node": "gres:shard:1"}
    assert modify(rt, move, 1002, pol, rec=shared)[0] != 0
    assert modify(rt, {"tres_per_node": "gres:shard:1"}, 1002, pol)[1] == {"tres_per_node": "gres:gpu:1"}
    assert policy_values(text)["admin_uids"] == "0000000450, 64030 1862400001"
    # names (the hook cannot resolve them) or a uid past 32 bits: the line is ignored, root only
    for bad in ("admin_uids = slurm\n", "admin_uids = 4294967295\n", "admin_uids =\n",
                "admin_uids = 00000000450\n", "admin_uids = -450\n"):
        pol = site("raw_shards = whole\n" + bad, name="bad.conf")
        assert modify(rt, move, 450, pol, rec=shared)[0] != 0, bad
        assert modify(rt, move, 0, pol, rec=shared)[0] == 0, bad
        assert [k for _, k, _ in ignored_policy_lines(bad)] == ["admin_uids"], bad


# --------------------------------------------------------------------------- policy_value

def test_policy_value_reads_what_the_hook_reads(site, tmp_path):
    pol = site("""
record_file = relative/path
record_file = /first
underclaim_window_days = 7   # a comment
underclaim_window_days = 0
raw_shards = whole
""")
    assert policy_value("record_file", path=pol) == "/first"  # "relative/path" is invalid: skipped
    assert policy_value("underclaim_window_days", "30", path=pol) == "7"  # 0 is invalid: 7 stays
    assert policy_value("raw_shards", path=pol) == "whole"
    assert policy_value("underclaim_limit", "3", path=pol) == "3"
    assert policy_value("gpu.t4.mem_mib", path=pol) == "15360"
    assert policy_value("record_file", "/d", path=tmp_path / "missing") == "/d"
    big = tmp_path / "big.conf"
    big.write_text("record_file = /x\n" + "#" * 70000)
    assert policy_value("record_file", "/d", path=big) == "/d"


def test_policy_value_record_file_is_the_one_the_hook_uses(site, tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    other.write_text(RECORD)
    pol = site(f"record_file = {other}\n")
    monkeypatch.setenv("HORUS_POLICY", str(pol))
    assert policy_file() == pol
    assert policy_value("record_file") == str(other)
    d = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, hook_path=HOOK, submit_uid=54321)
    assert d.action == "exclusive" and "claim record" in d.admin_comment


def test_policy_file_next_to_the_controllers_hook(tmp_path, monkeypatch):
    monkeypatch.delenv("HORUS_POLICY", raising=False)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    (tmp_path / "job_submit.lua").write_text(HOOK.read_text())
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert policy_file() == tmp_path / "horus_policy.conf"
    (tmp_path / "horus_policy.conf").write_text("underclaim_window_days = 12\n")
    assert policy_value("underclaim_window_days", "30") == "12"
    monkeypatch.setenv("HORUS_POLICY", str(tmp_path / "x.conf"))
    assert policy_file() == tmp_path / "x.conf"
    assert policy_value("underclaim_window_days", "30") == "30"


def test_decide_defaults_to_the_callers_uid(site):
    pol = site(record_text=f"user {os.getuid()} me 9 9\n")
    d = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, policy_path=pol, hook_path=HOOK)
    assert d.action == "exclusive" and "claim record" in d.admin_comment
