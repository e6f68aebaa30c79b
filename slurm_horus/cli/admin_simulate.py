"""`horus-admin simulate`: compare placement policies on a simulated GPU cluster.

Wired into `horus-admin` by ``register(main)``; the work is in slurm_horus.sim
(cluster, traces/replay, policies, engine).
"""

from __future__ import annotations

import json
import math
import os

import click
from click.core import ParameterSource

from slurm_horus.cli.common import not_empty, one_line_errors, print_json

SUMMARY = (("completed", "completed jobs", "{:,}"), ("failed_jobs", "failed jobs", "{:,}"),
           ("unschedulable", "unschedulable", "{:,}"), ("rejected", "rejected by the hook", "{:,}"),
           ("makespan_s", "makespan (s)", "{:,.0f}"), ("mean_jct_s", "mean JCT (s)", "{:,.0f}"),
           ("median_jct_s", "median JCT (s)", "{:,.0f}"), ("p95_jct_s", "p95 JCT (s)", "{:,.0f}"),
           ("mean_wait_s", "mean wait (s)", "{:,.0f}"), ("gpu_util", "GPU util", "{:.3f}"),
           ("gpus_busy_frac", "GPUs busy", "{:.3f}"), ("mean_slowdown", "slowdown", "{:.3f}"),
           ("p95_slowdown", "p95 slowdown", "{:.2f}"), ("throughput_per_h", "jobs/h (window)", "{:.1f}"),
           ("sm_busy", "SM busy (window)", "{:.3f}"), ("gpus_alloc", "GPUs alloc (window)", "{:.3f}"),
           ("oom_failures", "OOM failures", "{}"), ("timeouts", "timeouts", "{}"),
           ("shared_starts", "shared starts", "{}"), ("history_hits", "from history", "{}"),
           ("site_hits", "site-corrected", "{}"),
           ("sim_cpu_s", "sim CPU (s)", "{:.2f}"))


MAX_INPUT_BYTES = 1 << 30  # a trace or an export: never endless
# a cluster description, slurm.conf or gres.conf: a GB of `{"nodes": [{}, {}, ...]}` had taken
# 25 GB to parse (23 bytes of memory a byte); 64 MiB name a million nodes one by one
MAX_CONF_BYTES = 64 << 20


