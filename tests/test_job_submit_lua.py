"""The real etc/job_submit.lua, run in Lua 5.1 through slurm_horus.slurm.policy (lupa)."""

from __future__ import annotations

import atexit
import random
import shutil
import time
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("lupa")

import tempfile  # noqa: E402

from slurm_horus.slurm.hint import parse_decision  # noqa: E402
from slurm_horus.slurm.hook_runtime import Decision, HookCache, HookRuntime  # noqa: E402
from slurm_horus.slurm.policy import decide  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "etc" / "job_submit.lua"
SHIPPED_POLICY = REPO / "etc" / "horus_policy.conf"
# Most cases check pinned type choice; the shipped policy's `type_choice = any` has its own tests.
_ORDER_DIR = Path(tempfile.mkdtemp(prefix="horus-policy-"))
atexit.register(shutil.rmtree, _ORDER_DIR, True)  # each run had left one in /tmp
POLICY = _ORDER_DIR / "horus_policy.conf"
# Never the site's claim record: tests give their own (see tests/test_job_submit_record.py).
NO_RECORD = _ORDER_DIR / "no-record"
POLICY.write_text(SHIPPED_POLICY.read_text().replace("type_choice = any", "type_choice = order")
                  .replace("record_file = /var/lib/slurm-horus/record", f"record_file = {NO_RECORD}"))
TEST_UID = 54321  # a uid no claim record on this machine names

LIGHT = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"  # t4: 26 shards (memory-bound)
BIG_MEM = "horus:v1;t4=20/14000/14500;a100=10/14000/14500"  # > 90 % of a t4
HEAVY = "horus:v1;t4=85/3000/3500;a100=75/3000/3500"  # >= 70 % everywhere
HEAVY_T4 = "horus:v1;t4=85/3000/3500;a100=40/3000/3500"  # heavy on t4 only


def run(job: dict, policy: Path | str = POLICY, **kw) -> Decision:
    kw.setdefault("submit_uid", TEST_UID)
    return decide(job, policy_path=policy, hook_path=HOOK, **kw)


def write_policy(tmp_path: Path, text: str, name: str = "policy.conf") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


