"""sbatch's command line and ``#SBATCH`` / ``#HORUS`` lines, read the way sbatch reads them.

Pure functions (no subprocess, no Slurm needed). sbatch parses its command line with
``getopt_long`` and the option string starting with ``+``: options stop at the first non-option
argument (the script), long options may be abbreviated to any unambiguous prefix, a required value
is either ``--opt=value`` or the next argument (whatever it looks like), an optional value only
ever comes as ``--opt=value``.  ``SBATCH_LONG_OPTS`` is the table of sbatch 22.05's long options
(from ``sbatch --help`` and ``man sbatch`` of the installed 22.05.8, plus the hidden aliases of
``src/common/slurm_opt.c``).

Horus's own options (``HORUS_OPTS``) are recognised only by their exact full name and only before
the script; everything else is sbatch's and passes through unchanged.

A long option the table does not know is a SPANK plugin's (pyxis's ``--container-image IMAGE``):
in a directive line sbatch refuses any argument that is not an option, so a following word not
starting with '-' is its value; on the command line that word may be the script, and only
sbatch's list of its plugins' options (``split_args``'s ``plugin_options``) can tell.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "SBATCH_LONG_OPTS", "SBATCH_SHORT_OPTS", "HORUS_OPTS", "SbatchOpt", "SplitArgs",
    "resolve_long", "split_args", "help_request", "parse_sbatch_tokens", "last_value", "has_flag",
    "script_directives", "ScriptDirectives", "script_path", "horus_directives", "gres_to_tres", "gpus_to_tres",
]

REQ, OPT, NONE = "required", "optional", "none"

# sbatch 22.05 long options: name -> whether it takes a value.
SBATCH_LONG_OPTS: dict[str, str] = {
    # with a required value
    **{name: REQ for name in (
        "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir",
        "cluster", "clusters", "cluster-constraint", "comment", "constraint", "container",
        "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu", "cpus-per-task",
        "deadline", "delay-boot", "dependency", "distribution", "error", "exclude", "export",
        "export-file", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus",
        "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint",
        "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user",
        "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network",
        "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu",
        "ntasks-per-node", "ntasks-per-socket", "open-mode", "output", "partition", "power",
        "prefer", "priority", "profile", "qos", "reservation", "signal", "sockets-per-node",
        "switches", "thread-spec", "threads-per-core", "time", "time-min", "tmp",
        "uid", "wait-all-nodes", "wckey", "wrap",
        "tasks-per-node",  # 22.05's hidden alias of ntasks-per-node
        "tres-per-task",  # 23.02+ (22.05.8's sbatch refuses it)
        "container-id", "segment", "tres-bind",  # 25.11
        "autocomplete", "context", "extra", "ntasks-per-tres", "resources",  # 25.11 (slurm_opt.c)
    )},
    # with an optional value (only as --opt=value)
    **{name: OPT for name in (
        "exclusive", "get-user-env", "nice", "no-kill", "propagate",
    )},
    # flags
    **{name: NONE for name in (
        "contiguous", "help", "hold", "ignore-pbs", "no-requeue", "overcommit",
        "oversubscribe", "parsable", "quiet", "reboot", "requeue", "spread-job", "test-only",
        "usage", "use-min-nodes", "verbose", "version", "wait",
        "oom-kill-step", "resv-ports", "spread-segments",  # 25.11 (a value only as --opt=value)
        "consolidate-segments", "external", "stepmgr",  # 25.11
    )},
}

# sbatch 22.05 short options -> long name (getopt string "+a:A:b:B:c:C:d:D:e:F:G:hHi:J:kL:m:M:n:N:o:Op:q:QsS:t:vVw:Wx:").
SBATCH_SHORT_OPTS: dict[str, str] = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task",
    "C": "constraint", "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile",
    "G": "gpus", "h": "help", "H": "hold", "i": "input", "J": "job-name", "k": "no-kill",
    "L": "licenses", "m": "distribution", "M": "clusters", "n": "ntasks", "N": "nodes",
    "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose", "V": "version",
    "w": "nodelist", "W": "wait", "x": "exclude",
}
SHORT_WITH_VALUE = frozenset("aAbBcCdDeFGiJLmMnNopqStwx")

# Horus's options: name -> takes a value.  Exact names only.
HORUS_OPTS: dict[str, bool] = {
    "model": True, "batch-size": True, "dim": True, "task": True, "optimizer": True,
    "precision": True, "explain": False, "horus-model-dir": True, "horus-probe": False,
}


# the options 25.11 added: a prefix 22.05 reads as one option (--cons: constraint) is ambiguous
# on 25.11 only (consolidate-segments), where sbatch refuses it itself
SBATCH_2511_OPTS = frozenset({
    "container-id", "segment", "tres-bind", "tres-per-task", "autocomplete", "context", "extra",
    "ntasks-per-tres", "resources", "oom-kill-step", "resv-ports", "spread-segments",
    "consolidate-segments", "external", "stepmgr"})


# sbatch's long options that set another's field: parsed under that one's name, so that the
# last of either given wins, as in sbatch (--tasks-per-node=1 after #SBATCH --ntasks-per-node=4)
ALIASES = {"tasks-per-node": "ntasks-per-node"}


def resolve_long(name: str) -> str | None:
    """sbatch's long option for ``name`` (exact, else an unambiguous prefix: among 22.05's
    options when 25.11's make it ambiguous), or None when unknown or ambiguous (sbatch then
    fails itself)."""
    if name in SBATCH_LONG_OPTS:
        return name
    hits = [o for o in SBATCH_LONG_OPTS if o.startswith(name)] if name else []
    if len(hits) > 1:
        hits = [o for o in hits if o not in SBATCH_2511_OPTS]
    return hits[0] if len(hits) == 1 else None


@dataclass
class SbatchOpt:
    name: str            # canonical long name ("partition"), or "?" + text when unknown
    value: str | None    # None for flags / missing optional values
    start: int           # index of the first token in the token list
    end: int             # one past the last token


@dataclass
class SplitArgs:
    """A hsubmit command line split into its parts.

    ``sbatch_opts`` are the tokens before the script that belong to sbatch (in order, unchanged);
    ``horus`` the horus options as (name, value) pairs in order; ``rest`` the script and its
    arguments (empty when there is none: --wrap or a script on stdin).
    """

    sbatch_opts: list[str]
    horus: list[tuple[str, str | None]]
    rest: list[str]
    parsed: list[SbatchOpt] = field(default_factory=list)
    hetjob: bool = False
    errors: list[str] = field(default_factory=list)
    # options not sbatch's own whose value sbatch's plugin list did not settle (the split is a guess)
    unsure: list[str] = field(default_factory=list)

    @property
    def script(self) -> str | None:
        return self.rest[0] if self.rest else None

    def horus_value(self, name: str) -> str | None:
        vals = [v for n, v in self.horus if n == name]
        return vals[-1] if vals else None

    def horus_values(self, name: str) -> list[str]:
        return [v for n, v in self.horus if n == name and v is not None]

    def sbatch_argv(self, replace_comment: str | None = None, replace_wrap: str | None = None,
                    replace_script: str | None = None, add: tuple[str, ...] = ()) -> list[str]:
        """sbatch's arguments. With replace_comment (replace_wrap) every --comment (--wrap) is
        dropped and a single ``--comment=...`` (``--wrap=...``) is put first (the command line
        wins over #SBATCH lines wherever it stands, and nothing the user wrote, a ``--`` or an
        option unknown here with its value, can come between it and sbatch's parser);
        replace_script swaps the script path (its arguments stay); ``add`` goes before it."""
        opts = self.sbatch_opts
        replaced = {n: v for n, v in (("comment", replace_comment), ("wrap", replace_wrap))
                    if v is not None}
        if replaced:
            keep = [True] * len(opts)
            for o in self.parsed:
                if o.name in replaced:
                    for i in range(o.start, o.end):
                        keep[i] = False
            opts = [f"--{n}={v}" for n, v in replaced.items()] + [t for t, k in zip(opts, keep) if k]
        rest = list(self.rest)
        if replace_script is not None and rest:
            rest[0] = replace_script
        return list(opts) + list(add) + rest


def _directive_kind(following: str) -> str:
    """An unknown option in a directive line: sbatch refuses a non-option argument there, so a
    following word not starting with '-' can only be the option's value."""
    return NONE if following.startswith("-") else REQ


def _is_horus(tok: str) -> bool:
    name = tok[2:].partition("=")[0] if tok.startswith("--") else ""
    return name in HORUS_OPTS


def _is_count(value: str) -> bool:
    """A --task value that is a count (sbatch's --tasks-per-node), not hsubmit's train/infer."""
    return value.strip().isdigit()


def _number_like(value: str) -> bool:
    """A word meant as a number (``8``, ``-3``, ``1.5``): a --batch-size's value, right or
    wrong (check_options judges it); any other word after --batch-size is the script or an
    option, and the value is missing."""
    v = value.strip()  # as check_options strips it (a value read with its \r)
    v = v[1:] if v.startswith(("+", "-")) else v
    return v.replace(".", "", 1).isdigit()  # any digit Python knows ("²" too: judged later)


def _scan(argv: list[str], horus: list | None,
          plugin_kind: Callable[[str], str | None] | None = None, cmdline: bool = False
          ) -> tuple[list[str], list[SbatchOpt], int, list[str], bool, list[str]]:
    """getopt_long("+...") over argv.  Returns (sbatch tokens, parsed opts, index of the first
    non-option in argv, errors, hetjob, unsure).  With ``horus`` a list, horus options are taken
    out (appended to it) instead of being kept; a ``--task`` whose value is a count is sbatch's
    (its abbreviation of --tasks-per-node), each occurrence judged on its own.  A long option the table does not know, written
    without '=' and followed by a word, is read as in a directive line (_directive_kind); with
    ``plugin_kind`` (the command line) as that says (REQ or NONE), and where it cannot tell
    (None) as in a directive line, the option's name going to ``unsure``.  After an unsure
    option no hsubmit option is taken out: one there may be hsubmit's or the script's argument
    (the word after the unsure one its value, or the script), so it is an error naming both
    ways to settle it, never a guess that drops a script's arguments or hands sbatch ours.
    ``cmdline``: a --batch-size followed by a word that is no number is missing its value (an
    error naming the word), never given that word, the script, as getopt would."""
    out: list[str] = []
    parsed: list[SbatchOpt] = []
    errors: list[str] = []
    unsure: list[str] = []
    unsure_at = -1  # argv index of the first unsure option
    hetjob = False
    i, n = 0, len(argv)
    while i < n:
        tok = argv[i]
        if tok == "--":
            out.append(tok)
            i += 1
            break
        if tok == ":":  # heterogeneous job component separator
            hetjob = True
            out.append(tok)
            i += 1
            continue
        if tok.startswith("--"):
            body = tok[2:]
            name, eq, val = body.partition("=")
            count = name == "task" and _is_count(val if eq else argv[i + 1] if i + 1 < n else "")
            if horus is not None and unsure_at < 0 and _is_horus(tok) and not count:
                if HORUS_OPTS[name]:
                    if eq:
                        horus.append((name, val))
                        i += 1
                    elif cmdline and name == "batch-size" and i + 1 < n and not _number_like(argv[i + 1]):
                        errors.append(f"option --batch-size needs a value: {argv[i + 1][:40]!r} after it "
                                      "is no number (write --batch-size N, N from 1 up)")
                        i += 1
                    elif i + 1 < n:
                        horus.append((name, argv[i + 1]))
                        i += 2
                    else:
                        errors.append(f"option --{name} needs a value")
                        i += 1
                else:
                    if eq:
                        errors.append(f"option --{name} takes no value")
                    horus.append((name, None))
                    i += 1
                continue
            canon = resolve_long(name)
            start = len(out)
            out.append(tok)
            i += 1
            kind = SBATCH_LONG_OPTS.get(canon) if canon else None
            if canon is None and not eq and i < n:
                kind = plugin_kind(name) if plugin_kind else _directive_kind(argv[i])
                # an exact hsubmit option is never another's value, nor passed on to sbatch
                if kind is None or (kind == REQ and _is_horus(argv[i])):
                    unsure.append(name)
                    unsure_at = i if unsure_at < 0 else unsure_at
                    kind = _directive_kind(argv[i])
            value = val if eq else None
            if kind == REQ and not eq and i < n:
                out.append(argv[i])
                value = argv[i]
                i += 1
            parsed.append(SbatchOpt(ALIASES.get(canon, canon) if canon else "?" + name, value, start, len(out)))
            continue
        if tok.startswith("-") and len(tok) > 1:
            start = len(out)
            out.append(tok)
            i += 1
            j = 1
            while j < len(tok):
                c = tok[j]
                canon = SBATCH_SHORT_OPTS.get(c, "?" + c)
                if c in SHORT_WITH_VALUE:
                    if j + 1 < len(tok):
                        value = tok[j + 1:]
                    elif i < n:
                        value = argv[i]
                        out.append(argv[i])
                        i += 1
                    else:
                        value = None
                    parsed.append(SbatchOpt(canon, value, start, len(out)))
                    break
                parsed.append(SbatchOpt(canon, None, start, len(out)))
                j += 1
            continue
        break  # first non-option: the script
    ours = [t for t in argv[unsure_at:i] if _is_horus(t)] if unsure_at >= 0 else []
    if ours and horus is not None:
        name = unsure[0]
        errors.append(f"option --{name} is not sbatch's own and sbatch --help did not say whether it takes "
                      f"a value, so {ours[0].partition('=')[0]} after it may be hsubmit's or the script's: "
                      f"write --{name}=VALUE if it takes one, else put -- before the script (or give "
                      f"hsubmit's options before --{name})")
    return out, parsed, i, errors, hetjob, unsure


def _plugin_kind(name: str, plugin_opts: dict[str, bool] | None) -> str | None:
    """Whether the plugin option ``name`` takes a value (REQ or NONE), found by its exact name,
    else as an unambiguous prefix of one (and of none of sbatch's own), as getopt_long matches;
    None when sbatch could not say (``plugin_opts`` None) or lists no such option."""
    if plugin_opts is None:
        return None
    hits = [name] if name in plugin_opts else [o for o in plugin_opts if o.startswith(name)]
    if len(hits) != 1 or (hits[0] != name and any(o.startswith(name) for o in SBATCH_LONG_OPTS)):
        return None
    return REQ if plugin_opts[hits[0]] else NONE


def split_args(argv: list[str],
               plugin_options: Callable[[], dict[str, bool] | None] | None = None) -> SplitArgs:
    """Split a hsubmit command line into sbatch's options, horus's options and the script part;
    ``plugin_options``: {name: takes a value} of
    the options sbatch's SPANK plugins add, None when sbatch cannot say, called only when an
    unknown option needs it (it runs sbatch); without it such an option is ``unsure``."""
    horus: list[tuple[str, str | None]] = []

    def kind(name: str) -> str | None:
        return _plugin_kind(name, plugin_options() if plugin_options else None)

    out, parsed, i, errors, hetjob, unsure = _scan(list(argv), horus, kind, cmdline=True)
    return SplitArgs(out, horus, list(argv[i:]), parsed, hetjob, errors, unsure)


def help_request(opts: list[SbatchOpt]) -> str | None:
    """The first option (as ``--name=value``) whose value asks sbatch for a list, not a job:
    ``--gres=help`` or ``list``, and ``help`` in ``--hint`` or ``--mem-bind`` (any case;
    slurm_opt.c's arg_set_gres, proc_args.c's verify_hint and slurm_verify_mem_bind): sbatch
    prints the list and exits, submitting nothing; None when there is none.  sbatch acts on
    them only after reading its script (from stdin where none is named): such a call is
    sbatch's alone, nothing to predict and no script for hsubmit to read."""
    for o in opts:
        v = (o.value or "").lower()
        if (o.name == "gres" and v in ("help", "list")) or \
                (o.name in ("hint", "mem-bind") and "help" in re.split(r"[,;]", v)):
            return f"--{o.name}={o.value}"
    return None


def script_path(script: str, chdir: str | None, path_env: str | None, cwd: str) -> str:
    """The file sbatch reads for ``script`` (its search_path, 22.05 and 25.11): a name starting
    with '.' or '/' as given; any other first in the --chdir folder (the working folder without
    one), then along PATH, then as given.  A folder is no match; only existence is checked."""
    if script.startswith((".", "/")):
        return script
    base = os.path.join(cwd, chdir) if chdir else cwd
    for d in [base] + [x for x in (path_env or "").split(":") if x]:
        full = os.path.join(base, d, script) if d.startswith(".") else os.path.join(d, script)
        if os.path.exists(full) and not os.path.isdir(full):
            return full
    return script


def parse_sbatch_tokens(tokens: list[str]) -> list[SbatchOpt]:
    """sbatch options in a token list (a #SBATCH line's arguments), with canonical names."""
    return _scan(list(tokens), None)[1]


def env_flag(value: str | None) -> bool:
    """Whether an sbatch flag's environment variable (SBATCH_IGNORE_PBS) sets it,
    as slurm_process_option reads one: empty, "yes" or a non-zero integer; anything else
    (0, "no") resets it."""
    if value is None:
        return False
    m = re.fullmatch(r"[ \t\n\v\f\r]*[+-]?([0-9]+)", value)
    return value == "" or value.lower() == "yes" or (m is not None and int(m.group(1)) != 0)


def last_value(opts: list[SbatchOpt], name: str) -> str | None:
    """Value of the last occurrence of option ``name`` (canonical long name), or None."""
    for o in reversed(opts):
        if o.name == name:
            return o.value
    return None


def has_flag(opts: list[SbatchOpt], name: str) -> bool:
    return any(o.name == name for o in opts)


_C_SPACE = " \t\n\v\f\r"  # C's isspace(), which sbatch splits on
_HETJOB_WORDS = ("packjob", "hetjob")


def _hetjob_word_at(text: str, i: int) -> int:
    """Length of a hetjob/packjob word (any case) at ``text[i]`` that ends there, else 0."""
    for w in _HETJOB_WORDS:
        end = i + len(w)
        if text[i:end].lower() == w and (end == len(text) or text[end] in _C_SPACE):
            return len(w)
    return 0


def _directive_args(rest: str) -> list[str]:
    """Arguments of one directive line as sbatch's get_argument splits them (22.05 and 25.11):
    whitespace separates, ' and " group, a backslash makes the next character literal (inside
    quotes too), an unquoted '#' ends the line; a hetjob/packjob word, or an empty argument,
    ends the line's arguments as it does there (sbatch stops reading the line)."""
    rest = rest.split("\0", 1)[0]
    out: list[str] = []
    i, n = 0, len(rest)
    while True:
        while i < n and rest[i] in _C_SPACE:
            i += 1
        if i >= n or _hetjob_word_at(rest, i):
            return out
        arg: list[str] = []
        quote = ""
        while i < n and (quote or rest[i] not in _C_SPACE):
            c = rest[i]
            if c == "\\":
                i += 1
                if i < n and (quote or rest[i] == " " or rest[i] not in _C_SPACE):
                    arg.append(rest[i])
                    i += 1
                continue
            if quote:
                if c != quote:
                    arg.append(c)
                else:
                    quote = ""
            elif c in "\"'":
                quote = c
            elif c == "#":
                i = n  # the rest of the line is a comment
                break
            else:
                arg.append(c)
            i += 1
        if not arg:
            return out
        out.append("".join(arg))


@dataclass
class ScriptDirectives:
    """What a batch script's directives say: #SBATCH/#SLURM arguments, #HORUS arguments, whether
    the #SBATCH lines make a heterogeneous job, and the #PBS/#BSUB magic sbatch would translate
    (None when there is none, or when #SBATCH --ignore-pbs turns the translation off)."""

    sbatch: list[str]
    horus: list[str]
    hetjob: bool = False
    translated: str | None = None
    ended: bool = False  # a command line ended the block within the text read


def script_directives(text: str) -> ScriptDirectives:
    """The directives of a batch script, read like sbatch reads them: #SBATCH/#SLURM/#HORUS
    lines of the leading block of comment and blank lines (the first command line ends it);
    #PBS/#BSUB lines anywhere in the first 100 lines not starting with '#' (sbatch's xlate)."""
    sb: list[str] = []
    hz: list[str] = []
    het = False
    lines = text.split("\n")  # sbatch's lines: splitlines() also breaks at \f, \v, U+2028, ...
    ended = False
    for line in lines:
        if line.startswith(("#SBATCH", "#SLURM")):  # #SLURM: obsolete spelling sbatch still reads
            rest = line[len("#SBATCH" if line.startswith("#SBATCH") else "#SLURM"):]
            head = rest.lstrip(_C_SPACE)
            het = het or bool(_hetjob_word_at(head, 0))
            sb.extend(_directive_args(rest))
        elif line.startswith("#HORUS"):
            hz.extend(_directive_args(line[len("#HORUS"):]))
        else:
            s = line.lstrip(_C_SPACE)
            if s and not s.startswith("#"):
                ended = True
                break
    translated = None
    if not has_flag(parse_sbatch_tokens(sb), "ignore-pbs"):
        for magic in ("#BSUB", "#PBS"):  # sbatch tries them in this order, translates one
            non_comments = 0
            for line in lines:
                if line.startswith(magic):
                    translated = magic
                    break
                if not line.startswith("#"):
                    non_comments += 1
                    if non_comments > 100:
                        break
            if translated:
                break
    return ScriptDirectives(sb, hz, het, translated, ended)


def horus_directives(tokens: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """#HORUS arguments -> ([(name, value)], errors); only horus options are allowed there."""
    horus: list[tuple[str, str | None]] = []
    _, parsed, i, errors, _, _ = _scan(list(tokens), horus)
    for o in parsed:
        errors.append(f"#HORUS: unknown option {o.name.lstrip('?')}")
    if i < len(tokens):
        errors.append(f"#HORUS: unexpected argument {tokens[i]!r}")
    return horus, errors


# --------------------------------------------------------------------------------------------
# sbatch's request -> job_desc fields (as slurmctld's job_submit hook sees them in 22.05)
# --------------------------------------------------------------------------------------------

def gres_to_tres(gres: str | None) -> str | None:
    """``--gres=gpu:1,foo:2`` -> ``gres:gpu:1,gres:foo:2`` (22.05's tres_per_node spelling)."""
    if not gres or gres.lower() == "none":
        return None
    items = [g.strip() for g in gres.split(",") if g.strip()]
    return ",".join(g if g.startswith("gres:") else f"gres:{g}" for g in items)


def gpus_to_tres(gpus: str | None) -> str | None:
    """``--gpus=1`` / ``--gpus=a100:2`` -> ``gres:gpu:1`` / ``gres:gpu:a100:2``."""
    if not gpus:
        return None
    items = [g.strip() for g in gpus.split(",") if g.strip()]
    return ",".join(g if g.startswith("gres:") else f"gres:gpu:{g}" for g in items)
