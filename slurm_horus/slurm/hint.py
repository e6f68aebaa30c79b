"""The horus hint: a job's predicted GPU use, carried in its Slurm ``--comment``.

Format (one whitespace-free token, after the user's own comment if any)::

    horus:v1;<gtype>=<util_pct>/<mem_mib>/<mem_p90_mib>[/<mem_p95_mib>[/<mem_p99_mib>]];...
    horus:v1;a100=45.2/5230/6010;t4=80.1/5100/5900
    horus:v1;a100=45.2/5230/6010/6400/7100

The p95 and p99 memory bounds are optional (older hints have only the p90); the policy's
``memory = p95 | p99`` falls back to the p90 where a hint lacks them.

The grammar is the one ``etc/job_submit.lua`` accepts (keep both in step):

* gtype: a Slurm gres type name, ``[a-z0-9_-]{1,32}``, each at most once, at most 16 types;
* numbers: plain non-negative decimals (``45``, ``45.25``): at most 9 digits before and
  9 after the point; no sign, exponent, ``nan`` or ``inf``;
* util in 0..100 (percent); memory values in MiB, at most 99,999,999;
* the token is at most 600 characters; the whole comment at most 65,536 bytes.

encode_hint() rounds UP (util to 0.1 %, memory to whole MiB), so a prediction is never
understated by the encoding.  The hook also rounds up what it reads.

After the hint, the workload token tells ``horus-admin sync`` what the job ran, so that it can
recompute the features itself (the hook never reads it; ``horus-job:`` is not ``horus:``)::

    horus-job:v1;sha=<64 hex>;bs=<int>;task=<train|infer>;opt=<name>;prec=<name>;dims=<n>:<int>,...;model=<path>

Every field but ``sha`` is optional; the order is fixed. The model's absolute path and the
dimension names are percent-encoded (``%``, ``;``, whitespace, non-ASCII; names also ``,:=``).
Slurm refuses a comment over 1,024 characters: attach_tokens() drops ``model=``, then ``dims=``,
then the workload token, then the hint, to stay within it.

The hook answers in the job's AdminComment: a human note, then the decision token that
parse_decision() reads (the note's wording may change, the token's grammar may not)::

    horus: shared t4 shards=26/100 (util 20%, mem 3500 MiB p90) horus-decision:v1;action=shared;type=t4;shards=26/100
    horus-decision:v1;action=<shared|exclusive|unchanged>[;type=<gtype|any>][;shards=<n>/<S>][;reason=<code>][;unpressed=<gpu|m>]
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal

from slurm_horus.errors import CONTROL_CHARS, HorusError
from slurm_horus.rounding import round_up

__all__ = [
    "HINT_PREFIX",
    "MAX_COMMENT_BYTES",
    "MAX_TOKEN_LEN",
    "MAX_TYPES",
    "MAX_MEM_MIB",
    "encode_hint",
    "attach_hint",
    "parse_hint",
    "find_hint_token",
    "JOB_PREFIX",
    "MAX_SLURM_COMMENT",
    "encode_workload",
    "parse_workload",
    "attach_tokens",
    "DECISION_PREFIX",
    "HookDecision",
    "parse_decision",
]

HINT_PREFIX = "horus:v1;"
MAX_TOKEN_LEN = 600
MAX_TYPES = 16
MAX_MEM_MIB = 99_999_999
MAX_COMMENT_BYTES = 65_536
JOB_PREFIX = "horus-job:v1;"
MAX_SLURM_COMMENT = 1024  # slurmctld: strlen(comment) > 1024 is refused
JOB_FIELDS = ("sha", "bs", "task", "opt", "prec", "dims", "model")
DECISION_PREFIX = "horus-decision:v1;"
# reason codes of job_submit.lua's decision_token(): why a job got a whole GPU or was left as is
DECISION_REASONS = {"exclusive": ("util", "pack_limit", "memory", "record", "raw_shards"),
                    "unchanged": ("not_handled", "bad_hint"), "shared": ("pressure", "pack_heavy")}

_GTYPE_RE = re.compile(r"[a-z0-9_-]{1,32}")
_NUMBER_RE = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
_ENTRY_RE = re.compile(r"([a-z0-9_-]+)=([^/]+)/([^/]+)/([^/]+)(?:/([^/]+))?(?:/([^/]+))?")
BOUND_NAMES = ("p90", "p95", "p99")
# Lua's %s in the C locale: ASCII whitespace only (not Python's Unicode \s).
_WS = " \t\n\r\v\f"
_TOKEN_START_RE = re.compile(r"(?:(?<=[ \t\n\r\v\f])|^)horus:")
_HORUS_TOKEN_RE = re.compile(r"(?:(?<=[ \t\n\r\v\f])|^)horus:[^ \t\n\r\v\f]*")
_JOB_TOKEN_RE = re.compile(r"(?:(?<=[ \t\n\r\v\f])|^)horus-job:[^ \t\n\r\v\f]*")
_DECISION_TOKEN_RE = re.compile(r"(?:(?<=[ \t\n\r\v\f])|^)horus-decision:[^ \t\n\r\v\f]*")
_DECISION_RE = re.compile(r"horus-decision:v1;action=(shared|exclusive|unchanged)(?:;type=([a-z0-9_-]{1,32}))?"
                          r"(?:;shards=([1-9][0-9]{0,8})/([1-9][0-9]{0,8}))?(?:;reason=([a-z_]{1,16}))?"
                          r"(?:;unpressed=(gpu|[1-9][0-9]{0,8}))?")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_INT_RE = re.compile(r"[1-9][0-9]{0,17}")

HintFields = tuple[float, ...]  # (util_pct, mem_mib, mem_p90_mib[, mem_p95_mib[, mem_p99_mib]])


def _number(value: object, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise HorusError(f"{what}: not a number: {value!r}")
    if isinstance(value, Decimal):
        d = value
    else:
        f = float(value)
        if not math.isfinite(f):
            raise HorusError(f"{what}: not a finite number: {value!r}")
        # an integer exactly; any other real (numpy's float32 too) by its float's shortest
        # form, as rounding.shown reads it (int() had rounded 69.94 down to 69)
        d = Decimal(int(value)) if isinstance(value, numbers.Integral) else Decimal(repr(f))
    if not d.is_finite():
        raise HorusError(f"{what}: not a finite number: {value!r}")
    if d < 0:
        raise HorusError(f"{what}: negative: {value!r}")
    return d if d else Decimal(0)  # -0.0 would be written '-0.0', which no reader takes


def _fmt(d: Decimal, places: int) -> str:
    return format(round_up(d, places), "f")


def encode_hint(predictions: dict[str, tuple]) -> str:
    """Encode {gtype: (util_pct, mem_mib, mem_p90_mib[, mem_p95_mib[, mem_p99_mib]])} as a hint
    token.

    Types are written in sorted order; util is rounded up to 0.1 %, memory up to whole MiB.
    Raises HorusError for a bad type name or value, or a token longer than 600 characters.
    """
    if not isinstance(predictions, dict) or not predictions:
        raise HorusError("hint: no GPU type predicted")
    if len(predictions) > MAX_TYPES:
        raise HorusError(f"hint: {len(predictions)} GPU types, at most {MAX_TYPES}")
    parts = []
    for gtype in sorted(predictions):
        if not isinstance(gtype, str) or not _GTYPE_RE.fullmatch(gtype):
            raise HorusError(f"hint: bad GPU type name {gtype!r} (need [a-z0-9_-]{{1,32}})")
        pred = predictions[gtype]
        if not isinstance(pred, (tuple, list)) or not 3 <= len(pred) <= 5:
            raise HorusError(f"hint: {gtype}: need (util_pct, mem_mib, mem_p90_mib"
                             "[, mem_p95_mib[, mem_p99_mib]])")
        util = _number(pred[0], f"hint: {gtype} utilization")
        if util > 100:
            raise HorusError(f"hint: {gtype} utilization {pred[0]!r} above 100 %")
        mems = []
        for name, raw in zip(("memory", *(f"{b} memory" for b in BOUND_NAMES)), pred[1:]):
            v = _number(raw, f"hint: {gtype} {name}")
            if v > MAX_MEM_MIB:
                raise HorusError(f"hint: {gtype} {name} {raw!r} MiB above {MAX_MEM_MIB}")
            mems.append(_fmt(v, 0))
        parts.append(f"{gtype}={_fmt(util, 1)}/" + "/".join(mems))
    token = HINT_PREFIX + ";".join(parts)
    if len(token) > MAX_TOKEN_LEN:
        raise HorusError(f"hint: {len(token)} characters, at most {MAX_TOKEN_LEN}")
    return token


def find_hint_token(comment: str | None) -> str | None:
    """The horus token in a comment (a whitespace-delimited word starting with "horus:"),
    or None if there is none.  Raises HorusError if there are several or the comment is
    too long, as the hook would ignore the hint then."""
    return _one_token(comment, "horus:", _HORUS_TOKEN_RE)


def _one_token(comment: str | None, kind: str, token_re: re.Pattern) -> str | None:
    """The one token of a kind ("horus:", "horus-job:") in a comment, as ``token_re`` finds it,
    or None if there is none.  Raises HorusError if there are several or the comment is too
    long."""
    if not comment or kind not in comment:
        return None
    if _nbytes(comment) > MAX_COMMENT_BYTES:
        raise HorusError(f"comment longer than {MAX_COMMENT_BYTES} bytes")
    tokens = token_re.findall(comment)
    if len(tokens) > 1:
        raise HorusError(f"more than one {kind} token in the comment")
    return tokens[0] if tokens else None


def _parse_token(token: str) -> dict[str, HintFields]:
    if len(token) > MAX_TOKEN_LEN:
        raise HorusError(f"hint longer than {MAX_TOKEN_LEN} characters")
    if not token.startswith(HINT_PREFIX):
        if re.match(r"horus:v[0-9]+;", token):
            raise HorusError("unsupported hint version")
        raise HorusError("malformed hint header")
    body = token[len(HINT_PREFIX):]
    if not body:
        raise HorusError("hint lists no GPU type")
    entries = body.split(";")
    if len(entries) > MAX_TYPES:
        raise HorusError(f"hint lists more than {MAX_TYPES} GPU types")
    out: dict[str, HintFields] = {}
    for n, entry in enumerate(entries, 1):
        m = _ENTRY_RE.fullmatch(entry)
        if not m:
            raise HorusError(f"malformed entry #{n}")
        gtype, *fields = m.groups()
        if len(gtype) > 32:
            raise HorusError(f"GPU type name too long in entry #{n}")
        if gtype in out:
            raise HorusError(f"GPU type repeated in entry #{n}")
        vals = []
        for what, s in zip(("utilization", "memory", *(f"{b} memory" for b in BOUND_NAMES)),
                           fields):
            if s is None:
                break
            if not _NUMBER_RE.fullmatch(s):
                raise HorusError(f"bad {what} in entry #{n}")
            vals.append(Decimal(s))
        if vals[0] > 100:
            raise HorusError(f"bad utilization in entry #{n}")
        if any(v > MAX_MEM_MIB for v in vals[1:]):
            raise HorusError(f"bad memory in entry #{n}")
        out[gtype] = tuple(float(v) for v in vals)
    return out


def _is_old_token(word: str) -> bool:
    """Is ``word`` a hint or workload token (an earlier submission's, to be replaced)?"""
    try:
        if word.startswith(HINT_PREFIX):
            _parse_token(word)
        elif word.startswith(JOB_PREFIX):
            _parse_job_token(word)
        else:
            return False
    except HorusError:
        return False
    return True


def attach_hint(comment: str | None, token: str) -> str:
    """The comment to submit: the user's comment as given, less the hint and workload tokens an
    earlier submission left (each with the whitespace before it, or after it where it starts the
    comment), then a space where it does not end in one, then ``token``.  Raises HorusError for
    a bad token, a too long result, or a word of the user's that the hook or sync would read as
    a second token (a word starting with ``horus:`` or ``horus-job:``): the hint would be lost."""
    _parse_token(token)  # validate what we attach
    if any(c in token for c in _WS):
        raise HorusError("hint token contains whitespace")
    parts = re.split(f"([{_WS}]+)", comment or "")  # words at even indexes, whitespace between
    keep = [True] * len(parts)
    for i in range(0, len(parts), 2):
        if _is_old_token(parts[i]):
            keep[i] = False
            sep = i - 1 if i > 0 and keep[i - 1] else i + 1
            if sep < len(parts):
                keep[sep] = False
    user = "".join(p for p, k in zip(parts, keep) if k)
    for word in (w for i, w in enumerate(parts) if keep[i] and i % 2 == 0):
        if word.startswith(("horus:", "horus-job:")):
            raise HorusError(f"the comment's word {word[:40]!r} would read as a second horus token "
                             "beside the hint (job_submit.lua reads one horus: word, sync one "
                             "horus-job: word)")
    result = user + (" " if user and user[-1] not in _WS else "") + token
    if _nbytes(result) > MAX_COMMENT_BYTES:
        raise HorusError(f"comment with hint longer than {MAX_COMMENT_BYTES} bytes")
    return result


def attach_tokens(comment: str | None, hint: str, job: dict | None = None, *,
                  limit: int = MAX_SLURM_COMMENT) -> str | None:
    """The user's comment, the hint and the workload token ``job`` (encode_workload's fields),
    within ``limit`` bytes: ``model``, then ``dims``, then the workload token are dropped to fit;
    None when even the hint does not fit (submit without it)."""
    base = attach_hint(comment, hint)
    if job:
        job = dict(job)
        for drop in (None, "model", "dims"):
            job.pop(drop, None)
            full = f"{base} {encode_workload(job)}"
            if _nbytes(full) <= limit:
                return full
    return base if _nbytes(base) <= limit else None


def _nbytes(s: str) -> int:
    """The bytes Slurm gets: an undecodable byte of argv or a script (surrogateescape) is one."""
    try:
        return len(s.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate no byte stands for
        return len(s.encode("utf-8", "surrogatepass"))


def _pct(s: str, extra: str = "") -> str:
    """Percent-encode %, ;, whitespace, control and non-ASCII characters (and ``extra``)."""
    return "".join("".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   if c in "%;" or c in extra or not 33 <= ord(c) < 127 else c for c in s)


def _unpct(s: str, what: str) -> str:
    from urllib.parse import unquote

    try:
        text = unquote(s, errors="strict")
    except UnicodeDecodeError:
        raise HorusError(f"workload token: {what} is not UTF-8") from None
    if CONTROL_CHARS.search(text):  # it ends up in admins' terminals (hacct)
        raise HorusError(f"workload token: {what} has control characters")
    return text


def encode_workload(job: dict) -> str:
    """The workload token for {sha, bs, task, opt, prec, dims: {name: int}, model}: sha
    required, other fields optional. Raises HorusError for a bad value."""
    parts = []
    for key in JOB_FIELDS:
        v = job.get(key)
        if v is None or v == {}:
            if key == "sha":
                raise HorusError("workload token: no model sha256")
            continue
        if key == "sha":
            if not isinstance(v, str) or not _SHA_RE.fullmatch(v):
                raise HorusError(f"workload token: bad sha256 {v!r}")
        elif key == "bs":
            if isinstance(v, bool) or not isinstance(v, int) or not _INT_RE.fullmatch(str(v)):
                raise HorusError(f"workload token: bad batch size {v!r}")
        elif key == "task":
            if v not in ("train", "infer"):
                raise HorusError(f"workload token: bad task {v!r}")
        elif key in ("opt", "prec"):
            if not isinstance(v, str) or not _GTYPE_RE.fullmatch(v):
                raise HorusError(f"workload token: bad {key} {v!r}")
        elif key == "dims":
            items = []
            for name, n in sorted(v.items()):
                if not name or isinstance(n, bool) or not isinstance(n, int) \
                        or not _INT_RE.fullmatch(str(n)):
                    raise HorusError(f"workload token: bad dimension {name!r}={n!r}")
                items.append(f"{_pct(name, ',:=')}:{n}")
            v = ",".join(items)
        elif key == "model":
            if not isinstance(v, str) or not v.startswith("/"):
                raise HorusError(f"workload token: model path {v!r} is not absolute")
            v = _pct(v)
        parts.append(f"{key}={v}")
    return JOB_PREFIX + ";".join(parts)


def _parse_job_token(token: str) -> dict:
    if not token.startswith(JOB_PREFIX):
        raise HorusError("unsupported workload token version" if re.match(r"horus-job:v[0-9]+;", token)
                         else "malformed workload token header")
    out: dict = {}
    pos = 0
    for part in token[len(JOB_PREFIX):].split(";"):
        key, sep, v = part.partition("=")
        if not sep or key not in JOB_FIELDS or JOB_FIELDS.index(key) < pos:
            raise HorusError(f"workload token: unexpected field {part[:40]!r}")
        pos = JOB_FIELDS.index(key) + 1
        ok = {"sha": lambda: _SHA_RE.fullmatch(v), "bs": lambda: _INT_RE.fullmatch(v),
              "task": lambda: v in ("train", "infer"), "opt": lambda: _GTYPE_RE.fullmatch(v),
              "prec": lambda: _GTYPE_RE.fullmatch(v), "dims": lambda: True,
              "model": lambda: v.startswith("/")}[key]()
        if not ok:
            raise HorusError(f"workload token: bad {key}")
        if key == "bs":
            out[key] = int(v)
        elif key == "dims":
            dims = {}
            for item in v.split(","):
                name, sep, n = item.rpartition(":")
                name = _unpct(name, "a dimension name")
                if not sep or not name or name in dims or not _INT_RE.fullmatch(n):
                    raise HorusError("workload token: bad dims")
                dims[name] = int(n)
            out[key] = dims
        elif key == "model":
            out[key] = _unpct(v, "the model path")
        else:
            out[key] = v
    if "sha" not in out:
        raise HorusError("workload token: no sha")
    return out


def parse_workload(comment: str | None, *, strict: bool = False) -> dict | None:
    """The workload token's fields from a job's comment ({sha, bs, task, opt, prec, dims,
    model}, those present), or None when there is none, several, or a malformed one
    (strict=True raises HorusError with the reason instead)."""
    try:
        token = _one_token(comment, "horus-job:", _JOB_TOKEN_RE)
        return None if token is None else _parse_job_token(token)
    except HorusError:
        if strict:
            raise
        return None


def parse_hint(comment: str | None, *, strict: bool = False) -> dict[str, HintFields] | None:
    """{gtype: (util_pct, mem_mib, mem_p90_mib[, p95[, p99]])} from a job's comment (the
    fields the hint has), or None when it has
    no hint.  A malformed hint also gives None (the hook ignores it), unless strict=True,
    which raises HorusError with the reason."""
    try:
        token = find_hint_token(comment)
        if token is None:
            return None
        return _parse_token(token)
    except HorusError:
        if strict:
            raise
        return None


@dataclass(frozen=True)
class HookDecision:
    """What job_submit.lua did to a job, from its decision token.

    action: "shared" (the GPU request became shards), "exclusive" (a whole GPU) or "unchanged";
    gpu_type: the type pinned, "any" when the job may run on any type, None when unchanged;
    shards/shards_per_gpu: the shard request and the policy's S (shared only);
    reason: a code for exclusive and unchanged (DECISION_REASONS); for shared None, or
    "pressure" when the job was packed at submission because horus-admin queue saw its GPU type
    under queue pressure, or "pack_heavy" when the policy packs such jobs on every type
    (``pack_heavy = always``: Slurm's least-loaded placement spreads them);
    unpressed_whole / unpressed_shards (pressure and pack_heavy only): what the job would have
    had without the pressure, a whole GPU (kept whole for its utilization) or more shards (its
    count for its utilization, capped at pressure_shards); an older hook's token has neither
    (it does not say which: horus-admin queue leaves that job as it is).
    """

    action: str
    gpu_type: str | None = None
    shards: int | None = None
    shards_per_gpu: int | None = None
    reason: str | None = None
    unpressed_whole: bool = False
    unpressed_shards: int | None = None


def parse_decision(admin_comment: str | None) -> HookDecision | None:
    """The hook's decision in a job's AdminComment (as slurmctld, sacct or scontrol show it), or
    None when there is none.  The hook appends its token after whatever AdminComment held, so
    only the LAST whitespace-delimited ``horus-decision:`` word counts; when that one is
    malformed the answer is None, never an earlier (possibly hand-written) token."""
    if not admin_comment or "horus-decision:" not in admin_comment:
        return None
    tokens = _DECISION_TOKEN_RE.findall(admin_comment)
    m = _DECISION_RE.fullmatch(tokens[-1]) if tokens else None
    if not m:
        return None
    action, gtype, shards, per_gpu, reason, unpressed = m.groups()
    if (action == "shared") != (shards is not None) or (action == "unchanged") != (gtype is None) \
            or (reason is None and action != "shared") \
            or (reason is not None and reason not in DECISION_REASONS[action]):
        return None
    more = int(unpressed) if unpressed and unpressed != "gpu" else None
    # only pressure lowers a count, and never past a whole GPU's shards
    if unpressed and (reason not in ("pressure", "pack_heavy")
                      or (more is not None and not int(shards) < more <= int(per_gpu))):
        return None
    return HookDecision(action, gtype, int(shards) if shards else None,
                        int(per_gpu) if per_gpu else None, reason, unpressed == "gpu", more)