BASE_POLICY = """
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


# --------------------------------------------------------------------------- policy cases

CASES = [
    # (id, job, expected action, gpu_type, shards, expected changed fields)
    (
        "light job shared on first type of type_order",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:1"},
        "shared", "t4", 26,
        {"tres_per_node": "gres:shard:26", "features": "t4"},
    ),
    (
        "memory does not fit t4 -> a100",
        {"comment": BIG_MEM, "tres_per_node": "gres:gpu:1"},
        "shared", "a100", 40,
        {"tres_per_node": "gres:shard:40", "features": "a100"},
    ),
    (
        "heavy job exclusive on the first type",
        {"comment": HEAVY, "tres_per_node": "gres:gpu:1"},
        "exclusive", "t4", None,
        {"tres_per_node": "gres:gpu:t4:1"},
    ),
    (
        "heavy on t4 only: sharing an a100 is preferred",
        {"comment": HEAVY_T4, "tres_per_node": "gres:gpu:1"},
        "shared", "a100", 45,
        {"tres_per_node": "gres:shard:45", "features": "a100"},
    ),
    (
        "explicit type honoured although t4 comes first",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:a100:1"},
        "shared", "a100", 12,
        {"tres_per_node": "gres:shard:12", "features": "a100"},
    ),
    (
        "explicit type that breaks the policy stays exclusive on it",
        {"comment": BIG_MEM, "tres_per_node": "gres:gpu:t4:1"},
        "exclusive", "t4", None,
        {},
    ),
    (
        "explicit heavy type stays as asked",
        {"comment": HEAVY, "tres_per_node": "gres:gpu:a100:1"},
        "exclusive", "a100", None,
        {},
    ),
    (
        "23.11 spelling kept",
        {"comment": LIGHT, "tres_per_node": "gres/gpu:1"},
        "shared", "t4", 26,
        {"tres_per_node": "gres/shard:26", "features": "t4"},
    ),
    (
        "23.11 spelling, typed",
        {"comment": LIGHT, "tres_per_node": "gres/gpu:a100:1"},
        "shared", "a100", 12,
        {"tres_per_node": "gres/shard:12", "features": "a100"},
    ),
    (
        "23.11 spelling, exclusive gets the type",
        {"comment": HEAVY, "tres_per_node": "gres/gpu:1"},
        "exclusive", "t4", None,
        {"tres_per_node": "gres/gpu:t4:1"},
    ),
    (
        "other GRES preserved, in order",
        {"comment": LIGHT, "tres_per_node": "gres:nvme:1,gres:gpu:1,gres:fpga:2"},
        "shared", "t4", 26,
        {"tres_per_node": "gres:nvme:1,gres:shard:26,gres:fpga:2", "features": "t4"},
    ),
    (
        "a constraint with the user's type keeps the user's other terms",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:t4:1", "features": "ib&fast"},
        "shared", "t4", 26,
        {"tres_per_node": "gres:shard:26", "features": "ib&fast&t4"},
    ),
    (
        "type named in --constraint counts as asked",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "features": "ib&a100"},
        "shared", "a100", 12,
        {"tres_per_node": "gres:shard:12"},
    ),
    (
        "NO_VAL node counts mean unset",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "min_nodes": 4294967294,
         "max_nodes": 4294967294},
        "shared", "t4", 26,
        {"tres_per_node": "gres:shard:26", "features": "t4"},
    ),
    (
        "-N1 is one node",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "min_nodes": 1, "max_nodes": 1},
        "shared", "t4", 26,
        {"tres_per_node": "gres:shard:26", "features": "t4"},
    ),
    (
        "a gpu:0 entry is not the request (and is dropped beside shards)",
        {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "tres_per_job": "gres:gpu:0"},
        "shared", "t4", 26,
        {"tres_per_node": "gres:shard:26", "features": "t4", "tres_per_job": None},
    ),
    (
        "user's own comment before the token",
        {"comment": "my experiment 7 " + LIGHT, "tres_per_node": "gres:gpu:1"},
        "shared", "t4", 26,
        {"tres_per_node": "gres:shard:26", "features": "t4"},
    ),
]

UNCHANGED_CASES = [
    ("multi-GPU", {"comment": LIGHT, "tres_per_node": "gres:gpu:2"}, "multi-GPU"),
    ("multi-GPU typed", {"comment": LIGHT, "tres_per_node": "gres/gpu:a100:4"}, "multi-GPU"),
    ("--gpus=2", {"comment": LIGHT, "tres_per_job": "gres:gpu:2"}, "multi-GPU"),
    # --gpus=1 had become shards, but sbatch puts SLURM_GPUS=1 in the job's environment and every
    # srun step reads it as its own --gpus=1: "Step requested GRES (gpu:(null)) not found" (a review)
    ("--gpus=1 (22.05 spelling)", {"comment": LIGHT, "tres_per_job": "gres:gpu:1"}, "use --gres=gpu:1 to share"),
    ("--gpus=1 (23.11 spelling) with other per-node GRES",
     {"comment": LIGHT, "tres_per_job": "gres/gpu:1", "tres_per_node": "gres/nvme:1"}, "--gpus set"),
    ("--gpus=1, heavy: not even typed", {"comment": HEAVY, "tres_per_job": "gres:gpu:1"}, "--gpus set"),
    # Slurm refuses a GPU frequency for a job without gpu GRES (a review: the job was rejected)
    ("--gpu-freq", {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "tres_freq": "gpu:high"}, "--gpu-freq"),
    ("--gpu-freq, heavy", {"comment": HEAVY, "tres_per_node": "gres:gpu:1", "tres_freq": "gpu:medium,memory=high"},
     "--gpu-freq"),
    ("gpu per node and per job", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                                  "tres_per_job": "gres:gpu:1"}, "multi-GPU"),
    ("multi-node", {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "min_nodes": 2}, "multi-node"),
    # Slurm gives an --exclusive job every GRES of its nodes: shards would never start
    ("--exclusive", {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "shared": 0}, "--exclusive"),
    ("--exclusive=user", {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "shared": 2}, "--exclusive"),
    # tasks Slurm may spread over nodes (-n 20 where one node has 16 CPUs): a GPU on each
    ("several tasks, GPU per node", {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "num_tasks": 20},
     "may span nodes"),
    # the hook would pin a type the named (or remaining) nodes may lack
    ("--nodelist, type the hook picks", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                                         "req_nodes": "gpu-t4"}, "--nodelist"),
    ("--exclude, type the hook picks", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                                        "exc_nodes": "gpu-a100"}, "--nodelist"),
    ("node range", {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "min_nodes": 1,
                    "max_nodes": 3}, "multi-node"),
    ("no GPU", {"comment": LIGHT, "tres_per_node": "gres:nvme:1"}, "no GPU requested"),
    ("no GRES at all", {"comment": LIGHT}, "no GPU requested"),
    ("gpus per task", {"comment": LIGHT, "tres_per_task": "gres:gpu:1"}, "per task"),
    ("cpus per gpu", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                      "cpus_per_tres": "gres:gpu:4"}, "--cpus-per-gpu"),
    ("ntasks per gpu", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                        "ntasks_per_tres": 2}, "--ntasks-per-gpu"),
    ("unknown type asked", {"comment": LIGHT, "tres_per_node": "gres:gpu:h100:1"},
     "does not know type h100"),
    ("asked type not predicted", {"comment": "horus:v1;t4=20/3000/3500",
                                  "tres_per_node": "gres:gpu:a100:1"}, "no prediction for a100"),
    ("no predicted type known", {"comment": "horus:v1;h100=20/3000/3500",
                                 "tres_per_node": "gres:gpu:1"}, "no GPU type fits"),
    ("memory fits nowhere", {"comment": "horus:v1;t4=20/50000/50000;a100=20/50000/50000",
                             "tres_per_node": "gres:gpu:1"}, "no GPU type fits"),
    ("complex constraint", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                            "features": "[ib|eth]"}, "complex --constraint"),
    ("two types in constraint", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                                 "features": "t4&a100"}, "several GPU types"),
    ("gres and constraint differ", {"comment": LIGHT, "tres_per_node": "gres:gpu:t4:1",
                                    "features": "a100"}, "differ"),
    # a type the hook picked, ANDed to terms it cannot see on any node, made a valid job one
    # Slurm refuses ("Requested node configuration is not available")
    ("other features, no type", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                                 "features": "ib&fast"}, "names features, not a GPU type"),
    ("a type the policy lacks", {"comment": LIGHT, "tres_per_node": "gres:gpu:1",
                                 "features": "v100"}, "names features, not a GPU type"),
    ("whole GPU, other features", {"comment": HEAVY, "tres_per_node": "gres:gpu:1",
                                   "features": "ib"}, "names features, not a GPU type"),
    ("odd type name", {"comment": LIGHT, "tres_per_node": "gres:gpu:A%s\n:1"}, "unusual GPU type"),
    ("odd count", {"comment": LIGHT, "tres_per_node": "gres:gpu:1k"}, "unreadable GPU request"),
]


def _changed(before: dict, after: dict) -> dict:
    keys = set(before) | set(after)
    return {k: after.get(k) for k in keys if before.get(k) != after.get(k) and k != "admin_comment"}


@pytest.mark.parametrize("name,job,action,gtype,shards,changes", CASES, ids=[c[0] for c in CASES])
def test_policy_cases(name, job, action, gtype, shards, changes):
    d = run(job)
    assert d.rc == 0
    assert (d.action, d.gpu_type, d.shards) == (action, gtype, shards), d.admin_comment
    if action == "shared" and job.get("max_nodes") != 1:
        changes = {**changes, "max_nodes": 1}  # a job on shards is held to its one node
    assert _changed(job, d.job_desc) == changes
    assert d.admin_comment.startswith("horus: " + action)
    assert "\n" not in d.admin_comment
    note, token = d.admin_comment.rsplit(" ", 1)  # the user's note, then the decision token
    assert d.user_messages == [note] and token.startswith("horus-decision:v1;action=" + d.action)
    # the comment (with the hint) is never touched
    assert d.job_desc["comment"] == job["comment"]


@pytest.mark.parametrize("name,job,reason", UNCHANGED_CASES, ids=[c[0] for c in UNCHANGED_CASES])
def test_unhandled_requests_get_only_a_note(name, job, reason):
    d = run(job)
    assert d.rc == 0 and d.action == "unchanged"
    assert d.admin_comment.startswith("horus: unchanged (") and reason in d.admin_comment
    assert d.written == ("admin_comment",)
    assert _changed(job, d.job_desc) == {}
    note, token = d.admin_comment.rsplit(" ", 1)  # the user's note, then the decision token
    assert d.user_messages == [note] and token.startswith("horus-decision:v1;action=" + d.action)


@pytest.mark.parametrize(
    "job",
    [
        {"tres_per_node": "gres:gpu:1"},
        {"comment": "just my note", "tres_per_node": "gres:gpu:1", "features": "ib"},
        {"comment": "mentions xhorus:v1;t4=1/1/1 inside a word", "tres_per_job": "gres/gpu:1"},
        {"comment": "", "tres_per_node": "gres:gpu:2", "min_nodes": 2, "max_nodes": 2,
         "admin_comment": "set by admin", "time_limit": 60, "partition": "gpu"},
        {"comment": "x" * 1_000_000, "tres_per_node": "gres:gpu:1"},
    ],
    ids=["no comment", "plain comment", "horus: inside a word", "multi", "1MB no hint"],
)
def test_no_hint_leaves_job_exactly_as_submitted(job):
    d = run(job)
    assert d.rc == 0
    assert d.written == ()
    assert d.job_desc == job
    assert d.user_messages == [] and d.log == []
    assert d.action == "unchanged" and d.admin_comment == job.get("admin_comment")


def test_admin_comment_is_appended_not_replaced():
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "admin_comment": "vip"})
    assert d.admin_comment.startswith("vip; horus: shared t4 ")
    assert d.action == "shared" and d.note.startswith("horus: shared t4")


def test_type_via_gres(tmp_path):
    pol = write_policy(tmp_path, BASE_POLICY + "type_via = gres\n")
    # A complex --constraint is refused whatever type_via says (it might name a GPU type).
    d = run({"comment": LIGHT, "tres_per_node": "gres/gpu:1", "features": "[a|b]"}, pol)
    assert d.action == "unchanged"
    d = run({"comment": LIGHT, "tres_per_node": "gres/gpu:1"}, pol)
    assert d.action == "shared"
    assert d.job_desc["tres_per_node"] == "gres/shard:t4:26"
    assert "features" not in d.job_desc


def test_memory_expected_and_min_shards(tmp_path):
    job = {"comment": "horus:v1;t4=1/1000/9000", "tres_per_node": "gres:gpu:1"}
    assert run(job).shards == 66  # p90: ceil(100*9000/(15360*0.9))
    pol = write_policy(tmp_path, BASE_POLICY + "memory = expected\nmin_shards = 10\n")
    assert run(job, pol).shards == 10  # expected 1000 MiB -> 8 shards, raised to min 10
    pol = write_policy(tmp_path, BASE_POLICY + "memory = expected\n", "p2.conf")
    assert run(job, pol).shards == 8


def test_exclusive_threshold_is_inclusive():
    at = run({"comment": "horus:v1;t4=70/100/100", "tres_per_node": "gres:gpu:t4:1"})
    below = run({"comment": "horus:v1;t4=69.999/100/100", "tres_per_node": "gres:gpu:t4:1"})
    assert at.action == "exclusive" and below.action == "shared"
    assert below.shards == 78  # ceil(100 * 69.999 / 90)


def test_exclusive_above_pack_limit(tmp_path):
    pol = write_policy(tmp_path, BASE_POLICY.replace("exclusive_util_pct = 70",
                                                     "exclusive_util_pct = 95"))
    d = run({"comment": "horus:v1;t4=92/100/100", "tres_per_node": "gres:gpu:1"}, pol)
    assert d.action == "exclusive" and "pack limit" in d.admin_comment


# --------------------------------------------------------------------------- bad hints

BAD_HINTS = {
    "garbage": "horus:garbage",
    "empty body": "horus:v1;",
    "unknown version": "horus:v2;t4=1/1/1",
    "no version": "horus:;t4=1/1/1",
    "negative util": "horus:v1;t4=-5/100/100",
    "negative mem": "horus:v1;t4=5/-100/100",
    "nan": "horus:v1;t4=nan/100/100",
    "NaN mem": "horus:v1;t4=5/NaN/100",
    "inf": "horus:v1;t4=inf/100/100",
    "exponent": "horus:v1;t4=1e1/100/100",
    "hex": "horus:v1;t4=0x10/100/100",
    "util over 100": "horus:v1;t4=100.001/100/100",
    "huge number": "horus:v1;t4=5/99999999999999999999999/100",
    "mem over limit": "horus:v1;t4=5/100000000/100",
    "too many digits": "horus:v1;t4=5.1234567891/100/100",
    "too many types": "horus:v1;" + ";".join(f"g{i}=1/1/1" for i in range(17)),
    "too long": "horus:v1;t4=1/1/1;" + "a" * 32 + "=" + "1" * 600 + "/1/1",
    "duplicate type": "horus:v1;t4=1/1/1;t4=2/2/2",
    "uppercase type": "horus:v1;T4=1/1/1",
    "type name 33 chars": "horus:v1;" + "a" * 33 + "=1/1/1",
    "lua pattern chars": "horus:v1;%d+=.*/(.-)/[^/]",
    "pattern chars in numbers": "horus:v1;t4=%d/.-/%s",
    "trailing semicolon": "horus:v1;t4=1/1/1;",
    "empty entry": "horus:v1;t4=1/1/1;;a100=1/1/1",
    "six numbers": "horus:v1;t4=1/1/1/1/1/1",
    "two numbers": "horus:v1;t4=1/1",
    "missing number": "horus:v1;t4=1//1",
    "leading dot": "horus:v1;t4=.5/1/1",
    "trailing dot": "horus:v1;t4=5./1/1",
    "sign": "horus:v1;t4=+5/1/1",
    "unicode digits": "horus:v1;t4=\u0665/1/1",
    "control chars": "horus:v1;t4=5\x00/1/1",
    "two tokens": "horus:v1;t4=1/1/1 horus:v1;a100=1/1/1",
    "percent signs": "horus:v1;t4=50%/1%s%d/1",
}


@pytest.mark.parametrize("comment", list(BAD_HINTS.values()), ids=list(BAD_HINTS))
@pytest.mark.parametrize("gres", ["gres:gpu:1", "gres/gpu:t4:1"])
def test_bad_hint_is_ignored(comment, gres):
    job = {"comment": "user text " + comment, "tres_per_node": gres}
    d = run(job)
    assert d.rc == 0 and d.action == "unchanged"
    assert d.admin_comment.startswith("horus: ignored hint (")
    assert d.written == ("admin_comment",)
    assert {k: v for k, v in d.job_desc.items() if k != "admin_comment"} == job
    assert len(d.user_messages) == 1 and d.user_messages[0].startswith("horus: ignored hint")
    assert not [m for m in d.log if m[0] == "error"]


def test_bad_hint_rejected_by_policy(tmp_path):
    pol = write_policy(tmp_path, BASE_POLICY.replace("on_bad_hint = ignore", "on_bad_hint = reject"))
    job = {"comment": "horus:v1;t4=nan/1/1", "tres_per_node": "gres:gpu:1"}
    d = run(job, pol)
    assert d.rc == -1 and d.action == "rejected"
    assert d.written == ()
    assert "rejected" in d.user_messages[0] and "bad utilization" in d.user_messages[0]
    # valid hints and jobs without one are not affected by on_bad_hint
    assert run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, pol).action == "shared"
    none = run({"comment": "hello", "tres_per_node": "gres:gpu:1"}, pol)
    assert none.rc == 0 and none.written == ()


# --------------------------------------------------------------------------- policy file

def test_missing_policy_file_uses_safe_defaults_and_logs_once(tmp_path):
    missing = tmp_path / "nope.conf"
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}
    cache = HookCache()
    d1 = decide(job, policy_path=missing, hook_path=HOOK, cache=cache)
    assert d1.rc == 0 and d1.action == "unchanged"
    assert "policy knows no GPU types" in d1.admin_comment
    assert [m for m in d1.log if "not readable" in m[1]]
    d2 = decide(job, policy_path=missing, hook_path=HOOK, cache=cache)
    assert d2.action == "unchanged"
    assert not [m for m in d2.log if "not readable" in m[1]]  # logged once


def test_policy_next_to_hook_and_env(tmp_path, monkeypatch):
    hook = tmp_path / "job_submit.lua"
    hook.write_text(HOOK.read_text())
    write_policy(tmp_path, BASE_POLICY.replace("type_order = t4, a100", "type_order = a100, t4"),
                 "horus_policy.conf")
    monkeypatch.delenv("HORUS_POLICY", raising=False)
    d = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, hook_path=hook)
    assert d.gpu_type == "a100"
    other = write_policy(tmp_path, BASE_POLICY, "other.conf")
    monkeypatch.setenv("HORUS_POLICY", str(other))
    d = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, hook_path=hook)
    assert d.gpu_type == "t4"


def test_bad_policy_values_fall_back_to_defaults(tmp_path):
    pol = write_policy(tmp_path, """
