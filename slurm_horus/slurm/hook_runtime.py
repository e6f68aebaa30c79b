"""The real ``etc/job_submit.lua`` in a Lua 5.1 runtime, as slurmctld runs it.

HookRuntime loads the hook into ``lupa.lua51`` (the Lua version Debian's slurmctld links) with a
fake ``slurm`` table that behaves like slurmctld's: the same constants, ``log_*`` functions that
run ``string.format`` as Slurm does, and a ``job_desc`` proxy whose string setters reject ``nil``
and turn ``""`` into an unset field.  Its answer, a Decision, takes what the hook decided from
the hook's own decision token (slurm_horus.slurm.hint.parse_decision), not from the note's prose.

Callers use slurm_horus.slurm.policy.decide(), which finds the hook and keeps runtimes cached.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_horus.errors import HorusError
from slurm_horus.slurm.hint import HookDecision, parse_decision

__all__ = ["Decision", "HookRuntime", "HookCache", "SLURM_SUCCESS", "SLURM_ERROR"]

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


@dataclass(frozen=True)
class Decision:
    """What the hook did to one job.

    action: "shared" (GPU request turned into shards), "exclusive" (keeps a whole GPU),
    "unchanged" (no hint, hint ignored, or request not handled) or "rejected"; gpu_type,
    shards, shards_per_gpu and reason as in hint.HookDecision.  All of them come from the
    decision token the hook wrote, so rewording the human note changes none of them.
    """

    rc: int
    job_desc: dict[str, Any]
    user_messages: list[str]
    admin_comment: str | None
    action: str
    gpu_type: str | None = None
    shards: int | None = None
    shards_per_gpu: int | None = None
    reason: str | None = None
    log: list[tuple[str, str]] = field(default_factory=list)
    written: tuple[str, ...] = ()

    @property
    def note(self) -> str | None:
        """What the hook appended to AdminComment ("horus: ..." and its decision token), if it
        wrote anything: the text ``scontrol show job`` then ends with."""
        if "admin_comment" not in self.written or not self.admin_comment:
            return None
        text = self.admin_comment  # the hook appends "; " + its note to an AdminComment there
        i = text.rfind("; horus: ")  # (its own reason may say "horus: " too)
        return text[i + 2:] if i >= 0 else text if text.startswith("horus: ") else None


def _lua_text(v: str) -> str:
    """``v`` as the runtime can pass it: bytes that are not UTF-8 (sbatch passes any; Python
    holds each as a surrogate) become one "?" each, so the hook's byte limits fall where
    slurmctld's do; no hint or GRES is read from such bytes either way."""
    try:
        v.encode("utf-8")
        return v
    except UnicodeEncodeError:
        return "".join("?" if 0xD800 <= ord(c) <= 0xDFFF else c for c in v)


def _lua_value(v: str | int | float | bool) -> str | int | float | bool:
    """A job_desc value as slurmctld pushes it (lua_pushnumber: every number a double): an int
    past 64 bits (NO_VAL64, Slurm's unset pn_min_memory), which lupa refuses with an
    OverflowError, as a float; text as _lua_text."""
    if isinstance(v, str):
        return _lua_text(v)
    if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 63:
        return float(v)
    return v


def _make_decision(rc, job, user, log, written) -> Decision:
    admin = job.get("admin_comment")
    token = (parse_decision(admin) if "admin_comment" in written else None) or HookDecision("unchanged")
    return Decision(
        rc=rc,
        job_desc=job,
        user_messages=user,
        admin_comment=admin,
        action="rejected" if rc != SLURM_SUCCESS else token.action,
        gpu_type=token.gpu_type,
        shards=token.shards,
        shards_per_gpu=token.shards_per_gpu,
        reason=token.reason,
        log=log,
        written=written,
    )


class HookRuntime:
    """One Lua 5.1 runtime with the hook loaded, as slurmctld would load it.

    Module-level state of the script (its "log once" memory, its parsed-policy cache)
    persists across calls, exactly as in slurmctld, which keeps the script loaded until
    the file's mtime changes.  Calls are serialized with a lock.
    """

    def __init__(self, hook_path: str | os.PathLike[str], lua: str = "lua51"):
        # lua51 is what slurmctld links on Debian/Ubuntu; other lupa modules (lua54, ...) let
        # tests check newer Lua too.
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
        given = {k: v for k, v in job_desc.items() if v is not None}
        env = given.pop("environment", None)  # slurmctld's: a table read by variable name
        if env is not None and not all(isinstance(x, str) for kv in env.items() for x in kv):
            raise HorusError("job_desc['environment']: not a {name: value} of strings")
        for k, v in given.items():
            if not isinstance(v, (str, int, float, bool)):
                raise HorusError(f"job_desc[{k!r}]: unsupported value type {type(v).__name__}")
        fields = {k: _lua_value(v) for k, v in given.items()}
        with self._lock:
            g = self._g
            g._horus_reset()
            g._horus_policy_override = None if policy_path is None else str(policy_path)
            try:
                if env is not None:
                    fields["environment"] = self._lua.table_from({_lua_text(k): _lua_text(v) for k, v in env.items()})
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
            if k == "environment":
                result[k] = env  # read, never written: the caller's
            elif k in given and k not in written:
                result[k] = given[k]
            elif isinstance(v, float) and v.is_integer():
                result[k] = int(v)
            else:
                result[k] = v
        return _make_decision(rc, result, user, log, written)


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
