"""Integer multiply-add peaks beside the fp32 FMA's, and ResNet-18's convolutions per layer
(fp32 bundle vs ``--quantize int8`` bundle) against them: what ``vpmaddwd`` (the AVX2 integer
kernels' instruction, codegen/qgemm.py) and ``vpmaddubsw`` allow on this host.

Run: .venv/bin/python bench/int8_peak.py [--onnx resnet18.onnx --calibration DIR]
                                         [--rounds 8] [--loops-only]

Register-only loops (12 independent 8-lane chains, nothing loaded, compiled here with
llvmlite for the host CPU), multiply-adds per second, minimum thread time over rounds:
  fma        vfmadd231ps                                     8 MAC / instruction
  pmaddwd    vpmaddwd (int16 pairs) + vpaddd                16 MAC / 2 instructions
  pmaddubsw  vpmaddubsw (u8 x s8 pairs, int16 saturating) + vpmaddwd by ones (widen) + vpaddd
                                                            32 MAC / 3 instructions (exact
             only while a pair sum fits int16: 7-bit weights)
and on a host with avx512_vnni (x86-64-v4+vnni):
  fma512     vfmadd231ps on 512-bit vectors (the fp32 kernels' at x86-64-v4)  16 MAC / instruction
  dpbusd     vpdpbusd on 256-bit vectors (u8 x s8 quads into int32, exact)   32 MAC / instruction
  dpbusd512  vpdpbusd on 512-bit vectors                                     64 MAC / instruction
Then (unless --loops-only) the fp32 bundle and the int8 bundle of the model (mlcpack's own
static quantization, packager/calibrate.quantize_onnx, on DIR's .npy samples; default
bench/models.py's ResNet-18 and 8 seeded normal samples) profiled in alternating rounds (1
thread): per convolution / Gemm, MMAC, min us, GMAC/s for each bundle, the int8 kernel's share
of the pmaddwd loop's peak, and int8 / fp32 speed. The fp32 3x3 stride-1 layers run Winograd
(fewer multiplies than MACs counted), so their GMAC/s can exceed the FMA loop's.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

CHAINS, ITERS = 12, 1 << 20


def _loop(kind: str):
    """(engine to keep alive, f(n, ptr), multiply-adds per iteration)."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    i64, i32, i16, i8 = (ir.IntType(n) for n in (64, 32, 16, 8))
    f32 = ir.FloatType()
    v8f, v8i, v16s, v32b = (ir.VectorType(f32, 8), ir.VectorType(i32, 8),
                            ir.VectorType(i16, 16), ir.VectorType(i8, 32))
    mod = ir.Module(kind)
    mod.triple = llvm.get_process_triple()
    v16f, v16i, v64b = ir.VectorType(f32, 16), ir.VectorType(i32, 16), ir.VectorType(i8, 64)
    acc_t = {"fma": v8f, "fma512": v16f, "dpbusd512": v16i}.get(kind, v8i)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64, acc_t.as_pointer()]), "peak")
    n, out = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    a0 = b.load(out, align=4)
    a1 = b.load(b.gep(out, [ir.Constant(i64, 1)]), align=4)
    if kind == "fma":
        op = ir.Function(mod, ir.FunctionType(v8f, [v8f] * 3), "llvm.fma.v8f32")
        starts = [b.fadd(a1, ir.Constant(v8f, [float(k)] * 8)) for k in range(CHAINS)]
        macs = 8
    elif kind == "fma512":
        op = ir.Function(mod, ir.FunctionType(v16f, [v16f] * 3), "llvm.fma.v16f32")
        starts = [b.fadd(a1, ir.Constant(v16f, [float(k)] * 16)) for k in range(CHAINS)]
        macs = 16
    elif kind in ("dpbusd", "dpbusd512"):
        wide = kind == "dpbusd512"
        vi, vb = (v16i, v64b) if wide else (v8i, v32b)
        op = ir.Function(mod, ir.FunctionType(vi, [vi, vb, vb]),
                         f"llvm.x86.avx512.vpdpbusd.{512 if wide else 256}")
        starts = [b.add(a1, ir.Constant(vi, [k] * vi.count)) for k in range(CHAINS)]
        y8 = b.bitcast(a1, vb)
        macs = 4 * vi.count
    else:
        wd = ir.Function(mod, ir.FunctionType(v8i, [v16s, v16s]), "llvm.x86.avx2.pmadd.wd")
        ub = ir.Function(mod, ir.FunctionType(v16s, [v32b, v32b]), "llvm.x86.avx2.pmadd.ub.sw")
        starts = [b.add(a1, ir.Constant(v8i, [k] * 8)) for k in range(CHAINS)]
        y16, y8 = b.bitcast(a1, v16s), b.bitcast(a1, v32b)
        ones = ir.Constant(v16s, [1] * 16)
        planes = b.bitcast(out, v32b.as_pointer())
        sg = ir.Function(mod, ir.FunctionType(v32b, [v32b, v32b]), "llvm.x86.avx2.psign.b")
        uy8 = b.xor(y8, ir.Constant(v32b, [0x7F] * 32))
        macs = 16 if kind == "pmaddwd" else 32
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    accs = [b.phi(acc_t) for _ in range(CHAINS)]
    nxt = []
    for k, acc in enumerate(accs):
        acc.add_incoming(starts[k], entry)
        if kind in ("fma", "fma512"):
            nxt.append(b.call(op, [acc, a0, a1]))
        elif kind in ("dpbusd", "dpbusd512"):
            # the chain's own bytes as the unsigned operand: nothing hoisted out of the loop
            nxt.append(b.call(op, [acc, b.bitcast(acc, y8.type), y8]))
        elif kind == "pmaddwd":
            # the operand depends on the chain, so no product is hoisted out of the loop
            nxt.append(b.add(acc, b.call(wd, [b.bitcast(acc, v16s), y16])))
        elif kind == "vload":
            # a plane vector loaded per row and vector (a per-row plane variant), from L1
            at = b.and_(b.add(b.mul(i, ir.Constant(i64, CHAINS)), ir.Constant(i64, k)),
                        ir.Constant(i64, 255))
            xv = b.load(b.gep(planes, [at]), align=4)
            p = b.call(ub, [xv, b.bitcast(acc, v32b)])
            nxt.append(b.add(acc, b.call(wd, [p, ones])))
        elif kind == "pxor":
            # the byte-flip kernel's step: x xor a per-word mask (255 - x where flipped)
            p = b.call(ub, [b.xor(b.bitcast(acc, v32b), uy8), y8])
            nxt.append(b.add(acc, b.call(wd, [p, ones])))
        elif kind == "psignb":
            # the sign kernel's step (codegen/qgemm.py ``_dp_signed``): the weight's sign
            # from x, |x| as the unsigned operand
            s = b.call(sg, [b.bitcast(acc, v32b), y8])
            p = b.call(ub, [uy8, s])
            nxt.append(b.add(acc, b.call(wd, [p, ones])))
        else:
            p = b.call(ub, [b.bitcast(acc, v32b), y8])
            nxt.append(b.add(acc, b.call(wd, [p, ones])))
    for acc, v in zip(accs, nxt):
        acc.add_incoming(v, loop)
    i1 = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(i1, loop)
    b.cbranch(b.icmp_unsigned("<", i1, n), loop, done)
    b.position_at_end(done)
    total = nxt[0]
    for v in nxt[1:]:
        total = b.fadd(total, v) if kind.startswith("fma") else b.add(total, v)
    b.store(total, out, align=4)
    b.ret_void()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(mod)), tm)
    engine.finalize_object()
    cfn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(engine.get_function_address("peak"))
    return engine, cfn, macs * CHAINS