shards_per_gpu = lots
pack_limit_pct = 150
exclusive_util_pct = -1
memory = max
min_shards = 0
on_bad_hint = explode
type_via = magic
gpu.T4.mem_mib = 100
gpu.t4.mem_mib = 15360
gpu.v100.mem_mib = 1e5
what = ever
this line is junk
type_order = t4, v100, %d+
type_features = t4, v100, T4
""")
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, pol)
    assert d.rc == 0 and (d.action, d.gpu_type, d.shards) == ("shared", "t4", 26)
    warnings = " | ".join(m[1] for m in d.log)
    for key in ("shards_per_gpu", "pack_limit_pct", "exclusive_util_pct", "memory", "min_shards",
                "on_bad_hint", "type_via", "gpu.T4.mem_mib", "gpu.v100.mem_mib", "what",
                "unreadable line", "v100 has no", "type_features: bad type name",
                "type_features: v100 has no gpu.v100.mem_mib"):
        assert key in warnings, key


def test_type_order_defaults_to_memory_size(tmp_path):
    pol = write_policy(tmp_path, "gpu.big.mem_mib = 81920\ngpu.small.mem_mib = 16384\n"
                                 "type_features = big, small\n")
    d = run({"comment": "horus:v1;big=10/1000/1000;small=10/1000/1000",
             "tres_per_node": "gres:gpu:1"}, pol)
    assert d.gpu_type == "small"


# --------------------------------------------------------------------------- robustness

HOSTILE = {
    "1MB of horus: tokens": "horus: " * (1_000_000 // 7),
    "1MB of horus: without spaces": "horus:" * (1_000_000 // 6),
    "1MB comment then valid hint": "a" * 1_000_000 + " " + LIGHT,
    "1MB of semicolons": "horus:v1;" + ";" * 1_000_000,
    "1MB of entries": "horus:v1;" + "t4=1/1/1;" * 110_000,
    "64KiB - 1 of spaces then hint": " " * 65_000 + LIGHT,
    "60KiB of horus: tokens (under the limit)": "horus: " * (60_000 // 7),
    "60KiB token-like word": "horus:v1;" + "t" * 60_000,
}


@pytest.mark.parametrize("comment", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_comment_is_fast_and_harmless(comment):
    job = {"comment": comment, "tres_per_node": "gres:gpu:1"}
    t0 = time.monotonic()
    d = run(job)
    assert time.monotonic() - t0 < 5
    assert d.rc == 0
    if d.action != "shared":  # only the last case carries a usable hint
        assert d.written == ("admin_comment",)
        assert d.admin_comment.startswith("horus: ignored hint")


def test_internal_error_leaves_job_unchanged():
    rt = HookRuntime(HOOK)
    rt._g._horus_fail_field = "features"  # make the 2nd write fail, after tres_per_node
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1,gres:nvme:1"}
    d = rt.submit(job, policy_path=POLICY)
    assert d.rc == 0
    assert d.job_desc == job
    assert [m for m in d.log if m[0] == "error" and "left as submitted" in m[1]]


def test_modify_is_a_no_op():
    rt = HookRuntime(HOOK)
    assert rt._g.slurm_job_modify(rt._lua.table(), rt._lua.table(), rt._lua.table(), 0) == 0


@pytest.mark.parametrize("lua", ["lua51", "lua54"])
def test_runs_on_lua_versions(lua):
    pytest.importorskip(f"lupa.{lua}")
    rt = HookRuntime(HOOK, lua=lua)
    d = rt.submit({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, policy_path=POLICY)
    assert (d.action, d.gpu_type, d.shards) == ("shared", "t4", 26)
    assert d.job_desc["tres_per_node"] == "gres:shard:26"


def test_only_lua51_syntax():
    src = HOOK.read_text()
    for bad in ("goto ", "//", "utf8.", "<const>", "<close>", "table.unpack", "math.tointeger"):
        assert bad not in src.replace("-- ", ""), bad


def test_cache_reloads_on_change(tmp_path):
    hook = tmp_path / "job_submit.lua"
    hook.write_text(HOOK.read_text())
    cache = HookCache(maxsize=2)
    a = cache.get(hook)
    assert cache.get(hook) is a
    hook.write_text(HOOK.read_text() + "\n-- changed\n")
    assert cache.get(hook) is not a


# --------------------------------------------------------------------------- packing property

def _rand_decimal(rng: random.Random, hi: int, frac_digits: int) -> str:
    whole = rng.randint(0, hi)
    if frac_digits == 0 or whole == hi:
        return str(whole)
    return f"{whole}.{''.join(rng.choice('0123456789') for _ in range(rng.randint(1, frac_digits)))}"


@pytest.mark.parametrize("seed", range(6))
def test_packing_property(tmp_path, seed):
    """Any jobs whose shards sum to <= S on one GPU have summed predicted utilization <= P %
    and summed predicted memory <= P % of the GPU: checked exactly (Fractions of the hint's
    decimals), per job (shards/S >= each share) and on random first-fit packings."""
    rng = random.Random(seed)
    S = rng.choice([4, 7, 10, 100, 400, 1000])
    P = rng.choice([50, 73, 90, 100])
    excl = rng.choice([60, 70.5, 100])
    memkind = rng.choice(["p90", "expected"])
    gpus = {"t4": rng.choice([15360, 16000]), "a100": rng.choice([40960, 81920]), "x": 24576}
    pol = write_policy(tmp_path, "\n".join([
        f"shards_per_gpu = {S}", f"pack_limit_pct = {P}", f"exclusive_util_pct = {excl}",
        f"memory = {memkind}", "min_shards = 1",
        *(f"gpu.{t}.mem_mib = {m}" for t, m in gpus.items()),
        "type_order = " + ", ".join(rng.sample(sorted(gpus), 3)), "type_features = t4, a100, x",
    ]))
    rt = HookRuntime(HOOK)
    placed: dict[str, list[tuple[int, Fraction, Fraction]]] = {t: [] for t in gpus}
    for _ in range(150):
        preds = {}
        for t in rng.sample(sorted(gpus), rng.randint(1, 3)):
            hi = gpus[t] if rng.random() < 0.8 else gpus[t] * 2
            preds[t] = (_rand_decimal(rng, 100, rng.choice([0, 1, 4, 9])),
                        _rand_decimal(rng, hi // 3, rng.choice([0, 2, 9])),
                        _rand_decimal(rng, hi, rng.choice([0, 3])))
        token = "horus:v1;" + ";".join(f"{t}={u}/{m}/{p}" for t, (u, m, p) in preds.items())
        gres = rng.choice(["gres:gpu:1", "gres/gpu:1", "gres:gpu:%s:1" % rng.choice(sorted(gpus))])
        d = rt.submit({"comment": token, "tres_per_node": gres}, policy_path=pol)
        assert d.rc == 0
        if d.action != "shared":
            continue
        t = d.gpu_type
        assert d.shards_per_gpu == S and 1 <= d.shards <= S
        u = Fraction(preds[t][0])
        mem = Fraction(preds[t][2] if memkind == "p90" else preds[t][1])
        assert u < Fraction(str(excl))
        share = Fraction(d.shards, S)
        assert share >= u / P, (token, d.admin_comment)
        assert share >= mem * 100 / (gpus[t] * P), (token, d.admin_comment)
        placed[t].append((d.shards, u, mem))
    # first-fit onto GPUs, in random orders: every GPU's sums stay within the pack limit
    for t, jobs in placed.items():
        for _ in range(3):
            rng.shuffle(jobs)
            bins: list[list] = []
            for j in jobs:
                for b in bins:
                    if sum(x[0] for x in b) + j[0] <= S:
                        b.append(j)
                        break
                else:
                    bins.append([j])
            for b in bins:
                assert sum(x[1] for x in b) <= P
                assert sum(x[2] for x in b) <= Fraction(gpus[t] * P, 100)
    assert sum(len(v) for v in placed.values()) > 20  # the test did exercise sharing


# --- type_choice = any (the shipped policy) -------------------------------------------------

def test_shipped_policy_lets_a_light_job_run_on_any_type():
    """Shards are the largest per-type need (t4: 26), with no type pinned."""
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, policy=SHIPPED_POLICY)
    assert d.action == "shared" and d.shards == 26
    assert d.job_desc["tres_per_node"] == "gres:shard:26"
    assert not d.job_desc.get("features")
    assert "the most of any type" in d.admin_comment


def test_any_falls_back_to_pinning_when_a_type_cannot_share():
    d = run({"comment": BIG_MEM, "tres_per_node": "gres:gpu:1"}, policy=SHIPPED_POLICY)
    assert d.action == "shared" and d.gpu_type == "a100" and d.job_desc["features"] == "a100"
    d = run({"comment": HEAVY_T4, "tres_per_node": "gres:gpu:1"}, policy=SHIPPED_POLICY)
    assert d.gpu_type == "a100" and d.job_desc["features"] == "a100"


def test_any_pins_a_type_where_the_hint_names_one_the_policy_lacks():
    # hsubmit predicts for the partition's types: an l4 there, unknown to the policy, would
    # take untyped shards costed for t4 and a100 only
    d = run({"comment": LIGHT + ";l4=20/3000/3500", "tres_per_node": "gres:gpu:1"}, policy=SHIPPED_POLICY)
    assert d.action == "shared" and d.gpu_type in ("t4", "a100") and d.job_desc["features"] == d.gpu_type
    d = run({"comment": LIGHT + ";l4=20/3000/3500", "tres_per_node": "gres:gpu:1", "features": "ib"},
            policy=SHIPPED_POLICY)
    assert d.action == "unchanged"


def test_a_job_the_hook_cannot_spread_still_shares():
    """What stays shareable beside those refusals: --oversubscribe, several tasks held to one
    node, a node list with the user's own type or with untyped shards (type_choice = any)."""
    for extra in ({"shared": 1}, {"shared": 65534}, {"num_tasks": 4, "max_nodes": 1}, {"num_tasks": 1}):
        d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", **extra})
        assert d.action == "shared" and d.job_desc["max_nodes"] == 1, extra
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:a100:1", "req_nodes": "gpu-a100"})
    assert d.action == "shared" and d.gpu_type == "a100"
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "exc_nodes": "gpu-a100"}, policy=SHIPPED_POLICY)
    assert d.action == "shared" and d.gpu_type == "any" and d.job_desc["tres_per_node"] == "gres:shard:26"
    assert not d.job_desc.get("features")


