"""The default target is portable (issue 14, item 3): one code variant per level from the
architecture's baseline (x86-64-v2) up to the exporting host's, so a bundle built on an
AVX-512 workstation runs on an AVX2 laptop; ``--target host`` keeps the single fastest
variant. The summary says which CPUs run the bundle; notes name no temporary file and give
advice that fits the case."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import X86_V2, X86_V3, X86_V4, mlp_reference

from mlcpack.packager.codegen.target import portable_levels, resolve_targets, runs_on


@pytest.mark.parametrize("arch, flags, levels", [
    ("x86_64", X86_V4, ["x86-64-v2", "x86-64-v3", "x86-64-v4"]),
    ("x86_64", X86_V3, ["x86-64-v2", "x86-64-v3"]),
    ("x86_64", X86_V2, ["x86-64-v2"]),
    ("x86_64", "fpu,cx8,cmov,fxsr,mmx,sse,sse2", ["x86-64"]),
    ("aarch64", "fp,asimd,asimddp", ["aarch64", "aarch64+dotprod"]),
    ("aarch64", "fp,asimd", ["aarch64"]),
])
def test_portable_levels_span_baseline_to_host(monkeypatch, arch, flags, levels) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", arch)
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
    assert portable_levels() == levels
    assert [t.name for t in resolve_targets(None)] == levels
    assert [t.name for t in resolve_targets("portable")] == levels
    assert [t.name for t in resolve_targets("host")] == levels[-1:]


def test_runs_on_words(monkeypatch) -> None:
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "x86_64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V4)
    assert runs_on(resolve_targets(None)) == "x86-64 CPUs with SSE4.2 (x86-64-v2) and up"
    assert runs_on(resolve_targets("host")) == "x86-64 CPUs with AVX-512 (x86-64-v4) and up"
    assert runs_on(resolve_targets("portable,aarch64")) == \
        "x86-64 CPUs with SSE4.2 (x86-64-v2) and up or any aarch64 CPU"


def test_default_export_is_fat_and_runs_on_every_level(run_cli, paths, tmp_path,
                                                       mlp_weights) -> None:
    out = tmp_path / "mlp.mlc"
    # an AVX2 host (simulated, so the test means the same on an AVX-512 machine)
    proc = run_cli("export", paths["mlp_pickle"], "-o", out, timeout=300,
                   env={"MLCPACK_CPU_FEATURES": X86_V3})
    assert proc.returncode == 0, proc.stderr
    assert "target x86-64-v2,x86-64-v3" in proc.stdout
    assert "  runs on x86-64 CPUs with SSE4.2 (x86-64-v2) and up" in proc.stdout.splitlines()
    info = json.loads(run_cli("inspect", out, "--json").stdout)
    assert [v["level"] for v in info["code"]] == ["x86-64-v2", "x86-64-v3"]
    x = tmp_path / "x.npy"
    rows = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    np.save(x, rows)
    want = mlp_reference(mlp_weights, rows)[0]
    for flags in (X86_V2, X86_V3):  # an SSE4.2-only server and an AVX2 machine
        doc = json.loads(run_cli("infer", out, x, "--json", env={"MLCPACK_CPU_FEATURES": flags})
                         .stdout)
        np.testing.assert_allclose(doc["outputs"]["y"][0] if "y" in doc["outputs"]
                                   else next(iter(doc["outputs"].values()))[0], want,
                                   rtol=1e-4, atol=1e-4)


def test_bundle_from_an_avx512_host_runs_on_an_avx2_host(run_cli, paths, tmp_path) -> None:
    """The issue's case: exported where x86-64-v4 is the host level (simulated; the check is
    off because an AVX2 machine cannot run v4 code), run on an AVX2 host (simulated too, so
    the test means the same on an AVX-512 machine)."""
    avx2 = {"MLCPACK_CPU_FEATURES": X86_V3}
    out = tmp_path / "mlp.mlc"
    proc = run_cli("export", paths["mlp_pickle"], "-o", out, "--no-check", timeout=300,
                   env={"MLCPACK_CPU_FEATURES": X86_V4})
    assert proc.returncode == 0, proc.stderr
    assert "target x86-64-v2,x86-64-v3,x86-64-v4" in proc.stdout
    proc = run_cli("infer", out, paths["samples"] / "digit_7.png", "-k", "1", env=avx2)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "digit_7.png: 7"
    host_only = tmp_path / "host.mlc"
    assert run_cli("export", paths["mlp_pickle"], "-o", host_only, "--no-check", "--target",
                   "host", timeout=300, env={"MLCPACK_CPU_FEATURES": X86_V4}).returncode == 0
    proc = run_cli("infer", host_only, paths["samples"] / "digit_7.png", env=avx2)
    assert proc.returncode == 5
    assert proc.stderr.strip().endswith("this CPU is x86-64-v3: export again with --target "
                                        "x86-64-v3 or the default portable target")


def test_cross_export_note_names_the_bundle_and_no_wrong_advice(run_cli, paths, tmp_path) -> None:
    out = tmp_path / "v4.mlc"
    proc = run_cli("export", paths["mlp_pickle"], "-o", out, "--target", "x86-64-v4",
                   timeout=300, env={"MLCPACK_CPU_FEATURES": X86_V3})  # an AVX2 host
    assert proc.returncode == 0, proc.stderr
    note = next(line for line in proc.stdout.splitlines() if line.startswith("golden check"))
    assert note.startswith("golden check not run on this host: no code in v4.mlc runs"), note
    assert "mlcpack-check" not in proc.stdout + proc.stderr
    assert not re.search(r"\.mlcpack-\w+", note) and "export again" not in note
    assert "`mlcpack verify v4.mlc`" in note


def test_parallel_compile_gives_the_same_objects(monkeypatch) -> None:
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.frontends.weights import load_weights
    from mlcpack.packager.export import compile_variants

    from conftest import MLP_PICKLE
    weights = load_weights(MLP_PICKLE)
    mod = build_from_spec(infer_mlp_spec(weights), weights, None)
    spec = "x86-64-v2,x86-64-v3,x86-64-v4"
    monkeypatch.setenv("MLCPACK_PARALLEL_COMPILE", "0")
    _, one_by_one, _ = compile_variants(mod, target=spec)
    monkeypatch.setenv("MLCPACK_PARALLEL_COMPILE", "1")
    _, parallel, _ = compile_variants(mod, target=spec)
    assert [v.target.name for v in parallel] == spec.split(",")
    assert [v.object_code for v in parallel] == [v.object_code for v in one_by_one]
