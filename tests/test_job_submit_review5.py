"""Findings of a fifth review of etc/job_submit.lua, each a test that fails on the hook before it.
Run on the real hook in Lua 5.1 (lupa), with a job_desc as slurmctld hands it over."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lupa")

from slurm_horus.slurm.hint import parse_decision  # noqa: E402
from slurm_horus.slurm.hook_runtime import HookRuntime  # noqa: E402
from slurm_horus.slurm.policy import decide  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "etc" / "job_submit.lua"
UID = 54321
LIGHT = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"  # t4: 26 shards, a100: 12
SCRIPT = "#!/bin/sh\nsrun python train.py\n"


@pytest.fixture()
def policy(tmp_path):
    p = tmp_path / "horus_policy.conf"
    p.write_text("gpu.a100.mem_mib = 40960\ngpu.t4.mem_mib = 15360\ntype_order = t4, a100\n"
                 "type_features = a100, t4\nraw_shards = whole\nunderclaim_limit = 0\n")
    return p


def run(job: dict, policy: Path):
    return decide(job, policy_path=policy, hook_path=HOOK, submit_uid=UID)


def submit_as_slurmctld(job: dict, env: dict[str, str], policy: Path, vm_count: bool = False):
    """slurm_job_submit on a job_desc with its environment (a table read by name, as slurmctld
    gives it).  Returns the fields after and, with vm_count, about how many Lua VM instructions
    the hook ran (a debug count hook every 100; work inside C string functions is not counted)."""
    rt = HookRuntime(HOOK)
    g, lua = rt._g, rt._lua
    g._horus_reset()
    g._horus_policy_override = str(policy)
    lua.execute("_review_vm = 0")
    counter = lua.eval("function() _review_vm = _review_vm + 1 end")
    fields = lua.table_from({**job, "environment": lua.table_from(env)})
    jd, backing, _ = g._horus_make_job(fields)
    if vm_count:
        g.debug.sethook(counter, "", 100)
    try:
        assert g.slurm_job_submit(jd, lua.table(), UID) == 0
    finally:
        g.debug.sethook()
        g._horus_policy_override = None
    return dict(backing.items()), g._review_vm * 100


# --------------------------------------------------------------------------- het job environment

@pytest.mark.parametrize("env,offset", [
    ({"SLURM_GPUS_PER_NODE_HET_GROUP_0": "1"}, 0),  # sbatch --gpus-per-node=1 : ... (component 0)
    ({"SLURM_GPUS_PER_NODE_PACK_GROUP_0": "1"}, 0),  # the older spelling srun still reads
    ({"SLURM_GRES_HET_GROUP_0": "gpu:1"}, None),  # inherited from a het job's allocation
    ({"SLURM_CPUS_PER_GPU_HET_GROUP_2": "4"}, 2),
])
def test_a_het_group_gpu_option_in_the_environment_keeps_the_job_whole(policy, env, offset):
    """sbatch writes a het job's GPU options into the environment with the suffix _HET_GROUP_<n>
    (SLURM_GPUS_PER_NODE_HET_GROUP_0=1 for --gpus-per-node=1 in component 0), and srun reads the
    variable of its het group (0 without --het-group, in any job) as its own option.  The hook
    looked at the plain names only: component 0 was put on shards and its srun steps, asking for
    a GPU, failed."""
    job = {"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": SCRIPT}
    if offset is not None:
        job["het_job_offset"] = offset
    after, _ = submit_as_slurmctld(job, {"PATH": "/usr/bin", **env}, policy)
    assert after["tres_per_node"] == "gres/gpu:1" and "features" not in after and "max_nodes" not in after
    assert parse_decision(after["admin_comment"]).action == "unchanged"


def test_another_het_groups_gpu_option_does_not_stop_sharing(policy):
    # component 0's steps read _HET_GROUP_0; component 1's options are for steps on component 1
    job = {"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": SCRIPT, "het_job_offset": 0}
    after, _ = submit_as_slurmctld(job, {"SLURM_GPUS_PER_NODE_HET_GROUP_1": "1"}, policy)
    assert after["tres_per_node"] == "gres/shard:26" and after["features"] == "t4"


# --------------------------------------------------------------------------- script scan cost

def test_the_script_scan_does_not_step_through_every_newline(policy):
    """The srun scan found the line of each srun word by a Lua loop over every newline before
    it: a 4 MB script of newlines and one srun line held slurmctld (and every other submission,
    behind the job_submit/lua lock) for about a second, 32 MB for 7 s.  The last newline before
    each srun word is now found in one C-level match: the Lua work no longer grows with them."""
    script = "#!/bin/sh\n" + "\n" * 200_000 + "srun --gpus=1 python train.py\n"
    after, vm = submit_as_slurmctld({"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": script},
                                    {}, policy, vm_count=True)
    assert after["tres_per_node"] == "gres/gpu:1"  # still seen: its step asks for a GPU
    assert vm < 50_000, vm  # was about 2.5 million
    # a comment line is still a comment line, however far down
    script = "#!/bin/sh\n" + "\n" * 1000 + "  # srun --gpus=1 x\nsrun python train.py\n"
    after, _ = submit_as_slurmctld({"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": script},
                                   {}, policy)
    assert after["tres_per_node"] == "gres/shard:26"


@pytest.mark.parametrize("line", ['"srun" --gres=gpu:1 python train.py', "'srun' -G 1 python train.py",
                                  '"$HOME/bin/srun" --gpus=1 python train.py'])
def test_a_quoted_srun_word_is_read_as_srun(policy, line):
    """The shell runs "srun" (quoted) as srun; the scan wanted a blank right after the word and
    took the step asking for a GPU for some other word: the job went on shards and the step failed."""
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": f"#!/bin/bash\n{line}\n"}, policy)
    assert d.action == "unchanged" and d.job_desc["tres_per_node"] == "gres:gpu:1", d.admin_comment


# --------------------------------------------------------------------------- --constraint

@pytest.mark.parametrize("features,written", [("ib&", "ib&a100"), ("ib&fast&", "ib&fast&a100")])
def test_a_trailing_ampersand_in_the_constraint_is_not_doubled(policy, features, written):
    """Slurm takes a --constraint ending in '&' ("ib&" is ib) but refuses '&' without a feature
    before it ("Invalid feature specification"): the hook appended "&a100" and made the valid
    "ib&" the invalid "ib&&a100"."""
    d = run({"comment": LIGHT, "tres_per_node": "gres:gpu:a100:1", "features": features}, policy)
    assert (d.action, d.gpu_type) == ("shared", "a100")
    assert d.job_desc["features"] == written and "&&" not in d.job_desc["features"]
