"""The hsubmit flow as a library: read the job's request, predict, attach the hint, submit.

    plan = prepare(argv)                 # split args, read #SBATCH/#HORUS, find the request
    plan = predict(plan)                 # features + per-GPU-type predictions + hint (lazy onnx)
    explain_text(plan)                   # what --explain prints (runs the real hook in-process)
    plan.sbatch_argv                     # what goes to sbatch

Nothing here parses Slurm output itself: that is ``slurm.parse``; running commands is
``slurm.commands``. The graph, the predictors, the hint encoder and the hook runner are imported
inside the functions that use them: hsubmit without --model is plain sbatch and must start as
fast.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

from slurm_horus.slurm import sbatch_args as sa
from slurm_horus.errors import CONTROL_CHARS, HorusError, one_line, to_stderr
from slurm_horus.rounding import shown

__all__ = ["Plan", "prepare", "check_options", "request_unknown", "other_clusters", "asks_for_gpus", "requested_cpus_per_gpu", "predict", "job_desc_of", "explain_text", "on_prediction_error",
           "on_prediction_error_problem"]

MAX_STDIN_SCRIPT = 512 << 20  # sbatch's MAX_BATCH_SCRIPT_SIZE
DIRECTIVE_BYTES = 4 << 20  # what is read of a script for its #SBATCH/#HORUS block

# sbatch input environment variables that set request fields we read (22.05).
_ENV_OPTS = {
    "partition": "SBATCH_PARTITION", "gres": "SBATCH_GRES", "gpus": "SBATCH_GPUS",
    "constraint": "SBATCH_CONSTRAINT", "gpus-per-node": "SBATCH_GPUS_PER_NODE",
    "gpus-per-task": "SBATCH_GPUS_PER_TASK", "gpus-per-socket": "SBATCH_GPUS_PER_SOCKET",
    "cpus-per-gpu": "SBATCH_CPUS_PER_GPU", "mem-per-gpu": "SBATCH_MEM_PER_GPU",
    "tres-per-task": "SBATCH_TRES_PER_TASK", "gpu-freq": "SBATCH_GPU_FREQ", "account": "SBATCH_ACCOUNT",
    "gpu-bind": "SBATCH_GPU_BIND", "tres-bind": "SBATCH_TRES_BIND",
}


@dataclass
class Plan:
    argv: list[str]
    split: sa.SplitArgs
    script_text: str | None = None          # the batch script, if read
    stdin_script: bytes | None = None       # the script read from stdin (must be re-fed to sbatch)
    script_unread: bool = False             # a script hsubmit could not read (a pipe sbatch must
    #                                         read itself, once; no such file; no access; typed at
    #                                         a terminal)
    script_hetjob: bool = False             # its #SBATCH lines make a heterogeneous job
    directives_cut: bool = False            # its #SBATCH block runs past DIRECTIVE_BYTES
    script_translated: str | None = None    # its #PBS/#BSUB directives, which sbatch translates
    answers_only: bool = False              # --help, --usage, --version: sbatch submits nothing
    script_opts: list[sa.SbatchOpt] = field(default_factory=list)
    horus: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # filled by predict()
    partition: str | None = None
    gpu_types: dict[str, int] = field(default_factory=dict)
    report: object = None
    predictions: dict[str, object] = field(default_factory=dict)
    predictor_note: str = ""
    hint: str | None = None
    comment: str | None = None

    @property
    def model(self) -> str | None:
        return self.horus.get("model")  # type: ignore[return-value]

    @property
    def explain(self) -> bool:
        return bool(self.horus.get("explain"))

    @property
    def quiet(self) -> bool:
        """sbatch -Q (--quiet, #SBATCH -Q): errors only, hsubmit's warnings too.  There is no
        SBATCH_QUIET: neither 22.05's sbatch nor 25.11's reads one."""
        return sa.has_flag(self.split.parsed, "quiet") or sa.has_flag(self.script_opts, "quiet")

    def request(self, name: str) -> str | None:
        """A request field as sbatch resolves it: command line > environment > #SBATCH."""
        v = sa.last_value(self.split.parsed, name)
        if v is not None:
            return v
        env = _ENV_OPTS.get(name)
        if env and env in self.env:  # set but empty too: sbatch applies it over #SBATCH
            return self.env[env]
        return sa.last_value(self.script_opts, name)

    def user_comment(self) -> str | None:
        v = sa.last_value(self.split.parsed, "comment")
        return v if v is not None else sa.last_value(self.script_opts, "comment")

    @property
    def sbatch_argv(self) -> list[str]:
        comment = self.comment if self.comment is not None and self.hint is not None else None
        return self.split.sbatch_argv(replace_comment=comment)


def _horus_dict(pairs: list[tuple[str, str | None]], into: dict) -> None:
    for name, value in pairs:
        if name == "dim":
            into.setdefault("dim", []).append(value)
        elif name in ("explain", "horus-probe"):
            into[name] = True
        else:
            into[name] = value


def _plugin_options() -> dict[str, bool] | None:
    from slurm_horus.slurm import commands

    return commands.sbatch_plugin_options()


def prepare(argv: list[str], env: dict[str, str] | None = None,
            stdin=None) -> Plan:
    """Split ``argv`` and read the script's directives.  ``stdin`` (a binary file) is read for
    the script when there is no script path, no --wrap and no --external, and the command line
    has a horus option; without it (None: a terminal, or closed) such a script is unread."""
    env = dict(os.environ if env is None else env)
    split = sa.split_args(argv, plugin_options=_plugin_options)
    if split.errors:
        raise HorusError(split.errors[0])
    plan = Plan(list(argv), split, env=env)
    cmd_horus: dict = {}
    _horus_dict(split.horus, cmd_horus)
    wrap = sa.has_flag(split.parsed, "wrap")
    text = None
    answers_only = plan.answers_only = any(sa.has_flag(split.parsed, f) for f in ("help", "usage", "version"))
    if not wrap and not answers_only:
        if split.script:
            # the file sbatch will read: -D's folder, PATH, then the working folder
            try:  # a regular file only: a pipe (<(...), /dev/stdin) is sbatch's to read, once
                # (a working folder that was removed: sbatch says "getcwd failed")
                path = sa.script_path(split.script, sa.last_value(split.parsed, "chdir"), env.get("PATH"),
                                      os.getcwd())
                if stat.S_ISREG(os.stat(path).st_mode):
                    with open(path, "rb") as f:
                        text = _directive_text(plan, f.read(DIRECTIVE_BYTES + 1))
                else:
                    plan.script_unread = True
            except OSError:  # sbatch will say what is wrong with it (or the script is another
                plan.script_unread = True  # word: an option sbatch reads in a way we do not)
        elif not sa.has_flag(split.parsed, "external"):  # sbatch reads no script with --external
            # read where the command line has horus options (a #HORUS line may name the model
            # their --task belongs to), not for plain sbatch use: sbatch reads no stdin when it
            # refuses an option, and hsubmit must not wait where it returns
            if stdin is None:  # a terminal (or closed): sbatch reads it, hsubmit cannot first
                plan.script_unread = True
            elif cmd_horus and not split.unsure:  # unsure: no hint, and the script may be a path
                try:
                    data = _read_at_most(stdin, MAX_STDIN_SCRIPT + 1)
                except OSError as e:  # "< /tmp": sbatch's read fails too ("Batch script is empty!", exit 1)
                    err = HorusError(f"cannot read the batch script from standard input: {e.strerror or e}")
                    err.exit_code = 1
                    raise err from None
                if len(data) > MAX_STDIN_SCRIPT:  # sbatch's own limit: it would refuse it too
                    raise HorusError(f"script from stdin is too big (over {MAX_STDIN_SCRIPT >> 20} MiB, "
                                     "sbatch's limit)")
                plan.stdin_script = data
                # the directives come first: a 512 MiB script decoded whole took 1.5 GB
                text = _directive_text(plan, data[:DIRECTIVE_BYTES + 1])
    plan.script_text = text
    horus: dict = {}
    if text is not None:
        d = sa.script_directives(text)
        # sbatch sets --ignore-pbs (command line, SBATCH_IGNORE_PBS) before it translates
        ignore_pbs = sa.has_flag(split.parsed, "ignore-pbs") or sa.env_flag(env.get("SBATCH_IGNORE_PBS"))
        plan.script_hetjob, plan.script_translated = d.hetjob, None if ignore_pbs else d.translated
        plan.directives_cut = plan.directives_cut and not d.ended
        plan.script_opts = sa.parse_sbatch_tokens(d.sbatch)
        pairs, errs = sa.horus_directives(d.horus)
        for e in errs:
            plan.warnings.append(f"{e} (ignored)")
        _horus_dict(pairs, horus)
        if horus.pop("explain", None):  # a script is to be submitted: only the command line
            plan.warnings.append("#HORUS --explain is ignored (on the command line it shows the "
                                 "decision and submits nothing)")
    # the command line wins; --dim values add up with #HORUS ones, the command line's last
    dims = horus.pop("dim", []) + cmd_horus.pop("dim", [])
    horus.update(cmd_horus)
    if dims:
        horus["dim"] = dims
    unused = [k for k in horus if k not in ("explain", "horus-probe")]
    if "model" not in horus and unused and not answers_only:
        # sbatch would refuse them (--task train is its --tasks-per-node): dropped, not passed on
        plan.warnings.append(f"{', '.join('--' + k for k in unused)} ignored: no --model on the command "
                             "line or in #HORUS lines hsubmit could read; submitting the job unchanged")
    plan.horus = horus
    if horus.get("horus-probe"):  # drop-in scripts keep working
        plan.warnings.append("--horus-probe is ignored: the site's Prolog measures every job")
    return plan


def _directive_text(plan: Plan, head: bytes) -> str:
    """The script's first DIRECTIVE_BYTES (``head``: one byte more, where the script has it) as
    text, without a line the cut halves: its last #SBATCH --comment had been read cut short and
    sent in place of the script's whole one.  plan.directives_cut: the script goes on."""
    plan.directives_cut = len(head) > DIRECTIVE_BYTES
    if plan.directives_cut:
        head = head[:head.rfind(b"\n", 0, DIRECTIVE_BYTES) + 1]
    return head.decode("utf-8", "surrogateescape")


def _read_at_most(stream, limit: int) -> bytes:
    """Up to ``limit`` bytes, a MiB at a time: read(limit) reserved the whole 512 MiB first,
    a MemoryError under a login node's ulimit -v.  A non-blocking stream with nothing yet
    (read gives None) is waited on: it had ended the script there, and sbatch got its head."""
    parts, n = [], 0
    while n < limit:
        chunk = stream.read(min(1 << 20, limit - n))
        if chunk is None:
            select.select([stream], [], [])
            continue
        if not chunk:
            break
        parts.append(chunk)
        n += len(chunk)
    return b"".join(parts)


_BATCH_NAMES = ("batch", "batch_size", "batchsize", "bs")


def check_options(plan: Plan):
    """(Workload, dims) of hsubmit's own options (command line and #HORUS lines).  A value they
    cannot take (--precision fp8, --batch-size -3, --dim seq=x, an empty one) is a HorusError, as sbatch
    refuses its own options' bad values: hsubmit stops before anything is submitted, where a
    model that cannot be used later only costs the job its hint."""
    from slurm_horus.graph.load import parse_dims

    dims = parse_dims(tuple(plan.horus.get("dim", [])))  # type: ignore[arg-type]
    return _workload(plan, dims), dims


def _workload(plan: Plan, dims: dict[str, int]):
    """The job's Workload from its horus options and the CPUs per GPU it asks for
    (requested_cpus_per_gpu: None, the model's "unknown", where that cannot be told; sync
    records what Slurm allocated).  Without --batch-size, a batch dimension bound with --dim is
    the batch size."""
    from slurm_horus.graph.load import MAX_DIM
    from slurm_horus.predict.coldstart import OPTIMIZERS, PRECISIONS, TASKS
    from slurm_horus.predict.workload import workload_from

    h = plan.horus
    # given but empty (an unset variable): an error, never the default (workload_from's "missing")
    for key, allowed in (("task", TASKS), ("optimizer", OPTIMIZERS), ("precision", PRECISIONS)):
        if h.get(key) is not None and not str(h[key]).strip():
            raise HorusError(f"--{key} is empty (an unset variable?): choose one of {', '.join(allowed)}")
    bs = (h.get("batch-size") or "").strip()
    if h.get("batch-size") is not None and not (bs.isascii() and bs.isdigit() and len(bs) <= 10
                                                and 0 < int(bs) <= MAX_DIM):
        raise HorusError(f"--batch-size {one_line(bs)[:40]!r}: need an integer from 1 to {MAX_DIM}")
    # only the plain batch names: "n" or "b" may be another axis, which the loader judges
    named = {k: v for k, v in dims.items() if k.lower() in _BATCH_NAMES}
    for k, v in named.items():
        if bs and v != int(bs):
            raise HorusError(f"--dim {k}={v} contradicts --batch-size {bs}")
    if not bs and len(set(named.values())) == 1 and next(iter(named.values())) > 0:
        bs = str(next(iter(named.values())))
    return workload_from({"batch_size": bs or None, "task": h.get("task"),
                          "optimizer": h.get("optimizer"), "precision": h.get("precision"),
                          "cpus_per_gpu": requested_cpus_per_gpu(plan)})


def requested_cpus_per_gpu(plan: Plan) -> float | None:
    """The CPUs per GPU the job asks for (all hsubmit knows before submission; the learned
    model trains on what Slurm allocated, docs/ledger.md): its --cpus-per-gpu as sbatch
    resolves it (_cpus_per_gpu_option), else its CPUs per task (_cpus_per_task) times its tasks
    (-n, else --ntasks-per-node times its nodes, else --ntasks-per-gpu times its GPUs, else one
    a node) over the GPUs it asks for (_gpu_requests, as the hook reads them).  None where that
    cannot be told: no whole GPU (a CPU job, shards), a count sbatch will refuse, GPUs per
    socket, GPUs per node of a job whose tasks may span nodes, or a node range (-N 1-4) the
    figure depends on."""
    from slurm_horus.predict.workload import cpus_per_gpu

    given = _cpus_per_gpu_option(plan)
    if given is not None:
        return cpus_per_gpu(_count(given), 1)
    jd = job_desc_of(plan)
    reqs = _gpu_requests(jd)
    cpt = _cpus_per_task(plan)
    tasks = jd.get("num_tasks")
    per_node = plan.request("ntasks-per-node")
    if per_node is not None:
        per_node = _count(per_node) or None
        if per_node is None:
            return None  # sbatch refuses it
    if not reqs or cpt is None or (tasks is None and plan.request("ntasks") is not None):
        return None
    if plan.request("nodes") is not None:
        if "min_nodes" not in jd or "max_nodes" not in jd:
            return None  # a count sbatch refuses (or one with a suffix: unknown here)
        nodes = {jd["min_nodes"], jd["max_nodes"]}
    elif tasks is not None and per_node is not None:
        nodes = {-(-tasks // per_node)}  # the nodes Slurm gives -n at --ntasks-per-node each
    else:
        nodes = {1 if tasks is None or tasks <= 1 else None}  # None: tasks that may span nodes
    figures = {_cpus_per_gpu_on(jd, reqs, cpt, tasks, per_node, n) for n in nodes}
    return figures.pop() if len(figures) == 1 else None


def _cpus_per_gpu_on(jd: dict, reqs: dict[str, list[dict]], cpt: int, tasks: int | None,
                     per_node: int | None, nodes: int | None) -> float | None:
    """requested_cpus_per_gpu's figure where the job gets ``nodes`` nodes (None: unknown;
    rounded, so that a node range whose ends give the same figure gives one)."""
    from slurm_horus.predict.workload import cpus_per_gpu

    if tasks is None and per_node is not None:
        tasks = per_node * nodes  # nodes is known: -N, or one
    count = {k: sum(g["count"] for g in items) for k, items in reqs.items()}
    if "tres_per_job" in count:
        gpus = count["tres_per_job"]
    elif "tres_per_node" in count and nodes is not None:
        gpus = count["tres_per_node"] * nodes
    elif "tres_per_task" in count:
        gpus = count["tres_per_task"] * (tasks if tasks is not None else nodes)
    else:
        return None  # GPUs per socket (the sockets are the nodes' to say), or per node of nodes unknown
    if tasks is None:
        tasks = jd["ntasks_per_tres"] * gpus if jd.get("ntasks_per_tres") else nodes
    ratio = cpus_per_gpu(cpt * tasks, gpus)
    if ratio is None or round(ratio, 6) == 0:  # 0: GPUs past counting
        return None
    return round(ratio, 6)


def _cpus_per_task(plan: Plan) -> int | None:
    """The CPUs per task the job asks for: -c, else --tres-per-task's cpu (23.02+), else
    Slurm's default, one; None for a value sbatch refuses."""
    c = plan.request("cpus-per-task")
    if c is not None:
        return _count(c)
    m = re.search(r"(?:^|,)\s*cpu[=:]([^,]*)", plan.request("tres-per-task") or "")
    return _count(m.group(1)) if m else 1


def _cpus_per_gpu_option(plan: Plan) -> str | None:
    """--cpus-per-gpu as sbatch resolves it (command line > environment > script): the
    environment's SBATCH_CPUS_PER_GPU is dropped where a -c (or --tres-per-task=cpu) is on the
    command line or in the script (slurm_opt.c's _validate_cpus_per_tres), and the script's
    value with it, which the environment's had replaced."""
    cli = sa.last_value(plan.split.parsed, "cpus-per-gpu")
    if cli is not None:
        return cli
    if plan.env.get(_ENV_OPTS["cpus-per-gpu"]):
        cpus_given = plan.request("cpus-per-task") is not None or "cpu" in (plan.request("tres-per-task") or "")
        return None if cpus_given else plan.env[_ENV_OPTS["cpus-per-gpu"]]
    return sa.last_value(plan.script_opts, "cpus-per-gpu")


def request_unknown(plan: Plan) -> str | None:
    """Why the job's request cannot be known before sbatch reads it (then whether it asks for
    a GPU cannot be told either), or None."""
    if plan.split.unsure:  # where the script starts, and what is an option's value, is a guess
        name = plan.split.unsure[0]
        return (f"option --{name} is not sbatch's own, and sbatch --help did not settle whether "
                f"the word after it is its value: no hint is attached (--{name}=VALUE settles "
                "it if it takes one, -- before the script if it takes none)")
    if plan.directives_cut:  # sbatch reads the block whole; a directive past the cut is unknown
        return (f"the #SBATCH lines of script {plan.split.script or '(stdin)'} run past the first "
                f"{DIRECTIVE_BYTES >> 20} MiB hsubmit reads: they are unknown, so no hint is attached")
    if plan.script_unread:  # its #SBATCH lines (a --comment, the partition) are unknown
        where = (f"script {plan.split.script} could not be read as a regular file before sbatch reads it"
                 if plan.split.script else "a script typed at the terminal is read by sbatch alone")
        return f"{where}: its #SBATCH lines are unknown, so no hint is attached"
    return None


def other_clusters(plan: Plan) -> str | None:
    """The clusters the job is sent to (-M/--clusters as sbatch resolves it: command line >
    SLURM_CLUSTERS > SBATCH_CLUSTERS > #SBATCH), when they are not just this one; else None.
    hsubmit reads this cluster's partitions: a hint for types another cluster's partition
    lacks pins the job to a type it can never get there."""
    from slurm_horus.slurm.commands import local_cluster

    def last(opts):
        return next((o.value for o in reversed(opts) if o.name in ("clusters", "cluster")), None)

    given = last(plan.split.parsed)
    if given is None:
        given = plan.env.get("SLURM_CLUSTERS", plan.env.get("SBATCH_CLUSTERS"))
    if given is None:
        given = last(plan.script_opts)
    names = {c.strip().lower() for c in (given or "").split(",") if c.strip()}  # as sbatch reads them
    return None if not names or names == {local_cluster()} else given


def predict(plan: Plan, gpu_types: dict[str, int] | None = None,
            partition: str | None = None) -> Plan:
    """Features, predictions per GPU type of the target partition, the hint and the merged
    comment.  ``gpu_types`` / ``partition`` skip asking Slurm (tests).  Raises HorusError."""
    from slurm_horus.graph.features import extract_features
    from slurm_horus.predict.gpus import default_catalog
    from slurm_horus.slurm.hint import MAX_SLURM_COMMENT, attach_tokens, parse_workload
    from slurm_horus.predict.chain import choose_predictor, predict_for

    model = plan.model
    if model is None:
        raise HorusError("no --model")
    if not model.strip():
        raise HorusError("--model is empty (an unset variable?)")
    model_dir = plan.horus.get("horus-model-dir")
    if model_dir is not None and not str(model_dir).strip():  # "" would be the site's registry
        raise HorusError("--horus-model-dir is empty (an unset variable?)")
    if why := request_unknown(plan):
        raise HorusError(why)
    if other := other_clusters(plan):
        raise HorusError(f"the job goes to cluster {other}: hsubmit predicts for this cluster's "
                         "partitions only, so no hint is attached")
    path = Path(str(model))
    try:
        exists, regular = path.exists(), path.is_file()
    except OSError as e:  # a name too long for the system
        raise HorusError(f"model {model}: {e.strerror or e}") from None
    if not exists:
        raise HorusError(f"model {model}: no such file")
    if not regular:
        raise HorusError(f"model {model}: not a regular file")
    if not os.access(path, os.R_OK):
        raise HorusError(f"model {model}: not readable")
    workload, dims = check_options(plan)
    try:
        report = extract_features(path, batch_size=workload.batch_size, dims=dims)
    except HorusError as e:
        msg = str(e)
        raise HorusError(msg if str(model) in msg else f"model {model}: {msg}") from None
    except Exception as e:  # onnx/protobuf failures on a non-ONNX file
        raise HorusError(f"model {model}: not a readable ONNX model ({type(e).__name__})") from None
    report.require_bound()  # sizes taken as 1 would understate the job: attach no hint
    plan.report = report
    plan.warnings.extend(report.warnings())
    if not plan.horus.get("batch-size") and any(k not in dims for k in report.bound_dims):
        plan.warnings.append("no --batch-size: predicted for batch 1 (give the batch size the "
                             "job trains or infers with)")
    if gpu_types is None:
        from slurm_horus.slurm import commands as slurm

        plan.partition, gpu_types = slurm.partition_gpu_types(partition or plan.request("partition"))
    else:
        plan.partition = partition or plan.request("partition")
    plan.gpu_types = dict(gpu_types)
    if not gpu_types:
        raise HorusError(f"partition {plan.partition}: no typed GPUs (Gres=gpu:<type>:N)")
    offered = {g.lower() for g in gpu_types}
    missing = sorted(t for t in _requested_gpu_types(plan) if t.lower() not in offered)
    if missing:
        # the hook then says it does not know the type: the cause is the partition's nodes
        plan.warnings.append(f"GPU type {', '.join(missing)} requested, but partition {plan.partition} "
                             f"has {', '.join(sorted(gpu_types))}: Slurm will likely refuse the job")
    catalog = default_catalog()
    gpus, names = [], []
    for gtype in sorted(gpu_types):
        gpu = catalog.find(gtype)
        if gpu is None:
            plan.warnings.append(f"GPU type {gtype} not in the GPU catalog: no prediction for it")
            continue
        if workload.precision == "bf16" and not gpu.has_bf16:
            # the job cannot run bf16 there: the hint leaves the type out (all of it had been
            # lost, the types that can run it too), and the hook pins one it names
            plan.warnings.append(f"GPU type {gtype} ({gpu.name}) has no bf16: no prediction for it")
            continue
        gpus.append(gpu)
        names.append(gtype)
    if not gpus:
        raise HorusError(f"partition {plan.partition}: no GPU type the catalog knows"
                         + (" that runs bf16" if workload.precision == "bf16" else ""))
    choice = choose_predictor(model_dir)
    if choice.warning:
        plan.warnings.append(choice.warning)
    plan.predictor_note = choice.note
    preds = predict_for(report, gpus, workload, choice)
    plan.predictions = dict(zip(names, preds))
    if all(p.mem_mib > g.mem_mib for p, g in zip(preds, gpus)):  # not even a whole GPU holds it
        largest = max(gpus, key=lambda g: g.mem_mib)
        plan.warnings.append(f"predicted memory {shown(min(p.mem_mib for p in preds), 0):,.0f} MiB or more is above "
                             f"every GPU type of partition {plan.partition} (the largest, {largest.name}, "
                             f"has {largest.mem_mib:,} MiB): the job will likely run out of GPU memory "
                             "(a smaller --batch-size, another partition, or more GPUs)")
    plan.hint = _hint_of(plan.predictions, plan.warnings)
    # what sync needs to recompute the features itself, as the admin
    job = {"sha": report.sha256, "bs": workload.batch_size, "task": workload.task,
           "opt": workload.optimizer, "prec": workload.precision, "dims": dims,
           "model": os.path.abspath(str(model))}
    try:
        job["model"].encode("utf-8")
        unreadable = "has control characters" if CONTROL_CHARS.search(job["model"]) else None
    except UnicodeEncodeError:
        unreadable = "is not UTF-8 text"
    if unreadable:  # a token naming it could not be read back (parse_workload): all of it was lost
        del job["model"]
        plan.warnings.append(f"the model's path {unreadable}: the job is submitted without "
                             "it, so the site cannot measure this graph's features")
    plan.comment = attach_tokens(plan.user_comment(), plan.hint, job)
    if plan.comment is None:
        plan.hint = None
        plan.warnings.append(f"no room for the hint in Slurm's {MAX_SLURM_COMMENT}-character "
                             "comment beside yours: submitting the job without it")
    elif "model" in job and "model" not in (sent := parse_workload(plan.comment) or {}):
        # sync needs the path to measure the graph's features itself: the run teaches nothing
        what = "the model's path" if sent else "the job's workload (batch size, task, model path)"
        plan.warnings.append(f"no room for {what} in Slurm's {MAX_SLURM_COMMENT}-character comment "
                             "beside yours: the job is submitted without it, so the site cannot "
                             "learn from this run (a shorter --comment)")
    return plan


_TRES_KEYS = ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")


def asks_for_gpus(plan: Plan) -> bool:
    """Does the job ask for a GPU (or shards) in any form sbatch reads (command line,
    environment, #SBATCH lines)?  A CPU job is left alone by the hook, and a hint would make
    it a GPU job in the ledger.  A count of 0 (--gres=gpu:0, a template's way to ask for
    none) asks for nothing, as the hook reads it."""
    jd = job_desc_of(plan)
    return any(_asks_for_some(item) for k in _TRES_KEYS for item in (jd.get(k) or "").split(","))


def _asks_for_some(item: str) -> bool:
    """Whether one item of a TRES string names GPUs or shards, other than a count of 0."""
    from slurm_horus.slurm.parse import parse_gres

    if "gpu" not in item and "shard" not in item:
        return False
    try:
        [g] = parse_gres(item)
    except (HorusError, ValueError, IndexError, TypeError):
        return True  # what does not read as GRES is sbatch's to judge
    return not (g["name"] in ("gpu", "shard") and g["count"] == 0)


def _requested_gpu_types(plan: Plan) -> set[str]:
    """The GPU types the job names itself (--gres=gpu:TYPE:N, --gpus[-per-*]=TYPE:N), from the
    TRES strings the hook sees (job_desc_of); what does not read as such is sbatch's to judge."""
    reqs = _gpu_requests(job_desc_of(plan)) or {}
    return {g["type"] for items in reqs.values() for g in items if g["type"]}


def _gpu_requests(jd: dict) -> dict[str, list[dict]] | None:
    """The whole GPUs a job_desc (job_desc_of) asks for: per TRES field (_TRES_KEYS) that asks
    for some, its gpu items as parse_gres reads them ({name, type, count, idx}); None where a
    field does not read as GRES (sbatch's to judge)."""
    from slurm_horus.slurm.parse import parse_gres

    out: dict[str, list[dict]] = {}
    try:
        for key in _TRES_KEYS:
            items = [g for g in parse_gres(jd.get(key)) if g["name"] == "gpu"]
            if items:
                out[key] = items
    except (HorusError, ValueError, IndexError, TypeError):
        return None
    return out


def _hint_of(predictions: dict, warnings: list[str] | None = None) -> str:
    """The hint token: p95 (and p99) memory where calibrated (for policies that ask for them),
    dropped when the token would not fit: what horus predict's fit column reads too.  A GPU type
    whose own figures no hint carries (NaN, past MAX_MEM_MIB) is left out, with a warning in
    ``warnings``, so that it does not cost the other types theirs (the hook pins the job to a
    type the hint names); HorusError, as encode_hint says, where every type is such. A type
    whose p95/p99 alone are past them goes without its own bounds (every type's had been
    dropped)."""
    from slurm_horus.slurm.hint import encode_hint

    def fields(p, bounds: bool):
        mem = max(p.mem_mib, 0.0)
        out = [min(max(p.util_pct, 0.0), 100.0), mem, max(p.mem_mib_p90, mem)]
        if bounds and p.mem_mib_p95 is not None:  # p95 alone where only it is calibrated
            out.append(max(p.mem_mib_p95, out[2]))
            if p.mem_mib_p99 is not None:
                out.append(max(p.mem_mib_p99, out[3]))
        return tuple(out)

    carried, bounded, left_out = {}, set(), []
    for gtype, p in predictions.items():
        try:
            encode_hint({gtype: fields(p, False)})
            carried[gtype] = p
        except HorusError as e:
            left_out.append(f"{e}: the hint leaves {gtype} out (the other GPU types keep theirs)")
            continue
        try:  # its own p95/p99 past what a hint carries cost it alone its bounds
            encode_hint({gtype: fields(p, True)})
            bounded.add(gtype)
        except HorusError:
            pass
    if not carried:
        carried = predictions  # no hint: encode_hint says why, as it always did
    elif warnings is not None:
        warnings.extend(left_out)
    try:
        return encode_hint({g: fields(p, g in bounded) for g, p in carried.items()})
    except HorusError:
        return encode_hint({g: fields(p, False) for g, p in carried.items()})


def job_desc_of(plan: Plan) -> dict:
    """The job_desc fields slurmctld 22.05's job_submit hook sees for this request."""
    tpn = [sa.gres_to_tres(plan.request("gres"))]
    gpn = plan.request("gpus-per-node")
    if gpn:
        tpn.append(sa.gpus_to_tres(gpn))
    jd: dict = {
        "tres_per_node": ",".join(t for t in tpn if t) or None,
        "tres_per_job": sa.gpus_to_tres(plan.request("gpus")),
        # --tres-per-task=gres/gpu:1 (sbatch 23.02+) as the hook sees it, beside --gpus-per-task
        "tres_per_task": ",".join(filter(None, (sa.gpus_to_tres(plan.request("gpus-per-task")),
                                                plan.request("tres-per-task")))) or None,
        "tres_per_socket": sa.gpus_to_tres(plan.request("gpus-per-socket")),
        "features": plan.request("constraint"),
        "partition": plan.partition or plan.request("partition"),
        "comment": plan.comment if plan.hint else plan.user_comment(),
        "account": plan.request("account") or None,
    }
    cpg = _cpus_per_gpu_option(plan)
    if cpg:
        jd["cpus_per_tres"] = f"gres:gpu:{cpg}"
    mpg = plan.request("mem-per-gpu")
    if mpg:
        jd["mem_per_tres"] = f"gres:gpu:{mpg}"
    nodes = plan.request("nodes")
    if nodes:
        lo, _, hi = nodes.partition("-")
        jd["min_nodes"] = _count(lo)  # None (dropped below) for what sbatch would refuse
        if jd["min_nodes"] is not None:
            jd["max_nodes"] = _count(hi) if hi else jd["min_nodes"]  # -N 1 is 1-1
    jd["req_nodes"] = plan.request("nodelist")
    jd["exc_nodes"] = plan.request("exclude")
    jd["shared"] = _shared(plan)
    # the hook reads the script's srun lines (a step asking for GPUs by name fails on shards)
    wrap = sa.last_value(plan.split.parsed, "wrap")
    jd["script"] = (f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{wrap}\n"
                    if wrap is not None else plan.script_text)
    # Slurm refuses a GPU frequency beside shards: the hook leaves such a job whole
    freq = plan.request("gpu-freq")
    if freq is not None:
        jd["tres_freq"] = f"gpu:{freq}"
    # and 25.11 gives a job on shards with a GPU binding no GPU in its steps: left whole too
    jd["tres_bind"] = _tres_bind(plan)
    env = _step_gpu_environment(plan)
    if env and jd["script"]:
        jd["environment"] = env
    # the task counts the hook decides on too (a GPU per job of several tasks may span nodes)
    for opt, key in (("ntasks", "num_tasks"), ("ntasks-per-gpu", "ntasks_per_tres")):
        n = _count(plan.request(opt) or "")
        if n is not None:
            jd[key] = n
    # without -n, 22.05's sbatch sends its nodes times --ntasks-per-node as the task count (seen
    # on the local cluster: --ntasks-per-node=2 alone reached the hook as 2 tasks; 25.11's sends none)
    per_node = _count(plan.request("ntasks-per-node") or "")
    if per_node and plan.request("ntasks") is None and jd.get("min_nodes", 1) == jd.get("max_nodes", 1):
        jd["num_tasks"] = jd.get("min_nodes", 1) * per_node
    return {k: v for k, v in jd.items() if v is not None}


def _tres_bind(plan: Plan) -> str | None:
    """job_desc.tres_bind as sbatch 25.11 sets it (slurm_opt.c): --gpu-bind=X sets it to
    gres/gpu:X and --tres-bind=Y to Y, each over the other's, so the last of either that sbatch
    reads wins: the #SBATCH lines, then the environment (SBATCH_GPU_BIND, then
    SBATCH_TRES_BIND: the order of sbatch's table), then the command line."""
    names = ("gpu-bind", "tres-bind")
    read = [(o.name, o.value) for o in plan.script_opts if o.name in names]
    read += [(n, plan.env[_ENV_OPTS[n]]) for n in names if _ENV_OPTS[n] in plan.env]
    read += [(o.name, o.value) for o in plan.split.parsed if o.name in names]
    if not read or read[-1][1] is None:
        return None
    name, value = read[-1]
    return f"gres/gpu:{value}" if name == "gpu-bind" else value


# what sbatch puts in a job's environment for its GPU options, which srun steps read as their own
_STEP_GPU_OPTIONS = {"gpus": "SLURM_GPUS", "gpus-per-node": "SLURM_GPUS_PER_NODE",
                     "gpus-per-socket": "SLURM_GPUS_PER_SOCKET", "gpus-per-task": "SLURM_GPUS_PER_TASK",
                     "cpus-per-gpu": "SLURM_CPUS_PER_GPU", "mem-per-gpu": "SLURM_MEM_PER_GPU",
                     "ntasks-per-gpu": "SLURM_NTASKS_PER_GPU"}


# the names srun reads as its own GPU options, each also with its het group's suffix (the hook's
# env_asks_for_gpus): the submitting shell's, which sbatch passes on
_STEP_GPU_ENV = re.compile("(?:{})(?:_(?:HET|PACK)_GROUP_[0-9]+)?".format(
    "|".join((*_STEP_GPU_OPTIONS.values(), "SLURM_GRES", "SLURM_TRES_PER_TASK", "SLURM_GPU_BIND",
              "SLURM_TRES_BIND"))))  # 25.11 srun's --tres-bind (sbatch writes it for a --gpu-bind)


def _step_gpu_environment(plan: Plan) -> dict[str, str]:
    """The variables of the job's environment the hook reads (a step asking for GPUs fails in a
    job on shards): sbatch's for the job's GPU options, and the submitting shell's own (hsubmit
    run inside another job's allocation, a het one's SLURM_GPUS_PER_NODE_HET_GROUP_0 too),
    which sbatch passes on."""
    env = {v: x for v, x in plan.env.items() if x and _STEP_GPU_ENV.fullmatch(v)}
    for opt, var in _STEP_GPU_OPTIONS.items():
        value = plan.request(opt)
        if value:
            env[var] = value
    return env


# job_desc.shared as sbatch sets it: --oversubscribe, --exclusive[=user|mcs|topo]
_SHARED = {"oversubscribe": 1, "exclusive": 0, "exclusive=user": 2, "exclusive=mcs": 3, "exclusive=topo": 4}


def _shared(plan: Plan) -> int | None:
    """The last of --exclusive / --oversubscribe sbatch reads (command line, then
    SBATCH_EXCLUSIVE, then #SBATCH lines), as job_desc.shared; None when neither is given."""
    def last(opts):
        for o in reversed(opts):
            if o.name in ("exclusive", "oversubscribe"):
                return _SHARED.get(o.name if o.name == "oversubscribe" or not o.value else f"exclusive={o.value}")
        return None
    found = last(plan.split.parsed)
    if found is None and plan.env.get("SBATCH_EXCLUSIVE") is not None:
        v = plan.env["SBATCH_EXCLUSIVE"]
        found = _SHARED.get(f"exclusive={v}" if v else "exclusive")
    return found if found is not None else last(plan.script_opts)


def _count(s: str) -> int | None:
    """A count sbatch would take (32-bit), else None: sbatch itself refuses the rest (a
    string of thousands of digits too, before int() is asked to read it)."""
    s = s.strip()
    return int(s) if len(s) <= 10 and s.isascii() and s.isdigit() and int(s) < 2 ** 31 else None


def _hook_paths(env: dict[str, str]) -> tuple[str | None, str]:
    """(hook, policy) slurmctld uses: the job_submit.lua next to $SLURM_CONF (else
    /etc/slurm/slurm.conf) when there, and the policy the hook itself would read."""
    from slurm_horus.slurm.policy import policy_file

    hook = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent / "job_submit.lua"
    hook_path = str(hook) if hook.is_file() else None
    return hook_path, str(policy_file(env=env, hook_path=hook_path))


def decision_of(plan: Plan):
    """The hook's decision as slurmctld will take it, which for a job without -A reads the
    claim record under the user's default account (sacctmgr's; unknown: none, as before)."""
    from slurm_horus.slurm import commands
    from slurm_horus.slurm.policy import decide

    hook, pol = _hook_paths(plan.env)
    jd = job_desc_of(plan)
    if not jd.get("account"):
        acct = commands.default_account()
        if acct:
            jd["default_account"] = acct
    return decide(jd, policy_path=pol, hook_path=hook)


def explain_text(plan: Plan) -> str:
    lines = []
    r = plan.report
    if r is not None:
        v = r.values
        lines.append(f"model: {plan.model} (batch {int(v.get('batch_size', 1))}"
                     + (f", dims {r.bound_dims}" if r.bound_dims else "") + ")")
        lines.append(f"features: {v['flops'] / 1e9:.2f} GFLOP/step, {v['params'] / 1e6:.2f} M params, "
                     f"{v['activation_bytes'] / 2**20:.0f} MiB activations, "
                     f"{int(v['kernels'])} kernels, depth {int(v['depth'])}")
        w, _ = check_options(plan)
        lines.append(f"workload: task={w.task} optimizer={w.optimizer} precision={w.precision}"
                     f" cpus_per_gpu={'-' if w.cpus_per_gpu is None else f'{w.cpus_per_gpu:g}'}")
        lines.append(f"partition: {plan.partition}  GPU types: "
                     + ", ".join(f"{t} x{n}" for t, n in sorted(plan.gpu_types.items())))
        lines.append(f"predictor: {plan.predictor_note}")
        for g, p in plan.predictions.items():
            lines.append(f"  {g:>8}: util {shown(p.util_pct, 1):5.1f} %  mem {shown(p.mem_mib, 0):8.0f} MiB"
                         f"  p90 {shown(p.mem_mib_p90, 0):8.0f} MiB  ({p.predictor})")
        lines.append(f"hint: {plan.hint}")
    else:
        lines.append("no prediction (no usable --model): the job is submitted unchanged")
    jd = job_desc_of(plan)
    lines.append("job_desc: " + " ".join(f"{k}={v!r}" for k, v in jd.items() if k != "script"))
    hook, pol = _hook_paths(plan.env)
    if hook is None:
        from slurm_horus.slurm.policy import find_hook

        lines.append(f"hook: no job_submit.lua beside slurm.conf here: the packaged {find_hook()} "
                     f"with {pol} (the cluster's hook and policy may differ)")
    else:
        lines.append(f"hook: {hook} with {pol}")
    d = decision_of(plan)
    lines.append(f"decision: {d.note or d.action}")
    changed = {k: v for k, v in d.job_desc.items() if jd.get(k) != v}
    changed.update({k: None for k in jd if k not in d.job_desc})
    if changed:
        lines.append("slurmctld would submit: " + " ".join(f"{k}={v!r}" for k, v in changed.items()))
    for m in d.user_messages:
        lines.append(f"hook says: {m}")
    lines.append("sbatch " + " ".join(shlex.quote(a) for a in plan.sbatch_argv))
    return "\n".join(one_line(line) for line in lines)  # the user's paths, the model's names


def _on_prediction_error_setting(env: dict[str, str] | None) -> tuple[str, str]:
    """(the setting as written, where): $HORUS_ON_PREDICTION_ERROR, else ``on_prediction_error``
    in /etc/slurm-horus/horus.conf ($HORUS_CONF)."""
    from slurm_horus.siteconf import site_setting

    env = os.environ if env is None else env
    if env.get("HORUS_ON_PREDICTION_ERROR"):
        return env["HORUS_ON_PREDICTION_ERROR"], "$HORUS_ON_PREDICTION_ERROR"
    return site_setting("on_prediction_error", env) or "", "horus.conf"


def on_prediction_error(env: dict[str, str] | None = None) -> str:
    """'submit' (default, and for a value that is neither) or 'refuse'."""
    return "refuse" if _on_prediction_error_setting(env)[0].strip().lower() == "refuse" else "submit"


def on_prediction_error_problem(env: dict[str, str] | None = None) -> str | None:
    """What is wrong with the setting, if it is neither submit nor refuse (a misspelt 'refuse'
    submits: the job is never lost to a typo, but whoever set it must hear of it)."""
    value, where = _on_prediction_error_setting(env)
    if value.strip().lower() in ("", "submit", "refuse"):
        return None
    return f"on_prediction_error {one_line(value)!r} ({where}) is neither submit nor refuse: taken as submit"


def warn(msg: str) -> None:
    """hsubmit's one-line warning on stderr (lost, never the job, when stderr is closed)."""
    to_stderr("hsubmit", f"warning: {msg}")
