"""hsubmit: a drop-in for sbatch that attaches horus's GPU prediction to the job.

    hsubmit [sbatch options] [horus options] [script [script args...]]

Horus's options (exact names only, before the script; also as ``#HORUS --opt=value`` lines in
the script, the command line wins):

    --model PATH           ONNX graph of the job's model (without it: plain sbatch)
    --batch-size N         batch size (binds the symbolic `batch` dimension)
    --dim NAME=VALUE       bind another symbolic dimension (repeatable)
    --task train|infer     --optimizer sgd|momentum|adam|adamw   --precision fp32|fp16|bf16|amp
    --horus-model-dir DIR  learned-model registry (default $HORUS_MODEL_DIR, else
                           /var/lib/slurm-horus/models)
    --explain              print features, predictions, hint and the hook's decision; submit nothing
    --horus-probe          accepted and ignored (the site's Prolog measures every job)

Everything else goes to sbatch unchanged; sbatch's output and exit code are hsubmit's.
The prediction travels in the job's comment only: hsubmit writes nothing anywhere else.
A model that cannot be used gives a one-line warning and the job is submitted unchanged, or
refused (exit 1) with HORUS_ON_PREDICTION_ERROR=refuse (or on_prediction_error = refuse in
/etc/slurm-horus/horus.conf).  A value these options cannot take (--precision fp8) is an
error, as sbatch's own options' are: nothing is submitted (exit 2, which SLURM_EXIT_ERROR
leaves alone, as sbatch's exit on a bad option is).  Where SLURM_EXIT_ERROR is set to a number
(read as sbatch reads it), hsubmit's other errors where nothing is submitted (a job refused, a
script unreadable on stdin, an internal error) exit with it instead, as sbatch's failed
submission does.  --explain exits 1 when it has no prediction to explain (as sbatch
--test-only does when the job could not run).
"""

from __future__ import annotations

import os
import sys

PROG = "hsubmit"


def _err(msg: str) -> None:
    from slurm_horus.errors import to_stderr  # lazily: hsubmit starts as fast as sbatch

    to_stderr(PROG, msg)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as e:  # HorusError and anything unexpected: one line, no traceback
        from slurm_horus.errors import HorusError

        if os.environ.get("HORUS_DEBUG") and not isinstance(e, HorusError):
            raise
        code = getattr(e, "exit_code", 1) if isinstance(e, HorusError) else 1
        _err(f"error: {e}" if isinstance(e, HorusError) else
             f"internal error: {type(e).__name__}: {str(e).strip()[:300]}")
        # a usage error (a bad option or value, exit 2) keeps its code: sbatch exits 255 on
        # its own (exit(-1)) whatever SLURM_EXIT_ERROR says, as it does on a too-big script (1)
        return code if code == 2 else error_exit(code)


def error_exit(default: int) -> int:
    """The exit code of an error of hsubmit's own (nothing submitted): $SLURM_EXIT_ERROR as
    sbatch reads it (C's atoi: blanks, a sign and digits, the rest ignored; strtol's clamp to a
    long), else ``default``.  sbatch ignores a zero (or a value that is no number) with a
    complaint; a value whose exit status is 0 (256: sbatch's exit() keeps the low 8 bits) would
    report the error as a success, so it is ignored here too."""
    val = os.environ.get("SLURM_EXIT_ERROR")
    if val is None:
        return default
    import re

    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", val)
    status = min(max(int(m.group(1)), -2**63), 2**63 - 1) & 0xFF if m else 0
    if status == 0:
        _err(f"SLURM_EXIT_ERROR={val!r} gives no non-zero exit status: ignored")
        return default
    return status


