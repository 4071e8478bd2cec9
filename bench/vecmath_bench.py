"""Throughput of the generated float32 math (mlc.math.<name>) against numpy and ONNX Runtime,
one core.

Run: .venv/bin/python bench/vecmath_bench.py [n]. Prints, asserts nothing.
Each kernel is y[i] = <name>(x[i]) (silu: x[i] * sigmoid(x[i])) built by mlcpack's own code
generator (-O3, the host's level) and mapped by the runtime's ELF loader, the path a bundle
takes. ONNX Runtime runs the one-node model (SiLU: Sigmoid then Mul) with I/O bound to the same
buffers, on one thread. Times are CPU time (time.process_time), the minimum over rounds in which
the engines alternate, in ns per element.
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import numpy as np

from mlcpack.packager.codegen.parallel import compile_prim_funcs
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.ir import prim_func, te
from mlcpack.runtime import elf
from mlcpack.runtime.vm import KERNEL_SIGNATURE


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += 1.0
    return np.reciprocal(out, out=out)


def _silu(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.multiply(_sigmoid(x, out), x, out=out)


# numpy writes into a preallocated output, like the kernels, so no allocation is timed.
NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "silu": _silu,
    "sqrt": np.sqrt,
}
INPUT_RANGE = {
    "exp": (-80, 80),
    "log": (1e-3, 1e3),
    "tanh": (-5, 5),
    "sigmoid": (-20, 20),
    "silu": (-8, 8),
    "erf": (-3, 3),
    "sqrt": (0, 1e4),
}
ONNX_OPS = {"exp": "Exp", "log": "Log", "tanh": "Tanh", "sigmoid": "Sigmoid", "erf": "Erf",
            "sqrt": "Sqrt", "silu": None}


def build_kernel(name: str, n: int) -> tuple[Callable[[int, int], None], object]:
    """Compile y[i] = <name>(x[i]) over n floats with mlcpack's own code generator (host level)
    and map it with the runtime's loader; return run(x_addr, y_addr) and the code image."""
    x = te.placeholder((n,), name="x")
    if name == "silu":
        y = te.compute((n,), lambda i: x[i] * te.math("sigmoid", x[i]), name="y")
    else:
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


def ort_runner(name: str, x: np.ndarray, y: np.ndarray) -> Callable[[], object] | None:
    """ONNX Runtime's one-node model on x, writing into y; None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    shape = [x.size]
    if ONNX_OPS[name] is None:   # silu
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
                 helper.make_node("Mul", ["x", "s"], ["y"])]
    else:
        nodes = [helper.make_node(ONNX_OPS[name], ["x"], ["y"])]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "cpu", element_type=np.float32, shape=tuple(shape),
                        buffer_ptr=y.ctypes.data)
    return lambda: sess.run_with_iobinding(binding)


def alternating_min(runs: list[Callable[[], object]], rounds: int = 30, inner: int = 5
                    ) -> list[float]:
    """Per callable the minimum CPU seconds of one call, the callables alternating by round."""
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        for j, run in enumerate(runs):
            start = time.process_time()
            for _ in range(inner):
                run()
            best[j] = min(best[j], (time.process_time() - start) / inner)
    return best


def bench_one(name: str, x: np.ndarray) -> str:
    y = np.empty_like(x)
    kernel, _image = build_kernel(name, x.size)
    x_addr, y_addr = x.ctypes.data, y.ctypes.data
    runs = [lambda: kernel(x_addr, y_addr)]
    reference = NUMPY.get(name)
    if reference is not None:
        runs.append(lambda: reference(x, out=y))
    ort_run = ort_runner(name, x, y)
    if ort_run is not None:
        runs.append(ort_run)
    times = iter(alternating_min(runs))
    per = 1e9 / x.size
    t_mlc = next(times)
    line = f"{name:8s} {t_mlc * per:8.3f}"
    line += f" {next(times) * per:9.3f}" if reference is not None else f" {'-':>9s}"
    if ort_run is not None:
        t_ort = next(times)
        line += f" {t_ort * per:8.3f} {t_ort / t_mlc:8.2f}x"
    return line


def main(n: int = 1 << 16) -> None:
    print(f"{n} float32 values, one thread, target {resolve_target(None).name}, "
          f"numpy {np.__version__}; ns per element (min CPU time)")
    print(f"{'function':8s} {'mlcpack':>8s} {'numpy':>9s} {'ORT':>8s} {'ORT/mlc':>9s}")
    rng = np.random.default_rng(0)
    for name, (lo, hi) in INPUT_RANGE.items():
        print(bench_one(name, rng.uniform(lo, hi, n).astype(np.float32)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 16)
