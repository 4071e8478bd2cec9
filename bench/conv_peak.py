"""Convolution layers against the host's fp32 FMA peak: every convolution kernel of a bundle
(the profiler's GFLOP/s at its minimum time) beside the peak of a register-only FMA loop and
numpy's one-core sgemm (bench/sgemm.py's reference), measured in the same process, alternating.

Run: .venv/bin/python bench/conv_peak.py [MODEL.onnx|BUNDLE.mlc|resnet18 ...] [--rounds 8]
                                         [--runs 5] [--min-gflop 0.05] [--cpu]
A name is one of bench/models.py's models or ``vgg11`` (VGG-11's convolution body, written
with onnx's helper: ``build_vgg``; built into bench/.cache and exported there if missing), an
ONNX file (exported into a temporary directory, ``--target host``) or a bundle.
1 thread. Each round times the FMA loop, numpy's sgemm (square, each of ``--sgemm-sizes``;
the %sgemm column is of the best size's rate, as bench/sgemm.py reports) and ``--runs`` profiled
runs of each bundle, one after another, so all see the same machine load; each kernel's time
is its minimum over all rounds (on a shared machine the minimum is what the code does when it
has the core). Prints, per convolution kernel (at least ``--min-gflop`` GFLOP per call): its
source node, GFLOP per call, min µs, GFLOP/s, its share of the FMA peak and of sgemm's, and
the kernel the export chose for it (``mlcpack inspect``'s ``kernel:``).

The FMA loop: 12 independent 8-lane (AVX2) multiply-add chains in registers (16-lane where the
host has AVX-512: Zen 5's 512-bit FMA pipes double the peak, Zen 4's do not), compiled here with
llvmlite for the host CPU: the machine's fp32 limit (2 FMA pipes x 8 lanes x 2 FLOP per cycle
on AVX2 cores) with nothing to load.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import ctypes  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FMA_CHAINS = 12


def _fma_lanes() -> int:
    from mlcpack.runtime.cpu import host_features

    return 16 if "avx512f" in host_features() else 8


FMA_LANES = _fma_lanes()
FMA_ITERS = 1 << 20


def fma_loop() -> tuple[object, ctypes.CFUNCTYPE]:
    """(the JIT engine to keep alive, f(n, ptr) -> FMA_CHAINS x FMA_LANES x n multiply-adds)."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    f32 = ir.FloatType()
    vec = ir.VectorType(f32, FMA_LANES)
    i64 = ir.IntType(64)
    mod = ir.Module("fma_peak")
    mod.triple = llvm.get_process_triple()
    fma = ir.Function(mod, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{FMA_LANES}f32")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64, f32.as_pointer()]), "fma_peak")
    n, out = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    vp = b.bitcast(out, vec.as_pointer())
    mul = b.load(vp, align=4)
    add = b.load(b.gep(vp, [ir.Constant(i64, 1)]), align=4)
    starts = [b.fadd(add, ir.Constant(vec, [float(k)] * FMA_LANES)) for k in range(FMA_CHAINS)]
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    accs = [b.phi(vec) for _ in range(FMA_CHAINS)]
    i.add_incoming(ir.Constant(i64, 0), entry)
    nxt = []
    for k, acc in enumerate(accs):   # distinct starts: no two chains fold into one
        acc.add_incoming(starts[k], entry)
        nxt.append(b.call(fma, [acc, mul, add]))
    for acc, v in zip(accs, nxt):
        acc.add_incoming(v, loop)
    i1 = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(i1, loop)
    b.cbranch(b.icmp_unsigned("<", i1, n), loop, done)
    b.position_at_end(done)
    total = nxt[0]
    for v in nxt[1:]:
        total = b.fadd(total, v)
    b.store(total, vp, align=4)
    b.ret_void()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                      features=llvm.get_host_cpu_features().flatten(), opt=2)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(mod)), tm)
    engine.finalize_object()
    cfn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(
        engine.get_function_address("fma_peak"))
    return engine, cfn


# VGG-11's body ("A": 3x3 convolutions, ReLU, 2x2 max pools; no classifier), at 224 x 224
VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512)


