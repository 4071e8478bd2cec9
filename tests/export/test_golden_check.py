"""The export's golden check (packager/golden.py) and `mlcpack verify` (runtime/selftest.py):
export runs the model with a reference and with the bundle, embeds the pair, and refuses (nothing
written) when they disagree; verify re-runs the pair with the runtime alone."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cli_in_process import run_cli_in_process
from conftest import ARTIFACTS
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader
from mlcpack.runtime.selftest import GoldenMismatchError, NoGoldenDataError, verify

from bundle_parts import payload_spans, read_parts, write_parts
from test_runtime_isolation import ALL_COMPILER, _blocker, _clean_env


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(3)
    return {"w0": rng.standard_normal((16, 12)).astype(np.float32),
            "b0": rng.standard_normal(16).astype(np.float32),
            "w1": rng.standard_normal((5, 16)).astype(np.float32),
            "b1": rng.standard_normal(5).astype(np.float32)}


def _export(weights, path, shape=(2, 12), **opts):
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import ExportOptions, export_module

    mod = build_from_spec(infer_mlp_spec(weights), weights, shape)
    return export_module(mod, path, ExportOptions(check=True, **opts))


@pytest.fixture(scope="module")
def checked(tmp_path_factory, small):
    path = tmp_path_factory.mktemp("golden") / "g.mlc"
    report = _export(small, path)
    return path, report


def test_a_passing_export_embeds_the_golden_pair(checked, small, reference_mlp) -> None:
    path, report = checked
    assert report.check.startswith("golden check passed against the numpy reference of the IR")
    with BundleReader(path) as reader:
        g = reader.header["golden"]
        assert g["rtol"] == 1e-3 and g["atol"] == 1e-4 and g["seed"] == 0
        (x,) = g["inputs"]
        assert x["name"] == "x" and x["shape"] == [2, 12] and x["dtype"] == "float32"
    result = verify(path)
    assert result.ok and result.max_rel < 1e-5
    # the embedded input is the seeded one, and the output is the reference's
    from mlcpack.runtime.selftest import golden_arrays
    with BundleReader(path) as reader:
        ins, outs, _ = golden_arrays(reader)
        want = np.random.default_rng(0).standard_normal((2, 12)).astype(np.float32)
        np.testing.assert_array_equal(ins["x"], want)
        np.testing.assert_allclose(outs["logits"], reference_mlp(small, want), rtol=1e-5,
                                   atol=1e-5)


def test_a_wrong_reference_fails_the_export_and_writes_nothing(tmp_path, small) -> None:
    from mlcpack.packager.export import ExportError

    path = tmp_path / "w.mlc"
    with pytest.raises(ExportError) as info:
        _export(small, path, reference=lambda feeds: {"logits": np.zeros((2, 5), np.float32)},
                reference_name="a wrong reference")
    msg = str(info.value)
    assert "golden check failed against a wrong reference" in msg and "\n" not in msg
    assert "nothing written" in msg and "--no-check" in msg
    assert list(tmp_path.iterdir()) == []


def test_a_corrupted_kernel_fails_the_export(tmp_path, small, monkeypatch) -> None:
    """relu's kernel computes -x instead (its numpy reference is untouched)."""
    from mlcpack.packager.export import ExportError
    from mlcpack.packager.ops.registry import OPS

    monkeypatch.setitem(OPS, "relu", dataclasses.replace(OPS["relu"],
                                                         legalize=OPS["negative"].legalize))
    path = tmp_path / "bad.mlc"
    with pytest.raises(ExportError, match="golden check failed"):
        _export(small, path)
    assert list(tmp_path.iterdir()) == []


def _mlp_wide(rng):
    """An MLP whose first matmul (64 x 256 by 256 x 256) is a parallel kernel."""
    return {"w0": rng.standard_normal((256, 256)).astype(np.float32) / 16,
            "b0": rng.standard_normal(256).astype(np.float32),
            "w1": rng.standard_normal((10, 256)).astype(np.float32) / 16,
            "b1": rng.standard_normal(10).astype(np.float32)}


def test_a_fault_in_the_parallel_split_fails_the_export(tmp_path, monkeypatch) -> None:
    """The check runs the bundle on 2 threads too: tasks past the first computing nothing is
    right on 1 thread (one task does all the work) and wrong on several."""
    from mlcpack.packager.codegen.contraction.kernel import ContractionEmitter
    from mlcpack.packager.codegen.helpers import const_i64
    from mlcpack.packager.export import ExportError

    weights = _mlp_wide(np.random.default_rng(5))
    good = _export(weights, tmp_path / "good.mlc", (64, 256))
    assert good.check.startswith("golden check passed")
    with load(tmp_path / "good.mlc") as m:
        assert m.has_parallel_kernels

    split = ContractionEmitter._split

    def first_task_only(self, total, task, ntasks):
        lo, hi = split(self, total, task, ntasks)
        b = self.builder
        return lo, b.select(b.icmp_signed("==", task, const_i64(0)), hi, lo)

    monkeypatch.setattr(ContractionEmitter, "_split", first_task_only)
    monkeypatch.setenv("MLCPACK_CACHE_DIR", "off")   # a patched code generator: not in the cache key
    bad = tmp_path / "bad" / "bad.mlc"
    bad.parent.mkdir()
    with pytest.raises(ExportError) as info:
        _export(weights, bad, (64, 256))
    msg = str(info.value)
    assert "golden check failed on 2 threads" in msg and "passed on 1 thread" in msg, msg
    assert "nothing written" in msg and "\n" not in msg
    assert list(bad.parent.iterdir()) == []