@pytest.mark.parametrize("nodes", ["gpu-t4,gpu-a100", "gpu-[1-2]", "gpu-[1,3]", "gpu-1 gpu-2", "gpu-[1",
                                   "gpu-[1]-[1-2]"])
@pytest.mark.parametrize("job,policy", [
    ({"tres_per_node": "gres:gpu:a100:1"}, POLICY),  # the user's own type
    ({"tres_per_node": "gres:gpu:1", "features": "a100"}, POLICY),  # ... in --constraint
    ({"tres_per_node": "gres:gpu:1"}, SHIPPED_POLICY),  # untyped shards (type_choice = any)
    ({"tres_per_node": "gres:gpu:1"}, POLICY),  # a type the hook picks
], ids=["gres type", "constraint type", "any", "order"])
def test_a_node_list_of_several_nodes_keeps_the_job_as_submitted(nodes, job, policy):
    """A review: -w gpu-t4,gpu-a100 with the user's own type or under type_choice = any got
    max_nodes = 1 and shards; slurmctld raises the node count to the list's, so the job was
    invalid or ran with shards on each node.  A list that may name several nodes is a
    multi-node job, whoever picks the type (the same reading refuses it in scontrol update)."""
    job = {"comment": LIGHT, "req_nodes": nodes, **job}
    d = run(job, policy)
    assert d.action == "unchanged" and "several nodes" in d.admin_comment, d.admin_comment
    assert d.written == ("admin_comment",)


