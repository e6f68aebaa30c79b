"""Review 8 of retraining and the model registry: hostile model files cost a reader no more than
the largest one retrain writes."""

import json
from pathlib import Path

import numpy as np
import pytest

from slurm_horus.errors import HorusError
from slurm_horus.predict.chain import choose_predictor
from slurm_horus.predict.learned import MAX_MODEL_BYTES, LearnedModel, fit, probe_rows
from slurm_horus.predict.registry import Registry
from slurm_horus.predict.trees import MAX_TREES


@pytest.fixture(scope="module")
def model_json() -> str:
    """A small trained model (the probe set's jobs, memory 20 % over the cold start)."""
    rng = np.random.default_rng(0)
    rows = np.repeat(np.asarray(probe_rows()), 5, axis=0)
    cold = np.full(len(rows), 4000.0)
    return fit(rows, cold * 1.2 * rng.uniform(0.95, 1.05, len(rows)),
               rng.uniform(20, 80, len(rows)), cold, max_iter=20).to_json()


def _registry(root: Path, text: str | bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "v0001.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    (root / "current.json").write_text(json.dumps({"serving": "v0001", "history": []}))
    return root


def test_a_model_file_of_millions_of_empty_lists_is_refused_before_it_is_parsed(tmp_path):
    # 16 MiB of [] had been parsed whole (5.6 million lists: 2 s and 390 MB on every hsubmit)
    # before the format was even looked at
    head, tail = b'{"format":"slurm-horus-learned","format_version":2,"x":[', b"[]]}"
    n = (MAX_MODEL_BYTES - len(head) - len(tail)) // 3
    root = _registry(tmp_path / "models", head + b"[]," * n + tail)
    with pytest.raises(HorusError, match="objects and lists, more than readers take"):
        Registry(root).load("v0001")
    choice = choose_predictor(root)
    assert choice.estimator.name == "cold-start" and "objects and lists" in choice.warning


def test_a_format_1_model_of_the_most_trees_the_loader_takes_still_loads(model_json, tmp_path):
    """The cap on objects and lists leaves every file the tree checks take: two ensembles of
    MAX_TREES trees as lists (format 1), the most objects and lists a model may hold."""
    from test_robustness import _as_lists

    d = _as_lists(json.loads(model_json))
    leaf = {"feature": [0], "threshold": [0.0], "missing_left": [0], "left": [0],
            "right": [0], "leaf": [1], "value": [0.0]}  # adds nothing to any answer
    for part in ("mem", "util"):
        d[part]["trees"] += [leaf] * (MAX_TREES - len(d[part]["trees"]))
    text = json.dumps(d)
    assert len(text) <= MAX_MODEL_BYTES
    root = _registry(tmp_path / "models", text)
    rows = np.asarray(probe_rows())
    got = Registry(root).load("v0001")
    want = LearnedModel.from_json(model_json)
    assert np.allclose(got.mem.predict(rows), want.mem.predict(rows))


def test_a_model_listing_the_most_seen_rows_answers_as_fast_as_one_listing_a_few(model_json):
    """familiar() had compared each row with each seen GPU and workload row in a Python loop:
    a file listing MAX_SEEN of each cost 58 ms an answer, 2 s for hsubmit's 35 GPU types."""
    import time

    from slurm_horus.predict.learned import MAX_SEEN, SEEN_COLUMNS

    few = LearnedModel.from_json(model_json)
    d = json.loads(model_json)
    for kind, cols in SEEN_COLUMNS.items():
        d["seen"][kind] += [[-1.0 - i] * len(cols) for i in range(MAX_SEEN - len(d["seen"][kind]))]
    many = LearnedModel.from_json(json.dumps(d))
    rows = np.asarray(probe_rows())
    cold_mem, cold_util = np.full(len(rows), 4000.0), np.full(len(rows), 50.0)
    assert [a.tolist() for a in many.answer(rows, cold_mem, cold_util)] == \
        [a.tolist() for a in few.answer(rows, cold_mem, cold_util)]

    def cost(model) -> float:  # the best of three: a pause of the machine is not the model's
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for row in rows:
                model.answer(row[None], cold_mem[:1], cold_util[:1])
            best = min(best, time.perf_counter() - start)
        return best

    assert cost(many) < 30 * cost(few) + 0.02  # a hang guard: the old code took 300x


def test_a_damaged_registry_state_says_how_to_repair_it(tmp_path):
    """A current.json cut short failed retrain, promote and list alike with 'unreadable registry
    state', and nothing said what to do; removing it and promoting a version repairs it."""
    from click.testing import CliRunner

    from slurm_horus.cli.admin import main as admin

    (tmp_path / "current.json").write_text('{"serving": "v0001", "hist')
    r = CliRunner().invoke(admin, ["models", "list", "--model-dir", str(tmp_path)])
    assert r.exit_code != 0 and "unreadable registry state" in r.output, r.output
    assert "an admin may remove it" in r.output and "models promote VERSION" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
