"""The GPU catalog: peak compute, memory and bandwidth per GPU model, looked up by Slurm gres type.

The packaged catalog (``slurm_horus/data/gpus.json``) holds vendor datasheet figures (dense, no
sparsity). A site can extend or correct it with files of the same schema, read in this order, later
ones winning:

1. ``/etc/slurm-horus/gpus.json`` if it exists;
2. each path in ``$HORUS_GPU_CATALOG`` (``:``-separated);
3. ``extra_paths`` given to :meth:`Catalog.load`.

A site file is either ``{"gpus": [entry, ...]}`` or a bare list of entries. An entry whose ``name``
is already known overrides just the fields it gives and adds its ``aliases`` (``{"name": "a100-80gb",
"aliases": ["a100"]}`` makes ``a100`` mean the 80 GB card); an entry with a new name must give every
required field.

Lookups are case-insensitive, treat ``_``, ``-`` and spaces alike and ignore a leading ``nvidia``, so
Slurm's NVML-autodetected type names (``nvidia_a100-sxm4-40gb``) and raw NVML names
(``NVIDIA A100-SXM4-40GB``) both resolve.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from slurm_horus.errors import HorusError
from slurm_horus.textfile import read_text

ENV_VAR = "HORUS_GPU_CATALOG"
DEFAULT_SITE_FILE = Path("/etc/slurm-horus/gpus.json")
CATALOG_MAX_BYTES = 4 << 20  # a catalog of every GPU ever made is a few hundred KiB
# What a bare CUDA context holds, the least any GPU job peaks at (the hook's min_mem_mib
# default): a measurement at or below it used no GPU, and no prediction goes below it
BARE_CONTEXT_MIB = 512.0

ARCHES = ("pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "amp")

_REQUIRED = (
    "vendor",
    "arch",
    "compute_capability",
    "mem_mib",
    "mem_bw_gbs",
    "sm_count",
    "fp32_tflops",
    "fp16_tflops",
    "tdp_w",
)
_OPTIONAL_DEFAULTS: dict[str, Any] = {
    "aliases": (),
    "tf32_tflops": None,
    "bf16_tflops": None,
    "notes": "",
}
_INT_FIELDS = ("mem_mib", "sm_count")
_POSITIVE_FIELDS = ("mem_mib", "mem_bw_gbs", "sm_count", "fp32_tflops", "fp16_tflops", "tdp_w")
_NULLABLE_POSITIVE_FIELDS = ("tf32_tflops", "bf16_tflops")
# The most any GPU's figure may be (a thousand times past the largest made): a site entry's
# 1e300 GB/s or 10**308 SMs had made the cold start's arithmetic overflow (a traceback in
# horus predict) or its memory 1e303 MiB; and the least a positive rate may be, whose
# 5e-324 TFLOPS had made every utilization NaN
_MAX_FIELD = {"mem_mib": 2**30, "mem_bw_gbs": 1e7, "sm_count": 10**6, "fp32_tflops": 1e7,
              "tf32_tflops": 1e7, "fp16_tflops": 1e7, "bf16_tflops": 1e7, "tdp_w": 1e6}
_MIN_RATE = 1e-6  # TFLOPS, GB/s: a million operations or bytes a second
_STRING_FIELDS = ("vendor", "source", "notes")


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU model. TFLOPS are 1e12 FLOP/s, ``mem_bw_gbs`` is 1e9 bytes/s, ``mem_mib`` is MiB."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    arch: str
    compute_capability: str
    mem_mib: int
    mem_bw_gbs: float
    sm_count: int
    fp32_tflops: float
    tf32_tflops: float | None
    fp16_tflops: float
    bf16_tflops: float | None
    tdp_w: float
    source: str
    notes: str = ""

    @property
    def mem_bytes(self) -> int:
        return self.mem_mib * 1024 * 1024

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_gbs * 1e9

    def peak_flops(self, precision: str = "fp32") -> float:
        """Peak FLOP/s for ``precision`` (fp32, tf32, fp16, bf16, amp).

        ``amp`` and ``fp16`` are the fp16 tensor-core rate. ``tf32`` on a GPU without TF32 is the
        fp32 rate (frameworks then simply run fp32 math). ``bf16`` on a GPU without BF16 raises.
        """
        p = str(precision).strip().lower()
        if p == "fp32":
            tflops = self.fp32_tflops
        elif p == "tf32":
            tflops = self.tf32_tflops if self.tf32_tflops is not None else self.fp32_tflops
        elif p in ("fp16", "amp"):
            tflops = self.fp16_tflops
        elif p == "bf16":
            if self.bf16_tflops is None:
                raise HorusError(f"GPU type '{self.name}' ({self.arch}) does not support bf16; use fp16/amp or fp32")
            tflops = self.bf16_tflops
        else:
            raise HorusError(f"unknown precision {precision!r}; use one of: {', '.join(PRECISIONS)}")
        return tflops * 1e12

    @property
    def has_tf32(self) -> bool:
        return self.tf32_tflops is not None

    @property
    def has_bf16(self) -> bool:
        return self.bf16_tflops is not None


def normalize(name: str) -> str:
    """The lookup key of a GPU name or alias: lowercase, ``-`` for ``_``/space, no ``nvidia`` prefix."""
    key = "-".join(str(name).strip().lower().replace("_", " ").replace("-", " ").split())
    if key.startswith("nvidia-"):
        key = key[len("nvidia-"):]
    return key


class Catalog:
    """An immutable set of GPU models with alias lookup. Build with :meth:`load` or :meth:`from_entries`."""

    def __init__(self, gpus: Mapping[str, GPU]):
        self._gpus: dict[str, GPU] = dict(sorted(gpus.items()))
        index: dict[str, str] = {}
        for gpu in self._gpus.values():
            for alias in gpu.aliases:
                index[normalize(alias)] = gpu.name
        for name in self._gpus:  # a canonical name always means itself
            index[name] = name
        self._index = index

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        extra_paths: Iterable[str | os.PathLike[str]] = (),
        *,
        environ: Mapping[str, str] | None = None,
        site_file: str | os.PathLike[str] | None = DEFAULT_SITE_FILE,
    ) -> "Catalog":
        """The packaged catalog merged with the default site file, ``$HORUS_GPU_CATALOG`` and ``extra_paths``."""
        text = resources.files("slurm_horus").joinpath("data/gpus.json").read_text(encoding="utf-8")
        builder = _Builder()
        builder.add_file_text(text, "packaged gpus.json", packaged=True)
        paths: list[Path] = []
        try:  # a folder on its way the reader may not search (0700): a one-line error
            if site_file is not None and Path(site_file).is_file():
                paths.append(Path(site_file))
        except OSError as e:  # (is_file() had raised it, PermissionError, out of every command)
            raise HorusError(f"GPU catalog {site_file}: {e.strerror or e}") from None
        env = os.environ if environ is None else environ
        paths.extend(Path(p) for p in env.get(ENV_VAR, "").split(":") if p.strip())
        paths.extend(Path(p) for p in extra_paths)
        for path in paths:
            builder.add_file_text(read_text(path, "GPU catalog", CATALOG_MAX_BYTES), str(path))
        return cls(builder.build())

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, Any]], origin: str = "entries") -> "Catalog":
        """A catalog of just ``entries`` (complete entries, packaged schema)."""
        builder = _Builder()
        builder.add_entries(list(entries), origin, packaged=True)
        return cls(builder.build())

    # --- lookup -------------------------------------------------------------------------------

    def get(self, name_or_alias: str) -> GPU:
        name = self._index.get(normalize(name_or_alias))
        if name is None:
            raise HorusError(f"unknown GPU type {str(name_or_alias)!r}; known: {', '.join(self.names())}")
        return self._gpus[name]

    def find(self, name_or_alias: str) -> GPU | None:
        """Like :meth:`get` but ``None`` when unknown."""
        name = self._index.get(normalize(name_or_alias))
        return None if name is None else self._gpus[name]

    def names(self) -> list[str]:
        """Canonical names, sorted."""
        return list(self._gpus)

    def aliases(self) -> dict[str, str]:
        """Every normalized lookup key (aliases and names) -> canonical name."""
        return dict(self._index)

    def __iter__(self) -> Iterator[GPU]:
        return iter(self._gpus.values())

    def __len__(self) -> int:
        return len(self._gpus)

    def __contains__(self, name_or_alias: object) -> bool:
        return isinstance(name_or_alias, str) and normalize(name_or_alias) in self._index

    def __repr__(self) -> str:
        return f"Catalog({len(self)} GPUs)"


@functools.lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog from the packaged file plus site files, read once per process."""
    return Catalog.load()


