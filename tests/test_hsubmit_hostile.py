"""hsubmit against hostile or odd input (a review's findings, kept as cases): a graph that asks
for huge memory or time, external data outside the model's folder, an endless script on stdin,
a FIFO in the model registry, sbatch's own --task and 25.11 options, undecodable Slurm output, a
script sbatch must read itself, sbatch killed by a signal.  The job is always submitted, with
the user's options, unless sbatch itself would refuse it."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from slurm_horus.errors import HorusError, ModelError
from slurm_horus.graph.features import extract_features
from slurm_horus.graph.limits import analysis_limits
from slurm_horus.slurm import sbatch_args as sa
from slurm_horus.slurm import submit as sub
from slurm_horus.slurm.hint import parse_workload

ZOO = Path(__file__).resolve().parent / "data" / "zoo"


def _range_bomb(path: Path) -> Path:
    """183 bytes that make ONNX's shape inference build a 300-million-element tensor."""
    inits = [numpy_helper.from_array(np.array(v, dtype=np.int64), name)
             for name, v in (("z", 0), ("lim", 300_000_000), ("one", 1))]
    nodes = [helper.make_node("Range", ["z", "lim", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["x"], ["y"])]
    g = helper.make_graph(nodes, "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("rf", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def hsubmit(args, env, **kw):
    if "input" not in kw:
        kw["stdin"] = subprocess.DEVNULL  # the stand-in sbatch drains its stdin
    return subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", *args],
                          capture_output=True, text=True, timeout=120, env=env, **kw)


def test_a_graph_that_builds_huge_values_is_submitted_without_a_hint(tmp_path, slurm_bin):
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(_range_bomb(tmp_path / "b.onnx")),
                  "--wrap", "true"], env)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    assert "MiB of memory" in cp.stderr and "submitting the job unchanged" in cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1
    assert log.read_text().split("\n")[:3] == ["-p", "gpu", "--gres=gpu:1"]
    assert "horus:" not in log.read_text()
    # undecodable bytes in scontrol's output (a node's Reason) cost no real model its hint
    ok = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"),
                  "--batch-size", "8", "--wrap", "true"], env)
    assert ok.returncode == 0 and "horus:v1;a100=" in log.read_text(), ok.stderr


def test_the_limits_raise_a_model_error_and_are_restored():
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    with pytest.raises(ModelError, match="more than 64 MiB"):
        with analysis_limits("m.onnx", mem_mib=64):
            bytearray(1 << 30)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    bytearray(1 << 28)  # the process may grow again
    with pytest.raises(ModelError, match="more than 0.2 s"):
        with analysis_limits("m.onnx", timeout_s=0.2):
            while True:
                pass
    with analysis_limits("m.onnx", timeout_s=0.2):
        pass
    import time
    time.sleep(0.3)  # no timer left behind


def _external_shape_model(folder: Path) -> Path:
    """An Expand whose target shape is a Constant kept in an external file, "shape.bin"."""
    shape = TensorProto(name="s_t", data_type=TensorProto.INT64, dims=[3],
                        data_location=TensorProto.EXTERNAL)
    for k, v in (("location", "shape.bin"), ("offset", "0"), ("length", "24")):
        shape.external_data.add(key=k, value=v)
    nodes = [helper.make_node("Constant", [], ["s"], value=shape),
             helper.make_node("Identity", ["s"], ["s2"]),
             helper.make_node("Expand", ["x", "s2"], ["e"]),
             helper.make_node("Relu", ["e"], ["z"]),
             helper.make_node("Foo", ["x"], ["c"], domain="custom")]
    g = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("c", TensorProto.FLOAT, ["q"])])
    path = folder / "ext.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]),
              path)
    return path


def test_external_data_is_never_read_from_the_working_directory(tmp_path, monkeypatch):
    """numpy_helper opens a tensor's external location relative to the working directory, outside
    the model's folder: the analysis must never ask it to."""
    import onnx.external_data_helper as edh

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    path = _external_shape_model(model_dir)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "shape.bin").write_bytes(np.array([64, 4, 64], dtype=np.int64).tobytes())
    monkeypatch.chdir(cwd)
    opened = []
    real = edh._read_external_data_bytes
    monkeypatch.setattr(edh, "_read_external_data_bytes",
                        lambda tensor, *a, **k: opened.append(tensor.name) or real(tensor, *a, **k))
    try:
        extract_features(path, batch_size=4)
    except HorusError:
        pass
    assert opened == []


def test_a_script_on_stdin_is_read_only_up_to_sbatchs_limit(monkeypatch):
    monkeypatch.setattr(sub, "MAX_STDIN_SCRIPT", 100)
    with pytest.raises(HorusError, match="too big"):
        sub.prepare(["--model", "m.onnx"], env={}, stdin=io.BytesIO(b"#!/bin/sh\n" * 1000))
    plan = sub.prepare(["--model", "m.onnx"], env={}, stdin=io.BytesIO(b"#!/bin/sh\ntrue\n"))
    assert plan.stdin_script == b"#!/bin/sh\ntrue\n"
    # the whole script goes to sbatch; only its head is decoded for the directives
    monkeypatch.setattr(sub, "MAX_STDIN_SCRIPT", 1 << 20)
    monkeypatch.setattr(sub, "DIRECTIVE_BYTES", 64)
    body = b"#!/bin/sh\n#SBATCH -J early\n" + b"echo x\n" * 1000 + b"#SBATCH -J late\n"
    plan = sub.prepare(["--model", "m.onnx"], env={}, stdin=io.BytesIO(body))
    assert plan.stdin_script == body and len(plan.script_text) <= 64


def test_a_fifo_in_the_model_registry_does_not_hang(tmp_path):
    from slurm_horus.predict.chain import choose_predictor

    reg = tmp_path / "reg"
    reg.mkdir()
    os.mkfifo(reg / "current.json")
    out = []
    t = threading.Thread(target=lambda: out.append(choose_predictor(str(reg))), daemon=True)
    t.start()
    t.join(30)
    assert out and "not a regular file" in (out[0].warning or "")


