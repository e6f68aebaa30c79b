"""The packing policy: run it (decide) and read its file (policy_value, policy_with_overrides).

The policy itself, every packing decision, lives in ``etc/job_submit.lua`` only: decide() runs
that file in-process (hook_runtime.HookRuntime) and reads the answer from the decision token it
writes, so ``hsubmit --explain`` and the simulator report what slurmctld does::

    from slurm_horus.slurm.policy import decide
    d = decide({"comment": "horus:v1;t4=20/3000/3500", "tres_per_node": "gres:gpu:1"})
    d.action, d.gpu_type, d.shards     # ("shared", "t4", 26)
    d.job_desc["tres_per_node"]        # "gres:shard:26"

``job_desc`` keys are the Lua field names of Slurm's job_desc (``comment``, ``tres_per_node``,
``tres_per_job``, ``features``, ``admin_comment``, ...); a key that is absent or None is unset.

What Python does mirror is the policy FILE's grammar: the hook's line syntax and per-key value
checks (_policy_entries, the one reader here), for the values admin tools need (record_file,
underclaim_window_days) and for policy_with_overrides().  tests/test_hook_decision.py checks
that these checks accept exactly the values the hook accepts.
"""

from __future__ import annotations

import errno
import math
import os
import re
from pathlib import Path
from typing import Any

from slurm_horus.errors import HorusError
from slurm_horus.slurm.hook_runtime import Decision, HookCache
from slurm_horus.textfile import open_for_reading

__all__ = ["decide", "declared_type_features", "find_hook", "policy_file", "policy_value", "policy_values",
           "policy_with_overrides"]


def find_hook(hook_path: str | os.PathLike[str] | None = None) -> Path:
    """The hook file: explicit path, else $HORUS_HOOK, else the repository's etc/job_submit.lua,
    else the copy pip installed, share/slurm-horus/etc (shared_files)."""
    from slurm_horus.shared_files import shared_candidates

    if hook_path is not None:
        candidates = [Path(hook_path)]
    elif os.environ.get("HORUS_HOOK"):
        candidates = [Path(os.environ["HORUS_HOOK"])]
    else:
        candidates = shared_candidates("etc", "job_submit.lua")
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise HorusError(f"job_submit.lua not found (looked at {', '.join(str(c) for c in candidates)})")


_default_cache = HookCache(maxsize=4)


def decide(
    job_desc: dict[str, Any],
    policy_path: str | os.PathLike[str] | None = None,
    hook_path: str | os.PathLike[str] | None = None,
    *,
    submit_uid: int | None = None,
    cache: HookCache | None = None,
) -> Decision:
    """Run the real job_submit hook on ``job_desc`` (not modified) and report what it did.

    policy_path: the policy file to use (as if slurmctld had HORUS_POLICY set); default:
    $HORUS_POLICY, else horus_policy.conf next to the hook.  hook_path: see find_hook().
    submit_uid: the submitting user's uid (default: this process's), which the hook looks up in
    the claim record named by the policy's ``record_file``; put the job's ``account`` (-A) or, as
    slurmctld does for a job without one, the user's ``default_account`` in job_desc for the
    account's record to apply.  A job_desc with no ``script`` and no ``environment`` is taken for
    an sbatch job (slurmctld's always has an environment: with no script it is an srun or salloc
    allocation, which the hook leaves whole).
    """
    rt = (cache or _default_cache).get(find_hook(hook_path))
    return rt.submit(dict(job_desc), policy_path=policy_path, submit_uid=submit_uid)


# --------------------------------------------------------------------------- policy file
# The line grammar and value checks of parse_policy() in job_submit.lua (keep in step).

POLICY_MAX_BYTES = 65536
DEFAULT_RECORD = "/var/lib/slurm-horus/record"  # the hook's built-in record_file
_POLICY_MAX_LINES = 1000
_POLICY_MAX_LINE = 1024
_POLICY_LINE_RE = re.compile(r"^[ \t\r\n\v\f]*([A-Za-z0-9_.\-]+)[ \t\r\n\v\f]*=[ \t\r\n\v\f]*(.*?)[ \t\r\n\v\f]*$",
                             re.S)


def _int_in(lo: int, hi: int):
    def ok(v: str) -> bool:
        return bool(re.fullmatch(r"[0-9]{1,9}", v)) and lo <= int(v) <= hi
    return ok


