"""The GPUMemNet measurements as a benchmark: rebuild each MLP run as an ONNX graph, featurize it.

The data (GPUMemNet authors, CC-BY-4.0) is never copied into the project: it is read from
`../shared/datasets/gpumemnet/` next to the repository root, or from $HORUS_GPUMEMNET_DIR.
Callers catch `DataMissing` (or test `data_dir() is None`) and skip, saying why.

    python benchmarks/gpumemnet.py [--limit N] [--workers 2] [--cache-dir DIR] [--no-cache]

builds (or loads from the cache) the feature table of the 3,000 MLP runs and prints a summary.
The table is cached outside the repository, in ~/.cache/slurm-horus/, keyed by a hash of the
CSV, the feature version and BUILDER_VERSION (bump it whenever `build_mlp_onnx` changes).
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.append(str(REPO_ROOT))  # after PYTHONPATH: bench_coldstart --rev runs older code

from slurm_horus.graph.features import FEATURE_VERSION, extract_features  # noqa: E402

ENV_VAR = "HORUS_GPUMEMNET_DIR"
DEFAULT_DIR = REPO_ROOT.parent / "shared" / "datasets" / "gpumemnet"
MLP_CSV = "mlp_training_runs.csv"
REAL_CSV = "real_models_memory.csv"
TIMM_CSV = "timm_training_memory.csv"
TIMM_OOM_MIB = 39_500  # at the 40 GB card's limit: the run ran out of memory
BUILDER_VERSION = 1
OPSET = 20
WEIGHTS_FILE = "weights.bin"  # external-data location named by the graphs, never created
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slurm-horus"

DCGM_COLUMNS = {"Avg GRACT": "gract", "Avg SMACT": "smact", "Avg SMOCC": "smocc",
                "Avg FP32A": "fp32a"}


class DataMissing(Exception):
    """The GPUMemNet data set is not where the benchmark looks for it."""

    def __init__(self, what: str = MLP_CSV):
        env = os.environ.get(ENV_VAR)
        where = f"${ENV_VAR}={env}" if env else str(DEFAULT_DIR)
        super().__init__(
            f"GPUMemNet data set not found: expected {what} in {where} "
            f"(set ${ENV_VAR} to the folder holding {MLP_CSV} and {REAL_CSV}); "
            "the data is not part of the project")


def data_dir() -> Path | None:
    """The folder holding the GPUMemNet CSVs, or None when it is absent."""
    env = os.environ.get(ENV_VAR)
    folder = Path(env).expanduser() if env else DEFAULT_DIR
    return folder if (folder / MLP_CSV).is_file() else None


def _csv_path(name: str) -> Path:
    folder = data_dir()
    if folder is None or not (folder / name).is_file():
        raise DataMissing(name)
    return folder / name


# --------------------------------------------------------------------------- MLP runs

def _filename_field(filename: str, key: str) -> str | None:
    m = re.search(rf"(?:^|_){key}:([^_]+)", filename)
    return m.group(1) if m else None


def parse_mlp_row(raw: dict[str, str], index: int | None = None) -> dict:
    """One CSV row (as csv.DictReader gives it) parsed into typed fields."""
    raw = {k.strip(): v for k, v in raw.items()}
    filename = raw["Filename"]
    width = _filename_field(filename, "input")
    if width is None:
        raise ValueError(f"no 'input:NNNN' in Filename {filename!r}")
    layers = [(str(t), int(w), int(p)) for t, w, p in ast.literal_eval(raw["Activations-Params"])]
    ratio = _filename_field(filename, "dropout")  # first match: the ratio, not the True/False flag
    try:
        dropout_ratio = float(ratio) if ratio is not None else None
    except ValueError:
        dropout_ratio = None
    row = {
        "row_id": "mlp-" + hashlib.sha1(filename.encode()).hexdigest()[:12],
        "index": index,
        "filename": filename,
        "input_width": int(width),
        "output_width": layers[-1][1] if layers else None,
        "arch": _filename_field(filename, "arch"),
        "layers": layers,
        "depth": int(raw["Depth"]),
        "batch_size": int(raw["Batch Size"]),
        "activation": raw["Activation Function"],
        "dropout_ratio": dropout_ratio,
        "total_parameters": int(raw["Total Parameters"]),
        "total_activations": int(raw["Total Activations"]),
        "bn_layers": int(raw["Batch Normalization Layers"]),
        "dropout_layers": int(raw["Dropout Layers"]),
        "mem_mib": float(raw["Max GPU Memory (MiB)"]),
        "util_pct": float(raw["Avg GPUTL"]),
    }
    for column, key in DCGM_COLUMNS.items():
        row[key] = float(raw[column])
    return row


def mlp_rows() -> list[dict]:
    """The 3,000 MLP training runs, parsed; raises DataMissing when the data is absent."""
    with open(_csv_path(MLP_CSV), newline="") as f:
        return [parse_mlp_row(raw, i) for i, raw in enumerate(csv.DictReader(f))]


# --------------------------------------------------------------------------- ONNX builder

class LayerMismatch(ValueError):
    """A layer tuple whose parameter count does not match the layer it describes."""


def _external(name: str, dims: list[int], location: str = WEIGHTS_FILE):
    import onnx
    from onnx import TensorProto

    t = onnx.TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    n = 1
    for d in dims:
        n *= d
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * n))):
        e = t.external_data.add()
        e.key, e.value = key, value
    return t


ACTIVATIONS = {  # layer type -> (ONNX op, attributes); SiLU, PReLU, Identity handled apart
    "ReLU": ("Relu", {}), "Tanh": ("Tanh", {}), "Sigmoid": ("Sigmoid", {}),
    "Softplus": ("Softplus", {}), "SELU": ("Selu", {}), "ELU": ("Elu", {"alpha": 1.0}),
    "LeakyReLU": ("LeakyRelu", {"alpha": 0.01}), "GELU": ("Gelu", {}), "Mish": ("Mish", {}),
    "Softmax": ("Softmax", {"axis": -1}),
}


def build_mlp_onnx(row: dict, path: str | os.PathLike) -> dict:
    """Write the run's MLP as the ONNX graph PyTorch's exporter gives for a training-mode model.

    Linear -> Gemm(transB=1) with W[out, in], B[out]; BatchNorm1d -> BatchNormalization
    (training_mode=1, so with its two running-statistics outputs); Dropout -> Dropout(ratio,
    training_mode=True), its ratio from the filename; SiLU -> Sigmoid + Mul; PReLU -> PRelu
    with one slope (nn.PReLU() default); Identity -> nothing. Weights are external-data
    initializers pointing at a file that is never written, so graphs stay tiny.
    Returns {"params": ..., "prelu_params": ..., "nodes": [...op types]}: `params` counts
    trainable float elements (Gemm, BN scale/bias, PReLU slope; not BN running statistics).
    Raises LayerMismatch when a tuple's parameter count disagrees with the layer rebuilt.
    """
    from onnx import TensorProto, helper

    nodes, inits = [], []
    prev, width = "x", int(row["input_width"])
    params = prelu_params = 0
    ratio = row.get("dropout_ratio")
    ratio = 0.5 if ratio is None else float(ratio)  # nn.Dropout() default
    shared: dict[str, str] = {}

    def scalar(name, dtype, value):
        if name not in shared:
            inits.append(helper.make_tensor(name, dtype, [], [value]))
            shared[name] = name
        return name

    for i, (kind, out, count) in enumerate(row["layers"]):
        y = f"{kind.lower()}_{i}"
        where = f"layer {i} {(kind, out, count)} of {row.get('filename', row.get('row_id'))}"
        if kind == "linear":
            expect = out * width + out
            if count != expect:
                raise LayerMismatch(f"{where}: Linear({width}, {out}) has {expect} parameters")
            inits += [_external(f"fc{i}.weight", [out, width]), _external(f"fc{i}.bias", [out])]
            nodes.append(helper.make_node("Gemm", [prev, f"fc{i}.weight", f"fc{i}.bias"], [y],
                                          name=f"/fc{i}/Gemm", alpha=1.0, beta=1.0, transB=1))
            params += expect
            width = out
            prev = y
            continue
        if out != width:
            raise LayerMismatch(f"{where}: width {out} does not follow the previous {width}")
        if kind == "batch_normalization":
            if count != 2 * out:
                raise LayerMismatch(f"{where}: BatchNorm1d({out}) has {2 * out} parameters")
            names = [f"bn{i}.{s}" for s in ("weight", "bias", "running_mean", "running_var")]
            inits += [_external(n, [out]) for n in names]
            # training mode needs all three outputs: Y and the updated running statistics
            stats_out = [f"bn{i}.running_mean_out", f"bn{i}.running_var_out"]
            nodes.append(helper.make_node("BatchNormalization", [prev, *names], [y, *stats_out],
                                          name=f"/bn{i}/BatchNormalization", epsilon=1e-5,
                                          momentum=0.9, training_mode=1))
            params += 2 * out
        elif kind == "dropout":
            if count:
                raise LayerMismatch(f"{where}: Dropout has no parameters")
            r = scalar("dropout.ratio", TensorProto.FLOAT, ratio)
            t = scalar("dropout.training_mode", TensorProto.BOOL, True)
            nodes.append(helper.make_node("Dropout", [prev, r, t], [y], name=f"/drop{i}/Dropout"))
        elif kind == "Identity":
            if count:
                raise LayerMismatch(f"{where}: Identity has no parameters")
            continue  # the exporter emits nothing for nn.Identity
        elif kind == "SiLU":
            if count:
                raise LayerMismatch(f"{where}: SiLU has no parameters")
            nodes += [helper.make_node("Sigmoid", [prev], [f"{y}_sig"], name=f"/act{i}/Sigmoid"),
                      helper.make_node("Mul", [prev, f"{y}_sig"], [y], name=f"/act{i}/Mul")]
        elif kind == "PReLU":
            # nn.PReLU() has one slope; the data set's tuples say 0 (its count leaves it out)
            if count not in (0, 1):
                raise LayerMismatch(f"{where}: PReLU() has 1 parameter")
            inits.append(_external(f"prelu{i}.weight", [1]))
            nodes.append(helper.make_node("PRelu", [prev, f"prelu{i}.weight"], [y],
                                          name=f"/act{i}/PRelu"))
            params += 1
            prelu_params += 1
        elif kind in ACTIVATIONS:
            if count:
                raise LayerMismatch(f"{where}: {kind} has no parameters")
            op, attrs = ACTIVATIONS[kind]
            nodes.append(helper.make_node(op, [prev], [y], name=f"/act{i}/{op}", **attrs))
        else:
            raise LayerMismatch(f"{where}: unknown layer type {kind!r}")
        prev = y
    if prev == "x":
        raise LayerMismatch(f"{row.get('filename', row.get('row_id'))}: no layers")
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", int(row["input_width"])])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pytorch", producer_version="2.x (rebuilt)")
    model.ir_version = 9
    Path(path).write_bytes(model.SerializeToString())
    return {"params": params, "prelu_params": prelu_params, "nodes": [n.op_type for n in nodes]}


def graph_param_count(path: str | os.PathLike) -> int:
    """Trainable float elements of a rebuilt graph: every float initializer with a dimension,
    less BatchNormalization running statistics (inputs 3 and 4)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    stats = {n.input[i] for n in g.node if n.op_type == "BatchNormalization" for i in (3, 4)
             if len(n.input) > i}
    total = 0
    for t in g.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) and t.name not in stats:
            n = 1
            for d in t.dims:
                n *= d
            total += n
    return total


