"""The GPU catalog: packaged data sanity, alias lookup, site files, peak figures."""

import json
import math

import pytest

from slurm_horus.errors import HorusError
from slurm_horus.predict.gpus import ARCHES, ENV_VAR, GPU, Catalog, normalize

NO_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(environ=NO_ENV, site_file=None)


def load(*paths, environ=NO_ENV, site_file=None) -> Catalog:
    return Catalog.load(paths, environ=environ, site_file=site_file)


def write(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# A site-added GPU (not in the packaged catalog); tf32_tflops left out on purpose (optional).
FULL_ENTRY = {
    "name": "rtx-a4000",
    "aliases": ["nvidia_rtx_a4000"],
    "vendor": "nvidia",
    "arch": "ampere",
    "compute_capability": "8.6",
    "mem_mib": 16376,
    "mem_bw_gbs": 448,
    "sm_count": 48,
    "fp32_tflops": 19.2,
    "fp16_tflops": 76.7,
    "bf16_tflops": 76.7,
    "tdp_w": 140,
}


# --- packaged data ----------------------------------------------------------------------------

REQUIRED_MODELS = [
    "v100-16gb", "v100-32gb", "p100", "t4", "a10", "a10g", "a30", "a40", "a100-40gb", "a100-80gb",
    "a100-pcie-40gb", "a100-pcie-80gb", "a2", "l4", "l40", "l40s", "h100-pcie", "h100-sxm", "h100-nvl",
    "h200", "gh200", "b200", "rtx2080ti", "rtx3090", "rtx4090", "rtx-a6000", "rtx6000-ada", "titan-rtx",
    "quadro-rtx8000",
]


@pytest.mark.parametrize("model", REQUIRED_MODELS)
def test_required_models_present(catalog, model):
    assert catalog.get(model)


def test_packaged_json_is_well_formed():
    from importlib import resources

    data = json.loads(resources.files("slurm_horus").joinpath("data/gpus.json").read_text())
    names = [e["name"] for e in data["gpus"]]
    assert len(names) == len(set(names))
    for e in data["gpus"]:
        assert e["name"] == normalize(e["name"]), e["name"]
        assert e["source"].strip(), e["name"]


def test_every_packaged_entry_is_plausible(catalog):
    assert len(catalog) >= len(REQUIRED_MODELS)
    for gpu in catalog:
        assert isinstance(gpu, GPU)
        assert gpu.vendor == "nvidia"
        assert gpu.arch in ARCHES
        major, minor = (int(x) for x in gpu.compute_capability.split("."))
        assert 6 <= major <= 12 and 0 <= minor <= 9, gpu.name
        # 8 GiB .. 256 GiB, and never more than the marketed size in GiB allows.
        assert 8 * 1024 <= gpu.mem_mib <= 256 * 1024, gpu.name
        assert 100 <= gpu.mem_bw_gbs <= 10_000, gpu.name
        assert 10 <= gpu.sm_count <= 200, gpu.name
        assert 25 <= gpu.tdp_w <= 1200, gpu.name
        assert 1 <= gpu.fp32_tflops <= 120, gpu.name
        assert gpu.fp16_tflops >= gpu.fp32_tflops, gpu.name
        assert gpu.fp16_tflops <= 2500, gpu.name
        if gpu.tf32_tflops is not None:
            assert gpu.fp32_tflops <= gpu.tf32_tflops <= gpu.fp16_tflops, gpu.name
        if gpu.bf16_tflops is not None:
            assert gpu.bf16_tflops == gpu.fp16_tflops, gpu.name
        # Ampere and later have TF32 and BF16; earlier generations have neither.
        modern = gpu.arch not in ("pascal", "volta", "turing")
        assert (gpu.tf32_tflops is not None) == modern, gpu.name
        assert (gpu.bf16_tflops is not None) == modern, gpu.name
        assert gpu.name not in gpu.aliases


def test_known_figures(catalog):
    a100 = catalog.get("a100-40gb")
    assert (a100.mem_mib, a100.sm_count, a100.fp32_tflops, a100.tf32_tflops, a100.fp16_tflops) == (
        40960, 108, 19.5, 156.0, 312.0)
    assert a100.compute_capability == "8.0" and a100.arch == "ampere"
    assert catalog.get("t4").mem_mib == 15360
    assert catalog.get("h100-sxm").mem_mib == 81559
    assert catalog.get("h100-sxm").fp16_tflops == 989.5  # dense, not the 1979 sparsity figure
    assert catalog.get("v100-32gb").tf32_tflops is None


def test_aliases_are_unique(catalog):
    seen: dict[str, str] = {}
    for gpu in catalog:
        for alias in gpu.aliases:
            assert alias not in catalog.names(), alias
            assert alias not in seen, f"{alias} in {seen.get(alias)} and {gpu.name}"
            seen[alias] = gpu.name


# --- lookup -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, expected",
    [
        ("a100", "a100-40gb"),
        ("A100", "a100-40gb"),
        ("a100_40g", "a100-40gb"),
        ("a100-sxm4-40gb", "a100-40gb"),
        ("nvidia_a100-sxm4-40gb", "a100-40gb"),  # Slurm AutoDetect=nvml type name
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),  # raw NVML device name
        ("nvidia-a100-sxm4-40gb", "a100-40gb"),
        ("a100_pcie_40g", "a100-pcie-40gb"),
        ("nvidia_a100-pcie-40gb", "a100-pcie-40gb"),
        ("nvidia_a100-sxm4-80gb", "a100-80gb"),
        ("nvidia_a100_80gb_pcie", "a100-pcie-80gb"),
        ("v100", "v100-16gb"),
        ("tesla_v100-sxm2-32gb", "v100-32gb"),
        ("tesla_v100-pcie-16gb", "v100-pcie-16gb"),
        ("tesla_t4", "t4"),
        ("Tesla T4", "t4"),
        ("p100", "p100-16gb"),
        ("h100", "h100-sxm"),
        ("nvidia_h100_80gb_hbm3", "h100-sxm"),
        ("nvidia_h100_pcie", "h100-pcie"),
        ("nvidia_h100_nvl", "h100-nvl"),
        ("nvidia_h200", "h200"),
        ("nvidia_gh200_480gb", "gh200"),
        ("nvidia_geforce_rtx_3090", "rtx3090"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("nvidia_geforce_rtx_2080_ti", "rtx2080ti"),
        ("nvidia_rtx_a6000", "rtx-a6000"),
        ("nvidia_rtx_6000_ada_generation", "rtx6000-ada"),
        ("quadro_rtx_8000", "quadro-rtx8000"),
        ("nvidia_titan_rtx", "titan-rtx"),
        ("  L40S ", "l40s"),
        ("nvidia_a10g", "a10g"),
    ],
)
def test_lookup_by_alias(catalog, query, expected):
    assert catalog.get(query).name == expected
    assert query in catalog


