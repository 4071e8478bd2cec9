"""Shared test helpers: build a one-op model, export it, run it."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir import BlockBuilder
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features


def build_op_module(op: str, inputs: Sequence[np.ndarray], const_mask: Sequence[bool] | None = None,
                    **attrs):
    """``main`` calling ``op`` once; inputs marked in ``const_mask`` become bound constants."""
    const_mask = const_mask or [False] * len(inputs)
    bb = BlockBuilder()
    params, args = [], []
    for i, (arr, is_const) in enumerate(zip(inputs, const_mask)):
        if is_const:
            args.append(bb.constant(arr, f"c{i}"))
        else:
            v = bb.input(f"x{i}", arr.shape, str(arr.dtype))
            params.append(v)
            args.append(v)
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_op(op, *args, **attrs))
        bb.emit_func_output(out, names=["y"])
    return bb.get()


def compile_and_run(mod, feeds: dict, tmp_path: Path, target: str | None = "host",
                    name: str = "m.mlc", threads: int | None = None) -> dict:
    """Export ``mod`` and run it here: for this host's level only (these tests check numbers on
    this machine; the portable default's variants are tested in test_portable_default_target.py)."""
    path = tmp_path / name
    export_module(mod, path, ExportOptions(target=target))
    with load(path, threads=threads) as model:
        return model.run(feeds)


