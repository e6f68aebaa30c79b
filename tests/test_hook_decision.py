"""The hook's decision as data: the token job_submit.lua writes beside its note
(hint.parse_decision), and the policy file as Python reads and rewrites it
(policy.policy_values, policy.policy_with_overrides) against what the hook does."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("lupa")

from slurm_horus.errors import HorusError  # noqa: E402
from slurm_horus.ledger.requeue import write_pressure  # noqa: E402
from slurm_horus.slurm.hint import DECISION_REASONS, HookDecision, parse_decision  # noqa: E402
from slurm_horus.slurm.policy import decide, policy_values, policy_with_overrides  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "etc" / "job_submit.lua"
UID = 54321
LIGHT = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"  # t4: 26 shards (memory-bound)
BASE = """shards_per_gpu = 100
pack_limit_pct = 90
exclusive_util_pct = 70
gpu.a100.mem_mib = 40960
gpu.t4.mem_mib = 15360
type_order = t4, a100
type_features = a100, t4
raw_shards = whole
"""

# One job per outcome the hook can reach: (name, job, policy extra, expected (action, type, shards, reason)).
CASES = [
    ("shared", {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, "",
     ("shared", "t4", 26, None)),
    ("util", {"comment": "horus:v1;t4=85/3000/3500", "tres_per_node": "gres:gpu:1"}, "",
     ("exclusive", "t4", None, "util")),
    ("pack limit", {"comment": "horus:v1;t4=95/3000/3500", "tres_per_node": "gres:gpu:1"},
     "exclusive_util_pct = 100\n", ("exclusive", "t4", None, "pack_limit")),
    ("memory", {"comment": "horus:v1;t4=10/15000/15000", "tres_per_node": "gres:gpu:t4:1"}, "",
     ("exclusive", "t4", None, "memory")),
    ("record", {"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, "RECORD",
     ("exclusive", "any", None, "record")),
    ("raw shards", {"tres_per_node": "gres:shard:3"}, "",
     ("exclusive", "any", None, "raw_shards")),
    ("not handled", {"comment": LIGHT, "tres_per_node": "gres:gpu:2"}, "",
     ("unchanged", None, None, "not_handled")),
    ("bad hint", {"comment": "horus:v1;t4=x", "tres_per_node": "gres:gpu:1"}, "",
     ("unchanged", None, None, "bad_hint")),
    ("pressure", {"comment": "horus:v1;t4=85/3000/3500", "tres_per_node": "gres:gpu:1"}, "PRESSURE",
     ("shared", "t4", 50, "pressure")),
    ("pack heavy", {"comment": "horus:v1;t4=85/3000/3500", "tres_per_node": "gres:gpu:1"}, "PACK_HEAVY",
     ("shared", "t4", 50, "pack_heavy")),
]


def _policy(tmp_path: Path, extra: str, name: str = "policy.conf") -> Path:
    record = tmp_path / "record"
    record.unlink(missing_ok=True)  # one case's record must not decide the next
    if extra == "RECORD":
        record.write_text(f"user {UID} alice 4 9\n")
        extra = ""
    if extra == "PRESSURE":
        extra = f"pressure_file = {_pressure(tmp_path, 't4')}\n"
    if extra == "PACK_HEAVY":  # a fresh file that names no type under pressure
        extra = f"pressure_file = {_pressure(tmp_path)}\npack_heavy = always\n"
    p = tmp_path / name
    p.write_text(BASE + f"record_file = {record}\n" + extra)
    return p


def _pressure(tmp_path: Path, *types: str, age_s: float = 0, text: str | None = None,
              util_limit: float = 100.0) -> Path:
    """A pressure file as horus-admin queue writes it (``write_pressure``)."""
    p = tmp_path / "pressure"
    if text is None:
        write_pressure(p, types, now=time.time() - age_s, util_limit_pct=util_limit)
    else:
        p.write_text(text)
    return p


def _outcome(d) -> tuple:
    return d.action, d.gpu_type, d.shards, d.reason


def _token(tmp_path: Path, job: dict, want: tuple) -> HookDecision:
    """The decision ``want`` names; shared for queue pressure, with what the hook gives ``job``
    without it (unpressed: a whole GPU, or its shards)."""
    d = HookDecision(*want[:3], 100 if want[2] else None, want[3])
    if want[3] not in ("pressure", "pack_heavy"):
        return d
    alone = decide(job, policy_path=_policy(tmp_path, "", "alone.conf"), hook_path=HOOK, submit_uid=UID)
    return replace(d, unpressed_whole=alone.action == "exclusive", unpressed_shards=alone.shards)


@pytest.mark.parametrize("name,job,extra,want", CASES, ids=[c[0] for c in CASES])
def test_every_outcome_has_a_token_python_reads(tmp_path, name, job, extra, want):
    d = decide(job, policy_path=_policy(tmp_path, extra), hook_path=HOOK, submit_uid=UID)
    assert _outcome(d) == want, d.admin_comment
    assert parse_decision(d.admin_comment) == _token(tmp_path, job, want)
    note, token = d.admin_comment.rsplit(" ", 1)
    assert d.user_messages == [note] and "horus-decision" not in note and len(token) <= 120


def test_the_reason_codes_are_the_hooks():
    """Every reason code Python accepts is one the hook writes (the CASES reach them all)."""
    reached = {(c[3][0], c[3][3]) for c in CASES if c[3][3]}
    assert reached == {(a, r) for a, rs in DECISION_REASONS.items() for r in rs}


def _reworded_hook(tmp_path: Path, token_edit: tuple[str, str] | None = None) -> Path:
    text = HOOK.read_text()
    for old, new in [('"horus: shared %s shards=%d/%d (util', '"horus: packed onto %s, %d of %d shards (util'),
                     ('"horus: exclusive "', '"horus: a whole GPU for "'),
                     ('"horus: unchanged ("', '"horus: left as it was ("'),
                     ('"horus: ignored hint ("', '"horus: hint not used ("')]:
        assert old in text
        text = text.replace(old, new)
    if token_edit:
        assert token_edit[0] in text
        text = text.replace(*token_edit)
    p = tmp_path / "hooks" / "job_submit.lua"
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return p


def test_decisions_come_from_the_token_not_the_wording(tmp_path):
    reworded = _reworded_hook(tmp_path)
    for name, job, extra, want in CASES:
        pol = _policy(tmp_path, extra, name=f"{name}.conf".replace(" ", "_"))
        d = decide(job, policy_path=pol, hook_path=reworded, submit_uid=UID)
        assert "horus: shared" not in d.admin_comment and "horus: exclusive" not in d.admin_comment
        assert _outcome(d) == want, (name, d.admin_comment)


def test_a_changed_token_changes_the_decision(tmp_path):
    """The converse: same note, token says otherwise -> Decision follows the token."""
    hook = _reworded_hook(tmp_path, ('";type=" .. plan.gtype', '";type=" .. plan.gtype .. "x"'))
    d = decide(CASES[0][1], policy_path=_policy(tmp_path, ""), hook_path=hook, submit_uid=UID)
    assert "packed onto t4, 26 of 100 shards" in d.admin_comment and d.job_desc["features"] == "t4"
    assert (d.action, d.gpu_type, d.shards) == ("shared", "t4x", 26)


FAKE = "horus-decision:v1;action=shared;type=a100;shards=1/100"


def test_a_fake_token_before_the_hooks_is_not_taken(tmp_path):
    pol = _policy(tmp_path, "")
    heavy = {"comment": "horus:v1;t4=85/3000/3500", "tres_per_node": "gres:gpu:1"}
    for admin in (FAKE, f"note {FAKE}", f"{FAKE};", f"x {FAKE} {FAKE}"):
        d = decide({**heavy, "admin_comment": admin}, policy_path=pol, hook_path=HOOK, submit_uid=UID)
        assert d.admin_comment.startswith(admin + "; horus: exclusive t4")
        assert _outcome(d) == ("exclusive", "t4", None, "util")
        assert parse_decision(d.admin_comment) == HookDecision("exclusive", "t4", reason="util")
    # in the user's --comment a token is neither a hint nor a decision
    d = decide({**heavy, "comment": f"{FAKE} {heavy['comment']}"}, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert _outcome(d) == ("exclusive", "t4", None, "util")
    # a job the hook leaves alone keeps its AdminComment and has no decision
    d = decide({"tres_per_node": "gres:gpu:1", "admin_comment": FAKE}, policy_path=pol, hook_path=HOOK)
    assert d.written == () and d.action == "unchanged" and d.gpu_type is None


@pytest.mark.parametrize("text,want", [
    (None, None),
    ("", None),
    ("set by hand", None),
    ("horus: shared t4 shards=26/100 (util 20%, mem 3500 MiB p90)", None),  # prose alone: no decision
    (f"a {FAKE}", HookDecision("shared", "a100", 1, 100)),
    (f"{FAKE}\tnext words", HookDecision("shared", "a100", 1, 100)),  # a later plugin's text is fine
    (f"{FAKE} horus-decision:v1;action=exclusive;type=t4;reason=util", HookDecision("exclusive", "t4", reason="util")),
    (f"{FAKE} horus-decision:v2;action=shared", None),        # the last one is unreadable: not the earlier
    (f"{FAKE} horus-decision:v1;action=shared;type=t4", None),  # shared without shards
    ("horus-decision:v1;action=exclusive;type=t4", None),      # exclusive without reason
    ("horus-decision:v1;action=exclusive;type=t4;reason=bad_hint", None),  # not an exclusive reason
    ("horus-decision:v1;action=unchanged;type=t4;reason=not_handled", None),
    ("horus-decision:v1;action=unchanged;reason=not_handled", HookDecision("unchanged", reason="not_handled")),
    ("horus-decision:v1;action=shared;type=t4;shards=0/100", None),
    ("horus-decision:v1;action=shared;type=T4;shards=1/100", None),
    ("xhorus-decision:v1;action=shared;type=t4;shards=1/100", None),  # not a word of its own
])
def test_parse_decision(text, want):
    assert parse_decision(text) == want


# --------------------------------------------------------------------------- the policy file

VALUES = {
    "shards_per_gpu": ["200", "0", "10001", "1e3", "-5", "5.0", "1234567890"],
    "pack_limit_pct": ["50", "101", "0"],
    "exclusive_util_pct": ["50.5", "100", "100.0001", "5.", ".5", "1.0000000001"],
    "memory": ["p95", "P95", "p50"],
    "min_shards": ["5", "0", "101"],
    "on_bad_hint": ["reject", "fail"],
    "type_via": ["gres", "node"],
    "type_choice": ["any", "first"],
    "raw_shards": ["refuse", "deny"],
    "min_mem_mib": ["0", "100000000"],
    "record_file": ["/x/y", "x/y", "/a\x01b"],
    "underclaim_limit": ["0", "1000001"],
    "underclaim_window_days": ["7", "0", "36501"],
    "slowdown_bound": ["1.5", "2", "0.9999", "0.999", "1", "10", "10.0001", "10.000", ".5", "1.0000000001"],
    "slowdown_tail": ["p95", "median", "p50", "P95", "p99", "p9"],
    "gpu.v100.mem_mib": ["16384", "0", "lots"],
}


def test_python_accepts_exactly_the_values_the_hook_accepts(tmp_path):
    n = 0
    for key, values in VALUES.items():
        for v in values:
            n += 1
            pol = tmp_path / f"p{n}.conf"  # a new path each time: the hook logs each warning once
            text = BASE + f"{key} = {v}\n"
            pol.write_text(text)
            d = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1"}, policy_path=pol, hook_path=HOOK,
                        submit_uid=UID)
            hook_rejects = any(f"policy: {key}:" in msg for _, msg in d.log)
            assert (policy_values(text).get(key) != v) == hook_rejects, (key, v, d.log)


def test_policy_with_overrides_replaces_every_base_line(tmp_path):
    base = BASE + "shards_per_gpu = 100   # again\nmin_mem_mib = 512\n"
    new = {"shards_per_gpu": "200", "gpu.v100.mem_mib": "16384", "type_order": "v100, t4",
           "type_features": "v100, t4"}
    text = policy_with_overrides(base, new)
    assert policy_values(text) == {**policy_values(base), **new}
    assert text.startswith("# (overridden below) shards_per_gpu = 100\n")
    pol = tmp_path / "p.conf"
    pol.write_text(text)
    d = decide({"comment": "horus:v1;v100=20/3000/3500;t4=20/3000/3500", "tres_per_node": "gres:gpu:1"},
               policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert (d.action, d.gpu_type, d.shards_per_gpu) == ("shared", "v100", 200), d.admin_comment
    # an override the hook would reject would leave the base value in force: refused instead
    text = policy_with_overrides(base, {"raw_shards": "refuse"})
    assert policy_values(text)["raw_shards"] == "refuse" and text.count("raw_shards = whole") == 1


@pytest.mark.parametrize("overrides", [
    {"shards_per_gpu": "0"}, {"nonsense": "1"}, {"gpu.V100.mem_mib": "1"}, {"memory": "p90 # x"},
    {"record_file": "/a\n/b"}, {"type_order": " t4"}, {"min_mem_mib": 512}, {"min_shards": "101"},
])
def test_policy_with_overrides_refuses_what_the_hook_would_not_read(overrides):
    with pytest.raises(HorusError):
        policy_with_overrides(BASE, overrides)


def test_policy_with_overrides_stays_within_what_the_hook_reads():
    with pytest.raises(HorusError, match="1000 lines"):
        policy_with_overrides("# c\n" * 999, {"memory": "p95"})
    text = policy_with_overrides("# c\n" * 990, {"memory": "p95"})
    assert policy_values(text) == {"memory": "p95"}


HEAVY = {"comment": "horus:v1;t4=85/3000/3500;a100=85/3000/3500", "tres_per_node": "gres:gpu:1"}


def test_a_pressure_file_without_a_util_limit_packs_any_util(tmp_path):
    """A loop older than the slowdown bound writes no util_limit_milli: the hook packs as before."""
    path = _pressure(tmp_path, text=f"written {int(time.time())}\npressure t4\n")
    pol = _policy(tmp_path, f"pressure_file = {path}\n")
    d = decide(HEAVY, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert _outcome(d) == ("shared", "t4", 50, "pressure"), d.admin_comment


@pytest.mark.parametrize("pressure,job,want", [
    (dict(types=("t4",)), HEAVY, ("shared", "t4", 50, "pressure")),
    (dict(types=("t4",), age_s=600), HEAVY, ("exclusive", "t4", None, "util")),      # stale
    (dict(types=("a100",)), HEAVY, ("exclusive", "t4", None, "util")),  # t4 first, not pressed
    (dict(text="pressure t4\n"), HEAVY, ("exclusive", "t4", None, "util")),        # no time
    (dict(text="written 99999999999\npressure t4\n"), HEAVY, ("exclusive", "t4", None, "util")),
    (dict(text="\x00" * 5000), HEAVY, ("exclusive", "t4", None, "util")),           # garbage
    (dict(types=("t4",)), {"comment": "horus:v1;t4=85/9000/9000", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 66, "pressure")),      # 9,000 MiB needs 66 shards of a T4: its memory's share
    (dict(types=("t4",)), {"comment": "horus:v1;t4=85/13800/13800", "tres_per_node": "gres:gpu:1"},
     ("exclusive", "t4", None, "util")),     # all 100 shards: a whole GPU
    (dict(types=("t4",)), {"comment": "horus:v1;t4=20/3000/3500", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 26, None)),            # light: already within pressure_shards
    (dict(types=("t4",)), {"comment": "horus:v1;t4=60/3000/3500", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 50, "pressure")),      # 60 % asks 67 shards alone: 50 under pressure
    (dict(types=("t4",), age_s=600), {"comment": "horus:v1;t4=60/3000/3500", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 67, None)),
    (dict(types=("t4",)), {"comment": "horus:v1;t4=60/8000/9000", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 66, "pressure")),      # its 9,000 MiB keep 66 shards
    (dict(types=("t4",), util_limit=84.5), HEAVY, ("exclusive", "t4", None, "util")),  # over the
    (dict(types=("t4",), util_limit=85.0), HEAVY, ("shared", "t4", 50, "pressure")),   # bound's limit
    (dict(types=("t4",), util_limit=59.0), {"comment": "horus:v1;t4=60/3000/3500", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 67, None)),            # not capped beyond the bound's limit
], ids=["pressed", "stale", "other type", "no time", "future", "garbage", "big", "too big", "light",
        "mid pressed", "mid stale", "mid memory", "over limit", "at limit", "mid over limit"])
def test_queue_pressure_packs_at_submission_only_when_fresh_and_fitting(tmp_path, pressure, job, want):
    """horus-admin queue's pressure file turns a job kept whole for its utilization into
    pressure_shards on that type, as the loop's pack would, and caps a shared job's shards for
    its utilization at pressure_shards (any two jobs may pair), while the file is fresh and
    the job is within the slowdown bound's utilization limit."""
    path = _pressure(tmp_path, *pressure.pop("types", ()), **pressure)
    pol = _policy(tmp_path, f"pressure_file = {path}\npressure_max_age_s = 300\n")
    d = decide(job, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert _outcome(d) == want, d.admin_comment
    assert parse_decision(d.admin_comment) == _token(tmp_path, job, want)


@pytest.mark.parametrize("pressed,extra,want", [
    (("t4", "a100"), "", ("shared", "any", 50, "pressure")),
    (("t4",), "", ("exclusive", "any", None, "util")),      # an idle A100 may take it whole
    ((), "pack_heavy = always\n", ("shared", "any", 50, "pack_heavy")),
    (("t4", "a100"), "pressure_max_age_s = 1\n", ("exclusive", "any", None, "util")),
], ids=["every type pressed", "one type pressed", "pack_heavy", "stale"])
def test_a_job_of_no_type_packs_when_every_type_is_pressed(tmp_path, pressed, extra, want):
    """type_choice = any (the shipped policy) leaves a heavy job untyped: the pressure file never
    reached it, so on a site of one GPU type queue pressure packed nothing at submission."""
    path = _pressure(tmp_path, *pressed, age_s=5 if "max_age" in extra else 0)
    pol = _policy(tmp_path, f"type_choice = any\npressure_file = {path}\n{extra}")
    d = decide(HEAVY, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert _outcome(d) == want, d.admin_comment
    assert d.job_desc["tres_per_node"] == ("gres:shard:50" if want[0] == "shared" else "gres:gpu:1")
    assert not d.job_desc.get("features")
    if want[3] == "pressure":
        assert "queue pressure on every type" in d.admin_comment


MID = {"comment": "horus:v1;t4=60/3000/3500", "tres_per_node": "gres:gpu:1"}


@pytest.mark.parametrize("pressure,pack_heavy,job,want", [
    (dict(), "always", HEAVY, ("shared", "t4", 50, "pack_heavy")),     # no type under pressure
    (dict(), "pressure", HEAVY, ("exclusive", "t4", None, "util")),    # the default: whole
    (dict(types=("t4",)), "always", HEAVY, ("shared", "t4", 50, "pack_heavy")),
    (dict(age_s=600), "always", HEAVY, ("exclusive", "t4", None, "util")),          # loop gone
    (dict(util_limit=84.5), "always", HEAVY, ("exclusive", "t4", None, "util")),    # the bound
    (dict(), "always", MID, ("shared", "t4", 50, "pack_heavy")),       # 67 shards capped at 50
    (dict(), "always", {"comment": "horus:v1;t4=85/9000/9000", "tres_per_node": "gres:gpu:1"},
     ("shared", "t4", 66, "pack_heavy")),                               # its memory's 66 shards
    (dict(), "sometimes", HEAVY, ("exclusive", "t4", None, "util")),   # bad value: the default
], ids=["always", "pressure", "always pressed", "stale", "over limit", "mid", "big", "bad value"])
def test_pack_heavy_always_packs_on_every_type_while_the_loop_lives(tmp_path, pressure, pack_heavy, job, want):
    """pack_heavy = always: a job kept whole for its utilization takes pressure_shards on any
    type (Slurm's LL_SHARED_GRES spreads it onto an idle GPU while there is one), but only
    while the loop's pressure file is fresh and within its slowdown bound's limit."""
    path = _pressure(tmp_path, *pressure.pop("types", ()), **pressure)
    pol = _policy(tmp_path, f"pressure_file = {path}\npressure_max_age_s = 300\npack_heavy = {pack_heavy}\n")
    d = decide(job, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert _outcome(d) == want, d.admin_comment
    assert parse_decision(d.admin_comment) == _token(tmp_path, job, want)
    if want[3] == "pack_heavy":
        assert "pack_heavy = always" in d.admin_comment
    assert policy_values(pol.read_text()).get("pack_heavy") == (None if pack_heavy == "sometimes" else pack_heavy)


@pytest.mark.parametrize("mem", [3000, 6000, 9000, 12000, 13800])
def test_the_loops_memory_share_is_the_hooks(tmp_path, monkeypatch, mem):
    """horus-admin queue packs a waiting job into its memory's share as the hook counts it at
    submission (hint_mem_shards), so the two never size the same job differently."""
    from slurm_horus.ledger.requeue import _pack_size, hint_mem_shards

    path = _pressure(tmp_path, "t4")
    pol = _policy(tmp_path, f"pressure_file = {path}\n")
    monkeypatch.setenv("HORUS_POLICY", str(pol))
    job = {"comment": f"horus:v1;t4=85/{mem}/{mem}", "tres_per_node": "gres:gpu:1"}
    d = decide(job, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    loop = _pack_size(hint_mem_shards({"Comment": job["comment"]}, "t4"), 50, 100)
    assert (d.shards if d.action == "shared" else None) == loop, d.admin_comment


def test_a_comment_of_bytes_that_are_not_utf8_is_decided_not_an_error(tmp_path):
    """hsubmit --explain with such a comment (sbatch passes any bytes; Python holds them as
    surrogates) failed with an internal UnicodeEncodeError (a review).  The hook reads them as
    U+FFFD: no hint, the job unchanged, the caller's own value kept."""
    from slurm_horus.slurm.policy import decide

    pol = tmp_path / "p.conf"
    pol.write_text("gpu.a100.mem_mib = 40960\ntype_via = gres\n")
    odd = "note \udcff\ud800 horus:v1;a100=10/3000/3500"
    d = decide({"comment": odd, "tres_per_node": "gres:gpu:1"}, policy_path=pol)
    assert d.rc == 0 and d.job_desc["comment"] == odd
    plain = decide({"comment": "horus:v1;a100=10/3000/3500", "tres_per_node": "gres:gpu:1"}, policy_path=pol)
    assert plain.action == "shared" and d.action == plain.action  # the hint after the odd bytes still reads
    # each such byte counts one byte, as in slurmctld: a comment just under the hook's 64 KiB
    hint = "horus:v1;a100=10/3000/3500 "
    for pad in ("x", "\udcff"):
        d = decide({"comment": hint + pad * (65526 - len(hint)), "tres_per_node": "gres:gpu:1"}, policy_path=pol)
        assert d.action == "shared", (pad, d.admin_comment)


def test_the_note_is_the_hooks_own_entry_even_when_its_reason_says_horus(tmp_path):
    """Decision.note had been cut at the last "horus: ", inside the hook's reason "more than one
    horus: token" (a review)."""
    from slurm_horus.slurm.policy import decide

    pol = tmp_path / "p.conf"
    pol.write_text("gpu.a100.mem_mib = 40960\ntype_via = gres\n")
    two = "horus:v1;a100=10/3000/3500 horus:v1;a100=90/3000/3500"
    d = decide({"comment": two, "tres_per_node": "gres:gpu:1"}, policy_path=pol)
    assert d.note and d.note.startswith("horus: ") and "more than one horus: token" in d.note, d.admin_comment
    d = decide({"comment": two, "tres_per_node": "gres:gpu:1", "admin_comment": "moved by ops"}, policy_path=pol)
    assert d.admin_comment.startswith("moved by ops; horus: ") and d.note == d.admin_comment[len("moved by ops; "):]


@pytest.mark.parametrize("extra,want", [
    ("shards_per_gpu = 40\n", 40),                          # default 50 > 40: held to 40
    ("shards_per_gpu = 40\npressure_shards = 60\n", 40),
    ("shards_per_gpu = 40\npressure_shards = 30\n", 30),
    ("pressure_shards = 150\n", 50),                        # over 100: back to the default
    ("", 50),
])
def test_python_reads_the_pressure_shards_the_hook_packs_with(tmp_path, extra, want):
    """A review: with shards_per_gpu below 50 the hook holds pressure_shards to it, while
    policy_values reported nothing (callers took 50).  A heavy job under pressure on t4 (its
    memory's share below pressure_shards) gets exactly pressure_shards."""
    text = BASE + f"pressure_file = {_pressure(tmp_path, 't4')}\n" + extra
    pol = tmp_path / "p.conf"
    pol.write_text(text)
    d = decide(HEAVY, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert (d.action, d.reason, d.shards) == ("shared", "pressure", want), d.admin_comment
    assert int(policy_values(text).get("pressure_shards", "50")) == want


def test_python_declares_the_type_features_the_hook_declares(tmp_path):
    """A review: declared_type_features kept names the hook drops (bad names, types without
    gpu.<type>.mem_mib, anything past the 16th valid name).  The hook pins a job to a type of its
    own choosing only where the type's feature is declared: it tells, type by type."""
    from slurm_horus.slurm.policy import declared_type_features

    types = [f"t{i}" for i in range(20)]
    names = ["T4", "bad!", "x\u00a0t18", "nomem", *types, "t19"]  # 16 valid: nomem, t0 .. t14
    text = ("".join(f"gpu.{t}.mem_mib = 16000\n" for t in types) + "type_features = " + ", ".join(names)
            + "\ntype_order = " + ", ".join(types) + "\n")
    pol = tmp_path / "p.conf"
    pol.write_text(text)
    hook = {t for t in [*types, "nomem"]
            if decide({"comment": f"horus:v1;{t}=10/1000/1000", "tres_per_node": "gres:gpu:1"}, policy_path=pol,
                      hook_path=HOOK, submit_uid=UID).action == "shared"}
    assert hook == set(types[:15])
    assert declared_type_features(pol) == hook
