"""Throughput of the generated float32 math (mlc.math.<name>) against numpy, one core.

Run: .venv/bin/python bench/vecmath_bench.py [n]. Prints, asserts nothing.
Each kernel is `void k(float* x, float* y, i64 n)` applying mlc.math.<name> per element,
optimized at -O3 for the host CPU and run through MCJIT.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from mlcpack.packager.codegen.vecmath import call_math

F32 = ir.FloatType()
I64 = ir.IntType(64)


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1.0
    return np.reciprocal(out, out=out)


# numpy writes into a preallocated output, like the kernels, so no allocation is timed.
NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "sqrt": np.sqrt,
}
INPUT_RANGE = {
    "exp": (-80, 80),
    "log": (1e-3, 1e3),
    "tanh": (-5, 5),
    "sigmoid": (-20, 20),
    "erf": (-3, 3),
    "sqrt": (0, 1e4),
}


def host_target_machine() -> llvm.TargetMachine:
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )


def build_kernel(name: str) -> tuple[Callable[[int, int, int], None], object]:
    """Compile y[i] = mlc.math.<name>(x[i]); return the callable and the engine that owns it."""
    module = ir.Module(name=f"bench_{name}")
    module.triple = llvm.get_default_triple()
    ptr = F32.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, I64]), name="k")
    for arg in fn.args[:2]:
        arg.add_attribute("noalias")
    x, y, n = fn.args
    entry, loop, done = (fn.append_basic_block(b) for b in ("entry", "loop", "done"))
    builder = ir.IRBuilder(entry)
    builder.cbranch(builder.icmp_signed(">", n, I64(0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(I64)
    i.add_incoming(I64(0), entry)
    value = builder.load(builder.gep(x, [i]))
    builder.store(call_math(builder, name, value), builder.gep(y, [i]))
    i_next = builder.add(i, I64(1))
    i.add_incoming(i_next, loop)
    builder.cbranch(builder.icmp_signed("<", i_next, n), loop, done)
    builder.position_at_end(done)
    builder.ret_void()

    mod = llvm.parse_assembly(str(module))
    tm = host_target_machine()
    pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    # The engine takes ownership of its target machine and frees it: give it its own.
    engine = llvm.create_mcjit_compiler(mod, host_target_machine())
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    return proto(engine.get_function_address("k")), engine


def best_of(run: Callable[[], object], repeats: int = 20) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def bench_one(name: str, x: np.ndarray) -> str:
    y = np.empty_like(x)
    kernel, _engine = build_kernel(name)
    x_addr, y_addr = x.ctypes.data, y.ctypes.data
    t_mlc = best_of(lambda: kernel(x_addr, y_addr, x.size))
    line = f"{name:10s} {t_mlc * 1e3:9.3f} {x.size / t_mlc / 1e9:8.2f}"
    reference = NUMPY.get(name)
    if reference is None:
        return line + f" {'(none)':>11s}"
    t_np = best_of(lambda: reference(x, out=y))
    return line + f" {t_np * 1e3:11.3f} {t_np / t_mlc:7.1f}x"


def main(n: int = 1_000_000) -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    print(
        f"{n} float32 values, one thread, host CPU {llvm.get_host_cpu_name()}, "
        f"numpy {np.__version__}"
    )
    print(f"{'function':10s} {'mlc (ms)':>9s} {'Gelem/s':>8s} {'numpy (ms)':>11s} {'speedup':>8s}")
    rng = np.random.default_rng(0)
    for name, (lo, hi) in INPUT_RANGE.items():
        print(bench_one(name, rng.uniform(lo, hi, n).astype(np.float32)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