def _decimal_in(lo: int, hi: int):
    """The hook's decimal_up(v, 3) (thousandths, rounded up) within lo..hi."""
    def ok(v: str) -> bool:
        m = re.fullmatch(r"([0-9]{1,9})(?:\.([0-9]{1,9}))?", v)
        if not m:
            return False
        frac = m.group(2) or ""
        milli = int(m.group(1)) * 1000 + int((frac + "000")[:3]) + bool(frac[3:].strip("0"))
        return lo * 1000 <= milli <= hi * 1000
    return ok


def _one_of(*names: str):
    return lambda v: v in names


def _absolute_path(v: str) -> bool:
    """The hook's absolute_path(): from "/", no control character, at most 1000 bytes (Lua's
    length: characters had let a longer path of accented names pass here)."""
    return (len(v.encode("utf-8", "surrogateescape")) <= 1000 and v.startswith("/")
            and not re.search(r"[\x00-\x1f\x7f]", v))


# policy slowdown_tail -> the job of horus-admin queue's worst group the slowdown bound is for:
# the curve's median pair loss (sensitivity 1), or this quantile of the measured spread
SLOWDOWN_TAILS = {"median": None, "p90": 0.90, "p95": 0.95, "p99": 0.99}
_MAX_MEM_MIB = 99999999
# key -> validator of the hook (an invalid value makes the hook keep the key's earlier value,
# else its built-in default; raw_shards: whole)
_POLICY_KEYS = {
    "shards_per_gpu": _int_in(1, 10000),
    "pack_limit_pct": _int_in(1, 100),
    "exclusive_util_pct": _decimal_in(0, 100),
    "memory": _one_of("expected", "p90", "p95", "p99"),
    "min_shards": _int_in(1, 999999999),
    "on_bad_hint": _one_of("ignore", "reject"),
    "type_via": _one_of("features", "gres"),
    "type_choice": _one_of("order", "any"),
    "type_order": lambda v: True,
    "type_features": lambda v: True,  # bad names are dropped one by one, like type_order's
    "raw_shards": _one_of("allow", "whole", "refuse"),
    "min_mem_mib": _int_in(0, _MAX_MEM_MIB),
    "record_file": _absolute_path,
    "pressure_file": lambda v: v == "" or _absolute_path(v),
    "pressure_shards": _int_in(1, 1000000),
    "pressure_max_age_s": _int_in(1, 86400),
    "pack_heavy": _one_of("pressure", "always"),
    "admin_uids": lambda v: bool(re.fullmatch(r"[0-9, \t\r\v\f]+", v))
    and all(len(i) <= 10 and int(i) <= 4294967294 for i in re.findall(r"[0-9]+", v)),
    "slowdown_bound": _decimal_in(1, 10),
    "slowdown_tail": _one_of(*SLOWDOWN_TAILS),
    "underclaim_limit": _int_in(0, 1000000),
    "underclaim_window_days": _int_in(1, 36500),
}
_PRESSURE_SHARDS = 50  # the hook's default pressure_shards
_TYPE_NAME = re.compile(r"[a-z0-9_\-]{1,32}")  # the hook's is_gtype
_GPU_MEM_KEY = re.compile(rf"gpu\.({_TYPE_NAME.pattern})\.mem_mib")
_GPU_KEY = re.compile(r"gpu\..+\.mem_mib", re.S)  # the hook's gpu.<type>.mem_mib: a known key even with a bad type


def _check(key: str):
    """The hook's check of a value for ``key``, or None for a key the hook does not know."""
    check = _POLICY_KEYS.get(key)
    if check is None and _GPU_MEM_KEY.fullmatch(key):
        check = _int_in(1, _MAX_MEM_MIB)
    return check


_LUA_SPACE = " \t\n\v\f\r"  # what Lua 5.1's %s matches (C isspace)


def _policy_lines(text: str) -> list[str]:
    """The policy's lines as the hook splits them: at LF, CRLF or a lone CR."""
    return re.split(r"\r\n|\r|\n", text)


