"""Host CPU detection, instruction-set levels, and the refusals for code this CPU cannot run."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from mlcpack.runtime import cpu
from mlcpack.runtime.cpu import (
    LEVELS,
    best_level,
    check_supported,
    host_arch,
    host_features,
    level,
    pick_variant,
)
from mlcpack.runtime.errors import BundleError, CpuFeatureError

V2 = "cx16,lahf_lm,popcnt,sse4_1,sse4_2,ssse3,pni,fpu,cx8,cmov,fxsr,mmx,sse,sse2"
V3 = V2 + ",avx,avx2,bmi1,bmi2,f16c,fma,abm,movbe,xsave"
V4 = V3 + ",avx512f,avx512bw,avx512cd,avx512dq,avx512vl"


@pytest.fixture()
def x86_v3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", V3)


def test_detection_reads_proc_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLCPACK_CPU_FEATURES", raising=False)
    monkeypatch.delenv("MLCPACK_CPU_ARCH", raising=False)
    assert host_arch() in ("x86_64", "aarch64")
    feats = host_features()
    if host_arch() == "x86_64":
        assert {"sse2", "cx8"} <= feats
        assert best_level() is not None and best_level().startswith("x86-64")
    else:
        assert "asimd" in feats and best_level().startswith("aarch64")
    assert host_features() is feats  # cached


def test_env_overrides_are_read_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", " sse2, avx2 ,FMA,sse3,lzcnt")
    assert host_features() == {"sse2", "avx2", "fma", "pni", "abm"}  # aliases normalized
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "")
    assert host_features() == frozenset()
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "ARM64")
    assert host_arch() == "aarch64"
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "amd64")
    assert host_arch() == "x86_64"


def test_levels_are_ordered_and_cumulative() -> None:
    names = [lv.name for lv in LEVELS]
    x86 = [n for n in names if n.startswith("x86")]
    assert x86 == ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "x86-64-v4+vnni",
                   "x86-64-v4+bf16"]
    for low, high in itertools.pairwise(x86):
        assert level(low).flags < level(high).flags
    assert level("aarch64").flags < level("aarch64+dotprod").flags
    v3 = level("x86-64-v3")
    assert (v3.llvm_cpu, v3.triple) == ("x86-64-v3", "x86_64-unknown-linux-gnu")
    assert {"pni", "avx2", "abm", "movbe"} <= v3.flags and "avx512f" not in v3.flags
    dot = level("aarch64+dotprod")
    assert (dot.llvm_cpu, dot.llvm_features, dot.triple) == (
        "generic", "+neon,+dotprod", "aarch64-unknown-linux-gnu")
    assert "asimddp" in dot.flags
    vnni = level("x86-64-v4+vnni")
    assert vnni.flags - level("x86-64-v4").flags == {"avx512_vnni"}
    assert (vnni.llvm_cpu, vnni.llvm_features) == ("x86-64-v4", "-prefer-256-bit,+prefer-no-scatter,+avx512vnni")


def test_best_level() -> None:
    assert best_level("x86_64", set(V2.split(","))) == "x86-64-v2"
    assert best_level("x86_64", set(V3.split(","))) == "x86-64-v3"
    assert best_level("x86_64", set(V4.split(","))) == "x86-64-v4"
    assert best_level("x86_64", set(V4.split(",")) - {"avx512vl"}) == "x86-64-v3"
    assert best_level("x86_64", {"sse2"}) is None
    assert best_level("aarch64", {"asimd", "fp"}) == "aarch64"
    assert best_level("aarch64", {"asimd", "fp", "asimddp"}) == "aarch64+dotprod"


def test_check_supported_passes_and_refuses(x86_v3: None) -> None:
    check_supported("x86_64", "x86-64-v3", [], "model.mlc")
    check_supported("x86_64", "x86-64-v2", ["fma"], "model.mlc")
    with pytest.raises(CpuFeatureError) as err:
        check_supported("x86_64", "x86-64-v4", [], "model.mlc")
    assert str(err.value) == (
        "model.mlc was built for x86-64-v4 (needs avx512bw, avx512cd, avx512dq, avx512f, "
        "avx512vl); this CPU is x86-64-v3: export again with --target x86-64-v3 or the default "
        "portable target")
    with pytest.raises(CpuFeatureError, match=r"needs avx512_vnni\); this CPU is x86-64-v3"):
        check_supported("x86_64", "x86-64-v3", ["avx512_vnni"], "model.mlc")
    with pytest.raises(CpuFeatureError) as err:
        check_supported("aarch64", "aarch64+dotprod", [], "model.mlc")
    assert str(err.value) == ("model.mlc holds code for aarch64; this machine is x86_64: "
                              "export again with --target x86-64-v3")
    with pytest.raises(CpuFeatureError, match="unknown instruction-set level 'x86-64-v9'"):
        check_supported("x86_64", "x86-64-v9", [], "model.mlc")
    check_supported("x86_64", "x86-64-v9", ["avx2"], "model.mlc")  # its flags can be checked


def test_messages_on_an_old_or_foreign_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "aarch64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "fp,asimd")
    with pytest.raises(CpuFeatureError, match="needs asimddp\\); this CPU is aarch64: "
                                              "export again with --target aarch64 or the "
                                              "default portable target$"):
        check_supported("aarch64", "aarch64+dotprod", [], "m.mlc")
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "sse")
    with pytest.raises(CpuFeatureError, match="lacks even the baseline level") as err:
        check_supported("x86_64", "x86-64-v2", [], "m.mlc")
    assert "\n" not in str(err.value)


def test_pick_variant_prefers_the_most_capable(x86_v3: None) -> None:
    variants = [
        {"arch": "x86_64", "level": "x86-64-v2", "features": []},
        {"arch": "x86_64", "level": "x86-64-v4", "features": []},
        {"arch": "x86_64", "level": "x86-64-v3", "features": ["fma"]},
        {"arch": "aarch64", "level": "aarch64+dotprod", "features": []},
    ]
    assert pick_variant(variants) == 2
    assert pick_variant(variants[:1] + variants[3:]) == 0


def test_pick_variant_with_a_capable_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", V4)
    variants = [{"arch": "x86_64", "level": lv, "features": []}
                for lv in ("x86-64-v3", "x86-64-v4", "x86-64-v2")]
    assert pick_variant(variants) == 1
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "aarch64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "fp,asimd,asimddp")
    arm = [{"arch": "arm64", "level": "aarch64", "features": []},
           {"arch": "aarch64", "level": "aarch64+dotprod", "features": []}]
    assert pick_variant(arm) == 1


def test_pick_variant_refuses_with_reasons(x86_v3: None) -> None:
    variants = [
        {"arch": "x86_64", "level": "x86-64-v4", "features": []},
        {"arch": "aarch64", "level": "aarch64", "features": []},
    ]
    with pytest.raises(CpuFeatureError) as err:
        pick_variant(variants, "model.mlc")
    msg = str(err.value)
    assert msg.startswith("no code in model.mlc runs on this x86_64 CPU (x86-64-v4 needs "
                          "avx512bw, avx512cd")
    assert "; aarch64 is for aarch64 machines)" in msg
    assert msg.endswith("this CPU is x86-64-v3: export again with --target x86-64-v3 or the "
                        "default portable target")
    with pytest.raises(CpuFeatureError, match="no code variants"):
        pick_variant([])
    with pytest.raises(BundleError, match="code variant 0 is malformed"):
        pick_variant([{"level": "x86-64-v3"}])


def test_cpu_module_imports_only_the_stdlib() -> None:
    source = Path(cpu.__file__).read_text()
    assert "import numpy" not in source and "llvmlite" not in source