def get_gpu(name_or_alias: str) -> GPU:
    """Shorthand for ``default_catalog().get(name_or_alias)``."""
    return default_catalog().get(name_or_alias)


# --- building and validation ----------------------------------------------------------------------


class _Builder:
    """Accumulates entries as plain dicts (name -> fields), then validates them into GPUs."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.origins: dict[str, str] = {}

    def add_file_text(self, text: str, origin: str, packaged: bool = False) -> None:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HorusError(
                f"GPU catalog {origin}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        except RecursionError:
            raise HorusError(f"GPU catalog {origin}: nested too deeply") from None
        if isinstance(data, dict):
            if "gpus" not in data:
                raise HorusError(
                    f"GPU catalog {origin}: expected a list of GPU entries or an object with a 'gpus' list"
                )
            data = data["gpus"]
        if not isinstance(data, list):
            raise HorusError(f"GPU catalog {origin}: 'gpus' must be a list of GPU entries")
        self.add_entries(data, origin, packaged=packaged)

    def add_entries(self, entries: list[Any], origin: str, packaged: bool = False) -> None:
        seen: set[str] = set()
        for i, raw in enumerate(entries):
            where = f"GPU catalog {origin}: entry {i + 1}"
            if not isinstance(raw, dict):
                raise HorusError(f"{where}: expected an object, got {type(raw).__name__}")
            if "name" not in raw or not isinstance(raw["name"], str) or not normalize(raw["name"]):
                raise HorusError(f"{where}: missing or empty 'name'")
            name = normalize(raw["name"])
            where = f"GPU catalog {origin}: {name}"
            if name in seen:
                raise HorusError(f"{where}: defined twice in the same file")
            seen.add(name)
            unknown = sorted(set(raw) - {"name", "source", *_REQUIRED, *_OPTIONAL_DEFAULTS})
            if unknown:
                raise HorusError(f"{where}: unknown field(s) {', '.join(unknown)}")
            fields = {k: v for k, v in raw.items() if k != "name"}
            if "aliases" in fields:
                aliases = fields["aliases"]
                if not isinstance(aliases, list) or not all(isinstance(a, str) and normalize(a) for a in aliases):
                    raise HorusError(f"{where}: 'aliases' must be a list of non-empty strings")
                fields["aliases"] = [normalize(a) for a in aliases]

            if name in self.entries and not packaged:
                merged = dict(self.entries[name])
                new_aliases = fields.pop("aliases", [])
                merged.update(fields)
                merged["aliases"] = list(dict.fromkeys([*merged.get("aliases", []), *new_aliases]))
                if "source" not in fields and len(fields) > 0:
                    merged["source"] = f"{merged.get('source', '')}; overridden by {origin}".lstrip("; ")
                self._check(name, merged, where)
                self.entries[name] = merged
                self._claim_aliases(name, new_aliases, where)
            else:
                if name in self.entries:
                    raise HorusError(f"{where}: defined twice")
                missing = [k for k in (*_REQUIRED, *(("source",) if packaged else ())) if k not in fields]
                if missing:
                    owner = next((n for n, o in self.entries.items() if name in o["aliases"]), None)
                    hint = f" (to change '{owner}', use that name)" if owner else ""
                    raise HorusError(f"{where}: missing field(s) {', '.join(missing)}{hint}")
                entry = {**_OPTIONAL_DEFAULTS, "source": origin, **fields}
                entry["aliases"] = list(entry["aliases"])
                self._check(name, entry, where)
                # A new canonical name wins over an older alias of the same spelling.
                for other in self.entries.values():
                    if name in other["aliases"]:
                        if packaged:
                            raise HorusError(f"{where}: name is already an alias of another GPU")
                        other["aliases"] = [a for a in other["aliases"] if a != name]
                self.entries[name] = entry
                self._claim_aliases(name, entry["aliases"], where, strict=packaged)
            self.origins[name] = origin

    def _claim_aliases(self, name: str, aliases: list[str], where: str, strict: bool = False) -> None:
        """Point ``aliases`` at ``name``: a later file re-points an alias, the packaged file may not."""
        for alias in aliases:
            if alias != name and alias in self.entries:
                raise HorusError(f"{where}: alias '{alias}' is the name of another GPU")
            for other_name, other in self.entries.items():
                if other_name != name and alias in other["aliases"]:
                    if strict:
                        raise HorusError(f"{where}: alias '{alias}' is also an alias of {other_name}")
                    other["aliases"] = [a for a in other["aliases"] if a != alias]
        entry = self.entries[name]
        entry["aliases"] = [a for a in dict.fromkeys(entry["aliases"]) if a != name]

    @staticmethod
    def _check(name: str, e: Mapping[str, Any], where: str) -> None:
        def number(key: str) -> float:
            v = e[key]
            try:  # an int past a float's range (400 digits) raised OverflowError from isfinite
                finite = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            except OverflowError:
                finite = False
            if not finite:
                raise HorusError(f"{where}: '{key}' must be a finite number, got {repr(v)[:40]}")
            return v

        def in_range(key: str) -> None:
            low = _MIN_RATE if key.endswith(("_tflops", "_gbs")) else 0
            if not number(key) <= _MAX_FIELD[key]:
                raise HorusError(f"{where}: '{key}' must be at most {_MAX_FIELD[key]:g}, got {repr(e[key])[:40]}")
            if e[key] < low:
                raise HorusError(f"{where}: '{key}' must be at least {low:g}, got {e[key]!r}")

        for key in _POSITIVE_FIELDS:
            if number(key) <= 0:
                raise HorusError(f"{where}: '{key}' must be positive, got {e[key]!r}")
            in_range(key)
        for key in _INT_FIELDS:
            if not isinstance(e[key], int):
                raise HorusError(f"{where}: '{key}' must be an integer, got {e[key]!r}")
        for key in _NULLABLE_POSITIVE_FIELDS:
            if e.get(key) is not None and number(key) <= 0:
                raise HorusError(f"{where}: '{key}' must be positive or null, got {e[key]!r}")
            if e.get(key) is not None:
                in_range(key)
        for key in _STRING_FIELDS:
            if not isinstance(e.get(key, ""), str):
                raise HorusError(f"{where}: '{key}' must be a string")
        if not e["vendor"].strip():
            raise HorusError(f"{where}: 'vendor' must not be empty")
        if e["arch"] not in ARCHES:
            raise HorusError(f"{where}: 'arch' must be one of {', '.join(ARCHES)}, got {e['arch']!r}")
        cc = e["compute_capability"]
        parts = cc.split(".") if isinstance(cc, str) else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise HorusError(f"{where}: 'compute_capability' must be a string like \"8.0\", got {cc!r}")

    def build(self) -> dict[str, GPU]:
        gpus: dict[str, GPU] = {}
        for name, e in self.entries.items():
            gpus[name] = GPU(
                name=name,
                aliases=tuple(e["aliases"]),
                vendor=e["vendor"].strip().lower(),
                arch=e["arch"],
                compute_capability=e["compute_capability"],
                mem_mib=e["mem_mib"],
                mem_bw_gbs=float(e["mem_bw_gbs"]),
                sm_count=e["sm_count"],
                fp32_tflops=float(e["fp32_tflops"]),
                tf32_tflops=None if e.get("tf32_tflops") is None else float(e["tf32_tflops"]),
                fp16_tflops=float(e["fp16_tflops"]),
                bf16_tflops=None if e.get("bf16_tflops") is None else float(e["bf16_tflops"]),
                tdp_w=float(e["tdp_w"]),
                source=e.get("source") or self.origins.get(name, ""),
                notes=e.get("notes") or "",
            )
        return gpus
