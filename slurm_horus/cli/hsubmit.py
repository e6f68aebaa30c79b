"""hsubmit: a drop-in for sbatch that attaches horus's GPU prediction to the job.

    hsubmit [sbatch options] [horus options] [script [script args...]]

Horus's options (exact names only, before the script; also as ``#HORUS --opt=value`` lines in
the script, the command line wins):

    --model PATH           ONNX graph of the job's model (without it: plain sbatch)
    --batch-size N         batch size (binds the symbolic `batch` dimension)
    --dim NAME=VALUE       bind another symbolic dimension (repeatable)
    --task train|infer     --optimizer sgd|momentum|adam|adamw   --precision fp32|fp16|bf16|amp
    --horus-model-dir DIR  learned-model registry
    --horus-probe          start horus-probe first in the job (records its own GPU use)
    --explain              print features, predictions, hint and the hook's decision; submit nothing

Everything else goes to sbatch unchanged; sbatch's output and exit code are hsubmit's.
A model that cannot be used gives a one-line warning and the job is submitted unchanged, or
refused (exit 1) with HORUS_ON_PREDICTION_ERROR=refuse (or on_prediction_error = refuse in
/etc/slurm-horus/horus.conf).
"""

from __future__ import annotations

import os
import sys

PROG = "hsubmit"


def _err(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as e:  # HorusError and anything unexpected: one line, no traceback
        from ..errors import HorusError

        if os.environ.get("HORUS_DEBUG") and not isinstance(e, HorusError):
            raise
        code = getattr(e, "exit_code", 1) if isinstance(e, HorusError) else 1
        _err(f"error: {e}" if isinstance(e, HorusError) else
             f"internal error: {type(e).__name__}: {str(e).strip()[:300]}")
        return code


def _main(argv: list[str]) -> int:
    if argv in (["--horus-help"],):
        sys.stdout.write(__doc__)
        return 0
    from .. import slurm
    from .. import submit as sub
    from ..errors import HorusError

    stdin = sys.stdin.buffer if not sys.stdin.isatty() else None
    plan = sub.prepare(argv, stdin=stdin)
    for w in plan.warnings:
        sub.warn(w)
    shown = len(plan.warnings)
    if plan.horus.get("horus-probe") and not plan.explain:
        if plan.model and not _predict_or_warn(plan, sub, shown):
            return 1
        return _submit_with_probe(plan, sub, slurm)
    if not plan.model and not plan.explain:
        if plan.stdin_script is not None:
            return slurm.sbatch(plan.sbatch_argv, stdin=plan.stdin_script).returncode
        slurm.exec_sbatch(plan.sbatch_argv)  # does not return
        return 1
    if plan.model and not _predict_or_warn(plan, sub, shown):
        return 1
    if plan.explain:
        if plan.partition is None:
            try:
                plan.partition = plan.request("partition") or slurm.default_partition()
            except HorusError:
                pass
        sys.stdout.write(sub.explain_text(plan) + "\n")
        return 0
    if plan.hint is None:  # nothing predicted: sbatch exactly as the user asked
        if plan.stdin_script is not None:
            return slurm.sbatch(plan.sbatch_argv, stdin=plan.stdin_script).returncode
        sys.stdout.flush()
        sys.stderr.flush()
        slurm.exec_sbatch(plan.sbatch_argv)
        return 1
    result = slurm.sbatch(plan.sbatch_argv, stdin=plan.stdin_script, capture=True)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    sys.stdout.flush()
    if result.returncode == 0:
        _record(plan, result.stdout.decode(errors="replace"))
    return result.returncode


def _predict_or_warn(plan, sub, shown: int) -> bool:
    """Predict and attach the hint. On failure warn and go on without a hint (the job is still
    submitted), or return False when the site refuses such jobs."""
    from ..errors import HorusError

    if plan.split.hetjob:
        err = HorusError("heterogeneous job: no prediction attached")
    else:
        err = None
        try:
            sub.predict(plan)
        except HorusError as e:
            err = e
    for w in plan.warnings[shown:]:
        sub.warn(w)
    if err is not None:
        plan.hint = plan.comment = None
        if sub.on_prediction_error() == "refuse":
            _err(f"error: {err}; job refused (on_prediction_error = refuse)")
            return False
        sub.warn(f"{err}; submitting the job unchanged")
    return True


def _submit_with_probe(plan, sub, slurm) -> int:
    """--horus-probe: submit a copy of the job that starts horus-probe first; the temporary
    script copy is removed once sbatch has answered."""
    copy = sub.with_probe(plan)
    try:
        result = slurm.sbatch(plan.sbatch_argv, stdin=plan.stdin_script, capture=True)
    finally:
        if copy:
            os.unlink(copy)
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    sys.stdout.flush()
    if result.returncode == 0 and plan.hint:
        _record(plan, result.stdout.decode(errors="replace"))
    return result.returncode


def _record(plan, sbatch_stdout: str) -> None:
    """Write the submission to the ledger from a detached child, so the user does not wait.

    The job is already in; the ledger (or, when it is unreachable, the local spool) gets the
    record a moment later. Set HORUS_LEDGER_SYNC=1 to write before returning (tests, scripts).
    """
    from ..slurm_parse import parse_sbatch_stdout

    job = parse_sbatch_stdout(sbatch_stdout)
    if not job:
        return
    job_id, _, cluster = job.partition(";")
    if not os.environ.get("HORUS_LEDGER_SYNC"):
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() > 0:
            return
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    try:
        from ..ledger import record_submission_safely, submission_from_plan

        record_submission_safely(**submission_from_plan(plan, job_id, cluster))
    except Exception as e:  # the job is in; a lost ledger record must not look like a failure
        _err(f"warning: submission not recorded in the ledger ({type(e).__name__})")
    if not os.environ.get("HORUS_LEDGER_SYNC"):
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