def check_param_counts(rows: list[dict]) -> dict:
    """Rebuild every row and compare its parameter count with the `Total Parameters` column.

    The data set's tuples give PReLU 0 parameters, so its total leaves out the one slope of
    each nn.PReLU(): a row's expected gap is exactly its number of PReLU layers. Anything
    else is an unexplained mismatch (or a LayerMismatch raised by the builder).
    """
    out = {"rows": 0, "exact": 0, "prelu_only": 0, "unexplained": [], "errors": []}
    with tempfile.TemporaryDirectory(prefix="gpumemnet-") as tmp:
        path = Path(tmp) / "mlp.onnx"
        for row in rows:
            out["rows"] += 1
            try:
                built = build_mlp_onnx(row, path)
            except LayerMismatch as e:
                out["errors"].append(str(e))
                continue
            counted = graph_param_count(path)
            if counted != built["params"]:
                out["unexplained"].append((row["row_id"], counted, built["params"]))
            gap = counted - row["total_parameters"]
            if gap == 0:
                out["exact"] += 1
            elif gap == built["prelu_params"]:
                out["prelu_only"] += 1
            else:
                out["unexplained"].append((row["row_id"], counted, row["total_parameters"]))
    return out


# --------------------------------------------------------------------------- feature table

def _featurize(row: dict) -> tuple[str, dict | None, str | None]:
    try:
        with tempfile.TemporaryDirectory(prefix="gpumemnet-") as tmp:
            path = Path(tmp) / "mlp.onnx"
            build_mlp_onnx(row, path)
            report = extract_features(path, batch_size=row["batch_size"])
            return row["row_id"], {k: float(v) for k, v in report.values.items()}, None
    except Exception as e:  # reported per row, never kills the pool
        return row["row_id"], None, f"{type(e).__name__}: {e}"


