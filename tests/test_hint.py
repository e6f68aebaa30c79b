"""slurm_horus.slurm.hint: encoding, attaching and parsing the horus hint."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from pathlib import Path

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.slurm.hint import (
    MAX_TOKEN_LEN,
    attach_hint,
    encode_hint,
    find_hint_token,
    parse_hint,
)

HOOK = Path(__file__).resolve().parent.parent / "etc" / "job_submit.lua"
POLICY = Path(__file__).resolve().parent.parent / "etc" / "horus_policy.conf"


def test_encode_example():
    tok = encode_hint({"t4": (80.1, 5100, 5900), "a100": (45.2, 5230, 6010)})
    assert tok == "horus:v1;a100=45.2/5230/6010;t4=80.1/5100/5900"


def test_encode_rounds_up_never_down():
    tok = encode_hint({"t4": (45.21, 5100.01, 5900.5)})
    assert tok == "horus:v1;t4=45.3/5101/5901"
    assert encode_hint({"t4": (0, 0, 0)}) == "horus:v1;t4=0.0/0/0"
    assert encode_hint({"t4": (99.99, 1e-9, 1)}) == "horus:v1;t4=100.0/1/1"
    assert encode_hint({"t4": (Decimal("12.34"), 7, 8)}) == "horus:v1;t4=12.4/7/8"


@pytest.mark.parametrize(
    "preds",
    [
        {},
        {"T4": (1, 1, 1)},
        {"t 4": (1, 1, 1)},
        {"a" * 33: (1, 1, 1)},
        {"t4;x": (1, 1, 1)},
        {"t4": (1, 1)},
        {"t4": (-1, 1, 1)},
        {"t4": (1, -1, 1)},
        {"t4": (100.01, 1, 1)},
        {"t4": (math.nan, 1, 1)},
        {"t4": (1, math.inf, 1)},
        {"t4": (1, 1, -math.inf)},
        {"t4": (1, 100_000_000, 1)},
        {"t4": ("5", 1, 1)},
        {"t4": (True, 1, 1)},
        {"t4": (None, 1, 1)},
        {"t4": (Decimal("NaN"), 1, 1)},
        {f"g{i}": (1, 1, 1) for i in range(17)},
        {("x" * 30 + f"{i:02d}"): (100, 99_999_999, 99_999_999) for i in range(16)},  # > 600
    ],
)
def test_encode_rejects_bad_values(preds):
    with pytest.raises(HorusError):
        encode_hint(preds)


def test_encode_limits_are_inclusive():
    tok = encode_hint({f"g{i}": (100, 99_999_999, 99_999_999) for i in range(16)})
    assert len(tok) <= MAX_TOKEN_LEN
    assert len(parse_hint(tok)) == 16


def test_round_trip_random():
    rng = random.Random(7)
    for _ in range(300):
        preds = {
            f"{rng.choice(['t4', 'a100', 'h100', 'l4', 'rtx_6000', 'mi-250'])}": (
                rng.uniform(0, 100), rng.uniform(0, 90_000), rng.uniform(0, 90_000))
            for _ in range(rng.randint(1, 4))
        }
        comment = attach_hint(rng.choice([None, "", "my run", "a\tb  c"]), encode_hint(preds))
        back = parse_hint(comment)
        assert set(back) == set(preds)
        for t, (u, m, p) in preds.items():
            bu, bm, bp = back[t]
            assert u <= bu <= u + 0.1 + 1e-9
            assert m <= bm < m + 1 and p <= bp < p + 1


def test_attach_keeps_user_comment_and_replaces_old_hint():
    tok = encode_hint({"t4": (10, 100, 200)})
    assert attach_hint(None, tok) == tok
    assert attach_hint("", tok) == tok
    assert attach_hint("my run 3", tok) == "my run 3 " + tok
    old = encode_hint({"a100": (50, 100, 200)})
    assert attach_hint(f"my run {old}", tok) == "my run " + tok
    assert attach_hint(f"{old} my run", tok) == "my run " + tok
    assert attach_hint("see xhorus:abc", tok) == "see xhorus:abc " + tok  # not a token
    assert parse_hint(attach_hint(f"a {old}\nb {old}", tok)) == {"t4": (10.0, 100.0, 200.0)}


def test_attach_keeps_the_users_words_and_replaces_only_earlier_tokens():
    """Every word starting with horus: or horus-job: had been cut, and the comment trimmed."""
    from slurm_horus.slurm.hint import encode_workload

    tok = encode_hint({"t4": (10, 100, 200)})
    old, job = encode_hint({"a100": (50, 100, 200)}), encode_workload({"sha": "0" * 64, "bs": 2})
    assert attach_hint("  see horus-faq  and xhorus:x ", tok) == "  see horus-faq  and xhorus:x " + tok
    assert attach_hint(f"run {old}  3\t{job}", tok) == f"run  3 {tok}"
    assert attach_hint(f"{job} {old} run", tok) == f"run {tok}"
    for mine in ("  see horus:faq  and x ", "and horus-job:x", f"{old[:-1]}x/1"):  # the hook, sync: two
        with pytest.raises(HorusError, match="second horus token"):
            attach_hint(mine, tok)


def test_attach_rejects_bad_token_and_huge_comment():
    with pytest.raises(HorusError):
        attach_hint("x", "horus:v1;t4=nan/1/1")
    with pytest.raises(HorusError):
        attach_hint("x", "not a hint")
    with pytest.raises(HorusError):
        attach_hint("x" * 70_000, encode_hint({"t4": (1, 1, 1)}))


@pytest.mark.parametrize(
    "comment",
    [
        None,
        "",
        "just text",
        "xhorus:v1;t4=1/1/1",
    ],
)
def test_parse_no_hint(comment):
    assert parse_hint(comment) is None
    assert find_hint_token(comment) is None


@pytest.mark.parametrize(
    "comment",
    [
        "horus:garbage",
        "horus:v2;t4=1/1/1",
        "horus:v1;",
        "horus:v1;t4=nan/1/1",
        "horus:v1;t4=1e2/1/1",
        "horus:v1;t4=-1/1/1",
        "horus:v1;t4=101/1/1",
        "horus:v1;t4=1/1/1;t4=1/1/1",
        "horus:v1;t4=1/1/1;",
        "horus:v1;t4=1/1/1 horus:v1;a100=1/1/1",
        "horus:v1;T4=1/1/1",
        "horus:v1;t4=\u0665/1/1",
        "horus:v1;" + ";".join(f"g{i}=1/1/1" for i in range(17)),
        "horus:v1;t4=1/1/" + "1" * 700,
        "x" * 70_000 + " horus:v1;t4=1/1/1",
    ],
)
def test_parse_malformed(comment):
    assert parse_hint(comment) is None
    with pytest.raises(HorusError):
        parse_hint(comment, strict=True)


def test_parse_whitespace_is_ascii_only_like_lua():
    # U+00A0 is not whitespace for Lua's %s, so "horus:" after it is not a token start.
    assert parse_hint("note\u00a0horus:v1;t4=1/1/1") is None
    assert parse_hint("note\vhorus:v1;t4=1/1/1") == {"t4": (1.0, 1.0, 1.0)}


def test_python_and_lua_agree_on_validity():
    """parse_hint() and the hook accept exactly the same hints."""
    pytest.importorskip("lupa")
    from slurm_horus.slurm.policy import decide

    samples = [
        "horus:v1;t4=1/1/1", "horus:v1;t4=100/99999999/99999999", "horus:v1;t4=0.000000001/0/0",
        "horus:v1;t4=100.0000000001/1/1", "horus:v1;t4=5/100000000/1", "horus:v1;t4=1.5.5/1/1",
        "horus:v1;t4=1//1", "horus:v1;" + "a" * 32 + "=1/1/1", "horus:v1;" + "a" * 33 + "=1/1/1",
        "horus:v1;t4=1/1/1;a100=2/2/2", "horus:v1;t4=0000000001/1/1", "horus:v1;t4=01/1/1",
        "horus:v1;t4=1/1/1\thorus:v1;t4=1/1/1", "pre\nhorus:v1;t4=1/1/1 post",
        "horus:v1;t_4-x=1/1/1", "horus:V1;t4=1/1/1", "horus:v1;t4=1/1/1/",
    ]
    for c in samples:
        py_ok = parse_hint(c) is not None
        d = decide({"comment": c, "tres_per_node": "gres:gpu:h100:1"}, policy_path=POLICY,
                   hook_path=HOOK)
        lua_ok = "ignored hint" not in (d.admin_comment or "")
        assert py_ok == lua_ok, c


# --- the workload token --------------------------------------------------------------------

SHA = "0123456789abcdef" * 4
JOB = {"sha": SHA, "bs": 32, "task": "train", "opt": "adamw", "prec": "amp",
       "dims": {"seq": 512, "odd, name:=x": 3}, "model": "/home/ann/my models/ré;s%.onnx"}


def test_workload_token_round_trip_and_encoding():
    from slurm_horus.slurm.hint import encode_workload, parse_workload

    tok = encode_workload(JOB)
    assert tok == ("horus-job:v1;sha=" + SHA + ";bs=32;task=train;opt=adamw;prec=amp;"
                   "dims=odd%2C%20name%3A%3Dx:3,seq:512;model=/home/ann/my%20models/r%C3%A9%3Bs%25.onnx")
    assert parse_workload(f"mine {HINT_T4} {tok}", strict=True) == JOB
    assert parse_workload(encode_workload({"sha": SHA})) == {"sha": SHA}
    # the hook's token is "horus:": the workload token is never taken for a hint
    assert parse_hint(tok) is None and parse_hint(f"{HINT_T4} {tok}") == {"t4": (1.0, 2.0, 3.0)}


HINT_T4 = "horus:v1;t4=1/2/3"


@pytest.mark.parametrize("comment", [
    "horus-job:v1;bs=3",                                   # sha is required
    f"horus-job:v1;bs=3;sha={SHA}",                        # fixed order
    f"horus-job:v1;sha={SHA};bs=3;bs=4",                   # each field once
    f"horus-job:v1;sha={SHA};bs=0",
    f"horus-job:v1;sha={SHA};bs=-1",
    f"horus-job:v1;sha={SHA};task=eval",
    f"horus-job:v1;sha={SHA};model=relative/m.onnx",
    f"horus-job:v1;sha={SHA};dims=seq",
    f"horus-job:v1;sha={SHA};color=red",
    f"horus-job:v1;sha={SHA.upper()}",
    f"horus-job:v2;sha={SHA}",
    f"horus-job:v1;sha={SHA} horus-job:v1;sha={SHA}",      # several: none is believed
    f"horus-job:v1;sha={SHA};model=/a%FF.onnx",            # not UTF-8
    f"horus-job:v1;sha={SHA};model=/a%1B%5D0%3Bx%07.onnx",  # terminal escapes for hacct's reader
    f"horus-job:v1;sha={SHA};dims=s%0Aq:8",                # a newline in a dimension name
])
def test_workload_token_malformed(comment):
    from slurm_horus.slurm.hint import parse_workload

    assert parse_workload(comment) is None
    with pytest.raises(HorusError):
        parse_workload(comment, strict=True)


@pytest.mark.parametrize("comment, reason", [
    (f"{HINT_T4} x {HINT_T4}", "more than one horus: token in the comment"),
    (f"horus-job:v1;sha={SHA} horus-job:v1;sha={SHA}", "more than one horus-job: token in the comment"),
    ("x" * 65_537 + f" {HINT_T4}", "comment longer than 65536 bytes"),
    ("é" * 32_768 + f" horus-job:v1;sha={SHA}", "comment longer than 65536 bytes"),  # bytes, not characters
])
def test_hint_and_workload_token_finders_say_why(comment, reason):
    """find_hint_token and parse_workload share the finding of their one token: same reasons."""
    from slurm_horus.slurm.hint import parse_workload

    parse = parse_workload if "horus-job:" in comment else find_hint_token
    with pytest.raises(HorusError) as e:
        parse(comment) if parse is find_hint_token else parse(comment, strict=True)
    assert str(e.value) == reason
    # each looks for its own kind only: the other's token is not a second one, nor a hint
    assert find_hint_token(f"horus-job:v1;sha={SHA} {HINT_T4}") == HINT_T4
    assert parse_workload(f"{HINT_T4} x {HINT_T4}", strict=True) is None


def test_workload_encoder_refuses_what_it_cannot_write():
    from slurm_horus.slurm.hint import encode_workload

    for bad in ({}, {"sha": "x"}, {"sha": SHA, "bs": 0}, {"sha": SHA, "task": "eval"},
                {"sha": SHA, "model": "rel.onnx"}, {"sha": SHA, "dims": {"s": -1}},
                {"sha": SHA, "opt": "Adam"}):
        with pytest.raises(HorusError):
            encode_workload(bad)


def test_attach_tokens_drop_order_and_limit():
    from slurm_horus.slurm.hint import attach_tokens, encode_workload, parse_workload

    full = attach_tokens("old horus:v1;t4=9/9/9 horus-job:v1;sha=" + SHA, HINT_T4, JOB)
    assert full == f"old {HINT_T4} {encode_workload(JOB)}"  # earlier tokens replaced
    n = len(full.encode())
    no_model = {k: v for k, v in JOB.items() if k != "model"}
    no_dims = {k: v for k, v in no_model.items() if k != "dims"}
    assert parse_workload(attach_tokens(None, HINT_T4, JOB, limit=n)) == JOB
    assert parse_workload(attach_tokens(None, HINT_T4, JOB, limit=n - 5)) == no_model
    short = len(f"{HINT_T4} {encode_workload(no_model)}")
    assert parse_workload(attach_tokens(None, HINT_T4, JOB, limit=short - 1)) == no_dims
    assert attach_tokens(None, HINT_T4, JOB, limit=len(HINT_T4) + 5) == HINT_T4
    assert attach_tokens("é" * 10, HINT_T4, JOB, limit=len(HINT_T4) + 15) is None  # bytes count
    assert attach_tokens(None, HINT_T4, None) == HINT_T4


def test_hook_ignores_the_workload_token():
    pytest.importorskip("lupa")
    from slurm_horus.slurm.hint import encode_workload
    from slurm_horus.slurm.policy import decide

    hint = "horus:v1;t4=20/3000/3500"
    alone = decide({"comment": hint, "tres_per_node": "gres:gpu:1"}, policy_path=POLICY,
                   hook_path=HOOK)
    both = decide({"comment": f"{hint} {encode_workload(JOB)}", "tres_per_node": "gres:gpu:1"},
                  policy_path=POLICY, hook_path=HOOK)
    assert alone.action == both.action == "shared" and alone.shards == both.shards


def test_optional_p95_p99_round_trip():
    """Hints may carry p95 and p99 memory bounds after the p90; three-field hints still parse
    as before, and encoding rounds every bound up."""
    tok = encode_hint({"t4": (10, 100, 200, 250.2, 300), "a100": (5, 50, 60)})
    assert tok == "horus:v1;a100=5.0/50/60;t4=10.0/100/200/251/300"
    assert parse_hint(tok) == {"a100": (5.0, 50.0, 60.0), "t4": (10.0, 100.0, 200.0, 251.0, 300.0)}
    assert parse_hint("horus:v1;t4=1/2/3/4") == {"t4": (1.0, 2.0, 3.0, 4.0)}
    for bad in ({"t4": (1, 2)}, {"t4": (1, 2, 3, 4, 5, 6)}, {"t4": (1, 2, 3, -4)},
                {"t4": (1, 2, 3, 4, 100_000_000)}):
        with pytest.raises(HorusError):
            encode_hint(bad)
    for bad in ("horus:v1;t4=1/2/3/4/5/6", "horus:v1;t4=1/2/3//5", "horus:v1;t4=1/2/3/4/x"):
        assert parse_hint(bad) is None


def test_every_display_shows_the_figures_the_hint_carries():
    # the hook judges the hint's figures, rounded up: a utilization shown as 69.9 % went in as
    # 70.0 (kept exclusive at util_threshold 70), a p90 shown as 5830 MiB as 5831
    import random

    from slurm_horus.predict.coldstart import Prediction
    from slurm_horus.slurm.hint import encode_hint, parse_hint

    rng = random.Random(7)
    for _ in range(2000):
        u, m = rng.uniform(0, 100), rng.uniform(0, 80000)
        p90 = m * rng.uniform(1, 1.5)
        shown = Prediction(gpu="a100", util_pct=u, mem_mib=m, mem_mib_p90=p90, predictor="x",
                           confidence="", breakdown={}).to_dict()
        hinted = parse_hint(encode_hint({"a100": (u, m, p90)}))["a100"]
        assert (shown["util_pct"], shown["mem_mib"], shown["mem_mib_p90"]) == tuple(hinted[:3])
    assert Prediction(gpu="a100", util_pct=69.94, mem_mib=1.0, mem_mib_p90=1.0, predictor="x",
                      confidence="", breakdown={}).to_dict()["util_pct"] == 70.0


def test_any_real_number_is_written_rounded_up_and_negative_zero_as_zero():
    # numpy's float32 and other non-float reals had gone through int(): 69.94 written as 69.0;
    # -0.0 had been written '-0.0', which parse_hint (and the hook) refuse
    from fractions import Fraction

    import numpy as np

    from slurm_horus.rounding import shown
    from slurm_horus.slurm.hint import encode_hint, parse_hint

    assert encode_hint({"a100": (np.float32(69.94), np.int64(100), 100.2)}) == "horus:v1;a100=70.0/100/101"
    assert encode_hint({"a100": (Fraction(1, 3), 1, 1)}) == "horus:v1;a100=0.4/1/1"
    assert parse_hint(encode_hint({"a100": (-0.0, -0.0, -0.0)})) == {"a100": (0.0, 0.0, 0.0)}
    assert shown(float("inf"), 0) == float("inf") and shown(1e300, 0) == 1e300  # never an error
    assert shown(np.float32(69.94), 1) == 70.0