def build_vgg(path: Path, cfg=VGG11, size: int = 224) -> None:
    """A VGG-style body as ONNX (random weights, seeded): every 3x3 convolution + bias + ReLU,
    the max pools of ``cfg``; no torch needed."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, cur, c = [], [], "x", 3
    for i, v in enumerate(cfg):
        if v == "M":
            nodes.append(helper.make_node("MaxPool", [cur], [f"p{i}"], kernel_shape=[2, 2],
                                          strides=[2, 2]))
            cur = f"p{i}"
            continue
        w = rng.standard_normal((v, c, 3, 3)) / np.sqrt(9 * c)
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(v) * 0.1).astype(np.float32),
                                          f"b{i}")]
        nodes += [helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [f"c{i}"],
                                   kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        cur, c = f"r{i}", v
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    graph = helper.make_graph(
        nodes, "vgg_body", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def bundle_for(name: str, work: Path) -> Path:
    """The bundle to profile for a model name, an ONNX file or a bundle (see the docstring)."""
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    if name.endswith(".mlc"):
        return Path(name)
    if name.endswith(".onnx"):
        onnx_path, bundle = Path(name), work / (Path(name).stem + ".mlc")
    else:
        if name != "vgg11":
            from models import build

        cache = HERE / ".cache"
        cache.mkdir(exist_ok=True)
        onnx_path, bundle = cache / f"{name}.onnx", cache / f"{name}.mlc"
        if not onnx_path.exists():
            if name == "vgg11":
                build_vgg(onnx_path)
            else:
                build(name, str(onnx_path))
        if bundle.exists() and bundle.stat().st_mtime >= onnx_path.stat().st_mtime:
            return bundle
    mod, _ = import_onnx(str(onnx_path))
    export_module(mod, bundle, ExportOptions(target="host"))
    return bundle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["resnet18"])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5, help="profiled runs per bundle per round")
    ap.add_argument("--min-gflop", type=float, default=0.05)
    ap.add_argument("--cpu", action="store_true",
                    help="time each kernel in this thread's CPU time (the profiler's clock "
                         "swapped for time.thread_time_ns; 1 thread): on a loaded host a "
                         "kernel of milliseconds is preempted within every run, and its "
                         "wall-clock minimum is then not what its code does")
    ap.add_argument("--sgemm-sizes", default="512",
                    help="square numpy sgemm sizes, e.g. 512,1024,2048 (the best is the column)")
    args = ap.parse_args()

    from mlcpack.runtime import load
    from mlcpack.runtime.bundle import BundleReader

    if args.cpu:
        import mlcpack.runtime.vm as vm

        class _ThreadClock:
            """``time`` for the runtime's profiler, its clock the thread's CPU time."""
            perf_counter_ns = staticmethod(time.thread_time_ns)

            def __getattr__(self, name):
                return getattr(time, name)

        vm.time = _ThreadClock()

    engine, fma = fma_loop()
    buf = (ctypes.c_float * (2 * FMA_LANES))(*([1.0] * FMA_LANES + [0.0] * FMA_LANES))
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in args.sgemm_sizes.split(",")]
    mats = {n: (rng.standard_normal((n, n)).astype(np.float32),
                rng.standard_normal((n, n)).astype(np.float32)) for n in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        bundles = [bundle_for(m, Path(tmp)) for m in args.models]
        models, feeds, best, choices = [], [], [], []
        for path in bundles:
            model = load(str(path), threads=1)
            models.append(model)
            feeds.append({i.name: rng.standard_normal(
                [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
                for i in model.inputs})
            best.append({})
            with BundleReader(str(path)) as r:
                choices.append({k.get("name"): k.get("kernel") for k in r.header["kernels"]})
        peak_s = float("inf")
        sgemm_s = dict.fromkeys(sizes, float("inf"))
        for _ in range(args.rounds):
            for _ in range(3):
                t0 = time.thread_time()
                fma(FMA_ITERS, ctypes.addressof(buf))
                peak_s = min(peak_s, time.thread_time() - t0)
            for n, (a, bm) in mats.items():
                for _ in range(3):
                    t0 = time.thread_time()
                    a @ bm
                    sgemm_s[n] = min(sgemm_s[n], time.thread_time() - t0)
            for model, feed, kbest in zip(models, feeds, best):
                prof = model.profile(feed, runs=args.runs)
                for ins in prof.instructions:
                    if ins.step.macs:
                        key = ins.index
                        prev = kbest.get(key)
                        if prev is None or ins.min_us < prev[1]:
                            kbest[key] = (ins, ins.min_us)
        peak = 2.0 * FMA_CHAINS * FMA_LANES * FMA_ITERS / peak_s / 1e9
        rates = {n: 2.0 * n ** 3 / sgemm_s[n] / 1e9 for n in sizes}
        best_n = max(rates, key=rates.get)
        sgemm = rates[best_n]
        each = ", ".join(f"{n}: {r:.1f}" for n, r in rates.items())
        clock = "thread CPU time" if args.cpu else "wall clock"
        print(f"FMA loop peak {peak:.1f} GFLOP/s, numpy sgemm {each} GFLOP/s, best {best_n} "
              f"(1 thread, CPU-time mins over {args.rounds} rounds; kernels: {clock} mins)")
        for path, kbest, chosen in zip(bundles, best, choices):
            print(f"\n{path.name}:")
            print(f"{'#':>3s} {'source':34s} {'GFLOP':>6s} {'min us':>8s} {'GFLOP/s':>7s} "
                  f"{'%peak':>6s} {'%sgemm':>6s}  kernel")
            total_us = 0.0
            for key in sorted(kbest):
                ins, us = kbest[key]
                gflop = 2.0 * ins.step.macs / 1e9
                if gflop < args.min_gflop:
                    continue
                total_us += us
                rate = gflop / (us / 1e6)
                src = ins.step.sources[0].name if ins.step.sources else ins.step.name
                print(f"{key:3d} {src[-34:]:34s} {gflop:6.3f} {us:8.1f} {rate:7.1f} "
                      f"{100 * rate / peak:6.1f} {100 * rate / sgemm:6.1f}  "
                      f"{chosen.get(ins.step.name) or '-'}")
        del engine


if __name__ == "__main__":
    main()