def cache_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache file for the current CSV, feature version and builder version."""
    h = hashlib.sha256()
    with open(_csv_path(MLP_CSV), "rb") as f:
        h.update(f.read())
    h.update(f"features={FEATURE_VERSION};builder={BUILDER_VERSION}".encode())
    for stage in sorted((Path(__file__).resolve().parents[1] / "slurm_horus" / "graph").glob("*.py")):
        h.update(stage.read_bytes())  # any change to the graph stage
    folder = Path(cache_dir) if cache_dir else DEFAULT_CACHE_DIR
    return folder / f"gpumemnet-{h.hexdigest()[:16]}.json"


def mlp_feature_table(limit: int | None = None, cache_dir: str | os.PathLike | None = None,
                      workers: int = 2, use_cache: bool = True,
                      progress: bool = True) -> list[tuple[dict, dict]]:
    """(row, features) for the first `limit` MLP runs (all when None), in CSV order.

    Features already in the cache are reused; the rest are computed with `workers` processes
    and merged into the cache. Rows whose graph could not be featurized are left out (and
    reported on stderr). Raises DataMissing when the data is absent.
    """
    rows = mlp_rows()
    if limit is not None:
        rows = rows[:limit]
    cached: dict[str, dict] = {}
    path = cache_path(cache_dir) if use_cache else None
    if path is not None and path.is_file():
        try:
            cached = json.loads(path.read_text()).get("features", {})
        except (OSError, ValueError):
            cached = {}
    todo = [r for r in rows if r["row_id"] not in cached]
    errors: dict[str, str] = {}
    if todo:
        started = time.monotonic()
        if progress:
            print(f"gpumemnet: featurizing {len(todo)} graphs ({len(rows) - len(todo)} cached) "
                  f"with {workers} workers", file=sys.stderr)
        results = _run_pool(todo, workers)
        for n, (row_id, values, error) in enumerate(results, 1):
            if values is None:
                errors[row_id] = error
            else:
                cached[row_id] = values
            if progress and (n % 250 == 0 or n == len(todo)):
                print(f"gpumemnet: {n}/{len(todo)} graphs, {time.monotonic() - started:.1f} s",
                      file=sys.stderr)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"feature_version": FEATURE_VERSION,
                                       "builder_version": BUILDER_VERSION,
                                       "features": cached}))
            os.replace(tmp, path)
    for row_id, error in errors.items():
        print(f"gpumemnet: {row_id}: {error}", file=sys.stderr)
    return [(r, cached[r["row_id"]]) for r in rows if r["row_id"] in cached]


def _run_pool(rows: list[dict], workers: int):
    """Featurize `rows` in order, lazily, so the caller can report progress."""
    if workers <= 1 or len(rows) < 8:
        yield from map(_featurize, rows)
        return
    import multiprocessing as mp

    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else None)
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_featurize, rows, chunksize=16)


# --------------------------------------------------------------------------- real models

def _number(text: str) -> float | None:
    text = text.strip()
    if text in ("", "-"):
        return None
    return float(text)


def real_model_rows() -> list[dict]:
    """The 18 well-known models' measured peaks beside the three other methods' estimates.

    The model name appears only on the first row of each pair (the second carries it forward).
    Repeated header lines and repeated (model, batch size) rows are dropped.
    """
    out, seen, name = [], set(), None
    with open(_csv_path(REAL_CSV), newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        for values in reader:
            cells = [v.strip() for v in values]
            if not any(cells) or cells[1:] == header[1:]:
                continue  # blank line or a repeated header
            raw = dict(zip(header, cells))
            name = raw[header[0]] or name
            key = (name, int(raw["batch_size"]))
            if key in seen:
                continue
            seen.add(key)
            out.append({"name": name, "batch_size": key[1],
                        "mem_mib": _number(raw["Actual GPU memory"]),
                        "gpumemnet": _number(raw["GPUMemNet"]),
                        "faketensor": _number(raw["FakeTensor"]),
                        "horus": _number(raw["Horus"])})
    return out


# --------------------------------------------------------------------------- timm runs

def timm_rows() -> list[dict]:
    """timm_training_memory.csv as dicts: model, batch_size, peak_mib, faketensor_mib (or None)."""
    with open(_csv_path(TIMM_CSV), newline="") as f:
        return [{"model": r["model"], "batch_size": int(r["batch_size"]),
                 "peak_mib": float(r["peak_mib"]),
                 "faketensor_mib": float(r["faketensor_mib"]) if r["faketensor_mib"] else None}
                for r in csv.DictReader(f)]


def clean_timm_rows(rows: list[dict]) -> list[dict]:
    """The clean-row rule (the data set's README): drop out-of-memory rows (>= TIMM_OOM_MIB),
    then rows below the same model's peak at a smaller batch among the rows kept (unstable
    runs: memory cannot shrink as the batch grows)."""
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        if r["peak_mib"] < TIMM_OOM_MIB:
            by_model.setdefault(r["model"], []).append(r)
    kept = []
    for runs in by_model.values():
        runs.sort(key=lambda r: r["batch_size"])
        kept += [r for i, r in enumerate(runs)
                 if not any(r["peak_mib"] < s["peak_mib"] for s in runs[:i])]
    return kept


# --------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="only the first N MLP runs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache-dir", default=None, help=f"default {DEFAULT_CACHE_DIR}")
    ap.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    ap.add_argument("--check-params", action="store_true",
                    help="also rebuild every row and compare parameter counts")
    args = ap.parse_args(argv)
    try:
        started = time.monotonic()
        table = mlp_feature_table(args.limit, args.cache_dir, args.workers,
                                  use_cache=not args.no_cache)
        elapsed = time.monotonic() - started
        reals = real_model_rows()
    except DataMissing as e:
        print(f"skipped: {e}", file=sys.stderr)
        return 0
    print(f"MLP runs featurized: {len(table)} in {elapsed:.1f} s"
          + ("" if args.no_cache else f" (cache {cache_path(args.cache_dir)})"))
    if table:
        mem = sorted(r["mem_mib"] for r, _ in table)
        params = sorted(f["params"] for _, f in table)
        print(f"  peak memory MiB: min {mem[0]:.0f}, median {mem[len(mem) // 2]:.0f}, "
              f"max {mem[-1]:.0f}; params: min {params[0]:.0f}, max {params[-1]:.0f}")
        bad = sum(1 for r, f in table if f["n_unknown_ops"])
        print(f"  graphs with ops the cost model does not know: {bad}")
    print(f"real models: {len(reals)} rows")
    if args.check_params:
        rows = mlp_rows()[:args.limit] if args.limit else mlp_rows()
        res = check_param_counts(rows)
        print(f"parameter check: {res['rows']} rows, {res['exact']} exact, "
              f"{res['prelu_only']} off by their PReLU slopes only, "
              f"{len(res['unexplained'])} unexplained, {len(res['errors'])} builder errors")
        for item in (res["unexplained"] + res["errors"])[:10]:
            print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
