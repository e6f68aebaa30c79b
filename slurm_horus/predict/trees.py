"""The learned model's regression trees as plain arrays: read from JSON, checked, walked with numpy.

A model file serves every job of a site, so its trees are checked whole when read: arrays of the
right kind, split features that exist, children after their parent within their own tree (every
path ends at a leaf), finite values, and outputs that cannot add up beyond a bound. No pickle is
ever loaded, and predicting does not import scikit-learn.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from slurm_horus.errors import HorusError

TREE_KEYS = ("feature", "threshold", "missing_left", "left", "right", "leaf", "value")
KINDS = {"feature": "iu", "left": "iu", "right": "iu", "missing_left": "biu", "leaf": "biu",
         "threshold": "iuf", "value": "iuf"}
# The packed (format 2) layout: each array as little-endian bytes, base64 in the JSON file, so a
# 300-tree model parses in a few milliseconds instead of a quarter of a million JSON numbers.
PACKED = {"sizes": "<i4", "feature": "<i4", "threshold": "<f8", "missing_left": "|u1",
          "left": "<i4", "right": "<i4", "leaf": "|u1", "value": "<f8"}
# What a model file may hold: retrain fits at most 2,000 trees of 31 leaves (61 nodes, depth at
# most 30) per ensemble. Predicting walks one numpy step per level, so a file of one
# million-node chain had taken hsubmit 20 s; these bounds keep any file's walk to milliseconds.
MAX_TREES = 4000
MAX_TREE_NODES = 1023
MAX_DEPTH = 64
# Rows walked at once: each step indexes rows x trees arrays, which for the history export's
# 100,000 rows were 160 MB each; blocks of 1,024 rows give the same answers in far less memory
# and time (BENCHMARKS.md section 5).
PREDICT_CHUNK = 1024


@dataclass(frozen=True)
class FlatTrees:
    """Every tree of an ensemble in one set of arrays: tree k's nodes start at roots[k] and its
    children indices are global, so all trees are walked at once (one numpy step per level)."""

    sizes: object
    roots: object
    feature: object
    threshold: object
    missing_left: object
    left: object
    right: object
    leaf: object
    value: object
    depth: int  # the longest path (checked against MAX_DEPTH when the file is read)


def _from_lists(trees) -> tuple:
    """(sizes, columns) of trees stored as lists (format 1, and scikit-learn's nodes)."""
    if not isinstance(trees, list) or not trees:
        raise HorusError("malformed model file (no trees)")
    if len(trees) > MAX_TREES:
        raise HorusError(f"model file holds {len(trees):,} trees (at most {MAX_TREES:,})")
    cols: dict[str, list] = {k: [] for k in TREE_KEYS}
    sizes = []
    for t in trees:
        if not isinstance(t, dict) or set(TREE_KEYS) - set(t):
            raise HorusError("malformed tree in model file")
        n = len(t["value"]) if isinstance(t["value"], list) else 0
        if n == 0 or any(not isinstance(t[k], list) or len(t[k]) != n for k in TREE_KEYS):
            raise HorusError("malformed tree in model file")
        if n > MAX_TREE_NODES:  # before its lists are copied: one of 2 million nodes took 5 s
            raise HorusError(f"model file holds a tree of {n:,} nodes (at most {MAX_TREE_NODES:,})")
        sizes.append(n)
        for k in TREE_KEYS:
            cols[k] += t[k]
    try:
        return np.asarray(sizes), {k: np.asarray(v) for k, v in cols.items()}
    except (ValueError, TypeError):  # ragged or nested lists
        raise HorusError("malformed tree in model file") from None


def _from_packed(packed) -> tuple:
    """(sizes, columns) of packed trees (format 2)."""
    if not isinstance(packed, dict) or set(PACKED) - set(packed):
        raise HorusError("malformed model file (packed trees)")
    try:
        a = {k: np.frombuffer(base64.b64decode(packed[k], validate=True), dtype=dt)
             for k, dt in PACKED.items()}
    except (TypeError, ValueError, binascii.Error):
        raise HorusError("malformed model file (packed trees are not base64 arrays)") from None
    sizes = a.pop("sizes")
    if not len(sizes) or (sizes < 1).any() or any(len(v) != sizes.sum() for v in a.values()):
        raise HorusError("malformed model file (packed tree sizes)")
    return sizes, a


def _flat_trees(sizes, a: dict, n_inputs: int) -> FlatTrees:
    """Trees' arrays (children numbered within their tree), checked all at once: numbers of
    the right kind, split features that exist, and children after their parent within their own
    tree (so every path ends at a leaf)."""
    for k, kinds in KINDS.items():
        if a[k].ndim != 1 or a[k].dtype.kind not in kinds:
            raise HorusError(f"malformed tree in model file ('{k}' holds "
                             f"{'non-numbers' if kinds != 'iu' else 'non-integers'})")
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) > MAX_TREES or sizes.max() > MAX_TREE_NODES:
        raise HorusError(f"model file holds {len(sizes):,} trees of up to {sizes.max():,} nodes "
                         f"(at most {MAX_TREES:,} of {MAX_TREE_NODES:,})")
    roots = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    start = np.repeat(roots, sizes)          # each node's tree's first node
    end = start + np.repeat(sizes, sizes)    # and one past its last
    nodes = np.arange(len(start))
    leaf = a["leaf"].astype(bool)
    split = ~leaf
    if not ((a["feature"][split] >= 0) & (a["feature"][split] < n_inputs)).all():
        raise HorusError("malformed tree in model file (feature index out of range "
                         f"0..{n_inputs - 1})")
    left, right = a["left"].astype(np.int64) + start, a["right"].astype(np.int64) + start
    for child in (left, right):
        if not ((child[split] > nodes[split]) & (child[split] < end[split])).all():
            raise HorusError("malformed tree in model file (child index out of range)")
    value, threshold = a["value"].astype(float), a["threshold"].astype(float)
    if not np.isfinite(value).all() or np.isnan(threshold[split]).any():
        raise HorusError("malformed tree in model file (NaN or infinite values)")
    left, right = np.where(split, left, nodes), np.where(split, right, nodes)  # leaves stay put
    feature = np.where(split, a["feature"], 0)  # a leaf's feature is never read; keep it valid
    return FlatTrees(sizes=sizes, roots=roots, feature=feature, threshold=threshold,
                     missing_left=a["missing_left"].astype(bool), left=left, right=right,
                     leaf=leaf, value=value, depth=_depth(roots, left, right, split))


