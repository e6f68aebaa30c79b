"""sync's GPU type from the nodes, for a job on several nodes."""

import json
from pathlib import Path

import pytest

from slurm_horus.ledger import Ledger
from slurm_horus.ledger.sync import node_list_gpu_type, sync

FIX = Path(__file__).parent / "fixtures" / "slurm" / "sacct_json_finished_gpu.stdout"
TYPES = {"gpu1": "a100", "gpu2": "a100", "gpu3": "t4", "login1": "a100"}


@pytest.mark.parametrize("nodes,gpu_type", [
    ("gpu[1-2]", "a100"),      # every node of one type: that type
    ("gpu1,login1", "a100"),
    ("gpu[1-3]", None),        # two types: none, as the ledger gives a job on two types
    ("gpu[1-2],gpu9", None),   # a node of no known single type
    ("gpu1", "a100"),
    ("gpu[1-", None),          # a list cut to its column's length
])
def test_a_multi_node_job_has_its_nodes_one_gpu_type(nodes, gpu_type, tmp_path):
    """Only the node list's own name was looked up: a job on gpu[1-2] had no type, its run
    taught no type's history."""
    data = json.loads(FIX.read_text())
    data["jobs"][0]["nodes"] = nodes
    L = Ledger(f"sqlite:///{tmp_path}/l.db", spool=str(tmp_path / "sp"))
    sync(L, sacct_json=data, all_jobs=True, node_types=TYPES)
    (row,) = L.jobs()
    assert row["node"] == nodes and row["gpu_type"] == gpu_type


def test_a_node_list_too_big_to_expand_has_no_type():
    """A range expand_hostlist refuses (its bound on a list's names): no type, no error."""
    assert node_list_gpu_type("n[0-9999999]", {"n0": "a100"}) is None