def peaks(rounds: int) -> dict[str, float]:
    """GMAC/s of each register-only loop (minimum thread time over ``rounds``, alternating)."""
    from mlcpack.runtime.cpu import host_features

    kinds = ["fma", "pmaddwd", "pmaddubsw", "vload", "pxor", "psignb"]
    if "avx512_vnni" in host_features():
        kinds += ["fma512", "dpbusd", "dpbusd512"]
    loops = {k: _loop(k) for k in kinds}
    buf = (ctypes.c_float * 4096)(*([0.5] * 4096))     # the vload loop's 8 KB of planes
    best = dict.fromkeys(loops, float("inf"))
    for _ in range(rounds):
        for k, (_, f, _) in loops.items():
            t = time.thread_time()
            f(ITERS, ctypes.addressof(buf))
            best[k] = min(best[k], time.thread_time() - t)
    return {k: loops[k][2] * ITERS / best[k] / 1e9 for k in loops}


def _products(steps, best) -> list:
    """(step, min us) of each convolution / matrix-product kernel, program order."""
    return [(st, float(best[i])) for i, st in enumerate(steps)
            if st.macs or st.name.startswith(("qconv", "qmatmul", "qdwconv"))]


def layers(fp32_onnx: Path, samples: list[np.ndarray], rounds: int, work: Path,
           peak: dict[str, float]) -> None:
    import onnx

    from int8 import _export
    from mlcpack.packager.calibrate import quantize_onnx
    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    q = quantize_onnx(fp32_onnx, samples)
    try:
        onnx.save(q.model, work / "int8.onnx")
    finally:
        q.close()
    paths = {"fp32": _export(fp32_onnx, work / "fp32.mlc"),
             "int8": _export(work / "int8.onnx", work / "int8.mlc")}
    models = {k: load(p, threads=1) for k, p in paths.items()}
    feed = {k: {m.inputs[0].name: samples[0]} for k, m in models.items()}
    best, steps = {}, {}
    for _ in range(rounds):
        for k, m in models.items():
            prof = m.profile(feed[k], runs=5)
            mins = prof.durations_ns.min(axis=0) / 1e3
            best[k] = mins if k not in best else np.minimum(best[k], mins)
            steps[k] = prof.steps
    kernel = {r["symbol"]: r.get("kernel") or "" for r in describe(paths["int8"])["kernels"]}
    # an int8 kernel's sources name its QuantizeLinear: walk back to the Conv / Gemm it
    # quantizes, the fp32 step that names it gives the multiply-adds
    g = onnx.load(str(work / "int8.onnx")).graph
    by_name = {n.name: n for n in g.node}
    producer = {o: n for n in g.node for o in n.output}

    def product_of(name: str) -> str | None:
        n = by_name.get(name)
        for _ in range(8):
            if n is None or n.op_type in ("Conv", "Gemm", "MatMul"):
                break
            n = producer.get(n.input[0])
        return n.name if n is not None else None

    f32 = {s.name: (st, t) for st, t in _products(steps["fp32"], best["fp32"]) for s in st.sources}
    # the int8 kernel's share of its instruction's loop: vpdpbusd (512-bit) on a VNNI host
    ref = "dpbusd512" if "dpbusd512" in peak else "pmaddwd"
    wd = peak[ref]
    col = "%dp" if ref == "dpbusd512" else "%wd"
    print(f"{'layer':38s} {'MMAC':>6s} | {'fp32 us':>8s} {'GMAC/s':>6s} | {'int8 us':>8s} "
          f"{'GMAC/s':>6s} {col:>4s} | int8/fp32 | int8 kernel")
    tot = {"fp32": 0.0, "int8": 0.0}
    for st8, t8 in _products(steps["int8"], best["int8"]):
        name = product_of(st8.sources[0].name) if st8.sources else None
        if name not in f32:
            print(f"  {st8.name}: no fp32 counterpart found")
            continue
        st32, t32 = f32[name]
        mac = st32.macs
        tot["fp32"] += t32
        tot["int8"] += t8
        print(f"{name[-38:]:38s} {mac / 1e6:6.1f} | {t32:8.1f} {mac / t32 / 1e3:6.1f} | {t8:8.1f} "
              f"{mac / t8 / 1e3:6.1f} {100 * mac / t8 / 1e3 / wd:4.0f} | x{t32 / t8:4.2f}     | "
              f"{kernel.get(st8.symbol, '')[:50]}")
    print(f"products: fp32 {tot['fp32'] / 1e3:.2f} ms, int8 {tot['int8'] / 1e3:.2f} ms; all kernels:"
          f" fp32 {best['fp32'].sum() / 1e3:.2f} ms, int8 {best['int8'].sum() / 1e3:.2f} ms "
          f"(sums of per-kernel minimums over {rounds} x 5 runs, 1 thread)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx", default="", help="fp32 model (default: bench/models.py resnet18)")
    ap.add_argument("--calibration", default="", help="folder of .npy samples")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--loops-only", action="store_true")
    args = ap.parse_args()
    peak = peaks(args.rounds)
    print("register-only loops, 1 thread: " + ", ".join(f"{k} {v:.1f} GMAC/s"
                                                        for k, v in peak.items()))
    if args.loops_only:
        return
    work = Path(tempfile.mkdtemp(prefix="int8peak"))
    if args.onnx:
        model = Path(args.onnx)
    else:
        from int8 import resnet18
        model = resnet18(work / "resnet18.onnx")
    if args.calibration:
        samples = [np.load(p) for p in sorted(Path(args.calibration).glob("*.npy"))]
    else:
        rng = np.random.default_rng(0)
        samples = [rng.normal(0, 1, (1, 3, 224, 224)).astype(np.float32) for _ in range(8)]
    layers(model, samples, args.rounds, work, peak)


if __name__ == "__main__":
    main()
