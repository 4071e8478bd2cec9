"""fp32 vs ``--precision bf16`` bundles, 1 thread, alternating in one process.

    .venv/bin/python bench/bf16.py [--budget 6] [--models mlp,resnet_small,resnet18]

Models (bench/int8.py's, and ``mlp@ROWS``: the MLP at that many rows): mlp (x [32,256],
256-512-512-10), resnet_small (3x3 convs 16->32->32, a residual Add, a 1x1 conv, a Gemm),
resnet18 (bench/models.py, random weights, 1x3x224x224). Each is exported with ``--target host``
in fp32 and in bf16 (docs/precision.md: on a host with avx512_bf16 the matmul and convolution
weights in bf16 pairs, vdpbf16ps; without it, matmuls of at most 2 rows in bf16, widened, the
rest fp32). Rows: median and min ms per run (bench.time_interleaved: the engines alternate),
least CPU time of a run, the bundle size, the weights' size, and the bf16 bundle's error
against the fp32 bundle (max |diff| over the output's scale). Print the host's CPU flags beside
the numbers.

``--peers`` (issue 33 target 6: bf16 on real CNNs at or below OpenVINO's default time): models
are bench/models.py's (``resnet18``, ``resnet50``: random weights, 1x3x224x224) or corpus names
(bench/corpus.py, fetched with ``bench/corpus.py --fetch NAME``; their realistic input), each
exported with the command line (``mlcpack export --target host --no-check``, ``--precision
fp32`` and ``bf16``; the bf16 guard runs either way and its line is printed). Engines, at each
of ``--threads`` (default 1,2), alternating in one process (bench.time_interleaved):
mlcpack fp32, mlcpack bf16, ONNX Runtime fp32 and OpenVINO at its default precision (bf16 on an
avx512_bf16 host; bench/peers.py, not pinned); ``--ov-f32`` adds OpenVINO f32. Per engine the
median and min ms, the least CPU time of a run, and its output error against ONNX Runtime fp32
(max |diff| over the output's scale, the worst output). ``--layers N``: then the bf16 bundle's
N slowest kernels (Model.profile minimums over alternating rounds) with GFLOP/s against the
vdpbf16ps and fp32 FMA peaks measured here (register-only loops, 1 thread), and OpenVINO bf16's
N slowest layers (PERF_COUNT: its kernel, time) beside them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


WIDEN_ALL = False   # --widen-all: every packed matmul in bf16 (how BF16_WIDEN_MAX_ROWS was set)
CHAINS = 16        # peak_loops: independent accumulator chains (12 to 28 measure the same here)


def _export(path: Path, out: Path, precision: str):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    mod, _ = import_onnx(str(path))
    return export_module(mod, out, ExportOptions(
        target="host", precision=precision, compile=CompileOptions(bf16_widen_all=WIDEN_ALL)))


def _flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                      if ln.startswith("flags")), []))
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"]
    return ", ".join(f"{f}{'' if f in flags else ' (no)'}" for f in wanted)


def mlp_rows(path: Path, rows: int, dims=(256, 512, 512, 10)) -> Path:
    """bench/int8.py's MLP (MatMul + Add + ReLU, 256-512-512-10) at ``rows`` rows: where the
    bf16 matmul on AVX2 turns from weight-bound (half the bytes) to compute-bound (the widening
    beside the FMAs); ``mlp@ROWS`` on the command line."""
    import onnx
    from onnx import TensorProto
    from onnx import helper as h

    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:])):
        w = (rng.normal(0, 1, (k, n)) / np.sqrt(k)).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w{i}"),
                  onnx.numpy_helper.from_array(np.zeros(n, np.float32), f"b{i}")]
        nodes += [h.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  h.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        x = f"a{i}"
        if i < len(dims) - 2:
            nodes.append(h.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    graph = h.make_graph(nodes, "mlp",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [rows, dims[0]])],
                         [h.make_tensor_value_info(x, TensorProto.FLOAT, [rows, dims[-1]])],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def bench_model(name: str, tmp: Path, budget: float) -> None:
    from int8 import BUILDERS, _cpu_min

    from bench import time_interleaved
    from mlcpack.runtime import load

    if name.startswith("mlp@"):
        src = mlp_rows(tmp / f"mlp{name[4:]}.onnx", int(name[4:]))
    else:
        src = BUILDERS[name](tmp / f"{name}.onnx")
    reports = {p: _export(src, tmp / f"{name}_{p}.mlc", p) for p in ("fp32", "bf16")}
    print(f"{name}: {reports['bf16'].precision_note}")
    models = {p: load(r.path, threads=1) for p, r in reports.items()}
    spec = models["fp32"].inputs[0]
    feed = {spec.name: np.random.default_rng(3).standard_normal(spec.shape).astype(np.float32)}
    outs = {p: list(m.run(feed).values())[0] for p, m in models.items()}
    scale = float(np.abs(outs["fp32"]).max()) or 1.0
    fns = [lambda m=m: m.run(feed) for m in models.values()]
    res = time_interleaved(fns, budget)
    cpu = [_cpu_min(fn, 5) for fn in fns]
    for (p, r), (med, mn, n), c in zip(reports.items(), res, cpu):
        err = float(np.abs(outs[p] - outs["fp32"]).max()) / scale
        print(f"  {p:5s} median {med / 1e3:8.3f} ms  min {mn / 1e3:8.3f} ms  cpu {c / 1e3:8.3f} "
              f"ms | x{res[0][1] / mn:4.2f} of fp32 (min) | bundle {r.bundle_bytes / 1e6:6.2f} MB"
              f"  weights {r.weights_bytes / 1e6:6.2f} MB | error vs fp32 {100 * err:.3f} % of "
              f"scale | {n} runs")
    for m in models.values():
        m.close()


# ---- --peers: mlcpack fp32 / bf16 against ONNX Runtime fp32 and OpenVINO's default -----------

def peers_case(name: str, tmp: Path) -> tuple[Path, list[str], dict, dict]:
    """(ONNX file, extra export arguments, the bundle's feeds, ONNX Runtime's feeds)."""
    if name in ("resnet18", "resnet50", "mobilenet_v2"):
        from models import build

        onnx_path = HERE / ".cache" / f"{name}.onnx"
        if not onnx_path.exists():
            onnx_path.parent.mkdir(exist_ok=True)
            build(name, str(onnx_path))
        x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
        import onnx

        inp = onnx.load(str(onnx_path), load_external_data=False).graph.input[0].name
        return onnx_path, [], {inp: x}, {inp: x}
    import corpus

    args = []
    for shape in corpus.MODELS[name].input_shape_args():
        args += ["--input-shape", shape]
    args += corpus.MODELS[name].bind_args(tmp)
    return (corpus.model_path(name), args, corpus.bundle_inputs(name),
            corpus.realistic_inputs(name))


def export_cli(onnx_path: Path, out: Path, precision: str, args: list[str]) -> str:
    """``mlcpack export`` as a user runs it; its bf16 line (or the last line on failure)."""
    import subprocess

    cmd = [str(Path(sys.executable).parent / "mlcpack"), "export", str(onnx_path), "-o",
           str(out), "--target", "host", "--no-check", "--precision", precision, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    if proc.returncode != 0:
        raise RuntimeError(f"export failed: {lines[-1] if lines else proc.returncode}")
    return next((ln.strip() for ln in lines if ln.strip().startswith("bf16:")), "")


def _rel_err(got: list, ref: list) -> float:
    worst = 0.0
    for g, r in zip(got, ref):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        scale = float(np.abs(r[np.isfinite(r)]).max()) if r.size else 0.0
        worst = max(worst, float(np.abs(g - r).max()) / (scale or 1.0))
    return worst


def peak_loops() -> tuple[float, float]:
    """(fp32 FMA GFLOP/s, vdpbf16ps GFLOP/s): 16 independent 16-lane chains in registers each,
    1 thread, least CPU time of 5 (vdpbf16ps: 32 multiply-adds per instruction); vdpbf16ps 0
    without avx512_bf16."""
    import ctypes
    import time

    import llvmlite.binding as llvm
    from llvmlite import ir

    from mlcpack.packager.codegen.bf16dot import BF16

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    features = llvm.get_host_cpu_features()
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vec = ir.VectorType(f32, 16)
    chains, iters = CHAINS, 1 << 20
    mod = ir.Module("peaks")
    mod.triple = llvm.get_process_triple()
    kinds = ["fma"] + (["dpbf16"] if features.get("avx512bf16") else [])
    for kind in kinds:
        if kind == "fma":
            fn_t = ir.Function(mod, ir.FunctionType(vec, [vec] * 3), "llvm.fma.v16f32")
        else:
            v32b = ir.VectorType(BF16, 32)
            fn_t = ir.Function(mod, ir.FunctionType(vec, [vec, v32b, v32b]),
                               "llvm.x86.avx512bf16.dpbf16ps.512")
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64, f32.as_pointer()]),
                         f"peak_{kind}")
        entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
        b = ir.IRBuilder(entry)
        vp = b.bitcast(fn.args[1], vec.as_pointer())
        m, a = b.load(vp, align=4), b.load(b.gep(vp, [ir.Constant(i64, 1)]), align=4)
        if kind != "fma":
            m, a = (b.bitcast(v, ir.VectorType(BF16, 32)) for v in (m, a))
        starts = [b.fadd(b.load(vp, align=4), ir.Constant(vec, [float(k)] * 16))
                  for k in range(chains)]
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(i64)
        accs = [b.phi(vec) for _ in range(chains)]
        i.add_incoming(ir.Constant(i64, 0), entry)
        nxt = [b.call(fn_t, [m, a, acc] if kind == "fma" else [acc, m, a]) for acc in accs]
        for k, (acc, v) in enumerate(zip(accs, nxt)):
            acc.add_incoming(starts[k], entry)
            acc.add_incoming(v, loop)
        i1 = b.add(i, ir.Constant(i64, 1))
        i.add_incoming(i1, loop)
        b.cbranch(b.icmp_unsigned("<", i1, fn.args[0]), loop, done)
        b.position_at_end(done)
        total = nxt[0]
        for v in nxt[1:]:
            total = b.fadd(total, v)
        b.store(total, vp, align=4)
        b.ret_void()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features.flatten(), opt=2)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(mod)), tm)
    engine.finalize_object()
    buf = (ctypes.c_float * 32)(*([1.0] * 32))
    rates = []
    for kind in ("fma", "dpbf16"):
        if kind not in kinds:
            rates.append(0.0)
            continue
        cfn = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(
            engine.get_function_address(f"peak_{kind}"))
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            cfn(iters, ctypes.addressof(buf))
            best = min(best, time.thread_time() - t0)
        macs = chains * 16 * iters * (1 if kind == "fma" else 2)
        rates.append(2.0 * macs / best / 1e9)
    del engine
    return rates[0], rates[1]


def bench_peers(name: str, tmp: Path, budget: float, threads_list: list[int], ov_f32: bool,
                layers: int) -> None:
    import peers
    from int8 import _cpu_min

    from bench import time_interleaved
    from mlcpack.runtime import load

    onnx_path, args, feeds, ort_feeds = peers_case(name, tmp)
    bundles = {}
    for p in ("fp32", "bf16"):
        bundles[p] = tmp / f"{name}_{p}.mlc"
        line = export_cli(onnx_path, bundles[p], p, args)
        if p == "bf16":
            print(f"{name}: {line}")
    for threads in threads_list:
        engines = {f"mlcpack {p}": load(str(path), threads=threads) for p, path in bundles.items()}
        runs = {k: (lambda m=m: m.run(feeds)) for k, m in engines.items()}
        outs = {k: [np.asarray(v) for v in m.run(feeds).values()] for k, m in engines.items()}
        ort = peers.ort_engine(onnx_path, ort_feeds, threads)
        ref = [np.asarray(v) for v in ort.outputs()]
        runs["ORT fp32"], outs["ORT fp32"] = ort.run, ref
        for e in peers.openvino_engines(onnx_path, ort_feeds, threads):
            if e.fp32 and not ov_f32:
                continue
            runs[e.label], outs[e.label] = e.run, e.outputs()
        res = time_interleaved(list(runs.values()), budget)
        cpu = [_cpu_min(fn, 20) for fn in runs.values()]
        ov = next((m for k, (m, _, _) in zip(runs, res) if k.startswith("OV default")), None)
        print(f"  {threads} thread{'s' if threads > 1 else ''}:")
        for k, (med, mn, n), c in zip(runs, res, cpu):
            vs = f" | x{med / ov:4.2f} of OV default (median)" if ov else ""
            print(f"    {k:20s} median {med / 1e3:8.3f} ms  min {mn / 1e3:8.3f} ms  cpu "
                  f"{c / 1e3:8.3f} ms | error vs ORT fp32 {100 * _rel_err(outs[k], ref):7.3f} "
                  f"% of scale{vs} | {n} runs")
        if layers and threads == 1:
            _layers(name, engines["mlcpack bf16"], feeds, onnx_path, ort_feeds, bundles["bf16"],
                    layers)
        for m in engines.values():
            m.close()


def _layers(name: str, model, feeds: dict, onnx_path: Path, ort_feeds: dict, bundle: Path,
            top: int) -> None:
    import openvino as ov

    from mlcpack.runtime.bundle import BundleReader

    fma, dp = peak_loops()
    core = ov.Core()
    m = core.read_model(str(onnx_path))
    m.reshape({k: list(v.shape) for k, v in ort_feeds.items()})
    compiled = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1,
                                             "PERFORMANCE_HINT": "LATENCY",
                                             "ENABLE_CPU_PINNING": False, "PERF_COUNT": True})
    req = compiled.create_infer_request()
    ours: dict[int, tuple] = {}
    theirs: dict[str, tuple] = {}
    for _ in range(6):
        for ins in model.profile(feeds, runs=10).instructions:
            if ins.index not in ours or ins.min_us < ours[ins.index][1]:
                ours[ins.index] = (ins, ins.min_us)
        for _ in range(10):
            req.infer(ort_feeds)
            for p in req.profiling_info:
                us = p.real_time.total_seconds() * 1e6
                if us > 0 and (p.node_name not in theirs or us < theirs[p.node_name][0]):
                    theirs[p.node_name] = (us, p.node_type, p.exec_type)
    with BundleReader(str(bundle)) as r:
        chosen = {k.get("name"): k.get("kernel") for k in r.header["kernels"]}
    total = sum(us for _, us in ours.values())
    print(f"  layers, 1 thread (peaks here: fp32 FMA {fma:.0f} GFLOP/s, vdpbf16ps {dp:.0f} "
          f"GFLOP/s); mlcpack bf16 sum of kernel mins {total / 1e3:.2f} ms, OpenVINO sum "
          f"{sum(t[0] for t in theirs.values()) / 1e3:.2f} ms")
    print(f"    {'source':34s} {'GFLOP':>6s} {'us':>8s} {'GFLOP/s':>7s} {'%bf16pk':>7s} "
          f"{'OV us':>8s}  kernel / OV kernel")
    def match(src: str):   # OpenVINO's node of that name (not its Reorders)
        for node, t in theirs.items():
            node = node.removesuffix("/WithoutBiases")
            if t[1] != "Reorder" and (src.endswith(node) or node.endswith(src)):
                return t
        return None

    kinds: dict[str, float] = {}
    for ins, us in ours.values():
        kind = chosen.get(ins.step.name) or (ins.step.name.split("_") + [ins.step.name])[1]
        kinds[kind] = kinds.get(kind, 0.0) + us
    print("    by kernel: " + ", ".join(f"{k} {us / 1e3:.2f} ms" for k, us in
                                          sorted(kinds.items(), key=lambda t: -t[1])[:8]))
    for ins, us in sorted(ours.values(), key=lambda t: -t[1])[:top]:
        src = ins.step.sources[0].name if ins.step.sources else ins.step.name
        gflop = 2.0 * (ins.step.macs or 0) / 1e9
        rate = gflop / (us / 1e6) if gflop else 0.0
        o = match(src)
        print(f"    {src[-34:]:34s} {gflop:6.3f} {us:8.1f} {rate:7.1f} "
              f"{100 * rate / dp if dp else 0:7.1f} {o[0] if o else float('nan'):8.1f}  "
              f"{chosen.get(ins.step.name) or '-'} / {o[2] if o else '-'}")
    print("    OpenVINO's slowest:")
    for node, (us, typ, ex) in sorted(theirs.items(), key=lambda t: -t[1][0])[:top]:
        print(f"    {node[-34:]:34s} {typ:14s} {us:8.1f} us  {ex}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=6.0, help="seconds per model")
    ap.add_argument("--models", default="mlp,resnet_small,resnet18")
    ap.add_argument("--widen-all", action="store_true",
                    help="without avx512_bf16, matmuls of any row count in bf16 too (widened)")
    ap.add_argument("--peers", action="store_true",
                    help="mlcpack fp32/bf16 against ONNX Runtime fp32 and OpenVINO's default")
    ap.add_argument("--threads", default="1,2", help="--peers: thread counts")
    ap.add_argument("--ov-f32", action="store_true", help="--peers: OpenVINO f32 too")
    ap.add_argument("--layers", type=int, default=0,
                    help="--peers: the N slowest kernels of the bf16 bundle and of OpenVINO")
    args = ap.parse_args()
    if args.peers:
        print(f"host CPU flags: {_flags()}")
        with tempfile.TemporaryDirectory() as d:
            for name in args.models.split(","):
                bench_peers(name, Path(d), args.budget,
                            [int(t) for t in args.threads.split(",")], args.ov_f32, args.layers)
        return
    global WIDEN_ALL
    WIDEN_ALL = args.widen_all
    print(f"host CPU flags: {_flags()}; 1 thread")
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            bench_model(name, Path(d), args.budget)


if __name__ == "__main__":
    main()
