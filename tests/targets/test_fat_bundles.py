"""Fat bundles: ``--target x86-64-v2,x86-64-v3,x86-64-v4[,aarch64,...]`` puts one code variant per
target in one bundle that shares a single copy of the weights, memory plan and bytecode; the
runtime picks the best variant the host supports, and ``inspect`` says which. The choice is
driven here by overriding the detected CPU (MLCPACK_CPU_FEATURES / MLCPACK_CPU_ARCH)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from arm64_root import arm64_root_or_fail, run_bundles
from mlcpack.runtime import cpu, elf, load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.errors import CpuFeatureError

from conftest import ARTIFACTS, ROOT, X86_V2, X86_V3, X86_V4

X86_LEVELS = {"x86-64-v2": X86_V2, "x86-64-v3": X86_V3, "x86-64-v4": X86_V4}
FAT_X86 = ",".join(X86_LEVELS)
FAT_ALL = FAT_X86 + ",aarch64,aarch64+dotprod"
HOST_X86 = elf._real_arch() == "x86_64"
needs_x86 = pytest.mark.skipif(not HOST_X86, reason="runs x86-64 code variants")


def _host_levels() -> list[str]:
    """The x86-64 levels this machine can really execute (overrides may only lower them)."""
    return [lv for lv, flags in X86_LEVELS.items()
            if HOST_X86 and set(flags.split(",")) <= cpu._detected_features()]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, run_cli) -> dict[str, object]:
    """The demo CNN exported fat (x86 levels; x86 + aarch64) and once per single x86 level."""
    folder = tmp_path_factory.mktemp("fat")
    out = {}
    for name, target in [("fat", FAT_X86), ("fat_all", FAT_ALL), *[(lv, lv) for lv in X86_LEVELS]]:
        path = folder / f"cnn-{name}.mlc"
        proc = run_cli("export", ARTIFACTS / "cnn.onnx", "-o", path, "--target", target)
        assert proc.returncode == 0, proc.stderr
        out[name] = path
    return out


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    return np.random.default_rng(3).random((1, 1, 28, 28), dtype=np.float32)


def _header(path) -> dict:
    with BundleReader(path) as reader:
        return reader.header


def test_fat_bundle_shares_one_copy_of_the_weights(bundles) -> None:
    # one copy of each weight for all variants: as many constants as a single-level bundle,
    # none larger than the largest layout a single level packs it in (passes/layout.py packs
    # for a level's kernels: AVX2's panels, AVX-512's 32-channel blocks; a bundle whose
    # variants want different layouts keeps one copy they all read)
    fat = _header(bundles["fat_all"])
    singles = [_header(bundles[lv]) for lv in X86_LEVELS]
    levels = [v["level"] for v in fat["code"]]
    assert levels == FAT_ALL.split(",")
    for single in singles:
        assert len(fat["constants"]) == len(single["constants"])
    for i, c in enumerate(fat["constants"]):
        assert c["data"]["size"] <= max(s["constants"][i]["data"]["size"] for s in singles)
    objects = sum(v["object"]["size"] for v in fat["code"])
    weights = sum(c["data"]["size"] for c in fat["constants"])
    size = bundles["fat_all"].stat().st_size
    # weights once, every object once, plus header/IR/bytecode (well under one weights copy)
    assert weights + objects < size < 2 * weights + objects - 10_000
    offsets = [v["object"]["offset"] for v in fat["code"]]
    assert len(set(offsets)) == len(offsets)


@needs_x86
@pytest.mark.parametrize("level", list(X86_LEVELS))
def test_runtime_picks_the_best_variant_the_cpu_has(level, bundles, image, monkeypatch) -> None:
    if level not in _host_levels():
        pytest.skip(f"this CPU cannot execute {level} code")
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_LEVELS[level])
    for name in ("fat", "fat_all"):
        with load(bundles[name]) as model:
            assert model.code_variant["level"] == level
            got = model(image)
        with load(bundles[level]) as model:
            want = model(image)
        # the single-level bundle of an AVX2 (or SSE + AVX2) target packs its weights for
        # other kernels than a bundle with AVX-512 and aarch64 variants: same values, not bits
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_x86
def test_all_variants_agree(bundles, image, monkeypatch) -> None:
    results = {}
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    for level in _host_levels():
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_LEVELS[level])
        with load(bundles["fat"]) as model:
            results[level] = model(image)
    assert len(results) >= 1
    first = next(iter(results.values()))
    for level, out in results.items():
        np.testing.assert_allclose(out, first, rtol=1e-5, atol=1e-6, err_msg=level)


def test_inspect_shows_the_selected_variant(bundles, run_cli) -> None:
    proc = run_cli("inspect", "--json", bundles["fat_all"],
                   env={"MLCPACK_CPU_ARCH": "x86_64", "MLCPACK_CPU_FEATURES": X86_V3})
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [v["level"] for v in info["code"] if v["selected"]] == ["x86-64-v3"]
    proc = run_cli("inspect", bundles["fat_all"],
                   env={"MLCPACK_CPU_ARCH": "aarch64", "MLCPACK_CPU_FEATURES": "fp,asimd"})
    assert proc.returncode == 0, proc.stderr
    selected = [line for line in proc.stdout.splitlines() if "(selected on this machine)" in line]
    assert len(selected) == 1 and "level aarch64 " in selected[0]


def test_no_variant_fits_is_refused_before_mapping(bundles, monkeypatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "fpu,cx8,cmov,fxsr,mmx,sse,sse2")
    mapped = []
    monkeypatch.setattr(elf, "load_object", lambda *a, **k: mapped.append(a))
    with pytest.raises(CpuFeatureError) as info:
        load(bundles["fat"])
    assert "x86-64-v2 needs" in str(info.value) and "--target x86-64" in str(info.value)
    assert mapped == []


def test_export_refuses_an_unknown_target_in_a_list(run_cli, tmp_path, one_line_error) -> None:
    proc = run_cli("export", ARTIFACTS / "cnn.onnx", "-o", tmp_path / "x.mlc",
                   "--target", "x86-64-v3,riscv64")
    assert "riscv64" in one_line_error(proc)
    assert not (tmp_path / "x.mlc").exists()


@pytest.mark.skipif(not HOST_X86, reason="compares an emulated aarch64 run with an x86-64 one")
def test_fat_bundle_picks_aarch64_under_qemu(bundles, image, tmp_path) -> None:
    root = arm64_root_or_fail()
    with load(bundles["fat_all"]) as model:
        want = model(image)
    report, got = run_bundles(root, tmp_path, ROOT, {"cnn": (bundles["fat_all"], {"x": image})})
    assert report["machine"] == "aarch64"
    # qemu's default CPU has dotprod, so the best aarch64 variant is chosen
    assert report["chosen"][str(bundles["fat_all"])] == "aarch64+dotprod"
    np.testing.assert_allclose(got["cnn"]["probs"], want, rtol=1e-5, atol=1e-6)
