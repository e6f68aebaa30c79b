"""What /proc says of a process: enough to tell it from a later one that reuses its pid."""

from __future__ import annotations


def started(pid, running: bool = False) -> str | None:
    """When process ``pid`` started, in clock ticks after boot (/proc/PID/stat; an exec keeps
    it); None when no process has that pid or /proc does not show it, and with ``running`` when
    it has exited (a zombie its parent has not reaped)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            line = f.read()
    except OSError:  # no such process, or /proc hides it (hidepid, another user's)
        return None
    fields = line[line.rindex(b")") + 2:].split()  # after the command name: state first
    return None if running and fields[0] == b"Z" else fields[19].decode()
