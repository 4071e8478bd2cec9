"""Throughput of the generated float32 math (mlc.math.<name>) against numpy, one core.

Run: .venv/bin/python bench/vecmath_bench.py [n]. Prints, asserts nothing.
Each kernel is y[i] = <name>(x[i]) built by mlcpack's own code generator (-O3, the host's level)
and mapped by the runtime's ELF loader, the path a bundle takes.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import numpy as np

from mlcpack.packager.codegen.build import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.ir import prim_func, te
from mlcpack.runtime import elf
from mlcpack.runtime.vm import KERNEL_SIGNATURE


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


def build_kernel(name: str, n: int) -> tuple[Callable[[int, int], None], object]:
    """Compile y[i] = <name>(x[i]) over n floats with mlcpack's own code generator (host level)
    and map it with the runtime's loader; return run(x_addr, y_addr) and the code image."""
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.math(name, x[i]), name="y")
    compiled = compile_prim_funcs([prim_func(f"bench_{name}", [x], y)], resolve_target(None))
    kernel = compiled.kernels[f"bench_{name}"]
    image = elf.load_object(compiled.object_code, elf.default_externals())
    fn = KERNEL_SIGNATURE(image.address(kernel.symbol))
    args = (ctypes.c_void_p * 2)()

    def run(x_addr: int, y_addr: int) -> None:
        args[0], args[1] = x_addr, y_addr
        fn(ctypes.addressof(args), 0, 1)

    return run, image


def best_of(run: Callable[[], object], repeats: int = 20) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def bench_one(name: str, x: np.ndarray) -> str:
    y = np.empty_like(x)
    kernel, _image = build_kernel(name, x.size)
    x_addr, y_addr = x.ctypes.data, y.ctypes.data
    t_mlc = best_of(lambda: kernel(x_addr, y_addr))
    line = f"{name:10s} {t_mlc * 1e3:9.3f} {x.size / t_mlc / 1e9:8.2f}"
    reference = NUMPY.get(name)
    if reference is None:
        return line + f" {'(none)':>11s}"
    t_np = best_of(lambda: reference(x, out=y))
    return line + f" {t_np * 1e3:11.3f} {t_np / t_mlc:7.1f}x"


def main(n: int = 1_000_000) -> None:
    print(f"{n} float32 values, one thread, target {resolve_target(None).name}, "
          f"numpy {np.__version__}")
    print(f"{'function':10s} {'mlc (ms)':>9s} {'Gelem/s':>8s} {'numpy (ms)':>11s} {'speedup':>8s}")
    rng = np.random.default_rng(0)
    for name, (lo, hi) in INPUT_RANGE.items():
        print(bench_one(name, rng.uniform(lo, hi, n).astype(np.float32)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
