"""Review 7 of the simulator: validation gaps of the what-if API."""

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.sim.cluster import homogeneous_cluster
from slurm_horus.sim.engine import Simulator
from slurm_horus.sim.policies import Request
from slurm_horus.sim.traces import generate_trace


def test_known_config_share_without_known_sensitivity_is_an_error_not_ignored():
    # the configuration's share of k known to the tail budget is read only when the budget
    # knows sensitivities at all: given alone it had run the plain scheduler, silently
    cluster = homogeneous_cluster(8, "a100", 8)
    jobs = generate_trace("philly", 5, cluster.gpu_types, cluster.total_gpus, seed=1,
                          sensitivity_config_share=0.3)
    reqs = [Request((0,), 100, j.gpus) for j in jobs]
    with pytest.raises(HorusError, match="known_sensitivity"):
        Simulator(cluster, jobs, reqs, known_config_share=0.3)
    Simulator(cluster, jobs, reqs, known_sensitivity=True, known_config_share=0.3).run()
