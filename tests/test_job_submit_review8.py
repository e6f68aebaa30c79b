"""Findings of an eighth review of the job-submit hook, its policy format and its Python runner,
each a test that fails before its fix.  Run on the real hook in Lua 5.1 (lupa)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lupa")

from slurm_horus.slurm.policy import decide, policy_values  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "etc" / "job_submit.lua"
UID = 54321
LIGHT = "horus:v1;t4=20/3000/3500;a100=10/3000/3500"  # t4: 26 shards
SCRIPT = "#!/bin/sh\nsrun python train.py\n"
BASE = ("gpu.a100.mem_mib = 40960\ngpu.t4.mem_mib = 15360\ntype_order = t4, a100\n"
        "type_features = a100, t4\nunderclaim_limit = 0\n")


def write_policy(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "horus_policy.conf"
    p.write_text(text)
    return p


def test_the_log_line_of_a_submission_names_its_submitter(tmp_path):
    """A job the hook refuses leaves no record but slurmctld's log, and a job id comes only
    after the hook: the log line said what was refused, not whose job it was."""
    pol = write_policy(tmp_path, BASE + "raw_shards = refuse\n")
    refused = decide({"tres_per_node": "gres/shard:50", "script": SCRIPT}, policy_path=pol,
                     hook_path=HOOK, submit_uid=1862400001)
    assert refused.action == "rejected"
    assert [m for _, m in refused.log if m.startswith("horus: job rejected")] == [
        refused.user_messages[0] + " (submitted by uid 1862400001)"]
    shared = decide({"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": SCRIPT}, policy_path=pol,
                    hook_path=HOOK, submit_uid=UID)
    assert shared.action == "shared"
    assert [m for _, m in shared.log if m.startswith("horus: shared")] == [
        shared.note.split(" horus-decision:")[0] + f" (submitted by uid {UID})"]
    # the user is told what was decided, not their own uid
    assert all("submitted by" not in m for m in refused.user_messages + shared.user_messages)


def test_python_counts_a_policy_paths_length_in_bytes_as_the_hook_does(tmp_path):
    """The hook takes a record_file or pressure_file of at most 1000 bytes; Python counted
    characters, so sync and the queue loop wrote (and doctor checked) a record the hook ignored."""
    path = "/" + "\u00e9" * 500  # 501 characters, 1001 bytes (and the line within 1024)
    for key in ("record_file", "pressure_file"):
        text = BASE + f"{key}={path}\n"
        d = decide({"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": SCRIPT},
                   policy_path=write_policy(tmp_path, text), hook_path=HOOK, submit_uid=UID)
        assert any(f"policy: {key}: need an absolute path" in m for _, m in d.log), d.log
        assert key not in policy_values(text), key
    ok = "/" + "\u00e9" * 499 + "x"  # 1000 bytes: both take it
    assert policy_values(f"record_file = {ok}\n")["record_file"] == ok


def test_a_job_desc_number_past_64_bits_is_passed_as_slurmctld_passes_it(tmp_path):
    """slurmctld pushes every number as a Lua number (a double), NO_VAL64 among them (an unset
    pn_min_memory); the runner raised an OverflowError instead of running the hook."""
    pol = write_policy(tmp_path, BASE + "raw_shards = whole\n")
    no_val64 = 2 ** 64 - 2
    d = decide({"comment": LIGHT, "tres_per_node": "gres/gpu:1", "script": SCRIPT, "pn_min_memory": no_val64},
               policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert (d.action, d.shards) == ("shared", 26)
    assert d.job_desc["pn_min_memory"] == no_val64  # not written: the caller's value


@pytest.mark.parametrize("job", [
    {"tres_bind": "gres/gpu:closest"},  # sbatch --gpu-bind (or SBATCH_GPU_BIND)
    {"script": "#!/bin/sh\nsrun --gpu-bind=none python train.py\n"},
    {"script": "#!/bin/sh\nsrun --gpu-b closest python train.py\n"},  # getopt's prefix
    {"environment": {"SLURM_GPU_BIND": "closest"}},  # srun reads it as --gpu-bind
], ids=["job", "step", "step-prefix", "environment"])
def test_a_gpu_binding_keeps_the_job_whole(tmp_path, job):
    """Slurm 25.11 gives the srun steps of a job on shards with a GPU binding (any, none too) no
    GPU: CUDA_VISIBLE_DEVICES empty (seen on the local cluster); such a job was put on shards."""
    pol = write_policy(tmp_path, BASE)
    d = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": SCRIPT, **job},
               policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert d.action == "unchanged" and ("--gpu-bind" in d.note or "srun steps" in d.note), d.note
    plain = decide({"comment": LIGHT, "tres_per_node": "gres:gpu:1", "script": SCRIPT,
                    "tres_bind": "cpu:cores"}, policy_path=pol, hook_path=HOOK, submit_uid=UID)
    assert plain.action == "shared", plain.note  # a binding of no GPU shares as before