def test_a_node_list_of_one_node_still_shares_where_the_type_is_known():
    for nodes in ("gpu-a100", "gpu-[3]", "gpu[03]"):
        d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:a100:1", "req_nodes": nodes})
        assert (d.action, d.gpu_type, d.job_desc["max_nodes"]) == ("shared", "a100", 1), nodes
        d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "req_nodes": nodes}, policy=SHIPPED_POLICY)
        assert (d.action, d.gpu_type, d.shards) == ("shared", "any", 26), nodes


def test_raw_shards_on_several_listed_nodes_are_not_costed_from_the_hint(tmp_path):
    pol = write_policy(tmp_path, BASE_POLICY + "raw_shards = whole\n")
    d = run({"comment": LIGHT, "tres_per_node": "gres:shard:a100:10", "req_nodes": "n[1-2]"}, pol)
    assert (d.action, d.reason) == ("exclusive", "raw_shards") and "several nodes" in d.admin_comment
    assert d.job_desc["tres_per_node"] == "gres:gpu:a100:1" and "max_nodes" not in d.job_desc


def _any_policy(tmp_path, order="a100", extra=""):
    """type_choice = any where type_order leaves t4 out: the policy still defines it."""
    return write_policy(tmp_path, BASE_POLICY.replace("type_order = t4, a100", f"type_order = {order}")
                        + "type_choice = any\n" + extra)