@pytest.mark.parametrize("argv,horus_task", [
    (["--task", "4", "--model", "m.onnx", "--wrap", "true"], None),
    (["--task=2", "--model", "m.onnx", "--wrap", "true"], None),
    (["--task", "infer", "--model", "m.onnx", "--wrap", "true"], "infer"),
])
def test_a_task_count_is_sbatchs_even_with_a_model(argv, horus_task):
    plan = sub.prepare(argv, env={})
    assert plan.horus.get("task") == horus_task and plan.model == "m.onnx"
    assert ("--task" in " ".join(plan.sbatch_argv)) == (horus_task is None)


@pytest.mark.parametrize("opt", ["--ntasks-per-tres", "--context", "--resources", "--autocomplete", "--extra"])
def test_slurm_2511_options_keep_their_values(opt):
    s = sa.split_args([opt, "2", "--model", "m.onnx", "job.sh"])
    assert s.horus == [("model", "m.onnx")] and s.sbatch_argv() == [opt, "2", "job.sh"]


def test_a_script_sbatch_must_read_itself_gets_no_hint(tmp_path):
    r, w = os.pipe()
    try:
        os.write(w, b"#!/bin/sh\n#SBATCH --comment='mine'\ntrue\n")
        plan = sub.prepare(["--model", str(ZOO / "resnet50.onnx"), f"/dev/fd/{r}"], env={})
        with pytest.raises(HorusError, match="could not be read as a regular file"):
            sub.predict(plan, gpu_types={"a100": 4}, partition="gpu")
        assert plan.hint is None and "--comment" not in " ".join(plan.sbatch_argv)
    finally:
        os.close(r)
        os.close(w)


def test_sbatch_killed_by_a_signal_ends_hsubmit_as_it_ends_sbatch(tmp_path, slurm_bin):
    """With the script on stdin sbatch had run as hsubmit's child, whose death by a signal
    hsubmit turned into exit 143: now sbatch replaces hsubmit, as it does for a script path."""
    import signal

    env, _ = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8"],
                 {**env, "SBATCH_DIE": "1"}, input="#!/bin/sh\ntrue\n")
    assert cp.returncode == -signal.SIGTERM


def test_a_model_path_that_is_not_utf8_costs_only_the_path(tmp_path, slurm_bin):
    """A path's undecodable bytes went into the workload token, which sync then could not read
    back: the job's whole workload (batch size, task, sha) was lost, not just its path."""
    from slurm_horus.slurm.hint import parse_workload

    env, log = slurm_bin
    folder = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(folder)
    model = os.path.join(folder, b"resnet50.onnx")
    shutil.copyfile(ZOO / "resnet50.onnx", model)
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", os.fsdecode(model), "--batch-size", "8",
                  "--wrap", "true"], env)
    assert cp.returncode == 0 and "not UTF-8 text" in cp.stderr, cp.stderr
    comment = next(a for a in log.read_text().splitlines() if a.startswith("--comment="))
    w = parse_workload(comment[len("--comment="):])
    assert w is not None and w["bs"] == 8 and "model" not in w and "horus:v1;a100=" in comment


def _many_nodes(path: Path, n: int) -> Path:
    """n Relu nodes side by side: a file of a few MB whose shape inference takes seconds."""
    g = helper.make_graph([], "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)])
    for i in range(n):
        g.node.add(op_type="Relu", input=["x"], output=[f"y{i}"])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_graph_of_more_nodes_than_any_model_is_submitted_without_analysis(tmp_path, slurm_bin):
    # ONNX's shape inference is one C++ call the 60 s timer cannot stop, its time growing with
    # the nodes: past the cap the file is refused before it, and the job goes as submitted
    from slurm_horus.graph.load import MAX_GRAPH_NODES

    env, log = slurm_bin
    path = _many_nodes(tmp_path / "wide.onnx", MAX_GRAPH_NODES + 1)
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(path), "--batch-size", "2", "--wrap", "true"], env)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    assert f"more than {MAX_GRAPH_NODES:,} nodes" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
    assert "horus:" not in log.read_text()


def test_the_node_cap_counts_subgraphs(tmp_path, monkeypatch):
    from slurm_horus.graph import load

    monkeypatch.setattr(load, "MAX_GRAPH_NODES", 10)
    branch = helper.make_graph([helper.make_node("Relu", ["x"], [f"b{i}"]) for i in range(8)], "branch", [],
                               [helper.make_tensor_value_info("b0", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True), "c")),
             helper.make_node("If", ["c"], ["o"], then_branch=branch, else_branch=branch)]
    g = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "if.onnx")
    with pytest.raises(ModelError, match="more than 10 nodes"):
        extract_features(tmp_path / "if.onnx")  # 2 + 8 + 8
    monkeypatch.setattr(load, "MAX_GRAPH_NODES", 18)
    extract_features(tmp_path / "if.onnx")


def test_the_node_cap_counts_function_calls_inside_a_functions_branches(tmp_path, monkeypatch):
    # a function whose body is an If, each branch calling another function: a 2.3 KB file of
    # such levels had inlined to 262k nodes while the cap counted the If alone
    from slurm_horus.graph import load

    relus = [helper.make_node("Relu", ["a" if i == 0 else f"r{i - 1}"], [f"r{i}" if i < 3 else "b"])
             for i in range(4)]
    leaf = helper.make_function("local", "Leaf", ["a"], ["b"], relus, [helper.make_opsetid("", 17)])
    calls = [helper.make_node("Leaf", ["x" if i == 0 else f"c{i - 1}"], [f"c{i}"], domain="local")
             for i in range(4)]
    branch = helper.make_graph(calls, "branch", [], [helper.make_tensor_value_info("c3", TensorProto.FLOAT, None)])
    body = [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True), "t")),
            helper.make_node("If", ["t"], ["b"], then_branch=branch, else_branch=branch)]
    fork = helper.make_function("local", "Fork", ["x"], ["b"], body, [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("Fork", ["x"], ["h"], domain="local"),
                           helper.make_node("Fork", ["h"], ["y"], domain="local")], "calls",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, functions=[leaf, fork], opset_imports=[helper.make_opsetid("", 17),
                                                                        helper.make_opsetid("local", 1)])
    onnx.save(model, tmp_path / "fork.onnx")
    monkeypatch.setattr(load, "MAX_GRAPH_NODES", 60)
    with pytest.raises(ModelError, match="more than 60 nodes once its functions are inlined"):
        extract_features(tmp_path / "fork.onnx")  # 2 x (2 + 2 x 4 x 4)
    monkeypatch.setattr(load, "MAX_GRAPH_NODES", 68)
    extract_features(tmp_path / "fork.onnx")


