"""The hook never makes a valid job invalid through the GPU typing it chooses (issue 13 item 4).

Slurm 25.11 refuses a job whose --constraint names a feature no node has ("Invalid feature
specification") and one whose GRES names a type no node has ("Requested node configuration is
not available"); job_submit/lua shows the hook no node features or GRES, so the policy declares
them: `type_features` (node features, one per GPU type) and `gpu.<type>.mem_mib` (GRES types).
Run on the real etc/job_submit.lua in Lua 5.1 (lupa)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("lupa")

from slurm_horus.slurm.hook_runtime import Decision, HookRuntime  # noqa: E402
from slurm_horus.slurm.policy import decide, policy_value  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "etc" / "job_submit.lua"
SHIPPED = REPO / "etc" / "horus_policy.conf"
UID = 54321

LIGHT = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"  # t4: 26 shards, a100: 12
BIG_MEM = "horus:v1;t4=20/14000/14500;a100=10/14000/14500"  # fits a100 only (40 shards)
HEAVY = "horus:v1;t4=85/3000/3500;a100=75/3000/3500"  # whole GPU everywhere

BASE = """
shards_per_gpu = 100
pack_limit_pct = 90
exclusive_util_pct = 70
memory = p90
gpu.a100.mem_mib = 40960
gpu.t4.mem_mib = 15360
type_order = t4, a100
underclaim_limit = 0
"""


@pytest.fixture()
def policy(tmp_path):
    def write(extra: str = "", name: str = "policy.conf") -> Path:
        p = tmp_path / name
        p.write_text(BASE + extra)
        return p
    return write


def run(job: dict, pol: Path) -> Decision:
    return decide(job, policy_path=pol, hook_path=HOOK, submit_uid=UID)


def assert_as_submitted(d: Decision, job: dict, note: str) -> None:
    """Only the AdminComment is written, it says why (and the decision token), and the user is
    told the same."""
    assert d.rc == 0 and d.action == "unchanged"
    assert d.written == ("admin_comment",)
    assert {k: v for k, v in d.job_desc.items() if k != "admin_comment"} == job
    assert d.admin_comment == note + " horus-decision:v1;action=unchanged;reason=not_handled"
    assert d.user_messages == [note]


# --------------------------------------------------------------------------- type_via = features

@pytest.mark.parametrize("gres", ["gres:gpu:1", "gres/gpu:1"])
def test_no_declared_feature_leaves_the_job_as_submitted(policy, gres):
    job = {"comment": LIGHT, "tres_per_node": gres}
    d = run(job, policy())  # type_features not set: no feature declared
    assert_as_submitted(d, job, "horus: unchanged (type_via = features, no node feature t4 declared)")
    assert any("type_features not set" in m for _, m in d.log)  # slurmctld says why, once


def test_only_declared_features_are_added(policy):
    pol = policy("type_features = a100\n")
    job = {"comment": LIGHT, "tres_per_node": "gres/gpu:1"}
    # t4 comes first in type_order but has no declared feature: not pinned, not moved to a100
    assert_as_submitted(run(job, pol), job, "horus: unchanged (type_via = features, no node feature t4 declared)")
    d = run({"comment": BIG_MEM, "tres_per_node": "gres/gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.shards) == ("shared", "a100", 40)
    assert d.job_desc["tres_per_node"] == "gres/shard:40" and d.job_desc["features"] == "a100"
    d = run({"comment": BIG_MEM, "tres_per_node": "gres/gpu:a100:1", "features": "ib"}, pol)
    assert d.job_desc["tres_per_node"] == "gres/shard:40" and d.job_desc["features"] == "ib&a100"
    assert not any("type_features not set" in m for _, m in d.log)


def test_users_type_without_declared_feature_is_kept(policy):
    pol = policy("type_features = a100\n")
    for job in ({"comment": LIGHT, "tres_per_node": "gres:gpu:t4:1"},
                {"comment": LIGHT, "tres_per_node": "gres/gpu:t4:1", "features": "ib"}):
        assert_as_submitted(run(job, pol), job,
                            "horus: unchanged (type_via = features, no node feature t4 declared)")


def test_users_own_constraint_is_not_an_added_feature(policy):
    """--constraint=t4 was the user's: the hook adds nothing to it, so it may share."""
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "features": "t4"}, policy())
    assert (d.action, d.gpu_type, d.shards) == ("shared", "t4", 26)
    assert d.job_desc["features"] == "t4" and "features" not in d.written