def test_any_costs_every_type_of_type_order_and_of_the_hint(tmp_path):
    """A review: type_choice = any costed the types of type_order only, so untyped shards could
    land on a type of the job's partition (one its hint names) that the job does not fit.  A
    type the policy defines for another partition alone (in no hint: hsubmit names the
    partition's types) does not keep the job from sharing (a regression review)."""
    pol = _any_policy(tmp_path)
    # fits both: the count covers t4 (26) too, not a100's 12 alone
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.shards) == ("shared", "any", 26), d.admin_comment
    assert "on t4, the most of any type" in d.admin_comment
    # does not fit t4 (14000 MiB > 90 % of 15360): pinned to a100, not untyped 38
    d = run({"comment": "horus:v1;a100=20/14000/14000;t4=20/14000/14000", "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.shards, d.job_desc["features"]) == ("shared", "a100", 38, "a100")
    # a hint without t4 (its partition has none): untyped, costed on the types it can reach
    d = run({"comment": "horus:v1;a100=20/10000/10000", "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type) == ("shared", "any"), d.admin_comment
    # a type of type_order the hint leaves out cannot be costed: pinned, as before
    d = run({"comment": "horus:v1;a100=20/10000/10000", "tres_per_node": "gres:gpu:1"},
            _any_policy(tmp_path, order="t4, a100"))
    assert (d.action, d.gpu_type) == ("shared", "a100")
    # a type defined for another partition alone (h100, in no hint) changes nothing
    other = _any_policy(tmp_path, order="t4, a100", extra="gpu.h100.mem_mib = 81920\n")
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, other)
    assert (d.action, d.gpu_type, d.shards) == ("shared", "any", 26), d.admin_comment
    # heavy on both types: an untyped whole GPU
    d = run({"comment": HEAVY, "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.job_desc["tres_per_node"]) == ("exclusive", "any", "gres:gpu:1")
    d = run({"comment": "horus:v1;a100=85/3000/3500", "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.job_desc["tres_per_node"]) == ("exclusive", "a100", "gres:gpu:a100:1")


def test_any_under_pressure_costs_every_type_the_hint_names(tmp_path):
    """An untyped job packed under pressure asks for the most shards any defined type needs:
    8000 MiB is 58 shards of a t4 (type_order = a100 leaves it out), 22 of an a100."""
    from slurm_horus.ledger.requeue import write_pressure

    pressure = tmp_path / "pressure"
    write_pressure(pressure, [])
    pol = _any_policy(tmp_path, extra=f"pressure_file = {pressure}\npack_heavy = always\n")
    d = run({"comment": "horus:v1;t4=85/8000/8000;a100=85/8000/8000", "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.shards, d.reason) == ("shared", "any", 58, "pack_heavy"), d.admin_comment


def test_any_keeps_the_users_type():
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:a100:1"}, policy=SHIPPED_POLICY)
    assert d.gpu_type == "a100" and d.shards == 12  # util 10 % of a 90 % limit


def test_any_shards_respect_the_policy_on_every_type():
    """Packing property for untyped requests: the count covers each type's own need."""
    import random

    rng = random.Random(3)
    for _ in range(200):
        u_t4, u_a100 = round(rng.uniform(0, 60), 1), round(rng.uniform(0, 60), 1)
        m = round(rng.uniform(100, 13000))
        token = f"horus:v1;t4={u_t4:.1f}/{m:.0f}/{m:.0f};a100={u_a100:.1f}/{m:.0f}/{m:.0f}"
        d = run({"comment": token, "tres_per_node": "gres:gpu:1"}, policy=SHIPPED_POLICY)
        if d.action == "shared" and d.gpu_type == "any":
            for util, mem_gpu in ((u_t4, 15360), (u_a100, 40960)):
                assert d.shards / 100 >= min(util, 100) / 90 - 1e-9
                assert d.shards / 100 >= m / (mem_gpu * 0.9) - 1e-9


def test_any_leaves_a_job_heavy_everywhere_untyped():
    """Heavy on every type: a whole GPU, any type (not pinned to the first in type_order)."""
    d = run({"comment": HEAVY, "tres_per_node": "gres:gpu:1"}, policy=SHIPPED_POLICY)
    assert d.action == "exclusive" and d.gpu_type == "any"
    assert d.job_desc["tres_per_node"] == "gres:gpu:1" and not d.job_desc.get("features")
    d = run({"comment": HEAVY, "tres_per_node": "gres:gpu:1"})  # type_choice = order
    assert d.gpu_type == "t4" and d.job_desc["tres_per_node"] == "gres:gpu:t4:1"


@pytest.mark.parametrize("memkind, comment, shards, used", [
    # old three-field hints: p95/p99 fall back to the p90
    ("p90", "horus:v1;t4=1/1000/9000", 66, "p90"),
    ("p95", "horus:v1;t4=1/1000/9000", 66, "p90"),
    ("p99", "horus:v1;t4=1/1000/9000", 66, "p90"),
    # hints with the p95 (and p99): ceil(100 * mem / (15360 * 0.9))
    ("p95", "horus:v1;t4=1/1000/9000/10000", 73, "p95"),
    # p99 on a hint without the p99: its p95, the largest bound it gives below (a review: its p90)
    ("p99", "horus:v1;t4=1/1000/9000/10000", 73, "p95"),
    ("p99", "horus:v1;t4=1/1000/9000/10000/12000", 87, "p99"),
    # a p99 claimed below the p95: never less than the p95 the user claimed (a review: its p90)
    ("p99", "horus:v1;t4=1/1000/9000/12000/10000", 87, "p99"),
    ("p95", "horus:v1;t4=1/1000/9000/100/12000", 66, "p95"),  # the p99 is above what p95 asks
    ("p90", "horus:v1;t4=1/1000/9000/10000/12000", 66, "p90"),
    ("expected", "horus:v1;t4=1/1000/9000/10000/12000", 8, "expected"),
])
def test_memory_bound_p95_p99(tmp_path, memkind, comment, shards, used):
    pol = write_policy(tmp_path, BASE_POLICY + f"memory = {memkind}\n")
    d = run({"comment": comment, "tres_per_node": "gres:gpu:1"}, pol)
    assert (d.action, d.shards) == ("shared", shards)
    assert f"MiB {used})" in d.admin_comment
    from slurm_horus.slurm.policy import policy_value

    assert policy_value("memory", "p90", pol) == memkind


@pytest.mark.parametrize("comment, why", [
    ("horus:v1;t4=1/1000/9000/", "malformed entry #1"),
    ("horus:v1;t4=1/1000/9000/1/2/3", "malformed entry #1"),
    ("horus:v1;t4=1/1000/9000/1e4", "bad p95 memory"),
    ("horus:v1;t4=1/1000/9000/10000/-5", "bad p99 memory"),
    ("horus:v1;t4=1/1000/9000/100000000", "bad p95 memory"),
])
def test_bad_bound_fields_are_bad_hints(comment, why):
    d = run({"comment": comment, "tres_per_node": "gres:gpu:1"})
    assert d.action == "unchanged" and why in d.admin_comment
    from slurm_horus.slurm.hint import parse_hint

    assert parse_hint(comment) is None


@pytest.mark.parametrize("lua", ["lua51", "lua54"])
def test_a_shard_count_from_the_policy_is_an_integer_on_every_lua(lua, tmp_path):
    # on Lua 5.3+ "^" gives a float: min_shards = 30 reached the job as "gres:shard:30.0"
    pytest.importorskip(f"lupa.{lua}")
    policy = tmp_path / "p.conf"
    policy.write_text(POLICY.read_text() + "\nmin_shards = 30\n")
    rt = HookRuntime(HOOK, lua=lua)
    d = rt.submit({"comment": "horus:v1;t4=5/1000/1000", "tres_per_node": "gres:gpu:1"}, policy_path=policy)
    assert d.action == "shared" and d.job_desc["tres_per_node"] == "gres:shard:30", d.job_desc



def test_the_hook_never_writes_a_field_past_slurms_1024_characters():
    """slurmctld checks --constraint and the tres_per_* strings at 1024 characters after the hook
    ("Pathname too long", job_mgr.c _test_job_desc_fields): "&a100" added to a 1022-character
    constraint, or gres:shard:26 / gres:gpu:t4:1 in place of gres:gpu:1 in a 1024-character
    GRES list, made a valid job invalid (a review)."""
    features = "&".join(f"f{i:03d}" for i in range(300))[:1022].rstrip("&")
    gres = "gres:gpu:1,gres:" + "x" * 1006 + ":1"
    assert len(features) == 1022 and len(gres) == 1024
    for job in ({"comment": LIGHT, "tres_per_node": "gres:gpu:a100:1", "features": features},
                {"comment": LIGHT, "tres_per_node": gres},   # shared: shard:26
                {"comment": HEAVY, "tres_per_node": gres}):  # whole: pinned to gpu:t4:1
        d = run(job)
        assert d.rc == 0 and d.action == "unchanged", d
        assert {k: v for k, v in d.job_desc.items() if k != "admin_comment"} == job
        assert "1024" in d.note

# a step asking for GPUs by name finds no gpu GRES in a job on shards: srun fails with
# "Invalid generic resource (gres) specification" (seen on the 22.05 cluster)
WRAP = "#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{}\n"


@pytest.mark.parametrize("line", [
    "srun --gres=gpu:1 python train.py",
    "srun --gres gpu:1 python train.py",
    "srun -n 1 --gpus=1 python train.py",
    "srun -G1 python train.py",
    "srun -G 1 python train.py",
    "srun --gpus-per-task=1 -n1 python train.py",
    "srun --cpus-per-gpu=4 python train.py",
    "srun --tres-per-task=gres/gpu:1 python train.py",
    "srun --tres-bind=gres/gpu:closest python train.py",  # 25.11's spelling of --gpu-bind
    "srun --gre=gpu:1 python train.py",  # getopt's abbreviation
    "cd /x && srun -l --gres=gpu:a100:1 python train.py",
    "time /usr/bin/srun --gpus 1 hostname",
    "srun -n 2 \\\n  --gres=gpu:1 \\\n  python train.py",
    "srun hostname; srun --gpus=1 nvidia-smi",
    # getopt takes a unique prefix of a long option, and bundled one-letter options (a review)
    "srun --cpus-per-g=2 python train.py",
    "srun --mem-per-g=1G python train.py",
    "srun --ntasks-per-g 1 python train.py",
    "srun --gr gpu:1 python train.py",
    "srun -lG1 python train.py",
    "srun -lG 1 python train.py",
    "srun -ln 2 --gpus=1 python train.py",  # -ln's value is the next word, not the program
])
def test_a_script_whose_steps_ask_for_gpus_by_name_stays_unchanged(line):
    for script in (f"#!/bin/bash\n#SBATCH -t 5\nmodule load cuda\n{line}\n", WRAP.format(line)):
        d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": script})
        assert d.action == "unchanged" and "srun steps ask for GPUs" in d.admin_comment, line
        assert d.written == ("admin_comment",)


@pytest.mark.parametrize("line", [
    "srun python train.py",
    "srun python train.py --gpus 4",  # the program's own options (Lightning's --gpus)
    "srun -n 1 -c 4 python train.py --gres=gpu:1",
    "# srun --gres=gpu:1 python train.py",
    "python train.py --gpus 1",
    "mysrun --gpus=1 x",
    "srun --gres=shard:10 python train.py",
    "srun -u python -u train.py --gpus 1",  # a flag of srun's: the next word is the program
    "srun --exclusive python -m train --gpus 2",
    "srun -lu python train.py --gpus 2",
    "srun -n4 python train.py --gpus 2",
    "srun --mem=4G python train.py --gpus 1",  # --mem and --ntasks: exact names, not --mem-per-gpu
    "srun --ntasks 2 python train.py --gpus 1",
    "srun -lo G.log python train.py",  # G in -o's value
    "srun --gres-flags=enforce-binding python train.py",
    "srun --tres-bind=gres/nic:closest python train.py",  # binds no GPU
])
def test_a_script_whose_steps_ask_no_gpu_by_name_is_still_shared(line):
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": f"#!/bin/bash\n{line}\n"})
    assert d.action == "shared", (line, d.admin_comment)


@pytest.mark.parametrize("script", [
    "srun " * 800_000,  # one 4 MB line of srun words
    ("srun -x " * 20_000 + "\n") * 25,  # each srun's options running on past the next srun
    " " * 4_000_000 + "srun --gpus=1 x\n",  # a long run of blanks before the first word
    "#" + "srun " * 800_000,  # a comment line
])
def test_the_script_scan_is_bounded_on_hostile_scripts(script):
    """Each srun word had copied the rest of its line: 20,000 on one line took 4 s in Lua 5.1,
    200 KB 15 s, quadratic (slurmctld stalls; these had taken hours).  Now the script is walked
    once, each word's options read within a window, and at most MAX_SRUN_WORDS words looked at
    (the time: benchmarks/bench_hook.py)."""
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": script})
    assert d.rc == 0 and d.action == ("unchanged" if "--gpus=1" in script else "shared"), d.admin_comment


@pytest.mark.parametrize("comment,whole", [("horus:v1;a100=95/6000/6900", True),
                                           ("horus:v1;a100=60/6000/6900", False)],
                         ids=["kept whole for its util", "capped"])
def test_the_loop_gives_a_job_shared_for_pressure_what_the_hook_would_have_given(tmp_path, comment, whole):
    """Under queue pressure the hook tags two jobs reason=pressure: one it would have kept whole
    (95 %) and one whose 67 shards it caps at 50 (60 %).  Once the queue drained, horus-admin
    queue spread both to a whole GPU: the 60 % job held an A100 the policy would share.  Its
    decision token now says what it would have had, and the loop gives exactly that back."""
    from slurm_horus.ledger.requeue import pressure_actions, write_pressure

    pressure = tmp_path / "pressure"
    pol = write_policy(tmp_path, BASE_POLICY + f"record_file = {NO_RECORD}\npressure_file = {pressure}\n")
    job = {"comment": comment, "tres_per_node": "gres:gpu:1"}
    alone = run(job, pol)  # no pressure file: what the policy gives the job
    write_pressure(pressure, ["a100"])
    d = run(job, pol)
    assert (d.action, d.gpu_type, d.shards, d.reason) == ("shared", "a100", 50, "pressure"), d.admin_comment
    assert (alone.action, alone.shards) == (("exclusive", None) if whole else ("shared", 67))
    rec = {"JobId": "7", "JobState": "PENDING", "Reason": "Resources", "Priority": "1",
           "SubmitTime": "2026-01-01T00:00:00", "TresPerNode": d.job_desc["tres_per_node"],
           "Features": d.job_desc.get("features") or "", "AdminComment": d.admin_comment, "Comment": comment}
    idle = [{"NodeName": "n1", "State": "IDLE", "Gres": "gpu:a100:4,shard:a100:400", "GresUsed": ""}]
    busy = [{**idle[0], "State": "ALLOCATED", "GresUsed": "gpu:a100:4(IDX:0-3),shard:a100:0(IDX:N/A)"}]
    assert pressure_actions([rec], busy, 50, lambda *a: 1, 0, 1.9e9) == []  # pressure still on
    acts = pressure_actions([rec], idle, 50, lambda *a: 1, 0, 1.9e9)
    assert [(a.kind, a.tres) for a in acts] == [("spread", "gres:gpu:a100:1" if whole else "gres:shard:67")]


def submit_as_slurmctld(job: dict, env: dict[str, str] | None, policy: Path = POLICY):
    """slurm_job_submit on a job_desc as slurmctld hands it over: with its environment, a table
    read by variable name (empty for srun and salloc), which decide() cannot pass.  Returns
    (rc, the fields after, the user's lines)."""
    from slurm_horus.slurm.hook_runtime import HookRuntime

    rt = HookRuntime(HOOK)
    g = rt._g
    g._horus_reset()
    g._horus_policy_override = str(policy)
    try:
        fields = rt._lua.table_from({**job, "environment": rt._lua.table_from(env or {})})
        jd, backing, _ = g._horus_make_job(fields)
        rc = g.slurm_job_submit(jd, rt._lua.table(), TEST_UID)
        return rc, dict(backing.items()), [str(m) for m in g._horus_user_msgs.values()]
    finally:
        g._horus_policy_override = None


SCRIPT = "#!/bin/sh\nsrun python train.py\n"


@pytest.mark.parametrize("env", [
    {"SLURM_GPUS_PER_NODE": "1"},  # sbatch --gpus-per-node=1: tres_per_node gres:gpu:1, like --gres
    {"SLURM_GPUS": "1"},
    # submitted from inside another job's allocation, whose GPU options srun reads too
    {"SLURM_GPUS_PER_TASK": "1"}, {"SLURM_CPUS_PER_GPU": "4"}, {"SLURM_GRES": "gpu:1"},
    {"SLURM_TRES_PER_TASK": "gres/gpu:1"},
    {"SLURM_TRES_BIND": "gres/gpu:closest"},  # 25.11 srun's --tres-bind, from a parent job
], ids=lambda e: next(iter(e)))
def test_gpu_options_in_the_job_environment_keep_it_whole(env):
    """A review: --gpus-per-node=1 reaches the hook as tres_per_node gres:gpu:1, as --gres=gpu:1
    does, and was put on shards; but sbatch puts SLURM_GPUS_PER_NODE=1 in the job's environment,
    srun reads it as its own option, and every plain srun step failed ("Step requested GRES
    (gpu:(null)) not found").  The environment says so: the job stays as submitted."""
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": SCRIPT}
    rc, after, user = submit_as_slurmctld(job, {"PATH": "/usr/bin", **env})
    assert rc == 0 and after["tres_per_node"] == "gres:gpu:1" and "features" not in after
    assert parse_decision(after["admin_comment"]).action == "unchanged"
    assert user == [after["admin_comment"].rsplit(" ", 1)[0]] and "use --gres=gpu:1 to share" in user[0]


def test_a_job_environment_without_gpu_options_still_shares():
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": SCRIPT}
    for env in ({}, {"PATH": "/usr/bin", "SLURM_GRES": "nvme:1", "SLURM_GPUS": "", "SLURM_JOB_GPUS": "0",
                                     "SLURM_TRES_BIND": "gres/nic:closest"}):
        rc, after, _ = submit_as_slurmctld(job, env)
        assert rc == 0 and after["tres_per_node"] == "gres:shard:26" and after["features"] == "t4", env


@pytest.mark.parametrize("script", [None, "", " \n"])
def test_an_allocation_without_a_batch_script_keeps_its_gpu(script):
    """A review: `srun --gres=gpu:1 --comment=<hint> cmd`, an allocation of its own, was put on
    shards, and its step, asking for gpu:1 again, failed.  slurmctld gives srun and salloc
    allocations no batch script: they stay as submitted, and the user is told why."""
    job = {"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": script}
    rc, after, user = submit_as_slurmctld(job, {})
    assert rc == 0 and after["tres_per_node"] == "gres:gpu:1" and "max_nodes" not in after
    assert parse_decision(after["admin_comment"]).action == "unchanged"
    assert len(user) == 1 and "no batch script" in user[0]
    # hsubmit --explain and the simulator describe sbatch jobs without an environment: decided as such
    assert run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}).action == "shared"