def test_a_golden_output_altered_after_export_fails_verify(checked, tmp_path,
                                                           one_line_error) -> None:
    path, _ = checked
    header, payloads = read_parts(path)
    spans = payload_spans(header)
    out = header["golden"]["outputs"][0]["data"]
    i = spans.index((out["offset"], out["size"]))
    y = np.frombuffer(payloads[i], np.float32).copy()
    y[3] += 0.5 * np.abs(y).max()
    payloads[i] = y.tobytes()
    bad = write_parts(tmp_path / "altered.mlc", header, payloads)  # re-hashed: loads fine
    with pytest.raises(GoldenMismatchError):
        raise GoldenMismatchError("") if not verify(bad).ok else AssertionError("passed")
    proc = run_cli_in_process("verify", bad)
    assert proc.returncode == 13
    assert proc.stdout.splitlines()[-1] == "FAIL" and "max rel error" in proc.stdout
    assert "does not reproduce its golden output" in one_line_error(proc)


def test_verify_without_golden_data_says_so(mlp_bundle, one_line_error) -> None:
    path, _ = mlp_bundle  # exported through the API without the check
    with pytest.raises(NoGoldenDataError):
        verify(path)
    proc = run_cli_in_process("verify", path)
    assert proc.returncode == 14
    assert "carries no golden data" in one_line_error(proc)


def test_verify_names_an_export_whose_reference_could_not_run(tmp_path, small, run_cli,
                                                             one_line_error) -> None:
    """A reference that cannot run the model skips the check, and the bundle has no pair:
    verify's message names that case among the reasons."""
    from mlcpack.frontends.reference import Reference, ReferenceUnavailable

    def unavailable(feeds):
        raise ReferenceUnavailable("this reference cannot run it")

    path = tmp_path / "unchecked.mlc"
    report = _export(small, path, reference=Reference(unavailable, "a failing reference"))
    assert report.check.startswith("golden check skipped") and "cannot run it" in report.check
    proc = run_cli("verify", path)
    assert proc.returncode == 14
    assert "no reference that could run at export" in one_line_error(proc)


def test_cli_export_checks_against_onnxruntime_and_verify_passes_without_the_compiler(
        tmp_path, run_cli) -> None:
    path = tmp_path / "mlp.mlc"
    proc = run_cli("export", ARTIFACTS / "mlp.onnx", "-o", path)
    assert proc.returncode == 0, proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout
    script = _blocker(ALL_COMPILER) + textwrap.dedent(f"""
        import sys
        sys.argv = ["mlcpack", "verify", {str(path)!r}]
        try:
            from mlcpack.packager.cli import main
            main()
        finally:
            leaked = sorted(m for m in sys.modules
                            if m.split(".")[0] in ("llvmlite", "onnx", "onnxruntime", "torch")
                            or m.startswith("mlcpack.frontends"))
            print("LEAKED", leaked)
    """)
    # the CLI module itself lives in mlcpack.packager: let that one module through
    script = script.replace("ALLOWED = ()", "ALLOWED = ('mlcpack.packager', "
                                            "'mlcpack.packager.cli')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_clean_env(), timeout=120)
    assert "PASS" in proc.stdout.splitlines(), proc.stdout + proc.stderr
    assert "LEAKED []" in proc.stdout


def test_check_input_is_used_and_embedded(tmp_path) -> None:
    x = np.random.default_rng(11).random((1, 784), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    path = tmp_path / "m.mlc"
    proc = run_cli_in_process("export", ARTIFACTS / "mlp.onnx", "-o", path, "--check-input",
                              f"x={tmp_path / 'x.npy'}")
    assert proc.returncode == 0, proc.stderr
    from mlcpack.runtime.selftest import golden_arrays
    with BundleReader(path) as reader:
        ins, _, rec = golden_arrays(reader)
        np.testing.assert_array_equal(ins["x"], x)
        assert rec.seed is None
    proc = run_cli_in_process("export", ARTIFACTS / "mlp.onnx", "-o", path, "--check-input",
                              "y=a.npy")
    assert proc.returncode == 7  # InputError: no such file


def test_cli_check_options(tmp_path, paths, one_line_error) -> None:
    out = tmp_path / "m.mlc"
    proc = run_cli_in_process("export", paths["mlp_pickle"], "-o", out, "--check-rtol", "-1")
    assert proc.returncode == 2 and "--check-rtol" in one_line_error(proc)
    proc = run_cli_in_process("export", paths["mlp_pickle"], "-o", out, "--no-check")
    assert proc.returncode == 0 and "golden check: off" in proc.stdout
    with BundleReader(out) as reader:
        assert "golden" not in reader.header
    proc = run_cli_in_process("inspect", out)
    assert "golden check: none embedded" in proc.stdout
    proc = run_cli_in_process("export", paths["mlp_pickle"], "-o", out)
    assert "golden check passed against the numpy reference of the IR" in proc.stdout
    info = json.loads(run_cli_in_process("inspect", "--json", out).stdout)
    assert info["golden"]["inputs"] == [{"name": "x", "shape": [1, 784], "dtype": "float32"}]


def test_a_large_pair_is_checked_but_not_embedded(tmp_path, small, monkeypatch) -> None:
    from mlcpack.packager import golden

    monkeypatch.setattr(golden, "MAX_EMBED_BYTES", 16)
    report = _export(small, tmp_path / "big.mlc")
    assert report.check.startswith("golden check passed") and "not embedded" in report.check
    with BundleReader(tmp_path / "big.mlc") as reader:
        assert "golden" not in reader.header


def test_a_target_this_host_cannot_run_is_not_checked(tmp_path, small) -> None:
    report = _export(small, tmp_path / "arm.mlc", target="aarch64")
    assert "not run on this host" in report.check
    with BundleReader(tmp_path / "arm.mlc") as reader:
        assert "golden" in reader.header  # verify on the device runs it