def test_unknown_type_lists_known_names(catalog):
    with pytest.raises(HorusError) as exc:
        catalog.get("x")
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("unknown GPU type 'x'; known: ")
    listed = msg.split("known: ", 1)[1].split(", ")
    assert listed == sorted(catalog.names())
    assert "a100-40gb" in listed and "h100-sxm" in listed
    assert catalog.find("x") is None
    assert "x" not in catalog


def test_names_and_iteration(catalog):
    names = catalog.names()
    assert names == sorted(names)
    assert [g.name for g in catalog] == names
    assert len(catalog) == len(names)


def test_normalize():
    assert normalize("NVIDIA_A100-SXM4-40GB") == "a100-sxm4-40gb"
    assert normalize("NVIDIA GeForce RTX 3090") == "geforce-rtx-3090"
    assert normalize("a100__40g") == "a100-40g"


# --- peak figures -----------------------------------------------------------------------------


def test_peak_flops_per_precision(catalog):
    a100 = catalog.get("a100")
    assert a100.peak_flops("fp32") == pytest.approx(19.5e12)
    assert a100.peak_flops("tf32") == pytest.approx(156e12)
    assert a100.peak_flops("fp16") == pytest.approx(312e12)
    assert a100.peak_flops("amp") == pytest.approx(312e12)
    assert a100.peak_flops("bf16") == pytest.approx(312e12)
    assert a100.peak_flops("FP16") == a100.peak_flops("fp16")
    assert a100.peak_flops() == a100.peak_flops("fp32")