def test_a_function_taking_a_graph_from_its_caller_is_refused(tmp_path):
    # the inliner copies the caller's graph into each reference: three such levels, 4 KB,
    # inlined to 648k nodes while the cap counted 8k (a review)
    def ref(name):
        a = onnx.AttributeProto(name=name, ref_attr_name="body", type=onnx.AttributeProto.GRAPH)
        return a
    branch_if = helper.make_node("If", ["c"], ["out"])
    branch_if.attribute.extend([ref("then_branch"), ref("else_branch")])
    fn = helper.make_function("local", "Pick", ["x", "c"], ["out"], [branch_if], [helper.make_opsetid("", 17)],
                              attributes=["body"])
    body = helper.make_graph([helper.make_node("Relu", ["X"], ["r"])], "body", [],
                             [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])])
    g = helper.make_graph([helper.make_node("Pick", ["X", "C"], ["Y"], domain="local", body=body)], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4]),
                           helper.make_tensor_value_info("C", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
    model = helper.make_model(g, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid("local", 1)])
    onnx.save(model, tmp_path / "ref.onnx")
    with pytest.raises(ModelError, match="'Pick' takes a graph from its caller"):
        extract_features(tmp_path / "ref.onnx")


def test_an_analysis_that_runs_out_of_its_memory_still_submits_the_job(tmp_path, slurm_bin):
    # one Concat of 5,000,000 inputs, under the node cap: the analysis meets its address-space
    # limit inside native code (900,000 nodes, under the earlier cap, made glibc abort the
    # process: run in hsubmit's own process, that took the user's job with it, exit 127)
    env, log = slurm_bin
    g = helper.make_graph([], "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g.node.add(op_type="Concat", input=["x"] * 5_000_000, output=["y"]).attribute.add(
        name="axis", i=0, type=onnx.AttributeProto.INT)
    path = tmp_path / "wide.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(path), "--batch-size", "2", "--wrap", "true"], env)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "analysing the graph" in lines[0] and "submitting the job unchanged" in lines[0]
    assert "horus:" not in log.read_text()


def test_the_bounded_child_reports_an_abort_a_hang_and_errors_as_model_errors(monkeypatch):
    import signal
    import time

    from slurm_horus.graph import limits

    def same(x):
        return x

    with pytest.raises(ModelError, match=r"m.onnx: analysing the graph failed \(signal SIGABRT\)"):
        limits.run_bounded("m.onnx", os.abort, same, same)
    # a call the child's timer cannot interrupt (one C++ call; here SIGALRM blocked) is killed
    monkeypatch.setattr(limits, "KILL_GRACE_S", 0.5)

    def stuck():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(ModelError, match="took more than 1 s"):
        limits.run_bounded("m.onnx", stuck, same, same, timeout_s=1)
    assert time.monotonic() - t0 < 30
    with pytest.raises(ModelError, match="^bad graph$"):
        limits.run_bounded("m.onnx", lambda: (_ for _ in ()).throw(ModelError("bad graph")), same, same)
    with pytest.raises(HorusError, match="^bad dims$") as e:
        limits.run_bounded("m.onnx", lambda: (_ for _ in ()).throw(HorusError("bad dims")), same, same)
    assert type(e.value) is HorusError
    with pytest.raises(ModelError, match=r"the analysis failed \(ZeroDivisionError"):
        limits.run_bounded("m.onnx", lambda: 1 / 0, same, same)
    assert limits.run_bounded("m.onnx", lambda: {"a": [1, 2.5]}, same, same) == {"a": [1, 2.5]}
    # an answer past the cap is not read whole (a graph of 50 kB names: 909 MB in the caller)
    monkeypatch.setattr(limits, "MAX_RESULT_BYTES", 1 << 20)
    with pytest.raises(ModelError, match="result is larger than 1 MiB"):
        limits.run_bounded("m.onnx", lambda: "x" * (4 << 20), same, same)


def test_features_from_the_child_equal_the_in_process_ones():
    from slurm_horus.graph.features import features_of
    from slurm_horus.graph.load import load_graph

    for name, batch in (("resnet50", 8), ("gpt2", 2), ("lstm_lm", 4)):
        path = ZOO / f"{name}.onnx"
        assert extract_features(path, batch_size=batch) == features_of(load_graph(path, batch_size=batch), batch)


def test_the_bounded_child_survives_what_its_caller_holds_and_how_it_dies(monkeypatch):
    # a review's findings: select() refused fds past 1024, a real-time signal was no Signals
    # member, a caller ignoring SIGCHLD met a stale kill, and a crashing child wrote core files
    import resource
    import signal

    from slurm_horus.graph import limits

    def same(x):
        return x

    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pytest.skip("cannot open 1,100 files here")
    try:
        assert limits.run_bounded("m.onnx", lambda: 7, same, same) == 7
    finally:
        for fd in held:
            os.close(fd)
    with pytest.raises(ModelError, match=r"failed \(signal \d+\)"):
        limits.run_bounded("m.onnx", lambda: os.kill(os.getpid(), signal.SIGRTMIN + 6), same, same)
    assert limits.run_bounded("m.onnx", lambda: resource.getrlimit(resource.RLIMIT_CORE), same, same) == [0, 0]
    monkeypatch.setattr(limits, "KILL_GRACE_S", 0.5)
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert limits.run_bounded("m.onnx", lambda: "fine", same, same) == "fine"

        def stuck():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            os.kill(os.getpid(), signal.SIGSTOP)  # no timer, no progress: killed past it

        with pytest.raises(ModelError, match="took more than 1 s"):
            limits.run_bounded("m.onnx", stuck, same, same, timeout_s=1)
    finally:
        signal.signal(signal.SIGCHLD, old)


