"""Errors that reach a user as one line, never as a traceback."""


class HorusError(Exception):
    """A problem with the user's input or environment, printed as one line by the CLIs."""

    exit_code = 2


class ModelError(HorusError):
    """The model file cannot be read as a usable ONNX graph."""
