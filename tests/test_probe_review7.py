"""Review 7 of the root probe and doctor: odd slurm.conf/gres.conf lines, arrays' squeue lines,
a hard-linked probe log."""

import os

from slurm_horus.doctor import check_nodes, read_slurm_conf
from slurm_horus.ledger import prolog as pl


def _conf(tmp_path, text):
    p = tmp_path / "slurm.conf"
    p.write_text(text)
    return read_slurm_conf(p)


def test_doctor_reports_an_unreadable_hostlist_or_gres_and_checks_the_other_nodes(tmp_path):
    """A NodeName (slurm.conf or gres.conf) that is no hostlist, or a Gres= Slurm cannot read,
    stopped doctor with one error (HorusError, or a ValueError traceback): no other finding."""
    conf = _conf(tmp_path, "NodeName=gpu[1-] Gres=gpu:a100:2,shard:200\n"
                           "NodeName=n1 Gres=gpu:a100:2(IDX:-),shard:200\n"
                           "NodeName=ok Gres=gpu:a100:1,shard:50 Features=a100\n")
    found = [p.what for p in check_nodes(conf, "NodeName=gpu[x] Name=shard Count=100\n", 100,
                                         "features", {"a100"}, {"a100"})]
    assert any("gres.conf: NodeName=gpu[x]" in w for w in found)
    assert any(w.startswith("node gpu[1-]: cannot read") for w in found)
    assert any(w.startswith("node n1: cannot read") for w in found)
    assert any(w.startswith("node ok: 50 shards for 1 GPUs") for w in found)  # still checked


def test_doctor_reads_slurms_feature_spelling_of_features(tmp_path):
    """slurm.conf takes Feature= as Features= on a NodeName line: doctor said such a node had no
    Features=a100 (and so that every job the hook pins there is invalid)."""
    conf = _conf(tmp_path, "NodeName=g1 Gres=gpu:a100:1,shard:100 Feature=a100\n")
    assert check_nodes(conf, "", 100, "features", {"a100"}, {"a100"}) == []


def _fake_squeue(tmp_path, lines_by_format):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    script = ["#!/bin/sh", 'for a; do f="$a"; done']  # the last argument: the -o format
    for fmt, out in lines_by_format.items():
        script.append(f'[ "$f" = "{fmt}" ] && {{ printf "{out}"; exit 0; }}')
    script.append("exit 0")
    (bin_ / "squeue").write_text("\n".join(script) + "\n")
    (bin_ / "squeue").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}")


def test_job_state_of_an_array_jobs_own_id_is_its_own_line(tmp_path):
    """`squeue --jobs ID` of an array's own id (the array's last task to start) lists every task
    still there, as it does a hetjob leader's components: the probe read it as no answer and
    stopped measuring a running job after UNANSWERED_LIMIT_S."""
    env = _fake_squeue(tmp_path, {"%T": "RUNNING\\nRUNNING\\nPENDING\\n",
                                  "%A %T": "124 RUNNING\\n123 RUNNING\\n130 PENDING\\n"})
    assert pl.job_state("123", env) == "RUNNING"
    assert pl.job_state("999", env) is None  # no line of this job: no answer


def test_probe_log_is_not_appended_through_a_hard_link(tmp_path):
    """HORUS_PROBE_LOG in a world-writable folder: a user's hard link there to a file of root's
    (where protected_hardlinks is off) had every job's lines appended to that file."""
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:\n")
    victim.chmod(0o600)
    log = tmp_path / "probe.log"
    os.link(victim, log)
    pl.ProbeLog(str(log), 5, "n1")("probing")
    assert victim.read_text() == "root:x:0:\n"
    plain = tmp_path / "plain.log"
    pl.ProbeLog(str(plain), 5, "n1")("probing")  # a file of its own: written
    assert "job 5 on n1: probing" in plain.read_text()
