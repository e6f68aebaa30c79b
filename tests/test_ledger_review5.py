"""Ledger review 5: what accounting says a job held and used, recorded as it is.

Every sacct record here is synthetic (built in the test, data_parser v0.0.39's layout as
tests/fixtures/sacct/README.md describes it), never a recording."""

from slurm_horus.ledger import Ledger
from slurm_horus.ledger.sync import sync
from slurm_horus.slurm.accounting import parse_job

T0 = 1_700_000_000


def _job(jid, alloc, *, steps=(), nodes="gpu-a100", comment="horus:v1;a100=30/4000/4500"):
    """A finished job as sacct --json prints it (synthetic)."""
    return {"job_id": jid, "user": "root", "account": "ml", "cluster": "gpucl",
            "comment": {"job": comment, "administrator": "", "system": ""},
            "time": {"elapsed": 100, "submission": T0 - 10, "start": T0, "end": T0 + 100},
            "tres": {"allocated": [{"type": "cpu", "name": None, "count": 4}, *alloc]},
            "nodes": nodes, "allocation_nodes": 2 if "," in nodes else 1,
            "state": {"current": ["COMPLETED"]}, "steps": list(steps)}


def _gres(name, count):
    return {"type": "gres", "name": name, "count": count}


def test_a_job_on_gpus_of_two_types_has_no_one_type():
    """Typed accounting TRES (AccountingStorageTRES=gres/gpu:a100,gres/gpu:t4) of a job that got
    an A100 node and a T4 node: it was recorded as an A100 job, the first type listed."""
    mixed = parse_job(_job(1, [_gres("gpu", 2), _gres("gpu:a100", 1), _gres("gpu:t4", 1)],
                           nodes="gpu-a100,gpu-t4"))
    assert (mixed["gpus"], mixed["gpu_type"]) == (2, None)
    typed = parse_job(_job(2, [_gres("gpu", 2), _gres("gpu:a100", 2)]))
    assert (typed["gpus"], typed["gpu_type"]) == (2, "a100")
    one = parse_job(_job(3, [_gres("gpu:a100", 1), _gres("gpu:t4", 0)]))  # none of the T4s
    assert (one["gpus"], one["gpu_type"]) == (1, "a100")


def test_syncs_failed_measurement_count_is_per_gpu_as_the_ledger_flags_it(tmp_path):
    """A 2-GPU job that never used its GPUs: utilization 0 and a bare CUDA context (300 MiB) on
    each. The ledger flags it (per GPU, 300 MiB), sync's count had read the sum (600 MiB) as
    use and said 0 failed measurements."""
    idle = {"time": {"elapsed": 100}, "tasks": {"count": 2}, "nodes": {"count": 1},
            "tres": {"allocated": [_gres("gpu", 2)], "requested": {
                "max": [_gres("gpuutil", 0), _gres("gpumem", 300 * 2 ** 20)],
                "average": [_gres("gpuutil", 0), _gres("gpumem", 300 * 2 ** 20)],
                "total": [_gres("gpuutil", 0), _gres("gpumem", 600 * 2 ** 20)]}},
            "step": {"id": "7.0"}}
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    res = sync(L, sacct_json={"jobs": [_job(7, [_gres("gpu", 2)], steps=[idle])]},
               node_types={})
    (row,) = L.jobs()
    assert row["failed_measurement"] == 1 and row["act_mem_mib"] == 300
    assert res["failed_measurements"] == 1