def _policy_entries(text: str) -> list[tuple[int, str, str, bool]]:
    """(line index, key, value, accepted) of every ``key = value`` line the hook reads, in order:
    the first 1000 lines, ``#`` comments stripped.  accepted: the hook takes the value (an
    unknown key or a rejected value changes nothing).  A line it cannot read (key ""): one
    that is no ``key = value``, one over 1024 bytes that is not blank, and the lines past the
    1000th (one entry for them all), which the hook counts as mistakes of the file."""
    out = []
    text = text.removeprefix("\ufeff")  # the hook skips a UTF-8 BOM too
    lines = _policy_lines(text)
    for n, line in enumerate(lines[:_POLICY_MAX_LINES]):
        line = line.split("#", 1)[0]
        if len(line.encode("utf-8", "surrogateescape")) > _POLICY_MAX_LINE:
            if line.strip(_LUA_SPACE):
                out.append((n, "", f"(a line of over {_POLICY_MAX_LINE} bytes)", False))
            continue
        m = _POLICY_LINE_RE.match(line)
        if m:
            check = _check(m.group(1))
            out.append((n, m.group(1), m.group(2), check is not None and bool(check(m.group(2)))))
        elif line.strip(_LUA_SPACE):  # the hook logs it as an unreadable line and reads on
            # (Lua's %s is ASCII: a line of no-break spaces is unreadable to it, not empty)
            out.append((n, "", line.strip(), False))
    if len(lines) - (lines[-1] == "") > _POLICY_MAX_LINES:  # the hook's lines: none after a last line end
        out.append((_POLICY_MAX_LINES, "", f"(the lines after line {_POLICY_MAX_LINES}, not read)", False))
    return out


