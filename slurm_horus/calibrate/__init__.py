"""Calibrate: measure real models on this site's GPUs and write rows `horus-admin import` takes.

For each planned (model, batch size, task) a runner steps the PyTorch model (random weights,
synthetic data) on one GPU while a sampler reads NVML; the model's weightless ONNX graph goes
through the graph stage, and one import-format row per run is appended to a CSV (and, if asked,
the ledger). The modules, in the order a run goes through them:

- ``plan``: runs, their stable ids, measurements, the Sampler and Runner protocols;
- ``models``: the model builders, their synthetic inputs and their export;
- ``export``: weightless ONNX export (also used by benchmarks/timm_graphs.py);
- ``torch_runner``: the real Runner (torch imported only when one is made);
- ``sampler``: the ledger's NVML sampler on a background thread;
- ``rows``: the CSV row, the resumable CSV writer, the ledger import;
- ``orchestrate``: ``calibrate()``, the loop over the plan.

Nothing here imports torch at import time: the ``[calibrate]`` extra (``pip install torch``) adds it.
"""