def test_a_node_name_that_is_not_utf8_still_gets_its_features(tmp_path):
    # protobuf gives such a name as bytes, which JSON could not carry: the child wrote nothing
    # and the analysis failed (blaming memory) where it had worked in the process
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="nQQ"), helper.make_node("Relu", ["y"], ["z"], name="c")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 8])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    (tmp_path / "n.onnx").write_bytes(data.replace(b"QQ", b"\xff\xfe"))
    r = extract_features(tmp_path / "n.onnx", batch_size=2)
    assert r.values["flops"] == 2 * 2 * 8 and len(r.nodes) == 2


def test_a_model_path_with_control_characters_warns_in_one_line(tmp_path, slurm_bin):
    # a newline in the path split the warning over two lines; an escape sequence drove the
    # terminal.  The job is still submitted, with the user's options
    env, log = slurm_bin
    folder = tmp_path / "a\nb\x1b[2J"
    folder.mkdir()
    (folder / "m.onnx").write_bytes(b"not a model")
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(folder / "m.onnx"), "--wrap", "true"], env)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1 and "\x1b" not in cp.stderr, cp.stderr
    assert "a\\nb\\x1b[2J/m.onnx" in cp.stderr and "submitting the job unchanged" in cp.stderr
    # --explain prints the path (and the sbatch line) too: the same escapes, for a real model
    shutil.copy(ZOO / "small_cnn.onnx", folder / "m.onnx")
    cp = hsubmit(["--explain", "-p", "gpu", "--gres=gpu:1", "--model", str(folder / "m.onnx"),
                  "--batch-size", "4", "--wrap", "true"], env)
    assert cp.returncode == 0 and "model: " in cp.stdout, cp.stderr
    assert "\x1b" not in cp.stdout and "a\\nb\\x1b[2J/m.onnx" in cp.stdout
    assert sum(line.startswith("model: ") for line in cp.stdout.splitlines()) == 1


@pytest.mark.parametrize("closed", ["<&-", ">&-", "2>&-"])
def test_a_closed_standard_stream_still_submits_the_job(tmp_path, slurm_bin, closed):
    # sys.stdin (or stdout, stderr) is None then: hsubmit failed with an internal error, and
    # the job, which plain sbatch submits, was lost
    env, log = slurm_bin
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p gpu\ntrue\n")
    model = ZOO / "small_cnn.onnx"
    cmd = (f"exec {sys.executable} -m slurm_horus.cli.hsubmit --model {model} --batch-size 2 "
           f"--dim nosuch=1 --gres=gpu:1 {script} {closed}")  # --dim: a warning to write
    subprocess.run(["sh", "-c", cmd], env=env, timeout=120, capture_output=closed != ">&-")
    args = log.read_text().splitlines()
    assert str(script) in args and any(a.startswith("--comment=horus:v1;") for a in args), args


def test_a_script_hsubmit_cannot_read_gets_no_hint_and_keeps_its_comment(tmp_path, slurm_bin):
    """sbatch 22.05 reads "--res myres" as --reservation (25.11's options make the abbreviation
    ambiguous, and its sbatch refuses it), so hsubmit had taken "myres" for the script: it read
    no #SBATCH line and its --comment=<hint> replaced the script's own comment. A script it
    cannot read gets no hint, and keeps its comment."""
    env, log = slurm_bin
    script = tmp_path / "c.sh"
    script.write_text('#!/bin/sh\n#SBATCH -p gpu\n#SBATCH --comment="keep me"\ntrue\n')
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2", "--res", "myres",
                  "--gres=gpu:1", str(script)], env)
    assert cp.returncode == 0, cp.stderr
    assert any(a.startswith("--comment=keep me horus:v1;") for a in log.read_text().splitlines())
    log.write_text("")
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2", "--gres=gpu:1",
                  str(tmp_path / "missing.sh")], env)
    assert cp.returncode == 0 and "no hint is attached" in cp.stderr, cp.stderr
    assert not any(a.startswith("--comment") for a in log.read_text().splitlines())
    # a form feed in a header comment: sbatch's lines end at \n only, and so do hsubmit's now
    ff = tmp_path / "ff.sh"
    ff.write_text('#!/bin/sh\n# notes \x0c more\n#SBATCH -p gpu\n#SBATCH --comment="keep me"\ntrue\n')
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2", "--gres=gpu:1", str(ff)], env)
    assert cp.returncode == 0, cp.stderr
    assert any(a.startswith("--comment=keep me horus:v1;") for a in log.read_text().splitlines())


def test_script_directives_that_hsubmit_honours_only_where_they_are_safe(tmp_path, slurm_bin):
    env, log = slurm_bin
    # #HORUS --explain in a script submitted nothing, exit 0, and said it was submitted
    ex = tmp_path / "ex.sh"
    ex.write_text("#!/bin/sh\n#HORUS --explain\ntrue\n")
    cp = hsubmit(["--parsable", str(ex)], env)
    assert cp.returncode == 0 and "#HORUS --explain is ignored" in cp.stderr and cp.stdout.startswith("Submitted")
    # a heterogeneous job defined in the script: no hint, as on the command line
    het = tmp_path / "het.sh"
    het.write_text("#!/bin/sh\n#SBATCH -p gpu --gres=gpu:1\n#SBATCH hetjob\n#SBATCH -p cpu\ntrue\n")
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2", str(het)], env)
    assert cp.returncode == 0 and "heterogeneous job" in cp.stderr
    assert not any(a.startswith("--comment") for a in log.read_text().splitlines())
    # --help with a model: sbatch answers and submits nothing; nothing to predict
    cp = hsubmit(["--help", "--model", str(ZOO / "small_cnn.onnx"), "--dim", "nosuch=1"], env)
    assert cp.returncode == 0 and cp.stderr == "" and log.read_text().splitlines() == ["--help"]