def ignored_policy_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number from 1, key, value) of each ``key = value`` line the hook ignores: an
    unknown key, or a value it rejects (it keeps the key's earlier value, else its default)."""
    return [(n + 1, key, value) for n, key, value, ok in _policy_entries(text) if not ok]


def ignored_policy_summary(path, text: str) -> str | None:
    """The lines of the policy file at ``path`` that the hook ignores, said in one line (the
    count and the first), or None: what simulate and sync warn of."""
    ignored = ignored_policy_lines(text)
    if not ignored:
        return None
    n, key, value = ignored[0]
    first = f"{key} = {value[:60]!r}" if key else repr(value[:60])
    return (f"the hook ignores {len(ignored):,} line{'s' * (len(ignored) > 1)} of policy file "
            f"{path} (line {n}: {first}; an unknown key, a value it does not take or no "
            "'key = value' line)")


def accepted_policy_keys(text: str) -> list[str]:
    """The keys of the ``key = value`` lines the hook takes, once each, in file order (the
    twin of ignored_policy_lines)."""
    return list(dict.fromkeys(key for _, key, _, ok in _policy_entries(text) if ok))


def _fails_closed(entries: list[tuple[int, str, str, bool]]) -> bool:
    """No raw_shards line, and a line the hook cannot read or a key it does not know (its
    gpu.<type>.mem_mib lines it knows whatever the type): the hook takes raw_shards = whole."""
    return (not any(key == "raw_shards" for _, key, _, _ in entries)
            and any(not key or (_check(key) is None and not _GPU_KEY.fullmatch(key)) for _, key, _, _ in entries))


def policy_fails_closed(text: str) -> bool:
    """Whether the hook turns raw shard requests into whole GPUs for the mistakes of a policy
    text that has no raw_shards line (_fails_closed)."""
    return _fails_closed(_policy_entries(text))


def policy_values(text: str) -> dict[str, str]:
    """Every key the policy text sets validly, with the value the hook uses (the last accepted
    line's; after a rejected raw_shards line, whole until a valid one; whole too when no line
    names raw_shards and one cannot be read or names an unknown key); keys it leaves at the
    hook's built-in default are absent (pressure_shards, whose default the hook holds to
    shards_per_gpu, is there when that is below 50)."""
    if len(text.encode("utf-8", "surrogateescape")) > POLICY_MAX_BYTES:
        return {"raw_shards": "whole"}  # the hook ignores the whole file, failing closed
    values = {}
    entries = _policy_entries(text)
    for _, key, value, ok in entries:
        if ok:
            values[key] = value
        elif key == "raw_shards":
            values[key] = "whole"  # the hook fails closed on a bad raw_shards line
    if _fails_closed(entries):
        values["raw_shards"] = "whole"
    per_gpu = int(values.get("shards_per_gpu", 100))
    if int(values.get("min_shards", 1)) > per_gpu:
        del values["min_shards"]  # the hook's cross-check: back to its default
    if int(values.get("pressure_shards", _PRESSURE_SHARDS)) > per_gpu:
        # back to its default, which the hook holds to shards_per_gpu too
        values.pop("pressure_shards", None)
        if per_gpu < _PRESSURE_SHARDS:
            values["pressure_shards"] = str(per_gpu)
    return values


def policy_file(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None,
                hook_path: str | os.PathLike[str] | None = None) -> Path:
    """The policy file the hook reads (its policy_path()): ``path`` if given, else $HORUS_POLICY,
    else horus_policy.conf next to the job_submit.lua that slurmctld loads (the directory of
    $SLURM_CONF, default /etc/slurm), else next to find_hook()'s hook.

    slurmctld's own environment is not visible from here: a site that sets HORUS_POLICY for
    slurmctld sets it for the admin tools too (or passes ``path``)."""
    if path is not None:
        return Path(path)
    env = os.environ if env is None else env
    if env.get("HORUS_POLICY"):
        return Path(env["HORUS_POLICY"])
    if hook_path is not None:
        return Path(hook_path).parent / "horus_policy.conf"
    conf_dir = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent
    if (conf_dir / "job_submit.lua").is_file():
        return conf_dir / "horus_policy.conf"
    try:
        return find_hook().parent / "horus_policy.conf"
    except HorusError:
        return conf_dir / "horus_policy.conf"


def policy_value(key: str, default: str | None = None,
                 path: str | os.PathLike[str] | None = None) -> str | None:
    """The value job_submit.lua reads for ``key`` from its policy file (see policy_file()), or
    ``default`` when the file is missing, unreadable, over 64 KiB, or sets no acceptable value
    for the key (the hook then uses its built-in default: pass that as ``default``)."""
    try:
        values = _file_values(path)
    except OSError as e:  # missing: the hook is off; there but unusable: it fails closed
        return "whole" if key == "raw_shards" and e.errno != errno.ENOENT else default
    return values.get(key, default)


def _file_values(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """policy_values() of the policy file (see policy_file()); OSError when it cannot be read."""
    with open_for_reading(policy_file(path)) as f:
        data = f.read(POLICY_MAX_BYTES + 1)
    return policy_values(data.decode("utf-8", "surrogateescape"))


def declared_type_features(path: str | os.PathLike[str] | None = None) -> set[str]:
    """The node features the policy's ``type_features`` declares for GPU types (the hook pins a
    shared job to its type with one), as the hook keeps them: of the names split at commas and
    Lua's blanks, the first 16 valid type names, less those without a gpu.<type>.mem_mib."""
    try:
        values = _file_values(path)
    except OSError:
        return set()
    names = [n for n in re.split(f"[,{_LUA_SPACE}]+", values.get("type_features", "")) if _TYPE_NAME.fullmatch(n)]
    return {n for n in names[:16] if f"gpu.{n}.mem_mib" in values}


def charged_mem_mib(expected: float, p90: float, p95: float | None = None,
                    p99: float | None = None,
                    path: str | os.PathLike[str] | None = None) -> tuple[str, int]:
    """(bound, MiB): the memory the hook charges a hinted job, as job_submit.lua's evaluate
    reads it: the policy's ``memory`` bound (p90 unless set); for p95 / p99 the largest bound
    the hint gives up to that quantile (a hint without the p99 is costed at its p95, one without
    either at its p90), named by the highest of those it has; rounded up to whole MiB, at least
    ``min_mem_mib``."""
    want = policy_value("memory", "p90", path=path)
    field, value = ("expected", expected) if want == "expected" else ("p90", p90)
    if want in ("p95", "p99") and p95 is not None:
        field, value = "p95", max(value, p95)
    if want == "p99" and p99 is not None:
        field, value = "p99", max(value, p99)
    return field, max(math.ceil(value), int(policy_value("min_mem_mib", "512", path=path)))


def policy_with_overrides(base_text: str, overrides: dict[str, str]) -> str:
    """``base_text`` with each key of ``overrides`` set to its value, as the hook will read it:
    the base's lines for those keys are commented out (so an override never falls back to a base
    value) and ``key = value`` lines are appended.  Raises HorusError when the hook would not use
    an override as given (unknown key, rejected value, ``#``/newline/edge spaces, min_shards above
    shards_per_gpu) or would not read the result whole (over 64 KiB or 1000 lines)."""
    lines = _policy_lines(base_text)  # numbered as _policy_entries numbers them
    if lines and lines[-1] == "":
        lines.pop()
    for n, key, _, _ in _policy_entries(base_text):
        if key in overrides:
            lines[n] = "# (overridden below) " + lines[n]
    if overrides:
        lines += ["# overrides", *(f"{k} = {v}" for k, v in overrides.items())]
    text = "\n".join(lines) + "\n"
    if len(lines) > _POLICY_MAX_LINES or len(text.encode("utf-8", "surrogateescape")) > POLICY_MAX_BYTES:
        raise HorusError("policy with overrides exceeds the hook's 1000 lines / 64 KiB")
    got = policy_values(text)
    for key, value in overrides.items():
        if got.get(key) != value:
            raise HorusError(f"policy override: the hook would not use {key} = {value!r}")
    return text
