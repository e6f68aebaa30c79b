"""The pyslurm backend (``commands.backend() == "pyslurm"``): Slurm's C API instead of the tools.

Gives the records the CLI backend gives (see ``commands``): nodes and partitions in scontrol's
record shape. Checked on pyslurm 25.11.2 with Slurm 25.11.7. What pyslurm cannot give, and so
is read with the tools:

* a node's untyped GPUs (``gpu:4``): pyslurm reads a GPU type of digits (``gpu:3090:2``) as
  that many untyped GPUs, so such a node is an ``UnreadableRecord`` (``_gres_text``);
* the GPU index of a running *shard* job: pyslurm's GRES parser drops Slurm's per-GPU counts
  (``shard:66(0/100,66/100)`` becomes ``{"shard": 66}``);
* GPU usage from accounting (TRESUsageIn ``gres/gpuutil``, ``gres/gpumem``, Slurm 23.02+ with
  AutoDetect=nvml): pyslurm's job statistics carry only CPU, memory and disk, so accounting is
  always read with sacct (``commands.accounting_jobs``).

pyslurm itself is imported (``load``) only once ``commands.backend()`` has checked that it
matches the running Slurm: an import initialises libslurm.
"""

from __future__ import annotations

import functools

from slurm_horus.errors import HorusError


def load():
    """The pyslurm module, imported on first use (it initialises libslurm)."""
    try:
        import pyslurm
    except Exception as e:  # a broken build or a missing libslurm: say so in one line
        raise HorusError(f"pyslurm does not import ({e}); HORUS_SLURM_BACKEND=cli avoids it") from None
    return pyslurm


class UnreadableRecord(HorusError):
    """pyslurm got Slurm's answer but its own parser failed on it (a Gres count Slurm writes as
    1K): the tools read the same records."""


def _one_line_errors(fn):
    """pyslurm's RPC errors as HorusError (callers print one line, never a traceback)."""
    @functools.wraps(fn)
    def inner(*args):
        ps = load()
        try:
            return fn(*args)
        except ps.PyslurmError as e:
            raise HorusError(f"pyslurm {fn.__name__}: {e}") from None
        except Exception as e:  # its parsers too (a Gres count Slurm writes as 1K was a ValueError)
            raise UnreadableRecord(f"pyslurm {fn.__name__}: {type(e).__name__}: {str(e)[:200]}") from None
    return inner


def _gres_text(gres: dict) -> str:
    """pyslurm's ``{"gpu:a100": 4, "shard:a100": 400}`` back to ``gpu:a100:4,shard:a100:400``.
    An untyped GPU there is no answer: pyslurm 25.11.2 reads a type of digits as the count
    (``gpu:3090:2`` is ``{"gpu": 3090}``), and Slurm's ``gpu:3090`` reads the same (a
    ValueError: the tools read that node)."""
    if "gpu" in gres:
        raise ValueError(f"untyped GPUs ({gres['gpu']}) may be a type of digits pyslurm read as a count")
    return ",".join(f"{k}:{v['count'] if isinstance(v, dict) else v}" for k, v in gres.items())


@_one_line_errors
def nodes() -> list[dict]:
    out = []
    for n in load().Nodes.load().values():
        out.append({"NodeName": n.name, "Gres": _gres_text(n.configured_gres or {}),
                    "Partitions": ",".join(n.partitions or []),
                    "AvailableFeatures": ",".join(n.available_features or []),
                    "ActiveFeatures": ",".join(n.active_features or []), "_details": []})
    return out


@_one_line_errors
def partitions() -> list[dict]:
    return [{"PartitionName": p.name, "Default": "YES" if p.is_default else "NO",
             "Nodes": p.nodes or "", "_details": []}
            for p in load().Partitions.load().values()]
