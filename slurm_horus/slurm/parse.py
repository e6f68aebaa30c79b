"""Slurm's output and configuration, parsed: scontrol records, GRES strings, hostlists,
slurm.conf / gres.conf lines, ``sinfo`` / ``squeue --json``, sbatch's reply.

Pure functions (no subprocess, no Slurm needed), tested against the recorded real outputs in
``tests/fixtures/slurm`` (Slurm 22.05.8, Debian 12) and ``tests/fixtures/slurm-25.11`` (25.11.7).
The other Slurm text slurm-horus reads is parsed beside this module: sbatch's arguments in
``sbatch_args``, ``sacct --json`` in ``accounting``.
"""

from __future__ import annotations

import json
import re

from slurm_horus.errors import HorusError, one_line

__all__ = [
    "parse_scontrol_records", "parse_gres", "gpu_types_of_node", "partition_nodes", "partition_gpu_types",
    "default_partition", "job_gres_detail", "parse_sbatch_stdout", "parse_scontrol_config", "config_user_id", "expand_batch_stdio",
    "expand_hostlist", "parse_conf_lines", "parse_pipe_table",
    "job_gpus_on_node", "parse_listpids", "job_state", "sinfo_json_nodes",
    "squeue_json_records", "array_task_count",
]


# --------------------------------------------------------------------------------------------
# scontrol / sinfo / squeue / sbatch output
# --------------------------------------------------------------------------------------------

# Fields whose value runs to the end of the line (may contain spaces) in the multi-line format.
_LINE_FIELDS = ("Comment", "AdminComment", "SystemComment", "Command", "WorkDir", "StdErr",
                "StdIn", "StdOut", "OS", "Reason", "Extra")
_KEY_RE = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_/:.()]*)=")


def _parse_kv_line(line: str, rec: dict) -> None:
    s = line.strip()
    for f in _LINE_FIELDS:
        if s.startswith(f + "="):
            rec[f] = s[len(f) + 1:].rstrip()
            return
    matches = list(_KEY_RE.finditer(s))
    for k, m in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(s)
        rec.setdefault(m.group(1), s[m.end():end].strip())


def parse_scontrol_records(text: str) -> list[dict]:
    """Records of ``scontrol [-d] [-o] show job|node|partition``: one dict per record.

    Multi-line records are separated by blank lines; ``-o`` gives one record per line.  The
    ``-d`` job detail lines (``Nodes=... GRES=...``) go to ``rec["_details"]`` (list of dicts).
    """
    records: list[dict] = []
    rec: dict | None = None
    for line in text.splitlines():
        if not line.strip():
            rec = None
            continue
        head = re.match(r"(JobId|NodeName|PartitionName|ReservationName)=", line)
        if head:
            rec = {"_details": []}
            records.append(rec)
            _parse_kv_line(line, rec)
            continue
        if rec is None:
            continue
        if re.match(r"\s+Nodes=", line) and "JobId" in rec:
            d: dict = {}
            _parse_kv_line(line, d)
            rec["_details"].append(d)
            continue
        _parse_kv_line(line, rec)
    return records