def test_peak_flops_pre_ampere(catalog):
    v100 = catalog.get("v100")
    assert v100.peak_flops("amp") == pytest.approx(125e12)
    assert v100.peak_flops("tf32") == v100.peak_flops("fp32")  # no TF32: runs as fp32
    with pytest.raises(HorusError, match="does not support bf16"):
        v100.peak_flops("bf16")
    with pytest.raises(HorusError, match="unknown precision 'int4'"):
        v100.peak_flops("int4")


def test_memory_units(catalog):
    a100 = catalog.get("a100")
    assert a100.mem_bytes == 40960 * 1024 * 1024
    assert a100.mem_bw_bytes_per_s == pytest.approx(1555e9)
    assert isinstance(a100.mem_bytes, int)


def test_gpu_is_frozen(catalog):
    with pytest.raises(AttributeError):
        catalog.get("t4").mem_mib = 1  # type: ignore[misc]


# --- site files -------------------------------------------------------------------------------


def test_site_file_adds_a_gpu(tmp_path):
    path = write(tmp_path, "site.json", {"gpus": [FULL_ENTRY]})
    cat = load(path)
    gpu = cat.get("NVIDIA RTX A4000")
    assert gpu.name == "rtx-a4000" and gpu.vendor == "nvidia"
    assert gpu.tf32_tflops is None and gpu.source == path
    assert "rtx-a4000" in cat.names() and "a100-40gb" in cat.names()


def test_site_file_as_bare_list_adds_aliases(tmp_path):
    path = write(tmp_path, "site.json", [{"name": "a100-80gb", "aliases": ["a100", "lab_big_gpu"]}])
    cat = load(path)
    # 'a100' now means the 80 GB card; the packaged entry lost the alias.
    assert cat.get("a100").name == "a100-80gb"
    assert cat.get("lab-big-gpu").name == "a100-80gb"
    assert "a100" not in cat.get("a100-40gb").aliases
    assert cat.get("a100_40g").name == "a100-40gb"
    # Other packaged aliases and figures are kept.
    assert cat.get("nvidia_a100-sxm4-80gb").mem_mib == 81920
    assert cat.get("a100-80gb").source == catalog_source("a100-80gb")


def catalog_source(name):
    return Catalog.load(environ=NO_ENV, site_file=None).get(name).source


def test_site_file_overrides_fields(tmp_path):
    path = write(tmp_path, "site.json", [{"name": "T4", "tdp_w": 60, "notes": "power-capped"}])
    t4 = load(path).get("t4")
    assert t4.tdp_w == 60 and t4.notes == "power-capped"
    assert t4.mem_mib == 15360  # untouched
    assert path in t4.source


def test_later_files_win_and_env_var(tmp_path):
    first = write(tmp_path, "a.json", [{"name": "t4", "tdp_w": 50}])
    second = write(tmp_path, "b.json", [{"name": "t4", "tdp_w": 55}])
    third = write(tmp_path, "c.json", [{"name": "t4", "tdp_w": 65}])
    assert load(environ={ENV_VAR: f"{first}:{second}"}).get("t4").tdp_w == 55
    assert load(third, environ={ENV_VAR: f"{first}::{second}"}).get("t4").tdp_w == 65
    assert load(site_file=first).get("t4").tdp_w == 50
    assert load(site_file=first, environ={ENV_VAR: second}).get("t4").tdp_w == 55


def test_env_var_from_os_environ(tmp_path, monkeypatch):
    path = write(tmp_path, "site.json", [{"name": "t4", "tdp_w": 42}])
    monkeypatch.setenv(ENV_VAR, path)
    assert Catalog.load(site_file=None).get("t4").tdp_w == 42


def test_missing_default_site_file_is_fine(tmp_path):
    assert load(site_file=tmp_path / "absent.json").get("t4")


def test_site_entry_may_take_a_packaged_alias_as_its_name(tmp_path):
    entry = dict(FULL_ENTRY, name="a100", aliases=[])
    cat = load(write(tmp_path, "site.json", [entry]))
    assert cat.get("a100").name == "a100"
    assert "a100" not in cat.get("a100-40gb").aliases


