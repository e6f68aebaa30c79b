"""Review 8 of `horus-admin simulate`: inputs checked at the boundary, figures over nothing."""

import json

import pytest
from click.testing import CliRunner

from slurm_horus.cli import admin_simulate
from slurm_horus.errors import HorusError
from slurm_horus.sim import replay
from slurm_horus.sim.cluster import cluster_from_json
from slurm_horus.sim.plot import figure, sweep_terminal, terminal
from slurm_horus.sim.replay import from_rows, from_sacct_json

ROW = {"submit_time": 1.7e9, "elapsed_s": 600, "gpus": 1, "pred_util": 50, "pred_mem": 10000,
       "true_util": 40, "true_mem": 12000}


def _one_line_error(r, words):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and words in lines[0], r.output


@pytest.mark.parametrize("args, words", [
    (["--policies", "exclusive,bogus"], "unknown policy 'bogus'"),
    (["--slowdown-bound", "0.5"], "--slowdown-bound"),
    (["--max-group", "0"], "--max-group"),
    (["--naive-shards", "0"], "--naive-shards")])
def test_policy_options_fail_before_the_trace_is_built(simulate_cli, monkeypatch, args, words):
    # they had been checked after the trace was built: minutes of --jobs 2000000 for a typo
    def built(*a, **k):
        raise AssertionError("the trace was built")

    monkeypatch.setattr(admin_simulate, "build_trace", built)
    _one_line_error(CliRunner().invoke(simulate_cli, ["simulate", "--jobs", "2000000", *args]), words)


def test_figures_over_no_ended_job_are_null_and_dash_not_zero(simulate_cli, tmp_path):
    # every job asks more GPUs than a node has: none ends; a mean JCT of 0, a mean wait of 0 and
    # a slowdown of 1 had read as true figures
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps([dict(ROW, gpus=64, submit_time=1.7e9 + 60 * i) for i in range(3)]))
    r = CliRunner().invoke(simulate_cli, ["simulate", "--ledger", str(ledger), "--json", "--policies", "exclusive"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.output)["exclusive"]
    assert m["ended"] == 0 and m["unschedulable"] == 3
    for k in ("mean_jct_s", "median_jct_s", "p95_jct_s", "mean_wait_s", "mean_slowdown", "p95_slowdown",
              "gpu_util", "gpus_busy_frac"):
        assert m[k] is None, k
    r = CliRunner().invoke(simulate_cli, ["simulate", "--ledger", str(ledger), "--policies", "exclusive"])
    assert r.exit_code == 0, r.output
    assert [ln.split("│")[2].strip() for ln in r.output.splitlines() if "mean wait" in ln] == ["-"]


def test_plots_label_a_missing_figure_dash():
    res = {"exclusive": {"mean_jct_s": 7200.0, "makespan_s": 9000.0},
           "horus": {"mean_jct_s": None, "makespan_s": 9000.0}}
    text = terminal(res, "t").plain
    block = text.split("mean job completion time")[1].split("\n\n")[0]
    assert block.split("\n")[2].split()[-1] == "-" and block.split("\n")[1].split()[-1] == "2.00"
    ax = figure(res, "t").axes[1]
    assert [t.get_text() for t in ax.texts] == ["2.00", "-"]
    # a sweep cell whose seed ended no job is '-', not a crash on None
    sweep = {("philly", 1.0): [{"horus": {"mean_jct_s": 3600.0}}, {"horus": {"mean_jct_s": None}}]}
    assert "-" in sweep_terminal(sweep, "s").plain.split("horus")[-1]


@pytest.mark.parametrize("change, words", [({"gpus": 2.5}, "whole number"), ({"gpus": True}, "whole number"),
                                           ({"true_mem": 1e12}, "at most"), ({"pred_mem": 2e8}, "at most"),
                                           ({"pred_mem_p90": 1e9}, "at most")])
def test_ledger_rows_of_part_gpus_or_impossible_memory_are_refused(change, words):
    # 2.5 GPUs had run as 2 and `true` as 1; a memory beyond the hint's bound had failed in the
    # hook, naming no row
    with pytest.raises(HorusError, match=f"row 2: .*{words}"):
        from_rows([ROW, dict(ROW, **change)], ["a100"])


def test_replays_are_capped_as_generated_traces_are(monkeypatch):
    monkeypatch.setattr(replay, "MAX_TRACE_JOBS", 3)
    with pytest.raises(HorusError, match="4 jobs to replay, at most 3"):
        from_rows([dict(ROW, submit_time=1.7e9 + i) for i in range(4)], ["a100"])
    doc = {"jobs": [{"job_id": i + 1, "time": {"submission": 100 + i, "elapsed": 60},
                     "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]}} for i in range(4)]}
    with pytest.raises(HorusError, match="4 jobs to replay, at most 3"):
        from_sacct_json(json.dumps(doc), ["a100"])


def test_cluster_file_and_slurm_conf_have_a_smaller_size_cap(simulate_cli, monkeypatch, tmp_path):
    # a GB of `{"nodes": [{}, {}, ...]}` took some 25 GB to parse
    monkeypatch.setattr(admin_simulate, "MAX_CONF_BYTES", 100, raising=False)
    big = tmp_path / "c.json"
    big.write_text(json.dumps({"nodes": [{"gpu_type": "a100", "gpus": 8, "name": f"g{i}"} for i in range(5)]}))
    _one_line_error(CliRunner().invoke(simulate_cli, ["simulate", "--cluster", str(big)]), "larger than 100 bytes")
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=g[1-2] Gres=gpu:a100:4\n" + "#" * 200 + "\n")
    _one_line_error(CliRunner().invoke(simulate_cli, ["simulate", "--slurm-conf", str(conf)]),
                    "larger than 100 bytes")


def test_cluster_memory_in_gb_instead_of_mib_is_refused():
    # "mem_mib": 40 (GB meant) had simulated 40 MiB GPUs, every job's memory capped to fit
    with pytest.raises(HorusError, match="MiB, not GB"):
        cluster_from_json('{"nodes": [{"gpu_type": "a100", "gpus": 8, "mem_mib": 40}]}')
    assert cluster_from_json('{"nodes": [{"gpu_type": "a100", "gpus": 8, "mem_mib": 1024}]}').mem_mib("a100") == 1024