def test_a_bf16_job_on_a_partition_with_gpus_without_bf16_keeps_the_hint_for_the_others():
    # the cold start refuses bf16 on a V100, and that refusal had dropped the whole hint
    plan = sub.prepare(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "4",
                        "--precision", "bf16", "--wrap", "true"], env={})
    sub.predict(plan, gpu_types={"a100": 4, "v100": 2}, partition="gpu")
    assert set(plan.predictions) == {"a100"} and plan.hint.startswith("horus:v1;a100=")
    assert any("v100" in w and "bf16" in w for w in plan.warnings)
    only_v100 = sub.prepare(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "4",
                             "--precision", "bf16", "--wrap", "true"], env={})
    with pytest.raises(HorusError, match="that runs bf16"):
        sub.predict(only_v100, gpu_types={"v100": 2}, partition="old")


def test_a_digit_python_reads_but_int_does_not_is_no_internal_error(tmp_path, slurm_bin):
    # "²".isdigit() is True and int("²") fails: hsubmit said "internal error: ValueError"
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"),
                  "--batch-size", "\u00b2", "--wrap", "true"], env)
    assert cp.returncode == 2 and "Submitted" not in cp.stdout and not log.exists(), cp.stderr
    assert "need an integer from 1 to" in cp.stderr and "internal" not in cp.stderr


def test_a_job_no_gpu_of_the_partition_can_hold_is_submitted_with_a_warning(tmp_path, slurm_bin):
    # GPT-2 XL at batch 16, 512 tokens: 92 GB predicted went in with no word to the user
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "gpt2_xl.onnx"), "--batch-size", "16",
                  "--dim", "seq=512", "--wrap", "true"], env)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    assert "above every GPU type of partition gpu" in cp.stderr and "run out of GPU memory" in cp.stderr
    ok = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8",
                  "--wrap", "true"], env)
    assert "above every GPU type" not in ok.stderr


def test_task_train_never_reaches_sbatch_even_when_the_model_is_named_only_in_the_script(tmp_path, slurm_bin):
    # sbatch reads --task train as --tasks-per-node and refuses the job: with the model named in
    # a #HORUS line of a script on stdin, hsubmit passed --task on and the job was lost
    env, log = slurm_bin
    script = f"#!/bin/bash\n#HORUS --model={ZOO / 'small_cnn.onnx'}\n#SBATCH --gres=gpu:1 -p gpu\ntrue\n"
    cp = hsubmit(["--task", "train", "--batch-size", "2"], env, input=script)
    assert cp.returncode == 0, cp.stderr
    args = log.read_text().splitlines()
    assert "--task" not in args and "train" not in args and any(a.startswith("--comment=horus:v1;") for a in args)
    # no model anywhere: the horus options are dropped with a word, sbatch gets the job as it is
    cp = hsubmit(["--task", "infer", "--batch-size", "2", "--wrap", "true"], env)
    assert cp.returncode == 0 and "--task, --batch-size ignored: no --model" in cp.stderr
    assert log.read_text().splitlines() == ["--wrap", "true"]
    # a count is sbatch's --tasks-per-node, as before
    cp = hsubmit(["--task", "4", "--wrap", "true"], env)
    assert cp.returncode == 0 and log.read_text().splitlines() == ["--task", "4", "--wrap", "true"]


def test_the_script_read_is_the_one_sbatch_reads_under_chdir_and_path(tmp_path, slurm_bin):
    # sbatch looks for a bare script name in -D's folder, then along PATH (checked on 22.05 and
    # 25.11); hsubmit read ./run.sh and replaced the submitted script's own comment
    env, log = slurm_bin
    work, sub_dir, on_path = tmp_path / "w", tmp_path / "w" / "sub", tmp_path / "p"
    for d in (sub_dir, on_path):
        d.mkdir(parents=True)
    (work / "run.sh").write_text("#!/bin/bash\n#SBATCH --comment=wrong-one\ntrue\n")
    (sub_dir / "run.sh").write_text("#!/bin/bash\n#SBATCH -p gpu --gres=gpu:1 --comment=exp-42\ntrue\n")
    (on_path / "only-on-path.sh").write_text("#!/bin/bash\n#SBATCH -p gpu --gres=gpu:1 --comment=p-7\ntrue\n")
    model = ["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2"]
    cp = hsubmit(["-D", "sub", *model, "run.sh"], env, cwd=work)
    assert cp.returncode == 0, cp.stderr
    assert any(a.startswith("--comment=exp-42 horus:v1;") for a in log.read_text().splitlines()), cp.stderr
    cp = hsubmit([*model, "only-on-path.sh"], {**env, "PATH": f"{env['PATH']}:{on_path}"}, cwd=work)
    assert cp.returncode == 0 and "could not be read" not in cp.stderr, cp.stderr
    assert any(a.startswith("--comment=p-7 horus:v1;") for a in log.read_text().splitlines())


def test_a_script_with_pbs_directives_goes_unchanged_with_a_word(tmp_path, slurm_bin):
    # sbatch turns "#PBS -q debug" into -p debug even after a command; the hint was for the
    # partition hsubmit saw, not the one the job went to
    env, log = slurm_bin
    pbs = tmp_path / "pbs.sh"
    pbs.write_text("#!/bin/bash\n#SBATCH -p gpu --gres=gpu:1\necho start\n#PBS -q debug\ntrue\n")
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2", str(pbs)], env)
    assert cp.returncode == 0 and "#PBS directives are translated by sbatch" in cp.stderr
    assert not any(a.startswith("--comment") for a in log.read_text().splitlines())