def _main(argv: list[str]) -> int:
    if argv in (["--horus-help"],):
        sys.stdout.write(__doc__)
        return 0
    from slurm_horus.slurm import commands as slurm
    from slurm_horus.slurm import sbatch_args as sa
    from slurm_horus.slurm import submit as sub
    from slurm_horus.errors import HorusError

    if slurm.reentered():  # a site's sbatch wrapper ran hsubmit again: the first one predicted
        _flush()
        slurm.exec_sbatch(argv)  # does not return
        return 1
    split = sa.split_args(argv, plugin_options=slurm.sbatch_plugin_options)
    if not split.errors and not split.unsure and sa.help_request(split.parsed):
        # --gres=help and the like: sbatch prints a list and submits nothing, so the call is
        # sbatch's alone (less hsubmit's options, which it would refuse): no prediction, no
        # warning, and no script read here (sbatch reads stdin itself, as it does without us)
        _flush()
        slurm.exec_sbatch(split.sbatch_argv())  # does not return
        return 1
    # a closed stdin (<&-) is None, as is a closed stdout or stderr: sbatch runs without them;
    # a script typed at a terminal is sbatch's to read (prepare: no hint)
    stdin = sys.stdin.buffer if sys.stdin is not None and not sys.stdin.isatty() else None
    plan = sub.prepare(argv, stdin=stdin)
    for w in plan.warnings:
        _warn(plan, sub, w)
    shown = len(plan.warnings)
    if plan.model is not None and not plan.answers_only:
        try:
            sub.check_options(plan)  # a bad value of hsubmit's own options: an error, nothing submitted
        except HorusError:
            raise
        except Exception:  # a bug: _predict_or_warn meets it again and submits the job unchanged
            pass
        if not _predict_or_warn(plan, sub, shown):
            return error_exit(1)
    if plan.explain:
        if plan.partition is None:
            try:
                plan.partition = plan.request("partition") or slurm.default_partition()
            except HorusError:
                pass
        if sys.stdout is None:  # started with stdout closed (>&-): nowhere to explain
            _err("error: --explain: standard output is closed")
            return error_exit(1)
        _write_out(sub.explain_text(plan) + "\n")
        return 1 if plan.model is not None and not plan.predictions else 0  # nothing predicted
    # with or without a hint, sbatch answers the user itself
    _flush()
    slurm.exec_sbatch(plan.sbatch_argv, stdin=plan.stdin_script)  # does not return
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _write_out(text: str) -> None:
    """Print ``text`` with the bytes of a script or an argument that were no UTF-8 (decoded
    with surrogateescape) as they were: a strict stdout had crashed --explain on them."""
    if not hasattr(sys.stdout, "buffer"):  # a text-only stream put in its place
        sys.stdout.write(text)
        return
    enc = sys.stdout.encoding or "utf-8"
    try:
        data = text.encode(enc, "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode(enc, "backslashreplace")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _warn(plan, sub, msg: str) -> None:
    if not plan.quiet:
        sub.warn(msg)


def _predict_or_warn(plan, sub, shown: int) -> bool:
    """Predict and attach the hint. On failure warn and go on without a hint (the job is still
    submitted), or return False when the site refuses such jobs."""
    from slurm_horus.errors import HorusError

    if plan.split.hetjob or plan.script_hetjob:
        err = HorusError("heterogeneous job: no prediction attached")
    elif plan.script_translated:
        err = HorusError(f"the script's {plan.script_translated} directives are translated by sbatch, "
                         "not read by hsubmit: no prediction attached (write them as #SBATCH lines, "
                         "or submit with --ignore-pbs)")
    elif why := sub.request_unknown(plan):  # before the GPU question, which it leaves open
        err = HorusError(why)
    elif not sub.asks_for_gpus(plan):
        _warn(plan, sub, "the job asks for no GPU (--gres=gpu:N, --gpus=N): no prediction attached")
        return True
    else:
        err = None
        try:
            sub.predict(plan)
        except HorusError as e:
            err = e
        except Exception as e:  # a bug or a file nobody foresaw must not cost the user the job
            err = HorusError(f"internal error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    for w in plan.warnings[shown:]:
        _warn(plan, sub, w)
    if err is not None:
        plan.hint = plan.comment = None
        if problem := sub.on_prediction_error_problem():
            _warn(plan, sub, problem)
        if sub.on_prediction_error() == "refuse":
            _err(f"error: {err}; job refused (on_prediction_error = refuse)")
            return False
        _warn(plan, sub, f"{err}; " + ("no prediction to explain (without --explain the job would go "
                                "unchanged)" if plan.explain else "submitting the job unchanged"))
    return True


if __name__ == "__main__":
    sys.exit(main())