def _depth(roots, left, right, split) -> int:
    """The longest root-to-leaf path of checked trees (children after their parent), level by
    level over every tree at once, each node once per level (a mask: children shared by many
    parents cost nothing more); HorusError beyond MAX_DEPTH."""
    level, depth = roots[split[roots]], 0
    reached = np.zeros(len(split), dtype=bool)
    while len(level):
        depth += 1
        if depth > MAX_DEPTH:
            raise HorusError(f"malformed tree in model file (deeper than {MAX_DEPTH} levels)")
        reached[:] = False
        reached[left[level]] = True
        reached[right[level]] = True
        level = np.flatnonzero(reached & split)
    return depth


@dataclass
class TreeEnsemble:
    """Additive regression trees as checked arrays; predict() walks them all at once."""

    baseline: float
    flat: FlatTrees

    @classmethod
    def from_sklearn(cls, est, n_inputs: int, columns=None) -> "TreeEnsemble":
        """Copy a fitted HistGradientBoostingRegressor's trees (numeric splits only) over
        n_inputs input columns; ``columns``: the input column each of the estimator's features
        is (when it was fitted on some columns only)."""
        trees = []
        for (predictor,) in est._predictors:
            nodes = predictor.nodes.copy()
            if nodes["is_categorical"].any():
                raise HorusError("categorical splits are not supported in the JSON format")
            if columns is not None:
                split = ~nodes["is_leaf"].astype(bool)
                nodes["feature_idx"][split] = np.asarray(columns)[nodes["feature_idx"][split]]
            trees.append({k: nodes[src].tolist() for k, src in (
                ("feature", "feature_idx"), ("threshold", "num_threshold"),
                ("missing_left", "missing_go_to_left"), ("left", "left"), ("right", "right"),
                ("leaf", "is_leaf"), ("value", "value"))})
        baseline = float(est._baseline_prediction.ravel()[0])
        return cls(baseline=baseline, flat=_flat_trees(*_from_lists(trees), n_inputs))

    @classmethod
    def from_dict(cls, d: dict, n_inputs: int, max_abs: float) -> "TreeEnsemble":
        """Refuses anything but checked trees over n_inputs columns whose outputs, in the worst
        case, stay within +-max_abs. Reads packed trees (format 2) and lists of trees (format 1)."""
        baseline = d["baseline"]
        if type(baseline) not in (int, float) or not abs(baseline) <= max_abs:
            raise HorusError(f"baseline {baseline!r} is not a number within +-{max_abs:g}")
        parts = _from_packed(d["packed"]) if "packed" in d else _from_lists(d["trees"])
        f = _flat_trees(*parts, n_inputs)
        reach = abs(baseline) + float(
            np.maximum.reduceat(np.where(f.leaf, np.abs(f.value), 0.0), f.roots).sum())
        if reach > max_abs:
            raise HorusError(f"trees can add up to {reach:.3g}, beyond +-{max_abs:g}")
        return cls(baseline=float(baseline), flat=f)

    def to_dict(self) -> dict:
        """The packed form (children numbered within their tree, as in the list form)."""
        f = self.flat
        start = np.repeat(f.roots, f.sizes)
        cols = {"sizes": f.sizes, "feature": f.feature, "threshold": f.threshold,
                "missing_left": f.missing_left, "left": f.left - start,
                "right": f.right - start, "leaf": f.leaf, "value": f.value}
        return {"baseline": self.baseline, "packed": {
            k: base64.b64encode(np.ascontiguousarray(cols[k], dtype=dt).tobytes()).decode()
            for k, dt in PACKED.items()}}

    def predict(self, X):
        X = np.asarray(X, dtype=float)
        if len(X) > PREDICT_CHUNK:  # rows are independent: the same figures, a bounded walk
            return np.concatenate([self.predict(X[i:i + PREDICT_CHUNK])
                                   for i in range(0, len(X), PREDICT_CHUNK)])
        f = self.flat
        n, k = len(X), len(f.roots)
        node = np.tile(f.roots, n)  # one walker per row and tree, row by row
        row = np.repeat(np.arange(n), k)
        walking = np.flatnonzero(~f.leaf[node])
        while len(walking):  # at most f.depth steps: children come after their parent
            at = node[walking]
            x = X[row[walking], f.feature[at]]
            go_left = np.where(np.isnan(x), f.missing_left[at], x <= f.threshold[at])
            node[walking] = at = np.where(go_left, f.left[at], f.right[at])
            walking = walking[~f.leaf[at]]  # only the walkers not at a leaf step again
        return self.baseline + f.value[node].reshape(n, k).sum(axis=1)