def error_for(tmp_path, data, name="site.json") -> str:
    path = write(tmp_path, name, data)
    with pytest.raises(HorusError) as exc:
        load(path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert path in msg, msg
    return msg


def test_bad_json_names_the_file(tmp_path):
    msg = error_for(tmp_path, '{"gpus": [', "broken.json")
    assert "invalid JSON" in msg and "line 1" in msg


def test_missing_site_file_errors(tmp_path):
    path = str(tmp_path / "nope.json")
    with pytest.raises(HorusError, match="GPU catalog .*nope.json: No such file"):
        load(path)
    with pytest.raises(HorusError, match="nope.json"):
        load(environ={ENV_VAR: path})


@pytest.mark.parametrize(
    "data, fragment",
    [
        ([{k: v for k, v in FULL_ENTRY.items() if k != "mem_mib"}], "rtx-a4000: missing field(s) mem_mib"),
        ([dict(FULL_ENTRY, mem_mib=-1)], "'mem_mib' must be positive"),
        ([dict(FULL_ENTRY, fp32_tflops=0)], "'fp32_tflops' must be positive"),
        ([dict(FULL_ENTRY, tf32_tflops=-5)], "'tf32_tflops' must be positive or null"),
        ([dict(FULL_ENTRY, mem_mib=1.5)], "'mem_mib' must be an integer"),
        ([dict(FULL_ENTRY, tdp_w="300")], "'tdp_w' must be a finite number"),
        ([dict(FULL_ENTRY, sm_count=True)], "'sm_count' must be a finite number"),
        ([dict(FULL_ENTRY, mem_bw_gbs=float("inf"))], "'mem_bw_gbs' must be a finite number"),
        ([dict(FULL_ENTRY, fp32_tflops=float("-inf"))], "'fp32_tflops' must be a finite number"),
        # past a float's range: an OverflowError (an internal error in hsubmit), now one short line
        ([dict(FULL_ENTRY, sm_count=10**400)], "'sm_count' must be a finite number, got 1000"),
        ([dict(FULL_ENTRY, tf32_tflops=-10**400)], "'tf32_tflops' must be a finite number, got -1000"),
        ([dict(FULL_ENTRY, arch="kepler")], "'arch' must be one of"),
        ([dict(FULL_ENTRY, compute_capability=9.0)], "'compute_capability' must be a string"),
        ([dict(FULL_ENTRY, aliases="a4000")], "'aliases' must be a list"),
        ([dict(FULL_ENTRY, memory_gb=64)], "unknown field(s) memory_gb"),
        ([dict(FULL_ENTRY, aliases=["t4"])], "alias 't4' is the name of another GPU"),
        ([FULL_ENTRY, FULL_ENTRY], "defined twice"),
        ([{"aliases": ["x"]}], "entry 1: missing or empty 'name'"),
        (["t4"], "entry 1: expected an object"),
        ({"models": []}, "expected a list of GPU entries"),
        ({"gpus": {}}, "must be a list"),
        ([{"name": "t4", "mem_mib": 0}], "t4: 'mem_mib' must be positive"),
        ([{"name": "a100", "tdp_w": 300}], "to change 'a100-40gb', use that name"),
    ],
)
def test_bad_site_entries(tmp_path, data, fragment):
    msg = error_for(tmp_path, data)
    assert fragment in msg and len(msg) < len(str(tmp_path)) + 200


def test_from_entries_requires_complete_entries():
    entry = dict(FULL_ENTRY, source="test")
    cat = Catalog.from_entries([entry])
    assert cat.names() == ["rtx-a4000"]
    assert math.isclose(cat.get("rtx-a4000").peak_flops("bf16"), 76.7e12)
    with pytest.raises(HorusError, match="missing field"):
        Catalog.from_entries([FULL_ENTRY])  # packaged-schema entries need a source


def test_default_catalog_is_cached(monkeypatch):
    from slurm_horus.predict import gpus

    monkeypatch.delenv(ENV_VAR, raising=False)
    gpus.default_catalog.cache_clear()
    try:
        first = gpus.default_catalog()
        assert gpus.default_catalog() is first
        gpus.default_catalog.cache_clear()
        assert gpus.default_catalog() is not first  # the cache, not a module-level global
    finally:
        gpus.default_catalog.cache_clear()
