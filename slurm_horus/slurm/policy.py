"""Run the real ``etc/job_submit.lua`` in-process, so Python never re-implements the policy.

``decide(job_desc)`` loads the hook into a Lua 5.1 runtime (``lupa.lua51``, the Lua version
Debian's slurmctld links) with a fake ``slurm`` table that behaves like slurmctld's:
the same constants, ``log_*`` functions that run ``string.format`` as Slurm does, and a
``job_desc`` proxy whose string setters reject ``nil`` and turn ``""`` into an unset field.

Used by ``hsubmit --explain`` and by the cluster simulator::

    from slurm_horus.slurm.policy import decide
    d = decide({"comment": "horus:v1;t4=20/3000/3500", "tres_per_node": "gres:gpu:1"})
    d.action, d.gpu_type, d.shards     # ("shared", "t4", 26)
    d.job_desc["tres_per_node"]        # "gres:shard:26"

``job_desc`` keys are the Lua field names of Slurm's job_desc (``comment``,
``tres_per_node``, ``tres_per_job``, ``tres_per_task``, ``tres_per_socket``, ``features``,
``min_nodes``, ``max_nodes``, ``cpus_per_tres``, ``mem_per_tres``, ``ntasks_per_tres``,
``admin_comment``, ...); a key that is absent or None is unset (nil in Lua).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_horus.errors import HorusError

__all__ = ["Decision", "HookRuntime", "HookCache", "decide", "find_hook", "policy_file", "policy_value"]

SLURM_SUCCESS = 0
SLURM_ERROR = -1

# What slurmctld 22.05 puts in the `slurm` table that a job_submit script may use.
_FAKE_SLURM = r"""
local msgs, user_msgs = {}, {}
_horus_unpack = unpack or table.unpack  -- unpack is table.unpack from Lua 5.2
_horus_msgs, _horus_user_msgs = msgs, user_msgs
slurm = {
  SUCCESS = 0, ERROR = -1, FAILURE = -1,
  -- the 8 ESLURM codes 22.05 exports (23.02+ exports all of them)
  ESLURM_ACCESS_DENIED = 2002, ESLURM_ACCOUNTING_POLICY = 2050,
  ESLURM_INVALID_ACCOUNT = 2045, ESLURM_INVALID_LICENSES = 2048,
  ESLURM_INVALID_NODE_COUNT = 2006, ESLURM_INVALID_TIME_LIMIT = 2051,
  ESLURM_JOB_MISSING_SIZE_SPECIFICATION = 2008, ESLURM_MISSING_TIME_LIMIT = 8000,
  NO_VAL = 4294967294, NO_VAL16 = 65534, NO_VAL8 = 254, NO_VAL64 = 18446744073709551614,
  INFINITE = 4294967295, INFINITE16 = 65535, MEM_PER_CPU = 9223372036854775808,
  NICE_OFFSET = 2147483648, CLUSTER_NAME = "horus-test",
}
function slurm.log(level, msg) msgs[#msgs + 1] = { level, msg } end
function slurm.error(msg) msgs[#msgs + 1] = { "error", msg } end
function slurm.user_msg(msg) user_msgs[#user_msgs + 1] = msg end
-- Like slurmctld: the log functions run string.format on their arguments.
slurm.log_error = function(...) slurm.error(string.format(_horus_unpack({...}))) end
slurm.log_info = function(...) slurm.log("info", string.format(_horus_unpack({...}))) end
slurm.log_verbose = function(...) slurm.log("verbose", string.format(_horus_unpack({...}))) end
slurm.log_debug = function(...) slurm.log("debug", string.format(_horus_unpack({...}))) end
slurm.log_debug2 = function(...) slurm.log("debug2", string.format(_horus_unpack({...}))) end
slurm.log_user = function(...) slurm.user_msg(string.format(_horus_unpack({...}))) end

-- Reset the collected messages before a call.
function _horus_reset()
  for i = #msgs, 1, -1 do msgs[i] = nil end
  for i = #user_msgs, 1, -1 do user_msgs[i] = nil end
end

-- A job_desc like slurmctld's: reads give the field or nil; writes of nil fail
-- (luaL_checkstring), "" unsets a string field; every write is recorded.
function _horus_make_job(fields)
  local backing, writes = {}, {}
  for k, v in pairs(fields) do backing[k] = v end
  local job = setmetatable({}, {
    __index = function(_, k) return backing[k] end,
    __newindex = function(_, k, v)
      if type(v) ~= "string" and type(v) ~= "number" then
        error("bad argument #3 to '__newindex' (string expected, got " .. type(v) .. ")", 2)
      end
      if k == _horus_fail_field then error("injected failure writing " .. k, 2) end  -- tests
      writes[#writes + 1] = k
      if v == "" then backing[k] = nil else backing[k] = v end
    end,
  })
  return job, backing, writes
end

-- Override HORUS_POLICY for one call (the hook reads it with os.getenv).
local real_getenv = os.getenv
_horus_policy_override = nil
os.getenv = function(name)
  if name == "HORUS_POLICY" and _horus_policy_override then return _horus_policy_override end
  return real_getenv(name)
end
"""

_NOTE_RE = re.compile(
    r"horus: (shared|exclusive|unchanged|ignored hint)"
    r"(?: ([a-z0-9_-]{1,32}))?(?: shards=(\d+)/(\d+))?"
)


@dataclass(frozen=True)
class Decision:
    """What the hook did to one job.

    action: "shared" (GPU request turned into shards), "exclusive" (keeps a whole GPU),
    "unchanged" (no hint, hint ignored, or request not handled) or "rejected".
    """

    rc: int
    job_desc: dict[str, Any]
    user_messages: list[str]
    admin_comment: str | None
    action: str
    gpu_type: str | None = None
    shards: int | None = None
    shards_per_gpu: int | None = None
    log: list[tuple[str, str]] = field(default_factory=list)
    written: tuple[str, ...] = ()

    @property
    def note(self) -> str | None:
        """The hook's one-line decision ("horus: ..."), if it wrote one."""
        if not self.admin_comment:
            return None
        i = self.admin_comment.rfind("horus: ")
        return self.admin_comment[i:] if i >= 0 else None


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def find_hook(hook_path: str | os.PathLike[str] | None = None) -> Path:
    """The hook file: explicit path, else $HORUS_HOOK, else the repository's etc/job_submit.lua,
    else the installed copy in <prefix>/share/slurm-horus/etc (pyproject's data-files)."""
    if hook_path is not None:
        candidates = [Path(hook_path)]
    elif os.environ.get("HORUS_HOOK"):
        candidates = [Path(os.environ["HORUS_HOOK"])]
    else:
        candidates = [
            _repo_root() / "etc" / "job_submit.lua",
            Path(sys.prefix) / "share" / "slurm-horus" / "etc" / "job_submit.lua",
        ]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise HorusError(f"job_submit.lua not found (looked at {', '.join(str(c) for c in candidates)})")


class HookRuntime:
    """One Lua 5.1 runtime with the hook loaded, as slurmctld would load it.

    Module-level state of the script (its "log once" memory, its parsed-policy cache)
    persists across calls, exactly as in slurmctld, which keeps the script loaded until
    the file's mtime changes.  Calls are serialized with a lock.
    """

    def __init__(self, hook_path: str | os.PathLike[str], lua: str = "lua51"):
        import importlib

        # lazy: only the callers of decide() need lupa; lua51 is what slurmctld links on
        # Debian/Ubuntu, other lupa modules (lua54, ...) let tests check newer Lua too.
        lua_mod = importlib.import_module(f"lupa.{lua}")

        self.path = Path(hook_path).resolve()
        self.lua_version = lua
        self._lock = threading.Lock()
        self._lua = lua_mod.LuaRuntime(unpack_returned_tuples=True, register_eval=False)
        self._lua.execute(_FAKE_SLURM)
        g = self._lua.globals()
        chunk, err = self._lua.eval("loadfile")(str(self.path)), None
        if isinstance(chunk, tuple):
            chunk, err = chunk
        if chunk is None:
            raise HorusError(f"cannot load {self.path}: {err}")
        rc = chunk()
        if rc not in (None, 0):
            raise HorusError(f"{self.path} returned {rc} on load")
        for fn in ("slurm_job_submit", "slurm_job_modify"):
            if g[fn] is None:
                raise HorusError(f"{self.path} does not define {fn}")
        self._g = g

    def submit(
        self,
        job_desc: dict[str, Any],
        policy_path: str | os.PathLike[str] | None = None,
        submit_uid: int | None = None,
    ) -> Decision:
        """Run slurm_job_submit on a copy of ``job_desc``; submit_uid defaults to this process's uid
        (what slurmctld passes for a job submitted by the caller: the claim record is keyed by it)."""
        if submit_uid is None:
            submit_uid = os.getuid()
        fields = {k: v for k, v in job_desc.items() if v is not None}
        for k, v in fields.items():
            if not isinstance(v, (str, int, float, bool)):
                raise HorusError(f"job_desc[{k!r}]: unsupported value type {type(v).__name__}")
        with self._lock:
            g = self._g
            g._horus_reset()
            g._horus_policy_override = None if policy_path is None else str(policy_path)
            try:
                job, backing, writes = g._horus_make_job(self._lua.table_from(fields))
                rc = g.slurm_job_submit(job, self._lua.table(), submit_uid)
                after = dict(backing.items())
                written = tuple(writes.values())
                log = [(str(m[1]), str(m[2])) for m in g._horus_msgs.values()]
                user = [str(m) for m in g._horus_user_msgs.values()]
            finally:
                g._horus_policy_override = None
        rc = int(rc) if isinstance(rc, (int, float)) else SLURM_SUCCESS
        # Keep the caller's Python values for fields the hook did not write.
        result = {}
        for k, v in after.items():
            if k in fields and k not in written:
                result[k] = fields[k]
            elif isinstance(v, float) and v.is_integer():
                result[k] = int(v)
            else:
                result[k] = v
        return _make_decision(rc, result, user, log, written)


def _make_decision(rc, job, user, log, written) -> Decision:
    admin = job.get("admin_comment") if "admin_comment" in written else None
    action, gtype, shards, per_gpu = "unchanged", None, None, None
    if rc != SLURM_SUCCESS:
        action = "rejected"
    elif admin:
        m = None
        for m in _NOTE_RE.finditer(admin):
            pass
        if m:
            kind = m.group(1)
            action = "unchanged" if kind == "ignored hint" else kind
            gtype = m.group(2)
            if m.group(3):
                shards, per_gpu = int(m.group(3)), int(m.group(4))
    return Decision(
        rc=rc,
        job_desc=job,
        user_messages=user,
        admin_comment=job.get("admin_comment"),
        action=action,
        gpu_type=gtype,
        shards=shards,
        shards_per_gpu=per_gpu,
        log=log,
        written=written,
    )


class HookCache:
    """Small LRU of loaded runtimes, keyed by (hook path, mtime, size)."""

    def __init__(self, maxsize: int = 4):
        self.maxsize = maxsize
        self._items: OrderedDict[tuple, HookRuntime] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, hook_path: str | os.PathLike[str]) -> HookRuntime:
        path = Path(hook_path).resolve()
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        with self._lock:
            rt = self._items.get(key)
            if rt is not None:
                self._items.move_to_end(key)
                return rt
        rt = HookRuntime(path)
        with self._lock:
            self._items[key] = rt
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return rt

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


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
    the claim record named by the policy's ``record_file``; put the job's ``account`` in job_desc
    for the account's record to apply.
    """
    rt = (cache or _default_cache).get(find_hook(hook_path))
    return rt.submit(dict(job_desc), policy_path=policy_path, submit_uid=submit_uid)


# --------------------------------------------------------------------------- policy file values
# The same line grammar and validation as parse_policy() in job_submit.lua, for the keys
# other tools need (horus-admin sync: record_file, underclaim_window_days).

_POLICY_MAX_BYTES = 65536
_POLICY_MAX_LINES = 1000
_POLICY_LINE_RE = re.compile(r"^[ \t\r\n\v\f]*([A-Za-z0-9_.\-]+)[ \t\r\n\v\f]*=[ \t\r\n\v\f]*(.*?)[ \t\r\n\v\f]*$",
                             re.S)


def _int_in(lo: int, hi: int):
    def ok(v: str) -> bool:
        return bool(re.fullmatch(r"[0-9]{1,9}", v)) and lo <= int(v) <= hi
    return ok


def _decimal_le(hi: int):
    def ok(v: str) -> bool:
        m = re.fullmatch(r"([0-9]{1,9})(?:\.([0-9]{1,9}))?", v)
        return bool(m) and float(v) <= hi
    return ok


def _one_of(*names: str):
    return lambda v: v in names


_MAX_MEM_MIB = 99999999
# key -> validator of the hook (an invalid value makes the hook use its built-in default)
_POLICY_KEYS = {
    "shards_per_gpu": _int_in(1, 10000),
    "pack_limit_pct": _int_in(1, 100),
    "exclusive_util_pct": _decimal_le(100),
    "memory": _one_of("expected", "p90", "p95", "p99"),
    "min_shards": _int_in(1, 999999999),
    "on_bad_hint": _one_of("ignore", "reject"),
    "type_via": _one_of("features", "gres"),
    "type_choice": _one_of("order", "any"),
    "type_order": lambda v: True,
    "type_features": lambda v: True,  # bad names are dropped one by one, like type_order's
    "raw_shards": _one_of("allow", "whole", "refuse"),
    "min_mem_mib": _int_in(0, _MAX_MEM_MIB),
    "record_file": lambda v: len(v) <= 1000 and v.startswith("/")
    and not re.search(r"[\x00-\x1f\x7f]", v),
    "underclaim_limit": _int_in(0, 1000000),
    "underclaim_window_days": _int_in(1, 36500),
}
_GPU_MEM_KEY = re.compile(r"gpu\.([a-z0-9_\-]{1,32})\.mem_mib")


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
    """The value job_submit.lua reads for ``key`` from its policy file (see policy_file()):
    the last ``key = value`` line with a value the hook accepts (``#`` comments stripped, value
    trimmed), or ``default`` when the file is missing, unreadable, over 64 KiB, or sets no
    acceptable value for the key (the hook then uses its built-in default: pass that as
    ``default``)."""
    p = policy_file(path)
    try:
        with open(p, "rb") as f:
            data = f.read(_POLICY_MAX_BYTES + 1)
    except OSError:
        return default
    if len(data) > _POLICY_MAX_BYTES:
        return default
    text = data.decode("utf-8", "surrogateescape")
    check = _POLICY_KEYS.get(key)
    if check is None and _GPU_MEM_KEY.fullmatch(key):
        check = _int_in(1, _MAX_MEM_MIB)
    value = default
    for n, line in enumerate(text.split("\n"), 1):
        if n > _POLICY_MAX_LINES:
            break
        line = line.split("#", 1)[0]
        if len(line) > 1024:
            continue
        m = _POLICY_LINE_RE.match(line)
        if not m or m.group(1) != key:
            continue
        v = m.group(2)
        if check is None or check(v):
            value = v  # an invalid value changes nothing: the hook logs it and keeps what it had
    return value