def _read(path: str, what: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    from slurm_horus.textfile import read_text

    return read_text(path, what, max_bytes)


def build_cluster(gpus, gpu_type, gpus_per_node, cluster_file, slurm_conf_text, gres_conf):
    """The simulated cluster: --cluster's JSON, the slurm.conf text read once (its backfill
    settings are read from the same text), else --gpus of --gpu-type."""
    from slurm_horus.sim.cluster import cluster_from_json, cluster_from_slurm_conf, homogeneous_cluster

    if cluster_file:
        return cluster_from_json(_read(cluster_file, "cluster file", MAX_CONF_BYTES))
    if slurm_conf_text is not None:
        gres = _read(gres_conf, "gres.conf", MAX_CONF_BYTES) if gres_conf else None
        return cluster_from_slurm_conf(slurm_conf_text, gres)
    return homogeneous_cluster(gpus, gpu_type.lower(), gpus_per_node)


def ledger_rows(ledger: str) -> list:
    """The measured rows of --ledger/--residuals-from: a ledger's SQLAlchemy URL or a JSON file."""
    from slurm_horus.errors import HorusError
    from slurm_horus.sim.replay import rows_from_ledger_jobs

    if "://" in ledger:  # the site's ledger itself
        from slurm_horus.ledger import Ledger

        return rows_from_ledger_jobs(Ledger(ledger, readonly=True).jobs(submitted_only=True))
    try:
        rows = json.loads(_read(ledger, "ledger file"))
    except (ValueError, RecursionError) as e:
        raise HorusError(f"ledger file {ledger}: not JSON ({type(e).__name__})") from None
    if isinstance(rows, dict):
        rows = rows.get("rows")
    if not isinstance(rows, list):
        raise HorusError(f"ledger file {ledger}: expected a JSON list of rows")
    return rows


def build_trace(cluster, trace, jobs, seed, load, sigma_util, sigma_mem, sacct, ledger, zoo,
                repeat_share=None, residuals_from=None, sensitivity_sigma=None, report=None,
                limit_noise=None):
    """The jobs to simulate: --ledger's rows, --sacct's dump (``report``, a dict, is filled with
    what from_sacct_json left out), else a generated trace."""
    from slurm_horus.errors import HorusError
    from slurm_horus.sim.mix import ModelMix
    from slurm_horus.sim.replay import from_rows, from_sacct_json, site_residuals
    from slurm_horus.sim.traces import generate_trace

    if sacct and ledger:
        raise HorusError("give --sacct or --ledger, not both")
    if residuals_from and ledger:
        raise HorusError("--residuals-from applies to generated and --sacct traces; "
                         "a --ledger replay takes its truth from its own rows")
    if ledger:
        return from_rows(ledger_rows(ledger), cluster.gpu_types, seed=seed)
    mix = ModelMix(zoo, site=site_residuals(ledger_rows(residuals_from)) if residuals_from else None)
    mem_cap = 0.97 * max(cluster.mem_mib(t) for t in cluster.gpu_types)
    if sacct:
        return from_sacct_json(_read(sacct, "sacct file"), cluster.gpu_types, seed=seed, trace_mix=trace,
                               sigma_util=sigma_util, sigma_mem=sigma_mem, mix=mix,
                               max_gpus_per_job=cluster.max_gpus_per_node, mem_cap_mib=mem_cap,
                               report=report)
    extra = {} if repeat_share is None else {"repeat_share": repeat_share}
    if sensitivity_sigma is not None:
        extra["sensitivity_sigma"] = sensitivity_sigma
    if limit_noise is not None:
        extra["limit_noise"] = limit_noise
    return generate_trace(trace, jobs, cluster.gpu_types, cluster.total_gpus, seed=seed, load=load,
                          sigma_util=sigma_util, sigma_mem=sigma_mem, mix=mix,
                          max_gpus_per_job=cluster.max_gpus_per_node, mem_cap_mib=mem_cap, **extra)


def sacct_warning(report: dict) -> str | None:
    """The one line that says which rows of a --sacct dump were not replayed as they are, or
    None when every row was."""
    from slurm_horus.sim.replay import skip_summary

    parts = []
    if report.get("skipped"):
        parts.append(f"{report['rows'] - report['jobs']:,} of {report['rows']:,} sacct rows skipped: "
                     f"{skip_summary(report)}")
    if report.get("clipped"):
        parts.append(f"{report['clipped']:,} jobs clipped to the largest node (they asked for more GPUs "
                     "than it has)")
    return "; ".join(parts) or None


def policy_warning(path, text: str) -> str | None:
    """The policy file's lines the hook ignores, in one line, or None."""
    from slurm_horus.errors import one_line
    from slurm_horus.slurm.policy import ignored_policy_summary

    summary = ignored_policy_summary(path, text)
    return one_line(summary) if summary else None


def register(main_group: click.Group) -> None:
    """Add the `simulate` command to ``main_group`` (horus-admin)."""

    @main_group.command("simulate")
    @click.option("--jobs", "n_jobs", type=int, default=2000, show_default=True, help="Jobs to generate.")
    @click.option("--trace", type=click.Choice(["philly", "helios", "pai", "llm"]), default="philly",
                  show_default=True, help="Workload to generate (or model mix for --sacct).")
    @click.option("--gpus", type=int, default=64, show_default=True, help="Homogeneous cluster size.")
    @click.option("--gpu-type", default="a100", show_default=True, help="GPU type of --gpus.")
    @click.option("--gpus-per-node", type=int, default=8, show_default=True)
    @click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), callback=not_empty,
                  help='Cluster JSON: {"nodes": [{"name", "gpu_type", "gpus", "count"}]}.')
    @click.option("--slurm-conf", type=click.Path(dir_okay=False), callback=not_empty,
                  help="Read nodes' Gres, and the backfill settings (SchedulerType, bf_interval, "
                       "bf_max_job_test), from slurm.conf.")
    @click.option("--gres-conf", type=click.Path(dir_okay=False), callback=not_empty, help="gres.conf for untyped GPUs (with --slurm-conf).")
    @click.option("--sacct", type=click.Path(dir_okay=False), callback=not_empty, help="Replay a `sacct --json` dump.")
    @click.option("--ledger", metavar="URL|FILE", callback=not_empty,
                  help="Replay the measured jobs of a ledger (its SQLAlchemy URL, e.g. "
                       "sqlite:////var/lib/slurm-horus/ledger.db), or a JSON list of rows "
                       "{submit_time, elapsed_s, gpus, pred_util, pred_mem, true_util, true_mem}.")
    @click.option("--residuals-from", metavar="URL|FILE", callback=not_empty,
                  help="Draw the generated (or --sacct) jobs' prediction errors from the site's "
                       "own measured jobs (a ledger URL or rows as for --ledger): per model (and GPU "
                       "type) where it ran at least 5 times, utilization from runs that had their "
                       "GPU alone.")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--load", type=float, default=1.0, show_default=True,
                  help="Offered load: arrivals x exclusive GPU-seconds / capacity.")
    @click.option("--sigma-util", type=float, default=0.05, show_default=True,
                  help="Lognormal jitter around the measured utilization residual.")
    @click.option("--sigma-mem", type=float, default=0.05, show_default=True,
                  help="Lognormal jitter around the measured memory residual.")
    @click.option("--repeat-share", type=float, default=None,
                  help="Share of generated jobs that run a graph the site ran before "
                       "[default: 0.5, an assumption; 0: every job a new graph].")
    @click.option("--sensitivity-sigma", type=float, default=None,
                  help="Spread (lognormal sigma) of generated jobs' true interference sensitivity "
                       "[default: 0.6, fitted to Lucid's pair p10]; the horus scheduler assumes "
                       "0.6 whatever it is.")
    @click.option("--limit-noise", type=float, default=None,
                  help="Generated jobs' time limits as users give them: the exact 2x the run time "
                       "on the slowest type times exp(NOISE x |N(0,1)|), rounded up to whole hours "
                       "[default: 0, the exact multiple].")
    @click.option("--known-sensitivity", is_flag=True,
                  help="What-if: the tail budget of horus and the oracle knows each generated job's "
                       "true interference sensitivity (placement still ranks by the median; no real "
                       "scheduler knows it: shows what knowing it is worth).")
    @click.option("--history-lag", type=float, default=900.0, show_default=True,
                  help="horus: seconds from a job's end until its measurement predicts the next "
                       "run of its graph (the sync period).")
    @click.option("--no-history", is_flag=True,
                  help="horus: predict every job with the cold start, never from the site's history.")
    @click.option("--policies", default=",".join(("exclusive", "naive", "horus", "oracle")),
                  show_default=True, help="Comma-separated policies to run.")
    @click.option("--naive-shards", type=int, default=50, show_default=True,
                  help="Shards per 1-GPU job under the naive policy.")
    @click.option("--policy-file", type=click.Path(dir_okay=False), callback=not_empty,
                  help="horus_policy.conf for the hook's decisions and the bound (default: the "
                       "site's, as horus-admin queue reads it: $HORUS_POLICY, which must exist when "
                       "set; else the one beside the hook).")
    @click.option("--bf-window", type=int, default=None,
                  help="Waiting jobs the backfill pass looks at (bf_max_job_test, 0..1,000,000) [default: "
                       "--slurm-conf's, else 100].")
    @click.option("--bf-interval", type=float, default=None,
                  help="Seconds between backfill passes (bf_interval; 0: at every event, -1: no "
                       "backfill) [default: --slurm-conf's, else Slurm's 30].")
    @click.option("--oom-delay", type=float, default=60.0, show_default=True,
                  help="Seconds an OOM-failing job holds its GPU before it dies.")
    @click.option("--interference", "itf_points", callback=not_empty,
                  help='Speed curve "sum:speed,..." (default: Lucid medians, see docs/simulator.md).')
    @click.option("--mem-bw-penalty", type=float, default=0.0, show_default=True,
                  help="Extra slowdown factor per additional co-located job.")
    @click.option("--slowdown-bound", type=float, default=None,
                  help="horus/oracle: co-locate only while every job's predicted slowdown stays within "
                       "this [default: the policy file's slowdown_bound, else 2].")
    @click.option("--slowdown-quantile", type=float, default=0.95, show_default=True,
                  help="horus/oracle: the share of jobs that must stay within --slowdown-bound, "
                       "given the measured spread of interference.")
    @click.option("--max-group", type=int, default=4, show_default=True,
                  help="horus/oracle: most jobs co-located on one GPU.")
    @click.option("--zoo", type=click.Path(file_okay=False), callback=not_empty,
                  help="Predict the mix from this folder of ONNX graphs (default: the shipped table).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object keyed by policy.")
    @click.option("--plot", is_flag=False, flag_value="-", default=None, metavar="[FILE.png|-]",
                  help="The policies side by side per metric: in the terminal (no file, or -), "
                       "else into FILE.png (needs matplotlib: pip install matplotlib, the [plot] extra).")
    @one_line_errors("horus-admin simulate", needs_stdout=True)  # the table, a plot beside it
    def simulate_cmd(n_jobs, trace, gpus, gpu_type, gpus_per_node, cluster_file, slurm_conf, gres_conf,
                     sacct, ledger, residuals_from, seed, load, sigma_util, sigma_mem, repeat_share,
                     sensitivity_sigma, limit_noise, known_sensitivity, history_lag, no_history,
                     policies, naive_shards, policy_file,
                     bf_window, bf_interval, oom_delay, itf_points, mem_bw_penalty, slowdown_bound,
                     slowdown_quantile, max_group, zoo, as_json, plot):
        """Simulate a GPU cluster running a job trace under several placement policies."""
        from slurm_horus.errors import HorusError
        from slurm_horus.plot import check_path, console, save
        from slurm_horus.sim.interference import LUCID_POINTS, Interference, parse_points
        from slurm_horus.sim.cluster import MAX_BF_MAX_JOB_TEST, SLURM_BF_INTERVAL_S, backfill_from_slurm_conf
        from slurm_horus.sim.engine import run_policies
        from slurm_horus.sim.plot import figure, terminal
        from slurm_horus.sim.policies import check_policies
        from slurm_horus.slurm.policy import POLICY_MAX_BYTES, find_hook, policy_values
        from slurm_horus.slurm.policy import policy_file as site_policy_file
        from slurm_horus.textfile import read_text

        floats = {"--load": load, "--sigma-util": sigma_util, "--sigma-mem": sigma_mem,
                  "--history-lag": history_lag, "--oom-delay": oom_delay, "--bf-interval": bf_interval,
                  "--mem-bw-penalty": mem_bw_penalty, "--slowdown-bound": slowdown_bound,
                  "--slowdown-quantile": slowdown_quantile, "--repeat-share": repeat_share,
                  "--sensitivity-sigma": sensitivity_sigma, "--limit-noise": limit_noise}
        bad = [k for k, v in floats.items() if v is not None and not math.isfinite(v)]
        if bad:
            raise HorusError(f"{', '.join(bad)}: need a finite number")
        if not 0 <= seed < 2 ** 32:
            raise HorusError("--seed must be 0..4294967295")
        given = click.get_current_context().get_parameter_source
        typed = lambda name: given(name) not in (ParameterSource.DEFAULT, None)  # noqa: E731
        if slurm_conf and cluster_file:
            raise HorusError("give --cluster or --slurm-conf, not both")
        if gres_conf and not slurm_conf:
            raise HorusError("--gres-conf applies with --slurm-conf (the types of its untyped GPUs)")
        for name, opt in (("gpus", "--gpus"), ("gpu_type", "--gpu-type"), ("gpus_per_node", "--gpus-per-node")):
            if typed(name) and (cluster_file or slurm_conf):
                raise HorusError(f"{opt} applies to the homogeneous cluster, not to "
                                 f"{'--cluster' if cluster_file else '--slurm-conf'} (it names its nodes)")
        if bf_window is not None and not 0 <= bf_window <= MAX_BF_MAX_JOB_TEST:
            raise HorusError(f"--bf-window must be 0..{MAX_BF_MAX_JOB_TEST:,} (slurm.conf's bf_max_job_test "
                             "takes at most that too)")
        conf_text = None
        if slurm_conf:
            conf_text = _read(slurm_conf, "slurm.conf", MAX_CONF_BYTES)
        sched = backfill_from_slurm_conf(conf_text) if conf_text is not None else None
        if bf_window is None:
            bf_window = sched.max_job_test if sched else 100
        if bf_interval is None:
            backfill = sched.enabled if sched else True
            bf_interval = sched.interval_s if sched else float(SLURM_BF_INTERVAL_S)
        else:
            backfill = bf_interval != -1  # slurm.conf's bf_interval=-1: no backfill loop
        if bf_window < 0 or (bf_interval < 0 and backfill) or oom_delay < 0:
            raise HorusError("--bf-window and --oom-delay must be >= 0, --bf-interval >= 0 (or -1: no backfill)")
        if max(bf_interval, oom_delay, history_lag) > 30 * 86400:
            raise HorusError("--bf-interval, --oom-delay and --history-lag must be at most 30 days "
                             "(2,592,000 s)")
        if not (0 <= sigma_util <= 5 and 0 <= sigma_mem <= 5):
            raise HorusError("--sigma-util and --sigma-mem must be in 0..5 (lognormal sigmas)")
        for name, value in (("--repeat-share", repeat_share), ("--sensitivity-sigma", sensitivity_sigma),
                            ("--limit-noise", limit_noise),
                            ("--known-sensitivity", known_sensitivity or None),
                            ("--jobs", n_jobs if typed("n_jobs") else None), ("--load", load if typed("load") else None)):
            if value is not None and (sacct or ledger):
                raise HorusError(f"{name} applies to generated traces, not to --sacct or --ledger")
        if history_lag < 0:
            raise HorusError("--history-lag must be >= 0")
        if not 0 < slowdown_quantile < 1:
            raise HorusError("--slowdown-quantile must be between 0 and 1 (e.g. 0.95)")
        if plot == "-" and as_json:
            raise HorusError("--plot - draws in the terminal; with --json name a FILE.png")
        if plot is not None and plot != "-":  # --plot '' too: no FILE.png named, as hacct says
            plot = check_path(plot)  # a missing matplotlib or a file it cannot write fails before the simulation
        pols = list(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))
        if not pols:
            raise HorusError("--policies: none given")
        # what run_policies and the Simulator check only after the trace is built (minutes for
        # 2,000,000 jobs), checked before it (and the bounds below, the upper ones once the
        # policy file is read)
        check_policies(pols)
        itf = Interference(parse_points(itf_points) if itf_points else LUCID_POINTS, mem_bw_penalty)
        # one policy file for the hook's decisions and the bound: the site's (as horus-admin queue
        # reads it), else the one beside the hook that runs (the bound had been the site's while
        # the decisions were the shipped file's); one named (--policy-file, $HORUS_POLICY) must
        # be there: a typo had silently run the shipped policy.  Read before the trace is built: a
        # missing file had been reported only after it
        from_env = policy_file is None and bool(os.environ.get("HORUS_POLICY"))
        if policy_file is None:
            policy_file = site_policy_file()
            if not from_env and not policy_file.is_file():
                policy_file = find_hook().parent / "horus_policy.conf"
        policy_text = read_text(policy_file, "policy file" + (" (HORUS_POLICY)" if from_env else ""),
                                POLICY_MAX_BYTES)
        if slowdown_bound is None:
            slowdown_bound = float(policy_values(policy_text).get("slowdown_bound", "2"))
        if slowdown_bound < 1 or max_group < 1 or naive_shards < 1:
            raise HorusError("--slowdown-bound (or the policy file's slowdown_bound) must be >= 1, "
                             "--max-group and --naive-shards >= 1")
        # the hook's shards per GPU as it reads them from this file (HorusDecider asks the hook
        # itself, after the trace is built): --max-group 200 had failed only then
        per_gpu = int(policy_values(policy_text).get("shards_per_gpu", "100"))
        if max_group > per_gpu:
            raise HorusError(f"--max-group must be in 1..{per_gpu}, the policy's shards per GPU "
                             "(each job holds at least one shard)")
        if "naive" in pols and naive_shards > per_gpu:
            raise HorusError(f"--naive-shards must be in 1..{per_gpu}")
        cluster = build_cluster(gpus, gpu_type, gpus_per_node, cluster_file, conf_text, gres_conf)
        replayed: dict = {}
        jobs = build_trace(cluster, trace, n_jobs, seed, load, sigma_util, sigma_mem, sacct, ledger, zoo,
                           repeat_share, residuals_from, sensitivity_sigma, report=replayed,
                           limit_noise=limit_noise)
        for warning in (sacct_warning(replayed) if sacct else None, policy_warning(policy_file, policy_text)):
            if warning:
                click.echo(f"horus-admin simulate: warning: {warning}", err=True)
        results = run_policies(cluster, jobs, pols, policy_path=policy_file, naive_shards=naive_shards,
                               interference=itf, bf_window=bf_window, bf_interval=max(bf_interval, 0.0),
                               backfill=backfill,
                               oom_delay_s=oom_delay, slowdown_bound=slowdown_bound,
                               slowdown_quantile=slowdown_quantile, max_group=max_group,
                               history_lag_s=None if no_history else history_lag,
                               known_sensitivity=known_sensitivity)
        from slurm_horus.ledger.db import mask_url

        shown = lambda where: mask_url(where) if "://" in where else where  # noqa: E731 (no password)
        src = f"sacct {sacct}" if sacct else f"ledger {shown(ledger)}" if ledger else f"{trace} trace, seed {seed}"
        if residuals_from:
            src += f", errors from {shown(residuals_from)}"
        what = f"{len(jobs)} jobs ({src}) on {cluster.describe()}"
        if not backfill:
            what += "; no backfill"
        else:
            what += f"; backfill {f'every {bf_interval:g} s' if bf_interval else 'at every event'} over {bf_window} jobs"
        if known_sensitivity:
            what += "; what-if: every job's sensitivity known"
        what += f"; policy {policy_file}, slowdown bound {slowdown_bound:g}"
        for res in results.values():  # what the run read: in each policy's entry, as its bf_window
            res["policy_file"] = str(policy_file)
            res["slowdown_bound"] = slowdown_bound
            if sacct:
                res["sacct_rows"] = dict(replayed)  # rows, jobs, skipped (per reason), examples, clipped
        if plot and plot != "-":
            plot = save(figure(results, f"horus-admin simulate: {what}"), plot)
        if as_json:
            if known_sensitivity:
                for p in ("horus", "oracle"):
                    if p in results:
                        results[p]["what_if"] = "known_sensitivity"
            print_json(results)
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=what)
        table.add_column("metric")
        for p in results:
            table.add_column(p, justify="right")
        for key, label, fmt in SUMMARY:  # a figure over no job or no time (None): '-'
            table.add_row(label, *("-" if results[p][key] is None else fmt.format(results[p][key])
                                   for p in results))
        Console().print(table)
        if plot == "-":
            console().print(terminal(results, what), end="")
        elif plot:
            click.echo(f"wrote {plot}")