def test_explicitly_empty_declares_none_without_a_warning(policy):
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, policy("type_features =\n"))
    assert d.action == "unchanged" and "no node feature t4 declared" in d.admin_comment
    assert not any("type_features not set" in m for _, m in d.log)


def test_whole_gpu_pin_uses_the_gres_type_the_policy_knows(policy):
    """A job that needs a whole GPU is pinned by its GRES type (gpu.<type>.mem_mib), not by a
    feature, so it is pinned whatever type_features says."""
    d = run({"comment": HEAVY, "tres_per_node": "gres:gpu:1"}, policy())
    assert (d.action, d.gpu_type) == ("exclusive", "t4")
    assert d.job_desc["tres_per_node"] == "gres:gpu:t4:1" and "features" not in d.written


def test_type_choice_any_still_shares_without_features(policy):
    pol = policy("type_choice = any\n")
    d = run({"comment": LIGHT, "tres_per_node": "gres/gpu:1"}, pol)
    assert (d.action, d.gpu_type, d.shards) == ("shared", "any", 26)
    assert d.job_desc["tres_per_node"] == "gres/shard:26" and "features" not in d.written
    # fits a100 only: any falls back to pinning, which needs the a100 feature
    job = {"comment": BIG_MEM, "tres_per_node": "gres/gpu:1"}
    assert_as_submitted(run(job, pol), job, "horus: unchanged (type_via = features, no node feature a100 declared)")
    d = run(job, policy("type_choice = any\ntype_features = a100, t4\n", name="p2.conf"))
    assert d.gpu_type == "a100" and d.job_desc["features"] == "a100"


def test_raw_shards_with_a_hint_on_an_undeclared_type_get_whole_gpus(policy):
    d = run({"comment": LIGHT, "tres_per_node": "gres:shard:30"}, policy("raw_shards = whole\n"))
    assert d.rc == 0 and d.job_desc["tres_per_node"] == "gres:gpu:1" and "features" not in d.written
    assert "hint not applied: type_via = features, no node feature t4 declared" in d.admin_comment


# --------------------------------------------------------------------------- type_via = gres

def test_type_via_gres_writes_only_types_the_policy_knows(policy):
    pol = policy("type_via = gres\n")  # needs no type_features
    d = run({"comment": LIGHT, "tres_per_node": "gres/gpu:1"}, pol)
    assert d.job_desc["tres_per_node"] == "gres/shard:t4:26" and "features" not in d.written
    assert not any("type_features" in m for _, m in d.log)
    job = {"comment": "horus:v1;v100=20/3000/3500;t4=20/3000/3500", "tres_per_node": "gres/gpu:v100:1"}
    assert_as_submitted(run(job, pol), job, "horus: unchanged (policy does not know type v100)")


# --------------------------------------------------------------------------- policy file

def test_shipped_policy_declares_the_test_clusters_features():
    assert policy_value("type_features", path=SHIPPED) == "a100, t4"
    d = decide({"comment": BIG_MEM, "tres_per_node": "gres:gpu:1"}, policy_path=SHIPPED, hook_path=HOOK,
               submit_uid=UID)
    assert d.job_desc["features"] == "a100"


def test_policy_value_knows_type_features(policy):
    assert policy_value("type_features", "", path=policy()) == ""
    pol = policy("type_features = t4\ntype_features = a100, t4  # both\n", name="p2.conf")
    assert policy_value("type_features", "", path=pol) == "a100, t4"


# --------------------------------------------------------------------------- random check

POOL = ["a100", "t4", "h100", "v100"]
MEM = {"a100": 40960, "t4": 15360, "h100": 81920, "v100": 16384}
GRES_NAMES = {"gpu", "shard", "nvme"}


def gres_entries(job: dict) -> list[tuple[str, str | None, int]]:
    """(name, type, count) of every GRES entry in the job's tres_per_* fields."""
    out = []
    for f in ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"):
        for item in filter(None, (job.get(f) or "").split(",")):
            parts = item[5:].split(":") if item[:5] in ("gres:", "gres/") else item.split(":")
            name, typ = parts[0], parts[1] if len(parts) == 3 else None
            out.append((name, typ, int(parts[-1]) if len(parts) > 1 else 1))
    return out


def features_of(job: dict) -> set[str]:
    return set(filter(None, (job.get("features") or "").split("&")))