def test_the_job_gets_the_locale_it_would_get_from_sbatch(tmp_path, slurm_bin):
    # Python in the C locale sets LC_CTYPE=C.UTF-8 in its environment (PEP 538), and sbatch
    # copies the environment into the job
    env, log = slurm_bin
    bin_dir = Path(env["PATH"].split(":")[0])
    dump = tmp_path / "sbatch.env"
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\nenv > {dump}\ncat > /dev/null\necho 'Submitted batch job 42'\n")
    plain = {k: v for k, v in env.items() if not k.startswith("LC_") and k not in ("LANG", "LANGUAGE")}
    for extra, want in (({}, None), ({"LC_CTYPE": "POSIX"}, "POSIX")):
        for kw in ({"input": "#!/bin/bash\ntrue\n"}, {}):  # run (stdin script) and exec paths
            args = [] if kw else ["--wrap", "true"]
            cp = hsubmit(args, {**plain, **extra, "PYTHONCOERCECLOCALE": "1"}, **kw)
            assert cp.returncode == 0, cp.stderr
            got = [x[len("LC_CTYPE="):] for x in dump.read_text().splitlines() if x.startswith("LC_CTYPE=")]
            assert got == ([] if want is None else [want]), (extra, kw, got)


def test_explain_with_stdout_closed_is_one_line(slurm_bin):
    env, _ = slurm_bin
    cp = subprocess.run(f"{sys.executable} -m slurm_horus.cli.hsubmit --explain --wrap true >&-",
                        shell=True, capture_output=True, text=True, timeout=60, env=env)
    assert cp.returncode == 1 and cp.stderr == "hsubmit: error: --explain: standard output is closed\n"


@pytest.mark.parametrize("opts,msg", [
    (["--precision", "fp8"], "unknown precision 'fp8'"),
    (["--task", "foo"], "unknown task 'foo'"),
    (["--optimizer", "lbfgs"], "unknown optimizer 'lbfgs'"),
    (["--batch-size", "-3"], "need an integer from 1 to"),
    (["--batch-size", "2147483648"], "need an integer from 1 to 2147483647"),  # had warned, submitted
    (["--batch-size", "9" * 5000], "need an integer from 1 to"),
    (["--dim", "seq=x"], "'x' is not an integer"),
    (["--dim", "seq"], "--dim expects name=value"),
    (["--batch-size", "8", "--dim", "batch=16"], "--dim batch=16 contradicts --batch-size 8"),
])
def test_a_bad_value_of_hsubmits_own_options_is_an_error_and_submits_nothing(tmp_path, slurm_bin, opts, msg):
    """A typo such as --precision fp8 warned and submitted the job without its hint, exit 0:
    a pipeline could not tell.  sbatch refuses its own options' bad values; so does hsubmit,
    on the command line and in #HORUS lines alike."""
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"), *opts, "--wrap", "true"], env)
    assert cp.returncode == 2 and not log.exists() and cp.stdout == "", cp.stderr
    assert cp.stderr.count("\n") == 1 and msg in cp.stderr and "hsubmit: error: " in cp.stderr
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\n#HORUS --model=" + str(ZOO / "resnet50.onnx") + "\n"
                      + "".join(f"#HORUS {a}={b}\n" for a, b in zip(opts[::2], opts[1::2]) if a != "--dim" or "=" in b)
                      + "true\n")
    if all(a != "--dim" or "=" in b for a, b in zip(opts[::2], opts[1::2])):
        cp = hsubmit(["-p", "gpu", str(script)], env)
        assert cp.returncode == 2 and not log.exists() and msg in cp.stderr, cp.stderr


def test_a_batch_dimension_bound_with_dim_alone_is_the_batch_size(slurm_bin):
    """--dim batch=16 without --batch-size said it contradicted a --batch-size 1 the user never
    gave, and the job lost its hint."""
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"), "--dim", "batch=16",
                  "--wrap", "true"], env)
    assert cp.returncode == 0 and "contradicts" not in cp.stderr, cp.stderr
    comment = next(a for a in log.read_text().splitlines() if a.startswith("--comment="))
    assert parse_workload(comment[len("--comment="):])["bs"] == 16


def test_explain_without_a_prediction_exits_non_zero(slurm_bin):
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", "/nonexistent.onnx", "--explain", "--wrap", "true"], env)
    assert cp.returncode == 1 and "no such file" in cp.stderr and not log.exists()
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8",
                  "--explain", "--wrap", "true"], env)
    assert cp.returncode == 0 and "decision: " in cp.stdout and not log.exists(), cp.stderr


def test_a_removed_working_folder_is_sbatchs_to_report(tmp_path, slurm_bin):
    """Plain hsubmit in a folder that was removed said "internal error: FileNotFoundError";
    without a model hsubmit is sbatch, which answers "getcwd failed" itself."""
    env, log = slurm_bin
    gone = tmp_path / "gone"
    gone.mkdir()
    cp = subprocess.run(["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$0" -m slurm_horus.cli.hsubmit '
                         "--test-only job.sh", sys.executable], capture_output=True, text=True, timeout=120,
                        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                        stdin=subprocess.DEVNULL)
    assert "internal error" not in cp.stderr and cp.returncode == 0, cp.stderr
    assert log.read_text().splitlines() == ["--test-only", "job.sh"]


def test_a_job_that_asks_for_no_gpu_gets_no_hint(slurm_bin):
    """A CPU job with --model got a GPU prediction, and the ledger then counted it as a GPU job
    of its node's type; now it goes unchanged, with a warning.  A GPU asked in the
    environment (SBATCH_GPUS) is a GPU request."""
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8", "--wrap", "true"], env)
    assert cp.returncode == 0 and "asks for no GPU" in cp.stderr, cp.stderr
    assert not any(a.startswith("--comment") for a in log.read_text().splitlines())
    cp = hsubmit(["-p", "gpu", "--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8", "--wrap", "true"],
                 {**env, "SBATCH_GPUS": "1"})
    assert cp.returncode == 0 and "asks for no GPU" not in cp.stderr, cp.stderr
    assert any(a.startswith("--comment=horus:v1;") for a in log.read_text().splitlines())


