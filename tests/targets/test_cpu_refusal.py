"""Bundles built for CPU features (or an architecture) the host lacks are refused before any code
is mapped, with a message that says what is missing and how to export for this host."""

from __future__ import annotations

import numpy as np
import pytest
from mlcpack.runtime import cpu, elf, load
from mlcpack.runtime.errors import CpuFeatureError

HOST_X86 = elf._real_arch() == "x86_64"
needs_x86 = pytest.mark.skipif(not HOST_X86, reason="x86-64 bundles run only on x86-64")
AVX512 = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


@pytest.fixture(scope="module")
def level_bundles(tmp_path_factory, mlp_weights, export_weights) -> dict[str, object]:
    """The demo MLP exported for x86-64-v4 and for x86-64-v3 (compiling needs no such CPU)."""
    folder = tmp_path_factory.mktemp("levels")
    return {lv: export_weights(mlp_weights, folder / f"mlp-{lv}.mlc", target=lv,
                               labels=[str(d) for d in range(10)])
            for lv in ("x86-64-v4", "x86-64-v3")}


@pytest.fixture()
def v3_host(monkeypatch, x86_levels) -> str:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels["x86-64-v3"])
    assert cpu.best_level() == "x86-64-v3"
    return x86_levels["x86-64-v3"]


def test_bundles_record_their_level(level_bundles) -> None:
    from mlcpack.runtime.bundle import BundleReader

    for lv, path in level_bundles.items():
        with BundleReader(path) as reader:
            (variant,) = reader.header["code"]
        assert variant["level"] == lv and variant["arch"] == "x86_64"


def test_v4_bundle_is_refused_on_a_v3_host_before_mapping(level_bundles, v3_host, mapped
                                                         ) -> None:
    with pytest.raises(CpuFeatureError) as info:
        load(level_bundles["x86-64-v4"])
    msg = str(info.value)
    assert "\n" not in msg
    assert "x86-64-v4" in msg
    for flag in AVX512:
        assert flag in msg, (flag, msg)
    assert "--target x86-64-v3" in msg
    assert "mlp-x86-64-v4.mlc" in msg
    assert mapped == []  # refused before any code was mapped


def test_v4_bundle_is_refused_even_without_verify(level_bundles, v3_host, mapped) -> None:
    with pytest.raises(CpuFeatureError):
        load(level_bundles["x86-64-v4"], verify=False)
    assert mapped == []


def test_v4_bundle_refused_on_a_v3_host_missing_one_flag(level_bundles, monkeypatch,
                                                         x86_levels, mapped) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels["x86-64-v4"].replace(",avx512vl", ""))
    with pytest.raises(CpuFeatureError) as info:
        load(level_bundles["x86-64-v4"])
    msg = str(info.value)
    assert "x86-64-v4 needs avx512vl)" in msg  # only the missing flag is named
    assert "--target x86-64-v3" in msg
    assert mapped == []


def test_a_v2_host_is_told_to_export_for_v2(level_bundles, monkeypatch, x86_levels) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", x86_levels["x86-64-v2"])
    with pytest.raises(CpuFeatureError) as info:
        load(level_bundles["x86-64-v3"])
    msg = str(info.value)
    assert "x86-64-v3" in msg and "avx2" in msg and "--target x86-64-v2" in msg


@needs_x86
def test_v3_bundle_runs_on_a_v3_host(level_bundles, v3_host, mapped, reference_mlp,
                                     mlp_weights) -> None:
    if cpu.best_level("x86_64", cpu._detected_features()) not in ("x86-64-v3", "x86-64-v4"):
        pytest.skip("this CPU cannot really run x86-64-v3 code")
    rng = np.random.default_rng(11)
    with load(level_bundles["x86-64-v3"]) as model:
        assert model.code_variant["level"] == "x86-64-v3"
        for _ in range(3):
            x = rng.random((1, 784), dtype=np.float32)
            np.testing.assert_allclose(model(x), reference_mlp(mlp_weights, x), rtol=1e-5,
                                       atol=1e-5)
    assert len(mapped) == 1


def test_foreign_architecture_is_refused(level_bundles, monkeypatch, mapped) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "aarch64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "fp,asimd,asimddp")
    for path in level_bundles.values():
        with pytest.raises(CpuFeatureError) as info:
            load(path)
        msg = str(info.value)
        assert "aarch64" in msg and "x86_64" in msg, msg
        assert "--target aarch64" in msg, msg
    assert mapped == []


def test_describe_reports_the_refusal(level_bundles, v3_host) -> None:
    from mlcpack.runtime.describe import describe

    info = describe(level_bundles["x86-64-v4"])
    assert info["runs_here"] is False and "x86-64-v4" in info["refusal"]
    assert describe(level_bundles["x86-64-v3"])["runs_here"] is True


def test_cli_infer_refuses_with_one_line(level_bundles, run_cli, paths, x86_levels,
                                         one_line_error) -> None:
    env = {"MLCPACK_CPU_ARCH": "x86_64", "MLCPACK_CPU_FEATURES": x86_levels["x86-64-v3"]}
    proc = run_cli("infer", level_bundles["x86-64-v4"], paths["samples"] / "digit_7.png",
                   env=env)
    line = one_line_error(proc)
    assert proc.returncode == CpuFeatureError.exit_code == 5
    assert "x86-64-v4" in line and "avx512f" in line and "--target x86-64-v3" in line
    assert proc.stdout == ""

    proc = run_cli("infer", level_bundles["x86-64-v4"], paths["samples"] / "digit_7.png",
                   env={"MLCPACK_CPU_ARCH": "aarch64", "MLCPACK_CPU_FEATURES": "fp,asimd"})
    line = one_line_error(proc)
    assert proc.returncode == CpuFeatureError.exit_code
    assert "aarch64" in line

    # inspect still describes the bundle and says why it cannot run here.
    proc = run_cli("inspect", level_bundles["x86-64-v4"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "cannot run it" in proc.stdout and "avx512f" in proc.stdout

    if HOST_X86 and cpu.best_level("x86_64", cpu._detected_features()) in ("x86-64-v3",
                                                                            "x86-64-v4"):
        proc = run_cli("infer", level_bundles["x86-64-v3"], paths["samples"] / "digit_7.png",
                       env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[0] == "digit_7.png: 7"