def onnx_mlp(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
             batch: int | str):
    """An ONNX MLP (opset 17): x [batch, K] -> MatMul W1 [K, H], Add b1, Relu, Gemm with W2
    [N, H] (transB) and b2, Softmax -> p [batch, N]; ``batch`` a size or a symbolic name."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (b1, "b1"), (w2, "W2"),
                                                        (b2, "b2"))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["h3"]),
             helper.make_node("Gemm", ["h3", "W2", "b2"], ["y"], transB=1),
             helper.make_node("Softmax", ["y"], ["p"], axis=-1)]
    g = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, w1.shape[0]])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [batch, w2.shape[0]])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])



def pipeline_calls(model, target: str, **options):
    """The ONNX ``model`` through the default pipeline for ``target`` with these
    CompileOptions fields: (the module, its main function's kernel calls in order)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.ir.graph import CallTIR
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod, _ = import_onnx(model)
    mod = run_pipeline(mod, DEFAULT_PIPELINE, options=CompileOptions(target=target, **options))
    return mod, [b.value.func for b in mod.functions["main"].bindings()
                 if isinstance(b.value, CallTIR)]



def bf16_option_runs(model, tmp_path: Path, x: np.ndarray, target: str, option: str
                     ) -> dict[bool, np.ndarray]:
    """The ONNX ``model`` (input x, output y) exported ``--precision bf16`` for ``target`` with
    the CompileOptions field ``option`` on and off: {on: output}, each checked bit for bit
    alike at 1 and 2 threads."""
    import dataclasses

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.options import CompileOptions

    got = {}
    for on in (True, False):
        mod, _ = import_onnx(model)
        path = tmp_path / f"{on}.mlc"
        report = export_module(mod, path, ExportOptions(
            target=target, precision="bf16",
            compile=dataclasses.replace(CompileOptions(), **{option: on})))
        assert report.precision == "bf16", report.precision_note
        with load(path) as one, load(path, threads=2) as two:
            got[on] = one.run({"x": x})["y"]
            np.testing.assert_array_equal(two.run({"x": x})["y"], got[on])
    return got


def ort_outputs(path: Path, feeds: dict, threads: int | None = None,
                as_written: bool = False) -> dict[str, np.ndarray]:
    """ONNX Runtime's (CPU provider) outputs of the model at ``path``, by name, in the graph's
    order; ``threads``: its intra-op threads (default: its own choice); ``as_written``: with its
    graph optimizations off, so that a QDQ model runs as the ONNX operators it is written in
    (DequantizeLinear, float op, QuantizeLinear) instead of ORT's fused integer kernels."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads is not None:
        opts.intra_op_num_threads = threads
    if as_written:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_runs_match(bundle: Path, feeds: dict, want: dict[str, np.ndarray], rtol: float,
                      atol: float, label: str, threads: Sequence[int] = (1, 2)) -> None:
    """Runs ``bundle`` on ``feeds`` at each thread count and compares every output named in
    ``want`` (a reference, e.g. ``ort_outputs``): same shape, values within rtol / atol."""
    for t in threads:
        with load(bundle, threads=t) as m:
            got = m.run(feeds)
        for y, ref in want.items():
            assert got[y].shape == ref.shape, (y, label)
            np.testing.assert_allclose(got[y], ref, rtol=rtol, atol=atol,
                                       err_msg=f"{y}, {label}, {t} threads")


def ort_int_gemm_exact(xd: str, wd: str) -> bool:
    """Whether ONNX Runtime's integer GEMM on ``xd`` x ``wd`` is exact on this CPU: its u8 x s8
    kernel on AVX2 without VNNI (``vpmaddubsw``) saturates int16 pair sums (255 * 127 * 2 >
    32767), so it can differ from the exact integer result that mlcpack (and numpy, and ORT
    with VNNI) computes."""
    if (xd, wd) != ("uint8", "int8"):
        return True
    flags = host_features()
    return bool({"avx512_vnni", "avx_vnni"} & flags) or "avx2" not in flags


def run_op(op: str, inputs: Sequence[np.ndarray], tmp_path: Path,
           const_mask: Sequence[bool] | None = None, **attrs) -> np.ndarray:
    mod = build_op_module(op, inputs, const_mask, **attrs)
    const_mask = const_mask or [False] * len(inputs)
    feeds = {f"x{i}": a for i, (a, c) in enumerate(zip(inputs, const_mask)) if not c}
    return compile_and_run(mod, feeds, tmp_path)["y"]


def force_parallel_kernels(monkeypatch, macs: bool = True, outputs: bool = True) -> None:
    """Every kernel split over threads however small, for the exports this test makes with the
    options of the environment (``CompileOptions.from_environ``, what export entries given no
    options use): ``parallel_min_macs`` (contraction, depthwise, channel-lane kernels) and/or
    ``parallel_min_outputs`` (generic loop nests, softmax, normalization) 0. Options are part
    of the compile cache's key, so these kernels never meet the unsplit ones' entries."""
    from mlcpack.packager.options import CompileOptions

    original = CompileOptions.from_environ.__func__
    changes = {**({"parallel_min_macs": 0} if macs else {}),
               **({"parallel_min_outputs": 0} if outputs else {})}

    def from_environ(cls, environ, **fields):
        return original(cls, environ, **{**changes, **fields})

    monkeypatch.setattr(CompileOptions, "from_environ", classmethod(from_environ))


# The emission under way in this process (``SharedLog.count_cache_hits``'s hook): a stack of
# (per-function key, {log file: the values appended to it meanwhile}); and whether the compile
# under way must miss the cache (a function a spy has not seen: it is emitted, then stored).
_EMITTING: list[tuple[str | None, dict[str, list]]] = []
_MISS: list[bool] = [False]


class SharedLog:
    """A list that spies fill from this process or from the forked compile workers
    (packager/codegen/parallel.py emits and compiles every module in a worker, so a plain list
    appended to by a spy there stays empty here). Values are written as Python literals, one a
    line, to a file opened for each append, and read back with ``ast.literal_eval``.

    A spy on an emitter sees only the kernels that are emitted; a compile cache hit emits none.
    ``count_cache_hits`` makes a hit count too, so such tests run with the cache on."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.write_text("")
        self.spy: str | None = None   # what the spy records (count_cache_hits)

    def append(self, value) -> None:
        with open(self.path, "a") as f:
            f.write(repr(value) + "\n")
        if _EMITTING and self.spy is not None:
            _EMITTING[-1][1].setdefault(str(self.path), []).append(value)

    def items(self) -> list:
        import ast
        return [ast.literal_eval(line) for line in self.path.read_text().splitlines()]

    def __len__(self) -> int:
        return len(self.items())

    def __iter__(self):
        return iter(self.items())

    def __bool__(self) -> bool:
        return bool(self.items())

    def __repr__(self) -> str:
        return f"SharedLog({self.items()!r})"

    def count_cache_hits(self, monkeypatch, spy: str, pure: bool = True) -> None:
        """Make a compile cache hit append what the spy appended when the hit's kernels were
        emitted. ``spy`` names what the spy records (the same name, the same values for the
        same kernel: e.g. "SoftmaxEmitter.emit: log"). Every function emitted while this runs
        has its values kept beside the cache (one store per ``spy``, keyed by the function's
        compile key: the function, target, size variables and options); a hit replays them,
        and a compile with a function the spy has not seen emitted (an entry another test
        stored) misses the cache, so that the spy sees it, and stores its object. ``pure``
        False: the spy changes what is emitted (a patched emitter that declines), and such a
        compile neither reads nor writes the cache."""
        from mlcpack.packager import export
        from mlcpack.packager.codegen import build, parallel

        import os
        directory = os.environ.get("MLCPACK_CACHE_DIR")   # the test run's (conftest.py)
        if not directory or directory == "off":
            return   # no cache: every kernel is emitted, the spy sees each
        self.spy = spy
        self.pure = pure
        self._cache_dir = directory
        monkeypatch.setattr(SharedLog, "_counting", [*SharedLog._counting, self])
        if getattr(build.emit_function, "_counts_hits", False):
            return   # another log installed the hooks in this test
        emit_function = build.emit_function

        def emitting(module, func, symbol, vl, size_vars, target, options):
            key = _function_key(func, size_vars, target, options)
            _EMITTING.append((key, {}))
            try:
                return emit_function(module, func, symbol, vl, size_vars, target, options)
            finally:
                _, values = _EMITTING.pop()
                if key is not None:
                    for log in SharedLog._counting:
                        log._remember(key, values.get(str(log.path), []))
        emitting._counts_hits = True
        monkeypatch.setattr(build, "emit_function", emitting)
        compile_for_targets = parallel.compile_for_targets

        def compiling(funcs, targets, size_vars=(), options=None, **kwargs):
            from mlcpack.packager.options import CompileOptions
            options = CompileOptions() if options is None else options
            keys = [[_function_key(f, size_vars, t, options) for f in funcs] for t in targets]
            if options.cache_dir and not all(
                    log._seen(k) for log in SharedLog._counting for k in keys):
                if all(log.pure for log in SharedLog._counting):
                    _MISS[0] = True   # the spies see every kernel; the object is stored
                else:
                    options = options.replace(cache_dir=None)
            try:
                codes = compile_for_targets(funcs, targets, size_vars, options, **kwargs)
            finally:
                _MISS[0] = False
            for code, k in zip(codes, keys):
                if code.from_cache:
                    for log in SharedLog._counting:
                        log._replay(k)
            return codes
        monkeypatch.setattr(parallel, "compile_for_targets", compiling)
        monkeypatch.setattr(export, "compile_for_targets", compiling)
        cached_code, hit = parallel.cached_code, build._hit
        monkeypatch.setattr(parallel, "cached_code",
                            lambda *args: None if _MISS[0] else cached_code(*args))
        monkeypatch.setattr(build, "_hit", lambda *args: None if _MISS[0] else hit(*args))

    _counting: list[SharedLog] = []   # the logs whose spies count cache hits (this test's)

    def _store(self) -> Path:
        """Beside the test run's cache entries (cache.entries reads only its 2-hex buckets)."""
        import hashlib
        name = hashlib.sha256(str(self.spy).encode()).hexdigest()[:24]
        return Path(self._cache_dir) / "spies" / f"{name}.log"

    def _remember(self, key: str, values: list) -> None:
        store = self._store()
        store.parent.mkdir(parents=True, exist_ok=True)
        with open(store, "a") as f:   # one line an emission; the last for a key counts
            f.write(repr((key, values)) + "\n")

    def _recorded(self) -> dict:
        import ast
        store = self._store()
        if not store.exists():
            return {}
        return dict(ast.literal_eval(line) for line in store.read_text().splitlines())

    def _seen(self, keys: list) -> bool:
        recorded = self._recorded()
        return all(k is not None and k in recorded for k in keys)

    def _replay(self, keys: list) -> None:
        recorded = self._recorded()
        for k in keys:
            for value in recorded[k]:
                with open(self.path, "a") as f:
                    f.write(repr(value) + "\n")


def _function_key(func, size_vars, target, options) -> str | None:
    """The compile cache's key of ``func`` compiled alone (None: not keyable)."""
    from mlcpack.packager.codegen import build
    return build.object_key([func], target, tuple(size_vars), True, options)


def self_loops(asm: str) -> list[list[str]]:
    """The instructions of each basic block of the assembly text ``asm`` that branches back to its
    own label: a kernel's innermost loops, to count what their bodies hold."""
    loops, label, body = [], None, []
    for line in asm.splitlines():
        if line.endswith(":") and not line.startswith("\t"):
            label, body = line[:-1], []
        elif label and line.startswith("\t") and not line.startswith("\t."):
            body.append(line.strip())
            if line.split()[0].startswith("j") and line.split()[-1] == label:
                loops.append(body)
                label = None
    return loops


def capture_compiles(monkeypatch) -> list:
    """The (target, compiled code) pairs of every ``export.compile_for_targets`` call from now
    on in this test, in order (the export's own compile, spied on, not replaced)."""
    import mlcpack.packager.export as export

    captured: list = []
    real = export.compile_for_targets

    def spy(funcs, targets, *args, **kwargs):
        out = real(funcs, targets, *args, **kwargs)
        captured.extend(zip(targets, out))
        return out

    monkeypatch.setattr(export, "compile_for_targets", spy)
    return captured
