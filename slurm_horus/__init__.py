"""slurm-horus: predict a deep-learning job's GPU use from its ONNX graph and let Slurm pack jobs by it.

The flow, one module per stage: graph -> features -> prediction -> hint -> Slurm -> ledger
-> report -> retrain.
"""

__version__ = "0.1.0"
