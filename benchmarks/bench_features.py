"""Speed of the graph stage against onnx-tool's profiler, on every corpus model, in one run.

    python benchmarks/bench_features.py [--repeat 5]

For each model: median in-process time of `extract_features` (load, shape inference, costs,
features) and of onnx-tool's `Model` + `shape_infer` + `profile` on the same file (given a
sparse all-zero weight file, since onnx-tool reads weights), alternating the two. Also the
median wall time of the `horus features` CLI on ResNet-50. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from slurm_horus.graph.features import extract_features  # noqa: E402

DATA = ROOT / "tests" / "data"


def _ratio(r: float) -> str:
    """A speed-up as 20.7x, one below 1 with two digits (0.05x: slower, not 0.0x)."""
    return f"{r:.1f}x" if r >= 1 else f"{r:.2g}x"


def _onnx_tool_copy(entry, folder: Path) -> Path:
    from test_zoo import _with_zero_weights  # the same preparation the agreement test uses

    return _with_zero_weights(entry, folder)


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tool-max-params", type=float, default=400e6,
                        help="skip onnx-tool above this many parameters: it reads every weight")
    args = parser.parse_args()
    import numpy as np
    import onnx_tool

    zoo = json.loads((DATA / "zoo.json").read_text())
    print("| model | nodes | slurm-horus ms (median) | onnx-tool ms (median) | speed-up |")
    print("|---|---|---|---|---|")
    ratios = []
    for entry in zoo:
        path = DATA / entry["file"]
        ours_t, tool_t = [], []
        with tempfile.TemporaryDirectory() as tmp:
            tool_path = _onnx_tool_copy(entry, Path(tmp))
            inputs = {k: np.zeros([entry["dims"].get(d, d) if isinstance(d, str) else d
                                   for d in shape], dtype=np.float32)
                      for k, shape in entry["inputs"].items()}

            def run_tool():
                m = onnx_tool.Model(str(tool_path))
                m.graph.shape_infer(inputs)
                m.graph.profile()

            tool_ok = entry["torch_params"] <= args.tool_max_params
            tool_err = f"skipped: reads {entry['torch_params'] * 4 / 2**30:.1f} GiB of weights"
            for _ in range(args.repeat):
                ours_t.append(_time(lambda: extract_features(path, dims=entry["dims"])))
                if tool_ok:
                    try:
                        tool_t.append(_time(run_tool))
                    except Exception as e:  # onnx-tool lacks some ops; say so, keep going
                        tool_ok = False
                        tool_err = f"onnx-tool failed: {type(e).__name__}"
        n_nodes = int(extract_features(path, dims=entry["dims"]).values["n_nodes"])
        ours = statistics.median(ours_t) * 1e3
        if tool_t:
            tool = statistics.median(tool_t) * 1e3
            ratios.append(tool / ours)
            print(f"| {entry['name']} | {n_nodes} | {ours:.1f} | {tool:.1f} | {_ratio(tool / ours)} |")
        else:
            print(f"| {entry['name']} | {n_nodes} | {ours:.1f} | {tool_err} | - |")
    if ratios:
        print(f"\nSpeed-up over onnx-tool: median {_ratio(statistics.median(ratios))}, "
              f"min {_ratio(min(ratios))} over {len(ratios)} models.")
    cli = []
    for _ in range(max(args.repeat, 5)):
        cli.append(_time(lambda: subprocess.run(
            ["horus", "features", str(DATA / "zoo" / "resnet50.onnx"), "-b", "32", "--json"],
            check=True, capture_output=True)))
    print(f"`horus features resnet50.onnx -b 32 --json` CLI wall time: median "
          f"{statistics.median(cli) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
