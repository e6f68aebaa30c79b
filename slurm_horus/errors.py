"""Errors that reach a user as one line, never as a traceback."""

import re
import sys

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1: never in text for a terminal


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (a newline as \\n): a message that names a
    user's file stays one line and cannot drive the reader's terminal."""
    return CONTROL_CHARS.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def to_stderr(prog: str, msg: str) -> None:
    """Write ``prog: msg`` to stderr as one line (one_line).  A closed stderr or a closed pipe
    loses the message, never the caller's work (hsubmit's job)."""
    try:
        sys.stderr.write(f"{prog}: {one_line(msg)}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr closed (None) or a closed pipe: the message is lost, never the job


class HorusError(Exception):
    """A problem with the user's input or environment, printed as one line by the CLIs."""

    exit_code = 2


class ModelError(HorusError):
    """The model file cannot be read as a usable ONNX graph."""