@pytest.mark.parametrize("request_,asks", [
    (["--gres=gpu:0"], False), (["--gres=gpu:a100:0"], False), (["--gpus=0"], False),
    (["--gres=shard:0"], False), (["--gres=gpu:0,gpu:a100:1"], True), (["--gres=gpu"], True),
    (["--gres=gpu:1"], True), (["--gres=shard:a100:10"], True),
])
def test_a_gpu_count_of_zero_asks_for_no_gpu(request_, asks):
    """--gres=gpu:0 (a template's way to ask for none) is no GPU to the hook, yet it had been
    given a hint (a CPU job counted as a GPU one in the ledger) and, with on_prediction_error =
    refuse, been refused when its model could not be read."""
    plan = sub.prepare(["-p", "gpu", *request_, "--model", "m.onnx", "--wrap", "true"], env={})
    assert sub.asks_for_gpus(plan) is asks


def test_a_cpu_job_with_gpu_zero_goes_unchanged_even_where_errors_refuse(slurm_bin):
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:0", "--model", "missing.onnx", "--wrap", "true"],
                 {**env, "HORUS_ON_PREDICTION_ERROR": "refuse"})
    assert cp.returncode == 0 and "asks for no GPU" in cp.stderr, cp.stderr
    assert log.read_text().splitlines() == ["-p", "gpu", "--gres=gpu:0", "--wrap", "true"]


def test_explain_shows_the_cpus_per_gpu_the_job_asks_for_and_unknown_ones_still_submit(slurm_bin):
    """The learned model's CPU input is the job's CPUs per GPU (it had been its --cpus-per-task,
    8 here, where the model trained on the job's CPUs in all, 32); where it cannot be told the
    job still goes in, with its hint."""
    env, log = slurm_bin
    model = ["--model", str(ZOO / "resnet50.onnx"), "--batch-size", "8"]
    cp = hsubmit(["-p", "gpu", "--gres=gpu:4", "--ntasks-per-node=4", "-c", "8", *model, "--explain",
                  "--wrap", "true"], env)
    assert cp.returncode == 0 and not log.exists(), cp.stderr
    assert " cpus_per_gpu=8\n" in cp.stdout and "cpus_per_task" not in cp.stdout
    cp = hsubmit(["-p", "gpu", "--gpus-per-socket=1", "-c", "6", *model, "--explain", "--wrap", "true"], env)
    assert cp.returncode == 0 and " cpus_per_gpu=-\n" in cp.stdout, cp.stderr
    for odd in (["--gpus-per-socket=1", "-c", "6"], ["--gpus=2", "-c", "x"], ["--gres=gpu:1", "-n", "0"]):
        cp = hsubmit(["-p", "gpu", *odd, *model, "--wrap", "true"], env)
        assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout and "Traceback" not in cp.stderr
        assert any(a.startswith("--comment=horus:v1;a100=") for a in log.read_text().splitlines()), odd



def _sbatch_with_plugins(env, tmp_path, help_rc: int = 0) -> Path:
    """The stand-in sbatch, answering --help with pyxis's options in spank.c's format (see
    test_hsubmit_args.spank_help) and exit ``help_rc``; each --help is counted in the returned file."""
    from tests.test_hsubmit_args import PYXIS, spank_help

    bin_dir = Path(env["PATH"].split(":")[0])
    (tmp_path / "help.txt").write_text(spank_help(PYXIS))
    asked = tmp_path / "help.asked"
    real = (bin_dir / "sbatch").read_text().split("\n", 1)[1]
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nif [ "$1" = --help ]; then echo >> {asked}; '
                                    f'cat {tmp_path / "help.txt"}; exit {help_rc}; fi\n{real}')
    return asked


def test_plugin_options_keep_the_job_and_its_comment(tmp_path, slurm_bin):
    """pyxis's --container-image IMAGE: on the command line its IMAGE had been taken for the
    script and --model went on to sbatch, which refused the job; in a #SBATCH line it had ended
    the reading of the script's #SBATCH lines, so the hint replaced the user's comment."""
    env, log = slurm_bin
    asked = _sbatch_with_plugins(env, tmp_path)
    script = tmp_path / "j.sh"
    script.write_text('#!/bin/sh\n#SBATCH --container-image nvcr.io/x:1\n#SBATCH --comment="exp-17"\n'
                      "#SBATCH -p gpu\n#SBATCH --gres=gpu:1\ntrue\n")
    model = ["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8"]
    cp = hsubmit(["--container-image", "nvcr.io/x:1", *model, str(script)], env)
    args = log.read_text().splitlines()
    assert cp.returncode == 0 and cp.stderr == "", cp.stderr
    assert args[0].startswith("--comment=exp-17 horus:v1;") and args[1:] == ["--container-image", "nvcr.io/x:1",
                                                                              str(script)], args
    assert asked.read_text().count("\n") == 1
    # no option it does not know: sbatch is not asked
    asked.unlink()
    hsubmit(["--container-image=nvcr.io/x:1", *model, str(script)], env)
    assert not asked.exists()
    # an option sbatch does not list (sbatch refuses it too), with hsubmit's after it: one line
    # saying how to settle it, and no hsubmit option to sbatch
    log.unlink()
    cp = hsubmit(["--container-imag3", "nvcr.io/x:1", *model, str(script)], env)
    assert cp.returncode == 2 and "--container-imag3 is not sbatch's own" in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1 and not log.exists()
    # hsubmit's options before it: no hint, one line saying why, the rest to sbatch as given
    cp = hsubmit([*model, "--container-imag3", "nvcr.io/x:1", str(script)], env)
    assert cp.returncode == 0 and "--container-imag3 is not sbatch's own" in cp.stderr, cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1
    assert log.read_text().splitlines() == ["--container-imag3", "nvcr.io/x:1", str(script)]