def _split_gres(text: str) -> list[str]:
    """Split a GRES list on commas that are not inside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return [x.strip() for x in out if x.strip()]


# Slurm writes a count that is a multiple of 1024 with a suffix (gres.c, _get_suffix: 1K = 1024)
# and reads one in either case (slurm.conf, gres.conf Count=)
_GRES_COUNT = re.compile(r"([0-9]+)([KMGTPkmgtp]?)")
MAX_GRES_COUNT = 2 ** 64 - 1  # Slurm holds a count in a uint64


def gres_count(text: str) -> int | None:
    """A GRES count as Slurm reads it ('400', '1K', '2m'), else None; None too past a uint64,
    which no Slurm holds (a gres.conf Count= of 5,000 digits had been int()'s ValueError)."""
    m = _GRES_COUNT.fullmatch(text.strip())
    if not m or len(m.group(1).lstrip("0")) > 20:
        return None
    n = int(m.group(1)) * 1024 ** "_KMGTP".index((m.group(2) or "_").upper())
    return n if n <= MAX_GRES_COUNT else None


_IDX_LIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
# the most GPU indices one IDX list may name: 64 times the most GPUs Slurm indexes on a node
# (MAX_GRES_BITMAP, 1024, in gres.c); "IDX:0-99999999999", which no Slurm writes, had been built
# into a list until memory ran out, before hsubmit could hand the job to sbatch
MAX_GRES_INDICES = 64 * 1024


def _gres_indices(text: str, raw: str) -> list[int]:
    """The indices of an IDX list (``0-1,3``), each range counted before it is built."""
    idx: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError:  # past int()'s 4,300 digits: past the cap too
            lo, hi = 0, MAX_GRES_INDICES
        if len(idx) + max(hi - lo + 1, 0) > MAX_GRES_INDICES:
            raise HorusError(f"GRES {one_line(raw)[:80]!r}: more than {MAX_GRES_INDICES:,} GPU indices")
        idx.extend(range(lo, hi + 1))
    return idx


def parse_gres(text: str | None) -> list[dict]:
    """``gpu:a100:4,shard:a100:400`` / ``shard:30(IDX:0)`` / ``gres:gpu:1`` ->
    [{name, type, count, idx}].  idx: the GPU indices of ``(IDX:0-1,3)``, or of a shared gres's
    per-GPU counts ``(0/100,66/100)`` (25.11's job detail: the GPUs where the job holds some), as
    a list; else None."""
    if not text or text in ("(null)", "N/A", "none"):
        return []
    items = []
    for raw in _split_gres(text):
        parts = raw.split("(", 1)
        main, paren = parts[0], (parts[1].rstrip(")") if len(parts) > 1 else "")
        fields = main.split(":")
        if fields and fields[0] == "gres":
            fields = fields[1:]
        if "/" in fields[0]:  # gres/shard
            fields[0] = fields[0].split("/", 1)[1]
        name, gtype, count = fields[0], None, 1
        rest = fields[1:]
        if rest and _GRES_COUNT.fullmatch(rest[-1].strip()):
            count = gres_count(rest.pop())
            if count is None:
                raise HorusError(f"GRES {one_line(raw)[:80]!r}: a count past {MAX_GRES_COUNT:,}")
        if rest:
            gtype = rest[0]
        idx = None
        m = re.search(r"IDX:([0-9,\-]+|N/A)", paren)
        if m and m.group(1) != "N/A":
            if not _IDX_LIST.fullmatch(m.group(1)):  # "(IDX:-)": a HorusError, not int('')'s
                raise HorusError(f"GRES {one_line(raw)[:80]!r}: unreadable GPU index list")
            idx = _gres_indices(m.group(1), raw)
        elif re.fullmatch(r"[0-9]+/[0-9]+(?:,[0-9]+/[0-9]+)*", paren):
            idx = [i for i, used in enumerate(paren.split(",")) if used.split("/")[0].strip("0")]
        items.append({"name": name, "type": gtype, "count": count, "idx": idx})
    return items


def gpu_types_of_node(node: dict) -> dict[str, int]:
    """{gres type: GPU count} of a node record (``Gres=gpu:a100:4,...``); untyped GPUs are
    left out (no type, no prediction)."""
    out: dict[str, int] = {}
    for g in parse_gres(node.get("Gres")):
        if g["name"] == "gpu" and g["type"]:
            out[g["type"]] = out.get(g["type"], 0) + g["count"]
    return out


def default_partition(partitions: list[dict]) -> str | None:
    """Name of the partition with ``Default=YES`` in ``scontrol show partition`` records."""
    for p in partitions:
        if p.get("Default") == "YES":
            return p.get("PartitionName")
    return None


def partition_nodes(nodes: list[dict], partition: str) -> list[dict]:
    """The ``scontrol show node`` records of ``partition``'s nodes (a comma list is a union),
    by their ``Partitions=`` field."""
    wanted = {p.strip() for p in partition.split(",") if p.strip()}
    return [n for n in nodes if wanted & {p.strip() for p in (n.get("Partitions") or "").split(",")}]


def partition_gpu_types(nodes: list[dict], partition: str) -> dict[str, int]:
    """{gres type: GPU count} over the nodes of ``partition`` (partition_nodes)."""
    out: dict[str, int] = {}
    for node in partition_nodes(nodes, partition):
        for t, c in gpu_types_of_node(node).items():
            out[t] = out.get(t, 0) + c
    return out


def job_gres_detail(job: dict) -> list[dict]:
    """Per node of a ``scontrol -d show job`` record: {node, gres: [{name,type,count,idx}]}."""
    out = []
    for d in job.get("_details", []):
        out.append({"node": d.get("Nodes"), "gres": parse_gres(d.get("GRES"))})
    return out


def parse_sbatch_stdout(text: str) -> str | None:
    """Job id from sbatch's stdout: ``Submitted batch job N`` or ``--parsable``'s ``N[;cluster]``."""
    m = re.search(r"Submitted batch job (\d+)", text)
    if m:
        return m.group(1)
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = re.fullmatch(r"(\d+(?:_\d+)?)(?:;\S+)?", first.strip())
    return m.group(1) if m else None


def parse_pipe_table(text: str) -> list[dict]:
    """``sinfo/squeue -o 'A|B'`` or ``sacct -P`` output (header line, ``|`` separated)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    head = lines[0].split("|")
    return [dict(zip(head, ln.split("|"))) for ln in lines[1:]]


# ESLURM_REST_EMPTY_RESULT (slurm_errno.h): "Nothing found", 22.05's sacct --json over a
# window without jobs; an answer, not a failure
EMPTY_RESULT = 9003


def json_errors(data, what: str) -> None:
    """Slurm's ``--json`` replies name the failures they met in ``errors``, exit status 0
    regardless (22.05's ``squeue --json`` with slurmctld unreachable: no jobs, and "Failed while
    looking for jobs"): a HorusError here, never an empty queue or cluster.  An empty result
    (EMPTY_RESULT) is no failure."""
    errors = data.get("errors") if isinstance(data, dict) else None
    if isinstance(errors, list):
        errors = [e for e in errors if not (isinstance(e, dict) and e.get("error_number") == EMPTY_RESULT)]
    if errors and isinstance(errors, list):
        first = errors[0] if isinstance(errors[0], dict) else {}
        text = first.get("description") or first.get("error") or str(errors[0])
        raise HorusError(f"{what}: {str(text)[:200]}")


def sinfo_json_nodes(text: str) -> list[dict]:
    """``sinfo --json`` -> [{name, partitions, gpu_types, features}].

    22.05 (v0.0.38) lists ``nodes``; 23.02+ (data_parser) lists ``sinfo``: one entry per
    partition and group of like nodes (``nodes.nodes`` names them, ``gres.total``,
    ``features.total``, ``partition.name``), merged here into one record per node."""
    data = json.loads(text)
    json_errors(data, "sinfo --json")
    if "sinfo" in data:
        by: dict[str, dict] = {}
        for e in data["sinfo"]:
            part = (e.get("partition") or {}).get("name")
            gres = (e.get("gres") or {}).get("total") or ""
            feats = (e.get("features") or {}).get("total") or ""
            for name in (e.get("nodes") or {}).get("nodes") or []:
                n = by.setdefault(name, {"name": name, "partitions": [],
                                         "gpu_types": gpu_types_of_node({"Gres": gres}),
                                         "features": feats})
                if part and part not in n["partitions"]:
                    n["partitions"].append(part)
        return list(by.values())
    out = []
    for n in data.get("nodes", []):
        gres = n.get("gres") or ""
        out.append({
            "name": n.get("name") or n.get("hostname"),
            "partitions": list(n.get("partitions") or []),
            "gpu_types": gpu_types_of_node({"Gres": gres}),
            "features": n.get("features") or n.get("active_features") or "",
        })
    return out


def _json_state(j: dict) -> str | None:
    """``job_state``: a string in 22.05 (v0.0.38), a list from 23.02 (the state, then flags)."""
    state = j.get("job_state")
    if isinstance(state, list):
        state = state[0] if state else None
    return state


def _json_state_flags(j: dict) -> str:
    """The flags after the state in 23.02+'s ``job_state`` list (COMPLETING, REQUEUE_HOLD,
    SPECIAL_EXIT, ...), comma-separated; 22.05 gives none."""
    state = j.get("job_state")
    return ",".join(str(f) for f in state[1:]) if isinstance(state, list) else ""


def _json_number(v):
    """A number of ``squeue --json``: plain in 22.05, ``{set, infinite, number}`` from 23.02;
    None when unset or infinite."""
    if isinstance(v, dict):
        return v.get("number") if v.get("set") and not v.get("infinite") else None
    return v


def _json_flag(v) -> str:
    """A yes/no of ``squeue --json`` (``requeue``, ``batch_flag``: true or false in 22.05's and
    25.11's) as scontrol writes it, 1 or 0; "" where squeue gives none."""
    return str(int(v)) if isinstance(v, bool) else ""


def _array_ids(j: dict) -> dict:
    """ArrayJobId and ArrayTaskId of an array task (none for other jobs; 22.05 gives 0 and
    NO_VAL there, 23.02+ unset numbers)."""
    a, t = _json_number(j.get("array_job_id")), _json_number(j.get("array_task_id"))
    if not a or t is None or not 0 <= int(t) < 4294967294:
        return {}
    return {"ArrayJobId": str(int(a)), "ArrayTaskId": str(int(t))}


def squeue_json_records(text: str, job_id: int | str | None = None) -> list[dict]:
    """``squeue --json`` jobs as ``scontrol -d show job`` records: the keys and value forms
    parse_scontrol_records gives (JobId, UserId ``name(uid)``, JobState, Partition, Features,
    TresPerNode, TRES, ReqTRES, Comment, AdminComment, Restarts, SubmitTime in local ISO time,
    NodeList, Reason, Priority, Requeue and BatchFlag (1 or 0: whether Slurm may requeue it),
    the detail lines as ``_details``), and what scontrol shows
    otherwise: ``_submit`` and ``_start`` (epoch seconds: local ISO time is ambiguous once a
    year; ``_start`` the last run's start, for a pending job the expected one),
    ``_flags`` (the state's flags, 23.02+), ``_het`` (a hetjob's id), ``_tasks`` (the tasks
    of an array record not split yet), only ``job_id``'s when given (22.05 ignores
    squeue's ``--jobs`` with ``--json``).  What root acts on is read from here, never from
    scontrol's text: that prints a job's name, comment and paths raw, newlines included, so a
    user can write lines that read as any field of the job, or as another user's job."""
    import time

    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise HorusError("squeue --json: not JSON") from None
    json_errors(data, "squeue --json")
    out = []
    for j in data.get("jobs", []):
        if job_id is not None and str(j.get("job_id")) != str(job_id):
            continue
        submit = _json_number(j.get("submit_time"))
        nodes = j.get("nodes") or ""
        detail = j.get("gres_detail") or []
        hosts = expand_hostlist(nodes) if nodes and detail else []
        if len(hosts) != len(detail):
            hosts = [nodes] * len(detail) if len(detail) == 1 else []
        out.append({
            "JobId": str(j.get("job_id")), "UserId": f"{j.get('user_name') or ''}({j.get('user_id')})",
            "JobState": _json_state(j), "Partition": j.get("partition") or "",
            "Features": j.get("features") or "", "TresPerNode": j.get("tres_per_node") or "",
            "TRES": j.get("tres_alloc_str") or j.get("tres_req_str") or "",
            "ReqTRES": j.get("tres_req_str") or "",
            "Comment": j.get("comment") or "", "AdminComment": j.get("admin_comment") or "",
            "Restarts": str(_json_number(j.get("restart_cnt")) or 0),
            "Requeue": _json_flag(j.get("requeue")), "BatchFlag": _json_flag(j.get("batch_flag")),
            "SubmitTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(submit)) if submit else "Unknown",
            "NodeList": nodes, "Reason": j.get("state_reason") or "",
            "StateDesc": j.get("state_description") or "",
            "Priority": "" if _json_number(j.get("priority")) is None else str(_json_number(j.get("priority"))),
            "_details": [{"Nodes": h, "GRES": g} for h, g in zip(hosts, detail)],
            "_submit": submit, "_start": _json_number(j.get("start_time")) or None,
            "_flags": _json_state_flags(j),
            "_het": _json_number(j.get("het_job_id")) or None,
            "_tasks": j.get("array_task_string") or "",
            **_array_ids(j),
        })
    return out


def array_task_count(text: str | None) -> int:
    """How many tasks an array record not split yet stands for that may still start
    (squeue's array_task_string: ``1-100``, ``1-99:2``, ``3,5,7-9``, ``0-31%4``; at most the
    ``%`` throttle), counted, never expanded; 1 for a text Slurm would not write."""
    m = re.fullmatch(r"([0-9,:\-]+)(?:%([0-9]+))?", (text or "").strip())
    if not m:
        return 1
    n = 0
    for part in m.group(1).split(","):
        r = re.fullmatch(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", part)
        if not r:
            return 1
        a, b, step = int(r.group(1)), int(r.group(2) or r.group(1)), int(r.group(3) or 1)
        if b < a or step < 1:
            return 1
        n += (b - a) // step + 1
    cap = int(m.group(2) or 0)  # %0: no throttle
    return max(1, min(n, cap) if cap else n)


# --------------------------------------------------------------------------- horus-probe (Prolog)

def _hostlist_has(expr: str | None, node: str) -> bool:
    """Whether a Slurm hostlist (``gpu-a100``, ``gpu[01-03,07],login1``) names ``node``."""
    try:
        return bool(expr) and node in expand_hostlist(expr)
    except HorusError:
        return False


def job_gpus_on_node(job: dict, node: str | None) -> dict | None:
    """The GPUs a job holds on ``node``, from a ``scontrol -d show job`` record (the detail line
    ``Nodes=gpu-t4 ... GRES=shard:7(IDX:0)`` on 22.05, ``GRES=shard:66(0/100,66/100)`` on 25.11,
    ``GRES=gpu:a100:2(IDX:1-2)`` on both).

    Returns {"indices": [node-local GPU indices], "type": gres type or None, "shards": shard count
    or None, "gpus": whole-GPU count or None}, or None when the job has no GPU or shard there.
    The type comes from the detail's ``gpu:TYPE:N``, else from ``TresPerNode=gres:shard:TYPE:N``;
    an untyped shard job's type is the node's (``gpu_types_of_node``), which the caller looks up.
    With ``node`` None a single-node job's only detail line is used.
    """
    details = job.get("_details") or []
    if node is not None:
        details = [d for d in details if _hostlist_has(d.get("Nodes"), node)]
    elif len(details) != 1:
        return None
    if not details:
        return None
    gres = [g for g in parse_gres(details[0].get("GRES")) if g["name"] in ("gpu", "shard")]
    if not gres:
        return None
    indices: set[int] = set()
    gtype = None
    shards = gpus = None
    for g in gres:
        indices.update(g["idx"] or [])
        gtype = gtype or g["type"]
        if g["name"] == "shard":
            shards = (shards or 0) + g["count"]
        else:
            gpus = (gpus or 0) + g["count"]
    if gtype is None:
        for g in parse_gres(job.get("TresPerNode")):
            if g["name"] in ("gpu", "shard") and g["type"]:
                gtype = g["type"]
                break
    return {"indices": sorted(indices), "type": gtype, "shards": shards, "gpus": gpus}


def parse_listpids(text: str) -> list[int]:
    """Process ids from ``scontrol listpids JOBID [NODE]`` (header ``PID JOBID STEPID ...``)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if f and f[0].isascii() and f[0].isdigit() and int(f[0]) > 1:
            out.append(int(f[0]))
    return out


def job_state(job: dict) -> str | None:
    """``JobState`` of a ``scontrol show job`` record (``RUNNING``, ``COMPLETING``, ...)."""
    s = job.get("JobState")
    return s.split()[0] if s else None


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = Value`` lines) as a dict; other lines are skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_slurmdbd_config(text: str) -> dict[str, str] | None:
    """slurmdbd.conf's settings from ``sacctmgr show configuration``: the ``Key = Value`` lines
    after its "SlurmDBD configuration:" line (before it: slurm.conf's, as scontrol shows);
    None without that section (sacctmgr prints slurm.conf's alone, exit 0, when slurmdbd does
    not answer)."""
    _, sep, dbd = text.partition("SlurmDBD configuration:")
    return parse_scontrol_config(dbd) if sep else None


_STDIO_PATTERN = re.compile(r"%(\d*)([AaJjNnstux%])")


def expand_batch_stdio(path: str, fields: dict[str, str | None]) -> str | None:
    """A batch job's StdErr/StdOut as slurmstepd names the file, from 22.05's scontrol text,
    which expands only unpadded %A %a %j %u %x: the rest (%N the batch host's hostname, %n and
    %t 0, %s "batch", %J "<job>.batch", a zero-padded %5j, %% a %) from ``fields`` (letter ->
    value). A path with a backslash is taken literally, as slurmstepd does. None when a pattern
    needs a value not given."""
    if "\\" in path:
        return path
    values = {"n": "0", "t": "0", "s": "batch", "%": "%", **fields}
    if values.get("j"):
        values.setdefault("J", f"{values['j']}.batch")

    def one(m):
        width, what = int(m.group(1) or 0), m.group(2)
        v = values.get(what)
        if v is None:
            raise LookupError
        if what == "N":
            v = v.split(".")[0]
        return v.zfill(width) if width and v.isdigit() else v
    try:
        return _STDIO_PATTERN.sub(one, path)
    except LookupError:
        return None


def config_user_id(value: str) -> int | None:
    """The uid of a user setting of ``scontrol show config`` (``SlurmUser = slurm(64030)``)."""
    m = re.fullmatch(r"[^()]*\((\d+)\)", value.strip())
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- slurm.conf

# the most names one hostlist expands to (the simulator's cluster: a million GPUs); ranges are
# capped one by one, and a[1-100000]b[1-100000] had filled memory with 10^10 names
MAX_HOSTLIST_NAMES = 1_000_000
# the widest range (Slurm's own is 64K, MAX_RANGE in hostlist.h), and the most bracketed ranges
# in one name (each a level of recursion: 1,500 had been a RecursionError)
MAX_HOSTLIST_RANGE = 100_000
MAX_HOSTLIST_BRACKETS = 16


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist: ``gpu[01-03,07],login1`` -> gpu01 gpu02 gpu03 gpu07 login1."""
    items, depth, cur = [], 0, ""
    for ch in expr:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", item)
        if not m:
            out.append(item)
            continue
        head, ranges, tail = m.groups()
        if item.count("[") > MAX_HOSTLIST_BRACKETS:
            raise HorusError(f"hostlist: more than {MAX_HOSTLIST_BRACKETS} ranges in '{item[:80]}'")
        for part in ranges.split(","):
            a, sep, b = part.partition("-")
            if not (a.isascii() and a.isdigit()) or (sep and not (b.isascii() and b.isdigit())):
                raise HorusError(f"hostlist: cannot read '{item[:80]}'")
            if max(len(a), len(b)) > 18:  # int() refuses 4,300 digits with a ValueError
                raise HorusError(f"hostlist: bad range in '{item[:80]}'")
            lo, hi = int(a), int(b) if sep else int(a)
            if hi < lo or hi - lo > MAX_HOSTLIST_RANGE:
                raise HorusError(f"hostlist: bad range in '{item[:80]}'")
            for k in range(lo, hi + 1):
                out.extend(expand_hostlist(f"{head}{str(k).zfill(len(a))}{tail}"))
                if len(out) > MAX_HOSTLIST_NAMES:
                    raise HorusError(f"hostlist: more than {MAX_HOSTLIST_NAMES:,} names in "
                                     f"'{expr[:80]}'")
    return out


# a slurm.conf / gres.conf pair as Slurm's parser reads it (s_p_parse_line): spaces about the
# '=' and a double-quoted value allowed ("Prolog = /x", Features="a100")
_CONF_PAIR = re.compile(r'([A-Za-z0-9_.]+)[ \t]*[-*+/]?=[ \t]*(?:"([^"]*)"|(\S+))')


def parse_conf_lines(text: str) -> list[dict[str, str]]:
    """slurm.conf / gres.conf lines as {lower-case key: value} (comments, continuations and
    lines without key=value dropped)."""
    recs = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        rec = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
               for m in _CONF_PAIR.finditer(line)}
        if rec:
            recs.append(rec)
    return recs


def node_lines(recs: list[dict[str, str]]) -> list[dict[str, str]]:
    """The NodeName lines of parsed slurm.conf records, each with the ``NodeName=DEFAULT`` lines
    before it folded in, as slurmctld reads them (a later DEFAULT changes only later lines)."""
    defaults: dict[str, str] = {}
    nodes = []
    for rec in recs:
        if "nodename" not in rec:
            continue
        if rec["nodename"].upper() == "DEFAULT":
            defaults.update({k: v for k, v in rec.items() if k != "nodename"})
        else:
            nodes.append({**defaults, **rec})
    return nodes


def sbatch_plugin_options(help_text: str) -> dict[str, bool]:
    """{name: takes a value} of the options SPANK plugins add, from ``sbatch --help``'s section
    "Options provided by plugins:" (spank_print_options in 25.11's spank.c, as in older
    releases): each option starts a line as ``"%*s--%s%s%s"`` (a pad of 6, the name,
    ``=ARGINFO`` where the plugin gives an arginfo: how a plugin shows that it takes a value),
    its description after it or, when that is 30 columns or more, on the next line, indented 30
    like its wrapped lines; the section ends at the next heading (a line starting with no space)."""
    lines = help_text.split("\n")
    if "Options provided by plugins:" not in lines:
        return {}
    out: dict[str, bool] = {}
    for line in lines[lines.index("Options provided by plugins:") + 1:]:
        if line[:1] not in ("", " "):
            break
        m = re.match(r" {6}--([^\s=]+)(=?)", line)
        if m:
            out[m.group(1)] = bool(m.group(2))
    return out


# Slurm's refusals of a requeue that no later pass changes (_job_requeue_op): ESLURM_DISABLED
# (--no-requeue or JobRequeue=0, the job's partition gone), ESLURM_BATCH_ONLY (salloc, srun)
_REQUEUE_REFUSED_RE = re.compile(r"Requested operation is presently disabled|"
                                 r"Only batch jobs are accepted or processed")
# scontrol update's answers for a job no longer pending: started, ended or purged since it was
# read (22.05 and 25.11)
_JOB_MOVED_ON_RE = re.compile(r"Job is no longer pending execution|Job has already finished|"
                              r"Job/step already completing or completed|Invalid job id specified")
_REQUEUE_HELD = "job requeued in held state"  # the state description requeuehold leaves
# node states whose GPUs no pending job gets: down, draining or drained, failing, reserved or
# in maintenance (a reserved node's idle GPUs had counted as free)
_UNAVAILABLE_NODE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "RESERVED", "MAINT")


def requeue_refused(message: str) -> bool:
    """Whether scontrol's error says Slurm will never requeue the job (not a transient failure)."""
    return bool(_REQUEUE_REFUSED_RE.search(message))


def job_moved_on(message: str) -> bool:
    """Whether scontrol update's error says the job is no longer pending."""
    return bool(_JOB_MOVED_ON_RE.search(message))


def held_by_requeue(rec: dict) -> bool:
    """A squeue_json_records job held as requeuehold leaves it, root's included: JobHeldUser with
    the description "job requeued in held state" (seen on the 22.05 test cluster; Slurm's
    _job_requeue_op)."""
    return (rec.get("JobState") == "PENDING" and rec.get("Reason") == "JobHeldUser"
            and rec.get("StateDesc") == _REQUEUE_HELD)


def node_takes_jobs(state: str | None) -> bool:
    """Whether a node of this ``State=`` (scontrol's, flags joined by +) can run a pending job."""
    upper = (state or "").upper()
    return not any(s in upper for s in _UNAVAILABLE_NODE_STATES)


def tres_requests(tres: str | None, name: str, count: int) -> bool:
    """Whether a TRES string (ReqTRES, TRES: ``cpu=2,gres/shard=50,...``) holds ``count`` of
    gres ``name``."""
    return f"gres/{name}={count}" in (tres or "").split(",")
