"""An LLVM abort never takes the export down (issue 31): llvmlite's LLVM is built with
assertions, and one that fires aborts the process that runs LLVM. Every compile runs in a worker
process (packager/codegen/parallel.py); when a worker dies, the kernels LLVM aborts on are found
and compiled with a conservative pipeline, with a one-line warning naming the kernel and its
ONNX nodes; when no pipeline compiles one, a one-line error with the same names and exit 11.

The abort is real (``os.abort()`` in the worker, where LLVM would assert), injected through the
test-only ``MLCPACK_TEST_LLVM_ABORT`` (codegen/build.py): "NAME" aborts the default pipeline on a
kernel whose name contains NAME, "NAME:always" every pipeline.
"""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import X86_V3
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from mlcpack.packager.codegen import build, cache
from mlcpack.packager.codegen.build import FAULT_ENV, KernelCompileError
from mlcpack.packager.codegen.parallel import compile_prim_funcs, death_reason
from mlcpack.packager.options import CompileOptions
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.runtime import load

ort = pytest.importorskip("onnxruntime")

# The assertion LLVM printed for the int8 LSTM's kernel on x86-64-v4 (abridged).
ASSERTION = ("python: /llvm/lib/Transforms/Vectorize/LoopVectorize.cpp:7264: llvm::"
             "VectorizationFactor llvm::LoopVectorizationPlanner::computeBestVF(): Assertion "
             "`(BestFactor.Width == LegacyVF.Width || BestPlan.hasEarlyExit()) && \" VPlan cost "
             "model and legacy cost model disagreed\"' failed.\nFatal Python error: Aborted\n")


def _model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
             h.make_node("Softmax", ["y"], ["z"], name="probs", axis=-1)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 17])],
                         [h.make_tensor_value_info("z", T.FLOAT, [3, 11])],
                         [nh.from_array(rng.standard_normal((17, 11)).astype(np.float32), "w")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


@pytest.fixture()
def core_dumps_allowed():
    """Core files allowed (up to the hard limit) for the commands a test starts, so that a
    worker that dumped core would leave one in its working directory (core_pattern "core")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def _matches_onnxruntime(onnx_path: Path, bundle: Path) -> None:
    x = np.random.default_rng(1).standard_normal((3, 17)).astype(np.float32)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    with load(bundle) as model:
        np.testing.assert_allclose(model.run({"x": x})["z"], sess.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-6)


def test_a_kernel_llvm_aborts_on_is_retried_with_a_conservative_pipeline(
        tmp_path, run_cli, core_dumps_allowed) -> None:
    """The portable default on an AVX2 host (simulated): v2 and v3, a worker each."""
    onnx_path = _model(tmp_path / "m.onnx")
    out = tmp_path / "m.mlc"
    proc = run_cli("export", onnx_path, "-o", out, timeout=300, cwd=tmp_path,
                   env={FAULT_ENV: "softmax", "MLCPACK_CPU_FEATURES": X86_V3, cache.ENV: "off"})
    assert proc.returncode == 0, proc.stderr
    levels = ["x86-64-v2", "x86-64-v3"]
    assert proc.stderr.splitlines() == [
        f"warning: LLVM aborted compiling kernel softmax (ONNX node probs, Softmax) for {lv} "
        "(killed by SIGABRT); compiled it with -O2 without the loop vectorizer instead"
        for lv in levels]
    assert "golden check passed" in proc.stdout
    assert not list(tmp_path.glob("core*"))   # the workers' working directory
    _matches_onnxruntime(onnx_path, out)


def test_a_kernel_no_pipeline_compiles_fails_the_export_with_exit_11(
        tmp_path, run_cli, one_line_error, core_dumps_allowed) -> None:
    onnx_path = _model(tmp_path / "m.onnx")
    out = tmp_path / "m.mlc"
    proc = run_cli("export", onnx_path, "-o", out, "--target", "x86-64-v2", timeout=300,
                   cwd=tmp_path, env={FAULT_ENV: "softmax:always", cache.ENV: "off"})
    assert proc.returncode == 11, proc.stderr
    assert one_line_error(proc) == (
        "error: LLVM aborted compiling kernel softmax (ONNX node probs, Softmax) for x86-64-v2, "
        "also with its conservative pipelines (killed by SIGABRT); export for other targets "
        "(--target) or report it")
    assert not out.exists() and not list(tmp_path.glob("core*"))


def test_a_cache_hit_warns_again_without_running_llvm(tmp_path, run_cli) -> None:
    onnx_path = _model(tmp_path / "m.onnx")
    env = {FAULT_ENV: "softmax", cache.ENV: str(tmp_path / "cache")}
    first = run_cli("export", onnx_path, "-o", tmp_path / "a.mlc", "--target", "x86-64-v2",
                    "--no-check", timeout=300, env=env)
    # the hit runs no LLVM, so an abort injected into every pipeline changes nothing
    second = run_cli("export", onnx_path, "-o", tmp_path / "b.mlc", "--target", "x86-64-v2",
                     "--no-check", timeout=300, env={**env, FAULT_ENV: "softmax:always"})
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stderr == second.stderr and "kernel softmax" in first.stderr
    assert (tmp_path / "a.mlc").read_bytes() == (tmp_path / "b.mlc").read_bytes()


def test_the_python_api_survives_an_abort_too(tmp_path, monkeypatch) -> None:
    """``compile_prim_funcs`` (one target) runs LLVM in a worker as the export does."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import compile_module

    monkeypatch.setenv(cache.ENV, "off")
    optimized, _, _ = compile_module(import_onnx(str(_model(tmp_path / "m.onnx")))[0],
                                     target="x86-64-v3")
    funcs = list(optimized.prim_funcs().values())
    target = resolve_target("x86-64-v3")
    plain = compile_prim_funcs(funcs, target)
    assert plain.fallbacks == ()
    code = compile_prim_funcs(funcs, target, options=CompileOptions(llvm_abort="softmax"))
    (fb,) = code.fallbacks
    assert (fb.kernel, fb.pipeline, fb.reason) == ("softmax", build.CONSERVATIVE_PIPELINES[0],
                                                   "killed by SIGABRT")
    assert code.kernels.keys() == plain.kernels.keys() and code.object_code
    with pytest.raises(KernelCompileError) as info:
        compile_prim_funcs(funcs, target, options=CompileOptions(llvm_abort="softmax:always"))
    assert info.value.kernels == ("softmax",)


def test_what_llvm_said_is_one_line() -> None:
    assert death_reason(ASSERTION, -6) == "VPlan cost model and legacy cost model disagreed"
    assert death_reason("LLVM ERROR: Cannot select: 0x1234\nmore\n", 1) == \
        "Cannot select: 0x1234"
    assert death_reason("", -9) == "killed by SIGKILL"
    assert death_reason("", 1) == "exited with status 1 without a result"