def test_sbatch_help_that_fails_costs_only_the_hint(tmp_path, slurm_bin):
    env, log = slurm_bin
    _sbatch_with_plugins(env, tmp_path, help_rc=1)
    cp = hsubmit(["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "8", "--container-image", "img",
                  "-p", "gpu", "--gres=gpu:1", "--wrap", "true"], env)
    assert cp.returncode == 0 and "no hint is attached" in cp.stderr, cp.stderr
    assert log.read_text().splitlines() == ["--container-image", "img", "-p", "gpu", "--gres=gpu:1",
                                            "--wrap", "true"]


def test_an_unsettled_option_before_hsubmits_own_is_an_error_not_a_guess(tmp_path, slurm_bin):
    """After an option sbatch --help did not settle, --model may be hsubmit's (the option took a
    value) or the script's argument (it took none: the word after it is the script): the guess
    that it took a value had dropped a training script's own --model and --batch-size."""
    env, log = slurm_bin
    _sbatch_with_plugins(env, tmp_path, help_rc=1)
    (tmp_path / "train.sh").write_text("#!/bin/sh\ntrue\n")
    cp = hsubmit(["--gres=gpu:1", "--no-container-entrypoint", str(tmp_path / "train.sh"), "--model",
                  "resnet50", "--batch-size", "64"], env)
    assert cp.returncode == 2 and not log.exists(), cp.stderr
    assert "--no-container-entrypoint=VALUE if it takes one, else put -- before the script" in cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1
    # with -- before the script, what follows is the script's: passed on as given, no hint
    cp = hsubmit(["--gres=gpu:1", "--no-container-entrypoint", "--", str(tmp_path / "train.sh"), "--model",
                  "resnet50", "--batch-size", "64"], env)
    assert cp.returncode == 0, cp.stderr
    assert log.read_text().splitlines() == ["--gres=gpu:1", "--no-container-entrypoint", "--",
                                            str(tmp_path / "train.sh"), "--model", "resnet50",
                                            "--batch-size", "64"]


def test_a_script_on_stdin_leaves_sbatch_the_files_signals_and_status_of_a_direct_run(tmp_path, slurm_bin):
    """hsubmit ran sbatch as its child with every other file closed (--export-file=<(...), 3<file,
    --nodefile /dev/fd/N read nothing) and turned its death by a signal into an exit status."""
    env, log = slurm_bin
    bin_dir = Path(env["PATH"].split(":")[0])
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\ncat <&3 > {tmp_path}/fd3\n'
                                    f"cat > {tmp_path}/script\nexit 7\n")
    (tmp_path / "extra").write_text("A=1\n")
    body = "#!/bin/sh\n#SBATCH -p gpu --gres=gpu:1\ntrue\n" * 3000
    cmd = (f"exec {sys.executable} -m slurm_horus.cli.hsubmit --model {ZOO / 'small_cnn.onnx'} --batch-size 2 "
           f"--export-file=/dev/fd/3 3<{tmp_path / 'extra'}")
    cp = subprocess.run(["sh", "-c", cmd], env=env, input=body, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 7, cp.stderr
    assert (tmp_path / "fd3").read_text() == "A=1\n" and (tmp_path / "script").read_text() == body
    assert log.read_text().splitlines()[0].startswith("--comment=horus:v1;")


def test_a_script_typed_at_a_terminal_gets_no_hint(tmp_path, slurm_bin):
    """hsubmit cannot read a script sbatch reads from the terminal: its hint had replaced the
    script's own #SBATCH --comment."""
    import pty

    env, log = slurm_bin
    bin_dir = Path(env["PATH"].split(":")[0])
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\necho "Submitted batch job 42"\n')
    master, slave = pty.openpty()
    try:
        cp = subprocess.run([sys.executable, "-m", "slurm_horus.cli.hsubmit", "--model", str(ZOO / "small_cnn.onnx"),
                             "--batch-size", "2", "-p", "gpu", "--gres=gpu:1"],
                            stdin=slave, capture_output=True, text=True, timeout=120, env=env)
    finally:
        os.close(slave)
        os.close(master)
    assert cp.returncode == 0 and "terminal" in cp.stderr and "no hint is attached" in cp.stderr, cp.stderr
    assert log.read_text().splitlines() == ["-p", "gpu", "--gres=gpu:1"]


def test_the_users_comment_keeps_every_word(tmp_path, slurm_bin):
    """Every word starting with horus: or horus-job: had been cut from the user's comment, and
    its spaces trimmed; only an earlier hint or workload token goes now, and a word the hook or
    sync would read as a second token costs the hint instead."""
    env, log = slurm_bin
    model = ["--model", str(ZOO / "small_cnn.onnx"), "--batch-size", "2", "-p", "gpu", "--gres=gpu:1"]
    mine = "  see horus:faq  and horus-job:x "
    cp = hsubmit([*model, "--comment", mine, "--wrap", "true"], env)
    assert cp.returncode == 0 and "would read as a second horus token" in cp.stderr, cp.stderr
    assert log.read_text().splitlines()[:3] == ["-p", "gpu", "--gres=gpu:1"]
    assert "--comment" in log.read_text().splitlines() and f"{mine}\n" in log.read_text()
    cp = hsubmit([*model, "--comment", " run  7 horus:v1;a100=1/2/3 ", "--wrap", "true"], env)
    assert cp.returncode == 0 and log.read_text().splitlines()[0].startswith("--comment= run  7 horus:v1;a100="), \
        log.read_text()


def test_a_model_path_too_long_for_the_system_is_one_warning_and_the_job_goes(tmp_path, slurm_bin):
    # checking that the file exists raised ENAMETOOLONG: "internal error: OSError" (a review)
    env, log = slurm_bin
    cp = hsubmit(["-p", "gpu", "--gres=gpu:1", "--model", "/" + "m" * 5000 + ".onnx", "--wrap", "true"], env)
    assert cp.returncode == 0 and "Submitted batch job 42" in cp.stdout, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "File name too long" in lines[0] and "internal error" not in lines[0], cp.stderr
    assert "submitting the job unchanged" in lines[0]
    assert log.read_text().split("\n")[:3] == ["-p", "gpu", "--gres=gpu:1"]