def valid(job: dict, nodes: list[tuple[str, set[str]]]) -> bool:
    """What slurmctld checks that the hook can affect: GRES names, no gpu beside shard, and
    some node (GPU type, features) with every feature the job asks for and the GPU type its
    typed GRES names (checked per node: a set of the cluster's features let "ib&t4" pass
    where no t4 node has ib)."""
    entries = gres_entries(job)
    names = {n for n, _, c in entries if c > 0}
    if not all(n in GRES_NAMES for n, _, _ in entries) or {"gpu", "shard"} <= names:
        return False
    return any(features_of(job) <= nf and all(t is None or t == nt for _, t, _ in entries)
               for nt, nf in nodes)


def random_case(rng: random.Random):
    types = set(rng.sample(POOL, rng.randint(1, 4)))                     # the cluster's GRES types
    feats = {t for t in types if rng.random() < 0.6}                      # type features on their nodes
    # one node per type, with its type's feature and, on some, ib
    nodes = [(t, ({t} if t in feats else set()) | ({"ib"} if rng.random() < 0.5 else set()))
             for t in sorted(types)]
    if not any("ib" in f for _, f in nodes):
        nodes[0][1].add("ib")
    known = rng.sample(sorted(types), rng.randint(1, len(types)))         # gpu.<type>.mem_mib
    lines = [f"gpu.{t}.mem_mib = {MEM[t]}" for t in known]
    declared: set[str] = set()
    if rng.random() < 0.8:
        declared = {t for t in known if t in feats and rng.random() < 0.7}
        lines.append("type_features = " + ", ".join(sorted(declared)))
    lines += [f"type_via = {rng.choice(['features', 'features', 'gres'])}",
              f"type_choice = {rng.choice(['order', 'any'])}",
              f"raw_shards = {rng.choice(['allow', 'whole', 'refuse'])}",
              "type_order = " + ", ".join(rng.sample(known, len(known))), "underclaim_limit = 0"]

    p = rng.choice(["gres:", "gres/"])
    t = rng.choice(sorted(types))
    req = rng.choice([("tres_per_node", f"{p}gpu:1"), ("tres_per_node", f"{p}gpu:{t}:1"),
                      ("tres_per_job", f"{p}gpu:1"), ("tres_per_node", f"{p}gpu:2"),
                      ("tres_per_node", f"{p}shard:{rng.randint(1, 150)}"),
                      ("tres_per_node", f"{p}shard:{t}:{rng.randint(1, 150)}")])
    job = {req[0]: req[1]}
    if rng.random() < 0.3:
        job["tres_per_node"] = ",".join(filter(None, [job.get("tres_per_node"), f"{p}nvme:1"]))
    cons = [f for f in sorted(feats | {"ib"}) if rng.random() < 0.3]
    if cons:
        job["features"] = "&".join(cons)
    preds = {g: (rng.choice([1, 20, 50, 85]), rng.choice([500, 3000, 14000, 30000]))
             for g in rng.sample(POOL, rng.randint(1, 4))}
    job["comment"] = "horus:v1;" + ";".join(f"{g}={u}/{m}/{m + 500}" for g, (u, m) in preds.items())
    return "\n".join(lines) + "\n", nodes, declared, set(known), job


@pytest.mark.parametrize("seed", range(4))
def test_random_jobs_stay_valid_and_use_only_declared_typing(tmp_path, seed):
    rng = random.Random(seed)
    rt = HookRuntime(HOOK)
    pol = tmp_path / "policy.conf"
    changed = kept = 0
    for i in range(600):  # (--gpus jobs, one choice in six, are always left as they are)
        text, nodes, declared, known, job = random_case(rng)
        pol.write_text(text)
        if not valid(job, nodes):
            continue
        d = rt.submit(job, policy_path=pol, submit_uid=UID)
        if d.rc != 0:  # a refusal the policy asked for (raw_shards = refuse), said to the user
            assert d.user_messages and "job rejected" in d.user_messages[0]
            continue
        out = d.job_desc
        ctx = (text, job, out, d.admin_comment)
        assert valid(out, nodes), ctx
        assert features_of(out) - features_of(job) <= declared, ctx
        new_types = {t for _, t, _ in gres_entries(out)} - {t for _, t, _ in gres_entries(job)} - {None}
        assert new_types <= known, ctx
        if d.action == "unchanged":
            assert set(d.written) <= {"admin_comment"}, ctx
        if "no node feature" in (d.admin_comment or ""):
            kept += 1
        changed += bool(set(d.written) - {"admin_comment"})
    assert changed > 50 and kept > 10  # both sides were exercised
